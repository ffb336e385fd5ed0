//! The index as a state machine: objects in, view and pending changes out. No API server.

#![allow(clippy::unwrap_used)]

mod common;

use berth_agent::index::{ChangedServices, Index};
use berth_agent::ConntrackFlow;
use berth_datapath::plan::convert::ProxyMode;
use chrono::{DateTime, Utc};
use common::*;

fn mk_index() -> Index {
    Index::new(NODE, ProxyMode::Full, started())
}

fn started() -> DateTime<Utc> {
    "2026-01-01T00:00:00Z".parse().unwrap()
}

fn changed(index: &mut Index) -> Vec<String> {
    index.take_pending().services.names()
}

fn endpoint_ips(index: &Index, name: &str) -> Vec<String> {
    index
        .view()
        .services
        .iter()
        .filter(|p| p.name.name == name)
        .flat_map(|p| {
            p.endpoints
                .iter()
                .filter(|e| e.ready)
                .map(|e| e.ip.to_string())
        })
        .collect()
}

#[test]
fn a_new_service_is_reported_changed_and_enters_the_view() {
    let mut index = mk_index();
    index.apply_service(&mk_service("default", "web", "10.96.0.10"));
    assert_eq!(changed(&mut index), vec!["default/web"]);
    assert_eq!(index.view().services.len(), 1);
    assert_eq!(index.view().services[0].port, 80);
    // Nothing changed since.
    assert!(!index.has_pending());
}

#[test]
fn reapplying_an_identical_service_reports_nothing() {
    let mut index = mk_index();
    let mut svc = mk_service("default", "web", "10.96.0.10");
    index.apply_service(&svc);
    index.take_pending();
    // A new resourceVersion or an annotation is not a datapath change.
    svc.metadata.resource_version = Some("42".into());
    svc.metadata.annotations = Some([("a".to_string(), "b".to_string())].into());
    index.apply_service(&svc);
    assert!(!index.has_pending());
}

#[test]
fn slices_fill_endpoints_and_report_their_service_only() {
    let mut index = mk_index();
    index.apply_service(&mk_service("default", "web", "10.96.0.10"));
    index.apply_service(&mk_service("default", "api", "10.96.0.11"));
    index.take_pending();
    index.apply_slice(&mk_slice(
        "default",
        "web",
        "web-abc",
        &[("10.244.1.5", true, NODE)],
    ));
    assert_eq!(changed(&mut index), vec!["default/web"]);
    assert_eq!(endpoint_ips(&index, "web"), vec!["10.244.1.5"]);
    assert!(endpoint_ips(&index, "api").is_empty());

    // Readiness flips are changes; the endpoint stays in the view as not ready.
    index.apply_slice(&mk_slice(
        "default",
        "web",
        "web-abc",
        &[("10.244.1.5", false, NODE)],
    ));
    assert_eq!(changed(&mut index), vec!["default/web"]);
    assert!(endpoint_ips(&index, "web").is_empty());
    assert_eq!(index.view().services[1].endpoints.len(), 1);
}

#[test]
fn slices_may_arrive_before_their_service() {
    let mut index = mk_index();
    index.apply_slice(&mk_slice(
        "default",
        "web",
        "web-abc",
        &[("10.244.1.5", true, NODE)],
    ));
    // No Service yet: nothing to program.
    assert!(changed(&mut index).is_empty());
    index.apply_service(&mk_service("default", "web", "10.96.0.10"));
    assert_eq!(changed(&mut index), vec!["default/web"]);
    assert_eq!(endpoint_ips(&index, "web"), vec!["10.244.1.5"]);
}

#[test]
fn several_slices_of_one_service_are_merged_and_deleted_one_by_one() {
    let mut index = mk_index();
    index.apply_service(&mk_service("default", "web", "10.96.0.10"));
    index.apply_slice(&mk_slice(
        "default",
        "web",
        "web-a",
        &[("10.244.1.5", true, NODE)],
    ));
    index.apply_slice(&mk_slice(
        "default",
        "web",
        "web-b",
        &[("10.244.2.5", true, "node-2")],
    ));
    index.take_pending();
    let mut ips = endpoint_ips(&index, "web");
    ips.sort();
    assert_eq!(ips, vec!["10.244.1.5", "10.244.2.5"]);
    index.delete_slice(&mk_slice("default", "web", "web-a", &[]));
    assert_eq!(changed(&mut index), vec!["default/web"]);
    assert_eq!(endpoint_ips(&index, "web"), vec!["10.244.2.5"]);
}

#[test]
fn a_slice_in_another_namespace_is_not_the_services() {
    let mut index = mk_index();
    index.apply_service(&mk_service("default", "web", "10.96.0.10"));
    index.take_pending();
    index.apply_slice(&mk_slice(
        "other",
        "web",
        "web-a",
        &[("10.244.1.5", true, NODE)],
    ));
    assert!(changed(&mut index).is_empty());
    assert!(endpoint_ips(&index, "web").is_empty());
}

#[test]
fn deleting_a_service_removes_its_ports_and_reports_it() {
    let mut index = mk_index();
    let svc = mk_service("default", "web", "10.96.0.10");
    index.apply_service(&svc);
    index.apply_service(&mk_service("default", "api", "10.96.0.11"));
    index.take_pending();
    index.delete_service(&svc);
    assert_eq!(changed(&mut index), vec!["default/web"]);
    let names: Vec<_> = index
        .view()
        .services
        .iter()
        .map(|p| p.name.name.clone())
        .collect();
    assert_eq!(names, vec!["api"]);
}

#[test]
fn reset_deletes_what_the_list_no_longer_has_and_reports_only_differences() {
    let mut index = mk_index();
    index.apply_service(&mk_service("default", "a", "10.96.0.10"));
    index.apply_service(&mk_service("default", "b", "10.96.0.11"));
    index.take_pending();
    assert!(!index.is_listed());
    // "a" is gone, "b" unchanged, "c" new.
    index.reset_services(&[
        mk_service("default", "b", "10.96.0.11"),
        mk_service("default", "c", "10.96.0.12"),
    ]);
    assert_eq!(changed(&mut index), vec!["default/a", "default/c"]);

    index.apply_slice(&mk_slice(
        "default",
        "b",
        "b-1",
        &[("10.244.1.5", true, NODE)],
    ));
    index.take_pending();
    index.reset_slices(&[]);
    assert_eq!(changed(&mut index), vec!["default/b"]);
    assert!(!index.is_listed());
    index.reset_node(&[]);
    assert!(index.is_listed());
}

#[test]
fn proxy_modes_and_labels_decide_what_is_programmed() {
    let mut labeled = mk_service("default", "mine", "10.96.0.10");
    labeled.metadata.labels = Some(
        [(
            "service.kubernetes.io/service-proxy-name".to_string(),
            "berth".to_string(),
        )]
        .into(),
    );
    let mut other_proxy = mk_service("default", "theirs", "10.96.0.11");
    other_proxy.metadata.labels = Some(
        [(
            "service.kubernetes.io/service-proxy-name".to_string(),
            "cilium".to_string(),
        )]
        .into(),
    );
    let plain = mk_service("default", "plain", "10.96.0.12");
    let mut headless = mk_service("default", "headless", "None");
    headless.spec.as_mut().unwrap().cluster_ips = None;
    let all = [labeled.clone(), other_proxy, plain.clone(), headless];
    let names = |mode| {
        let mut index = Index::new(NODE, mode, started());
        index.reset_services(&all);
        let mut names: Vec<_> = index
            .view()
            .services
            .iter()
            .map(|p| p.name.name.clone())
            .collect();
        names.dedup();
        names
    };
    assert_eq!(names(ProxyMode::Full), vec!["mine", "plain"]);
    assert_eq!(names(ProxyMode::Labeled), vec!["mine"]);
    assert!(names(ProxyMode::None).is_empty());

    // A label that takes a Service away from berth removes it.
    let mut index = Index::new(NODE, ProxyMode::Labeled, started());
    index.apply_service(&labeled);
    index.take_pending();
    labeled.metadata.labels = None;
    index.apply_service(&labeled);
    assert_eq!(changed(&mut index), vec!["default/mine"]);
    assert!(index.view().services.is_empty());
}

#[test]
fn an_unreadable_service_update_keeps_the_programmed_ports() {
    let mut index = mk_index();
    index.apply_service(&mk_service("default", "web", "10.96.0.10"));
    index.take_pending();
    let mut broken = mk_service("default", "web", "10.96.0.10");
    broken.spec.as_mut().unwrap().cluster_ips = Some(vec!["not-an-ip".into()]);
    index.apply_service(&broken);
    assert!(!index.has_pending());
    assert_eq!(
        index.view().services[0].cluster_ips[0].to_string(),
        "10.96.0.10"
    );
}

#[test]
fn the_own_node_is_seen_and_others_are_ignored() {
    let mut index = mk_index();
    index.apply_node(&mk_node("node-2", "198.18.0.12"));
    assert!(!index.take_pending().node);
    index.apply_node(&mk_node(NODE, "198.18.0.11"));
    assert!(index.take_pending().node);
    assert_eq!(index.view().node.addresses[0].to_string(), "198.18.0.11");
    index.apply_node(&mk_node(NODE, "198.18.0.11"));
    assert!(!index.take_pending().node);
    index.delete_node(&mk_node(NODE, "198.18.0.11"));
    assert!(index.take_pending().node);
    assert!(index.view().node.addresses.is_empty());
}

#[test]
fn trigger_times_are_collected_once_and_only_after_start() {
    let mut index = mk_index();
    index.apply_service(&mk_service("default", "web", "10.96.0.10"));
    let mut slice = mk_slice("default", "web", "web-a", &[("10.244.1.5", true, NODE)]);
    let annotate = |slice: &mut k8s_openapi::api::discovery::v1::EndpointSlice, at: &str| {
        slice.metadata.annotations = Some(
            [(
                "endpoints.kubernetes.io/last-change-trigger-time".to_string(),
                at.to_string(),
            )]
            .into(),
        );
    };
    annotate(&mut slice, "2025-12-31T23:59:00Z");
    index.apply_slice(&slice);
    assert!(index.take_pending().triggers.is_empty(), "before start");
    annotate(&mut slice, "2026-01-01T00:00:05Z");
    index.apply_slice(&slice);
    let pending = index.take_pending();
    assert_eq!(
        pending.triggers,
        vec!["2026-01-01T00:00:05Z".parse::<DateTime<Utc>>().unwrap()]
    );
    // The same annotation seen again (a relist) is not a new change.
    index.reset_slices(&[slice]);
    assert!(index.take_pending().triggers.is_empty());
}

#[test]
fn udp_endpoint_removal_queues_conntrack_cleanup_and_tcp_does_not() {
    let mut index = mk_index();
    index.apply_service(&mk_udp_service("kube-system", "dns", "10.96.0.10"));
    index.apply_service(&mk_service("default", "web", "10.96.0.11"));
    index.apply_slice(&mk_udp_slice(
        "kube-system",
        "dns",
        "dns-a",
        &[("10.244.1.5", true, NODE), ("10.244.1.6", true, NODE)],
    ));
    index.apply_slice(&mk_slice(
        "default",
        "web",
        "web-a",
        &[("10.244.1.7", true, NODE)],
    ));
    index.take_pending();
    index.apply_slice(&mk_udp_slice(
        "kube-system",
        "dns",
        "dns-a",
        &[("10.244.1.5", true, NODE)],
    ));
    index.apply_slice(&mk_slice("default", "web", "web-a", &[]));
    assert_eq!(
        index.take_pending().conntrack,
        vec![ConntrackFlow::ServiceToEndpoint {
            service_ip: "10.96.0.10".parse().unwrap(),
            endpoint_ip: "10.244.1.6".parse().unwrap(),
        }]
    );
}

#[test]
fn changed_services_match_ports_by_namespace_and_name() {
    let mut set = ChangedServices::default();
    set.insert("default", "web");
    assert!(set.contains("default", "web"));
    assert!(!set.contains("other", "web"));
    assert!(!set.contains("default", "we"));
    let mut more = ChangedServices::default();
    more.insert("other", "web");
    set.extend(more);
    assert_eq!(set.len(), 2);
    assert_eq!(set.names(), vec!["default/web", "other/web"]);
}

#[test]
fn a_streamed_relist_changes_nothing_until_it_finishes() {
    let mut index = mk_index();
    index.reset_services(&[
        mk_service("default", "a", "10.96.0.10"),
        mk_service("default", "b", "10.96.0.11"),
    ]);
    index.apply_slice(&mk_slice(
        "default",
        "a",
        "a-1",
        &[("10.244.1.5", true, NODE)],
    ));
    index.take_pending();

    // A watch restarted: "b" is gone, "c" is new, "a" moved to another address.
    index.begin_services();
    index.apply_service(&mk_service("default", "c", "10.96.0.12"));
    index.apply_service(&mk_service("default", "a", "10.96.0.20"));
    let names = |index: &Index| -> Vec<String> {
        index
            .view()
            .services
            .iter()
            .map(|p| p.name.name.clone())
            .collect()
    };
    assert_eq!(names(&index), vec!["a", "b"], "nothing removed mid-list");
    assert!(!index.has_pending());
    index.finish_services();
    assert_eq!(names(&index), vec!["a", "c"]);
    assert_eq!(
        changed(&mut index),
        vec!["default/a", "default/b", "default/c"]
    );
    // Endpoints survive the relist of their Service.
    assert_eq!(endpoint_ips(&index, "a"), vec!["10.244.1.5"]);
    assert_eq!(
        index.view().services[0].cluster_ips[0].to_string(),
        "10.96.0.20"
    );
}

#[test]
fn a_streamed_slice_relist_removes_unlisted_slices_at_the_end() {
    let mut index = mk_index();
    index.apply_service(&mk_service("default", "a", "10.96.0.10"));
    index.apply_slice(&mk_slice(
        "default",
        "a",
        "a-1",
        &[("10.244.1.5", true, NODE)],
    ));
    index.apply_slice(&mk_slice(
        "default",
        "a",
        "a-2",
        &[("10.244.1.6", true, NODE)],
    ));
    index.take_pending();
    index.begin_slices();
    index.apply_slice(&mk_slice(
        "default",
        "a",
        "a-2",
        &[("10.244.1.6", true, NODE)],
    ));
    assert_eq!(endpoint_ips(&index, "a").len(), 2);
    assert!(!index.has_pending());
    index.finish_slices();
    assert_eq!(endpoint_ips(&index, "a"), vec!["10.244.1.6"]);
    assert_eq!(changed(&mut index), vec!["default/a"]);
}

#[test]
fn endpoints_merge_across_slices_as_the_datapath_conversion_does() {
    use berth_datapath::plan::convert::build_node_view;
    let svc = mk_service("default", "a", "10.96.0.10");
    let slices = [
        // The same address twice, in two slices: kept once.
        mk_slice(
            "default",
            "a",
            "a-1",
            &[("10.244.1.5", true, NODE), ("10.244.1.6", false, "node-2")],
        ),
        mk_slice(
            "default",
            "a",
            "a-2",
            &[("10.244.1.5", true, NODE), ("10.244.1.7", true, "node-3")],
        ),
        mk_udp_slice("default", "a", "a-3", &[("10.244.1.8", true, NODE)]),
    ];
    let mut index = mk_index();
    index.apply_slice(&slices[2]);
    index.apply_service(&svc);
    index.apply_slice(&slices[1]);
    index.apply_slice(&slices[0]);
    let node = mk_node(NODE, "198.18.0.11");
    let (expected, errors) = build_node_view(&node, &[svc], &slices, ProxyMode::Full);
    assert!(errors.is_empty());
    assert_eq!(index.view().services, expected.services);
}

fn mk_node_port_service(
    name: &str,
    ip: &str,
    node_port: u16,
) -> k8s_openapi::api::core::v1::Service {
    let mut json = mk_service_json(
        "default",
        name,
        ip,
        serde_json::json!([{"name": "http", "port": 80, "protocol": "TCP", "nodePort": node_port}]),
    );
    json["spec"]["type"] = "NodePort".into();
    berth_testing::from_json(json)
}

fn node_port_of(index: &Index, name: &str) -> Option<u16> {
    let ports: Vec<Option<u16>> = index
        .view()
        .services
        .iter()
        .filter(|p| p.name.name == name)
        .map(|p| p.node_port)
        .collect();
    assert_eq!(ports.len(), 1, "{name} has one port in the view");
    ports[0]
}

#[test]
fn an_out_of_range_node_port_is_not_programmed_at_create() {
    let mut index = mk_index();
    index.apply_service(&mk_node_port_service("web", "10.96.0.10", 40123));
    assert_eq!(node_port_of(&index, "web"), None);
    // The Service itself is still programmed (its ClusterIP).
    assert_eq!(changed(&mut index), vec!["default/web"]);

    // The agent's range is the cluster's: a port outside the default one may be in it.
    let mut index = mk_index().with_node_port_range(berth_core::PortRange {
        first: 40000,
        last: 40999,
    });
    index.apply_service(&mk_node_port_service("web", "10.96.0.10", 40123));
    assert_eq!(node_port_of(&index, "web"), Some(40123));
}

#[test]
fn an_update_to_an_out_of_range_node_port_keeps_the_last_good_one() {
    let mut index = mk_index();
    index.apply_service(&mk_node_port_service("web", "10.96.0.10", 30080));
    assert_eq!(node_port_of(&index, "web"), Some(30080));
    index.take_pending();
    index.apply_service(&mk_node_port_service("web", "10.96.0.10", 40123));
    assert_eq!(node_port_of(&index, "web"), Some(30080));
    assert!(!index.has_pending(), "nothing to program");
    // Back in range: the new value is programmed.
    index.apply_service(&mk_node_port_service("web", "10.96.0.10", 30081));
    assert_eq!(node_port_of(&index, "web"), Some(30081));
}

#[test]
fn a_node_port_another_service_holds_is_not_programmed() {
    let mut index = mk_index();
    index.apply_service(&mk_node_port_service("web", "10.96.0.10", 30080));
    // Created with it: none.
    index.apply_service(&mk_node_port_service("api", "10.96.0.11", 30080));
    assert_eq!(node_port_of(&index, "web"), Some(30080));
    assert_eq!(node_port_of(&index, "api"), None);
    // Updated to it: keeps its own.
    index.apply_service(&mk_node_port_service("api", "10.96.0.11", 30081));
    index.apply_service(&mk_node_port_service("api", "10.96.0.11", 30080));
    assert_eq!(node_port_of(&index, "api"), Some(30081));
    // A relist keeps each port with the Service that had it.
    index.reset_services(&[
        mk_node_port_service("api", "10.96.0.11", 30080),
        mk_node_port_service("web", "10.96.0.10", 30080),
    ]);
    assert_eq!(node_port_of(&index, "web"), Some(30080));
    assert_eq!(node_port_of(&index, "api"), Some(30081));
    // Once the holder is gone, the port is free for the next write.
    index.delete_service(&mk_node_port_service("web", "10.96.0.10", 30080));
    index.apply_service(&mk_node_port_service("api", "10.96.0.11", 30080));
    assert_eq!(node_port_of(&index, "api"), Some(30080));
}

fn mk_bounded_index(max_endpoints_per_port: usize) -> Index {
    mk_index().with_policy(berth_api::ServicePolicy {
        bounds: berth_api::ServiceBounds {
            max_ports: 1,
            max_endpoints_per_port,
            max_endpoints: 10,
        },
        ..Default::default()
    })
}

#[test]
fn a_service_past_a_bound_gets_no_datapath_until_it_fits_again() {
    let mut index = mk_bounded_index(2);
    index.apply_service(&mk_service("default", "web", "10.96.0.10"));
    index.apply_service(&mk_service("default", "api", "10.96.0.11"));
    index.take_pending();
    let three = [
        ("10.244.1.5", true, NODE),
        ("10.244.1.6", true, NODE),
        ("10.244.1.7", true, NODE),
    ];
    // Three endpoints on a port bounded at two: the whole Service leaves the view.
    index.apply_slice(&mk_slice("default", "web", "web-abc", &three));
    assert_eq!(changed(&mut index), vec!["default/web"]);
    assert!(index.view().services.iter().all(|p| p.name.name != "web"));
    // The other Service is untouched.
    assert_eq!(index.view().services.len(), 1);
    // Still too many: nothing to report.
    let mut other = three;
    other[2].0 = "10.244.1.8";
    index.apply_slice(&mk_slice("default", "web", "web-abc", &other));
    assert!(!index.has_pending());
    // Back within the bound through a slice change alone: programmed again, endpoints and all.
    index.apply_slice(&mk_slice("default", "web", "web-abc", &three[..2]));
    assert_eq!(changed(&mut index), vec!["default/web"]);
    assert_eq!(
        endpoint_ips(&index, "web"),
        vec!["10.244.1.5", "10.244.1.6"]
    );
}

#[test]
fn a_refused_service_is_forgotten_when_deleted_or_unlisted() {
    let mut index = mk_bounded_index(0);
    let web = mk_service("default", "web", "10.96.0.10");
    index.apply_service(&web);
    index.apply_slice(&mk_slice(
        "default",
        "web",
        "web-abc",
        &[("10.244.1.5", true, NODE)],
    ));
    assert!(index.view().services.is_empty());
    index.delete_service(&web);
    index.take_pending();
    // A slice change of a deleted Service programs nothing.
    index.apply_slice(&mk_slice("default", "web", "web-abc", &[]));
    assert!(index.view().services.is_empty());

    index.apply_service(&web);
    index.apply_slice(&mk_slice(
        "default",
        "web",
        "web-abc",
        &[("10.244.1.5", true, NODE)],
    ));
    index.reset_services(&[]);
    index.apply_slice(&mk_slice("default", "web", "web-abc", &[]));
    assert!(index.view().services.is_empty());
}

/// A Service port fed by one slice holds that slice's list itself, not a copy (the agent holds
/// every endpoint of the cluster; two copies were 4.8 MB at 100,000 endpoints); fed by two, a
/// merged list of its own.
#[test]
fn a_port_fed_by_one_slice_shares_its_list() {
    let mut index = mk_index();
    index.apply_service(&mk_service("default", "web", "10.96.0.10"));
    index.apply_slice(&mk_slice(
        "default",
        "web",
        "web-a",
        &[("10.244.1.5", true, NODE), ("10.244.1.6", true, NODE)],
    ));
    let first = index.view().services[0].endpoints.clone();
    // The port is planned again from the slice (a new ClusterIP): the same list.
    index.apply_service(&mk_service("default", "web", "10.96.0.11"));
    let again = &index.view().services[0];
    assert_eq!(
        again.cluster_ips,
        vec!["10.96.0.11".parse::<std::net::IpAddr>().unwrap()]
    );
    assert!(again.endpoints.shares(&first));

    index.apply_slice(&mk_slice(
        "default",
        "web",
        "web-b",
        &[("10.244.2.5", true, "node-2")],
    ));
    let merged = index.view().services[0].endpoints.clone();
    assert_eq!(merged.len(), 3);
    assert!(!merged.shares(&first));
    index.apply_service(&mk_service("default", "web", "10.96.0.12"));
    assert!(!index.view().services[0].endpoints.shares(&merged));
    assert_eq!(index.view().services[0].endpoints, merged);
}

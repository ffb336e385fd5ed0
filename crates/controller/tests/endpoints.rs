//! The endpoints controller against the lab API server over real HTTP: Endpoints and
//! EndpointSlices follow pods, Services and Nodes, berth never touches slices it does not manage,
//! and everything converges after injected faults.
//!
//! Address plan: pods 10.244.<node>.<n>/24 on nodes n1 (zone z1) and n2 (zone z2); Services
//! 10.96.0.0/16.

#![allow(clippy::unwrap_used)]

mod endpoints_support;

use berth_api::names::annotation::ENDPOINTS_LAST_CHANGE_TRIGGER_TIME;
use berth_controller::endpoints::EndpointsConfig;
use berth_endpoints::{LABEL_MANAGED_BY, LABEL_SERVICE_NAME, MANAGED_BY_BERTH};
use berth_lab::LabApiServer;
use endpoints_support::*;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn ips(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test]
async fn endpoints_follow_pod_readiness() {
    let env = Env::start().await;
    env.create_service(mk_service("web", "web", "10.96.0.10", json!(8080)))
        .await;
    env.create_pod(mk_pod("a", "web", "n1", 8080), "10.244.1.5", true)
        .await;
    env.create_pod(mk_pod("b", "web", "n2", 8080), "10.244.2.5", false)
        .await;
    env.create_pod(mk_pod("other", "api", "n2", 8080), "10.244.2.9", true)
        .await;

    let want = Some((ips(&["10.244.1.5"]), ips(&["10.244.2.5"])));
    eventually("ready and not-ready addresses", WAIT, || async {
        (env.endpoint_ips("web").await == want).then_some(())
    })
    .await;
    let slices = env.berth_slices("web").await;
    assert_eq!(slices.len(), 1);
    let slice = &slices[0];
    assert_eq!(slice.address_type, "IPv4");
    let owner = &slice.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(owner.kind, "Service");
    assert_eq!(owner.controller, Some(true));
    let labels = slice.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[LABEL_MANAGED_BY], MANAGED_BY_BERTH);
    assert_eq!(labels[LABEL_SERVICE_NAME], "web");
    assert_eq!(labels["team"], "shop");
    let zones: Vec<Option<String>> = slice.endpoints.iter().map(|e| e.zone.clone()).collect();
    assert_eq!(zones, vec![Some("z1".to_owned()), Some("z2".to_owned())]);
    assert_eq!(
        env.slice_endpoints("web").await,
        vec![
            ("10.244.1.5".to_owned(), true, true, false),
            ("10.244.2.5".to_owned(), false, false, false)
        ]
    );

    // b becomes ready, a stops being ready.
    env.set_pod_status("b", "10.244.2.5", true).await;
    env.set_pod_status("a", "10.244.1.5", false).await;
    let want = Some((ips(&["10.244.2.5"]), ips(&["10.244.1.5"])));
    eventually("readiness flip", WAIT, || async {
        (env.endpoint_ips("web").await == want).then_some(())
    })
    .await;
    eventually("slice readiness flip", WAIT, || async {
        let got = env.slice_endpoints("web").await;
        (got == vec![
            ("10.244.1.5".to_owned(), false, false, false),
            ("10.244.2.5".to_owned(), true, true, false),
        ])
        .then_some(())
    })
    .await;
    // Still one slice, rewritten in place.
    let after = env.berth_slices("web").await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].metadata.name, slice.metadata.name);
    env.stop().await;
}

#[tokio::test]
async fn publish_not_ready_addresses_lists_every_pod_as_ready() {
    let env = Env::start().await;
    let mut svc = mk_service("web", "web", "10.96.0.11", json!(8080));
    svc["spec"]["publishNotReadyAddresses"] = json!(true);
    env.create_service(svc).await;
    env.create_pod(mk_pod("a", "web", "n1", 8080), "10.244.1.5", false)
        .await;
    let want = Some((ips(&["10.244.1.5"]), vec![]));
    eventually("not-ready pod published", WAIT, || async {
        (env.endpoint_ips("web").await == want).then_some(())
    })
    .await;
    eventually("slice ready by publishNotReadyAddresses", WAIT, || async {
        (env.slice_endpoints("web").await == vec![("10.244.1.5".to_owned(), true, false, false)])
            .then_some(())
    })
    .await;
    env.stop().await;
}

#[tokio::test]
async fn terminating_pods_leave_endpoints_but_stay_in_slices_as_terminating() {
    let env = Env::start_with(
        LabApiServer::builder().graceful_pod_deletion(true),
        EndpointsConfig::default(),
    )
    .await;
    env.create_service(mk_service("web", "web", "10.96.0.12", json!(8080)))
        .await;
    env.create_pod(mk_pod("a", "web", "n1", 8080), "10.244.1.5", true)
        .await;
    env.create_pod(mk_pod("b", "web", "n1", 8080), "10.244.1.6", true)
        .await;
    let want = Some((ips(&["10.244.1.5", "10.244.1.6"]), vec![]));
    eventually("both pods", WAIT, || async {
        (env.endpoint_ips("web").await == want).then_some(())
    })
    .await;

    env.pods()
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    assert!(env
        .pods()
        .get("a")
        .await
        .unwrap()
        .metadata
        .deletion_timestamp
        .is_some());
    let want = Some((ips(&["10.244.1.6"]), vec![]));
    eventually("terminating pod left out of Endpoints", WAIT, || async {
        (env.endpoint_ips("web").await == want).then_some(())
    })
    .await;
    eventually("terminating pod in slices", WAIT, || async {
        let got = env.slice_endpoints("web").await;
        (got == vec![
            ("10.244.1.5".to_owned(), false, true, true),
            ("10.244.1.6".to_owned(), true, true, false),
        ])
        .then_some(())
    })
    .await;

    // The kubelet's final delete removes it everywhere.
    env.pods()
        .delete("a", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually("pod gone from slices", WAIT, || async {
        (env.slice_endpoints("web").await == vec![("10.244.1.6".to_owned(), true, true, false)])
            .then_some(())
    })
    .await;
    env.stop().await;
}

#[tokio::test]
async fn named_ports_resolve_per_pod_and_split_slices() {
    let env = Env::start().await;
    env.create_service(mk_service("web", "web", "10.96.0.13", json!("http")))
        .await;
    env.create_pod(mk_pod("a", "web", "n1", 8080), "10.244.1.5", true)
        .await;
    env.create_pod(mk_pod("b", "web", "n1", 8080), "10.244.1.6", true)
        .await;
    env.create_pod(mk_pod("c", "web", "n2", 9090), "10.244.2.5", true)
        .await;
    let slices = eventually("two slices, one per port number", WAIT, || async {
        let slices = env.berth_slices("web").await;
        (slices.len() == 2 && slices.iter().map(|s| s.endpoints.len()).sum::<usize>() == 3)
            .then_some(slices)
    })
    .await;
    let mut by_port: Vec<(i32, Vec<String>)> = slices
        .iter()
        .map(|s| {
            let port = s.ports.as_ref().unwrap()[0].port.unwrap();
            let mut ips: Vec<String> = s.endpoints.iter().map(|e| e.addresses[0].clone()).collect();
            ips.sort();
            (port, ips)
        })
        .collect();
    by_port.sort();
    assert_eq!(
        by_port,
        vec![
            (8080, ips(&["10.244.1.5", "10.244.1.6"])),
            (9090, ips(&["10.244.2.5"]))
        ]
    );
    let ep = env.endpoints().get("web").await.unwrap();
    let mut subsets: Vec<(i32, usize)> = ep
        .subsets
        .unwrap()
        .iter()
        .map(|s| {
            (
                s.ports.as_ref().unwrap()[0].port,
                s.addresses.as_ref().unwrap().len(),
            )
        })
        .collect();
    subsets.sort();
    assert_eq!(subsets, vec![(8080, 2), (9090, 1)]);
    env.stop().await;
}

#[tokio::test]
async fn selector_and_port_changes_are_followed() {
    let env = Env::start().await;
    env.create_service(mk_service("web", "web", "10.96.0.14", json!(8080)))
        .await;
    env.create_pod(mk_pod("a", "web", "n1", 8080), "10.244.1.5", true)
        .await;
    env.create_pod(mk_pod("b", "canary", "n2", 8080), "10.244.2.5", true)
        .await;
    let want = Some((ips(&["10.244.1.5"]), vec![]));
    eventually("first selector", WAIT, || async {
        (env.endpoint_ips("web").await == want).then_some(())
    })
    .await;

    let patch = json!({"spec": {"selector": {"app": "canary"}}});
    env.services()
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let want = Some((ips(&["10.244.2.5"]), vec![]));
    eventually("new selector", WAIT, || async {
        (env.endpoint_ips("web").await == want).then_some(())
    })
    .await;
    eventually("slices follow the selector", WAIT, || async {
        (env.slice_endpoints("web").await == vec![("10.244.2.5".to_owned(), true, true, false)])
            .then_some(())
    })
    .await;

    let patch = json!({"spec": {"ports": [{"name": "http", "port": 80, "targetPort": 9443, "protocol": "TCP"}]}});
    env.services()
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually("new target port in slices", WAIT, || async {
        let slices = env.berth_slices("web").await;
        let ports: Vec<Option<i32>> = slices
            .iter()
            .flat_map(|s| s.ports.iter().flatten().map(|p| p.port))
            .collect();
        (slices.len() == 1 && ports == vec![Some(9443)] && slices[0].endpoints.len() == 1)
            .then_some(())
    })
    .await;
    eventually("new target port in Endpoints", WAIT, || async {
        let ep = env.endpoints().get("web").await.unwrap();
        let port = ep.subsets?.first()?.ports.as_ref()?.first()?.port;
        (port == 9443).then_some(())
    })
    .await;
    env.stop().await;
}

#[tokio::test]
async fn pod_deletion_and_service_deletion_clean_up() {
    let env = Env::start().await;
    env.create_service(mk_service("web", "web", "10.96.0.15", json!(8080)))
        .await;
    env.create_pod(mk_pod("a", "web", "n1", 8080), "10.244.1.5", true)
        .await;
    env.create_pod(mk_pod("b", "web", "n1", 8080), "10.244.1.6", true)
        .await;
    let want = Some((ips(&["10.244.1.5", "10.244.1.6"]), vec![]));
    eventually("both pods", WAIT, || async {
        (env.endpoint_ips("web").await == want).then_some(())
    })
    .await;
    env.pods()
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    let want = Some((ips(&["10.244.1.6"]), vec![]));
    eventually("deleted pod gone", WAIT, || async {
        (env.endpoint_ips("web").await == want).then_some(())
    })
    .await;
    eventually("deleted pod gone from slices", WAIT, || async {
        (env.slice_endpoints("web").await.len() == 1).then_some(())
    })
    .await;

    env.services()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "Endpoints and slices deleted with the Service",
        WAIT,
        || async {
            let gone = env.endpoints().get_opt("web").await.unwrap().is_none()
                && env.berth_slices("web").await.is_empty();
            gone.then_some(())
        },
    )
    .await;
    env.stop().await;
}

#[tokio::test]
async fn more_than_a_hundred_pods_fill_several_slices() {
    let env = Env::start().await;
    env.create_service(mk_service("web", "web", "10.96.0.16", json!(8080)))
        .await;
    for i in 0..250 {
        let node = if i % 2 == 0 { "n1" } else { "n2" };
        let ip = format!("10.244.{}.{}", 10 + i / 200, i % 200 + 1);
        env.create_pod(mk_pod(&format!("p{i}"), "web", node, 8080), &ip, true)
            .await;
    }
    let slices = eventually("250 endpoints in slices", WAIT, || async {
        let slices = env.berth_slices("web").await;
        let total: usize = slices.iter().map(|s| s.endpoints.len()).sum();
        (total == 250).then_some(slices)
    })
    .await;
    assert_eq!(slices.len(), 3, "100 + 100 + 50");
    assert!(slices.iter().all(|s| s.endpoints.len() <= 100));
    let (ready, _) = env.endpoint_ips("web").await.unwrap();
    assert_eq!(ready.len(), 250);
    env.stop().await;
}

#[tokio::test]
async fn foreign_slices_are_untouched_and_stale_berth_slices_removed() {
    let mut env = Env::start().await;
    env.stop_controller().await;
    let svc = env
        .create_service(mk_service("web", "web", "10.96.0.17", json!(8080)))
        .await;
    env.create_pod(mk_pod("a", "web", "n1", 8080), "10.244.1.5", true)
        .await;
    let foreign: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "web-foreign", "namespace": NS,
                     "labels": {LABEL_SERVICE_NAME: "web",
                                LABEL_MANAGED_BY: "endpointslice-controller.k8s.io"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.244.9.9"]}]
    }))
    .unwrap();
    let foreign = env
        .slices()
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    // berth's label on a slice of an older Service of the same name, and a slice of a Service
    // that no longer exists: both are stale.
    let stale = |name: &str, service: &str, uid: &str| -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NS,
                         "labels": {LABEL_SERVICE_NAME: service, LABEL_MANAGED_BY: MANAGED_BY_BERTH},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service,
                                              "uid": uid, "controller": true}]},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.8.8"]}]
        }))
        .unwrap()
    };
    env.slices()
        .create(&PostParams::default(), &stale("web-old", "web", "old-uid"))
        .await
        .unwrap();
    env.slices()
        .create(&PostParams::default(), &stale("gone-1", "gone", "gone-uid"))
        .await
        .unwrap();

    env.start_controller(EndpointsConfig::default());
    let uid = svc.metadata.uid.clone().unwrap();
    eventually(
        "one slice of berth, owned by the current Service",
        WAIT,
        || async {
            let slices = env.berth_slices("web").await;
            let ok = slices.len() == 1
                && slices[0].metadata.owner_references.as_ref().unwrap()[0].uid == uid
                && slices[0].endpoints.len() == 1
                && slices[0].endpoints[0].addresses == ips(&["10.244.1.5"])
                && env.berth_slices("gone").await.is_empty();
            ok.then_some(())
        },
    )
    .await;
    let after = env.slices().get("web-foreign").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        foreign.metadata.resource_version
    );
    assert_eq!(after.endpoints, foreign.endpoints);
    env.stop().await;
}

#[tokio::test]
async fn services_without_selector_are_left_alone() {
    let env = Env::start().await;
    let mut svc = mk_service("manual", "web", "10.96.0.18", json!(8080));
    svc["spec"].as_object_mut().unwrap().remove("selector");
    env.create_service(svc).await;
    let manual = serde_json::from_value(json!({
        "metadata": {"name": "manual", "namespace": NS},
        "subsets": [{"addresses": [{"ip": "192.0.2.10"}], "ports": [{"port": 8080}]}]
    }))
    .unwrap();
    let manual = env
        .endpoints()
        .create(&PostParams::default(), &manual)
        .await
        .unwrap();
    env.create_pod(mk_pod("a", "web", "n1", 8080), "10.244.1.5", true)
        .await;
    // A Service created afterwards proves the controller has been at work meanwhile.
    env.create_service(mk_service("web", "web", "10.96.0.19", json!(8080)))
        .await;
    eventually("the selector Service synced", WAIT, || async {
        env.endpoint_ips("web").await.filter(|(r, _)| !r.is_empty())
    })
    .await;
    let after = env.endpoints().get("manual").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        manual.metadata.resource_version
    );
    assert!(env.berth_slices("manual").await.is_empty());
    env.stop().await;
}

#[tokio::test]
async fn writes_carry_the_time_of_the_change_that_triggered_them() {
    let env = Env::start().await;
    env.create_service(mk_service("web", "web", "10.96.0.20", json!(8080)))
        .await;
    eventually("empty Endpoints", WAIT, || async {
        env.endpoint_ips("web").await
    })
    .await;
    let before = chrono::Utc::now() - chrono::Duration::seconds(1);
    env.create_pod(mk_pod("a", "web", "n1", 8080), "10.244.1.5", true)
        .await;
    let ep = eventually("pod in Endpoints", WAIT, || async {
        let ep = env.endpoints().get("web").await.unwrap();
        ep.subsets.is_some().then_some(ep)
    })
    .await;
    let stamp = |a: Option<&std::collections::BTreeMap<String, String>>| {
        let text = a.unwrap()[ENDPOINTS_LAST_CHANGE_TRIGGER_TIME].clone();
        chrono::DateTime::parse_from_rfc3339(&text).unwrap()
    };
    let at = stamp(ep.metadata.annotations.as_ref());
    assert!(at >= before && at <= chrono::Utc::now(), "{at}");
    let slices = eventually("pod in slices", WAIT, || async {
        let slices = env.berth_slices("web").await;
        (slices.iter().map(|s| s.endpoints.len()).sum::<usize>() == 1).then_some(slices)
    })
    .await;
    let slice = slices.iter().find(|s| !s.endpoints.is_empty()).unwrap();
    assert_eq!(stamp(slice.metadata.annotations.as_ref()), at);
    env.stop().await;
}

#[tokio::test]
async fn metrics_count_syncs_and_slice_changes() {
    let mut env = Env::start().await;
    env.create_service(mk_service("web", "web", "10.96.0.21", json!(8080)))
        .await;
    env.create_pod(mk_pod("a", "web", "n1", 8080), "10.244.1.5", true)
        .await;
    eventually("pod in slices", WAIT, || async {
        (env.slice_endpoints("web").await.len() == 1).then_some(())
    })
    .await;
    env.stop_controller().await;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &env.registry).unwrap();
    for needle in [
        "syncs_total{result=\"changed\"}",
        "slice_changes_total{op=\"create\"}",
        "endpoints_changes_total{op=\"create\"}",
        "sync_duration_seconds_count",
    ] {
        assert!(text.contains(needle), "{needle} missing from\n{text}");
    }
    let requests = env.server.request_counts();
    assert!(requests.writes >= 3 && requests.reads >= 5, "{requests:?}");
    env.server.shutdown().await.unwrap();
}

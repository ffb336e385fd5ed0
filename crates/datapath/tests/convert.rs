//! Kubernetes objects -> input model: proxy-mode and label filters, endpoint conditions, ports.
#![allow(clippy::unwrap_used)]

use berth_api::names::label;
use berth_core::{IpFamily, Protocol, TrafficPolicy};
use berth_datapath::plan::convert::*;
use berth_datapath::*;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

fn mk_service(
    name: &str,
    labels: serde_json::Value,
    spec: serde_json::Value,
    status: serde_json::Value,
) -> Service {
    let mut service = berth_testing::mk_service_json("ns1", name, spec);
    service["metadata"]["labels"] = labels;
    service["status"] = status;
    berth_testing::from_json(service)
}

fn mk_node() -> Node {
    berth_testing::mk_node(
        "node-a",
        serde_json::Value::Null,
        &[
            ("InternalIP", "198.18.0.11"),
            ("Hostname", "node-a"),
            ("InternalIP", "fd00::11"),
        ],
    )
}

fn mk_slice(service: &str, name: &str, endpoints: serde_json::Value) -> EndpointSlice {
    berth_testing::mk_slice(
        "ns1",
        service,
        name,
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 5353, "protocol": "UDP"}]),
        endpoints,
    )
}

fn lb_service() -> Service {
    mk_service(
        "web",
        json!({}),
        json!({
            "type": "LoadBalancer",
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10", "fd00:96::10"],
            "externalIPs": ["198.18.0.150"],
            "externalTrafficPolicy": "Local",
            "internalTrafficPolicy": "Local",
            "healthCheckNodePort": 30120,
            "loadBalancerSourceRanges": ["203.0.113.0/24"],
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
            "ports": [
                {"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"},
                {"name": "dns", "port": 53, "nodePort": 30053, "protocol": "UDP"}
            ]
        }),
        json!({"loadBalancer": {"ingress": [{"ip": "198.18.0.200"}, {"ip": "198.18.0.201", "ipMode": "Proxy"}, {"hostname": "lb.example"}]}}),
    )
}

#[test]
fn proxy_mode_and_labels() {
    let plain = mk_service(
        "a",
        json!({}),
        json!({"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}),
        json!({}),
    );
    let ours = mk_service(
        "b",
        json!({(label::SERVICE_PROXY_NAME): "berth"}),
        json!({"clusterIP": "10.96.0.2", "ports": [{"port": 80}]}),
        json!({}),
    );
    let theirs = mk_service(
        "c",
        json!({(label::SERVICE_PROXY_NAME): "other"}),
        json!({"clusterIP": "10.96.0.3", "ports": [{"port": 80}]}),
        json!({}),
    );
    let headless = mk_service(
        "d",
        json!({}),
        json!({"clusterIP": "None", "ports": [{"port": 80}]}),
        json!({}),
    );
    let headless_label = mk_service(
        "e",
        json!({(label::HEADLESS): ""}),
        json!({"clusterIP": "10.96.0.5", "ports": [{"port": 80}]}),
        json!({}),
    );
    let external_name = mk_service(
        "f",
        json!({}),
        json!({"type": "ExternalName", "externalName": "x.example"}),
        json!({}),
    );
    let cases = [
        (ProxyMode::Full, [true, true, false, false, false, false]),
        (
            ProxyMode::Labeled,
            [false, true, false, false, false, false],
        ),
        (ProxyMode::None, [false; 6]),
    ];
    for (mode, expected) in cases {
        let got: Vec<bool> = [
            &plain,
            &ours,
            &theirs,
            &headless,
            &headless_label,
            &external_name,
        ]
        .iter()
        .map(|s| is_proxied(s, mode))
        .collect();
        assert_eq!(got, expected, "{mode:?}");
    }
    assert_eq!("labeled".parse::<ProxyMode>().unwrap(), ProxyMode::Labeled);
    assert!("sometimes".parse::<ProxyMode>().is_err());
}

#[test]
fn load_balancer_service_with_everything() {
    let slices = vec![
        mk_slice(
            "web",
            "web-1",
            json!([
                {"addresses": ["10.244.1.2"], "nodeName": "node-a", "conditions": {"ready": true}},
                {"addresses": ["10.244.2.2"], "nodeName": "node-b", "conditions": {"ready": false, "serving": true, "terminating": true}},
                {"addresses": ["10.244.2.3"], "nodeName": "node-b"}
            ]),
        ),
        // The same endpoint in a second slice is kept once; a slice of another Service is ignored.
        mk_slice(
            "web",
            "web-2",
            json!([{"addresses": ["10.244.1.2"], "nodeName": "node-a"}]),
        ),
        mk_slice("other", "other-1", json!([{"addresses": ["10.244.9.9"]}])),
    ];
    let ports = build_service_ports(&lb_service(), &slices).unwrap();
    assert_eq!(ports.len(), 2);
    let http = &ports[0];
    assert_eq!(http.name.to_string(), "ns1/web:http");
    assert_eq!(
        (http.protocol, http.port, http.node_port),
        (Protocol::Tcp, 80, Some(30080))
    );
    assert_eq!(http.cluster_ips.len(), 2);
    assert_eq!(
        http.load_balancer_vips(IpFamily::V4),
        vec!["198.18.0.200".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(http.load_balancer_ingress.len(), 2);
    assert_eq!(http.source_ranges, vec!["203.0.113.0/24".parse().unwrap()]);
    assert_eq!(
        http.session_affinity,
        SessionAffinity::ClientIp {
            timeout_seconds: 60
        }
    );
    assert_eq!(
        (http.external_traffic_policy, http.internal_traffic_policy),
        (TrafficPolicy::Local, TrafficPolicy::Local)
    );
    assert_eq!(http.health_check_node_port, Some(30120));
    let eps: Vec<(String, bool, bool, bool)> = http
        .endpoints
        .iter()
        .map(|e| (e.address(), e.ready, e.serving, e.terminating))
        .collect();
    assert_eq!(
        eps,
        vec![
            ("10.244.1.2:8080".into(), true, true, false),
            ("10.244.2.2:8080".into(), false, true, true),
            ("10.244.2.3:8080".into(), true, true, false),
        ]
    );
    let dns = &ports[1];
    assert_eq!((dns.protocol, dns.port), (Protocol::Udp, 53));
    assert_eq!(dns.endpoints[0].port, 5353);
}

#[test]
fn cluster_ip_service_drops_node_ports_and_lb_fields() {
    let svc = mk_service(
        "plain",
        json!({}),
        json!({"clusterIP": "10.96.0.7", "ports": [{"port": 80, "nodePort": 30001}], "sessionAffinity": "ClientIP",
               "loadBalancerSourceRanges": ["10.0.0.0/8"], "externalTrafficPolicy": "Local"}),
        json!({}),
    );
    let ports = build_service_ports(&svc, &[]).unwrap();
    assert_eq!(ports[0].node_port, None);
    assert!(ports[0].source_ranges.is_empty());
    assert_eq!(
        ports[0].session_affinity,
        SessionAffinity::ClientIp {
            timeout_seconds: DEFAULT_AFFINITY_TIMEOUT_SECONDS
        }
    );
    assert_eq!(ports[0].health_check_node_port, None);
    assert!(ports[0].endpoints.is_empty());
    assert_eq!(ports[0].name.to_string(), "ns1/plain");
}

#[test]
fn invalid_services_are_skipped_not_fatal() {
    let bad = mk_service(
        "bad",
        json!({}),
        json!({"clusterIP": "10.96.0.999", "ports": [{"port": 80}]}),
        json!({}),
    );
    let bad_proto = mk_service(
        "bad2",
        json!({}),
        json!({"clusterIP": "10.96.0.8", "ports": [{"port": 80, "protocol": "ICMP"}]}),
        json!({}),
    );
    let good = mk_service(
        "good",
        json!({}),
        json!({"clusterIP": "10.96.0.9", "ports": [{"port": 80}]}),
        json!({}),
    );
    let (view, errors) = build_node_view(
        &mk_node(),
        &[bad, bad_proto, good, lb_service()],
        &[],
        ProxyMode::Full,
    );
    assert_eq!(errors.len(), 2);
    assert_eq!(view.node.name, "node-a");
    assert_eq!(view.node.addresses.len(), 2);
    let names: Vec<String> = view.services.iter().map(|s| s.name.to_string()).collect();
    assert_eq!(names, ["ns1/good", "ns1/web:http", "ns1/web:dns"]);
    // The converted view plans cleanly in both families.
    for family in [IpFamily::V4, IpFamily::V6] {
        let rs = plan(
            &view,
            &PlanOptions {
                family,
                ..PlanOptions::default()
            },
        );
        assert!(rs.rule_count() > 0);
    }
}

fn policy(cidrs: &[&str]) -> ServicePolicy {
    ServicePolicy {
        external_ip_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
        ..ServicePolicy::default()
    }
}

/// A tenant's LoadBalancer Service asking for external IPs and source ranges.
fn tenant(external_ips: &[&str], source_ranges: &[&str]) -> Service {
    mk_service(
        "tenant",
        json!({}),
        json!({"type": "LoadBalancer", "clusterIP": "10.96.0.20",
            "externalIPs": external_ips, "loadBalancerSourceRanges": source_ranges,
            "ports": [{"name": "https", "port": 443, "nodePort": 30443}]}),
        json!({"loadBalancer": {"ingress": [{"ip": "198.18.0.200"}]}}),
    )
}

#[test]
fn external_ips_only_inside_the_allowed_cidrs_and_bad_entries_drop_alone() {
    // (allowed CIDRs, externalIPs, source ranges,
    //  external IPs programmed, source ranges programmed, LB ingress kept, dropped entries)
    type Row<'a> = (
        &'a [&'a str],
        &'a [&'a str],
        &'a [&'a str],
        &'a [&'a str],
        &'a [&'a str],
        bool,
        &'a [&'a str],
    );
    let rows: &[Row] = &[
        // The default allows none: the API server's LAN address and port asked by a tenant.
        (
            &[],
            &["198.18.0.2"],
            &[],
            &[],
            &[],
            true,
            &[
                r#"spec.externalIPs[0]: Invalid value: "198.18.0.2": not inside the external IP CIDRs this cluster allows (none)"#,
            ],
        ),
        // Inside the allowed CIDR: programmed; outside: dropped alone.
        (
            &["203.0.113.0/24"],
            &["203.0.113.5", "198.18.0.2"],
            &[],
            &["203.0.113.5"],
            &[],
            true,
            &[
                r#"spec.externalIPs[1]: Invalid value: "198.18.0.2": not inside the external IP CIDRs this cluster allows (203.0.113.0/24)"#,
            ],
        ),
        // A leading zero (once octal in Go) drops that entry only, the ClusterIP stays.
        (
            &["0.0.0.0/0"],
            &["010.0.0.5", "10.0.0.6"],
            &[],
            &["10.0.0.6"],
            &[],
            true,
            &[r#"spec.externalIPs[0]: Invalid value: "010.0.0.5": must be a valid IP address"#],
        ),
        // One bad source range drops alone; the others still restrict.
        (
            &[],
            &[],
            &["192.0.2.0/24", "10.0.0.0/8x"],
            &[],
            &["192.0.2.0/24"],
            true,
            &[
                r#"spec.loadBalancerSourceRanges[1]: Invalid value: "10.0.0.0/8x": must be a valid CIDR"#,
            ],
        ),
        // Every source range bad: the load balancer stays closed rather than open to all.
        (
            &[],
            &[],
            &["010.0.0.0/8"],
            &[],
            &[],
            false,
            &[
                r#"spec.loadBalancerSourceRanges[0]: Invalid value: "010.0.0.0/8": must be a valid CIDR"#,
            ],
        ),
        // IPv6 allowed by its own CIDR only.
        (
            &["fd00:ee::/64"],
            &["fd00:ee::5", "fd00:ef::5"],
            &[],
            &["fd00:ee::5"],
            &[],
            true,
            &[
                r#"spec.externalIPs[1]: Invalid value: "fd00:ef::5": not inside the external IP CIDRs this cluster allows (fd00:ee::/64)"#,
            ],
        ),
    ];
    for (allowed, ext, ranges, want_ext, want_ranges, lb_kept, want_dropped) in rows {
        let ctx = format!("{allowed:?} {ext:?} {ranges:?}");
        let (ports, dropped) =
            build_service_ports_with(&tenant(ext, ranges), &[], &policy(allowed)).unwrap();
        assert_eq!(ports.len(), 1, "{ctx}");
        let p = &ports[0];
        assert_eq!(
            p.cluster_ips,
            vec!["10.96.0.20".parse::<std::net::IpAddr>().unwrap()],
            "{ctx}"
        );
        assert_eq!(p.node_port, Some(30443), "{ctx}");
        let got_ext: Vec<String> = p.external_ips.iter().map(ToString::to_string).collect();
        assert_eq!(got_ext, *want_ext, "{ctx}");
        let got_ranges: Vec<String> = p.source_ranges.iter().map(ToString::to_string).collect();
        assert_eq!(got_ranges, *want_ranges, "{ctx}");
        assert_eq!(!p.load_balancer_ingress.is_empty(), *lb_kept, "{ctx}");
        let got_dropped: Vec<String> = dropped.iter().map(ToString::to_string).collect();
        assert_eq!(got_dropped, *want_dropped, "{ctx}");
    }
}

#[test]
fn endpoints_on_one_node_share_its_name() {
    let slice = mk_slice(
        "web",
        "web-1",
        json!([
            {"addresses": ["10.244.1.5"], "nodeName": "node-a"},
            {"addresses": ["10.244.2.5"], "nodeName": "node-b"},
            {"addresses": ["10.244.1.6"], "nodeName": "node-a"},
            {"addresses": ["10.244.9.9"]},
        ]),
    );
    let eps = build_endpoints(&[&slice], "http", Protocol::Tcp);
    let names: Vec<Option<&str>> = eps.iter().map(|e| e.node_name.as_deref()).collect();
    assert_eq!(
        names,
        [Some("node-a"), Some("node-b"), Some("node-a"), None]
    );
    let (a, b, again) = (&eps[0].node_name, &eps[1].node_name, &eps[2].node_name);
    let same = |x: &Option<std::sync::Arc<str>>, y: &Option<std::sync::Arc<str>>| matches!((x, y), (Some(x), Some(y)) if std::sync::Arc::ptr_eq(x, y));
    assert!(same(a, again), "one allocation per node name");
    assert!(!same(a, b));
}

#[test]
fn topology_hints_and_the_nodes_zone_are_read() {
    let slice = mk_slice(
        "web",
        "web-1",
        json!([
            {"addresses": ["10.244.1.5"], "nodeName": "node-a",
             "hints": {"forZones": [{"name": "zone-a"}], "forNodes": [{"name": "node-a"}]}},
            {"addresses": ["10.244.2.5"], "nodeName": "node-b", "hints": {"forZones": []}},
            {"addresses": ["10.244.3.5"], "nodeName": "node-c"},
        ]),
    );
    let eps = build_endpoints(&[&slice], "http", Protocol::Tcp);
    assert_eq!(eps[0].zone_hints(), ["zone-a"]);
    assert_eq!(eps[0].node_hints(), ["node-a"]);
    // An empty list is no hint, as kube-proxy reads it.
    assert!(eps[1].hints.is_none() && eps[1].zone_hints().is_empty());
    assert!(eps[2].hints.is_none());

    let node = berth_testing::mk_node(
        "node-a",
        json!({"topology.kubernetes.io/zone": "zone-a"}),
        &[
            ("ExternalIP", "203.0.113.11"),
            ("InternalIP", "198.18.0.11"),
            ("InternalIP", "fd00::11"),
        ],
    );
    let info = build_node_info(&node);
    assert_eq!(info.zone.as_deref(), Some("zone-a"));
    // InternalIP first: the first of a family is the primary address.
    assert_eq!(
        info.primary_address(IpFamily::V4),
        Some("198.18.0.11".parse().unwrap())
    );
    assert_eq!(
        info.primary_address(IpFamily::V6),
        Some("fd00::11".parse().unwrap())
    );
    assert_eq!(build_node_info(&mk_node()).zone, None);
}

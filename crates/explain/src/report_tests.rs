use super::*;
use berth_core::parse_address;
use serde_json::json;

const NOW: i64 = 1_800_000_000;

fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(NOW, 0).unwrap()
}

fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn mk_lease(node: &str, renewed_ago: i64) -> Lease {
    let renew = DateTime::from_timestamp(NOW - renewed_ago, 0).unwrap();
    from(
        json!({"metadata": {"name": format!("berth-agent-{node}"), "namespace": "kube-system"},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 10,
                 "renewTime": renew.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)}}),
    )
}

fn mk_node(name: &str, labels: serde_json::Value) -> Node {
    from(json!({"metadata": {"name": name, "labels": labels}}))
}

fn mk_inputs(policy: &str, announced_by: Option<&str>) -> Inputs {
    let annotations = json!({});
    let records = announced_by
        .map(|node| {
            from(json!({
                "apiVersion": "berth.dev/v1alpha1", "kind": "ServiceL2Status",
                "metadata": {"name": "l2-0", "namespace": "berth-system"},
                "spec": {"node": node, "serviceNamespace": "default", "serviceName": "web",
                         "addresses": ["198.18.0.200"]}
            }))
        })
        .into_iter()
        .collect();
    Inputs {
        records,
        service: from(json!({
            "metadata": {"name": "web", "namespace": "default", "annotations": annotations},
            "spec": {"type": "LoadBalancer", "clusterIPs": ["10.96.0.10"], "externalTrafficPolicy": policy,
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.200"}]}}
        })),
        slices: vec![from(json!({
            "metadata": {"name": "web-1"}, "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.244.2.2"], "nodeName": "node2", "targetRef": {"kind": "Pod", "name": "web-a"},
                 "conditions": {"ready": true, "serving": true, "terminating": false}},
                {"addresses": ["10.244.1.2"], "nodeName": "node1", "targetRef": {"kind": "Pod", "name": "web-b"},
                 "conditions": {"ready": false, "serving": true, "terminating": true}}
            ]
        }))],
        nodes: vec![
            mk_node("node1", json!({})),
            mk_node("node2", json!({})),
            mk_node("node3", json!({})),
            mk_node(
                "node4",
                json!({"node.kubernetes.io/exclude-from-external-load-balancers": ""}),
            ),
        ],
        leases: vec![
            mk_lease("node1", 1),
            mk_lease("node2", 2),
            mk_lease("node3", 60),
            mk_lease("node4", 1),
        ],
        pools: vec![Pool {
            name: "default".into(),
            labels: BTreeMap::new(),
            ranges: vec![parse_address("198.18.0.200-198.18.0.250").unwrap()],
        }],
        advertisements: vec![("lan".into(), L2AdvertisementSpec::default())],
    }
}

fn standing<'a>(a: &'a Announcement, node: &str) -> &'a [String] {
    &a.candidates
        .iter()
        .find(|c| c.node == node)
        .unwrap()
        .excluded_because
}

#[test]
fn the_election_is_explained_with_its_inputs() {
    let ip: IpAddr = "198.18.0.200".parse().unwrap();
    let smallest = ["node1", "node2"]
        .into_iter()
        .min_by_key(|n| election_key(n, ip))
        .unwrap();
    let report = build_report(&mk_inputs("Cluster", Some(smallest)), now());
    let a = &report.announcements[0];
    assert_eq!(a.pools, ["default"]);
    assert_eq!(a.advertised_by, ["lan"]);
    assert_eq!(a.elected.as_deref(), Some(smallest));
    assert!(standing(a, "node1").is_empty() && standing(a, "node2").is_empty());
    assert_eq!(standing(a, "node3"), ["its agent holds no live Lease"]);
    assert_eq!(
        standing(a, "node4"),
        ["excluded from external load balancers"]
    );
    let keys: Vec<&str> = a.candidates.iter().map(|c| c.key.as_str()).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "candidates are listed in election order");
    let text = render(&report);
    assert!(text.contains(&format!("{smallest} announces it")), "{text}");
}

#[test]
fn local_policy_needs_a_ready_endpoint_on_the_node() {
    let report = build_report(&mk_inputs("Local", None), now());
    let a = &report.announcements[0];
    assert_eq!(
        a.elected.as_deref(),
        Some("node2"),
        "only node2 runs a Ready endpoint"
    );
    assert_eq!(
        standing(a, "node1"),
        ["no Ready endpoint here (externalTrafficPolicy: Local)"]
    );
    assert!(render(&report).contains("no agent has reported announcing it yet"));
}

#[test]
fn a_disagreeing_annotation_is_pointed_out() {
    let ip: IpAddr = "198.18.0.200".parse().unwrap();
    let other = ["node1", "node2"]
        .into_iter()
        .max_by_key(|n| election_key(n, ip))
        .unwrap();
    let text = render(&build_report(&mk_inputs("Cluster", Some(other)), now()));
    assert!(
        text.contains(&format!("the records say {other} announces it")),
        "{text}"
    );
}

#[test]
fn addresses_ports_and_endpoints_per_node() {
    let report = build_report(&mk_inputs("Cluster", None), now());
    assert_eq!(report.cluster_ips, ["10.96.0.10"]);
    assert_eq!(report.ports[0].node_port, Some(30080));
    assert_eq!(report.ports[0].target, "8080");
    let node1 = &report.endpoints["node1"][0];
    assert_eq!(
        (node1.address.as_str(), node1.pod.as_str()),
        ("10.244.1.2:8080", "web-b")
    );
    assert!(!node1.ready && node1.serving && node1.terminating);
    let text = render(&report);
    assert!(
        text.contains("80/TCP (http) -> target 8080, node port 30080 on every node"),
        "{text}"
    );
    assert!(text.contains("not ready, serving, terminating"), "{text}");
    assert!(text.contains("LoadBalancer  198.18.0.200"), "{text}");
}

#[test]
fn an_address_outside_every_pool_has_no_announcer() {
    let mut inputs = mk_inputs("Cluster", None);
    inputs.pools.clear();
    let report = build_report(&inputs, now());
    assert_eq!(report.announcements[0].elected, None);
    assert!(render(&report).contains("nobody can announce it"));
}

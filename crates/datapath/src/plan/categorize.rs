//! Which endpoints each traffic policy uses (kube-proxy's `CategorizeEndpoints`, topology hints
//! included: `pkg/proxy/topology.go`).

use crate::plan::input::{Endpoint, NodeInfo, ServicePort};
use berth_core::IpFamily;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Categorized<'a> {
    /// Endpoints for Cluster policy (ready, else serving+terminating), when the port uses them.
    pub cluster: Vec<&'a Endpoint>,
    /// This node's endpoints for Local policy (ready, else serving+terminating), when used.
    pub local: Vec<&'a Endpoint>,
    /// The union, in input order: each needs a SEP chain.
    pub reachable: Vec<&'a Endpoint>,
    /// Whether any usable endpoint exists anywhere in the cluster.
    pub has_any: bool,
}

/// Cluster endpoints are needed for Cluster internal policy, and for any external destination
/// (even with Local external policy, node-originated and pod traffic short-circuits to them).
pub fn uses_cluster_endpoints(port: &ServicePort, family: IpFamily) -> bool {
    !port.internal_policy_local() || port.externally_accessible(family)
}

pub fn uses_local_endpoints(port: &ServicePort, family: IpFamily) -> bool {
    port.internal_policy_local() || port.external_policy_local(family)
}

fn pick<'a>(endpoints: &[&'a Endpoint], keep: impl Fn(&Endpoint) -> bool) -> Vec<&'a Endpoint> {
    let ready: Vec<_> = endpoints
        .iter()
        .copied()
        .filter(|ep| keep(ep) && ep.ready)
        .collect();
    if !ready.is_empty() {
        return ready;
    }
    // Fallback only when nothing is ready: connections drain to terminating endpoints that still serve.
    endpoints
        .iter()
        .copied()
        .filter(|ep| keep(ep) && ep.serving && ep.terminating)
        .collect()
}

/// Which of the hints a node follows for one Service port, as kube-proxy's `topologyModeFromHints`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopologyMode {
    /// Every endpoint: some ready endpoint lacks a hint, or none is hinted for this node.
    All,
    /// Endpoints hinted for this node's zone.
    SameZone,
    /// Endpoints hinted for this node.
    SameNode,
}

/// Node hints win when every ready endpoint has one and one names this node; else zone hints
/// when every ready endpoint has one and one names this node's zone; else none. A node without
/// a zone label never matches a zone hint, so it uses every endpoint.
pub fn topology_mode(endpoints: &[&Endpoint], node: &NodeInfo) -> TopologyMode {
    let ready: Vec<&Endpoint> = endpoints.iter().copied().filter(|ep| ep.ready).collect();
    let all_have = |hints: fn(&Endpoint) -> &[String]| ready.iter().all(|ep| !hints(ep).is_empty());
    let any_names = |hints: fn(&Endpoint) -> &[String], name: &str| {
        ready.iter().any(|ep| hints(ep).iter().any(|h| h == name))
    };
    if all_have(Endpoint::node_hints) && any_names(Endpoint::node_hints, &node.name) {
        return TopologyMode::SameNode;
    }
    let zone = node.zone.as_deref().unwrap_or("");
    if all_have(Endpoint::zone_hints) && !zone.is_empty() && any_names(Endpoint::zone_hints, zone) {
        return TopologyMode::SameZone;
    }
    TopologyMode::All
}

fn available_for_topology(ep: &Endpoint, mode: TopologyMode, node: &NodeInfo) -> bool {
    match mode {
        TopologyMode::All => true,
        TopologyMode::SameNode => ep.node_hints().contains(&node.name),
        TopologyMode::SameZone => node
            .zone
            .as_ref()
            .is_some_and(|zone| ep.zone_hints().contains(zone)),
    }
}

/// Cluster endpoints: ready ones the topology mode admits, else (nothing ready anywhere, since a
/// mode other than `All` implies a ready endpoint in scope) serving+terminating ones anywhere.
fn pick_cluster<'a>(endpoints: &[&'a Endpoint], node: &NodeInfo) -> Vec<&'a Endpoint> {
    let mode = topology_mode(endpoints, node);
    let ready: Vec<_> = endpoints
        .iter()
        .copied()
        .filter(|ep| ep.ready && available_for_topology(ep, mode, node))
        .collect();
    if !ready.is_empty() {
        return ready;
    }
    pick(endpoints, |_| true)
}

pub fn categorize<'a>(port: &'a ServicePort, node: &NodeInfo, family: IpFamily) -> Categorized<'a> {
    let endpoints: Vec<&Endpoint> = port
        .endpoints
        .iter()
        .filter(|ep| family.contains(ep.ip))
        .collect();
    let has_any = endpoints
        .iter()
        .any(|ep| ep.ready || (ep.serving && ep.terminating));
    let cluster = if uses_cluster_endpoints(port, family) {
        pick_cluster(&endpoints, node)
    } else {
        Vec::new()
    };
    let local = if uses_local_endpoints(port, family) {
        pick(&endpoints, |ep| ep.is_local(node))
    } else {
        Vec::new()
    };
    let reachable = endpoints
        .iter()
        .copied()
        .filter(|ep| cluster.contains(ep) || local.contains(ep))
        .collect();
    Categorized {
        cluster,
        local,
        reachable,
        has_any,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::input::tests::mk_port;
    use crate::plan::input::TopologyHints;
    use berth_core::TrafficPolicy;

    fn mk_ep(ip: &str, node: &str, ready: bool, serving: bool, terminating: bool) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port: 80,
            ready,
            serving,
            terminating,
            node_name: Some(node.into()),
            hints: None,
        }
    }

    fn node() -> NodeInfo {
        NodeInfo {
            name: "node-a".into(),
            addresses: vec![],
            zone: None,
        }
    }

    /// A ready endpoint on `node` with the hints the endpoints controller writes.
    fn mk_hinted(ip: &str, node: &str, zones: &[&str], nodes: &[&str]) -> Endpoint {
        let mut ep = mk_ep(ip, node, true, true, false);
        let own = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
        ep.hints = TopologyHints::boxed(own(zones), own(nodes));
        ep
    }

    fn ips(eps: &[&Endpoint]) -> Vec<String> {
        eps.iter().map(|ep| ep.ip.to_string()).collect()
    }

    #[test]
    fn table() {
        struct Case {
            name: &'static str,
            internal: TrafficPolicy,
            external: TrafficPolicy,
            node_port: bool,
            endpoints: Vec<Endpoint>,
            cluster: &'static [&'static str],
            local: &'static [&'static str],
            has_any: bool,
        }
        let cases = vec![
            Case {
                name: "cluster policy uses ready endpoints only",
                internal: TrafficPolicy::Cluster,
                external: TrafficPolicy::Cluster,
                node_port: false,
                endpoints: vec![
                    mk_ep("10.0.0.1", "node-a", true, true, false),
                    mk_ep("10.0.0.2", "node-b", false, true, true),
                    mk_ep("10.0.0.3", "node-b", false, false, false),
                ],
                cluster: &["10.0.0.1"],
                local: &[],
                has_any: true,
            },
            Case {
                name: "terminating fallback for cluster",
                internal: TrafficPolicy::Cluster,
                external: TrafficPolicy::Cluster,
                node_port: false,
                endpoints: vec![
                    mk_ep("10.0.0.2", "node-b", false, true, true),
                    mk_ep("10.0.0.3", "node-b", false, false, true),
                ],
                cluster: &["10.0.0.2"],
                local: &[],
                has_any: true,
            },
            Case {
                name: "internal local uses only local endpoints",
                internal: TrafficPolicy::Local,
                external: TrafficPolicy::Cluster,
                node_port: false,
                endpoints: vec![
                    mk_ep("10.0.0.1", "node-a", true, true, false),
                    mk_ep("10.0.0.2", "node-b", true, true, false),
                ],
                cluster: &[],
                local: &["10.0.0.1"],
                has_any: true,
            },
            Case {
                name: "external local keeps cluster endpoints for short-circuit",
                internal: TrafficPolicy::Cluster,
                external: TrafficPolicy::Local,
                node_port: true,
                endpoints: vec![
                    mk_ep("10.0.0.1", "node-b", true, true, false),
                    mk_ep("10.0.0.2", "node-a", false, true, true),
                ],
                cluster: &["10.0.0.1"],
                local: &["10.0.0.2"],
                has_any: true,
            },
            Case {
                name: "external local without node port is cluster",
                internal: TrafficPolicy::Cluster,
                external: TrafficPolicy::Local,
                node_port: false,
                endpoints: vec![mk_ep("10.0.0.1", "node-b", true, true, false)],
                cluster: &["10.0.0.1"],
                local: &[],
                has_any: true,
            },
            Case {
                name: "nothing usable",
                internal: TrafficPolicy::Local,
                external: TrafficPolicy::Local,
                node_port: true,
                endpoints: vec![mk_ep("10.0.0.1", "node-a", false, false, false)],
                cluster: &[],
                local: &[],
                has_any: false,
            },
        ];
        for case in cases {
            let mut port = mk_port(case.endpoints);
            port.internal_traffic_policy = case.internal;
            port.external_traffic_policy = case.external;
            port.node_port = case.node_port.then_some(30080);
            let got = categorize(&port, &node(), IpFamily::V4);
            assert_eq!(ips(&got.cluster), case.cluster, "{}", case.name);
            assert_eq!(ips(&got.local), case.local, "{}", case.name);
            assert_eq!(got.has_any, case.has_any, "{}", case.name);
            for ep in got.cluster.iter().chain(&got.local) {
                assert!(got.reachable.contains(ep), "{}", case.name);
            }
        }
    }

    #[test]
    fn other_family_is_ignored() {
        let port = mk_port(vec![mk_ep("fd00::1", "node-a", true, true, false)]);
        let got = categorize(&port, &node(), IpFamily::V4);
        assert!(!got.has_any && got.cluster.is_empty());
        let got = categorize(&port, &node(), IpFamily::V6);
        assert_eq!(ips(&got.cluster), ["fd00::1"]);
    }

    /// kube-proxy's topology cases (`pkg/proxy/topology_test.go`), on node `node-a` in the zone
    /// each row names. Address plan: 10.0.0.x, x = the endpoint's number; zones zone-a/b/c.
    #[test]
    fn topology_table() {
        struct Case {
            name: &'static str,
            zone: Option<&'static str>,
            internal: TrafficPolicy,
            external_local: bool,
            endpoints: Vec<Endpoint>,
            cluster: &'static [&'static str],
            local: &'static [&'static str],
        }
        let zoned = || {
            vec![
                mk_hinted("10.0.0.1", "node-a", &["zone-a"], &[]),
                mk_hinted("10.0.0.2", "node-b", &["zone-a"], &[]),
                mk_hinted("10.0.0.3", "node-c", &["zone-b"], &[]),
                mk_hinted("10.0.0.4", "node-d", &["zone-c"], &[]),
            ]
        };
        let cluster = TrafficPolicy::Cluster;
        let cases = vec![
            Case {
                name: "zone hints, node in zone-a: only zone-a endpoints",
                zone: Some("zone-a"),
                internal: cluster,
                external_local: false,
                endpoints: zoned(),
                cluster: &["10.0.0.1", "10.0.0.2"],
                local: &[],
            },
            Case {
                name: "node without a zone label: hints ignored",
                zone: None,
                internal: cluster,
                external_local: false,
                endpoints: zoned(),
                cluster: &["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"],
                local: &[],
            },
            Case {
                name: "no endpoint hinted for this zone: hints ignored",
                zone: Some("zone-d"),
                internal: cluster,
                external_local: false,
                endpoints: zoned(),
                cluster: &["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"],
                local: &[],
            },
            Case {
                name: "one ready endpoint without a hint: hints ignored",
                zone: Some("zone-a"),
                internal: cluster,
                external_local: false,
                endpoints: {
                    let mut eps = zoned();
                    eps.push(mk_ep("10.0.0.5", "node-e", true, true, false));
                    eps
                },
                cluster: &["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"],
                local: &[],
            },
            Case {
                name: "a not-ready endpoint without a hint does not count",
                zone: Some("zone-a"),
                internal: cluster,
                external_local: false,
                endpoints: {
                    let mut eps = zoned();
                    eps.push(mk_ep("10.0.0.5", "node-e", false, false, false));
                    eps
                },
                cluster: &["10.0.0.1", "10.0.0.2"],
                local: &[],
            },
            Case {
                name: "an endpoint hinted for several zones serves each",
                zone: Some("zone-b"),
                internal: cluster,
                external_local: false,
                endpoints: vec![
                    mk_hinted("10.0.0.1", "node-a", &["zone-a", "zone-b"], &[]),
                    mk_hinted("10.0.0.3", "node-c", &["zone-b"], &[]),
                    mk_hinted("10.0.0.4", "node-d", &["zone-c"], &[]),
                ],
                cluster: &["10.0.0.1", "10.0.0.3"],
                local: &[],
            },
            Case {
                name: "node hints name this node: only its endpoints",
                zone: Some("zone-a"),
                internal: cluster,
                external_local: false,
                endpoints: vec![
                    mk_hinted("10.0.0.1", "node-a", &["zone-a"], &["node-a"]),
                    mk_hinted("10.0.0.2", "node-b", &["zone-a"], &["node-b"]),
                    mk_hinted("10.0.0.3", "node-c", &["zone-b"], &["node-c"]),
                ],
                cluster: &["10.0.0.1"],
                local: &[],
            },
            Case {
                name: "node hints without this node: same zone instead",
                zone: Some("zone-a"),
                internal: cluster,
                external_local: false,
                endpoints: vec![
                    mk_hinted("10.0.0.2", "node-b", &["zone-a"], &["node-b"]),
                    mk_hinted("10.0.0.3", "node-c", &["zone-b"], &["node-c"]),
                ],
                cluster: &["10.0.0.2"],
                local: &[],
            },
            Case {
                name: "node hints without this node nor zone hints: every endpoint",
                zone: Some("zone-a"),
                internal: cluster,
                external_local: false,
                endpoints: vec![
                    mk_hinted("10.0.0.2", "node-b", &[], &["node-b"]),
                    mk_hinted("10.0.0.3", "node-c", &[], &["node-c"]),
                ],
                cluster: &["10.0.0.2", "10.0.0.3"],
                local: &[],
            },
            Case {
                name: "the zone's endpoints terminating: every ready endpoint",
                zone: Some("zone-a"),
                internal: cluster,
                external_local: false,
                endpoints: {
                    let mut eps = zoned();
                    for ep in eps.iter_mut().take(2) {
                        (ep.ready, ep.terminating) = (false, true);
                    }
                    eps
                },
                cluster: &["10.0.0.3", "10.0.0.4"],
                local: &[],
            },
            Case {
                name: "nothing ready anywhere: serving terminating endpoints of every zone",
                zone: Some("zone-a"),
                internal: cluster,
                external_local: false,
                endpoints: {
                    let mut eps = zoned();
                    for ep in &mut eps {
                        (ep.ready, ep.terminating) = (false, true);
                    }
                    eps
                },
                cluster: &["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"],
                local: &[],
            },
            Case {
                name: "internal Local: the node's endpoints, hints play no part",
                zone: Some("zone-b"),
                internal: TrafficPolicy::Local,
                external_local: false,
                endpoints: zoned(),
                cluster: &[],
                local: &["10.0.0.1"],
            },
            Case {
                name: "external Local: local endpoints as they are, cluster ones by zone",
                zone: Some("zone-b"),
                internal: cluster,
                external_local: true,
                endpoints: zoned(),
                cluster: &["10.0.0.3"],
                local: &["10.0.0.1"],
            },
        ];
        for case in cases {
            let mut port = mk_port(case.endpoints);
            port.internal_traffic_policy = case.internal;
            if case.external_local {
                port.external_traffic_policy = TrafficPolicy::Local;
                port.node_port = Some(30080);
            }
            let node = NodeInfo {
                zone: case.zone.map(str::to_owned),
                ..node()
            };
            let got = categorize(&port, &node, IpFamily::V4);
            assert_eq!(ips(&got.cluster), case.cluster, "{}", case.name);
            assert_eq!(ips(&got.local), case.local, "{}", case.name);
            assert!(got.has_any, "{}", case.name);
        }
    }
}

//! Which endpoints each traffic policy uses (kube-proxy's `CategorizeEndpoints`, without topology hints).

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
        pick(&endpoints, |_| true)
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
    use berth_core::TrafficPolicy;

    fn mk_ep(ip: &str, node: &str, ready: bool, serving: bool, terminating: bool) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port: 80,
            ready,
            serving,
            terminating,
            node_name: Some(node.into()),
        }
    }

    fn node() -> NodeInfo {
        NodeInfo {
            name: "node-a".into(),
            addresses: vec![],
        }
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
}

//! `plan::policy`: what one Service port needs on this node, decided once. kube-proxy's proxier
//! makes these decisions inline while it writes rules; here they are plain data from a pure
//! function, so the chain builders in [`crate::plan::service`] only follow them and each decision
//! is tested on its own.

use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use crate::plan::categorize::Categorized;
use crate::plan::input::{NodeInfo, ServicePort, SessionAffinity};
use crate::plan::model::{ChainName, Target};
use crate::plan::names::{self, ServiceChain};
use crate::plan::options::PlanOptions;

/// One Service port's policy chains (kube-proxy's naming: SVC, SVL, EXT, FW).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chains {
    pub cluster: ChainName,
    pub local: ChainName,
    pub external: ChainName,
    pub firewall: ChainName,
}

/// Which cluster-IP traffic the internal policy chain masquerades.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Masquerade {
    /// None: the pod CIDR is unknown and `--masquerade-all` is off.
    Never,
    /// All of it (`--masquerade-all`).
    All,
    /// What comes from outside the pod CIDR: off-cluster clients routed to a ClusterIP through
    /// this node must get their replies back through it.
    OffCluster(IpNet),
}

/// The local decisions for one Service port of the family being planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PortPolicy {
    /// The port's name, once for every comment that is only the name.
    pub name: Arc<str>,
    pub cluster_ips: Vec<IpAddr>,
    pub external_ips: Vec<IpAddr>,
    pub load_balancer_ips: Vec<IpAddr>,
    pub chains: Chains,
    /// Some endpoint anywhere in the cluster can take traffic; without one, traffic is rejected
    /// in filter instead of dispatched.
    pub has_endpoints: bool,
    /// Where cluster-IP traffic goes: SVL for `internalTrafficPolicy: Local`, else SVC.
    pub internal_chain: ChainName,
    /// Cluster-IP traffic has an endpoint under its policy.
    pub has_internal: bool,
    /// `externalTrafficPolicy: Local` on a port reachable from outside.
    pub external_local: bool,
    /// Where the EXT chain sends traffic after its short-cuts: SVL or SVC.
    pub external_policy_chain: ChainName,
    /// External traffic has an endpoint under its policy.
    pub has_external: bool,
    /// The EXT chain exists: needed even without local endpoints, as it short-circuits node and
    /// pod traffic to the cluster chain.
    pub uses_external_chain: bool,
    /// `loadBalancerSourceRanges` of the family being planned; as in kube-proxy, a dual-stack
    /// Service whose ranges are all of the other family has none here, and is not firewalled.
    pub source_ranges: Vec<IpNet>,
    /// LoadBalancer traffic passes the FW chain (`loadBalancerSourceRanges` with a VIP).
    pub uses_firewall: bool,
    /// Where LoadBalancer traffic enters: FW when firewalled, else EXT.
    pub load_balancer_chain: ChainName,
    /// What filter does with traffic that has no endpoint to go to: REJECT when the Service has
    /// none at all, DROP when it has none under a Local policy.
    pub unreachable: Target,
    pub unreachable_comment: String,
    pub masquerade: Masquerade,
    /// The pod CIDR, when known: pod traffic to an external destination of a Local Service
    /// short-circuits to the cluster chain.
    pub pod_cidr: Option<IpNet>,
    /// A source range admits one of the node's addresses, so the node reaching its own VIP (which
    /// loops back with the VIP as source) is admitted too.
    pub firewall_admits_node: bool,
    /// ClientIP affinity's timeout, when the port has it.
    pub affinity_seconds: Option<u32>,
}

/// An external destination of a port: an external IP or a LoadBalancer VIP.
pub(crate) struct ExternalDestination<'a> {
    pub ip: IpAddr,
    /// For the comment: `external IP` or `loadbalancer IP`.
    pub kind: &'static str,
    /// The chain its traffic is dispatched to.
    pub chain: &'a ChainName,
    /// Traffic FW did not translate is dropped in `BERTH-PROXY-FIREWALL`.
    pub firewalled: bool,
}

impl PortPolicy {
    /// External IPs then LoadBalancer VIPs: dispatched and filtered alike, but for the comment,
    /// the chain they enter and the firewall.
    pub fn external_destinations(&self) -> impl Iterator<Item = ExternalDestination<'_>> {
        let external = self.external_ips.iter().map(|ip| ExternalDestination {
            ip: *ip,
            kind: "external IP",
            chain: &self.chains.external,
            firewalled: false,
        });
        let load_balancer = self.load_balancer_ips.iter().map(|ip| ExternalDestination {
            ip: *ip,
            kind: "loadbalancer IP",
            chain: &self.load_balancer_chain,
            firewalled: self.uses_firewall,
        });
        external.chain(load_balancer)
    }
}

/// The addresses of the family being planned: each family has its own ruleset.
fn of_family(ips: &[IpAddr], options: &PlanOptions) -> Vec<IpAddr> {
    ips.iter()
        .copied()
        .filter(|ip| options.family.contains(*ip))
        .collect()
}

/// Decides everything one Service port needs on `node`; `None` when the port has no address of
/// the family being planned (a single-stack Service of the other family).
pub(crate) fn decide_port(
    node: &NodeInfo,
    port: &ServicePort,
    eps: &Categorized<'_>,
    options: &PlanOptions,
) -> Option<PortPolicy> {
    let family = options.family;
    let cluster_ips = of_family(&port.cluster_ips, options);
    let external_ips = of_family(&port.external_ips, options);
    let load_balancer_ips = port.load_balancer_vips(family);
    if cluster_ips.is_empty() && external_ips.is_empty() && load_balancer_ips.is_empty() {
        return None;
    }
    let name = port.name.to_string();
    let proto = port.protocol;
    let chains = Chains {
        cluster: names::service_chain(ServiceChain::Cluster, &port.name, proto),
        local: names::service_chain(ServiceChain::Local, &port.name, proto),
        external: names::service_chain(ServiceChain::External, &port.name, proto),
        firewall: names::service_chain(ServiceChain::Firewall, &port.name, proto),
    };
    let has_endpoints = eps.has_any;
    let no_local = eps.local.is_empty();
    let internal_local = port.internal_policy_local();
    let external_local = port.external_policy_local(family);
    let policy_chain = |local: bool| {
        if local {
            chains.local.clone()
        } else {
            chains.cluster.clone()
        }
    };
    let internal_chain = policy_chain(internal_local);
    let external_policy_chain = policy_chain(external_local);
    let source_ranges: Vec<IpNet> = port
        .source_ranges
        .iter()
        .copied()
        .filter(|range| family.contains(range.addr()))
        .collect();
    let uses_firewall = has_endpoints && !load_balancer_ips.is_empty() && !source_ranges.is_empty();
    let load_balancer_chain = if uses_firewall {
        chains.firewall.clone()
    } else {
        chains.external.clone()
    };
    let (unreachable, unreachable_comment) = if has_endpoints {
        (Target::Drop, format!("{name} has no local endpoints"))
    } else {
        (Target::Reject, format!("{name} has no endpoints"))
    };
    let masquerade = match (options.masquerade_all, options.cluster_cidr) {
        (true, _) => Masquerade::All,
        (false, Some(cidr)) => Masquerade::OffCluster(cidr),
        (false, None) => Masquerade::Never,
    };
    let firewall_admits_node = source_ranges
        .iter()
        .any(|range| node.addresses.iter().any(|addr| range.contains(addr)));
    let affinity_seconds = match port.session_affinity {
        SessionAffinity::ClientIp { timeout_seconds } => Some(timeout_seconds),
        SessionAffinity::None => None,
    };
    Some(PortPolicy {
        name: Arc::from(name),
        cluster_ips,
        external_ips,
        load_balancer_ips,
        has_endpoints,
        internal_chain,
        has_internal: has_endpoints && !(internal_local && no_local),
        external_local,
        external_policy_chain,
        has_external: has_endpoints && !(external_local && no_local),
        uses_external_chain: has_endpoints && port.externally_accessible(family),
        source_ranges,
        uses_firewall,
        load_balancer_chain,
        unreachable,
        unreachable_comment,
        masquerade,
        pod_cidr: options.cluster_cidr,
        firewall_admits_node,
        affinity_seconds,
        chains,
    })
}

#[cfg(test)]
mod tests {
    //! Addresses: ClusterIP 10.96.0.1, external IP 198.18.0.100, LoadBalancer VIP 198.18.0.200,
    //! node 198.18.0.11 (node-a), pods 10.244.0.0/16; endpoint 10.244.1.5 on node-a, 10.244.2.5
    //! on node-b.
    use super::*;
    use crate::plan::categorize::categorize;
    use crate::plan::input::tests::mk_port;
    use crate::plan::input::{Endpoint, IpMode, LoadBalancerIngress};
    use berth_core::{IpFamily, TrafficPolicy};

    fn mk_ep(ip: &str, node: &str) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port: 8080,
            ready: true,
            serving: true,
            terminating: false,
            node_name: Some(node.into()),
            hints: None,
        }
    }

    fn mk_load_balancer(mut port: ServicePort) -> ServicePort {
        port.node_port = Some(30080);
        port.load_balancer_ingress = vec![LoadBalancerIngress {
            ip: "198.18.0.200".parse().unwrap(),
            mode: IpMode::Vip,
        }];
        port
    }

    fn node() -> NodeInfo {
        NodeInfo {
            name: "node-a".into(),
            addresses: vec!["198.18.0.11".parse().unwrap()],
            zone: None,
        }
    }

    fn options() -> PlanOptions {
        PlanOptions {
            cluster_cidr: Some("10.244.0.0/16".parse().unwrap()),
            ..PlanOptions::default()
        }
    }

    fn decide(port: &ServicePort, options: &PlanOptions) -> Option<PortPolicy> {
        let node = node();
        let eps = categorize(port, &node, options.family);
        decide_port(&node, port, &eps, options)
    }

    fn local_and_remote() -> Vec<Endpoint> {
        vec![mk_ep("10.244.1.5", "node-a"), mk_ep("10.244.2.5", "node-b")]
    }

    #[test]
    fn a_port_of_the_other_family_needs_nothing() {
        let port = mk_port(local_and_remote());
        let v6 = PlanOptions {
            family: IpFamily::V6,
            ..options()
        };
        assert_eq!(decide(&port, &v6), None);
    }

    #[test]
    fn each_decision_of_a_port_follows_its_policies_and_endpoints() {
        struct Row {
            case: &'static str,
            port: ServicePort,
            // has_endpoints, has_internal, has_external, uses_external_chain, uses_firewall
            reach: (bool, bool, bool, bool, bool),
            internal_local: bool,
            external_local: bool,
            unreachable: Target,
        }
        let remote_only = vec![mk_ep("10.244.2.5", "node-b")];
        let mut internal_local = mk_port(remote_only.clone());
        internal_local.internal_traffic_policy = TrafficPolicy::Local;
        let mut external_local = mk_load_balancer(mk_port(remote_only.clone()));
        external_local.external_traffic_policy = TrafficPolicy::Local;
        let mut external_local_here = mk_load_balancer(mk_port(local_and_remote()));
        external_local_here.external_traffic_policy = TrafficPolicy::Local;
        let mut firewalled = mk_load_balancer(mk_port(local_and_remote()));
        firewalled.source_ranges = vec!["203.0.113.0/24".parse().unwrap()];
        let mut firewalled_empty = firewalled.clone();
        firewalled_empty.endpoints = Default::default();
        let mut external_ip_only = mk_port(local_and_remote());
        external_ip_only.external_ips = vec!["198.18.0.100".parse().unwrap()];
        let rows = [
            Row {
                case: "ClusterIP with endpoints",
                port: mk_port(local_and_remote()),
                reach: (true, true, true, false, false),
                internal_local: false,
                external_local: false,
                unreachable: Target::Drop,
            },
            Row {
                case: "ClusterIP without endpoints rejects",
                port: mk_port(vec![]),
                reach: (false, false, false, false, false),
                internal_local: false,
                external_local: false,
                unreachable: Target::Reject,
            },
            Row {
                case: "internal Local without a local endpoint drops",
                port: internal_local,
                reach: (true, false, true, false, false),
                internal_local: true,
                external_local: false,
                unreachable: Target::Drop,
            },
            Row {
                case: "external Local without a local endpoint keeps EXT for short-cuts",
                port: external_local,
                reach: (true, true, false, true, false),
                internal_local: false,
                external_local: true,
                unreachable: Target::Drop,
            },
            Row {
                case: "external Local with a local endpoint",
                port: external_local_here,
                reach: (true, true, true, true, false),
                internal_local: false,
                external_local: true,
                unreachable: Target::Drop,
            },
            Row {
                case: "source ranges on a VIP pass FW",
                port: firewalled,
                reach: (true, true, true, true, true),
                internal_local: false,
                external_local: false,
                unreachable: Target::Drop,
            },
            Row {
                case: "no firewall without endpoints: filter rejects first",
                port: firewalled_empty,
                reach: (false, false, false, false, false),
                internal_local: false,
                external_local: false,
                unreachable: Target::Reject,
            },
            Row {
                case: "an external IP makes the port externally accessible",
                port: external_ip_only,
                reach: (true, true, true, true, false),
                internal_local: false,
                external_local: false,
                unreachable: Target::Drop,
            },
        ];
        for row in rows {
            let policy = decide(&row.port, &options()).expect(row.case);
            let reach = (
                policy.has_endpoints,
                policy.has_internal,
                policy.has_external,
                policy.uses_external_chain,
                policy.uses_firewall,
            );
            assert_eq!(reach, row.reach, "{}", row.case);
            let chain = |local: bool| {
                if local {
                    &policy.chains.local
                } else {
                    &policy.chains.cluster
                }
            };
            assert_eq!(
                &policy.internal_chain,
                chain(row.internal_local),
                "{}",
                row.case
            );
            assert_eq!(
                &policy.external_policy_chain,
                chain(row.external_local),
                "{}",
                row.case
            );
            assert_eq!(policy.external_local, row.external_local, "{}", row.case);
            assert_eq!(policy.unreachable, row.unreachable, "{}", row.case);
            let lb_chain = if row.reach.4 {
                &policy.chains.firewall
            } else {
                &policy.chains.external
            };
            assert_eq!(&policy.load_balancer_chain, lb_chain, "{}", row.case);
        }
    }

    #[test]
    fn masquerading_follows_masquerade_all_then_the_pod_cidr() {
        let port = mk_port(local_and_remote());
        let cidr: IpNet = "10.244.0.0/16".parse().unwrap();
        let cases = [
            (true, Some(cidr), Masquerade::All),
            (true, None, Masquerade::All),
            (false, Some(cidr), Masquerade::OffCluster(cidr)),
            (false, None, Masquerade::Never),
        ];
        for (masquerade_all, cluster_cidr, expected) in cases {
            let options = PlanOptions {
                masquerade_all,
                cluster_cidr,
                ..PlanOptions::default()
            };
            let policy = decide(&port, &options).unwrap();
            assert_eq!(
                policy.masquerade, expected,
                "{masquerade_all} {cluster_cidr:?}"
            );
            assert_eq!(policy.pod_cidr, cluster_cidr);
        }
    }

    #[test]
    fn the_firewall_admits_the_node_only_when_a_range_holds_a_node_address() {
        let mut port = mk_load_balancer(mk_port(local_and_remote()));
        port.source_ranges = vec!["203.0.113.0/24".parse().unwrap()];
        assert!(!decide(&port, &options()).unwrap().firewall_admits_node);
        port.source_ranges.push("198.18.0.0/24".parse().unwrap());
        assert!(decide(&port, &options()).unwrap().firewall_admits_node);
    }

    #[test]
    fn source_ranges_are_those_of_the_planned_family() {
        // Dual stack: a VIP per family, an endpoint per family.
        let mut port = mk_load_balancer(mk_port(vec![
            mk_ep("10.244.1.5", "node-a"),
            mk_ep("fd00:244:1::5", "node-a"),
        ]));
        port.cluster_ips.push("fd00:96::1".parse().unwrap());
        port.load_balancer_ingress.push(LoadBalancerIngress {
            ip: "fd00:198:18::c8".parse().unwrap(),
            mode: IpMode::Vip,
        });
        port.source_ranges = vec![
            "203.0.113.0/24".parse().unwrap(),
            "fd00:198:18::64/128".parse().unwrap(),
        ];
        let v6 = PlanOptions {
            family: IpFamily::V6,
            cluster_cidr: Some("fd00:244::/48".parse().unwrap()),
            ..PlanOptions::default()
        };
        let ranges = |port: &ServicePort, options: &PlanOptions| {
            let policy = decide(port, options).unwrap();
            let ranges: Vec<String> = policy.source_ranges.iter().map(|r| r.to_string()).collect();
            (policy.uses_firewall, ranges)
        };
        assert_eq!(
            ranges(&port, &options()),
            (true, vec!["203.0.113.0/24".into()])
        );
        assert_eq!(
            ranges(&port, &v6),
            (true, vec!["fd00:198:18::64/128".into()])
        );
        // Ranges of the other family only: this family's VIP is not firewalled (kube-proxy's
        // reading of a dual-stack Service's ranges).
        port.source_ranges.truncate(1);
        assert_eq!(ranges(&port, &v6), (false, vec![]));
    }

    #[test]
    fn affinity_comes_with_its_timeout() {
        let mut port = mk_port(local_and_remote());
        assert_eq!(decide(&port, &options()).unwrap().affinity_seconds, None);
        port.session_affinity = SessionAffinity::ClientIp {
            timeout_seconds: 60,
        };
        assert_eq!(
            decide(&port, &options()).unwrap().affinity_seconds,
            Some(60)
        );
    }

    #[test]
    fn external_destinations_list_external_ips_then_vips_with_their_chain() {
        let mut port = mk_load_balancer(mk_port(local_and_remote()));
        port.external_ips = vec!["198.18.0.100".parse().unwrap()];
        port.source_ranges = vec!["203.0.113.0/24".parse().unwrap()];
        let policy = decide(&port, &options()).unwrap();
        let dsts: Vec<_> = policy
            .external_destinations()
            .map(|dst| {
                (
                    dst.ip.to_string(),
                    dst.kind,
                    dst.chain.clone(),
                    dst.firewalled,
                )
            })
            .collect();
        assert_eq!(
            dsts,
            vec![
                (
                    "198.18.0.100".to_string(),
                    "external IP",
                    policy.chains.external.clone(),
                    false
                ),
                (
                    "198.18.0.200".to_string(),
                    "loadbalancer IP",
                    policy.chains.firewall.clone(),
                    true
                ),
            ]
        );
    }
}

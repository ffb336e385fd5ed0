//! `plan::full`: the node's view -> the complete berth ruleset for one address family.
//!
//! Semantics follow kube-proxy's iptables mode (chain roles, masquerading, traffic policies,
//! firewalling), under the `BERTH-` prefix; only the entry dispatch differs (see [`crate::plan::dispatch`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;

use crate::plan::categorize::{categorize, Categorized};
use crate::plan::dispatch::{build_dispatch, Dispatch, DispatchEntries};
use crate::plan::fixed::{builtin_jumps, plan_fixed_chains};
use crate::plan::input::{Endpoint, NodeInfo, NodeView, ServicePort, SessionAffinity};
use crate::plan::model::{
    AddrSide, ChainName, Match, PortMatch, RecentAction, Rule, Ruleset, Table, Target,
};
use crate::plan::names::{self, ServiceChain};
use berth_core::{IpFamily, Protocol};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanOptions {
    pub family: IpFamily,
    pub dispatch: Dispatch,
    /// Pod CIDR of the cluster: traffic to a ClusterIP from outside it is masqueraded, and pod
    /// traffic to external destinations of Local Services short-circuits to all endpoints.
    pub cluster_cidr: Option<IpNet>,
    /// Masquerade all ClusterIP traffic (kube-proxy's `--masquerade-all`).
    pub masquerade_all: bool,
    pub random_fully: bool,
    /// Most rules in one dispatch-tree leaf chain.
    pub leaf_size: usize,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            family: IpFamily::V4,
            dispatch: Dispatch::Tree,
            cluster_cidr: None,
            masquerade_all: false,
            random_fully: true,
            leaf_size: 16,
        }
    }
}

fn masq() -> ChainName {
    names::fixed(names::MARK_MASQ)
}

fn proto_port(protocol: Protocol, port: u16) -> [Match; 2] {
    [
        Match::Protocol(protocol),
        Match::DestPort(PortMatch::Single(port)),
    ]
}

/// The addresses of the family being planned: each family has its own ruleset.
fn of_family(ips: &[IpAddr], family: IpFamily) -> Vec<IpAddr> {
    ips.iter()
        .copied()
        .filter(|ip| family.contains(*ip))
        .collect()
}

/// Matches `-m proto -p proto -d addr --dport port` in kube-proxy's order.
fn dst_matches(comment: String, protocol: Protocol, addr: IpAddr, port: u16) -> Vec<Match> {
    vec![
        Match::comment(comment),
        Match::Protocol(protocol),
        Match::dst(addr),
        Match::DestPort(PortMatch::Single(port)),
    ]
}

/// Fixed chains kube-proxy declares and refills on every sync, partial ones included: its partial
/// syncs skip only unchanged SVC/SVL/EXT/FW/SEP chains (`pkg/proxy/iptables/proxier.go`). Linear
/// dispatch models that layout faithfully for comparison, so a [`crate::iptables::sync::Syncer`] running
/// it rewrites these every time; tree dispatch rewrites only the chains whose content changed.
pub fn rewritten_every_sync(dispatch: Dispatch) -> Vec<(Table, ChainName)> {
    match dispatch {
        Dispatch::Tree => Vec::new(),
        Dispatch::Linear => [
            (Table::Filter, names::SERVICES),
            (Table::Filter, names::EXTERNAL_SERVICES),
            (Table::Filter, names::FORWARD),
            (Table::Filter, names::NODEPORTS),
            (Table::Filter, names::PROXY_FIREWALL),
            (Table::Nat, names::SERVICES),
            (Table::Nat, names::NODEPORTS),
            (Table::Nat, names::POSTROUTING),
            (Table::Nat, names::MARK_MASQ),
        ]
        .into_iter()
        .map(|(table, chain)| (table, names::fixed(chain)))
        .collect(),
    }
}

/// Plans every berth chain for `options.family`. Deterministic: the same view gives the same ruleset.
pub fn plan(view: &NodeView, options: &PlanOptions) -> Ruleset {
    let mut rs = Ruleset {
        jumps: builtin_jumps(),
        ..Ruleset::default()
    };
    plan_fixed_chains(&mut rs, options.random_fully);
    let mut ports: Vec<&ServicePort> = view.services.iter().collect();
    ports.sort_by(|a, b| (&a.name, a.protocol).cmp(&(&b.name, b.protocol)));
    let mut entries = DispatchEntries::default();
    for port in ports {
        let categorized = categorize(port, &view.node, options.family);
        plan_service_port(
            &mut rs,
            &mut entries,
            &view.node,
            port,
            &categorized,
            options,
        );
    }
    build_dispatch(
        &mut rs,
        entries,
        options.dispatch,
        options.family,
        options.leaf_size,
    );
    rs
}

/// Policy chains and their reachability, computed once per Service port (kube-proxy's naming).
struct Chains {
    cluster: ChainName,
    local: ChainName,
    external: ChainName,
    firewall: ChainName,
}

/// Writes one Service port's chains, its rules in the shared filter chains, and its dispatch
/// entries. Depends only on the port, the node and the options, which is what lets
/// [`crate::plan::incremental::Planner`] cache the result per Service port.
pub(crate) fn plan_service_port(
    rs: &mut Ruleset,
    entries: &mut DispatchEntries,
    node: &NodeInfo,
    port: &ServicePort,
    eps: &Categorized<'_>,
    options: &PlanOptions,
) {
    let family = options.family;
    let cluster_ips = of_family(&port.cluster_ips, family);
    let external_ips = of_family(&port.external_ips, family);
    let lb_ips = port.load_balancer_vips(family);
    if cluster_ips.is_empty() && external_ips.is_empty() && lb_ips.is_empty() {
        // A single-stack Service of the other family.
        return;
    }
    let name = port.name.to_string();
    // One allocation for the comment of every endpoint rule of this port.
    let name_comment: Arc<str> = Arc::from(name.as_str());
    let masq = masq();
    let (proto, svc_port) = (port.protocol, port.port);
    let chains = Chains {
        cluster: names::service_chain(ServiceChain::Cluster, &port.name, proto),
        local: names::service_chain(ServiceChain::Local, &port.name, proto),
        external: names::service_chain(ServiceChain::External, &port.name, proto),
        firewall: names::service_chain(ServiceChain::Firewall, &port.name, proto),
    };
    let has_endpoints = eps.has_any;
    let internal_local = port.internal_policy_local();
    let external_local = port.external_policy_local(family);
    let internal_chain = if internal_local {
        &chains.local
    } else {
        &chains.cluster
    };
    let has_internal = has_endpoints && !(internal_local && eps.local.is_empty());
    let external_policy_chain = if external_local {
        &chains.local
    } else {
        &chains.cluster
    };
    let has_external = has_endpoints && !(external_local && eps.local.is_empty());
    // The EXT chain is needed even without local endpoints: it short-circuits node and pod traffic.
    let uses_external_chain = has_endpoints && port.externally_accessible(family);
    let uses_firewall = has_endpoints && !lb_ips.is_empty() && !port.source_ranges.is_empty();
    let lb_chain = if uses_firewall {
        &chains.firewall
    } else {
        &chains.external
    };

    let (filter_target, filter_comment_internal, filter_comment_external) = if !has_endpoints {
        let c = format!("{name} has no endpoints");
        (Target::Reject, c.clone(), c)
    } else {
        let c = format!("{name} has no local endpoints");
        (Target::Drop, c.clone(), c)
    };
    let internal_filter_target = if has_endpoints {
        Target::Drop
    } else {
        Target::Reject
    };

    let filter_services = names::fixed(names::SERVICES);
    let filter_external = names::fixed(names::EXTERNAL_SERVICES);

    for ip in &cluster_ips {
        if has_internal {
            entries.push_dst(
                *ip,
                Rule::jump(
                    dst_matches(format!("{name} cluster IP"), proto, *ip, svc_port),
                    internal_chain,
                ),
            );
        } else {
            rs.table_mut(Table::Filter).push(
                &filter_services,
                Rule::new(
                    dst_matches(filter_comment_internal.clone(), proto, *ip, svc_port),
                    internal_filter_target.clone(),
                ),
            );
        }
    }
    // External IPs and LoadBalancer VIPs are dispatched and filtered alike; only the comment, the
    // chain they jump to and the LB firewall differ. One loop keeps each chain's rule order.
    let external_dsts = external_ips
        .iter()
        .map(|ip| (*ip, "external IP", &chains.external, false))
        .chain(
            lb_ips
                .iter()
                .map(|ip| (*ip, "loadbalancer IP", lb_chain, uses_firewall)),
        );
    for (ip, kind, chain, firewall) in external_dsts {
        if has_endpoints {
            entries.push_dst(
                ip,
                Rule::jump(
                    dst_matches(format!("{name} {kind}"), proto, ip, svc_port),
                    chain,
                ),
            );
        }
        if firewall {
            // Packets that left BERTH-FW-* without DNAT still carry the LB address here.
            rs.table_mut(Table::Filter).push(
                &names::fixed(names::PROXY_FIREWALL),
                Rule::new(
                    dst_matches(
                        format!("{name} traffic not accepted by {}", chains.firewall),
                        proto,
                        ip,
                        svc_port,
                    ),
                    Target::Drop,
                ),
            );
        }
        if !has_external {
            rs.table_mut(Table::Filter).push(
                &filter_external,
                Rule::new(
                    dst_matches(filter_comment_external.clone(), proto, ip, svc_port),
                    filter_target.clone(),
                ),
            );
        }
    }
    if let Some(node_port) = port.node_port {
        if has_endpoints {
            let mut matches = vec![Match::Comment(name_comment.clone())];
            matches.extend(proto_port(proto, node_port));
            entries.push_node_port(proto, node_port, Rule::jump(matches, &chains.external));
        }
        if !has_external {
            let mut matches = vec![
                Match::comment(&filter_comment_external),
                Match::AddrTypeLocal {
                    side: AddrSide::Dst,
                    negated: false,
                },
            ];
            matches.extend(proto_port(proto, node_port));
            rs.table_mut(Table::Filter)
                .push(&filter_external, Rule::new(matches, filter_target.clone()));
        }
    }
    if let Some(hc_port) = port.health_check_node_port {
        // Health checks must reach the agent whether or not this node has endpoints.
        let mut matches = vec![Match::comment(format!("{name} health check node port"))];
        matches.extend(proto_port(Protocol::Tcp, hc_port));
        rs.table_mut(Table::Filter).push(
            &names::fixed(names::NODEPORTS),
            Rule::new(matches, Target::Accept),
        );
    }

    let nat = rs.table_mut(Table::Nat);
    if has_internal {
        for ip in &cluster_ips {
            let mut matches = dst_matches(format!("{name} cluster IP"), proto, *ip, svc_port);
            if options.masquerade_all {
                nat.push(internal_chain, Rule::jump(matches, &masq));
            } else if let Some(cidr) = options.cluster_cidr {
                // Off-cluster clients routed to a ClusterIP through this node must get replies back here.
                matches.push(Match::Source {
                    net: cidr,
                    negated: true,
                });
                nat.push(internal_chain, Rule::jump(matches, &masq));
            }
        }
    }
    if uses_external_chain {
        let ext = &chains.external;
        nat.chain_mut(ext);
        if !external_local {
            // Endpoints may be on another node, so replies must come back through this one.
            nat.push(
                ext,
                Rule::jump(
                    vec![Match::comment(format!(
                        "masquerade traffic for {name} external destinations"
                    ))],
                    &masq,
                ),
            );
        } else {
            if let Some(cidr) = options.cluster_cidr {
                // Pod -> external address behaves like leaving the cluster and coming back: no policy.
                nat.push(
                    ext,
                    Rule::jump(
                        vec![
                            Match::comment(format!("pod traffic for {name} external destinations")),
                            Match::Source {
                                net: cidr,
                                negated: false,
                            },
                        ],
                        &chains.cluster,
                    ),
                );
            }
            let local_src = Match::AddrTypeLocal {
                side: AddrSide::Src,
                negated: false,
            };
            // The node's own traffic has a node address as source, which the endpoint could not answer.
            nat.push(
                ext,
                Rule::jump(
                    vec![
                        Match::comment(format!(
                            "masquerade LOCAL traffic for {name} external destinations"
                        )),
                        local_src.clone(),
                    ],
                    &masq,
                ),
            );
            nat.push(
                ext,
                Rule::jump(
                    vec![
                        Match::comment(format!(
                            "route LOCAL traffic for {name} external destinations"
                        )),
                        local_src,
                    ],
                    &chains.cluster,
                ),
            );
        }
        if has_external {
            nat.push(ext, Rule::jump(vec![], external_policy_chain));
        }
    }
    if uses_firewall {
        let fw = &chains.firewall;
        nat.chain_mut(fw);
        let comment: Arc<str> = Arc::from(format!("{name} loadbalancer IP"));
        let mut allow_from_node = false;
        for range in &port.source_ranges {
            nat.push(
                fw,
                Rule::jump(
                    vec![
                        Match::Comment(comment.clone()),
                        Match::Source {
                            net: *range,
                            negated: false,
                        },
                    ],
                    &chains.external,
                ),
            );
            allow_from_node |= node.addresses.iter().any(|addr| range.contains(addr));
        }
        if allow_from_node {
            // A node reaching its own VIP loops back with the VIP as source.
            for ip in &lb_ips {
                nat.push(
                    fw,
                    Rule::jump(
                        vec![Match::Comment(comment.clone()), Match::src(*ip)],
                        &chains.external,
                    ),
                );
            }
        }
        nat.push(
            fw,
            Rule::counting(vec![Match::comment(format!(
                "other traffic to {name} will be dropped by {}",
                names::PROXY_FIREWALL
            ))]),
        );
    }

    // Categorizing leaves a list empty when its policy is unused, so non-empty means "referenced".
    // Each endpoint chain's name is made once: the chain and every jump to it share it.
    let sep_names: SepNames = eps
        .reachable
        .iter()
        .map(|ep| {
            (
                (ep.ip, ep.port),
                names::endpoint_chain(&port.name, proto, ep),
            )
        })
        .collect();
    if !eps.cluster.is_empty() {
        plan_policy_chain(rs, port, &name, &chains.cluster, &eps.cluster, &sep_names);
    }
    if !eps.local.is_empty() {
        plan_policy_chain(rs, port, &name, &chains.local, &eps.local, &sep_names);
    }
    // Without affinity, every endpoint's DNAT rule has the same matches.
    let dnat_matches: Arc<[Match]> = Arc::from(vec![
        Match::Comment(name_comment.clone()),
        Match::Protocol(proto),
    ]);
    for ep in &eps.reachable {
        let sep = sep_name(&sep_names, port, ep);
        let nat = rs.table_mut(Table::Nat);
        nat.chain_mut(&sep);
        // Hairpin: an endpoint reaching itself through the Service needs a source it will answer.
        nat.push(
            &sep,
            Rule::jump(
                vec![Match::Comment(name_comment.clone()), Match::src(ep.ip)],
                &masq,
            ),
        );
        let dnat = Target::Dnat(SocketAddr::new(ep.ip, ep.port));
        let rule = match port.session_affinity {
            SessionAffinity::ClientIp { .. } => Rule::new(
                vec![
                    Match::Comment(name_comment.clone()),
                    Match::Recent {
                        name: sep.clone(),
                        action: RecentAction::Set,
                    },
                    Match::Protocol(proto),
                ],
                dnat,
            ),
            SessionAffinity::None => Rule::shared(&dnat_matches, dnat),
        };
        nat.push(&sep, rule);
    }
}

type SepNames = BTreeMap<(IpAddr, u16), ChainName>;

fn sep_name(names: &SepNames, port: &ServicePort, ep: &Endpoint) -> ChainName {
    names
        .get(&(ep.ip, ep.port))
        .cloned()
        .unwrap_or_else(|| names::endpoint_chain(&port.name, port.protocol, ep))
}

fn plan_policy_chain(
    rs: &mut Ruleset,
    port: &ServicePort,
    name: &str,
    chain: &ChainName,
    endpoints: &[&Endpoint],
    sep_names: &SepNames,
) {
    let nat = rs.table_mut(Table::Nat);
    nat.chain_mut(chain);
    let seps: Vec<(ChainName, Arc<str>)> = endpoints
        .iter()
        .map(|ep| {
            (
                sep_name(sep_names, port, ep),
                Arc::from(format!("{name} -> {}", ep.address())),
            )
        })
        .collect();
    if let SessionAffinity::ClientIp { timeout_seconds } = port.session_affinity {
        for (sep, comment) in &seps {
            nat.push(
                chain,
                Rule::jump(
                    vec![
                        Match::Comment(comment.clone()),
                        Match::Recent {
                            name: sep.clone(),
                            action: RecentAction::Rcheck {
                                seconds: timeout_seconds,
                                reap: true,
                            },
                        },
                    ],
                    sep,
                ),
            );
        }
    }
    let n = seps.len();
    for (i, (sep, comment)) in seps.iter().enumerate() {
        let mut matches = vec![Match::Comment(comment.clone())];
        if i + 1 < n {
            matches.push(Match::Random {
                one_in: (n - i) as u32,
            });
        }
        nat.push(chain, Rule::jump(matches, sep));
    }
}

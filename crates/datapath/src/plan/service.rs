//! `plan::service`: one Service port's rules, written by one builder per kind of chain from the
//! decisions `plan::policy::decide_port` made: the dispatch entries, the filter rules,
//! then the nat chains (the head of SVC/SVL, EXT, FW, the endpoint choice in SVC/SVL, SEP).
//! Semantics follow kube-proxy's iptables mode (chain roles, masquerading, traffic policies,
//! firewalling), under the `BERTH-` prefix.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::plan::categorize::Categorized;
use crate::plan::dispatch::DispatchEntries;
use crate::plan::input::{Endpoint, NodeInfo, ServicePort};
use crate::plan::model::{
    AddrSide, ChainName, Match, PortMatch, RecentAction, Rule, Ruleset, Table, Target,
};
use crate::plan::names;
use crate::plan::options::PlanOptions;
use crate::plan::policy::{decide_port, Masquerade, PortPolicy};
use berth_core::Protocol;

fn masq() -> ChainName {
    names::fixed(names::MARK_MASQ)
}

fn proto_port(protocol: Protocol, port: u16) -> [Match; 2] {
    [
        Match::Protocol(protocol),
        Match::DestPort(PortMatch::Single(port)),
    ]
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

/// How a Service port's endpoint choice (its SVC/SVL and endpoint chains) is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndpointRules {
    /// Every rule, as it is applied.
    Full,
    /// The same chains with as many rules, each an empty placeholder: for a pass that keeps
    /// only a port's chain names and rule counts and drops the rules of its own chains (a lean
    /// planner's pass before a streamed cold load, which plans each port again as the load
    /// reaches its table). The comments and matches of every endpoint's rules were three
    /// quarters of that pass.
    Placeholders,
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
    endpoint_rules: EndpointRules,
) {
    let Some(policy) = decide_port(node, port, eps, options) else {
        return;
    };
    push_dispatch_entries(entries, port, &policy);
    push_cluster_ip_entries(entries, &policy, options);
    plan_filter_rules(rs, port, &policy);
    plan_cluster_ip_masquerade(rs, port, &policy);
    if policy.uses_external_chain {
        plan_external_chain(rs, &policy);
    }
    if policy.uses_firewall {
        plan_firewall_chain(rs, &policy);
    }
    match endpoint_rules {
        EndpointRules::Full => plan_endpoint_choice(rs, port, eps, &policy),
        EndpointRules::Placeholders => plan_endpoint_placeholders(rs, port, eps, &policy),
    }
}

/// The entries the dispatch chains jump from: each address (and the node port) to the chain
/// its traffic enters, when the Service has endpoints.
fn push_dispatch_entries(entries: &mut DispatchEntries, port: &ServicePort, policy: &PortPolicy) {
    if !policy.has_endpoints {
        return;
    }
    let (name, proto, svc_port) = (&policy.name, port.protocol, port.port);
    if policy.has_internal {
        for ip in &policy.cluster_ips {
            let matches = dst_matches(format!("{name} cluster IP"), proto, *ip, svc_port);
            entries.push_dst(*ip, Rule::jump(matches, &policy.internal_chain));
        }
    }
    for dst in policy.external_destinations() {
        let matches = dst_matches(format!("{name} {}", dst.kind), proto, dst.ip, svc_port);
        entries.push_dst(dst.ip, Rule::jump(matches, dst.chain));
    }
    if let Some(node_port) = port.node_port {
        let mut matches = vec![Match::Comment(policy.name.clone())];
        matches.extend(proto_port(proto, node_port));
        entries.push_node_port(
            proto,
            node_port,
            Rule::jump(matches, &policy.chains.external),
        );
    }
}

/// The REJECT of each ClusterIP inside the Service CIDRs, for new connections to it that no
/// port of the Service translated (kube-proxy's `cluster-ips` set). Every port of a Service
/// writes its own, so a port's plan depends on that port alone.
fn push_cluster_ip_entries(
    entries: &mut DispatchEntries,
    policy: &PortPolicy,
    options: &PlanOptions,
) {
    for ip in &policy.cluster_ips {
        if options.in_service_cidrs(*ip) {
            let comment = format!("{} cluster IP, on a port it does not have", policy.name);
            let matches = vec![Match::comment(comment), Match::dst(*ip)];
            entries.push_cluster_ip(*ip, Rule::new(matches, Target::Reject));
        }
    }
}

/// The filter rules: REJECT or DROP for traffic with no endpoint to go to, DROP for LoadBalancer
/// traffic the firewall did not admit, ACCEPT for the health-check node port.
fn plan_filter_rules(rs: &mut Ruleset, port: &ServicePort, policy: &PortPolicy) {
    let (proto, svc_port) = (port.protocol, port.port);
    let unreachable = |matches: Vec<Match>| Rule::new(matches, policy.unreachable.clone());
    let comment = &policy.unreachable_comment;
    let filter = rs.table_mut(Table::Filter);
    if !policy.has_internal {
        let services = names::fixed(names::SERVICES);
        for ip in &policy.cluster_ips {
            let matches = dst_matches(comment.clone(), proto, *ip, svc_port);
            filter.push(&services, unreachable(matches));
        }
    }
    let external_services = names::fixed(names::EXTERNAL_SERVICES);
    for dst in policy.external_destinations() {
        if dst.firewalled {
            // Packets that left BERTH-FW-* without DNAT still carry the LB address here.
            let comment = format!(
                "{} traffic not accepted by {}",
                policy.name, policy.chains.firewall
            );
            filter.push(
                &names::fixed(names::PROXY_FIREWALL),
                Rule::new(dst_matches(comment, proto, dst.ip, svc_port), Target::Drop),
            );
        }
        if !policy.has_external {
            let matches = dst_matches(comment.clone(), proto, dst.ip, svc_port);
            filter.push(&external_services, unreachable(matches));
        }
    }
    if let (Some(node_port), false) = (port.node_port, policy.has_external) {
        let mut matches = vec![
            Match::comment(comment),
            Match::AddrTypeLocal {
                side: AddrSide::Dst,
                negated: false,
            },
        ];
        matches.extend(proto_port(proto, node_port));
        filter.push(&external_services, unreachable(matches));
    }
    if let Some(hc_port) = port.health_check_node_port {
        // Health checks must reach the agent whether or not this node has endpoints.
        let mut matches = vec![Match::comment(format!(
            "{} health check node port",
            policy.name
        ))];
        matches.extend(proto_port(Protocol::Tcp, hc_port));
        filter.push(
            &names::fixed(names::NODEPORTS),
            Rule::new(matches, Target::Accept),
        );
    }
}

/// The head of the internal policy chain (SVC or SVL): which cluster-IP traffic is masqueraded.
fn plan_cluster_ip_masquerade(rs: &mut Ruleset, port: &ServicePort, policy: &PortPolicy) {
    if !policy.has_internal || policy.masquerade == Masquerade::Never {
        return;
    }
    let masq = masq();
    let nat = rs.table_mut(Table::Nat);
    for ip in &policy.cluster_ips {
        let comment = format!("{} cluster IP", policy.name);
        let mut matches = dst_matches(comment, port.protocol, *ip, port.port);
        if let Masquerade::OffCluster(cidr) = policy.masquerade {
            matches.push(Match::Source {
                net: cidr,
                negated: true,
            });
        }
        nat.push(&policy.internal_chain, Rule::jump(matches, &masq));
    }
}

/// EXT: masquerades what may come back through another node, or under a Local policy
/// short-circuits pod and node traffic to the cluster chain; then the external policy chain.
fn plan_external_chain(rs: &mut Ruleset, policy: &PortPolicy) {
    let (name, ext, masq) = (&policy.name, &policy.chains.external, masq());
    let nat = rs.table_mut(Table::Nat);
    nat.chain_mut(ext);
    if !policy.external_local {
        // Endpoints may be on another node, so replies must come back through this one.
        let comment = format!("masquerade traffic for {name} external destinations");
        nat.push(ext, Rule::jump(vec![Match::comment(comment)], &masq));
    } else {
        if let Some(cidr) = policy.pod_cidr {
            // Pod -> external address behaves like leaving the cluster and coming back: no policy.
            let matches = vec![
                Match::comment(format!("pod traffic for {name} external destinations")),
                Match::Source {
                    net: cidr,
                    negated: false,
                },
            ];
            nat.push(ext, Rule::jump(matches, &policy.chains.cluster));
        }
        let local_src = Match::AddrTypeLocal {
            side: AddrSide::Src,
            negated: false,
        };
        // The node's own traffic has a node address as source, which the endpoint could not answer.
        let comment = format!("masquerade LOCAL traffic for {name} external destinations");
        let matches = vec![Match::comment(comment), local_src.clone()];
        nat.push(ext, Rule::jump(matches, &masq));
        let comment = format!("route LOCAL traffic for {name} external destinations");
        let matches = vec![Match::comment(comment), local_src];
        nat.push(ext, Rule::jump(matches, &policy.chains.cluster));
    }
    if policy.has_external {
        nat.push(ext, Rule::jump(vec![], &policy.external_policy_chain));
    }
}

/// FW: LoadBalancer traffic from an admitted source range goes on to EXT; the rest is counted
/// here and dropped in filter (nat cannot drop).
fn plan_firewall_chain(rs: &mut Ruleset, policy: &PortPolicy) {
    let (fw, ext) = (&policy.chains.firewall, &policy.chains.external);
    let nat = rs.table_mut(Table::Nat);
    nat.chain_mut(fw);
    let comment: Arc<str> = Arc::from(format!("{} loadbalancer IP", policy.name));
    for range in &policy.source_ranges {
        let source = Match::Source {
            net: *range,
            negated: false,
        };
        nat.push(
            fw,
            Rule::jump(vec![Match::Comment(comment.clone()), source], ext),
        );
    }
    if policy.firewall_admits_node {
        // A node reaching its own VIP loops back with the VIP as source.
        for ip in &policy.load_balancer_ips {
            let matches = vec![Match::Comment(comment.clone()), Match::src(*ip)];
            nat.push(fw, Rule::jump(matches, ext));
        }
    }
    nat.push(
        fw,
        Rule::counting(vec![Match::comment(format!(
            "other traffic to {} will be dropped by {}",
            policy.name,
            names::PROXY_FIREWALL
        ))]),
    );
}

type SepNames = BTreeMap<(IpAddr, u16), ChainName>;

fn sep_name(names: &SepNames, port: &ServicePort, ep: &Endpoint) -> ChainName {
    names
        .get(&(ep.ip, ep.port))
        .cloned()
        .unwrap_or_else(|| names::endpoint_chain(&port.name, port.protocol, ep))
}

/// The endpoint choice: SVC and SVL pick an endpoint chain, each SEP translates to its endpoint.
fn plan_endpoint_choice(
    rs: &mut Ruleset,
    port: &ServicePort,
    eps: &Categorized<'_>,
    policy: &PortPolicy,
) {
    // Categorizing leaves a list empty when its policy is unused, so non-empty means "referenced".
    // Each endpoint chain's name is made once: the chain and every jump to it share it.
    let sep_names: SepNames = eps
        .reachable
        .iter()
        .map(|ep| {
            (
                (ep.ip, ep.port),
                names::endpoint_chain(&port.name, port.protocol, ep),
            )
        })
        .collect();
    if !eps.cluster.is_empty() {
        let chain = &policy.chains.cluster;
        plan_policy_chain(rs, port, policy, chain, &eps.cluster, &sep_names);
    }
    if !eps.local.is_empty() {
        let chain = &policy.chains.local;
        plan_policy_chain(rs, port, policy, chain, &eps.local, &sep_names);
    }
    plan_endpoint_chains(rs, port, eps, policy, &sep_names);
}

/// [`plan_endpoint_choice`]'s chains, each with as many rules, all empty placeholders.
fn plan_endpoint_placeholders(
    rs: &mut Ruleset,
    port: &ServicePort,
    eps: &Categorized<'_>,
    policy: &PortPolicy,
) {
    let placeholder = Rule::counting(Vec::new());
    let nat = rs.table_mut(Table::Nat);
    // SVC and SVL: with affinity a check per endpoint, then a choice per endpoint.
    let per_endpoint = if policy.affinity_seconds.is_some() {
        2
    } else {
        1
    };
    for (chain, endpoints) in [
        (&policy.chains.cluster, &eps.cluster),
        (&policy.chains.local, &eps.local),
    ] {
        if endpoints.is_empty() {
            continue;
        }
        nat.chain_mut(chain);
        for _ in 0..endpoints.len() * per_endpoint {
            nat.push(chain, placeholder.clone());
        }
    }
    // Each endpoint chain: the hairpin mark and the DNAT.
    for ep in &eps.reachable {
        let sep = names::endpoint_chain(&port.name, port.protocol, ep);
        nat.chain_mut(&sep);
        nat.push(&sep, placeholder.clone());
        nat.push(&sep, placeholder.clone());
    }
}

/// SVC or SVL: affinity first (an endpoint this client used recently), then a random choice.
fn plan_policy_chain(
    rs: &mut Ruleset,
    port: &ServicePort,
    policy: &PortPolicy,
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
                Arc::from(format!("{} -> {}", policy.name, ep.address())),
            )
        })
        .collect();
    if let Some(seconds) = policy.affinity_seconds {
        for (sep, comment) in &seps {
            let recent = Match::Recent {
                name: sep.clone(),
                action: RecentAction::Rcheck {
                    seconds,
                    reap: true,
                },
            };
            nat.push(
                chain,
                Rule::jump(vec![Match::Comment(comment.clone()), recent], sep),
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

/// SEP: masquerades hairpin traffic, then translates to the endpoint (recording it for affinity).
fn plan_endpoint_chains(
    rs: &mut Ruleset,
    port: &ServicePort,
    eps: &Categorized<'_>,
    policy: &PortPolicy,
    sep_names: &SepNames,
) {
    let (name, proto, masq) = (&policy.name, port.protocol, masq());
    // Without affinity, every endpoint's DNAT rule has the same matches.
    let dnat_matches: Arc<[Match]> =
        Arc::from(vec![Match::Comment(name.clone()), Match::Protocol(proto)]);
    let nat = rs.table_mut(Table::Nat);
    for ep in &eps.reachable {
        let sep = sep_name(sep_names, port, ep);
        nat.chain_mut(&sep);
        // Hairpin: an endpoint reaching itself through the Service needs a source it will answer.
        let hairpin = vec![Match::Comment(name.clone()), Match::src(ep.ip)];
        nat.push(&sep, Rule::jump(hairpin, &masq));
        let dnat = Target::Dnat(SocketAddr::new(ep.ip, ep.port));
        let rule = match policy.affinity_seconds {
            Some(_) => Rule::new(
                vec![
                    Match::Comment(name.clone()),
                    Match::Recent {
                        name: sep.clone(),
                        action: RecentAction::Set,
                    },
                    Match::Protocol(proto),
                ],
                dnat,
            ),
            None => Rule::shared(&dnat_matches, dnat),
        };
        nat.push(&sep, rule);
    }
}

#[cfg(test)]
mod tests {
    //! Addresses: ClusterIP 10.96.0.1, LoadBalancer VIP 198.18.0.200, node 198.18.0.11
    //! (node-a), pods 10.244.0.0/16; endpoints 10.244.1.x on node-a, 10.244.2.x on node-b.
    use super::*;
    use crate::plan::categorize::categorize;
    use crate::plan::input::tests::mk_port;
    use crate::plan::input::{IpMode, LoadBalancerIngress, SessionAffinity};
    use berth_core::TrafficPolicy;

    fn mk_ep(ip: &str, node: &str, ready: bool) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port: 8080,
            ready,
            serving: true,
            terminating: !ready,
            node_name: Some(node.into()),
            hints: None,
        }
    }

    fn node() -> NodeInfo {
        NodeInfo {
            name: "node-a".into(),
            addresses: vec!["198.18.0.11".parse().unwrap()],
            zone: None,
        }
    }

    /// Ports that write every kind of endpoint choice: Cluster and Local policies, affinity,
    /// terminating endpoints only, no endpoints, a firewall.
    fn ports() -> Vec<(&'static str, ServicePort)> {
        let two = vec![
            mk_ep("10.244.1.5", "node-a", true),
            mk_ep("10.244.2.5", "node-b", true),
            mk_ep("10.244.2.6", "node-b", true),
        ];
        let affinity = SessionAffinity::ClientIp {
            timeout_seconds: 60,
        };
        let mut local = mk_port(two.clone());
        local.node_port = Some(30080);
        local.external_traffic_policy = TrafficPolicy::Local;
        local.health_check_node_port = Some(30999);
        local.load_balancer_ingress = vec![LoadBalancerIngress {
            ip: "198.18.0.200".parse().unwrap(),
            mode: IpMode::Vip,
        }];
        let mut firewalled = local.clone();
        firewalled.source_ranges = vec!["198.18.0.0/24".parse().unwrap()];
        firewalled.session_affinity = affinity;
        let mut sticky = mk_port(two.clone());
        sticky.session_affinity = affinity;
        let mut internal_local = mk_port(two);
        internal_local.internal_traffic_policy = TrafficPolicy::Local;
        vec![
            (
                "cluster",
                mk_port(vec![mk_ep("10.244.1.5", "node-a", true)]),
            ),
            ("local", local),
            ("firewalled with affinity", firewalled),
            ("affinity", sticky),
            ("internal local", internal_local),
            (
                "terminating only",
                mk_port(vec![mk_ep("10.244.2.7", "node-b", false)]),
            ),
            ("no endpoints", mk_port(vec![])),
        ]
    }

    /// A placeholder pass writes the same chains with as many rules as the full one, the same
    /// rules everywhere but the endpoint choice, and the same dispatch entries: what a lean
    /// planner keeps of a port (names, counts, shared rules, entries) is what a full pass gives.
    #[test]
    fn placeholders_keep_every_chain_and_rule_count_of_the_endpoint_choice() {
        let options = PlanOptions {
            cluster_cidr: Some("10.244.0.0/16".parse().unwrap()),
            ..PlanOptions::default()
        };
        let node = node();
        for (name, port) in ports() {
            let eps = categorize(&port, &node, options.family);
            let plan = |endpoint_rules| {
                let mut rs = Ruleset::default();
                let mut entries = DispatchEntries::default();
                plan_service_port(
                    &mut rs,
                    &mut entries,
                    &node,
                    &port,
                    &eps,
                    &options,
                    endpoint_rules,
                );
                (rs, entries)
            };
            let (full, full_entries) = plan(EndpointRules::Full);
            let (placeholders, entries) = plan(EndpointRules::Placeholders);
            assert_eq!(
                format!("{entries:?}"),
                format!("{full_entries:?}"),
                "{name}: dispatch entries"
            );
            let chains = |rs: &Ruleset| -> Vec<(Table, ChainName, usize)> {
                rs.tables
                    .iter()
                    .flat_map(|(table, rules)| {
                        rules
                            .chains
                            .iter()
                            .map(|(chain, rules)| (*table, chain.clone(), rules.len()))
                    })
                    .collect()
            };
            assert_eq!(chains(&placeholders), chains(&full), "{name}: chains");
            let mut placeheld = 0;
            for (table, rules) in &full.tables {
                for (chain, full_rules) in &rules.chains {
                    let Some(got) = placeholders.chain(*table, chain) else {
                        continue;
                    };
                    for (got, want) in got.iter().zip(full_rules) {
                        if got != want {
                            assert_eq!(got, &Rule::counting(Vec::new()), "{name}: {chain}");
                            placeheld += 1;
                        }
                    }
                }
            }
            let with_endpoints = !eps.reachable.is_empty();
            assert_eq!(
                placeheld > 0,
                with_endpoints,
                "{name}: placeholders written"
            );
        }
    }
}

//! berth's nftables table of one family, typed: what the in-memory nftables holds after
//! berth's transactions (`fake::MemoryNft`, behind the `fake` feature) and what [`crate::nft::decode`] reads back
//! from the kernel. The packet tracer follows it as a [`Ruleset`] ([`NftTable::traceable`]);
//! each rule a traced packet hits is shown again in nft's words ([`NftTable::hop_text`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::nft::render::{
    element_text, rule_text, Element, Hook, NftChain, NftRule, CLUSTER_IP_COMMENT, TABLE,
};
use crate::nft::render::{NodePortKey, ServiceKey};
use crate::nft::shard::{table_name, Shard, MAIN};
use crate::plan::model::{ChainName, JumpRule, Match, PortMatch, Rule, Ruleset, Target};
use crate::trace::Hit;
use berth_core::IpFamily;

/// berth's tables of one family as the kernel holds them: the main table and the nat shards,
/// each chain, set and element in its table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NftTable {
    /// The tables that exist.
    pub tables: BTreeSet<Shard>,
    pub chains: BTreeMap<NftChain, Vec<NftRule>>,
    pub hooks: BTreeMap<NftChain, Hook>,
    /// The tables whose maps are declared.
    pub maps: BTreeSet<Shard>,
    /// Map elements, each in the map of its target's table.
    pub services: BTreeMap<ServiceKey, NftChain>,
    pub node_ports: BTreeMap<NodePortKey, NftChain>,
    pub affinity: BTreeMap<(Shard, ChainName), u32>,
    /// Endpoints of the hairpin set (`ep . ep`).
    pub hairpin: BTreeSet<IpAddr>,
    /// The ClusterIPs of `cluster-ips`.
    pub cluster_ips: BTreeSet<IpAddr>,
}

/// A chain's name as the tracer knows it: the same names in two tables (a shard's copy of the
/// mark chain, its dispatch chains) are two chains, so a shard's carry `@<shard>`.
pub fn traced_name(name: &ChainName, shard: Shard) -> ChainName {
    if shard == MAIN {
        name.clone()
    } else {
        ChainName::new(format!("{name}@{shard}"))
    }
}

/// The name and nat shard a traced name stands for (`None` for a chain of the main table).
pub fn traced_shard(traced: &ChainName) -> Option<(&str, Shard)> {
    let (name, shard) = traced.as_str().rsplit_once('@')?;
    Some((name, shard.parse().ok()?))
}

/// The chain a traced name stands for.
fn untraced(table: crate::plan::model::Table, traced: &ChainName) -> NftChain {
    match traced_shard(traced) {
        Some((name, shard)) => NftChain::in_shard(table, &ChainName::new(name), shard),
        None => NftChain::new(table, traced),
    }
}

/// A rule of the table `shard` as the tracer follows it: its jump to that table's chain.
fn traced_rule(rule: &Rule, shard: Shard) -> Rule {
    match &rule.target {
        Some(Target::Jump(to)) if shard != MAIN => Rule {
            target: Some(Target::Jump(traced_name(to, shard))),
            ..rule.clone()
        },
        _ => rule.clone(),
    }
}

/// A `service-ips` element as the rule the tracer follows.
fn service_rule((addr, proto, port): &ServiceKey, target: &NftChain) -> Rule {
    Rule::jump(
        vec![
            Match::Protocol(*proto),
            Match::dst(*addr),
            Match::DestPort(PortMatch::Single(*port)),
        ],
        &traced_name(&target.name, target.shard),
    )
}

/// A `node-ports` element as the rule the tracer follows.
fn node_port_rule((proto, port): &NodePortKey, target: &NftChain) -> Rule {
    Rule::jump(
        vec![
            Match::Protocol(*proto),
            Match::DestPort(PortMatch::Single(*port)),
        ],
        &traced_name(&target.name, target.shard),
    )
}

/// A hairpin pair as the rule the tracer follows. In postrouting the destination is the
/// translated one. The tracer has no `ct status dnat`: a pair would also match a pod sending
/// straight to itself, a packet that never reaches the node's hooks.
fn hairpin_rule(ip: IpAddr, target: &ChainName) -> Rule {
    Rule::jump(vec![Match::src(ip), Match::dst(ip)], target)
}

/// A `cluster-ips` element as the rule the tracer follows: the REJECT the planned chain had.
fn cluster_ip_rule(ip: IpAddr) -> Rule {
    Rule::new(
        vec![Match::comment(CLUSTER_IP_COMMENT), Match::dst(ip)],
        Target::Reject,
    )
}

impl NftTable {
    /// A chain's name with its table: `nat-BERTH-SVC-…`, in a shard `berth-<n> nat-BERTH-SVC-…`.
    pub fn chain_label(chain: &NftChain) -> String {
        if chain.shard == MAIN {
            chain.to_string()
        } else {
            format!("{} {chain}", table_name(TABLE, chain.shard))
        }
    }

    /// The rules the tracer follows for one rule of the table `shard`: a map lookup becomes one
    /// rule per element of that table's map (keys are unique, so their order does not matter),
    /// a planned rule itself.
    fn expand(&self, shard: Shard, rule: &NftRule) -> Vec<(Rule, Option<Element>)> {
        match rule {
            NftRule::Rule(rule) => vec![(traced_rule(rule, shard), None)],
            NftRule::ServiceMap => self
                .services
                .iter()
                .filter(|(_, target)| target.shard == shard)
                .map(|(key, target)| {
                    let element = Element::Service(*key, target.clone());
                    (service_rule(key, target), Some(element))
                })
                .collect(),
            NftRule::NodePortMap => self
                .node_ports
                .iter()
                .filter(|(_, target)| target.shard == shard)
                .map(|(key, target)| {
                    let element = Element::NodePort(*key, target.clone());
                    (node_port_rule(key, target), Some(element))
                })
                .collect(),
            NftRule::Hairpin(target) => self
                .hairpin
                .iter()
                .map(|ip| (hairpin_rule(*ip, target), Some(Element::Hairpin(*ip))))
                .collect(),
            NftRule::ClusterIpSet => self
                .cluster_ips
                .iter()
                .map(|ip| (cluster_ip_rule(*ip), Some(Element::ClusterIp(*ip))))
                .collect(),
        }
    }

    /// The tables as a ruleset the tracer follows: base chains become the built-in jumps (the
    /// base chains of one hook in the order the kernel runs them: by priority, and one priority
    /// in table order), each map lookup one rule per element, every other rule is the rule
    /// itself. A table's chains jump only within it: a shard's are named `<chain>@<shard>`.
    pub fn traceable(&self) -> Ruleset {
        let mut rs = Ruleset::default();
        let mut bases = Vec::new();
        for (chain, rules) in &self.chains {
            let out: Vec<Rule> = rules
                .iter()
                .flat_map(|rule| self.expand(chain.shard, rule))
                .map(|(rule, _)| rule)
                .collect();
            match self.hooks.get(chain) {
                Some(hook) => bases.push((*hook, chain, out)),
                None => {
                    rs.table_mut(chain.table)
                        .chains
                        .insert(traced_name(&chain.name, chain.shard), out);
                }
            }
        }
        bases.sort_by_key(|(hook, chain, _)| (hook.priority_number(), chain.shard));
        for (hook, _, out) in bases {
            rs.jumps.extend(out.into_iter().map(|rule| JumpRule {
                table: hook.table,
                from: hook.builtin(),
                rule,
            }));
        }
        rs
    }

    /// A rule a traced packet hit, as the table holds it: `<chain>: <rule in nft syntax>`, and
    /// for a map or set lookup the element that matched.
    pub fn hop_text(&self, family: IpFamily, hit: &Hit) -> String {
        let chain = untraced(hit.table, &hit.chain);
        // A built-in chain's hit is a rule of one of the base chains standing for it.
        let bases: Vec<&NftChain> = self
            .hooks
            .iter()
            .filter(|(_, hook)| hook.table == hit.table && hook.builtin() == hit.chain)
            .map(|(base, _)| base)
            .collect();
        let candidates: Vec<&NftChain> = if bases.is_empty() {
            vec![&chain]
        } else {
            bases
        };
        let found = candidates.into_iter().find_map(|chain| {
            let rules = self.chains.get(chain)?;
            rules.iter().find_map(|rule| {
                self.expand(chain.shard, rule)
                    .into_iter()
                    .find(|(traced, _)| *traced == hit.rule)
                    .map(|(_, element)| (chain, rule, element))
            })
        });
        let (chain, text) = match found {
            Some((chain, rule, None)) => (chain.clone(), rule_text(family, hit.table, rule)),
            Some((chain, rule, Some(element))) => (
                chain.clone(),
                format!(
                    "{} (element {})",
                    rule_text(family, hit.table, rule),
                    element_text(&element, true)
                ),
            ),
            // Not a rule of these tables (the tracer only hits the tables' own rules).
            None => (
                chain,
                rule_text(family, hit.table, &NftRule::Rule(hit.rule.clone())),
            ),
        };
        format!("{}: {text}", Self::chain_label(&chain))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::model::{Table, Target};
    use crate::trace::{trace_paths, Origin, Packet, TraceEnv, Verdict};
    use berth_core::Protocol;

    fn nat(name: &str) -> NftChain {
        NftChain::new(Table::Nat, &ChainName::new(name))
    }

    /// prerouting -> services map -> one Service with one endpoint; postrouting's hairpin.
    fn mk_table() -> NftTable {
        let mut t = NftTable {
            tables: [MAIN].into(),
            maps: [MAIN].into(),
            ..NftTable::default()
        };
        let pre = nat("PREROUTING");
        t.hooks.insert(
            pre.clone(),
            Hook::of_builtin(Table::Nat, &ChainName::new("PREROUTING")).unwrap(),
        );
        t.chains.insert(
            pre,
            vec![NftRule::Rule(Rule::jump(
                vec![Match::comment("berth service portals")],
                &ChainName::new("BERTH-SERVICES"),
            ))],
        );
        t.chains
            .insert(nat("BERTH-SERVICES"), vec![NftRule::ServiceMap]);
        t.chains.insert(
            nat("BERTH-SVC-A"),
            vec![NftRule::Rule(Rule::new(
                vec![Match::Protocol(Protocol::Tcp)],
                Target::Dnat("10.244.1.2:8080".parse().unwrap()),
            ))],
        );
        t.services.insert(
            ("10.96.0.10".parse().unwrap(), Protocol::Tcp, 80),
            nat("BERTH-SVC-A"),
        );
        t
    }

    #[test]
    fn a_packet_is_traced_through_the_map_and_each_hop_is_shown_as_nft_holds_it() {
        let t = mk_table();
        let packet = Packet {
            src: "10.244.2.9".parse().unwrap(),
            dst: "10.96.0.10".parse().unwrap(),
            protocol: Protocol::Tcp,
            dport: 80,
            origin: Origin::Network,
            bridged: false,
        };
        let paths = trace_paths(&t.traceable(), &TraceEnv::default(), &packet).unwrap();
        assert_eq!(paths.len(), 1);
        assert_eq!(
            paths[0].outcome.verdict,
            Verdict::Dnat("10.244.1.2:8080".parse().unwrap())
        );
        let hops: Vec<String> = paths[0]
            .hits
            .iter()
            .map(|hit| t.hop_text(IpFamily::V4, hit))
            .collect();
        assert_eq!(
            hops,
            [
                "nat-PREROUTING: jump nat-BERTH-SERVICES comment \"berth service portals\"",
                "nat-BERTH-SERVICES: ip daddr . meta l4proto . th dport vmap @service-ips \
                 (element 10.96.0.10 . tcp . 80 : jump nat-BERTH-SVC-A)",
                "nat-BERTH-SVC-A: meta l4proto tcp dnat to 10.244.1.2:8080",
            ]
        );
    }

    /// With Service CIDRs: the filter chain's set lookup is followed element by element, and the
    /// hop names the set rule and the ClusterIP that matched.
    #[test]
    fn a_cluster_ip_on_another_port_is_rejected_through_the_set() {
        let mut t = mk_table();
        let filter = |name: &str| NftChain::new(Table::Filter, &ChainName::new(name));
        let forward = filter("FORWARD");
        t.hooks.insert(
            forward.clone(),
            Hook::of_builtin(Table::Filter, &ChainName::new("FORWARD")).unwrap(),
        );
        t.chains.insert(
            forward,
            vec![NftRule::Rule(Rule::jump(
                vec![Match::dst_net("10.96.0.0/16".parse().unwrap())],
                &ChainName::new("BERTH-CLUSTER-IPS"),
            ))],
        );
        t.chains.insert(
            filter("BERTH-CLUSTER-IPS"),
            vec![
                NftRule::ClusterIpSet,
                NftRule::Rule(Rule::new(vec![], Target::Drop)),
            ],
        );
        t.cluster_ips.insert("10.96.0.10".parse().unwrap());
        let packet = |dst: &str| Packet {
            src: "10.244.2.9".parse().unwrap(),
            dst: dst.parse().unwrap(),
            protocol: Protocol::Tcp,
            dport: 81,
            origin: Origin::Network,
            bridged: false,
        };
        let paths =
            trace_paths(&t.traceable(), &TraceEnv::default(), &packet("10.96.0.10")).unwrap();
        assert_eq!(paths.len(), 1);
        assert_eq!(paths[0].outcome.verdict, Verdict::Reject);
        let last = paths[0].hits.last().unwrap();
        assert_eq!(
            t.hop_text(IpFamily::V4, last),
            "filter-BERTH-CLUSTER-IPS: ip daddr @cluster-ips reject with icmp type \
             port-unreachable comment \"berth: cluster IP, on a port it does not have\" \
             (element 10.96.0.10)"
        );
        let paths =
            trace_paths(&t.traceable(), &TraceEnv::default(), &packet("10.96.0.11")).unwrap();
        assert_eq!(paths[0].outcome.verdict, Verdict::Drop);
    }

    #[test]
    fn another_port_misses_the_map() {
        let t = mk_table();
        let packet = Packet {
            src: "10.244.2.9".parse().unwrap(),
            dst: "10.96.0.10".parse().unwrap(),
            protocol: Protocol::Tcp,
            dport: 81,
            origin: Origin::Network,
            bridged: false,
        };
        let paths = trace_paths(&t.traceable(), &TraceEnv::default(), &packet).unwrap();
        assert_eq!(paths.len(), 1);
        assert_eq!(paths[0].outcome.verdict, Verdict::Delivered);
    }
}

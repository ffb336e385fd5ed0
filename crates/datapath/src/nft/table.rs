//! berth's nftables table of one family, typed: what the in-memory nftables holds after
//! berth's transactions ([`crate::fake::MemoryNft`]) and what [`crate::nft::decode`] reads back
//! from the kernel. The packet tracer follows it as a [`Ruleset`] ([`NftTable::traceable`]);
//! each rule a traced packet hits is shown again in nft's words ([`NftTable::hop_text`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::nft::render::{element_text, rule_text, Element, Hook, NftChain, NftRule};
use crate::nft::render::{NodePortKey, ServiceKey};
use crate::plan::model::{ChainName, JumpRule, Match, PortMatch, Rule, Ruleset};
use crate::trace::Hit;
use berth_core::IpFamily;

/// berth's table as the kernel holds it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NftTable {
    pub chains: BTreeMap<NftChain, Vec<NftRule>>,
    pub hooks: BTreeMap<NftChain, Hook>,
    /// Whether the maps are declared.
    pub maps: bool,
    pub services: BTreeMap<ServiceKey, NftChain>,
    pub node_ports: BTreeMap<NodePortKey, NftChain>,
    pub affinity: BTreeMap<ChainName, u32>,
    /// Endpoints of the hairpin set (`ep . ep`).
    pub hairpin: BTreeSet<IpAddr>,
}

/// A `service-ips` element as the rule the tracer follows.
fn service_rule((addr, proto, port): &ServiceKey, target: &NftChain) -> Rule {
    Rule::jump(
        vec![
            Match::Protocol(*proto),
            Match::dst(*addr),
            Match::DestPort(PortMatch::Single(*port)),
        ],
        &target.name,
    )
}

/// A `node-ports` element as the rule the tracer follows.
fn node_port_rule((proto, port): &NodePortKey, target: &NftChain) -> Rule {
    Rule::jump(
        vec![
            Match::Protocol(*proto),
            Match::DestPort(PortMatch::Single(*port)),
        ],
        &target.name,
    )
}

/// A hairpin pair as the rule the tracer follows. In postrouting the destination is the
/// translated one. The tracer has no `ct status dnat`: a pair would also match a pod sending
/// straight to itself, a packet that never reaches the node's hooks.
fn hairpin_rule(ip: IpAddr, target: &ChainName) -> Rule {
    Rule::jump(vec![Match::src(ip), Match::dst(ip)], target)
}

impl NftTable {
    /// The rules the tracer follows for one rule of the table: a map lookup becomes one rule
    /// per element (keys are unique, so their order does not matter), a planned rule itself.
    fn expand(&self, rule: &NftRule) -> Vec<(Rule, Option<Element>)> {
        match rule {
            NftRule::Rule(rule) => vec![(rule.clone(), None)],
            NftRule::ServiceMap => self
                .services
                .iter()
                .map(|(key, target)| {
                    let element = Element::Service(*key, target.clone());
                    (service_rule(key, target), Some(element))
                })
                .collect(),
            NftRule::NodePortMap => self
                .node_ports
                .iter()
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
        }
    }

    /// The table as a ruleset the tracer follows: base chains become the built-in jumps, each
    /// map lookup one rule per element, every other rule is the rule itself.
    pub fn traceable(&self) -> Ruleset {
        let mut rs = Ruleset::default();
        for (chain, rules) in &self.chains {
            let out: Vec<Rule> = rules
                .iter()
                .flat_map(|rule| self.expand(rule))
                .map(|(rule, _)| rule)
                .collect();
            match self.hooks.get(chain) {
                Some(hook) => rs.jumps.extend(out.into_iter().map(|rule| JumpRule {
                    table: hook.table,
                    from: hook.builtin(),
                    rule,
                })),
                None => {
                    rs.table_mut(chain.table)
                        .chains
                        .insert(chain.name.clone(), out);
                }
            }
        }
        rs
    }

    /// A rule a traced packet hit, as the table holds it: `<chain>: <rule in nft syntax>`, and
    /// for a map or set lookup the element that matched.
    pub fn hop_text(&self, family: IpFamily, hit: &Hit) -> String {
        let chain = NftChain::new(hit.table, &hit.chain);
        let found = self.chains.get(&chain).and_then(|rules| {
            rules.iter().find_map(|rule| {
                self.expand(rule)
                    .into_iter()
                    .find(|(traced, _)| *traced == hit.rule)
                    .map(|(_, element)| (rule, element))
            })
        });
        let text = match found {
            Some((rule, None)) => rule_text(family, hit.table, rule),
            Some((rule, Some(element))) => format!(
                "{} (element {})",
                rule_text(family, hit.table, rule),
                element_text(&element, true)
            ),
            // Not a rule of this table (the tracer only hits the table's own rules).
            None => rule_text(family, hit.table, &NftRule::Rule(hit.rule.clone())),
        };
        format!("{chain}: {text}")
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
            maps: true,
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

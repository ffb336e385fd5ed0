//! Adoption: berth's table as the kernel holds it ([`Observed`], read back by a netlink dump)
//! against the plan, and the transaction that repairs the difference ([`plan_repair`]) instead
//! of replacing the table. What a full sync used to rebuild from nothing (and so forgot: the
//! ClientIP affinity entries of the dynamic sets) is kept wherever it already matches.
//!
//! Rules are compared in a canonical form of their expressions: each expression's name and its
//! attributes sorted by type, without what the kernel adds or counts on its own (counter values,
//! `lookup`/`dynset` flags and timeouts left at zero, the `bitwise` operation when boolean, a NAT
//! range's upper bounds and flags, set ids) and with nesting flags cleared. A rule berth wrote
//! and the kernel dumped compare equal; any other difference rewrites the chain.
//!
//! The observed side (the [`Observed`] tables read from a dump, the canonical form of a rule)
//! lives in `observed.rs`; it is re-exported here, so its `nft::adopt` paths keep working.

use std::collections::{BTreeMap, BTreeSet};

use crate::nft::expr::{element_key, rule_userdata, write_rule_exprs};
use crate::nft::inline::HAIRPIN_SET;
use crate::nft::render::{
    Command, Element, NftRuleset, CLUSTER_IP_SET, NODE_PORT_MAP, SERVICE_MAP,
};
use crate::nft::shard::{Shard, Shards, MAIN};
use crate::nft::wire::Writer;
use berth_core::IpFamily;

// Moved to their own module; re-exported so that every `nft::adopt::…` path keeps working.
pub use crate::nft::observed::{
    canonical_rule, observe_table, split_tables, Observed, ObservedChain, ObservedSet,
    ObservedTables,
};

/// The canonical form of a planned rule, as berth would write it.
fn planned_rule(
    family: IpFamily,
    chain: &crate::nft::render::NftChain,
    rule: &crate::nft::render::NftRule,
) -> Vec<u8> {
    let mut w = Writer::default();
    write_rule_exprs(&mut w, family, chain.table, rule);
    canonical_rule(w.bytes(), rule_userdata(rule).as_deref())
}

/// The fixed sets and maps of the table `shard` as the batch writer declares them: name,
/// flags, key type and length.
fn fixed_sets(family: IpFamily, shard: Shard) -> Vec<(&'static str, u32, u32, u32)> {
    let (addr, len) = match family {
        IpFamily::V4 => (7, 4),
        IpFamily::V6 => (8, 16),
    };
    let mut want = vec![
        (SERVICE_MAP, 0x8, (addr << 12) | (12 << 6) | 13, len + 8),
        (NODE_PORT_MAP, 0x8, (12 << 6) | 13, 8),
    ];
    if shard == MAIN {
        want.push((HAIRPIN_SET, 0, (addr << 6) | addr, len * 2));
        want.push((CLUSTER_IP_SET, 0, addr, len));
    }
    want
}

/// A table just added: its fixed sets declared, nothing else.
pub(super) fn declared(family: IpFamily, shard: Shard) -> Observed {
    let mut observed = Observed::default();
    for (name, flags, key_type, key_len) in fixed_sets(family, shard) {
        observed.sets.insert(
            name.to_string(),
            ObservedSet {
                flags,
                key_type,
                key_len,
                timeout_ms: 0,
            },
        );
        observed.elements.insert(name.to_string(), BTreeMap::new());
    }
    observed
}

/// The expected declaration of each fixed set and map, from the batch writer's own choice.
/// `cluster-ips` may be missing (a table written before berth had it): declaring the sets
/// again adds it.
pub(super) fn fixed_sets_match(observed: &Observed, family: IpFamily, shard: Shard) -> bool {
    fixed_sets(family, shard)
        .iter()
        .all(
            |(name, flags, key_type, key_len)| match observed.sets.get(*name) {
                Some(s) => {
                    s.flags & 0x8 == *flags && s.key_type == *key_type && s.key_len == *key_len
                }
                None => *name == CLUSTER_IP_SET,
            },
        )
}

/// The commands that turn `observed` into `planned`, leaving alone whatever already matches
/// (and the dynamic sets' entries); `None` when the table is not one berth can repair in place
/// (its maps are missing or of another shape, a base chain hooks elsewhere): then it is replaced.
///
/// Over berth's tables: a shard the plan has and the kernel not is added, one the kernel has and
/// the plan not (another shard count before a restart) deleted whole, each other repaired on its
/// own (no jump crosses tables).
pub fn plan_repair(
    observed: &ObservedTables,
    planned: &NftRuleset,
    family: IpFamily,
    shards: Shards,
) -> Option<Vec<Command>> {
    let main = observed.get(&MAIN)?;
    let mut out = Vec::new();
    let mut added = Vec::new();
    for shard in shards.shards() {
        if !observed.contains_key(&shard) {
            out.push(Command::AddTable(shard));
            out.push(Command::AddMaps(shard));
            added.push((shard, declared(family, shard)));
        }
    }
    let tables = std::iter::once((MAIN, main))
        .chain(shards.shards().filter_map(|s| Some((s, observed.get(&s)?))))
        .chain(added.iter().map(|(s, o)| (*s, o)));
    for (shard, table) in tables {
        out.extend(plan_repair_table(table, planned, family, shard)?);
    }
    for shard in observed.keys() {
        let planned_here = *shard == MAIN || shards.shards().any(|s| s == *shard);
        if !planned_here {
            out.push(Command::DeleteTable(*shard));
        }
    }
    Some(out)
}

/// The repair of one table, `shard`, against its part of the plan.
fn plan_repair_table(
    observed: &Observed,
    planned: &NftRuleset,
    family: IpFamily,
    shard: Shard,
) -> Option<Vec<Command>> {
    if !fixed_sets_match(observed, family, shard) {
        return None;
    }
    let chains = plan_chains(observed, planned, family, shard)?;
    let sets = plan_affinity_sets(observed, planned, family, shard)?;
    let elements = plan_elements(observed, planned, family, shard);
    let planned_chains: BTreeSet<String> = planned
        .chains
        .keys()
        .filter(|c| c.shard == shard)
        .map(|c| c.to_string())
        .collect();
    let stale = plan_stale(
        observed,
        &|chain| planned_chains.contains(chain),
        &|set| {
            planned
                .affinity
                .keys()
                .any(|(at, a)| *at == shard && a.as_str() == set)
        },
        shard,
    )?;
    let mut out = Vec::new();
    push_table_repair(&mut out, observed, shard, chains, sets, elements);
    out.extend(stale);
    Some(out)
}

/// One table's repair, in the order the kernel needs it: the maps (when `cluster-ips` is
/// missing), chains added, affinity sets, chains rewritten (their rules may name both), then
/// elements deleted and added (they may jump to the added chains). Stale deletions come after.
pub(super) fn push_table_repair(
    out: &mut Vec<Command>,
    observed: &Observed,
    shard: Shard,
    chains: ChainRepair,
    sets: Vec<Command>,
    elements: ElementRepair,
) {
    if shard == MAIN && !observed.sets.contains_key(CLUSTER_IP_SET) {
        out.push(Command::AddMaps(MAIN));
    }
    out.extend(chains.added);
    out.extend(sets);
    out.extend(chains.rewritten);
    out.extend(elements.deletes);
    out.extend(elements.adds);
}

/// Chains to add (with their rules), and chains whose rules differ, flushed and written again.
pub(super) struct ChainRepair {
    pub(super) added: Vec<Command>,
    pub(super) rewritten: Vec<Command>,
}

/// `None` when a planned base chain exists on another hook: the table is replaced then.
pub(super) fn plan_chains(
    observed: &Observed,
    planned: &NftRuleset,
    family: IpFamily,
    shard: Shard,
) -> Option<ChainRepair> {
    let mut added = Vec::new();
    let mut rewritten = Vec::new();
    for (chain, rules) in planned.chains.iter().filter(|(c, _)| c.shard == shard) {
        let name = chain.to_string();
        let hook = planned.hooks.get(chain).copied();
        let want_hook = hook.map(|h| (h.kind().to_string(), h.number(), h.priority_number()));
        match observed.chains.get(&name) {
            Some(seen) if seen.hook != want_hook => return None,
            Some(seen) => {
                let same = seen.rules.len() == rules.len()
                    && seen
                        .rules
                        .iter()
                        .zip(rules)
                        .all(|(have, rule)| *have == planned_rule(family, chain, rule));
                if !same {
                    rewritten.push(Command::FlushChain(chain.clone()));
                    rewritten.extend(
                        rules
                            .iter()
                            .map(|r| Command::AddRule(chain.clone(), r.clone())),
                    );
                }
            }
            None => {
                added.push(Command::AddChain(chain.clone(), hook));
                rewritten.extend(
                    rules
                        .iter()
                        .map(|r| Command::AddRule(chain.clone(), r.clone())),
                );
            }
        }
    }
    Some(ChainRepair { added, rewritten })
}

/// Affinity sets absent or with another timeout, declared again; `None` when one exists with
/// another key or without timeouts.
pub(super) fn plan_affinity_sets(
    observed: &Observed,
    planned: &NftRuleset,
    family: IpFamily,
    shard: Shard,
) -> Option<Vec<Command>> {
    let (addr_type, addr_len) = match family {
        IpFamily::V4 => (7, 4),
        IpFamily::V6 => (8, 16),
    };
    let mut sets = Vec::new();
    let here = planned.affinity.iter().filter(|((s, _), _)| *s == shard);
    for ((_, name), seconds) in here {
        let want = ObservedSet {
            flags: 0x30,
            key_type: addr_type,
            key_len: addr_len,
            timeout_ms: u64::from(*seconds) * 1000,
        };
        match observed.sets.get(name.as_str()) {
            Some(seen)
                if seen.key_type != want.key_type
                    || seen.key_len != want.key_len
                    || seen.flags & 0x30 != 0x30 =>
            {
                return None
            }
            Some(seen) if *seen == want => {}
            // Absent, or another timeout: declaring it again updates it in place.
            _ => sets.push(Command::AddAffinitySet(shard, name.clone(), *seconds)),
        }
    }
    Some(sets)
}

/// Elements of the fixed maps and set: those gone or pointing elsewhere deleted, the missing
/// or changed ones added.
#[derive(Default)]
pub(super) struct ElementRepair {
    pub(super) deletes: Vec<Command>,
    pub(super) adds: Vec<Command>,
}

/// An element keyed as the kernel keys it, with the chain it jumps to (none for a set).
type KeyedElements = BTreeMap<Vec<u8>, (Element, Option<String>)>;

fn keyed(element: Element) -> (Vec<u8>, (Element, Option<String>)) {
    let target = match &element {
        Element::Service(_, t) | Element::NodePort(_, t) => Some(t.to_string()),
        Element::Hairpin(_) | Element::ClusterIp(_) => None,
    };
    (element_key(&element), (element, target))
}

fn plan_elements(
    observed: &Observed,
    planned: &NftRuleset,
    family: IpFamily,
    shard: Shard,
) -> ElementRepair {
    let mut out = plan_map_elements(observed, planned, family, shard);
    if shard == MAIN {
        plan_hairpin(observed, planned.hairpin_endpoints(), family, &mut out);
    }
    out
}

/// The hairpin set's elements (main table) against `hairpin`, every endpoint that needs one.
pub(super) fn plan_hairpin(
    observed: &Observed,
    hairpin: impl IntoIterator<Item = std::net::IpAddr>,
    family: IpFamily,
    out: &mut ElementRepair,
) {
    let hairpin = hairpin
        .into_iter()
        .map(|ip| keyed(Element::Hairpin(ip)))
        .collect();
    diff_elements(observed, HAIRPIN_SET, hairpin, family, MAIN, out);
}

/// The elements of the maps (and in the main table the ClusterIPs' set): all but the hairpin
/// set's, which the whole plan's chains decide.
pub(super) fn plan_map_elements(
    observed: &Observed,
    planned: &NftRuleset,
    family: IpFamily,
    shard: Shard,
) -> ElementRepair {
    let mut out = ElementRepair::default();
    let services = planned
        .services
        .iter()
        .filter(|(_, t)| t.shard == shard)
        .map(|(k, t)| keyed(Element::Service(*k, t.clone())))
        .collect();
    diff_elements(observed, SERVICE_MAP, services, family, shard, &mut out);
    let node_ports = planned
        .node_ports
        .iter()
        .filter(|(_, t)| t.shard == shard)
        .map(|(k, t)| keyed(Element::NodePort(*k, t.clone())))
        .collect();
    diff_elements(observed, NODE_PORT_MAP, node_ports, family, shard, &mut out);
    if shard == MAIN {
        let cluster_ips = planned
            .cluster_ips
            .iter()
            .map(|ip| keyed(Element::ClusterIp(*ip)))
            .collect();
        diff_elements(
            observed,
            CLUSTER_IP_SET,
            cluster_ips,
            family,
            shard,
            &mut out,
        );
    }
    out
}

fn diff_elements(
    observed: &Observed,
    set: &str,
    want: KeyedElements,
    family: IpFamily,
    shard: Shard,
    out: &mut ElementRepair,
) {
    let empty = BTreeMap::new();
    let have = observed.elements.get(set).unwrap_or(&empty);
    for (key, target) in have {
        match want.get(key) {
            Some((_, t)) if t == target => {}
            Some((element, _)) => out.deletes.push(Command::DeleteElement(element.clone())),
            None => {
                if let Some(element) = element_from_key(set, key, target, family, shard) {
                    out.deletes.push(Command::DeleteElement(element));
                }
            }
        }
    }
    for (key, (element, target)) in want {
        if have.get(&key) != Some(&target) {
            out.adds.push(Command::AddElement(element));
        }
    }
}

/// Chains and sets of `observed` berth no longer plans (`chain_planned` and `set_planned` say
/// which it does), deleted once nothing names them (chains flushed first); `None` for a chain
/// name berth never gives.
pub(super) fn plan_stale(
    observed: &Observed,
    chain_planned: &dyn Fn(&str) -> bool,
    set_planned: &dyn Fn(&str) -> bool,
    shard: Shard,
) -> Option<Vec<Command>> {
    let stale_chains: Vec<_> = observed
        .chains
        .keys()
        .filter(|c| !chain_planned(c))
        .map(|c| raw_chain(c, shard))
        .collect::<Option<_>>()?;
    let fixed = [SERVICE_MAP, NODE_PORT_MAP, HAIRPIN_SET, CLUSTER_IP_SET];
    let stale_sets = observed
        .sets
        .keys()
        .filter(|s| !fixed.contains(&s.as_str()) && !set_planned(s));
    let mut out = Vec::new();
    for chain in &stale_chains {
        out.push(Command::FlushChain(chain.clone()));
    }
    for chain in stale_chains {
        out.push(Command::DeleteChain(chain));
    }
    for set in stale_sets {
        out.push(Command::DeleteAffinitySet(
            shard,
            crate::plan::model::ChainName::new(set),
        ));
    }
    Some(out)
}

/// A chain of the table by its nft name (`nat-BERTH-…`), for commands that only name it;
/// `None` for a name berth never gives a chain.
fn raw_chain(name: &str, shard: Shard) -> Option<crate::nft::render::NftChain> {
    use crate::plan::model::{ChainName, Table};
    let (table, rest) = name.split_once('-')?;
    Some(crate::nft::render::NftChain::in_shard(
        Table::parse(table)?,
        &ChainName::new(rest),
        shard,
    ))
}

/// An element the plan does not have, rebuilt from its key to be deleted.
fn element_from_key(
    set: &str,
    key: &[u8],
    target: &Option<String>,
    family: IpFamily,
    shard: Shard,
) -> Option<Element> {
    use berth_core::Protocol;
    use std::net::IpAddr;
    let addr_len = match family {
        IpFamily::V4 => 4,
        IpFamily::V6 => 16,
    };
    let addr = |bytes: &[u8]| -> Option<IpAddr> {
        match bytes.len() {
            4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
            16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
            _ => None,
        }
    };
    let proto = |b: u8| match b {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    };
    let port = |b: &[u8]| Some(u16::from_be_bytes([*b.first()?, *b.get(1)?]));
    let target = raw_chain(target.as_deref().unwrap_or("nat-BERTH-NONE"), shard)?;
    match set {
        SERVICE_MAP if key.len() == addr_len + 8 => Some(Element::Service(
            (
                addr(&key[..addr_len])?,
                proto(key[addr_len])?,
                port(&key[addr_len + 4..])?,
            ),
            target,
        )),
        NODE_PORT_MAP if key.len() == 8 => Some(Element::NodePort(
            (proto(key[0])?, port(&key[4..])?),
            target,
        )),
        HAIRPIN_SET if key.len() == addr_len * 2 => Some(Element::Hairpin(addr(&key[..addr_len])?)),
        CLUSTER_IP_SET if key.len() == addr_len => Some(Element::ClusterIp(addr(key)?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::render::{Hook, NftChain, NftRule};
    use crate::plan::model::{ChainName, Match, RecentAction, Rule, Table, Target};
    use berth_core::Protocol;
    use std::net::IpAddr;

    fn chain(name: &str) -> NftChain {
        NftChain::new(Table::Nat, &ChainName::new(name))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn dnat(to: &str, affinity: Option<&str>) -> NftRule {
        let mut matches = vec![Match::Random { one_in: 2 }];
        if let Some(set) = affinity {
            matches.push(Match::Recent {
                name: ChainName::new(set),
                action: RecentAction::Set,
            });
        }
        matches.push(Match::Protocol(Protocol::Tcp));
        NftRule::Rule(Rule::new(matches, Target::Dnat(to.parse().unwrap())))
    }

    /// A small plan: the prerouting base chain, the Service map and one Service with affinity.
    fn mk_planned() -> NftRuleset {
        let mut p = NftRuleset::default();
        let pre = ChainName::new("PREROUTING");
        let base = NftChain::new(Table::Nat, &pre);
        p.hooks
            .insert(base.clone(), Hook::of_builtin(Table::Nat, &pre).unwrap());
        p.chains.insert(
            base,
            vec![NftRule::Rule(Rule::jump(
                vec![Match::comment("berth service portals")],
                &ChainName::new("BERTH-SERVICES"),
            ))],
        );
        p.chains
            .insert(chain("BERTH-SERVICES"), vec![NftRule::ServiceMap]);
        p.chains.insert(
            chain("BERTH-SVC-A"),
            vec![
                dnat("10.244.1.2:8080", Some("BERTH-SEP-A1")),
                dnat("10.244.2.2:8080", None),
            ],
        );
        p.services
            .insert((ip("10.96.0.10"), Protocol::Tcp, 80), chain("BERTH-SVC-A"));
        p.affinity
            .insert((MAIN, ChainName::new("BERTH-SEP-A1")), 300);
        p.hairpin.insert(
            chain("BERTH-SVC-A"),
            [ip("10.244.1.2")].into_iter().collect(),
        );
        p.chains.insert(
            NftChain::new(Table::Filter, &ChainName::new("BERTH-CLUSTER-IPS")),
            vec![NftRule::ClusterIpSet],
        );
        p.cluster_ips.insert(ip("10.96.0.10"));
        p
    }

    /// What the kernel holds after berth wrote `p`, as a dump reads it.
    fn observe(p: &NftRuleset) -> Observed {
        let mut o = Observed::default();
        for (c, rules) in &p.chains {
            let hook = p
                .hooks
                .get(c)
                .map(|h| (h.kind().to_string(), h.number(), h.priority_number()));
            let rules = rules
                .iter()
                .map(|r| planned_rule(IpFamily::V4, c, r))
                .collect();
            o.chains
                .insert(c.to_string(), ObservedChain { hook, rules });
        }
        let set = |flags, key_type, key_len, timeout_ms| ObservedSet {
            flags,
            key_type,
            key_len,
            timeout_ms,
        };
        o.sets.insert(SERVICE_MAP.into(), set(8, 0x730d, 12, 0));
        o.sets.insert(NODE_PORT_MAP.into(), set(8, 0x30d, 8, 0));
        o.sets.insert(HAIRPIN_SET.into(), set(0, 0x1c7, 8, 0));
        o.sets.insert(CLUSTER_IP_SET.into(), set(0, 7, 4, 0));
        for ((_, name), seconds) in &p.affinity {
            o.sets.insert(
                name.to_string(),
                set(0x30, 7, 4, u64::from(*seconds) * 1000),
            );
        }
        let mut elements = |set: &str, element: Element, target: Option<String>| {
            o.elements
                .entry(set.to_string())
                .or_default()
                .insert(element_key(&element), target);
        };
        for (k, t) in &p.services {
            elements(
                SERVICE_MAP,
                Element::Service(*k, t.clone()),
                Some(t.to_string()),
            );
        }
        for ip in p.hairpin_endpoints() {
            elements(HAIRPIN_SET, Element::Hairpin(ip), None);
        }
        for ip in &p.cluster_ips {
            elements(CLUSTER_IP_SET, Element::ClusterIp(*ip), None);
        }
        o
    }

    /// The main table alone.
    fn tables(main: Observed) -> ObservedTables {
        [(MAIN, main)].into()
    }

    fn names(commands: &[Command]) -> Vec<String> {
        commands
            .iter()
            .map(|c| {
                crate::nft::render::command_text(IpFamily::V4, c)
                    .trim()
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn a_matching_table_needs_nothing() {
        let p = mk_planned();
        assert_eq!(
            plan_repair(&tables(observe(&p)), &p, IpFamily::V4, Shards::default()),
            Some(vec![])
        );
    }

    /// (what changed in the kernel, the commands that repair it)
    #[test]
    fn each_difference_is_repaired_alone() {
        let p = mk_planned();
        type Change = fn(&mut Observed);
        let rows: Vec<(&str, Change, Vec<&str>)> = vec![
            (
                "a rule deleted",
                |o| {
                    o.chains.get_mut("nat-BERTH-SVC-A").unwrap().rules.pop();
                },
                vec![
                    "flush chain ip berth nat-BERTH-SVC-A",
                    "add rule ip berth nat-BERTH-SVC-A numgen random mod 2 == 0 update @BERTH-SEP-A1 { ip saddr } meta l4proto tcp dnat to 10.244.1.2:8080",
                    "add rule ip berth nat-BERTH-SVC-A numgen random mod 2 == 0 meta l4proto tcp dnat to 10.244.2.2:8080",
                ],
            ),
            (
                "a chain deleted",
                |o| {
                    o.chains.remove("nat-BERTH-SERVICES");
                },
                vec![
                    "add chain ip berth nat-BERTH-SERVICES",
                    "add rule ip berth nat-BERTH-SERVICES ip daddr . meta l4proto . th dport vmap @service-ips",
                ],
            ),
            (
                "a stray chain and set",
                |o| {
                    o.chains.insert("nat-BERTH-OLD".into(), ObservedChain::default());
                    o.sets.insert("BERTH-SEP-OLD".into(), ObservedSet::default());
                },
                vec![
                    "flush chain ip berth nat-BERTH-OLD",
                    "delete chain ip berth nat-BERTH-OLD",
                    "delete set ip berth BERTH-SEP-OLD",
                ],
            ),
            (
                "a map element gone, a stray one, a hairpin pair gone",
                |o| {
                    let map = o.elements.get_mut(SERVICE_MAP).unwrap();
                    map.clear();
                    map.insert(
                        element_key(&Element::Service(
                            ("10.96.0.99".parse().unwrap(), Protocol::Udp, 53),
                            chain("BERTH-SVC-A"),
                        )),
                        Some("nat-BERTH-SVC-A".into()),
                    );
                    o.elements.get_mut(HAIRPIN_SET).unwrap().clear();
                },
                vec![
                    "delete element ip berth service-ips { 10.96.0.99 . udp . 53 }",
                    "add element ip berth service-ips { 10.96.0.10 . tcp . 80 : jump nat-BERTH-SVC-A }",
                    "add element ip berth hairpin { 10.244.1.2 . 10.244.1.2 }",
                ],
            ),
            (
                "a ClusterIP gone, a stray one",
                |o| {
                    let set = o.elements.get_mut(CLUSTER_IP_SET).unwrap();
                    set.clear();
                    set.insert(vec![10, 96, 0, 99], None);
                },
                vec![
                    "delete element ip berth cluster-ips { 10.96.0.99 }",
                    "add element ip berth cluster-ips { 10.96.0.10 }",
                ],
            ),
            (
                "a table written before berth had cluster-ips",
                |o| {
                    o.sets.remove(CLUSTER_IP_SET);
                    o.elements.remove(CLUSTER_IP_SET);
                    o.chains.remove("filter-BERTH-CLUSTER-IPS");
                },
                vec![
                    "add map ip berth service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }\n\
                     add map ip berth node-ports { type inet_proto . inet_service : verdict ; }\n\
                     add set ip berth hairpin { type ipv4_addr . ipv4_addr ; }\n\
                     add set ip berth cluster-ips { type ipv4_addr ; }",
                    "add chain ip berth filter-BERTH-CLUSTER-IPS",
                    "add rule ip berth filter-BERTH-CLUSTER-IPS ip daddr @cluster-ips reject with icmp type port-unreachable comment \"berth: cluster IP, on a port it does not have\"",
                    "add element ip berth cluster-ips { 10.96.0.10 }",
                ],
            ),
            (
                "an affinity set with another timeout",
                |o| o.sets.get_mut("BERTH-SEP-A1").unwrap().timeout_ms = 10_000,
                vec!["add set ip berth BERTH-SEP-A1 { type ipv4_addr ; flags dynamic,timeout ; timeout 300s ; }"],
            ),
        ];
        for (what, change, want) in rows {
            let mut o = observe(&p);
            change(&mut o);
            let got = plan_repair(&tables(o), &p, IpFamily::V4, Shards::default())
                .unwrap_or_else(|| panic!("{what}"));
            assert_eq!(names(&got), want, "{what}");
        }
    }

    #[test]
    fn a_table_of_another_shape_is_replaced() {
        let p = mk_planned();
        let mut no_map = observe(&p);
        no_map.sets.remove(SERVICE_MAP);
        assert_eq!(
            plan_repair(&tables(no_map), &p, IpFamily::V4, Shards::default()),
            None
        );
        let mut rehooked = observe(&p);
        rehooked.chains.get_mut("nat-PREROUTING").unwrap().hook = Some(("nat".into(), 0, 0));
        assert_eq!(
            plan_repair(&tables(rehooked), &p, IpFamily::V4, Shards::default()),
            None
        );
        let mut foreign = observe(&p);
        foreign
            .chains
            .insert("someone".into(), ObservedChain::default());
        assert_eq!(
            plan_repair(&tables(foreign), &p, IpFamily::V4, Shards::default()),
            None
        );
    }
}

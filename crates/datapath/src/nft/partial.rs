//! The partial diff: the chains that changed since the last sync, or the dispatch entries the
//! planner reports changed, turned into the fewest commands (chains flushed and refilled, added
//! or deleted; map and set elements deleted and added) while the applied state is updated in
//! place. Separate from the Syncer, which only decides when a sync is partial and applies it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::error::Error;
use crate::nft::applied::{sets_named, Applied, ChainKey, SetKey};
use crate::nft::render::{
    affinity_refs, check_expressible, convert_chain, element_chain, is_folded, place_rules,
    placed_rule_count, rules_hash, Command, ConvertedChain, Element, NftChain, NftRule,
    DEFAULT_AFFINITY_SECONDS,
};
use crate::nft::shard::{Placement, Shard, Shards, MAIN};
use crate::plan::incremental::DispatchChanges;
use crate::plan::model::{ChainName, Rule, Ruleset, Table};
use crate::plan::names;
use berth_core::Protocol;

/// One partial transaction as it is worked out, its commands by kind, and what settles at the
/// end: sets no chain names any more, hairpin endpoints whose need changed.
#[derive(Default)]
pub(super) struct PartialDiff {
    shards: Shards,
    added: Vec<Command>,
    flushed: Vec<Command>,
    sets: Vec<Command>,
    rules: Vec<Command>,
    element_deletes: Vec<Command>,
    element_adds: Vec<Command>,
    pub(super) deleted: Vec<NftChain>,
    stale_sets: Vec<Command>,
    pub(super) rewritten: usize,
    orphaned: Vec<SetKey>,
    /// Hairpin endpoints whose need changed -> whether the set held them before.
    touched_hairpin: BTreeMap<IpAddr, bool>,
    /// The endpoint chains the chains rewritten so far use -> those chains' table.
    homes: BTreeMap<ChainName, Shard>,
}

impl PartialDiff {
    /// An empty diff for the tables `shards` makes.
    pub(super) fn new(shards: Shards) -> Self {
        PartialDiff {
            shards,
            ..PartialDiff::default()
        }
    }

    /// Where the rules of the planned chain `key` go; an endpoint chain that stays a chain goes
    /// with the chains using it: where this diff wrote them (users go first, and a changed
    /// endpoint chain's users change with it), else where it is.
    fn placement(&self, next: &Applied, key: &ChainKey) -> Placement {
        match self.shards.place(key.0, &key.1) {
            Placement::WithUser => {
                let home = self
                    .homes
                    .get(&key.1)
                    .or_else(|| next.chains.get(key).map(|(_, _, home)| home))
                    .map_or(MAIN, |home| *home);
                Placement::In(home)
            }
            other => other,
        }
    }

    /// Brings one chain of the work list up to `rs`: deleted when it is no longer programmed,
    /// its map elements diffed, flushed and refilled (or added) when its rules changed.
    pub(super) fn chain(
        &mut self,
        next: &mut Applied,
        rs: &Ruleset,
        key: &ChainKey,
    ) -> Result<(), Error> {
        let planned = rs
            .chain(key.0, &key.1)
            .filter(|_| !is_folded(rs, key.0, &key.1));
        let Some(planned) = planned else {
            if key.0 == Table::Filter && key.1.as_str() == names::CLUSTER_IPS {
                // Its set's elements go with it.
                diff_set(
                    &mut next.cluster_ips,
                    &[],
                    Element::ClusterIp,
                    &mut self.element_deletes,
                    &mut self.element_adds,
                );
            }
            if let Some((_, n, home)) = next.chains.remove(key) {
                next.rules = next.rules.saturating_sub(n);
                self.orphaned
                    .extend(next.set_chain_sets(key, BTreeSet::new()));
                next.set_chain_folds(key, false, BTreeSet::new(), &mut self.touched_hairpin);
                self.delete_copies(key, home);
            }
            return Ok(());
        };
        let placement = self.placement(next, key);
        let home = match placement {
            Placement::In(shard) => shard,
            _ => MAIN,
        };
        let converted = convert_chain(rs, key.0, &key.1, planned);
        for endpoint in &converted.endpoints {
            self.homes.insert(endpoint.clone(), home);
        }
        self.maps(next, &converted);
        let hash = rules_hash(&converted.rules);
        let placed = place_rules(self.shards, key.0, &key.1, placement, converted.rules);
        let state = (hash, placed_rule_count(&placed), home);
        let before = next.chains.insert(key.clone(), state);
        if before == Some(state) {
            return Ok(());
        }
        self.rewritten += 1;
        next.rules = next.rules.saturating_sub(before.map_or(0, |(_, n, _)| n)) + state.1;
        let moved = before.is_some_and(|(_, _, was)| was != home);
        if moved {
            // An endpoint chain whose users moved: out of the old table, into the new one.
            if let Some((_, _, was)) = before {
                self.delete_copies(key, was);
            }
        }
        let sets = placed
            .iter()
            .flat_map(|(chain, rules)| sets_named(chain.shard, rules))
            .collect();
        self.orphaned.extend(next.set_chain_sets(key, sets));
        next.set_chain_folds(
            key,
            !converted.endpoints.is_empty(),
            converted.hairpin,
            &mut self.touched_hairpin,
        );
        for (chain, rules) in placed {
            match before {
                Some(_) if !moved => self.flushed.push(Command::FlushChain(chain.clone())),
                _ => self.added.push(Command::AddChain(chain.clone(), None)),
            }
            for rule in rules {
                check_expressible(&rule)?;
                for (name, seconds) in affinity_refs(&rule) {
                    let set = (chain.shard, name.clone());
                    let known = next.affinity.get(&set).copied();
                    // An endpoint chain written before any check names a timeout gets the
                    // default.
                    let wanted = seconds.or(known).unwrap_or(DEFAULT_AFFINITY_SECONDS);
                    if known != Some(wanted) {
                        // Re-adding a set with another timeout updates it in place.
                        next.affinity.insert(set, wanted);
                        self.sets
                            .push(Command::AddAffinitySet(chain.shard, name.clone(), wanted));
                    }
                }
                self.rules.push(Command::AddRule(chain.clone(), rule));
            }
        }
        Ok(())
    }

    /// The copies of the planned chain `key` in its table `home`, to delete.
    fn delete_copies(&mut self, key: &ChainKey, home: Shard) {
        let placement = match self.shards.place(key.0, &key.1) {
            Placement::WithUser => Placement::In(home),
            other => other,
        };
        let copies = place_rules(self.shards, key.0, &key.1, placement, Vec::new());
        self.deleted
            .extend(copies.into_iter().map(|(chain, _)| chain));
    }

    /// The dispatch maps' element changes, when `converted` is the chain that holds a map.
    fn maps(&mut self, next: &mut Applied, converted: &ConvertedChain) {
        match converted.rules.first() {
            Some(NftRule::ServiceMap) => diff_entries(
                self.shards,
                &mut next.services,
                &converted.services,
                Element::Service,
                &mut self.element_deletes,
                &mut self.element_adds,
            ),
            Some(NftRule::NodePortMap) => diff_entries(
                self.shards,
                &mut next.node_ports,
                &converted.node_ports,
                Element::NodePort,
                &mut self.element_deletes,
                &mut self.element_adds,
            ),
            Some(NftRule::ClusterIpSet) => diff_set(
                &mut next.cluster_ips,
                &converted.cluster_ips,
                Element::ClusterIp,
                &mut self.element_deletes,
                &mut self.element_adds,
            ),
            _ => {}
        }
    }

    /// The map element changes of the dispatch chains whose changed entries `dispatch` lists,
    /// made to `next`; returns those chains, which need nothing else. A chain is left to the
    /// whole-chain diff when its entries are not all map elements or it holds rules that
    /// could change with them (folded endpoints).
    pub(super) fn dispatch_maps(
        &mut self,
        next: &mut Applied,
        rs: &Ruleset,
        dispatch: &DispatchChanges,
    ) -> Vec<ChainKey> {
        let mut done = Vec::new();
        let services = (Table::Nat, names::fixed(names::SERVICES));
        let wanted = dispatch.services.iter().map(|(ip, rules)| {
            let converted = map_only(rs, next, &services, rules)?;
            let entries = converted.services;
            entries
                .iter()
                .all(|((addr, _, _), _)| addr == ip)
                .then_some((*ip, entries))
        });
        if let Some(wanted) = wanted.collect::<Option<Vec<_>>>() {
            for (ip, entries) in wanted {
                let mut before = BTreeMap::new();
                for proto in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
                    before.append(&mut take_range(
                        &mut next.services,
                        (ip, proto, 0)..=(ip, proto, u16::MAX),
                    ));
                }
                diff_entries(
                    self.shards,
                    &mut before,
                    &entries,
                    Element::Service,
                    &mut self.element_deletes,
                    &mut self.element_adds,
                );
                // Inserted one by one: `append` would rebuild the whole map.
                next.services.extend(before);
            }
            done.push(services);
        }
        let node_ports = (Table::Nat, names::fixed(names::NODEPORTS));
        let wanted = dispatch.node_ports.iter().map(|(key, rules)| {
            let converted = map_only(rs, next, &node_ports, rules)?;
            let entries = converted.node_ports;
            entries
                .iter()
                .all(|(k, _)| k == key)
                .then_some((*key, entries))
        });
        if let Some(wanted) = wanted.collect::<Option<Vec<_>>>() {
            for (key, entries) in wanted {
                let mut before = take_range(&mut next.node_ports, key..=key);
                diff_entries(
                    self.shards,
                    &mut before,
                    &entries,
                    Element::NodePort,
                    &mut self.element_deletes,
                    &mut self.element_adds,
                );
                next.node_ports.extend(before);
            }
            done.push(node_ports);
        }
        let cluster_ips = (Table::Filter, names::fixed(names::CLUSTER_IPS));
        let wanted = dispatch.cluster_ips.iter().map(|(ip, rules)| {
            let converted = map_only(rs, next, &cluster_ips, rules)?;
            let present = !converted.cluster_ips.is_empty();
            converted
                .cluster_ips
                .iter()
                .all(|addr| addr == ip)
                .then_some((*ip, present))
        });
        if let Some(wanted) = wanted.collect::<Option<Vec<_>>>() {
            for (ip, present) in wanted {
                if present && next.cluster_ips.insert(ip) {
                    self.element_adds
                        .push(Command::AddElement(Element::ClusterIp(ip)));
                } else if !present && next.cluster_ips.remove(&ip) {
                    self.element_deletes
                        .push(Command::DeleteElement(Element::ClusterIp(ip)));
                }
            }
            done.push(cluster_ips);
        }
        done
    }

    /// Once every chain is done: the sets no chain names any more, and the hairpin elements.
    pub(super) fn settle(&mut self, next: &mut Applied) {
        // A set orphaned by one chain may be named again by another rewritten after it.
        for set in std::mem::take(&mut self.orphaned) {
            let named = next.chain_sets.values().any(|sets| sets.contains(&set));
            if !named && next.affinity.remove(&set).is_some() {
                self.stale_sets
                    .push(Command::DeleteAffinitySet(set.0, set.1));
            }
        }
        for (ip, before) in std::mem::take(&mut self.touched_hairpin) {
            match (before, next.hairpin.contains_key(&ip)) {
                (true, false) => self
                    .element_deletes
                    .push(Command::DeleteElement(Element::Hairpin(ip))),
                (false, true) => self
                    .element_adds
                    .push(Command::AddElement(Element::Hairpin(ip))),
                _ => {}
            }
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.flushed.is_empty()
            && self.rules.is_empty()
            && self.deleted.is_empty()
            && self.sets.is_empty()
            && self.stale_sets.is_empty()
            && self.element_deletes.is_empty()
            && self.element_adds.is_empty()
    }

    /// The commands in the order the kernel accepts them: chains before the rules and elements
    /// that name them, deletions last.
    pub(super) fn into_commands(self, commands: &mut Vec<Command>) {
        commands.extend(self.added);
        commands.extend(self.flushed);
        commands.extend(self.sets);
        commands.extend(self.rules);
        commands.extend(self.element_deletes);
        commands.extend(self.element_adds);
        commands.extend(self.deleted.iter().cloned().map(Command::FlushChain));
        commands.extend(self.deleted.into_iter().map(Command::DeleteChain));
        commands.extend(self.stale_sets);
    }
}

/// The table whose map holds an element jumping to `target` ([`element_chain`]'s, without
/// building the chain).
fn element_shard(shards: Shards, target: &ChainName) -> Shard {
    match shards.place(Table::Nat, target) {
        Placement::In(shard) => shard,
        _ => MAIN,
    }
}

/// Element-level changes from the map `before` to the chain's `entries` (keys unique, any
/// order), made to `before` in place: deletions (removed or retargeted keys) in key order, then
/// additions (new or retargeted keys) in key order. A merge of the two sorted sequences: at
/// 10,000 Services only what differs is cloned, not the whole map.
fn diff_entries<K: Ord + Copy>(
    shards: Shards,
    before: &mut BTreeMap<K, NftChain>,
    entries: &[(K, ChainName)],
    element: impl Fn(K, NftChain) -> Element,
    deletes: &mut Vec<Command>,
    adds: &mut Vec<Command>,
) {
    let mut wanted: Vec<&(K, ChainName)> = entries.iter().collect();
    wanted.sort_unstable_by_key(|(k, _)| *k);
    let mut wanted = wanted.into_iter().peekable();
    let mut removed = Vec::new();
    let mut added = Vec::new();
    for (key, target) in before.iter() {
        while let Some((k, t)) = wanted.next_if(|(k, _)| k < key) {
            added.push((*k, t));
        }
        match wanted.next_if(|(k, _)| k == key) {
            Some((_, t)) if target.name == *t && target.shard == element_shard(shards, t) => {}
            Some((k, t)) => {
                removed.push(*key);
                added.push((*k, t));
            }
            None => removed.push(*key),
        }
    }
    added.extend(wanted.map(|(k, t)| (*k, t)));
    for key in removed {
        if let Some(old) = before.remove(&key) {
            deletes.push(Command::DeleteElement(element(key, old)));
        }
    }
    for (key, target) in added {
        let chain = element_chain(shards, target);
        adds.push(Command::AddElement(element(key, chain.clone())));
        before.insert(key, chain);
    }
}

/// Element-level changes from the set `before` to `wanted` (any order, duplicates allowed),
/// made to `before` in place: deletions, then additions, each in address order. A merge of the
/// two sorted sequences, as [`diff_entries`].
fn diff_set(
    before: &mut BTreeSet<IpAddr>,
    wanted: &[IpAddr],
    element: impl Fn(IpAddr) -> Element,
    deletes: &mut Vec<Command>,
    adds: &mut Vec<Command>,
) {
    let mut wanted: Vec<IpAddr> = wanted.to_vec();
    wanted.sort_unstable();
    wanted.dedup();
    let mut wanted = wanted.into_iter().peekable();
    let mut removed = Vec::new();
    let mut added = Vec::new();
    for ip in before.iter() {
        added.extend(std::iter::from_fn(|| wanted.next_if(|w| w < ip)));
        if wanted.next_if(|w| w == ip).is_none() {
            removed.push(*ip);
        }
    }
    added.extend(wanted);
    for ip in removed {
        before.remove(&ip);
        deletes.push(Command::DeleteElement(element(ip)));
    }
    for ip in added {
        before.insert(ip);
        adds.push(Command::AddElement(element(ip)));
    }
}

/// `rules`, entries of the dispatch chain `chain`, converted as that chain converts them, when
/// they all become map or set elements and the chain is one the last sync left as a map or set
/// lookup with no folded endpoint.
fn map_only(
    rs: &Ruleset,
    next: &Applied,
    chain: &ChainKey,
    rules: &[Rule],
) -> Option<ConvertedChain> {
    let is_map = next.chains.contains_key(chain)
        && !next.endpoint_users.contains(chain)
        && rs.chain(chain.0, &chain.1).is_some();
    let converted = convert_chain(rs, chain.0, &chain.1, rules);
    let only_elements = converted.rules.len() == 1
        && matches!(
            converted.rules.first(),
            Some(NftRule::ServiceMap | NftRule::NodePortMap | NftRule::ClusterIpSet)
        )
        && converted.endpoints.is_empty()
        && converted.hairpin.is_empty();
    (is_map && only_elements).then_some(converted)
}

/// The entries of `map` in `range`, taken out of it.
fn take_range<K: Ord + Copy, V>(
    map: &mut BTreeMap<K, V>,
    range: std::ops::RangeInclusive<K>,
) -> BTreeMap<K, V> {
    let keys: Vec<K> = map.range(range).map(|(key, _)| *key).collect();
    keys.into_iter()
        .filter_map(|key| map.remove(&key).map(|value| (key, value)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-place merge makes the changes and leaves the map a rebuild and a naive diff
    /// would: every mix of kept, removed, added and retargeted keys, sharded or not.
    #[test]
    fn map_entries_are_diffed_in_place_as_a_rebuild_would() {
        let svc = |n: u16| {
            ChainName::new(format!(
                "BERTH-SVC-{}",
                ["AAAA", "BBBB", "CCCC"][n as usize % 3]
            ))
        };
        for shards in [Shards::default(), Shards::new(4).unwrap()] {
            for before_mask in 0u32..64 {
                for after_mask in [0u32, 5, 18, 63, 40, 7] {
                    let before: BTreeMap<u16, NftChain> = (0..6)
                        .filter(|i| before_mask & (1 << i) != 0)
                        .map(|i| (i, element_chain(shards, &svc(i))))
                        .collect();
                    // Entries in reverse order, some retargeted.
                    let entries: Vec<(u16, ChainName)> = (0..6)
                        .rev()
                        .filter(|i| after_mask & (1 << i) != 0)
                        .map(|i| (i, svc(i + u16::from(i % 2 == 0 && before_mask % 3 == 0))))
                        .collect();
                    let element =
                        |k: u16, t: NftChain| Element::NodePort((berth_core::Protocol::Tcp, k), t);
                    let after: BTreeMap<u16, NftChain> = entries
                        .iter()
                        .map(|(k, t)| (*k, element_chain(shards, t)))
                        .collect();
                    let (mut want_deletes, mut want_adds) = (Vec::new(), Vec::new());
                    for (k, t) in &before {
                        if after.get(k) != Some(t) {
                            want_deletes.push(Command::DeleteElement(element(*k, t.clone())));
                        }
                    }
                    for (k, t) in &after {
                        if before.get(k) != Some(t) {
                            want_adds.push(Command::AddElement(element(*k, t.clone())));
                        }
                    }
                    let mut map = before.clone();
                    let (mut deletes, mut adds) = (Vec::new(), Vec::new());
                    diff_entries(shards, &mut map, &entries, element, &mut deletes, &mut adds);
                    assert_eq!(map, after, "{before_mask} {after_mask}");
                    assert_eq!((deletes, adds), (want_deletes, want_adds));
                }
            }
        }
    }
}

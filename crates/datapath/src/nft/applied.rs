//! The applied state: what the last successful sync left in the kernel, as the partial diff
//! needs it (each chain's rule hash and table, the dispatch maps' elements, the affinity sets,
//! which chains fold or jump to which endpoint chains, the hairpin endpoints). Kept apart from
//! the Syncer because a full sync, a staged cold load and the partial diff all build or update it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::error::Error;
use crate::nft::render::{
    affinity_refs, check_expressible, NftChain, NftRule, NftRuleset, NodePortKey, ServiceKey,
};
use crate::nft::shard::Shard;
use crate::plan::model::{ChainName, Table};

pub(super) type ChainKey = (Table, ChainName);
/// An affinity set: its table and name.
pub(super) type SetKey = (Shard, ChainName);

/// What the last successful sync left in the kernel, as far as diffs need it.
#[derive(Debug, Clone, Default)]
pub(super) struct Applied {
    /// Hash of each chain's converted rules, how many rules its copies hold, its table.
    pub(super) chains: BTreeMap<ChainKey, (u64, usize, Shard)>,
    pub(super) services: BTreeMap<ServiceKey, NftChain>,
    pub(super) node_ports: BTreeMap<NodePortKey, NftChain>,
    pub(super) cluster_ips: BTreeSet<IpAddr>,
    pub(super) affinity: BTreeMap<SetKey, u32>,
    /// The affinity sets each chain's rules name; a set no chain names any more is deleted.
    pub(super) chain_sets: BTreeMap<ChainKey, BTreeSet<SetKey>>,
    /// The endpoint chains each chain's rules fold or jump to, and the reverse: a changed
    /// endpoint chain rewrites the chains that use it (folded, or no longer foldable).
    pub(super) chain_endpoints: BTreeMap<ChainKey, BTreeSet<ChainName>>,
    /// (endpoint chain, chain using it): one flat set, not a set per endpoint.
    used_by: BTreeSet<(ChainName, ChainKey)>,
    /// The hairpin endpoints each chain's rules need, and how many chains need each.
    chain_hairpin: BTreeMap<ChainKey, BTreeSet<IpAddr>>,
    pub(super) hairpin: BTreeMap<IpAddr, usize>,
    pub(super) rules: usize,
}

/// `(endpoint chain, chain using it)` pairs as the two indexes of [`Applied`]: the flat set as
/// it is, and each using chain's endpoints.
type EndpointIndexes = (
    BTreeSet<(ChainName, ChainKey)>,
    BTreeMap<ChainKey, BTreeSet<ChainName>>,
);

fn endpoint_indexes(pairs: BTreeSet<(ChainName, NftChain)>) -> EndpointIndexes {
    let mut by_chain: Vec<(ChainKey, ChainName)> = Vec::with_capacity(pairs.len());
    let used_by = pairs
        .into_iter()
        .map(|(endpoint, referrer)| {
            let key = (referrer.table, referrer.name);
            by_chain.push((key.clone(), endpoint.clone()));
            (endpoint, key)
        })
        .collect();
    by_chain.sort_unstable();
    let mut chain_endpoints = BTreeMap::new();
    let mut rest = by_chain.as_slice();
    while let Some((key, _)) = rest.first() {
        let len = rest.iter().take_while(|(k, _)| k == key).count();
        let (group, tail) = rest.split_at(len);
        chain_endpoints.insert(
            key.clone(),
            group.iter().map(|(_, endpoint)| endpoint.clone()).collect(),
        );
        rest = tail;
    }
    (used_by, chain_endpoints)
}

/// The state a full sync of `planned` leaves, as the diffs need it; every rule checked to be
/// expressible. Takes the planned endpoint pairs, which the indexes are built from.
pub(super) fn applied_state(planned: &mut NftRuleset) -> Result<Applied, Error> {
    // Consumed as the two indexes are built, both from sorted lists (full nodes): at 10,000
    // Services these are 100,000 entries each.
    let (used_by, chain_endpoints) = endpoint_indexes(std::mem::take(&mut planned.endpoints));
    let mut applied = Applied {
        services: planned.services.clone(),
        node_ports: planned.node_ports.clone(),
        cluster_ips: planned.cluster_ips.clone(),
        affinity: planned.affinity.clone(),
        rules: planned.rule_count(),
        chain_endpoints,
        used_by,
        ..Applied::default()
    };
    for (chain, rules) in &planned.chains {
        for rule in rules {
            check_expressible(rule)?;
        }
        if planned.hooks.contains_key(chain) {
            continue;
        }
        let key = (chain.table, chain.name.clone());
        let sets = sets_named(chain.shard, rules);
        if !sets.is_empty() {
            applied.chain_sets.insert(key, sets);
        }
    }
    for (chain, hairpin) in &planned.hairpin {
        for ip in hairpin {
            *applied.hairpin.entry(*ip).or_default() += 1;
        }
        let key = (chain.table, chain.name.clone());
        applied.chain_hairpin.insert(key, hairpin.clone());
    }
    // Taken, not cloned: 10,000 chain names at 10,000 Services.
    applied.chains = std::mem::take(&mut planned.planned)
        .into_iter()
        .map(|(key, p)| (key, (p.hash, p.rules, p.home)))
        .collect();
    Ok(applied)
}

impl Applied {
    /// The state of a load made of `parts`, whose chains are disjoint: each map built once from
    /// all the parts' entries (sorted, so its nodes are full), the parts consumed.
    pub(super) fn merged(parts: Vec<Applied>) -> Applied {
        let mut all = Applied::default();
        // Each list sized for all the parts' entries at once: grown by doubling, the lists would
        // hold up to twice their entries at the load's peak (100,000 pairs in `used_by`).
        let room = |len: fn(&Applied) -> usize| parts.iter().map(len).sum::<usize>();
        let mut hairpin: Vec<(IpAddr, usize)> = Vec::with_capacity(room(|p| p.hairpin.len()));
        let mut chains = Vec::with_capacity(room(|p| p.chains.len()));
        let mut services = Vec::with_capacity(room(|p| p.services.len()));
        let mut node_ports = Vec::with_capacity(room(|p| p.node_ports.len()));
        let mut affinity = Vec::with_capacity(room(|p| p.affinity.len()));
        let mut chain_sets = Vec::with_capacity(room(|p| p.chain_sets.len()));
        let mut chain_endpoints = Vec::with_capacity(room(|p| p.chain_endpoints.len()));
        let mut used_by = Vec::with_capacity(room(|p| p.used_by.len()));
        let mut chain_hairpin = Vec::with_capacity(room(|p| p.chain_hairpin.len()));
        let mut cluster_ips = Vec::with_capacity(room(|p| p.cluster_ips.len()));
        for part in parts {
            let Applied {
                chains: c,
                services: s,
                node_ports: n,
                affinity: a,
                chain_sets: cs,
                chain_endpoints: ce,
                used_by: u,
                chain_hairpin: ch,
                hairpin: h,
                cluster_ips: ips,
                rules,
            } = part;
            chains.extend(c);
            services.extend(s);
            node_ports.extend(n);
            affinity.extend(a);
            chain_sets.extend(cs);
            chain_endpoints.extend(ce);
            used_by.extend(u);
            chain_hairpin.extend(ch);
            hairpin.extend(h);
            cluster_ips.extend(ips);
            all.rules += rules;
        }
        // Summed in one pass over the sorted pairs, then built at once.
        hairpin.sort_unstable_by_key(|(ip, _)| *ip);
        let mut summed: Vec<(IpAddr, usize)> = Vec::with_capacity(hairpin.len());
        for (ip, n) in hairpin {
            match summed.last_mut() {
                Some((last, count)) if *last == ip => *count += n,
                _ => summed.push((ip, n)),
            }
        }
        all.hairpin = summed.into_iter().collect();
        all.chains = chains.into_iter().collect();
        all.services = services.into_iter().collect();
        all.node_ports = node_ports.into_iter().collect();
        all.affinity = affinity.into_iter().collect();
        all.chain_sets = chain_sets.into_iter().collect();
        all.chain_endpoints = chain_endpoints.into_iter().collect();
        all.used_by = used_by.into_iter().collect();
        all.chain_hairpin = chain_hairpin.into_iter().collect();
        all.cluster_ips = cluster_ips.into_iter().collect();
        all
    }

    /// Records the sets `chain` names now; returns the sets no chain names any more.
    pub(super) fn set_chain_sets(
        &mut self,
        chain: &ChainKey,
        sets: BTreeSet<SetKey>,
    ) -> Vec<SetKey> {
        let before = if sets.is_empty() {
            self.chain_sets.remove(chain)
        } else {
            self.chain_sets.insert(chain.clone(), sets)
        };
        let mut orphaned = Vec::new();
        for set in before.into_iter().flatten() {
            let still_named = self.chain_sets.values().any(|sets| sets.contains(&set));
            if !still_named {
                orphaned.push(set);
            }
        }
        orphaned
    }

    /// Records the endpoint chains `chain` uses and the hairpin endpoints it needs; the
    /// endpoints whose need changed go into `touched`.
    pub(super) fn set_chain_folds(
        &mut self,
        chain: &ChainKey,
        endpoints: BTreeSet<ChainName>,
        hairpin: BTreeSet<IpAddr>,
        touched: &mut BTreeMap<IpAddr, bool>,
    ) {
        for endpoint in self.chain_endpoints.remove(chain).into_iter().flatten() {
            self.used_by.remove(&(endpoint, chain.clone()));
        }
        for endpoint in &endpoints {
            self.used_by.insert((endpoint.clone(), chain.clone()));
        }
        if !endpoints.is_empty() {
            self.chain_endpoints.insert(chain.clone(), endpoints);
        }
        for ip in self.chain_hairpin.remove(chain).into_iter().flatten() {
            touched.entry(ip).or_insert(true);
            if let Some(count) = self.hairpin.get_mut(&ip) {
                *count -= 1;
                if *count == 0 {
                    self.hairpin.remove(&ip);
                }
            }
        }
        for ip in &hairpin {
            let count = self.hairpin.entry(*ip).or_default();
            touched.entry(*ip).or_insert(*count > 0);
            *count += 1;
        }
        if !hairpin.is_empty() {
            self.chain_hairpin.insert(chain.clone(), hairpin);
        }
    }

    /// The chains whose rules fold or jump to the endpoint chain `name`.
    pub(super) fn users<'a>(
        &'a self,
        name: &'a ChainName,
    ) -> impl Iterator<Item = &'a ChainKey> + 'a {
        let first = (name.clone(), (Table::Filter, ChainName::new("")));
        self.used_by
            .range(first..)
            .take_while(move |(endpoint, _)| endpoint == name)
            .map(|(_, user)| user)
    }
}

pub(super) fn sets_named(shard: Shard, rules: &[NftRule]) -> BTreeSet<SetKey> {
    rules
        .iter()
        .flat_map(affinity_refs)
        .map(|(name, _)| (shard, name.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bulk-built indexes hold exactly what inserting pair by pair would.
    #[test]
    fn endpoint_indexes_match_pair_by_pair_insertion() {
        let chain = |table, name: &str| NftChain::new(table, &ChainName::new(name));
        let ep = ChainName::new;
        // (endpoint chain, chain using it): endpoints shared by chains, a name in two tables.
        let pairs: BTreeSet<(ChainName, NftChain)> = [
            (ep("BERTH-SEP-A"), chain(Table::Nat, "BERTH-SVC-1")),
            (ep("BERTH-SEP-B"), chain(Table::Nat, "BERTH-SVC-1")),
            (ep("BERTH-SEP-B"), chain(Table::Nat, "BERTH-SVL-1")),
            (ep("BERTH-SEP-C"), chain(Table::Nat, "BERTH-SVC-2")),
            (ep("BERTH-SEP-C"), chain(Table::Filter, "BERTH-SVC-2")),
        ]
        .into_iter()
        .collect();
        let mut want_used_by = BTreeSet::new();
        let mut want_by_chain: BTreeMap<ChainKey, BTreeSet<ChainName>> = BTreeMap::new();
        for (endpoint, referrer) in &pairs {
            let key = (referrer.table, referrer.name.clone());
            want_used_by.insert((endpoint.clone(), key.clone()));
            want_by_chain
                .entry(key)
                .or_default()
                .insert(endpoint.clone());
        }
        let (used_by, by_chain) = endpoint_indexes(pairs);
        assert_eq!(used_by, want_used_by);
        assert_eq!(by_chain, want_by_chain);
        assert_eq!(by_chain.len(), 4);
        assert_eq!(endpoint_indexes(BTreeSet::new()), Default::default());
    }
}

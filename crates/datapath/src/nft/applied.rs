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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Applied {
    /// Hash of each chain's converted rules, how many rules its copies hold, its table.
    pub(super) chains: BTreeMap<ChainKey, (u64, usize, Shard)>,
    pub(super) services: BTreeMap<ServiceKey, NftChain>,
    pub(super) node_ports: BTreeMap<NodePortKey, NftChain>,
    pub(super) cluster_ips: BTreeSet<IpAddr>,
    pub(super) affinity: BTreeMap<SetKey, u32>,
    /// The affinity sets each chain's rules name; a set no chain names any more is deleted.
    pub(super) chain_sets: BTreeMap<ChainKey, BTreeSet<SetKey>>,
    /// The chains whose rules fold or jump to endpoint chains: a map chain among them is
    /// rewritten whole. Which endpoint chains each uses is not kept, nor the reverse (100,000
    /// pairs at 10,000 Services, ~5 MB each way): a partial sync finds an endpoint chain's users
    /// among the chains that change with it (see `unnamed_users` in the Syncer).
    pub(super) endpoint_users: BTreeSet<ChainKey>,
    /// The hairpin endpoints each chain's rules need, and how many chains need each.
    chain_hairpin: BTreeMap<ChainKey, BTreeSet<IpAddr>>,
    pub(super) hairpin: BTreeMap<IpAddr, usize>,
    pub(super) rules: usize,
}

/// The state a full sync of `planned` leaves, as the diffs need it; every rule checked to be
/// expressible. Takes the planned chains' hashes and endpoint users.
pub(super) fn applied_state(planned: &mut NftRuleset) -> Result<Applied, Error> {
    let endpoint_users = std::mem::take(&mut planned.endpoint_users);
    let mut applied = Applied {
        services: planned.services.clone(),
        node_ports: planned.node_ports.clone(),
        cluster_ips: planned.cluster_ips.clone(),
        affinity: planned.affinity.clone(),
        rules: planned.rule_count(),
        endpoint_users,
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
    /// Joins `part`'s state, whose chains no earlier part held, to this one: each map merged
    /// in one pass that frees the two it reads as it builds the joint one (full nodes), so
    /// nothing is held twice. The pass costs both sizes: [`Parts`] joins parts of like size.
    fn absorb(&mut self, part: Applied) {
        let Applied {
            mut chains,
            mut services,
            mut node_ports,
            mut affinity,
            mut chain_sets,
            mut endpoint_users,
            mut chain_hairpin,
            hairpin,
            mut cluster_ips,
            rules,
        } = part;
        self.chains.append(&mut chains);
        self.services.append(&mut services);
        self.node_ports.append(&mut node_ports);
        self.affinity.append(&mut affinity);
        self.chain_sets.append(&mut chain_sets);
        self.endpoint_users.append(&mut endpoint_users);
        self.chain_hairpin.append(&mut chain_hairpin);
        self.cluster_ips.append(&mut cluster_ips);
        // An endpoint several chains need is counted once per chain, whichever part it is in.
        let mut fresh: BTreeMap<IpAddr, usize> = hairpin
            .into_iter()
            .filter_map(|(ip, n)| match self.hairpin.get_mut(&ip) {
                Some(count) => {
                    *count += n;
                    None
                }
                None => Some((ip, n)),
            })
            .collect();
        self.hairpin.append(&mut fresh);
        self.rules += rules;
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

    /// Records whether `chain` uses endpoint chains and the hairpin endpoints it needs; the
    /// endpoints whose need changed go into `touched`.
    pub(super) fn set_chain_folds(
        &mut self,
        chain: &ChainKey,
        uses_endpoints: bool,
        hairpin: BTreeSet<IpAddr>,
        touched: &mut BTreeMap<IpAddr, bool>,
    ) {
        if uses_endpoints {
            self.endpoint_users.insert(chain.clone());
        } else {
            self.endpoint_users.remove(chain);
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
}

/// The states of a load's parts (one per table, then the rest and the base chains), joined as
/// they come, like a binary counter: a part is joined with the last one held while that one
/// holds no more parts than it, so every entry is moved about log2(parts) times and at most
/// that many partial states are held. Joining each part into the whole state as it came moved
/// the whole state every time: at 10,000 Services 33 passes over the 100,000 endpoint pairs
/// the state then kept, a third of a cold load's own work, while the kernel waited for the
/// next table. Collecting every part and building each map once at the end was faster still
/// but held a second copy of the largest maps while building (11 MB more at the agent's
/// peak); inserting each part's entries into the whole left half-empty nodes (6 MB more).
#[derive(Debug, Default)]
pub(super) struct Parts(Vec<(Applied, usize)>);

impl Parts {
    pub(super) fn push(&mut self, part: Applied) {
        let mut part = (part, 1);
        while let Some(last) = self.0.pop_if(|last| last.1 <= part.1) {
            part = join(last, part);
        }
        self.0.push(part);
    }

    /// The state all parts leave together. No chain, Service key, node port or set is in two
    /// parts; an endpoint several chains need as a hairpin pair is counted once per chain,
    /// whichever part each is in.
    pub(super) fn merge(self) -> Applied {
        self.0
            .into_iter()
            .rev()
            .reduce(|later, earlier| join(earlier, later))
            .map(|(applied, _)| applied)
            .unwrap_or_default()
    }
}

/// Two joined parts, each with how many parts it holds.
fn join(
    (mut earlier, held): (Applied, usize),
    (later, more): (Applied, usize),
) -> (Applied, usize) {
    earlier.absorb(later);
    (earlier, held + more)
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

    /// One part's state: `chains` of its own, each needing the hairpin pairs of `hairpin` and
    /// using the endpoint chain of the same name with `-EP`.
    fn mk_part(shard: Shard, chains: &[&str], hairpin: &[[u8; 4]]) -> Applied {
        let mut part = Applied::default();
        for (i, name) in chains.iter().enumerate() {
            let key = (Table::Nat, ChainName::new(*name));
            let endpoint = ChainName::new(format!("{name}-EP"));
            part.chains.insert(key.clone(), (i as u64, 2, shard));
            let ip = IpAddr::from([10, 96, shard as u8, i as u8]);
            part.services.insert(
                (ip, berth_core::Protocol::Tcp, 80),
                NftChain::in_shard(Table::Nat, &key.1, shard),
            );
            part.cluster_ips.insert(ip);
            part.affinity.insert((shard, endpoint.clone()), 10);
            part.chain_sets
                .insert(key.clone(), [(shard, endpoint)].into());
            part.endpoint_users.insert(key.clone());
            let pairs: BTreeSet<IpAddr> = hairpin.iter().map(|ip| IpAddr::from(*ip)).collect();
            for ip in &pairs {
                *part.hairpin.entry(*ip).or_default() += 1;
            }
            part.chain_hairpin.insert(key, pairs);
            part.rules += 2;
        }
        part
    }

    /// Joined like a binary counter (five parts: held as one of four and one), the parts leave
    /// what joining them one by one leaves: every map the union, a hairpin pair counted once
    /// per chain that needs it, in whichever part.
    #[test]
    fn parts_joined_in_pairs_equal_parts_joined_one_by_one() {
        let parts = [
            mk_part(0, &["BERTH-SVC-B", "BERTH-SVC-D"], &[[10, 244, 1, 1]]),
            mk_part(1, &["BERTH-SVC-A"], &[[10, 244, 1, 1], [10, 244, 2, 2]]),
            mk_part(2, &[], &[]),
            mk_part(3, &["BERTH-SVC-C", "BERTH-SVC-E"], &[[10, 244, 2, 2]]),
            mk_part(4, &["BERTH-SVC-F"], &[[10, 244, 1, 1]]),
        ];
        let mut want = Applied::default();
        for part in parts.clone() {
            want.chains.extend(part.chains);
            want.services.extend(part.services);
            want.node_ports.extend(part.node_ports);
            want.cluster_ips.extend(part.cluster_ips);
            want.affinity.extend(part.affinity);
            want.chain_sets.extend(part.chain_sets);
            want.endpoint_users.extend(part.endpoint_users);
            want.chain_hairpin.extend(part.chain_hairpin);
            for (ip, n) in part.hairpin {
                *want.hairpin.entry(ip).or_default() += n;
            }
            want.rules += part.rules;
        }
        let mut merged = Parts::default();
        for part in parts {
            merged.push(part);
        }
        let merged = merged.merge();
        assert_eq!(merged, want);
        assert_eq!(merged.chains.len(), 6);
        assert_eq!(merged.hairpin[&IpAddr::from([10, 244, 1, 1])], 4);
        assert_eq!(merged.hairpin[&IpAddr::from([10, 244, 2, 2])], 3);
        assert_eq!(merged.rules, 12);
        assert_eq!(Parts::default().merge(), Applied::default());
    }
}

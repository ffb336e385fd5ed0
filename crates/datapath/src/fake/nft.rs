//! An in-memory nftables for one family that applies transactions with the kernel's rules as far
//! as berth's transactions meet them: a transaction is committed whole or not at all; every
//! command but `add table` needs the table; a rule or map element may only jump to an existing
//! chain, a rule may only name an existing set; a chain or set still referenced cannot be
//! deleted; a map key cannot be added twice with another verdict, nor deleted when absent; a
//! hairpin pair or ClusterIP cannot be deleted when absent, and an address of the other family is
//! refused; the hairpin and `cluster-ips` sets live in the main table only.
//! [`MemoryNft::traceable`] turns what it holds back into a [`Ruleset`] for the packet tracer.

use std::collections::BTreeSet;

use crate::nft::shard::{Shard, MAIN};

use crate::error::Error;
use crate::nft::render::{
    affinity_refs, command_text, rule_jump, Command, Element, NftChain, NftRule, Transaction,
};
use crate::nft::sync::Nft;
pub use crate::nft::table::NftTable;
use crate::plan::model::Ruleset;
use berth_core::IpFamily;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryNft {
    pub family: IpFamily,
    /// `None`: none of berth's tables exists.
    pub table: Option<NftTable>,
    /// Makes the next transaction fail before changing anything, as a kernel error would.
    pub fail_next: bool,
    /// The text of every transaction applied or attempted, when `record` is set.
    pub transactions: Vec<String>,
    pub record: bool,
    /// How many transactions were applied successfully.
    pub applied: usize,
}

fn refused(family: IpFamily, command: &Command, reason: &str) -> Error {
    Error::Restore {
        reason: format!("{reason}: {}", command_text(family, command).trim_end()),
    }
}

impl MemoryNft {
    pub fn new(family: IpFamily) -> Self {
        MemoryNft {
            family,
            table: None,
            fail_next: false,
            transactions: Vec::new(),
            record: true,
            applied: 0,
        }
    }

    /// What someone's `nft flush ruleset` does to berth's table.
    pub fn flush_ruleset(&mut self) {
        self.table = None;
    }

    /// Chains or map elements that jump to `chain`.
    fn referenced(table: &NftTable, chain: &NftChain) -> bool {
        let by_rule = table.chains.iter().any(|(from, rules)| {
            rules.iter().filter_map(rule_jump).any(|target| {
                from.table == chain.table && from.shard == chain.shard && *target == chain.name
            })
        });
        by_rule
            || table.services.values().any(|t| t == chain)
            || table.node_ports.values().any(|t| t == chain)
    }

    fn apply_command(
        family: IpFamily,
        state: &mut Option<NftTable>,
        command: &Command,
    ) -> Result<(), Error> {
        let fail = |reason: &str| refused(family, command, reason);
        if let Command::AddTable(shard) = command {
            state
                .get_or_insert_with(NftTable::default)
                .tables
                .insert(*shard);
            return Ok(());
        }
        let Some(table) = state.as_mut() else {
            return Err(fail("No such file or directory (no table)"));
        };
        let shard = command.shard();
        if !table.tables.contains(&shard) {
            return Err(fail("No such file or directory (no table)"));
        }
        match command {
            Command::AddTable(_) => {}
            Command::DeleteTable(shard) => {
                Self::delete_table(table, *shard);
                if table.tables.is_empty() {
                    *state = None;
                }
            }
            Command::AddMaps(shard) => {
                table.maps.insert(*shard);
            }
            Command::AddChain(chain, hook) => {
                if let Some(existing) = table.hooks.get(chain) {
                    if Some(*existing) != *hook {
                        return Err(fail("chain exists with another hook"));
                    }
                }
                table.chains.entry(chain.clone()).or_default();
                if let Some(hook) = hook {
                    table.hooks.insert(chain.clone(), *hook);
                }
            }
            Command::FlushChain(chain) => table
                .chains
                .get_mut(chain)
                .ok_or_else(|| fail("No such file or directory (chain)"))?
                .clear(),
            Command::DeleteChain(chain) => {
                if !table.chains.contains_key(chain) {
                    return Err(fail("No such file or directory (chain)"));
                }
                if Self::referenced(table, chain) {
                    return Err(fail("Device or resource busy (chain is referenced)"));
                }
                table.chains.remove(chain);
                table.hooks.remove(chain);
            }
            Command::AddRule(chain, rule) => {
                if !table.chains.contains_key(chain) {
                    return Err(fail("No such file or directory (chain)"));
                }
                if let Some(target) = rule_jump(rule) {
                    if !table.chains.contains_key(&NftChain::in_shard(
                        chain.table,
                        target,
                        chain.shard,
                    )) {
                        return Err(fail("No such file or directory (jump target)"));
                    }
                }
                let needs_maps = matches!(
                    rule,
                    NftRule::ServiceMap
                        | NftRule::NodePortMap
                        | NftRule::Hairpin(_)
                        | NftRule::ClusterIpSet
                );
                let hairpin_elsewhere = matches!(rule, NftRule::Hairpin(_) | NftRule::ClusterIpSet)
                    && chain.shard != MAIN;
                if (needs_maps && !table.maps.contains(&chain.shard)) || hairpin_elsewhere {
                    return Err(fail("No such file or directory (map)"));
                }
                if affinity_refs(rule)
                    .any(|(name, _)| !table.affinity.contains_key(&(chain.shard, name.clone())))
                {
                    return Err(fail("No such file or directory (set)"));
                }
                if let Some(rules) = table.chains.get_mut(chain) {
                    rules.push(rule.clone());
                }
            }
            Command::AddAffinitySet(shard, name, seconds) => {
                table.affinity.insert((*shard, name.clone()), *seconds);
            }
            Command::DeleteAffinitySet(shard, name) => {
                let set = (*shard, name.clone());
                if !table.affinity.contains_key(&set) {
                    return Err(fail("No such file or directory (set)"));
                }
                let used = table
                    .chains
                    .iter()
                    .filter(|(chain, _)| chain.shard == *shard)
                    .flat_map(|(_, rules)| rules)
                    .any(|rule| affinity_refs(rule).any(|(n, _)| n == name));
                if used {
                    return Err(fail("Device or resource busy (set is referenced)"));
                }
                table.affinity.remove(&set);
            }
            Command::AddElement(element) => {
                if !table.maps.contains(&element.shard()) {
                    return Err(fail("No such file or directory (map)"));
                }
                let (previous, target) = match element {
                    Element::Service(key, target) => (table.services.get(key), target),
                    Element::NodePort(key, target) => (table.node_ports.get(key), target),
                    Element::Hairpin(ip) => {
                        if !family.contains(*ip) {
                            return Err(fail("Invalid argument (address of the other family)"));
                        }
                        // Adding a set element that exists is no error.
                        table.hairpin.insert(*ip);
                        return Ok(());
                    }
                    Element::ClusterIp(ip) => {
                        if !family.contains(*ip) {
                            return Err(fail("Invalid argument (address of the other family)"));
                        }
                        table.cluster_ips.insert(*ip);
                        return Ok(());
                    }
                };
                if !table.chains.contains_key(target) {
                    return Err(fail("No such file or directory (verdict chain)"));
                }
                // The maps of one table are the elements whose targets are in it: a key held
                // by another shard's map is another element (berth never plans two).
                if previous.is_some_and(|previous| previous != target) {
                    return Err(fail("File exists (element with another verdict)"));
                }
                match element {
                    Element::Service(key, target) => {
                        table.services.insert(*key, target.clone());
                    }
                    Element::NodePort(key, target) => {
                        table.node_ports.insert(*key, target.clone());
                    }
                    Element::Hairpin(_) | Element::ClusterIp(_) => {}
                }
            }
            Command::DeleteElement(element) => {
                let shard = element.shard();
                if !table.maps.contains(&shard) {
                    return Err(fail("No such file or directory (map)"));
                }
                let present = match element {
                    Element::Service(key, _) => {
                        let here = table.services.get(key).is_some_and(|t| t.shard == shard);
                        here && table.services.remove(key).is_some()
                    }
                    Element::NodePort(key, _) => {
                        let here = table.node_ports.get(key).is_some_and(|t| t.shard == shard);
                        here && table.node_ports.remove(key).is_some()
                    }
                    Element::Hairpin(ip) => table.hairpin.remove(ip),
                    Element::ClusterIp(ip) => table.cluster_ips.remove(ip),
                };
                if !present {
                    return Err(fail("No such file or directory (element)"));
                }
            }
        }
        Ok(())
    }

    /// Everything of the table `shard` goes with it.
    fn delete_table(table: &mut NftTable, shard: Shard) {
        table.tables.remove(&shard);
        table.maps.remove(&shard);
        table.chains.retain(|chain, _| chain.shard != shard);
        table.hooks.retain(|chain, _| chain.shard != shard);
        table.affinity.retain(|(s, _), _| *s != shard);
        table.services.retain(|_, target| target.shard != shard);
        table.node_ports.retain(|_, target| target.shard != shard);
        if shard == MAIN {
            table.hairpin.clear();
            table.cluster_ips.clear();
        }
    }

    /// berth's table as a ruleset the tracer follows ([`NftTable::traceable`]).
    pub fn traceable(&self) -> Ruleset {
        self.table
            .as_ref()
            .map(NftTable::traceable)
            .unwrap_or_default()
    }

    /// Names of the chains in berth's tables (a shard's as `berth-<n> <chain>`).
    pub fn chain_names(&self) -> BTreeSet<String> {
        self.table
            .iter()
            .flat_map(|table| table.chains.keys().map(NftTable::chain_label))
            .collect()
    }
}

impl Nft for MemoryNft {
    fn apply(&mut self, tx: &Transaction) -> Result<(), Error> {
        if self.record {
            self.transactions.push(tx.text());
        }
        if std::mem::take(&mut self.fail_next) {
            return Err(Error::Restore {
                reason: "injected failure".to_string(),
            });
        }
        let mut state = self.table.clone();
        for command in &tx.commands {
            Self::apply_command(self.family, &mut state, command)?;
        }
        self.table = state;
        self.applied += 1;
        Ok(())
    }

    fn tables(&mut self, _family: IpFamily) -> Result<Option<BTreeSet<Shard>>, Error> {
        Ok(Some(
            self.table
                .iter()
                .flat_map(|t| t.tables.iter().copied())
                .collect(),
        ))
    }
}

//! The Syncer: applies planned rulesets through the [`Iptables`] trait, partially when it can.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use crate::backend::{Payload, SyncKind, SyncReport, SyncRuleset};
use crate::error::Error;
use crate::iptables::render::{ChainSelection, Rendered};
use crate::iptables::streamed::Streamed;
use crate::plan::incremental::Changes;
use crate::plan::model::{ChainName, JumpRule, Rule, Ruleset, Table};
use crate::plan::names;
use crate::plan::{Planner, PortGroups};

/// The iptables operations berth needs, for one address family.
pub trait Iptables {
    /// One `iptables-restore --noflush` of a whole payload, rendered completely before the
    /// restore starts reading it.
    fn restore(&mut self, payload: &dyn Payload) -> Result<(), Error>;
    /// `iptables-save -t <table>`.
    fn save(&mut self, table: Table) -> Result<String, Error>;
    fn ensure_chain(&mut self, table: Table, chain: &ChainName) -> Result<(), Error>;
    fn chain_exists(&mut self, table: Table, chain: &ChainName) -> Result<bool, Error>;
    /// Inserts the jump at the top of its built-in chain unless an identical rule is there.
    fn ensure_jump(&mut self, jump: &JumpRule) -> Result<(), Error>;
    /// Whether a large restore should start each table with a chain-less listing
    /// ([`Rendered::listing_first`]): true for iptables-nft, whose restore is otherwise quadratic.
    fn restore_lists_first(&mut self) -> bool {
        false
    }
}

/// Tables whose canary is watched; berth programs nothing in mangle.
const CANARY_TABLES: [Table; 2] = [Table::Filter, Table::Nat];

/// A chain's rules as far as change detection needs them: their hash and how many there are.
type ChainState = (u64, usize);
type ChainHashes = BTreeMap<(Table, ChainName), ChainState>;

fn chain_hash(rules: &[Rule]) -> u64 {
    // Hashing the typed rules is equivalent to hashing their text (rendering is a pure function
    // of them) and several times cheaper.
    let mut hasher = DefaultHasher::new();
    rules.hash(&mut hasher);
    hasher.finish()
}

fn chain_hashes(rs: &Ruleset) -> ChainHashes {
    // Collected in key order (tables, then chains, both sorted), so the map is built with full
    // nodes; inserted one by one it kept them half empty: 8.7 MB instead of 4.8 at 10,000
    // Services.
    rs.tables
        .iter()
        .flat_map(|(table, rules)| {
            rules.chains.iter().map(move |(chain, chain_rules)| {
                (
                    (*table, chain.clone()),
                    (chain_hash(chain_rules), chain_rules.len()),
                )
            })
        })
        .collect()
}

/// Berth chains named in an `iptables-save` dump.
pub fn berth_chains_in_save(dump: &str) -> BTreeSet<ChainName> {
    dump.lines()
        .filter_map(|line| line.strip_prefix(':'))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(ChainName::new)
        .filter(|chain| chain.is_berth() && chain.as_str() != names::CANARY)
        .collect()
}

/// Plans nothing itself: give it each new ruleset, it works out the smallest safe payload.
pub struct Syncer<I> {
    iptables: I,
    /// What the last successful sync left in place; `None` forces a full sync.
    applied: Option<ChainHashes>,
    /// Chains every partial sync rewrites whether or not they changed.
    always_rewrite: BTreeSet<(Table, ChainName)>,
    /// Rules in the applied chains.
    applied_rules: usize,
}

impl<I: Iptables> Syncer<I> {
    pub fn new(iptables: I) -> Self {
        Syncer {
            iptables,
            applied: None,
            always_rewrite: BTreeSet::new(),
            applied_rules: 0,
        }
    }

    /// Makes every partial sync rewrite `chains` too (see [`crate::plan::full::rewritten_every_sync`]).
    pub fn rewriting_every_sync(
        mut self,
        chains: impl IntoIterator<Item = (Table, ChainName)>,
    ) -> Self {
        self.always_rewrite = chains.into_iter().collect();
        self
    }

    pub fn iptables(&self) -> &I {
        &self.iptables
    }

    pub fn iptables_mut(&mut self) -> &mut I {
        &mut self.iptables
    }

    pub fn force_full_sync(&mut self) {
        self.applied = None;
    }

    /// The chain selection a sync of `rs` would use, and whether it is full, without applying it.
    fn canary_ok(&mut self) -> Result<bool, Error> {
        let canary = names::fixed(names::CANARY);
        let mut canary_ok = true;
        for table in CANARY_TABLES {
            canary_ok &= self.iptables.chain_exists(table, &canary)?;
        }
        Ok(canary_ok)
    }

    /// Applies `rs` when only the chains in `changes` can differ from the ruleset of the last
    /// successful sync (as a [`crate::plan::Planner`] reports them): only those are hashed and
    /// rendered. Falls back to [`Syncer::sync`] when a full sync is due.
    pub fn sync_changes(&mut self, rs: &Ruleset, changes: &Changes) -> Result<SyncReport, Error> {
        let result = self.try_sync_changes(rs, changes);
        self.forget_on_failure(result)
    }

    fn try_sync_changes(&mut self, rs: &Ruleset, changes: &Changes) -> Result<SyncReport, Error> {
        match self.try_sync_partial(rs, changes)? {
            Some(report) => Ok(report),
            None => self.try_sync(rs),
        }
    }

    /// [`Syncer::sync_changes`] when it can be partial; `None`, having changed nothing, when a
    /// full sync is due (no state, a change of everything, or the canary gone).
    pub fn sync_partial(
        &mut self,
        rs: &Ruleset,
        changes: &Changes,
    ) -> Result<Option<SyncReport>, Error> {
        let result = self.try_sync_partial(rs, changes);
        self.forget_on_failure(result)
    }

    fn try_sync_partial(
        &mut self,
        rs: &Ruleset,
        changes: &Changes,
    ) -> Result<Option<SyncReport>, Error> {
        // The dispatch entries, when told, are in the chains too: iptables rewrites chains.
        let Some(chains) = changes.chains() else {
            return Ok(None);
        };
        if self.applied.is_none() || !self.canary_ok()? {
            return Ok(None);
        }
        let Some(applied) = &self.applied else {
            return Ok(None);
        };
        let mut updates: Vec<((Table, ChainName), Option<ChainState>)> = Vec::new();
        let mut selection = ChainSelection {
            rewrite: Some(self.always_rewrite.clone()),
            delete: BTreeSet::new(),
        };
        for key in chains {
            match rs.chain(key.0, &key.1) {
                Some(rules) => {
                    let hash = (chain_hash(rules), rules.len());
                    if applied.get(key) != Some(&hash) {
                        selection
                            .rewrite
                            .get_or_insert_default()
                            .insert(key.clone());
                        updates.push((key.clone(), Some(hash)));
                    }
                }
                None if applied.contains_key(key) => {
                    selection.delete.insert(key.clone());
                    updates.push((key.clone(), None));
                }
                None => {}
            }
        }
        let payload = Rendered::new(rs, &selection);
        if !payload.is_empty() {
            self.iptables.restore(&payload)?;
        }
        let payload_bytes = payload.written();
        drop(payload);
        if let Some(applied) = &mut self.applied {
            for (key, hash) in updates {
                let before = match hash {
                    Some(hash) => applied.insert(key, hash),
                    None => applied.remove(&key),
                };
                // A running count: walking every chain of `rs` is what this sync avoids.
                self.applied_rules = self
                    .applied_rules
                    .saturating_sub(before.map_or(0, |(_, rules)| rules))
                    + hash.map_or(0, |(_, rules)| rules);
            }
        }
        Ok(Some(SyncReport {
            kind: SyncKind::Partial,
            rewritten_chains: selection.rewrite.as_ref().map_or(0, BTreeSet::len),
            deleted_chains: selection.delete.len(),
            payload_bytes,
            rule_count: self.applied_rules,
        }))
    }

    fn select(
        &mut self,
        rs: &Ruleset,
        hashes: &ChainHashes,
    ) -> Result<(SyncKind, ChainSelection), Error> {
        let canary_ok = self.canary_ok()?;
        match (&self.applied, canary_ok) {
            (Some(applied), true) => {
                let mut rewrite: BTreeSet<_> = hashes
                    .iter()
                    .filter(|(key, hash)| applied.get(*key) != Some(*hash))
                    .map(|(key, _)| key.clone())
                    .collect();
                rewrite.extend(self.always_rewrite.iter().cloned());
                let delete = applied
                    .keys()
                    .filter(|key| !hashes.contains_key(*key))
                    .cloned()
                    .collect();
                Ok((
                    SyncKind::Partial,
                    ChainSelection {
                        rewrite: Some(rewrite),
                        delete,
                    },
                ))
            }
            _ => {
                let mut delete = BTreeSet::new();
                for table in Table::ALL {
                    let dump = self.iptables.save(table)?;
                    for chain in berth_chains_in_save(&dump) {
                        if rs.chain(table, &chain).is_none() {
                            delete.insert((table, chain));
                        }
                    }
                }
                Ok((
                    SyncKind::Full,
                    ChainSelection {
                        rewrite: None,
                        delete,
                    },
                ))
            }
        }
    }

    /// Applies `rs`. Any failure makes the next sync full, whatever state the kernel was left in.
    pub fn sync(&mut self, rs: &Ruleset) -> Result<SyncReport, Error> {
        let result = self.try_sync(rs);
        self.forget_on_failure(result)
    }

    /// A full sync of a lean planner's ruleset, its Service ports' own chains planned a group
    /// of `ports` at a time as the payload is written (see `iptables/streamed.rs`):
    /// the whole plan is never held, typed or as text.
    pub fn sync_streamed(
        &mut self,
        planner: &Planner,
        ports: &mut PortGroups,
    ) -> Result<SyncReport, Error> {
        let result = self.try_sync_streamed(planner, ports);
        self.forget_on_failure(result)
    }

    fn try_sync_streamed(
        &mut self,
        planner: &Planner,
        ports: &mut PortGroups,
    ) -> Result<SyncReport, Error> {
        let rs = planner.ruleset();
        self.ensure_jumps(rs)?;
        let mut saved = Vec::new();
        for table in Table::ALL {
            let dump = self.iptables.save(table)?;
            saved.push((table, berth_chains_in_save(&dump).into_iter().collect()));
        }
        let list_first = self.iptables.restore_lists_first();
        let payload = Streamed::new(planner, ports, saved, list_first, chain_hash);
        self.iptables.restore(&payload)?;
        let payload_bytes = payload.written();
        let mut hashed = payload.take_hashed();
        drop(payload);
        self.ensure_canaries()?;
        hashed.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let hashes: ChainHashes = hashed.into_iter().collect();
        self.applied_rules = hashes.values().map(|(_, rules)| rules).sum();
        let rewritten_chains = hashes.len();
        let deleted_chains = self.applied.as_ref().map_or(0, |before| {
            before.keys().filter(|k| !hashes.contains_key(*k)).count()
        });
        self.applied = Some(hashes);
        Ok(SyncReport {
            kind: SyncKind::Full,
            rewritten_chains,
            deleted_chains,
            payload_bytes,
            rule_count: self.applied_rules,
        })
    }

    /// `result`, the applied state forgotten when it failed: whatever the kernel was left
    /// with, the next sync is full.
    fn forget_on_failure<T>(&mut self, result: Result<T, Error>) -> Result<T, Error> {
        if result.is_err() {
            self.applied = None;
        }
        result
    }

    /// Jumps need their target to exist before the first restore creates the rest.
    fn ensure_jumps(&mut self, rs: &Ruleset) -> Result<(), Error> {
        for jump in rs.jumps.iter().rev() {
            if let Some(target) = jump.rule.jump_target() {
                self.iptables.ensure_chain(jump.table, target)?;
            }
            self.iptables.ensure_jump(jump)?;
        }
        Ok(())
    }

    /// Created last, so a sync that failed half-way is never mistaken for a complete one.
    fn ensure_canaries(&mut self) -> Result<(), Error> {
        for table in CANARY_TABLES {
            self.iptables
                .ensure_chain(table, &names::fixed(names::CANARY))?;
        }
        Ok(())
    }

    fn try_sync(&mut self, rs: &Ruleset) -> Result<SyncReport, Error> {
        let hashes = chain_hashes(rs);
        let (kind, selection) = self.select(rs, &hashes)?;
        if kind == SyncKind::Full {
            self.ensure_jumps(rs)?;
        }
        let list_first = kind == SyncKind::Full && self.iptables.restore_lists_first();
        let payload = Rendered::new(rs, &selection).listing_first(list_first);
        let rewritten_chains = selection
            .rewrite
            .as_ref()
            .map_or(hashes.len(), BTreeSet::len);
        if !payload.is_empty() {
            self.iptables.restore(&payload)?;
        }
        let payload_bytes = payload.written();
        drop(payload);
        if kind == SyncKind::Full {
            self.ensure_canaries()?;
        }
        self.applied_rules = rs.rule_count();
        self.applied = Some(hashes);
        Ok(SyncReport {
            kind,
            rewritten_chains,
            deleted_chains: selection.delete.len(),
            payload_bytes,
            rule_count: self.applied_rules,
        })
    }
}

/// The restore payload that removes berth from one table of an `iptables-save` dump: the jumps to
/// berth chains from other chains, then every berth chain (the canary too). Empty when berth has
/// nothing there. What switching to the nftables backend does to iptables.
pub fn removal_payload(table: Table, dump: &str) -> String {
    let mut chains = Vec::new();
    let mut jumps = Vec::new();
    for line in dump.lines() {
        if let Some(decl) = line.strip_prefix(':') {
            if let Some(chain) = decl.split_whitespace().next() {
                if chain.starts_with(crate::plan::model::CHAIN_PREFIX) {
                    chains.push(chain.to_string());
                }
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let from = rule.split_whitespace().next().unwrap_or_default();
            let jumps_to_berth =
                rule.contains(&format!(" -j {}", crate::plan::model::CHAIN_PREFIX));
            if !from.starts_with(crate::plan::model::CHAIN_PREFIX) && jumps_to_berth {
                jumps.push(format!("-D {rule}\n"));
            }
        }
    }
    if chains.is_empty() && jumps.is_empty() {
        return String::new();
    }
    let mut out = format!("*{table}\n");
    // Declaring a chain in a restore flushes it, so no berth chain still jumps anywhere.
    for chain in &chains {
        out.push_str(&format!(":{chain} - [0:0]\n"));
    }
    jumps.iter().for_each(|line| out.push_str(line));
    for chain in &chains {
        out.push_str(&format!("-X {chain}\n"));
    }
    out.push_str("COMMIT\n");
    out
}

/// Removes every berth chain and jump from iptables, in every table; returns the tables changed.
pub fn remove_berth_rules(iptables: &mut dyn Iptables) -> Result<usize, Error> {
    let mut changed = 0;
    for table in Table::ALL {
        let payload = removal_payload(table, &iptables.save(table)?);
        if !payload.is_empty() {
            iptables.restore(&payload)?;
            changed += 1;
        }
    }
    Ok(changed)
}

impl<I: Iptables> SyncRuleset for Syncer<I> {
    fn sync_changes(&mut self, rs: &Ruleset, changes: &Changes) -> Result<SyncReport, Error> {
        Syncer::sync_changes(self, rs, changes)
    }

    fn sync_partial(
        &mut self,
        rs: &Ruleset,
        changes: &Changes,
    ) -> Result<Option<SyncReport>, Error> {
        Syncer::sync_partial(self, rs, changes)
    }

    fn sync_streamed(
        &mut self,
        planner: &Planner,
        ports: &mut PortGroups,
    ) -> Result<Option<SyncReport>, Error> {
        Syncer::sync_streamed(self, planner, ports).map(Some)
    }

    fn force_full_sync(&mut self) {
        Syncer::force_full_sync(self);
    }

    fn full_sync_due(&self) -> bool {
        self.applied.is_none()
    }
}

//! The nftables Syncer: applies planned rulesets to berth's own table through the [`Nft`] trait,
//! one atomic transaction per sync, partially when it can.
//!
//! - A full sync adopts when the writer can read the kernel ([`Nft::read`], the netlink writer):
//!   berth's table is read back, compared with the plan and only the difference written
//!   ([`crate::nft::adopt::plan_repair`]), so a matching table keeps its rules and its affinity
//!   entries. The agent's full syncs are streamed ([`NftSyncer::sync_streamed`]): the tables
//!   are read and compared one at a time as each shard's chains are planned
//!   (`nft/repair.rs`), so neither the whole plan nor the whole dump is ever held.
//!   Otherwise (no table, one it cannot repair, a writer that cannot read) it deletes
//!   and recreates the table in one transaction (`add table`, `delete table`, `add table`, then
//!   everything): no packet ever sees a half-built table, stale chains cannot survive, and other
//!   programs' tables are never named. Connections already established keep their translation
//!   (conntrack holds it); affinity entries start over.
//! - A partial sync sends only what changed since the last successful sync, as the iptables
//!   [`crate::iptables::sync::Syncer`] does: chains whose rules changed are flushed and refilled, new ones
//!   added, stale ones deleted, and the dispatch maps and the `cluster-ips` set get element-level
//!   deletes and adds (from the planner's changed dispatch entries when it reports them, without
//!   the dispatch chains).
//!   Desired state is diffed in memory; a partial sync reads nothing back from the kernel.
//! - Every command of a partial transaction names berth's table, so when someone deleted it
//!   (`nft flush ruleset`, say) the transaction fails as a whole, and any failure makes the next
//!   sync full. (The iptables backend needs a canary chain for this; a table needs none.) A
//!   `flush table` that empties berth's chains but keeps them is repaired by the next full sync,
//!   which the agent runs once an hour (kube-proxy's `FullSyncPeriod`) or after any failure.

use std::collections::BTreeSet;

use crate::backend::{SyncKind, SyncReport, SyncRuleset};
use crate::error::Error;
use crate::nft::adopt::{plan_repair, Observed, ObservedTables};
use crate::nft::applied::{applied_state, Applied, ChainKey};
use crate::nft::inline::is_endpoint_chain;
use crate::nft::partial::PartialDiff;
use crate::nft::render::{Command, Element, NftChain, NftRuleset, Transaction};
use crate::nft::repair::StreamedRepair;
use crate::nft::shard::{Placement, Shard, Shards, MAIN, MAX_SHARDS};
use crate::nft::stage::TablePieces;
use crate::nft::staged::StagedLoad;
use crate::plan::incremental::{Changes, DispatchChanges};
use crate::plan::model::{ChainName, Rule, Ruleset, Table};
use crate::plan::names;
use crate::plan::{Planner, PortGroups};
use berth_core::IpFamily;

/// The nftables operations berth needs, for one address family.
pub trait Nft {
    /// Applies one transaction atomically: all of it, or nothing and an error.
    fn apply(&mut self, tx: &Transaction) -> Result<(), Error>;

    /// Whether [`Nft::read`] reads the kernel; a writer that cannot replaces the table on
    /// every full sync instead of adopting it.
    fn can_read(&self) -> bool {
        false
    }

    /// berth's tables as the kernel holds them (`None`: there is no main table), for adoption.
    fn read(&mut self, _family: IpFamily) -> Result<Option<ObservedTables>, Error> {
        Ok(None)
    }

    /// [`Nft::read`] one table at a time, in shard order (the main one first), each handed to
    /// `each` and let go before the next is read; `false`, having read nothing, when there is
    /// no main table.
    fn read_each(
        &mut self,
        family: IpFamily,
        each: &mut dyn FnMut(Shard, Observed) -> Result<(), Error>,
    ) -> Result<bool, Error> {
        let Some(tables) = self.read(family)? else {
            return Ok(false);
        };
        for (shard, observed) in tables {
            each(shard, observed)?;
        }
        Ok(true)
    }

    /// The tables of berth's that exist, the main one ([`MAIN`]) included (`None`: unknown, so
    /// a full sync removes every shard table it does not fill, and never loads in stages).
    fn tables(&mut self, _family: IpFamily) -> Result<Option<BTreeSet<Shard>>, Error> {
        Ok(None)
    }

    /// Applies `stages` in order, each one transaction (all of it, or nothing and an error; the
    /// stages before a failed one stay applied); the bytes written in all. A writer may build
    /// the next stage while the kernel takes one.
    fn apply_staged(
        &mut self,
        stages: &mut dyn Iterator<Item = Transaction>,
    ) -> Result<usize, Error> {
        let mut written = 0;
        for tx in stages {
            self.apply(&tx)?;
            written += tx.written();
        }
        Ok(written)
    }
}

impl<N: Nft + ?Sized> Nft for Box<N> {
    fn apply(&mut self, tx: &Transaction) -> Result<(), Error> {
        (**self).apply(tx)
    }

    fn can_read(&self) -> bool {
        (**self).can_read()
    }

    fn read(&mut self, family: IpFamily) -> Result<Option<ObservedTables>, Error> {
        (**self).read(family)
    }

    fn read_each(
        &mut self,
        family: IpFamily,
        each: &mut dyn FnMut(Shard, Observed) -> Result<(), Error>,
    ) -> Result<bool, Error> {
        (**self).read_each(family, each)
    }

    fn tables(&mut self, family: IpFamily) -> Result<Option<BTreeSet<Shard>>, Error> {
        (**self).tables(family)
    }

    fn apply_staged(
        &mut self,
        stages: &mut dyn Iterator<Item = Transaction>,
    ) -> Result<usize, Error> {
        (**self).apply_staged(stages)
    }
}

/// A berth chain of the plan that the nft table holds (the iptables canary has no place there).
fn programmed(chain: &ChainName) -> bool {
    chain.is_berth() && chain.as_str() != names::CANARY
}

/// The chains that fold or jump to a changed endpoint chain of `work` and are not in it: a
/// changed endpoint chain changes them too (folded, or no longer foldable). None from a
/// [`crate::plan::Planner`]: an endpoint chain's rules follow from its name and its port's
/// affinity, which its users' rules name too, so its users change with it (the property tests
/// hold the planner to it). For a caller that names none of them, they are looked for among the
/// chains that used endpoint chains, in `rs`, which holds them (a lean planner holds every chain
/// of a port it planned). An endpoint chain no longer planned needs none: a user still jumping
/// to it would jump to nothing.
fn unnamed_users(rs: &Ruleset, applied: &Applied, work: &BTreeSet<ChainKey>) -> Vec<ChainKey> {
    let mut unnamed: BTreeSet<(Table, &ChainName)> = work
        .iter()
        .filter(|(table, chain)| is_endpoint_chain(chain) && rs.chain(*table, chain).is_some())
        .map(|(table, chain)| (*table, chain))
        .collect();
    // Users are small chains, looked at first; a dispatch chain of 10,000 entries, when it is
    // in the work, is read only if an endpoint chain is still unnamed by then.
    let mut others: Vec<(Table, &[Rule])> = work
        .iter()
        .filter(|(_, chain)| !is_endpoint_chain(chain))
        .filter_map(|(table, chain)| Some((*table, rs.chain(*table, chain)?.as_slice())))
        .collect();
    others.sort_by_key(|(_, rules)| rules.len());
    for (table, rules) in others {
        if unnamed.is_empty() {
            return Vec::new();
        }
        for target in rules.iter().filter_map(Rule::jump_target) {
            unnamed.remove(&(table, target));
        }
    }
    if unnamed.is_empty() {
        return Vec::new();
    }
    applied
        .endpoint_users
        .iter()
        .filter(|key| !work.contains(*key))
        .filter(|(table, user)| {
            let rules = rs.chain(*table, user).map_or(&[][..], Vec::as_slice);
            rules
                .iter()
                .filter_map(Rule::jump_target)
                .any(|target| unnamed.contains(&(*table, target)))
        })
        .cloned()
        .collect()
}

/// Plans nothing itself: give it each new ruleset (best planned with linear dispatch, which
/// becomes the verdict maps), it works out the smallest transaction.
pub struct NftSyncer<N> {
    nft: N,
    family: IpFamily,
    shards: Shards,
    /// Whether a cold load goes in stages ([`NftSyncer::with_staged_cold_load`]).
    staged: bool,
    /// Boxed: the Syncer stays small beside the iptables one.
    applied: Option<Box<Applied>>,
}

impl<N: Nft> NftSyncer<N> {
    /// A syncer of one table (no nat shards).
    pub fn new(nft: N, family: IpFamily) -> Self {
        NftSyncer {
            nft,
            family,
            shards: Shards::default(),
            staged: false,
            applied: None,
        }
    }

    /// The same syncer loading berth's tables in stages when the kernel holds none of them:
    /// one transaction per table without its base chains (inert: no hook leads into a table
    /// without base chains), then one transaction adding every base chain at once, so packets
    /// meet either no berth table or all of them. What it buys: the kernel holds a CPU for one
    /// table's rules at a time instead of the whole load's (on a kernel without preemption a
    /// long transaction delays every thread waiting for that CPU, real-time ones included), a
    /// writer holds one table's batch instead of all of them, and the netlink writer builds the
    /// next batch while the kernel takes one. Every other full sync stays one transaction:
    /// whenever a berth table exists, something may depend on it.
    pub fn with_staged_cold_load(mut self, staged: bool) -> Self {
        self.staged = staged;
        self
    }

    /// The same syncer spreading Service chains over `shards` nat shards.
    pub fn with_shards(mut self, shards: Shards) -> Self {
        self.shards = shards;
        self.applied = None;
        self
    }

    pub fn shards(&self) -> Shards {
        self.shards
    }

    pub fn nft(&self) -> &N {
        &self.nft
    }

    pub fn nft_mut(&mut self) -> &mut N {
        &mut self.nft
    }

    pub fn force_full_sync(&mut self) {
        self.applied = None;
    }

    /// Applies `rs`, diffing every chain against the last successful sync (a full sync when
    /// one is due). Any failure makes the next sync full.
    pub fn sync(&mut self, rs: &Ruleset) -> Result<SyncReport, Error> {
        let Some(applied) = &self.applied else {
            return self.sync_changes(rs, &Changes::All);
        };
        let mut chains: BTreeSet<ChainKey> = applied.chains.keys().cloned().collect();
        for (table, rules) in &rs.tables {
            chains.extend(rules.chains.keys().map(|chain| (*table, chain.clone())));
        }
        self.sync_changes(rs, &Changes::Chains(chains))
    }

    /// [`NftSyncer::sync_changes`] when it can be partial; `None`, having changed nothing,
    /// when a full sync is due (no state, or a change of everything).
    pub fn sync_partial(
        &mut self,
        rs: &Ruleset,
        changes: &Changes,
    ) -> Result<Option<SyncReport>, Error> {
        match (changes.chains(), self.applied.is_some()) {
            (Some(chains), true) => {
                let result = self.partial(rs, chains, changes.dispatch());
                self.forget_on_failure(result).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// `result`, the applied state forgotten when it failed: the next sync is full.
    fn forget_on_failure<T>(&mut self, result: Result<T, Error>) -> Result<T, Error> {
        if result.is_err() {
            self.applied = None;
        }
        result
    }

    /// Applies `rs` when only the chains in `changes` can differ from the ruleset of the last
    /// successful sync (as a [`crate::plan::Planner`] reports them); a full sync when one is due.
    pub fn sync_changes(&mut self, rs: &Ruleset, changes: &Changes) -> Result<SyncReport, Error> {
        match self.sync_partial(rs, changes)? {
            Some(report) => Ok(report),
            None => {
                let result = self.full(rs);
                self.forget_on_failure(result)
            }
        }
    }

    /// The transaction that replaces berth's tables with `rs`, and the state it leaves. Shard
    /// tables of another count are removed: those `existing` names, or (not known) every one
    /// this count does not fill.
    fn full_transaction(
        &self,
        rs: &Ruleset,
        existing: Option<&BTreeSet<Shard>>,
    ) -> Result<(Transaction, Applied), Error> {
        let mut planned = NftRuleset::from_ruleset_in(rs, self.shards)?;
        let applied = applied_state(&mut planned)?;
        let tables: Vec<Shard> = std::iter::once(MAIN).chain(self.shards.shards()).collect();
        let stale: Vec<Shard> = match existing {
            Some(existing) => existing
                .iter()
                .copied()
                .filter(|s| *s != MAIN && !tables.contains(s))
                .collect(),
            None => (1..=MAX_SHARDS).filter(|s| !tables.contains(s)).collect(),
        };
        let mut tx = Transaction::new(self.family);
        // Sized exactly: grown by doubling, a cold load's 130,000 commands would hold room for
        // 262,144 (19 MB at 10,000 Services).
        tx.commands.reserve_exact(
            4 * tables.len()
                + 2 * stale.len()
                + planned.chains.len()
                + planned.affinity.len()
                + applied.rules
                + planned.services.len()
                + planned.node_ports.len()
                + planned.cluster_ips.len()
                + applied.hairpin.len(),
        );
        for shard in stale {
            tx.push(Command::AddTable(shard));
            tx.push(Command::DeleteTable(shard));
        }
        for shard in &tables {
            tx.push(Command::AddTable(*shard));
            tx.push(Command::DeleteTable(*shard));
            tx.push(Command::AddTable(*shard));
            tx.push(Command::AddMaps(*shard));
        }
        for chain in planned.chains.keys() {
            tx.push(Command::AddChain(
                chain.clone(),
                planned.hooks.get(chain).copied(),
            ));
        }
        for ((shard, name), seconds) in &planned.affinity {
            tx.push(Command::AddAffinitySet(*shard, name.clone(), *seconds));
        }
        for (chain, rules) in planned.chains {
            for rule in rules {
                tx.push(Command::AddRule(chain.clone(), rule));
            }
        }
        for (key, target) in planned.services {
            tx.push(Command::AddElement(Element::Service(key, target)));
        }
        for (key, target) in planned.node_ports {
            tx.push(Command::AddElement(Element::NodePort(key, target)));
        }
        for ip in applied.hairpin.keys() {
            tx.push(Command::AddElement(Element::Hairpin(*ip)));
        }
        for ip in planned.cluster_ips {
            tx.push(Command::AddElement(Element::ClusterIp(ip)));
        }
        Ok((tx, applied))
    }

    fn full(&mut self, rs: &Ruleset) -> Result<SyncReport, Error> {
        if self.nft.can_read() {
            if let Some(report) = self.adopt(rs)? {
                return Ok(report);
            }
        }
        let existing = self.nft.tables(self.family)?;
        if self.staged && existing.as_ref().is_some_and(BTreeSet::is_empty) {
            return self.staged_load(rs);
        }
        let (tx, applied) = self.full_transaction(rs, existing.as_ref())?;
        self.nft.apply(&tx)?;
        Ok(self.loaded(applied, tx.written()))
    }

    /// A full sync of `rs` without its Service ports' own chains, which `service_chains(shard)`
    /// plans as the sync reaches each shard (see [`SyncRuleset::sync_streamed`]): with no
    /// berth table in the kernel a cold load in stages, over berth's tables an adoption
    /// compared table by table (`nft/repair.rs`). `None`, having changed nothing, unless the
    /// syncer has shards and either loads in stages and finds no table, or reads the kernel
    /// and finds tables it can repair in place.
    pub fn sync_streamed(
        &mut self,
        rs: &Ruleset,
        service_chains: &mut dyn FnMut(Shard) -> Ruleset,
    ) -> Result<Option<SyncReport>, Error> {
        if !self.shards.is_sharded() {
            return Ok(None);
        }
        let result = self.try_sync_streamed(rs, service_chains);
        self.forget_on_failure(result)
    }

    fn try_sync_streamed(
        &mut self,
        rs: &Ruleset,
        service_chains: &mut dyn FnMut(Shard) -> Ruleset,
    ) -> Result<Option<SyncReport>, Error> {
        let Some(tables) = self.nft.tables(self.family)? else {
            return Ok(None);
        };
        if tables.is_empty() {
            if !self.staged {
                return Ok(None);
            }
            let pieces = TablePieces::streamed(rs, self.shards, service_chains)?;
            let mut load = StagedLoad::new(self.family, pieces);
            let written = self.nft.apply_staged(&mut load)?;
            let applied = load.finish()?;
            return Ok(Some(self.loaded(applied, written)));
        }
        if !self.nft.can_read() {
            return Ok(None);
        }
        let pieces = TablePieces::streamed(rs, self.shards, service_chains)?;
        let mut repair = StreamedRepair::new(self.family, pieces);
        let found = self.nft.read_each(self.family, &mut |shard, observed| {
            repair.table(shard, observed)
        })?;
        if !found {
            return Ok(None);
        }
        let Some((commands, applied)) = repair.finish()? else {
            return Ok(None);
        };
        Ok(Some(self.repaired(commands, applied)?))
    }

    /// A cold load in stages ([`NftSyncer::with_staged_cold_load`]).
    fn staged_load(&mut self, rs: &Ruleset) -> Result<SyncReport, Error> {
        let mut load = StagedLoad::new(self.family, TablePieces::new(rs, self.shards)?);
        // The kernel's refusal first; then a conversion that stopped the stages.
        let written = self.nft.apply_staged(&mut load)?;
        let applied = load.finish()?;
        Ok(self.loaded(applied, written))
    }

    /// Records the state a full load left and reports it.
    fn loaded(&mut self, applied: Applied, payload_bytes: usize) -> SyncReport {
        let deleted_chains = self.applied.as_ref().map_or(0, |before| {
            before
                .chains
                .keys()
                .filter(|key| !applied.chains.contains_key(*key))
                .count()
        });
        let report = SyncReport {
            kind: SyncKind::Full,
            rewritten_chains: applied.chains.len(),
            deleted_chains,
            payload_bytes,
            rule_count: applied.rules,
        };
        self.applied = Some(Box::new(applied));
        report
    }

    /// A full sync that reads the table first and writes only what differs from the plan:
    /// nothing at all when it matches, so the dynamic sets' affinity entries and every rule
    /// stay as they are. `None` when there is no table or it cannot be repaired in place.
    fn adopt(&mut self, rs: &Ruleset) -> Result<Option<SyncReport>, Error> {
        let Some(observed) = self.nft.read(self.family)? else {
            return Ok(None);
        };
        // The plan and the state it leaves, without the full transaction (a table that
        // matches needs none).
        let mut planned = NftRuleset::from_ruleset_in(rs, self.shards)?;
        let applied = applied_state(&mut planned)?;
        let Some(commands) = plan_repair(&observed, &planned, self.family, self.shards) else {
            return Ok(None);
        };
        drop(observed);
        drop(planned);
        self.repaired(commands, applied).map(Some)
    }

    /// Applies an adoption's repair (nothing when the tables match) and records the state.
    fn repaired(&mut self, commands: Vec<Command>, applied: Applied) -> Result<SyncReport, Error> {
        let deleted: BTreeSet<&NftChain> = commands
            .iter()
            .filter_map(|c| match c {
                Command::DeleteChain(chain) => Some(chain),
                _ => None,
            })
            .collect();
        let rewritten = commands
            .iter()
            .filter_map(|c| match c {
                Command::FlushChain(chain) | Command::AddChain(chain, _) => Some(chain),
                _ => None,
            })
            .filter(|chain| !deleted.contains(chain))
            .collect::<BTreeSet<_>>()
            .len();
        let deleted_chains = deleted.len();
        let mut tx = Transaction::new(self.family);
        tx.commands = commands;
        if !tx.is_empty() {
            self.nft.apply(&tx)?;
        }
        let report = SyncReport {
            kind: SyncKind::Full,
            rewritten_chains: rewritten,
            deleted_chains,
            payload_bytes: tx.written(),
            rule_count: applied.rules,
        };
        self.applied = Some(Box::new(applied));
        Ok(report)
    }

    fn partial(
        &mut self,
        rs: &Ruleset,
        chains: &BTreeSet<ChainKey>,
        dispatch: Option<&DispatchChanges>,
    ) -> Result<SyncReport, Error> {
        // Updated in place, not cloned (its size is the whole table's): a failure on the way
        // leaves it taken, and a sync without state is full.
        let Some(mut next) = self.applied.take() else {
            return self.full(rs);
        };
        let mut diff = PartialDiff::new(self.shards);
        let mut work: BTreeSet<ChainKey> = chains
            .iter()
            .filter(|(_, c)| programmed(c))
            .cloned()
            .collect();
        work.extend(unnamed_users(rs, &next, &work));
        // The dispatch chains' map elements straight from the changed entries, when the
        // planner told them: not a whole chain of 10,000 entries converted to find one.
        if let Some(dispatch) = dispatch {
            for chain in diff.dispatch_maps(&mut next, rs, dispatch) {
                work.remove(&chain);
            }
        }
        // Endpoint chains that stay chains live with their users: those first.
        let (endpoints, users): (Vec<&ChainKey>, Vec<&ChainKey>) = work
            .iter()
            .partition(|key| self.shards.place(key.0, &key.1) == Placement::WithUser);
        for key in users.into_iter().chain(endpoints) {
            diff.chain(&mut next, rs, key)?;
        }
        diff.settle(&mut next);
        let (rewritten, deleted_chains) = (diff.rewritten, diff.deleted.len());
        let mut tx = Transaction::new(self.family);
        if !diff.is_empty() {
            diff.into_commands(&mut tx.commands);
            self.nft.apply(&tx)?;
        }
        let report = SyncReport {
            kind: SyncKind::Partial,
            rewritten_chains: rewritten,
            deleted_chains,
            payload_bytes: tx.written(),
            rule_count: next.rules,
        };
        self.applied = Some(next);
        Ok(report)
    }
}

/// The transaction that removes berth's tables, the main one and every shard, whatever they
/// hold (nothing when they are absent): what switching to the iptables backend does.
pub fn remove_table(family: IpFamily) -> Transaction {
    let mut tx = Transaction::new(family);
    for shard in 0..=MAX_SHARDS {
        tx.push(Command::AddTable(shard));
        tx.push(Command::DeleteTable(shard));
    }
    tx
}

impl<N: Nft> SyncRuleset for NftSyncer<N> {
    fn sync_changes(&mut self, rs: &Ruleset, changes: &Changes) -> Result<SyncReport, Error> {
        NftSyncer::sync_changes(self, rs, changes)
    }

    fn sync_partial(
        &mut self,
        rs: &Ruleset,
        changes: &Changes,
    ) -> Result<Option<SyncReport>, Error> {
        NftSyncer::sync_partial(self, rs, changes)
    }

    fn sync_streamed(
        &mut self,
        planner: &Planner,
        ports: &mut PortGroups,
    ) -> Result<Option<SyncReport>, Error> {
        NftSyncer::sync_streamed(self, planner.ruleset(), &mut |shard| {
            ports.take_service_chains(planner, shard)
        })
    }

    fn force_full_sync(&mut self) {
        NftSyncer::force_full_sync(self);
    }

    fn full_sync_due(&self) -> bool {
        self.applied.is_none()
    }
}

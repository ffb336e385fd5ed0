//! The nftables Syncer: applies planned rulesets to berth's own table through the [`Nft`] trait,
//! one atomic transaction per sync, partially when it can.
//!
//! - A full sync adopts when the writer can read the kernel ([`Nft::read`], the netlink writer):
//!   berth's table is read back, compared with the plan and only the difference written
//!   ([`crate::nft::adopt::plan_repair`]), so a matching table keeps its rules and its affinity
//!   entries. Otherwise (no table, one it cannot repair, a writer that cannot read) it deletes
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

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::backend::{SyncKind, SyncReport, SyncRuleset};
use crate::error::Error;
use crate::nft::adopt::{plan_repair, ObservedTables};
use crate::nft::render::{
    affinity_refs, check_expressible, convert_chain, element_chain, is_folded, place_rules,
    placed_rule_count, rules_hash, Command, ConvertedChain, Element, NftChain, NftRule, NftRuleset,
    NodePortKey, ServiceKey, Transaction, DEFAULT_AFFINITY_SECONDS,
};
use crate::nft::shard::{Placement, Shard, Shards, MAIN, MAX_SHARDS};
use crate::nft::stage::{Piece, TablePieces};
use crate::plan::incremental::{Changes, DispatchChanges};
use crate::plan::model::{ChainName, Rule, Ruleset, Table};
use crate::plan::names;
use berth_core::{IpFamily, Protocol};

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

type ChainKey = (Table, ChainName);
/// An affinity set: its table and name.
type SetKey = (Shard, ChainName);

/// What the last successful sync left in the kernel, as far as diffs need it.
#[derive(Debug, Clone, Default)]
struct Applied {
    /// Hash of each chain's converted rules, how many rules its copies hold, its table.
    chains: BTreeMap<ChainKey, (u64, usize, Shard)>,
    services: BTreeMap<ServiceKey, NftChain>,
    node_ports: BTreeMap<NodePortKey, NftChain>,
    cluster_ips: BTreeSet<IpAddr>,
    affinity: BTreeMap<SetKey, u32>,
    /// The affinity sets each chain's rules name; a set no chain names any more is deleted.
    chain_sets: BTreeMap<ChainKey, BTreeSet<SetKey>>,
    /// The endpoint chains each chain's rules fold or jump to, and the reverse: a changed
    /// endpoint chain rewrites the chains that use it (folded, or no longer foldable).
    chain_endpoints: BTreeMap<ChainKey, BTreeSet<ChainName>>,
    /// (endpoint chain, chain using it): one flat set, not a set per endpoint.
    used_by: BTreeSet<(ChainName, ChainKey)>,
    /// The hairpin endpoints each chain's rules need, and how many chains need each.
    chain_hairpin: BTreeMap<ChainKey, BTreeSet<IpAddr>>,
    hairpin: BTreeMap<IpAddr, usize>,
    rules: usize,
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
fn applied_state(planned: &mut NftRuleset) -> Result<Applied, Error> {
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
    fn merged(parts: Vec<Applied>) -> Applied {
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
    fn set_chain_sets(&mut self, chain: &ChainKey, sets: BTreeSet<SetKey>) -> Vec<SetKey> {
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
    fn set_chain_folds(
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
    fn users<'a>(&'a self, name: &'a ChainName) -> impl Iterator<Item = &'a ChainKey> + 'a {
        let first = (name.clone(), (Table::Filter, ChainName::new("")));
        self.used_by
            .range(first..)
            .take_while(move |(endpoint, _)| endpoint == name)
            .map(|(_, user)| user)
    }
}

fn sets_named(shard: Shard, rules: &[NftRule]) -> BTreeSet<SetKey> {
    rules
        .iter()
        .flat_map(affinity_refs)
        .map(|(name, _)| (shard, name.clone()))
        .collect()
}

/// A berth chain of the plan that the nft table holds (the iptables canary has no place there).
fn programmed(chain: &ChainName) -> bool {
    chain.is_berth() && chain.as_str() != names::CANARY
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

/// A cold load's stages, each built when the writer asks for it ([`Nft::apply_staged`]), so
/// that the next table is converted while the kernel takes the last: per table (the main one
/// first) one transaction that replaces whatever a cut-short load left under its name and
/// fills it with everything but its base chains and the hairpin pairs, then any endpoint
/// chains no table's chains jumped to, the hairpin pairs in transactions of their own, and one
/// transaction adding every table's base chains with their rules. A conversion that fails
/// ends the stages (the failure is kept) before the base chains.
struct StagedLoad<'a> {
    family: IpFamily,
    pieces: TablePieces<'a>,
    /// The state each piece leaves, merged with the last one.
    parts: Vec<Applied>,
    merged: Option<Applied>,
    failure: Option<Error>,
    /// Stages built ahead: the hairpin pairs and the base chains.
    ahead: std::collections::VecDeque<Transaction>,
}

/// Hairpin pairs per stage of a cold load: about what one shard's stage costs the kernel at
/// 10,000 Services.
const HAIRPIN_STAGE: usize = 10_000;

impl<'a> StagedLoad<'a> {
    fn new(family: IpFamily, pieces: TablePieces<'a>) -> Self {
        StagedLoad {
            family,
            pieces,
            parts: Vec::new(),
            merged: None,
            failure: None,
            ahead: std::collections::VecDeque::new(),
        }
    }

    /// Queues the stages of one piece, its state recorded: a table's (or the rest's)
    /// transaction; for the base chains, the whole load's state merged, the hairpin pairs' stages
    /// from it, then the base chains' transaction.
    fn stage(&mut self, piece: Piece) -> Result<(), Error> {
        let mut tx = Transaction::new(self.family);
        let (mut planned, table) = match piece {
            Piece::Table(shard, planned) => (planned, Some(shard)),
            Piece::Rest(planned) => (planned, None),
            Piece::Hooks(mut planned) => {
                self.parts.push(applied_state(&mut planned)?);
                let merged = Applied::merged(std::mem::take(&mut self.parts));
                let pairs: Vec<IpAddr> = merged.hairpin.keys().copied().collect();
                for chunk in pairs.chunks(HAIRPIN_STAGE) {
                    let mut pairs = Transaction::new(self.family);
                    pairs.commands.extend(
                        chunk
                            .iter()
                            .map(|ip| Command::AddElement(Element::Hairpin(*ip))),
                    );
                    self.ahead.push_back(pairs);
                }
                self.merged = Some(merged);
                for (chain, hook) in &planned.hooks {
                    tx.push(Command::AddChain(chain.clone(), Some(*hook)));
                }
                for (chain, rules) in std::mem::take(&mut planned.chains) {
                    for rule in rules {
                        tx.push(Command::AddRule(chain.clone(), rule));
                    }
                }
                self.ahead.push_back(tx);
                return Ok(());
            }
        };
        self.parts.push(applied_state(&mut planned)?);
        if let Some(shard) = table {
            tx.push(Command::AddTable(shard));
            tx.push(Command::DeleteTable(shard));
            tx.push(Command::AddTable(shard));
            tx.push(Command::AddMaps(shard));
        }
        let NftRuleset {
            chains,
            hooks: _,
            services,
            node_ports,
            cluster_ips,
            affinity,
            hairpin: _,
            endpoints: _,
            planned: _,
        } = planned;
        for chain in chains.keys() {
            tx.push(Command::AddChain(chain.clone(), None));
        }
        for ((shard, name), seconds) in affinity {
            tx.push(Command::AddAffinitySet(shard, name, seconds));
        }
        for (chain, rules) in chains {
            for rule in rules {
                tx.push(Command::AddRule(chain.clone(), rule));
            }
        }
        for (key, target) in services {
            tx.push(Command::AddElement(Element::Service(key, target)));
        }
        for (key, target) in node_ports {
            tx.push(Command::AddElement(Element::NodePort(key, target)));
        }
        for ip in cluster_ips {
            tx.push(Command::AddElement(Element::ClusterIp(ip)));
        }
        self.ahead.push_back(tx);
        Ok(())
    }

    /// The state the whole load leaves, or why it stopped.
    fn finish(self) -> Result<Applied, Error> {
        match (self.failure, self.merged) {
            (Some(failure), _) => Err(failure),
            (None, Some(merged)) => Ok(merged),
            (None, None) => Err(Error::InvalidInput {
                object: "nftables cold load".to_string(),
                field: "stages".to_string(),
                value: "the writer stopped before the base chains".to_string(),
            }),
        }
    }
}

impl Iterator for StagedLoad<'_> {
    type Item = Transaction;

    fn next(&mut self) -> Option<Transaction> {
        while self.failure.is_none() {
            if let Some(tx) = self.ahead.pop_front() {
                return Some(tx);
            }
            if let Err(failure) = self.pieces.next()?.and_then(|piece| self.stage(piece)) {
                self.failure = Some(failure);
            }
        }
        None
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
        && !next.chain_endpoints.contains_key(chain)
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

    /// Applies `rs` when only the chains in `changes` can differ from the ruleset of the last
    /// successful sync (as a [`crate::plan::Planner`] reports them); a full sync when one is due.
    pub fn sync_changes(&mut self, rs: &Ruleset, changes: &Changes) -> Result<SyncReport, Error> {
        let result = match (changes.chains(), self.applied.is_some()) {
            (Some(chains), true) => self.partial(rs, chains, changes.dispatch()),
            _ => self.full(rs),
        };
        if result.is_err() {
            self.applied = None;
        }
        result
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
        Ok(Some(report))
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
        let mut diff = PartialDiff {
            shards: self.shards,
            ..PartialDiff::default()
        };
        // A changed endpoint chain changes the chains that fold it or jump to it.
        let mut work: BTreeSet<ChainKey> = chains
            .iter()
            .filter(|(_, c)| programmed(c))
            .cloned()
            .collect();
        for key in chains {
            work.extend(next.users(&key.1).filter(|user| key.0 == user.0).cloned());
        }
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

/// One partial transaction as it is worked out, its commands by kind, and what settles at the
/// end: sets no chain names any more, hairpin endpoints whose need changed.
#[derive(Default)]
struct PartialDiff {
    shards: Shards,
    added: Vec<Command>,
    flushed: Vec<Command>,
    sets: Vec<Command>,
    rules: Vec<Command>,
    element_deletes: Vec<Command>,
    element_adds: Vec<Command>,
    deleted: Vec<NftChain>,
    stale_sets: Vec<Command>,
    rewritten: usize,
    orphaned: Vec<SetKey>,
    /// Hairpin endpoints whose need changed -> whether the set held them before.
    touched_hairpin: BTreeMap<IpAddr, bool>,
}

impl PartialDiff {
    /// Where the rules of the planned chain `key` go; an endpoint chain that stays a chain goes
    /// with the chain using it.
    fn placement(&self, next: &Applied, key: &ChainKey) -> Placement {
        match self.shards.place(key.0, &key.1) {
            Placement::WithUser => {
                let home = next
                    .users(&key.1)
                    .find_map(|user| next.chains.get(user))
                    .map_or(MAIN, |(_, _, home)| *home);
                Placement::In(home)
            }
            other => other,
        }
    }

    /// Brings one chain of the work list up to `rs`: deleted when it is no longer programmed,
    /// its map elements diffed, flushed and refilled (or added) when its rules changed.
    fn chain(&mut self, next: &mut Applied, rs: &Ruleset, key: &ChainKey) -> Result<(), Error> {
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
                next.set_chain_folds(
                    key,
                    BTreeSet::new(),
                    BTreeSet::new(),
                    &mut self.touched_hairpin,
                );
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
            converted.endpoints,
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
    fn dispatch_maps(
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
    fn settle(&mut self, next: &mut Applied) {
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

    fn is_empty(&self) -> bool {
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
    fn into_commands(self, commands: &mut Vec<Command>) {
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

    fn force_full_sync(&mut self) {
        NftSyncer::force_full_sync(self);
    }
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

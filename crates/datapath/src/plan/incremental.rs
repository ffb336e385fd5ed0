//! `Planner`: the incremental form of [`crate::plan::full`], for syncs where a few Services changed.
//!
//! The planner caches, per Service port (name and protocol), what planning it produced: its own
//! chains (SVC/SVL/EXT/FW/SEP), its rules in the shared filter chains and its dispatch entries,
//! with a fingerprint of its inputs. An update re-plans only ports whose fingerprint changed,
//! rebuilds the shared chains they contribute to, and in tree mode rewrites only the dispatch
//! chains whose key range holds a changed entry; in linear mode it splices the changed ports'
//! entries into the dispatch chains in place. The ruleset it keeps is always exactly what
//! [`crate::plan::full`] would return for the same view; the changed chains (and in linear mode
//! the changed dispatch keys with their entries) are collected until [`Planner::take_changes`]
//! hands them to the Syncers' `sync_changes`.

use std::collections::btree_map::Entry;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

mod lean;
mod owned;

pub use lean::PortGroups;
use owned::OwnedChains;

use crate::plan::categorize::categorize;
use crate::plan::changes::ChainKey;
pub use crate::plan::changes::{Changes, DispatchChanges};
use crate::plan::dispatch::{
    node_ports_jumps, range_of, service_cidr_jumps, unallocated_drop, AddrSpace, DispatchEntries,
    KeySpace, PortSpace, V4Space, V6Space,
};
use crate::plan::fixed::{builtin_jumps, plan_fixed_chains};
use crate::plan::input::{NodeInfo, NodeView, ServicePort, ServicePortName};
use crate::plan::model::{ChainName, Rule, Ruleset, Table, TableRules};
use crate::plan::names;
use crate::plan::options::Dispatch;
use crate::plan::options::PlanOptions;
use crate::plan::service::{plan_service_port, EndpointRules};
use berth_core::{IpFamily, Protocol};

type ServiceKey = (ServicePortName, Protocol);
/// A dispatch entry's place among those of one key: its Service port, then its planning order.
type EntryKey = (ServiceKey, usize);
/// Dispatch entries by key (address or node port), in the order linear dispatch would list them.
type Index = BTreeMap<u128, Entries>;

/// One key's dispatch entries, sorted. Nearly every key has exactly one, where a `BTreeMap`
/// would allocate a node for eleven: 15 MB at 10,000 Services.
#[derive(Debug, Clone, Default)]
struct Entries(Vec<(EntryKey, Rule)>);

impl Entries {
    fn position(&self, key: &EntryKey) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.cmp(key))
    }

    fn remove(&mut self, key: &EntryKey) -> Option<Rule> {
        let at = self.position(key).ok()?;
        Some(self.0.remove(at).1)
    }

    fn insert(&mut self, key: EntryKey, rule: Rule) {
        match self.position(&key) {
            Ok(at) => {
                if let Some(entry) = self.0.get_mut(at) {
                    entry.1 = rule;
                }
            }
            Err(at) => {
                // Exactly one slot for the usual single entry, not the four a push would reserve.
                self.0.reserve_exact(1);
                self.0.insert(at, (key, rule));
            }
        }
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn values(&self) -> impl Iterator<Item = &Rule> {
        self.0.iter().map(|(_, rule)| rule)
    }
}
type ChainRules = BTreeMap<ChainKey, Vec<Rule>>;

/// More changed Service ports than this in one update rebuild the linear dispatch chains
/// instead of splicing each port's entries in: a splice first sums the entries of every port
/// before it.
const SPLICE_MAX: usize = 16;

/// Fewer changed Service ports than this plan on the calling thread: starting threads costs
/// more than planning a few ports.
const PARALLEL_PLAN_MIN: usize = 512;
/// The most threads a cold plan uses.
const PLAN_THREADS_MAX: usize = 4;

/// What planning one Service port (all ports sharing its name and protocol) produced.
#[derive(Debug, Clone)]
struct Cached {
    fingerprint: u64,
    /// Its own chains; their rules live only in the ruleset, so the cache costs little memory.
    owned: OwnedChains,
    /// How many rules its own chains hold, per table (in [`Table::ALL`]'s order).
    owned_rules: [u32; 3],
    shared: BTreeMap<ChainKey, Vec<Rule>>,
    dst: Vec<(u128, Rule)>,
    node_ports: Vec<(Protocol, u128, Rule)>,
    cluster_ips: Vec<(u128, Rule)>,
}

/// Holds the current ruleset and the per-Service cache; see the module docs.
#[derive(Debug, Clone)]
pub struct Planner {
    options: PlanOptions,
    /// `None` until the first update: nothing is planned yet.
    node: Option<NodeInfo>,
    /// The fixed chains alone, which Services append to.
    base: Ruleset,
    rs: Ruleset,
    services: BTreeMap<ServiceKey, Cached>,
    /// Which Service ports write into each shared chain.
    contributors: BTreeMap<ChainKey, BTreeSet<ServiceKey>>,
    dst: Index,
    node_ports: BTreeMap<Protocol, Index>,
    /// The ClusterIP rejects below `BERTH-CLUSTER-IPS` (empty without Service CIDRs).
    cluster_ips: Index,
    pending: Option<BTreeSet<ChainKey>>,
    /// With linear dispatch, the dispatch keys whose entries changed since the last report.
    pending_dispatch: Dirty,
    /// Whether Service ports' own chains leave the ruleset once applied ([`Planner::lean`]).
    lean: bool,
    /// Whether the cache keeps endpoint chains' names, not their hash
    /// ([`Planner::keeping_endpoint_names`]).
    endpoint_names: bool,
    /// Whether the ruleset holds every Service port's own chains (always, unless `lean`).
    complete: bool,
    /// `lean` and not `complete`: the ports whose own chains the ruleset holds.
    held: BTreeSet<ServiceKey>,
    /// Rules of every Service port's own chains, per table (in [`Table::ALL`]'s order), held
    /// or not.
    owned_rules: [usize; 3],
    /// During [`Planner::update_without_service_chains`]: own chains planned are not kept.
    discard: bool,
    /// During a cold plan: the ports' cache entries, gathered to build the cache at once.
    deferred: Option<Vec<(ServiceKey, Cached)>>,
}

/// Dispatch keys whose entries changed: addresses, and node ports by protocol.
#[derive(Debug, Clone, Default)]
struct Dirty {
    dst: BTreeSet<u128>,
    node_ports: BTreeSet<(Protocol, u128)>,
    cluster_ips: BTreeSet<u128>,
}

fn fingerprint(ports: &[&ServicePort]) -> u64 {
    let mut hasher = DefaultHasher::new();
    ports.hash(&mut hasher);
    hasher.finish()
}

fn key_of(port: &ServicePort) -> (&ServicePortName, Protocol) {
    (&port.name, port.protocol)
}

impl Planner {
    /// An empty planner; the first [`Planner::update`] plans everything.
    pub fn new(options: PlanOptions) -> Self {
        Self::for_node(options, None)
    }

    /// An empty planner for `node` (whose addresses the node-port jumps may name).
    fn for_node(options: PlanOptions, node: Option<NodeInfo>) -> Self {
        let mut base = Ruleset {
            jumps: builtin_jumps(),
            ..Ruleset::default()
        };
        plan_fixed_chains(&mut base, options.random_fully);
        let mut rs = base.clone();
        // What dispatch of no Services at all gives.
        for jump in node_ports_jumps(&options, node.as_ref()) {
            rs.table_mut(Table::Nat)
                .push(&names::fixed(names::SERVICES), jump);
        }
        let cidr_jumps = service_cidr_jumps(&options);
        if !cidr_jumps.is_empty() {
            let filter = rs.table_mut(Table::Filter);
            for jump in cidr_jumps {
                filter.push(&names::fixed(names::SERVICES), jump);
            }
            filter.push(&names::fixed(names::CLUSTER_IPS), unallocated_drop());
        }
        Planner {
            options,
            node,
            rs,
            base,
            services: BTreeMap::new(),
            contributors: BTreeMap::new(),
            dst: Index::new(),
            node_ports: BTreeMap::new(),
            cluster_ips: Index::new(),
            pending: None,
            pending_dispatch: Dirty::default(),
            lean: false,
            endpoint_names: false,
            complete: true,
            held: BTreeSet::new(),
            owned_rules: [0; 3],
            discard: false,
            deferred: None,
        }
    }

    /// An empty planner for `options` and `node`, with this one's settings (lean, what its
    /// cache keeps, whether it is discarding).
    fn start_over(&mut self, options: PlanOptions, node: Option<NodeInfo>) {
        let (lean, endpoint_names, discard) = (self.lean, self.endpoint_names, self.discard);
        *self = Planner::for_node(options, node);
        (self.lean, self.endpoint_names, self.discard) = (lean, endpoint_names, discard);
    }

    /// Plans with `cidrs` as the cluster's Service CIDRs from now on. A change starts over, as new
    /// node facts do: the next update plans everything and reports every chain changed.
    pub fn set_service_cidrs(&mut self, cidrs: &[ipnet::IpNet]) {
        if self.options.service_cidrs != cidrs {
            let options = PlanOptions {
                service_cidrs: cidrs.to_vec(),
                ..self.options.clone()
            };
            self.start_over(options, None);
        }
    }

    pub fn options(&self) -> &PlanOptions {
        &self.options
    }

    /// The planned ruleset: equal to `plan(view, options)` of the last update's view — for a
    /// lean planner ([`Planner::lean`]) only while [`Planner::is_complete`]; otherwise without
    /// the own chains of Service ports not planned since the last [`Planner::release`].
    pub fn ruleset(&self) -> &Ruleset {
        &self.rs
    }

    /// The chains changed since the last call (everything, before the first call); with linear
    /// dispatch, also the dispatch entries that changed.
    pub fn take_changes(&mut self) -> Changes {
        let dirty = std::mem::take(&mut self.pending_dispatch);
        match self.pending.replace(BTreeSet::new()) {
            Some(chains)
                if dirty.dst.is_empty()
                    && dirty.node_ports.is_empty()
                    && dirty.cluster_ips.is_empty() =>
            {
                Changes::Chains(chains)
            }
            Some(chains) => Changes::Dispatch(chains, self.dispatch_changes(&dirty)),
            None => Changes::All,
        }
    }

    /// Each dirty key's entries as they are now, in chain order (within a key, the index keeps
    /// linear dispatch's order).
    fn dispatch_changes(&self, dirty: &Dirty) -> DispatchChanges {
        let entries = |index: Option<&Index>, key: &u128| -> Vec<Rule> {
            index
                .and_then(|index| index.get(key))
                .map(|entries| entries.values().cloned().collect())
                .unwrap_or_default()
        };
        let by_addr = |keys: &BTreeSet<u128>, index: &Index| {
            keys.iter()
                .map(|key| {
                    (
                        addr_of(self.options.family, *key),
                        entries(Some(index), key),
                    )
                })
                .collect()
        };
        let services = by_addr(&dirty.dst, &self.dst);
        let node_ports = dirty
            .node_ports
            .iter()
            .filter_map(|(proto, key)| {
                let port = u16::try_from(*key).ok()?;
                Some(((*proto, port), entries(self.node_ports.get(proto), key)))
            })
            .collect();
        let cluster_ips = by_addr(&dirty.cluster_ips, &self.cluster_ips);
        DispatchChanges {
            services,
            node_ports,
            cluster_ips,
        }
    }

    /// Brings the ruleset to `plan(view, options)`, re-planning only Service ports whose inputs
    /// changed. Cost: one fingerprint per Service port plus the re-planning of the changed ones.
    pub fn update(&mut self, view: &NodeView) {
        self.update_inner(view, &|_| true);
    }

    /// Like [`Planner::update`], for a caller that knows which Service ports may have changed
    /// since the last update (added and removed ones included), as the agent does from its watch
    /// events: `may_have_changed` false skips even the fingerprint of a port. Removed ports are
    /// found either way.
    pub fn update_changed(
        &mut self,
        view: &NodeView,
        may_have_changed: &dyn Fn(&ServicePortName) -> bool,
    ) {
        self.update_inner(view, may_have_changed);
    }

    fn update_inner(
        &mut self,
        view: &NodeView,
        may_have_changed: &dyn Fn(&ServicePortName) -> bool,
    ) {
        let everything = |_: &ServicePortName| true;
        let mut may_have_changed = may_have_changed;
        if self.node.as_ref() != Some(&view.node) {
            // Node facts enter every Service's plan: start over.
            self.start_over(self.options.clone(), Some(view.node.clone()));
            may_have_changed = &everything;
        }
        // Both sides of the merge skip the ports that cannot have changed, so a hinted update
        // sorts and fingerprints only those.
        let mut ports: Vec<&ServicePort> = view
            .services
            .iter()
            .filter(|port| may_have_changed(&port.name))
            .collect();
        ports.sort_by(|a, b| key_of(a).cmp(&key_of(b)));
        let groups: Vec<&[&ServicePort]> = ports.chunk_by(|a, b| key_of(a) == key_of(b)).collect();

        // Merge the sorted groups with the sorted cache, without cloning any unchanged key.
        let mut upserts: Vec<(&[&ServicePort], u64)> = Vec::new();
        let mut removals: Vec<ServiceKey> = Vec::new();
        let mut cached = self
            .services
            .iter()
            .filter(|(key, _)| may_have_changed(&key.0))
            .peekable();
        for group in &groups {
            let Some(first) = group.first() else {
                continue;
            };
            let key = key_of(first);
            while let Some((old, _)) = cached.next_if(|(old, _)| (&old.0, old.1) < key) {
                removals.push(old.clone());
            }
            match cached.next_if(|(old, _)| (&old.0, old.1) == key) {
                Some((_, entry)) => {
                    let print = fingerprint(group);
                    if entry.fingerprint != print {
                        upserts.push((group, print));
                    }
                }
                None => upserts.push((group, fingerprint(group))),
            }
        }
        removals.extend(cached.map(|(old, _)| old.clone()));

        let linear = self.options.dispatch == Dispatch::Linear;
        let mut changes = Touched {
            splice: linear && removals.len() + upserts.len() <= SPLICE_MAX,
            ..Touched::default()
        };
        for key in removals {
            self.replace_service(key, None, &mut changes);
        }
        let planned = self.plan_groups(&upserts);
        // Many new ports (a cold plan): their chains join the chain maps in one sorted merge
        // instead of a search per chain (110,000 at 10,000 Services).
        let mut merged = ChainMerge::default();
        let bulk = planned.len() >= PARALLEL_PLAN_MIN;
        if bulk && self.services.is_empty() {
            // A cold plan: the cache is built at once from the sorted ports (full nodes, where
            // inserting one by one leaves them half empty: 4 MB at 10,000 Services).
            self.deferred = Some(Vec::with_capacity(planned.len()));
        }
        for ((group, _), (cached, mut owned)) in upserts.iter().zip(planned) {
            let Some(first) = group.first() else {
                continue;
            };
            let key = (first.name.clone(), first.protocol);
            if bulk && !self.services.contains_key(&key) {
                for chain in owned.keys() {
                    self.touch(chain.clone());
                }
                merged.add(std::mem::take(&mut owned));
            }
            self.replace_service(key, Some((cached, owned)), &mut changes);
        }
        merged.into(&mut self.rs);
        if let Some(deferred) = self.deferred.take() {
            self.services = deferred.into_iter().collect();
        }
        self.rebuild_shared(&changes.shared);
        let dispatch_changed =
            !changes.dst.is_empty() || changes.node_ports.values().any(|d| !d.is_empty());
        match self.options.dispatch {
            // Spliced in place already, unless there were too many ports or a splice missed.
            Dispatch::Linear if changes.splice && !changes.splice_failed => {}
            Dispatch::Linear => {
                if dispatch_changed || changes.splice_failed {
                    self.rebuild_linear_dispatch();
                }
            }
            Dispatch::Tree => self.rebuild_tree_dispatch(&changes),
        }
        let cluster_ips_spliced = linear && changes.splice && !changes.splice_failed;
        let cluster_ips_chain = self
            .rs
            .chain(Table::Filter, &names::fixed(names::CLUSTER_IPS))
            .is_some();
        if (!changes.cluster_ips.is_empty() || (changes.splice_failed && cluster_ips_chain))
            && !cluster_ips_spliced
        {
            self.rebuild_cluster_ips(&changes.cluster_ips);
        }
        if linear && self.pending.is_some() {
            let dirty = &mut self.pending_dispatch;
            dirty.dst.extend(changes.dst);
            dirty.cluster_ips.extend(changes.cluster_ips);
            for (proto, keys) in changes.node_ports {
                dirty
                    .node_ports
                    .extend(keys.into_iter().map(|key| (proto, key)));
            }
        }
    }

    /// Plans each group, in order. Groups plan independently of each other, so a cold plan (every
    /// Service port at once) splits them over the machine's cores: planning is most of a cold
    /// load's time before the first table can be written.
    fn plan_groups(&self, groups: &[(&[&ServicePort], u64)]) -> Vec<(Cached, ChainRules)> {
        let plan_all = |groups: &[(&[&ServicePort], u64)]| -> Vec<(Cached, ChainRules)> {
            groups
                .iter()
                .map(|(group, print)| {
                    let (cached, owned) = self.plan_group(group, *print);
                    // Dropped at once: a cold plan would otherwise hold every port's chains.
                    (
                        cached,
                        if self.discard {
                            ChainRules::new()
                        } else {
                            owned
                        },
                    )
                })
                .collect()
        };
        if groups.len() < PARALLEL_PLAN_MIN {
            return plan_all(groups);
        }
        // Asked only for a large plan: on Linux the answer reads the cgroup's CPU quota files,
        // which an update of a few ports (every watch event) has no business doing.
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(PLAN_THREADS_MAX);
        if threads < 2 {
            return plan_all(groups);
        }
        let chunk = groups.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let mut parts = groups.chunks(chunk);
            // The first chunk on this thread, the others on threads of their own.
            let first = parts.next().unwrap_or_default();
            let others: Vec<_> = parts
                .map(|part| {
                    std::thread::Builder::new()
                        .name("berth-plan".to_string())
                        .spawn_scoped(scope, move || plan_all(part))
                        .map_err(|_| part)
                })
                .collect();
            let mut planned = plan_all(first);
            for other in others {
                // A thread that cannot be started or that panicked: plan its part here.
                match other {
                    Ok(handle) => match handle.join() {
                        Ok(part) => planned.extend(part),
                        Err(panic) => std::panic::resume_unwind(panic),
                    },
                    Err(part) => planned.extend(plan_all(part)),
                }
            }
            planned
        })
    }

    fn plan_group(&self, group: &[&ServicePort], print: u64) -> (Cached, ChainRules) {
        let node = self.node.clone().unwrap_or_default();
        let mut rs = Ruleset::default();
        let mut entries = DispatchEntries::default();
        // A pass that drops the ports' own chains keeps only their names and rule counts.
        let endpoint_rules = if self.discard {
            EndpointRules::Placeholders
        } else {
            EndpointRules::Full
        };
        for port in group {
            let categorized = categorize(port, &node, self.options.family);
            plan_service_port(
                &mut rs,
                &mut entries,
                &node,
                port,
                &categorized,
                &self.options,
                endpoint_rules,
            );
        }
        let mut owned = BTreeMap::new();
        let mut shared = BTreeMap::new();
        for (table, rules) in rs.tables {
            for (chain, mut chain_rules) in rules.chains {
                // Kept until the Service changes: an endpoint chain's two rules would otherwise
                // sit in room for four, 10 MB at 10,000 Services.
                chain_rules.shrink_to_fit();
                if self.base.chain(table, &chain).is_some() {
                    shared.insert((table, chain), chain_rules);
                } else {
                    owned.insert((table, chain), chain_rules);
                }
            }
        }
        let DispatchEntries {
            by_dst: mut dst,
            by_node_port: mut node_ports,
            by_cluster_ip: mut cluster_ips,
        } = entries;
        // Kept for the Service's lifetime: no room for entries that will never come.
        dst.shrink_to_fit();
        node_ports.shrink_to_fit();
        cluster_ips.shrink_to_fit();
        let mut owned_rules = [0u32; 3];
        for ((table, _), rules) in &owned {
            let count = u32::try_from(rules.len()).unwrap_or(u32::MAX);
            if let Some(total) = owned_rules.get_mut(table_slot(*table)) {
                *total = total.saturating_add(count);
            }
        }
        let cached = Cached {
            fingerprint: print,
            owned: OwnedChains::new(owned.keys(), !self.endpoint_names),
            owned_rules,
            shared,
            dst,
            node_ports,
            cluster_ips,
        };
        (cached, owned)
    }

    fn touch(&mut self, key: ChainKey) {
        if let Some(pending) = &mut self.pending {
            pending.insert(key);
        }
    }

    /// Swaps one Service port's cached plan for `new` (or drops it), updating its own chains in
    /// place and recording what the shared chains and dispatch must redo.
    fn replace_service(
        &mut self,
        key: ServiceKey,
        new: Option<(Cached, ChainRules)>,
        changes: &mut Touched,
    ) {
        let old = self.services.remove(&key);
        let (new, new_owned) = match new {
            Some((cached, owned)) => (Some(cached), owned),
            None => (None, ChainRules::new()),
        };
        for chain in old.iter().flat_map(|c| c.owned.iter()) {
            if !new_owned.contains_key(&chain) {
                if let Some(table) = self.rs.tables.get_mut(&chain.0) {
                    table.chains.remove(&chain.1);
                }
                self.touch(chain);
            }
        }
        for (chain, rules) in new_owned {
            // One walk of the chain map, not a lookup and then an insert: 110,000 chains at a
            // cold plan of 10,000 Services.
            let changed = match self.rs.table_mut(chain.0).chains.entry(chain.1.clone()) {
                Entry::Occupied(entry) if *entry.get() == rules => false,
                Entry::Occupied(mut entry) => {
                    entry.insert(rules);
                    true
                }
                Entry::Vacant(entry) => {
                    entry.insert(rules);
                    true
                }
            };
            if changed {
                self.touch(chain);
            }
        }

        let old_shared = old.as_ref().map(|c| c.shared.keys()).into_iter().flatten();
        let new_shared: BTreeSet<&ChainKey> = new
            .as_ref()
            .map(|c| c.shared.keys())
            .into_iter()
            .flatten()
            .collect();
        for chain in old_shared {
            changes.shared.insert(chain.clone());
            if !new_shared.contains(chain) {
                if let Some(set) = self.contributors.get_mut(chain) {
                    set.remove(&key);
                }
            }
        }
        for chain in new_shared {
            changes.shared.insert(chain.clone());
            self.contributors
                .entry(chain.clone())
                .or_default()
                .insert(key.clone());
        }

        let dst_old = old.as_ref().map_or(&[][..], |c| &c.dst[..]);
        let dst_new = new.as_ref().map_or(&[][..], |c| &c.dst[..]);
        swap_entries(
            &mut self.dst,
            &key,
            dst_old.iter().map(|(k, r)| (*k, r)),
            dst_new.iter().map(|(k, r)| (*k, r)),
            &mut changes.dst,
        );
        let cip_old = old.as_ref().map_or(&[][..], |c| &c.cluster_ips[..]);
        let cip_new = new.as_ref().map_or(&[][..], |c| &c.cluster_ips[..]);
        if !cip_old.is_empty() || !cip_new.is_empty() {
            swap_entries(
                &mut self.cluster_ips,
                &key,
                cip_old.iter().map(|(k, r)| (*k, r)),
                cip_new.iter().map(|(k, r)| (*k, r)),
                &mut changes.cluster_ips,
            );
        }
        for proto in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
            let (np_old, np_new) = (node_ports_of(&old, proto), node_ports_of(&new, proto));
            if np_old.is_empty() && np_new.is_empty() {
                continue;
            }
            swap_entries(
                self.node_ports.entry(proto).or_default(),
                &key,
                np_old.into_iter(),
                np_new.into_iter(),
                changes.node_ports.entry(proto).or_default(),
            );
        }
        if changes.splice && !changes.splice_failed {
            let spliced = self.splice_linear(&key, old.as_ref(), new.as_ref());
            changes.splice_failed = !spliced;
        }
        for (total, (before, after)) in self.owned_rules.iter_mut().zip(
            old.as_ref()
                .map_or([0; 3], |c| c.owned_rules)
                .into_iter()
                .zip(new.as_ref().map_or([0; 3], |c| c.owned_rules)),
        ) {
            *total = total.saturating_sub(before as usize) + after as usize;
        }
        if self.discard {
            self.held.remove(&key);
            if new.as_ref().is_some_and(|cached| !cached.owned.is_empty()) {
                self.complete = false;
            }
        } else if self.lean && !self.complete {
            match &new {
                Some(cached) if !cached.owned.is_empty() => {
                    self.held.insert(key.clone());
                }
                _ => {
                    self.held.remove(&key);
                }
            }
        }
        if let Some(new) = new {
            match &mut self.deferred {
                Some(deferred) => deferred.push((key, new)),
                None => {
                    self.services.insert(key, new);
                }
            }
        }
    }

    /// Linear dispatch lists every Service port's entries in Service order: swaps `key`'s
    /// entries in `BERTH-SERVICES`, `BERTH-NODEPORTS` and `BERTH-CLUSTER-IPS` in place, where
    /// a rebuild would clone every rule of those chains (10,000 at 10,000 Services). Call with
    /// `key` out of the cache. False when a chain is shorter than the cache says (not expected:
    /// the caller then rebuilds).
    fn splice_linear(
        &mut self,
        key: &ServiceKey,
        old: Option<&Cached>,
        new: Option<&Cached>,
    ) -> bool {
        let (mut dst_at, mut node_port_at, mut cluster_ip_at) = (0, 0, 0);
        for cached in self.services.range(..key).map(|(_, cached)| cached) {
            dst_at += cached.dst.len();
            node_port_at += cached.node_ports.len();
            cluster_ip_at += cached.cluster_ips.len();
        }
        let rules = |c: Option<&Cached>| -> Vec<Rule> {
            c.map(|c| c.dst.iter().map(|(_, rule)| rule.clone()).collect())
                .unwrap_or_default()
        };
        let (old_dst, new_dst) = (old.map_or(0, |c| c.dst.len()), rules(new));
        let node_port_rules = |c: Option<&Cached>| -> Vec<Rule> {
            c.map(|c| {
                c.node_ports
                    .iter()
                    .map(|(_, _, rule)| rule.clone())
                    .collect()
            })
            .unwrap_or_default()
        };
        let (old_np, new_np) = (old.map_or(0, |c| c.node_ports.len()), node_port_rules(new));
        let cluster_ip_rules = |c: Option<&Cached>| -> Vec<Rule> {
            c.map(|c| c.cluster_ips.iter().map(|(_, rule)| rule.clone()).collect())
                .unwrap_or_default()
        };
        let (old_cip, new_cip) = (
            old.map_or(0, |c| c.cluster_ips.len()),
            cluster_ip_rules(new),
        );
        let mut spliced = Vec::new();
        for (table, chain, at, old_len, new_rules) in [
            (Table::Nat, names::SERVICES, dst_at, old_dst, new_dst),
            (Table::Nat, names::NODEPORTS, node_port_at, old_np, new_np),
            (
                Table::Filter,
                names::CLUSTER_IPS,
                cluster_ip_at,
                old_cip,
                new_cip,
            ),
        ] {
            if old_len == 0 && new_rules.is_empty() {
                continue;
            }
            let name = names::fixed(chain);
            let Some(rules) = self
                .rs
                .tables
                .get_mut(&table)
                .and_then(|rules| rules.chains.get_mut(&name))
            else {
                return false;
            };
            match splice(rules, at, old_len, new_rules) {
                Some(true) => spliced.push((table, name)),
                Some(false) => {}
                None => return false,
            }
        }
        for chain in spliced {
            self.touch(chain);
        }
        true
    }

    /// Refills each shared chain a changed Service port writes to: its fixed rules, then every
    /// contributor's rules in Service order, as `plan` appends them.
    fn rebuild_shared(&mut self, chains: &BTreeSet<ChainKey>) {
        for chain in chains {
            let mut rules = self
                .base
                .chain(chain.0, &chain.1)
                .cloned()
                .unwrap_or_default();
            for key in self.contributors.get(chain).into_iter().flatten() {
                if let Some(part) = self.services.get(key).and_then(|c| c.shared.get(chain)) {
                    rules.extend(part.iter().cloned());
                }
            }
            if *chain == (Table::Filter, names::fixed(names::SERVICES)) {
                rules.extend(service_cidr_jumps(&self.options));
            }
            let table = self.rs.table_mut(chain.0);
            if table.chains.get(&chain.1) != Some(&rules) {
                table.chains.insert(chain.1.clone(), rules);
                self.touch(chain.clone());
            }
        }
    }

    /// Rewrites `BERTH-CLUSTER-IPS` (and, in tree mode, the tree chains below it whose range
    /// holds a changed ClusterIP), as [`crate::plan::dispatch::build_dispatch`] lays it out.
    fn rebuild_cluster_ips(&mut self, dirty: &BTreeSet<u128>) {
        let root = names::fixed(names::CLUSTER_IPS);
        let (mut rules, rewritten, orphans) = match self.options.dispatch {
            Dispatch::Linear => {
                let rules: Vec<Rule> = self
                    .services
                    .values()
                    .flat_map(|cached| cached.cluster_ips.iter().map(|(_, rule)| rule.clone()))
                    .collect();
                (rules, BTreeMap::new(), BTreeSet::new())
            }
            Dispatch::Tree => {
                let mut walk = TreeWalk {
                    existing: self.rs.table(Table::Filter),
                    leaf_size: self.options.leaf_size,
                    rewritten: BTreeMap::new(),
                    reached: BTreeSet::new(),
                };
                let space = AddrSpace(self.options.family, names::DISPATCH_CLUSTER_IP);
                let rules = match self.options.family {
                    IpFamily::V4 => walk.node(
                        &V4Space(space),
                        &self.cluster_ips,
                        dirty,
                        range_of(32, 0, 0),
                    ),
                    IpFamily::V6 => walk.node(
                        &V6Space(space),
                        &self.cluster_ips,
                        dirty,
                        range_of(128, 0, 0),
                    ),
                };
                // The root is rewritten below: its old children count as the walk's too.
                walk.rewritten.insert(root.clone(), Vec::new());
                let orphans = walk.orphans();
                walk.rewritten.remove(&root);
                (rules, walk.rewritten, orphans)
            }
        };
        rules.push(unallocated_drop());
        let filter = self.rs.table_mut(Table::Filter);
        let mut touched = Vec::new();
        for (chain, chain_rules) in rewritten.into_iter().chain([(root, rules)]) {
            if filter.chains.get(&chain) != Some(&chain_rules) {
                filter.chains.insert(chain.clone(), chain_rules);
                touched.push(chain);
            }
        }
        for chain in orphans {
            filter.chains.remove(&chain);
            touched.push(chain);
        }
        for chain in touched {
            self.touch((Table::Filter, chain));
        }
    }

    fn rebuild_linear_dispatch(&mut self) {
        let mut services = Vec::new();
        let mut node_ports = Vec::new();
        for cached in self.services.values() {
            services.extend(cached.dst.iter().map(|(_, rule)| rule.clone()));
            node_ports.extend(cached.node_ports.iter().map(|(_, _, rule)| rule.clone()));
        }
        services.extend(node_ports_jumps(&self.options, self.node.as_ref()));
        let nat = self.rs.table_mut(Table::Nat);
        nat.chains.insert(names::fixed(names::SERVICES), services);
        nat.chains
            .insert(names::fixed(names::NODEPORTS), node_ports);
        self.touch((Table::Nat, names::fixed(names::SERVICES)));
        self.touch((Table::Nat, names::fixed(names::NODEPORTS)));
    }

    fn rebuild_tree_dispatch(&mut self, changes: &Touched) {
        let leaf_size = self.options.leaf_size;
        let mut walk = TreeWalk {
            existing: self.rs.table(Table::Nat),
            leaf_size,
            rewritten: BTreeMap::new(),
            reached: BTreeSet::new(),
        };
        if !changes.dst.is_empty() {
            let mut rules = match self.options.family {
                IpFamily::V4 => walk.node(
                    &V4Space(AddrSpace(IpFamily::V4, names::DISPATCH_DST)),
                    &self.dst,
                    &changes.dst,
                    range_of(32, 0, 0),
                ),
                IpFamily::V6 => walk.node(
                    &V6Space(AddrSpace(IpFamily::V6, names::DISPATCH_DST)),
                    &self.dst,
                    &changes.dst,
                    range_of(128, 0, 0),
                ),
            };
            rules.extend(node_ports_jumps(&self.options, self.node.as_ref()));
            walk.rewritten.insert(names::fixed(names::SERVICES), rules);
        }
        if changes.node_ports.values().any(|dirty| !dirty.is_empty()) {
            let empty_index = Index::new();
            let no_dirty = BTreeSet::new();
            let mut rules = Vec::new();
            for proto in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
                rules.extend(walk.node(
                    &PortSpace(proto),
                    self.node_ports.get(&proto).unwrap_or(&empty_index),
                    changes.node_ports.get(&proto).unwrap_or(&no_dirty),
                    range_of(16, 0, 0),
                ));
            }
            walk.rewritten.insert(names::fixed(names::NODEPORTS), rules);
        }
        let orphans = walk.orphans();
        let TreeWalk { rewritten, .. } = walk;
        for (chain, rules) in rewritten {
            let nat = self.rs.table_mut(Table::Nat);
            if nat.chains.get(&chain) != Some(&rules) {
                nat.chains.insert(chain.clone(), rules);
                self.touch((Table::Nat, chain));
            }
        }
        for chain in orphans {
            self.rs.table_mut(Table::Nat).chains.remove(&chain);
            self.touch((Table::Nat, chain));
        }
    }
}

/// Replaces `rules[at..at + old_len]` with `new`: whether that changed anything, `None` when
/// the chain has no such range.
fn splice(rules: &mut Vec<Rule>, at: usize, old_len: usize, new: Vec<Rule>) -> Option<bool> {
    let end = at.checked_add(old_len)?;
    if rules.get(at..end)? == new.as_slice() {
        return Some(false);
    }
    rules.splice(at..end, new);
    Some(true)
}

/// A table's place in [`Table::ALL`].
fn table_slot(table: Table) -> usize {
    match table {
        Table::Filter => 0,
        Table::Nat => 1,
        Table::Mangle => 2,
    }
}

/// The address a dispatch key of `family` stands for.
fn addr_of(family: IpFamily, key: u128) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::from(u32::try_from(key).unwrap_or_default())),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::from(key)),
    }
}

/// New Service ports' own chains, gathered to join the ruleset's chain maps at once.
#[derive(Debug, Default)]
struct ChainMerge(BTreeMap<Table, Vec<(ChainName, Vec<Rule>)>>);

impl ChainMerge {
    fn add(&mut self, chains: ChainRules) {
        for ((table, chain), rules) in chains {
            self.0.entry(table).or_default().push((chain, rules));
        }
    }

    /// Merges the gathered chains into `rs`; a chain already there is replaced, as an insert
    /// would.
    fn into(self, rs: &mut Ruleset) {
        for (table, mut chains) in self.0 {
            let rules = rs.table_mut(table);
            chains.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            let old = std::mem::take(&mut rules.chains);
            if old.len() <= chains.len() / 8 {
                // A cold plan: the map is built from the sorted new chains alone (one pass),
                // and the few chains there before (the fixed ones) go in where no new one is.
                let mut merged: BTreeMap<ChainName, Vec<Rule>> = chains.into_iter().collect();
                for (chain, old_rules) in old {
                    merged.entry(chain).or_insert(old_rules);
                }
                rules.chains = merged;
            } else {
                // Of equal keys, a `BTreeMap` built from a list keeps the last: the new one.
                rules.chains = old.into_iter().chain(chains).collect();
            }
        }
    }
}

/// What an update must redo beyond the changed Services' own chains.
#[derive(Debug, Default)]
struct Touched {
    /// Linear dispatch with few changed ports: entries are spliced into the chains as each
    /// port is replaced; `splice_failed` when one could not be (the chains are rebuilt).
    splice: bool,
    splice_failed: bool,
    shared: BTreeSet<ChainKey>,
    /// Dispatch keys whose entries changed.
    dst: BTreeSet<u128>,
    node_ports: BTreeMap<Protocol, BTreeSet<u128>>,
    cluster_ips: BTreeSet<u128>,
}

fn node_ports_of(cached: &Option<Cached>, proto: Protocol) -> Vec<(u128, &Rule)> {
    cached
        .as_ref()
        .map(|c| {
            c.node_ports
                .iter()
                .filter(|(p, _, _)| *p == proto)
                .map(|(_, k, r)| (*k, r))
                .collect()
        })
        .unwrap_or_default()
}

/// Replaces one Service port's entries in `index`, marking the keys whose entries differ.
fn swap_entries<'a>(
    index: &mut Index,
    key: &ServiceKey,
    old: impl Iterator<Item = (u128, &'a Rule)>,
    new: impl Iterator<Item = (u128, &'a Rule)>,
    dirty: &mut BTreeSet<u128>,
) {
    let mut removed: BTreeMap<(u128, usize), Rule> = BTreeMap::new();
    for (i, (k, _)) in old.enumerate() {
        if let Some(entries) = index.get_mut(&k) {
            if let Some(rule) = entries.remove(&(key.clone(), i)) {
                removed.insert((k, i), rule);
            }
            if entries.is_empty() {
                index.remove(&k);
            }
        }
    }
    for (i, (k, rule)) in new.enumerate() {
        if removed.remove(&(k, i)).as_ref() != Some(rule) {
            dirty.insert(k);
        }
        index
            .entry(k)
            .or_default()
            .insert((key.clone(), i), rule.clone());
    }
    dirty.extend(removed.into_keys().map(|(k, _)| k));
}

/// One incremental pass over a dispatch tree. A chain's content is a function of the entries in
/// its key range alone and its name of that range, so a chain that exists and whose range holds
/// no changed key is kept as it is, with everything below it.
struct TreeWalk<'a> {
    existing: Option<&'a TableRules>,
    leaf_size: usize,
    rewritten: BTreeMap<ChainName, Vec<Rule>>,
    /// Every tree chain of the new layout that the walk saw, kept or rewritten.
    reached: BTreeSet<ChainName>,
}

impl TreeWalk<'_> {
    fn exists(&self, chain: &ChainName) -> bool {
        self.existing
            .is_some_and(|table| table.chains.contains_key(chain))
    }

    /// The rules of the chain covering `lo..=hi`, as [`crate::plan::dispatch`]'s `fill` lays them out,
    /// rewriting the children that need it.
    fn node<S: KeySpace>(
        &mut self,
        space: &S,
        index: &Index,
        dirty: &BTreeSet<u128>,
        (lo, hi): (u128, u128),
    ) -> Vec<Rule> {
        let (Some((&first, _)), Some((&last, _))) = (
            index.range(lo..=hi).next(),
            index.range(lo..=hi).next_back(),
        ) else {
            return Vec::new();
        };
        let common = if first == last {
            S::BITS
        } else {
            (first ^ last).leading_zeros() - (128 - S::BITS)
        };
        let limit = self.leaf_size.max(1);
        let mut count = 0;
        for (_, entries) in index.range(lo..=hi) {
            count += entries.len();
            if count > limit {
                break;
            }
        }
        if count <= limit || common >= S::BITS {
            return index
                .range(lo..=hi)
                .flat_map(|(_, entries)| entries.values().cloned())
                .collect();
        }
        let child_len = common + 1;
        let mask = !((1u128 << (S::BITS - child_len)) - 1) & range_of(S::BITS, 0, 0).1;
        let mut rules = Vec::with_capacity(2);
        // The first and last keys differ at the split bit, so they head the two halves.
        for prefix in [first & mask, last & mask] {
            let child = names::dispatch_chain(space.kind(), &space.label(prefix, child_len));
            rules.push(Rule::jump(space.matches(prefix, child_len), &child));
            let range = range_of(S::BITS, prefix, child_len);
            let changed = dirty.range(range.0..=range.1).next().is_some();
            if changed || !self.exists(&child) {
                let child_rules = self.node(space, index, dirty, range);
                self.rewritten.insert(child.clone(), child_rules);
            }
            self.reached.insert(child);
        }
        rules
    }

    /// Tree chains the rewritten chains used to jump to that the new layout no longer reaches,
    /// with whatever below them is not reached either.
    fn orphans(&self) -> BTreeSet<ChainName> {
        let mut orphans = BTreeSet::new();
        let mut stack: Vec<&ChainName> = self
            .rewritten
            .keys()
            .flat_map(|chain| self.old_children(chain))
            .collect();
        while let Some(chain) = stack.pop() {
            if self.reached.contains(chain) || !orphans.insert(chain.clone()) {
                continue;
            }
            stack.extend(self.old_children(chain));
        }
        orphans
    }

    fn old_children(&self, chain: &ChainName) -> Vec<&ChainName> {
        self.existing
            .and_then(|table| table.chains.get(chain))
            .map(|rules| {
                rules
                    .iter()
                    .filter_map(Rule::jump_target)
                    .filter(|target| names::is_dispatch_chain(target))
                    .collect()
            })
            .unwrap_or_default()
    }
}

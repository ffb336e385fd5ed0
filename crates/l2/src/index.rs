//! The announcer's index: a synchronous state machine fed one watch event at a time
//! (`apply_*`, `delete_*`, and `begin_*`/`finish_*` around a relist, `reset_*` for a whole
//! list) over IPPools, L2Advertisements, Nodes, Services and EndpointSlices, plus the live set
//! and the local interfaces that are up. Each call says whether the view changed;
//! [`L2Index::answers`] turns the view into the table of addresses this node answers for.
//!
//! Only what the election reads is kept. Objects that cannot be read are logged and skipped;
//! an invalid update of a pool or advertisement keeps the last valid one, so a typo does not
//! take working addresses off the LAN.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use berth_api::names::{class, label};
use berth_api::{IPPool, L2Advertisement, L2AdvertisementSpec};
use berth_core::TrafficPolicy;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::answers::{Answers, IpAnswer, IpEntry, ServiceKey};
use crate::election::{Election, ElectionOrder, ElectionView, IpDemand, NodeFacts, Pool};

/// What the election needs of one LoadBalancer Service.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ServiceFacts {
    ips: Vec<IpAddr>,
    local: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct SliceFacts {
    service: String,
    /// Nodes with a Ready endpoint in this slice.
    ready_nodes: BTreeSet<String>,
}

/// The kinds the index is fed, for relist bookkeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Pools,
    Advertisements,
    Nodes,
    Services,
    Slices,
}

const KINDS: [Kind; 5] = [
    Kind::Pools,
    Kind::Advertisements,
    Kind::Nodes,
    Kind::Services,
    Kind::Slices,
];

#[derive(Debug, Clone)]
pub struct L2Index {
    node: String,
    pools: BTreeMap<String, Pool>,
    advertisements: BTreeMap<String, L2AdvertisementSpec>,
    nodes: BTreeMap<String, NodeFacts>,
    services: BTreeMap<ServiceKey, ServiceFacts>,
    slices: BTreeMap<ServiceKey, SliceFacts>,
    /// `None` until a live set is given: then every known Node counts as live.
    live: Option<Arc<BTreeSet<String>>>,
    local_up: BTreeSet<String>,
    listed: BTreeSet<Kind>,
    /// Keys applied during a relist of each kind, to delete the rest at its end.
    relisting: BTreeMap<Kind, BTreeSet<ServiceKey>>,
    memo: Memo,
}

/// How many of the known nodes, in election order, are kept per address: the owner is almost
/// always among them, and when none is a candidate every node is weighed.
const ORDER_TOP: usize = 8;

/// What the last [`L2Index::answers`] elected, and what changed since. A Service or
/// EndpointSlice event marks its addresses: their demand is read again and they alone are
/// elected again. Pools, advertisements, Nodes, the live set and the local interfaces change
/// every address's election but no demand: every address is elected again from the demands
/// kept. A relist of Services or EndpointSlices (and the first table) rebuilds everything.
#[derive(Debug, Clone)]
struct Memo {
    /// Rebuild holders, slices and demands, and elect every address.
    rebuild: bool,
    /// Elect every address again.
    all: bool,
    /// Addresses whose Services or endpoints changed.
    dirty: BTreeSet<IpAddr>,
    /// The last outcome per address.
    ips: BTreeMap<IpAddr, Arc<IpEntry>>,
    /// What each address demands of its owner.
    demands: BTreeMap<IpAddr, IpDemand>,
    /// The Services holding each address.
    holders: BTreeMap<IpAddr, BTreeSet<ServiceKey>>,
    /// Each Service's EndpointSlices by name.
    slices_of: BTreeMap<ServiceKey, BTreeSet<String>>,
    /// Per address, the first known nodes in election order, kept up to date as Nodes come
    /// and go.
    order: HashMap<IpAddr, ElectionOrder>,
}

impl Default for Memo {
    fn default() -> Self {
        Memo {
            rebuild: true,
            all: true,
            dirty: BTreeSet::new(),
            ips: BTreeMap::new(),
            demands: BTreeMap::new(),
            holders: BTreeMap::new(),
            slices_of: BTreeMap::new(),
            order: HashMap::new(),
        }
    }
}

impl Memo {
    fn service_changed(
        &mut self,
        key: &ServiceKey,
        old: Option<&ServiceFacts>,
        new: Option<&ServiceFacts>,
    ) {
        if self.rebuild {
            return;
        }
        for ip in old.into_iter().flat_map(|f| f.ips.iter()) {
            if let Some(holders) = self.holders.get_mut(ip) {
                holders.remove(key);
                if holders.is_empty() {
                    self.holders.remove(ip);
                }
            }
            self.dirty.insert(*ip);
        }
        for ip in new.into_iter().flat_map(|f| f.ips.iter()) {
            self.holders.entry(*ip).or_default().insert(key.clone());
            self.dirty.insert(*ip);
        }
    }
}

fn cluster_key(name: Option<&String>) -> Option<ServiceKey> {
    Some((String::new(), name?.clone()))
}

fn namespaced_key(ns: Option<&String>, name: Option<&String>) -> Option<ServiceKey> {
    Some((ns?.clone(), name?.clone()))
}

/// A Node as the election reads it.
pub fn build_node_facts(node: &Node) -> NodeFacts {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let network_unavailable = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "NetworkUnavailable" && c.status == "True")
        });
    NodeFacts {
        excluded: labels.contains_key(label::EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS),
        labels,
        network_unavailable,
        deleting: node.metadata.deletion_timestamp.is_some(),
    }
}

/// The announced addresses of a Service: the ingress IPs of a LoadBalancer Service of class
/// `berth.dev/l2`, or of no class (its IPs are still only answered inside an IPPool).
fn build_service_facts(svc: &Service) -> Option<ServiceFacts> {
    let spec = svc.spec.as_ref()?;
    if spec.type_.as_deref() != Some("LoadBalancer") {
        return None;
    }
    if spec
        .load_balancer_class
        .as_deref()
        .is_some_and(|c| c != class::L2)
    {
        return None;
    }
    let mut ips: Vec<IpAddr> = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|ingress| ingress.ip.as_deref()?.parse().ok())
        .collect();
    ips.sort();
    ips.dedup();
    if ips.is_empty() {
        return None;
    }
    Some(ServiceFacts {
        ips,
        local: TrafficPolicy::from_spec(spec.external_traffic_policy.as_deref())
            == TrafficPolicy::Local,
    })
}

/// Nodes running a Ready endpoint of the slice (an unset `ready` counts as ready, as the API
/// documents).
fn build_slice_facts(slice: &EndpointSlice) -> Option<SliceFacts> {
    let service = slice
        .metadata
        .labels
        .as_ref()?
        .get(label::ENDPOINTSLICE_SERVICE_NAME)?
        .clone();
    let ready_nodes = slice
        .endpoints
        .iter()
        .filter(|ep| ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .filter_map(|ep| ep.node_name.clone())
        .collect();
    Some(SliceFacts {
        service,
        ready_nodes,
    })
}

fn build_pool(pool: &IPPool) -> Result<Pool, String> {
    let name = pool.metadata.name.clone().ok_or("no name")?;
    pool.spec.validate().map_err(|e| e.to_string())?;
    let ranges = pool.spec.ranges().map_err(|e| e.to_string())?;
    Ok(Pool {
        name,
        labels: pool.metadata.labels.clone().unwrap_or_default(),
        ranges,
    })
}

/// Replaces `map[key]` with `value` (`None` removes); true when that changed anything.
fn put<K: Ord, V: PartialEq>(map: &mut BTreeMap<K, V>, key: K, value: Option<V>) -> bool {
    match value {
        Some(value) => {
            if map.get(&key) == Some(&value) {
                return false;
            }
            map.insert(key, value);
            true
        }
        None => map.remove(&key).is_some(),
    }
}

impl L2Index {
    /// An empty index for the agent on `node`.
    pub fn new(node: &str) -> Self {
        L2Index {
            node: node.to_string(),
            pools: BTreeMap::new(),
            advertisements: BTreeMap::new(),
            nodes: BTreeMap::new(),
            services: BTreeMap::new(),
            slices: BTreeMap::new(),
            live: None,
            local_up: BTreeSet::new(),
            listed: BTreeSet::new(),
            relisting: BTreeMap::new(),
            memo: Memo::default(),
        }
    }

    /// Whether every kind has been listed once: answering before would elect from half a view.
    pub fn is_listed(&self) -> bool {
        KINDS.iter().all(|k| self.listed.contains(k))
    }

    fn seen(&mut self, kind: Kind, key: &ServiceKey) {
        if let Some(keys) = self.relisting.get_mut(&kind) {
            keys.insert(key.clone());
        }
    }

    pub fn apply_pool(&mut self, pool: &IPPool) -> bool {
        let Some(key) = cluster_key(pool.metadata.name.as_ref()) else {
            return false;
        };
        self.seen(Kind::Pools, &key);
        match build_pool(pool) {
            Ok(built) => {
                let changed = put(&mut self.pools, key.1, Some(built));
                self.everything(changed)
            }
            Err(reason) => {
                tracing::warn!(pool = %key.1, %reason, "keeping the last valid version of an IPPool that cannot be read");
                false
            }
        }
    }

    pub fn delete_pool(&mut self, pool: &IPPool) -> bool {
        let changed = pool
            .metadata
            .name
            .as_ref()
            .is_some_and(|name| self.pools.remove(name).is_some());
        self.everything(changed)
    }

    pub fn apply_advertisement(&mut self, adv: &L2Advertisement) -> bool {
        let Some(key) = cluster_key(adv.metadata.name.as_ref()) else {
            return false;
        };
        self.seen(Kind::Advertisements, &key);
        if let Err(errors) = adv.spec.validate() {
            tracing::warn!(advertisement = %key.1, %errors, "keeping the last valid version of an L2Advertisement that cannot be read");
            return false;
        }
        let changed = put(&mut self.advertisements, key.1, Some(adv.spec.clone()));
        self.everything(changed)
    }

    pub fn delete_advertisement(&mut self, adv: &L2Advertisement) -> bool {
        let changed = adv
            .metadata
            .name
            .as_ref()
            .is_some_and(|name| self.advertisements.remove(name).is_some());
        self.everything(changed)
    }

    pub fn apply_node(&mut self, node: &Node) -> bool {
        let Some(key) = cluster_key(node.metadata.name.as_ref()) else {
            return false;
        };
        self.seen(Kind::Nodes, &key);
        if !self.nodes.contains_key(&key.1) {
            for (ip, order) in self.memo.order.iter_mut() {
                order.admit(&key.1, *ip);
            }
        }
        let changed = put(&mut self.nodes, key.1, Some(build_node_facts(node)));
        self.everything(changed)
    }

    pub fn delete_node(&mut self, node: &Node) -> bool {
        let Some(name) = node.metadata.name.as_ref() else {
            return false;
        };
        if self.nodes.remove(name).is_none() {
            return false;
        }
        self.memo.order.retain(|_, order| order.remove(name));
        self.everything(true)
    }

    pub fn apply_service(&mut self, svc: &Service) -> bool {
        let Some(key) = namespaced_key(svc.metadata.namespace.as_ref(), svc.metadata.name.as_ref())
        else {
            return false;
        };
        self.seen(Kind::Services, &key);
        let facts = build_service_facts(svc);
        if self.services.get(&key) == facts.as_ref() {
            return false;
        }
        self.memo
            .service_changed(&key, self.services.get(&key), facts.as_ref());
        put(&mut self.services, key, facts)
    }

    pub fn delete_service(&mut self, svc: &Service) -> bool {
        let Some(key) = namespaced_key(svc.metadata.namespace.as_ref(), svc.metadata.name.as_ref())
        else {
            return false;
        };
        let Some(old) = self.services.remove(&key) else {
            return false;
        };
        self.memo.service_changed(&key, Some(&old), None);
        true
    }

    pub fn apply_slice(&mut self, slice: &EndpointSlice) -> bool {
        let Some(key) = namespaced_key(
            slice.metadata.namespace.as_ref(),
            slice.metadata.name.as_ref(),
        ) else {
            return false;
        };
        self.seen(Kind::Slices, &key);
        let facts = build_slice_facts(slice);
        if self.slices.get(&key) == facts.as_ref() {
            return false;
        }
        let old = self.slices.get(&key).map(|f| f.service.clone());
        self.slice_changed(&key, old, facts.as_ref().map(|f| f.service.clone()));
        put(&mut self.slices, key, facts)
    }

    pub fn delete_slice(&mut self, slice: &EndpointSlice) -> bool {
        let Some(key) = namespaced_key(
            slice.metadata.namespace.as_ref(),
            slice.metadata.name.as_ref(),
        ) else {
            return false;
        };
        let Some(old) = self.slices.remove(&key) else {
            return false;
        };
        self.slice_changed(&key, Some(old.service), None);
        true
    }

    /// Marks everything for election when `changed`; passes `changed` on.
    fn everything(&mut self, changed: bool) -> bool {
        if changed {
            self.memo.all = true;
        }
        changed
    }

    /// A slice moved from Service `old` to `new` (or came, or went): their addresses are
    /// elected again.
    fn slice_changed(&mut self, slice: &ServiceKey, old: Option<String>, new: Option<String>) {
        if self.memo.rebuild {
            return;
        }
        let (ns, name) = slice;
        for (service, keep) in [(old, false), (new, true)] {
            let Some(service) = service else { continue };
            let key = (ns.clone(), service);
            let slices = self.memo.slices_of.entry(key.clone()).or_default();
            if keep {
                slices.insert(name.clone());
            } else {
                slices.remove(name);
                if slices.is_empty() {
                    self.memo.slices_of.remove(&key);
                }
            }
            if let Some(facts) = self.services.get(&key) {
                self.memo.dirty.extend(facts.ips.iter().copied());
            }
        }
    }

    fn begin(&mut self, kind: Kind) {
        self.relisting.insert(kind, BTreeSet::new());
    }

    /// Ends a relist: what it did not name is deleted.
    fn finish(&mut self, kind: Kind) -> bool {
        self.listed.insert(kind);
        let Some(seen) = self.relisting.remove(&kind) else {
            return false;
        };
        fn retain_cluster<V>(map: &mut BTreeMap<String, V>, seen: &BTreeSet<ServiceKey>) -> bool {
            let before = map.len();
            map.retain(|name, _| seen.contains(&(String::new(), name.clone())));
            map.len() != before
        }
        fn retain<V>(map: &mut BTreeMap<ServiceKey, V>, seen: &BTreeSet<ServiceKey>) -> bool {
            let before = map.len();
            map.retain(|key, _| seen.contains(key));
            map.len() != before
        }
        let changed = match kind {
            Kind::Pools => retain_cluster(&mut self.pools, &seen),
            Kind::Advertisements => retain_cluster(&mut self.advertisements, &seen),
            Kind::Nodes => retain_cluster(&mut self.nodes, &seen),
            Kind::Services => retain(&mut self.services, &seen),
            Kind::Slices => retain(&mut self.slices, &seen),
        };
        if changed && kind == Kind::Nodes {
            self.memo.order.clear();
        }
        if changed && matches!(kind, Kind::Services | Kind::Slices) {
            self.memo.rebuild = true;
        }
        self.everything(changed)
    }

    pub fn begin_pools(&mut self) {
        self.begin(Kind::Pools);
    }
    pub fn finish_pools(&mut self) -> bool {
        self.finish(Kind::Pools)
    }
    pub fn begin_advertisements(&mut self) {
        self.begin(Kind::Advertisements);
    }
    pub fn finish_advertisements(&mut self) -> bool {
        self.finish(Kind::Advertisements)
    }
    pub fn begin_nodes(&mut self) {
        self.begin(Kind::Nodes);
    }
    pub fn finish_nodes(&mut self) -> bool {
        self.finish(Kind::Nodes)
    }
    pub fn begin_services(&mut self) {
        self.begin(Kind::Services);
    }
    pub fn finish_services(&mut self) -> bool {
        self.finish(Kind::Services)
    }
    pub fn begin_slices(&mut self) {
        self.begin(Kind::Slices);
    }
    pub fn finish_slices(&mut self) -> bool {
        self.finish(Kind::Slices)
    }

    /// A whole list at once, as a watch delivers a relist.
    fn reset<K>(
        &mut self,
        objects: &[K],
        begin: fn(&mut Self),
        apply: fn(&mut Self, &K) -> bool,
        finish: fn(&mut Self) -> bool,
    ) -> bool {
        begin(self);
        let mut changed = false;
        for object in objects {
            changed |= apply(self, object);
        }
        finish(self) | changed
    }

    pub fn reset_pools(&mut self, pools: &[IPPool]) -> bool {
        self.reset(
            pools,
            Self::begin_pools,
            Self::apply_pool,
            Self::finish_pools,
        )
    }
    pub fn reset_advertisements(&mut self, advs: &[L2Advertisement]) -> bool {
        self.reset(
            advs,
            Self::begin_advertisements,
            Self::apply_advertisement,
            Self::finish_advertisements,
        )
    }
    pub fn reset_nodes(&mut self, nodes: &[Node]) -> bool {
        self.reset(
            nodes,
            Self::begin_nodes,
            Self::apply_node,
            Self::finish_nodes,
        )
    }
    pub fn reset_services(&mut self, services: &[Service]) -> bool {
        self.reset(
            services,
            Self::begin_services,
            Self::apply_service,
            Self::finish_services,
        )
    }
    pub fn reset_slices(&mut self, slices: &[EndpointSlice]) -> bool {
        self.reset(
            slices,
            Self::begin_slices,
            Self::apply_slice,
            Self::finish_slices,
        )
    }

    /// The nodes whose agents are live now (this one included). Without a liveness signal
    /// (never called), every known Node counts as live: one owner still answers, but nothing
    /// moves when an agent dies.
    pub fn set_live(&mut self, live: Arc<BTreeSet<String>>) -> bool {
        if self.live.as_deref() == Some(&*live) {
            return false;
        }
        self.live = Some(live);
        self.everything(true)
    }

    /// The local interfaces that are up now.
    pub fn set_local_up(&mut self, up: BTreeSet<String>) -> bool {
        if self.local_up == up {
            return false;
        }
        self.local_up = up;
        self.everything(true)
    }

    /// The nodes counted live: the live set, or every known Node without one.
    pub fn live_nodes(&self) -> BTreeSet<String> {
        match &self.live {
            Some(live) => (**live).clone(),
            None => self.nodes.keys().cloned().collect(),
        }
    }

    /// The Services holding each address, and what the address demands of its owner.
    fn demands(&self) -> BTreeMap<IpAddr, (IpDemand, BTreeSet<ServiceKey>)> {
        let mut ready: BTreeMap<ServiceKey, BTreeSet<String>> = BTreeMap::new();
        for ((ns, _), slice) in &self.slices {
            ready
                .entry((ns.clone(), slice.service.clone()))
                .or_default()
                .extend(slice.ready_nodes.iter().cloned());
        }
        holders_of(&self.services)
            .into_iter()
            .map(|(ip, services)| {
                let demand = demand_of(&self.services, &services, |key| {
                    ready.get(key).cloned().unwrap_or_default()
                });
                (ip, (demand, services))
            })
            .collect()
    }

    fn view<'a>(
        &'a self,
        pools: &'a [Pool],
        advertisements: &'a [L2AdvertisementSpec],
        every_node: &'a mut BTreeSet<String>,
    ) -> ElectionView<'a> {
        let live = match &self.live {
            Some(live) => live.as_ref(),
            None => {
                *every_node = self.nodes.keys().cloned().collect();
                every_node
            }
        };
        ElectionView {
            pools,
            advertisements,
            nodes: &self.nodes,
            live,
            local: &self.node,
            local_up: &self.local_up,
        }
    }

    fn answer(&self, election: Election) -> Option<IpAnswer> {
        Some(match election {
            Election::NotInPool => return None,
            Election::NotAdvertised => IpAnswer::NotAdvertised,
            Election::NoCandidate => IpAnswer::Elsewhere { owner: None },
            Election::Owner { node, interfaces } if node == self.node => {
                IpAnswer::Owned(interfaces)
            }
            Election::Owner { node, .. } => IpAnswer::Elsewhere { owner: Some(node) },
        })
    }

    fn pool_ranges(&self) -> Vec<berth_core::AddressRange> {
        self.pools
            .values()
            .flat_map(|p| p.ranges.iter().copied())
            .collect()
    }

    /// The table of addresses this node answers for. Each address is elected once, however
    /// many Services share it; only the addresses whose Services or endpoints changed since the
    /// last call are elected again, unless something every address depends on changed.
    pub fn answers(&mut self) -> Answers {
        let mut memo = std::mem::take(&mut self.memo);
        if memo.rebuild {
            memo.holders = holders_of(&self.services);
            memo.slices_of = BTreeMap::new();
            for ((ns, name), slice) in &self.slices {
                memo.slices_of
                    .entry((ns.clone(), slice.service.clone()))
                    .or_default()
                    .insert(name.clone());
            }
            memo.ips.clear();
            memo.demands.clear();
            memo.dirty = memo.holders.keys().copied().collect();
            memo.rebuild = false;
            memo.all = true;
        }
        let stale = std::mem::take(&mut memo.dirty);
        // Every held address when everything changed, and always the marked ones: an address
        // its last Service left is held by none, and its entry goes.
        let mut targets = stale.clone();
        if memo.all {
            targets.extend(memo.holders.keys().copied());
        }
        memo.all = false;
        let pools: Vec<Pool> = self.pools.values().cloned().collect();
        let advertisements: Vec<L2AdvertisementSpec> =
            self.advertisements.values().cloned().collect();
        let mut every_node = BTreeSet::new();
        let view = self.view(&pools, &advertisements, &mut every_node);
        for ip in targets {
            let Some(services) = memo.holders.get(&ip) else {
                memo.ips.remove(&ip);
                memo.demands.remove(&ip);
                continue;
            };
            if stale.contains(&ip) || !memo.demands.contains_key(&ip) {
                let demand = demand_of(&self.services, services, |(ns, service)| {
                    let key = (ns.clone(), service.clone());
                    memo.slices_of
                        .get(&key)
                        .into_iter()
                        .flatten()
                        .filter_map(|slice| self.slices.get(&(ns.clone(), slice.clone())))
                        .flat_map(|slice| slice.ready_nodes.iter().cloned())
                        .collect()
                });
                memo.demands.insert(ip, demand);
            }
            let demand = &memo.demands[&ip];
            let order = memo
                .order
                .entry(ip)
                .or_insert_with(|| ElectionOrder::new(self.nodes.keys(), ip, ORDER_TOP));
            let Some(answer) = self.answer(view.elect_in_order(ip, demand, order)) else {
                memo.ips.remove(&ip);
                continue;
            };
            let unchanged = memo
                .ips
                .get(&ip)
                .is_some_and(|e| e.answer == answer && e.services == *services);
            if !unchanged {
                let services = services.clone();
                memo.ips.insert(ip, Arc::new(IpEntry { answer, services }));
            }
        }
        let answers = Answers {
            pools: self.pool_ranges(),
            ips: memo.ips.clone(),
        };
        self.memo = memo;
        answers
    }

    /// The same table computed from scratch, every node weighed for every address: the
    /// reference [`answers`](Self::answers) must equal, and the baseline of its benchmark.
    pub fn answers_full(&self) -> Answers {
        let pools: Vec<Pool> = self.pools.values().cloned().collect();
        let advertisements: Vec<L2AdvertisementSpec> =
            self.advertisements.values().cloned().collect();
        let mut every_node = BTreeSet::new();
        let view = self.view(&pools, &advertisements, &mut every_node);
        let mut ips = BTreeMap::new();
        for (ip, (demand, services)) in self.demands() {
            if let Some(answer) = self.answer(view.elect(ip, &demand)) {
                ips.insert(ip, Arc::new(IpEntry { answer, services }));
            }
        }
        Answers {
            pools: self.pool_ranges(),
            ips,
        }
    }
}

/// The Services holding each address.
fn holders_of(
    services: &BTreeMap<ServiceKey, ServiceFacts>,
) -> BTreeMap<IpAddr, BTreeSet<ServiceKey>> {
    let mut holders: BTreeMap<IpAddr, BTreeSet<ServiceKey>> = BTreeMap::new();
    for (key, facts) in services {
        for ip in &facts.ips {
            holders.entry(*ip).or_default().insert(key.clone());
        }
    }
    holders
}

/// What an address held by `holders` demands of its owner: a Cluster-policy Service is served
/// from any node; a Local one only from nodes with one of its Ready endpoints (`ready`), so the
/// address is answered where every Local Service sharing it has one.
fn demand_of(
    services: &BTreeMap<ServiceKey, ServiceFacts>,
    holders: &BTreeSet<ServiceKey>,
    ready: impl Fn(&ServiceKey) -> BTreeSet<String>,
) -> IpDemand {
    let mut demand = IpDemand::default();
    for key in holders {
        if !services.get(key).is_some_and(|facts| facts.local) {
            continue;
        }
        let local = ready(key);
        demand.endpoint_nodes = Some(match demand.endpoint_nodes.take() {
            None => local,
            Some(nodes) => nodes.intersection(&local).cloned().collect(),
        });
    }
    demand
}

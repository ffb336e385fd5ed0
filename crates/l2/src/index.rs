//! The announcer's index: a synchronous state machine fed one watch event at a time
//! (`apply_*`, `delete_*`, and `begin_*`/`finish_*` around a relist, `reset_*` for a whole
//! list) over IPPools, L2Advertisements, Nodes, Services and EndpointSlices, plus the live set
//! and the local interfaces that are up. Each call says whether the view changed;
//! [`L2Index::answers`] turns the view into the table of addresses this node answers for.
//!
//! Only what the election reads is kept. Objects that cannot be read are logged and skipped;
//! an invalid update of a pool or advertisement keeps the last valid one, so a typo does not
//! take working addresses off the LAN.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use berth_api::names::{class, label};
use berth_api::{IPPool, L2Advertisement, L2AdvertisementSpec};
use berth_core::TrafficPolicy;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::answers::{Answers, IpAnswer, IpEntry, ServiceKey};
use crate::election::{Election, ElectionView, IpDemand, NodeFacts, Pool};

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
            Ok(built) => put(&mut self.pools, key.1, Some(built)),
            Err(reason) => {
                tracing::warn!(pool = %key.1, %reason, "keeping the last valid version of an IPPool that cannot be read");
                false
            }
        }
    }

    pub fn delete_pool(&mut self, pool: &IPPool) -> bool {
        pool.metadata
            .name
            .as_ref()
            .is_some_and(|name| self.pools.remove(name).is_some())
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
        put(&mut self.advertisements, key.1, Some(adv.spec.clone()))
    }

    pub fn delete_advertisement(&mut self, adv: &L2Advertisement) -> bool {
        adv.metadata
            .name
            .as_ref()
            .is_some_and(|name| self.advertisements.remove(name).is_some())
    }

    pub fn apply_node(&mut self, node: &Node) -> bool {
        let Some(key) = cluster_key(node.metadata.name.as_ref()) else {
            return false;
        };
        self.seen(Kind::Nodes, &key);
        put(&mut self.nodes, key.1, Some(build_node_facts(node)))
    }

    pub fn delete_node(&mut self, node: &Node) -> bool {
        node.metadata
            .name
            .as_ref()
            .is_some_and(|name| self.nodes.remove(name).is_some())
    }

    pub fn apply_service(&mut self, svc: &Service) -> bool {
        let Some(key) = namespaced_key(svc.metadata.namespace.as_ref(), svc.metadata.name.as_ref())
        else {
            return false;
        };
        self.seen(Kind::Services, &key);
        put(&mut self.services, key, build_service_facts(svc))
    }

    pub fn delete_service(&mut self, svc: &Service) -> bool {
        namespaced_key(svc.metadata.namespace.as_ref(), svc.metadata.name.as_ref())
            .is_some_and(|key| self.services.remove(&key).is_some())
    }

    pub fn apply_slice(&mut self, slice: &EndpointSlice) -> bool {
        let Some(key) = namespaced_key(
            slice.metadata.namespace.as_ref(),
            slice.metadata.name.as_ref(),
        ) else {
            return false;
        };
        self.seen(Kind::Slices, &key);
        put(&mut self.slices, key, build_slice_facts(slice))
    }

    pub fn delete_slice(&mut self, slice: &EndpointSlice) -> bool {
        namespaced_key(
            slice.metadata.namespace.as_ref(),
            slice.metadata.name.as_ref(),
        )
        .is_some_and(|key| self.slices.remove(&key).is_some())
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
        match kind {
            Kind::Pools => retain_cluster(&mut self.pools, &seen),
            Kind::Advertisements => retain_cluster(&mut self.advertisements, &seen),
            Kind::Nodes => retain_cluster(&mut self.nodes, &seen),
            Kind::Services => retain(&mut self.services, &seen),
            Kind::Slices => retain(&mut self.slices, &seen),
        }
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
        true
    }

    /// The local interfaces that are up now.
    pub fn set_local_up(&mut self, up: BTreeSet<String>) -> bool {
        if self.local_up == up {
            return false;
        }
        self.local_up = up;
        true
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
        let mut ready: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
        for ((ns, _), slice) in &self.slices {
            ready
                .entry((ns.as_str(), slice.service.as_str()))
                .or_default()
                .extend(slice.ready_nodes.iter().map(String::as_str));
        }
        let mut demands: BTreeMap<IpAddr, (IpDemand, BTreeSet<ServiceKey>)> = BTreeMap::new();
        for (key, facts) in &self.services {
            for ip in &facts.ips {
                let (demand, services) = demands.entry(*ip).or_default();
                services.insert(key.clone());
                if !facts.local {
                    // A Cluster-policy Service is served from any node: no constraint.
                    continue;
                }
                // A Local one only from nodes with one of its Ready endpoints: the address is
                // answered where every Local Service sharing it has one.
                let local: BTreeSet<String> = ready
                    .get(&(key.0.as_str(), key.1.as_str()))
                    .into_iter()
                    .flatten()
                    .map(|n| n.to_string())
                    .collect();
                demand.endpoint_nodes = Some(match demand.endpoint_nodes.take() {
                    None => local,
                    Some(nodes) => nodes.intersection(&local).cloned().collect(),
                });
            }
        }
        demands
    }

    /// The table of addresses this node answers for. Each address is elected once, however
    /// many Services share it.
    pub fn answers(&self) -> Answers {
        let pools: Vec<Pool> = self.pools.values().cloned().collect();
        let advertisements: Vec<L2AdvertisementSpec> =
            self.advertisements.values().cloned().collect();
        let every_node: BTreeSet<String>;
        let live = match &self.live {
            Some(live) => live.as_ref(),
            None => {
                every_node = self.nodes.keys().cloned().collect();
                &every_node
            }
        };
        let view = ElectionView {
            pools: &pools,
            advertisements: &advertisements,
            nodes: &self.nodes,
            live,
            local: &self.node,
            local_up: &self.local_up,
        };
        let mut ips = BTreeMap::new();
        for (ip, (demand, services)) in self.demands() {
            let answer = match view.elect(ip, &demand) {
                Election::NotInPool => continue,
                Election::NotAdvertised => IpAnswer::NotAdvertised,
                Election::NoCandidate => IpAnswer::Elsewhere { owner: None },
                Election::Owner { node, interfaces } if node == self.node => {
                    IpAnswer::Owned(interfaces)
                }
                Election::Owner { node, .. } => IpAnswer::Elsewhere { owner: Some(node) },
            };
            ips.insert(ip, IpEntry { answer, services });
        }
        Answers {
            pools: pools
                .iter()
                .flat_map(|p| p.ranges.iter().copied())
                .collect(),
            ips,
        }
    }
}

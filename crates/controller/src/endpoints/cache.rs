//! The controller's view of the cluster, fed by watch events: a synchronous state machine that
//! answers two questions fast — which Services a change touches, and what a Service's sync needs.
//! Pods and Services are indexed by label so neither question scans a namespace.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_endpoints::{
    NodeZones, LABEL_MANAGED_BY, LABEL_SERVICE_NAME, LABEL_TOPOLOGY_ZONE, MANAGED_BY_BERTH,
};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::intern::Interner;
use super::key::ObjectKey;
use super::pod_facts::PodFacts;
use super::pod_slab::PodSlab;
use super::stored::{StoredEndpoints, StoredSlice};
use super::tracker::{Expectations, Seen, Target};

/// One label of one namespace: `(namespace, key, value)`.
type LabelKey = (String, String, String);

fn label_key(namespace: &str, k: &str, v: &str) -> LabelKey {
    (namespace.to_owned(), k.to_owned(), v.to_owned())
}

/// The selector of a Service that gets endpoints; `None` for one left alone.
fn selector_of(service: &Service) -> Option<&BTreeMap<String, String>> {
    let spec = service.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    spec.selector.as_ref().filter(|s| !s.is_empty())
}

/// `labels` sorted by key, as [`PodFacts`] keeps them.
fn selects(selector: &BTreeMap<String, String>, labels: &[(Arc<str>, Arc<str>)]) -> bool {
    selector.iter().all(|(k, v)| {
        labels
            .binary_search_by(|(key, _)| (**key).cmp(k.as_str()))
            .is_ok_and(|i| *labels[i].1 == **v)
    })
}

/// Whether two versions of a Service can give different endpoints. Status and most metadata
/// (the load-balancer controller's writes, resourceVersion) cannot.
fn same_for_endpoints(a: &Service, b: &Service) -> bool {
    // The fields `berth-endpoints` reads (its `ServiceView`), and the deletion mark.
    fn read(s: &Service) -> impl PartialEq + '_ {
        let spec = s.spec.as_ref();
        let annotation = |key: &str| s.metadata.annotations.as_ref().and_then(|a| a.get(key));
        (
            (
                &s.metadata.uid,
                &s.metadata.labels,
                &s.metadata.deletion_timestamp,
                annotation(berth_endpoints::ANNOTATION_TOPOLOGY_MODE),
                annotation(berth_endpoints::ANNOTATION_TOPOLOGY_AWARE_HINTS),
            ),
            spec.map(|s| {
                (
                    &s.type_,
                    &s.selector,
                    &s.ip_families,
                    &s.publish_not_ready_addresses,
                    &s.ports,
                    &s.cluster_ip,
                    &s.traffic_distribution,
                )
            }),
        )
    }
    read(a) == read(b)
}

/// Adds a pod's labels to the label index, or takes them out.
fn index_pod(index: &mut HashMap<LabelKey, HashSet<u32>>, id: u32, facts: &PodFacts, add: bool) {
    for (k, v) in facts.labels.iter() {
        let label = label_key(&facts.namespace, k, v);
        if add {
            index.entry(label).or_default().insert(id);
        } else if let Some(set) = index.get_mut(&label) {
            set.remove(&id);
            if set.is_empty() {
                index.remove(&label);
            }
        }
    }
}

/// Everything one Service's sync reads, copied out so that the sync runs without the lock.
#[derive(Debug, Clone)]
pub(crate) struct Inputs {
    pub(crate) service: Option<Arc<Service>>,
    /// The pods its selector matches (rebuilt from their facts).
    pub(crate) pods: Vec<Pod>,
    pub(crate) nodes: Arc<NodeZones>,
    /// The slices berth manages for a Service of this name.
    pub(crate) slices: Vec<EndpointSlice>,
    pub(crate) endpoints: Option<Arc<StoredEndpoints>>,
    /// The newest change that made this sync necessary, when one was seen.
    pub(crate) trigger: Option<DateTime<Utc>>,
}

/// The caches and indexes. Every `apply_*` / `delete_*` returns the Services to sync.
#[derive(Debug)]
pub(crate) struct Cache {
    services: HashMap<ObjectKey, Arc<Service>>,
    /// Services by the first pair of their selector: any pod they select carries that pair.
    services_by_label: HashMap<LabelKey, HashSet<ObjectKey>>,
    pods: PodSlab,
    pods_by_label: HashMap<LabelKey, HashSet<u32>>,
    node_zones: BTreeMap<String, Option<String>>,
    nodes: Arc<NodeZones>,
    /// Slices by the Service named in their label, and the reverse, for relabels and deletes.
    /// A Service has few slices: a list, where a map's first node would have room for eleven.
    slices: HashMap<ObjectKey, Vec<StoredSlice>>,
    slice_service: HashMap<ObjectKey, ObjectKey>,
    endpoints: HashMap<ObjectKey, Arc<StoredEndpoints>>,
    triggers: HashMap<ObjectKey, DateTime<Utc>>,
    expectations: Expectations,
    /// Shared node, zone and namespace names of the slices' endpoints.
    interner: Interner,
    /// Change times are recorded only once the first full view exists: before that every Service
    /// is synced anyway, and no single change caused it.
    record_triggers: bool,
}

impl Cache {
    pub(crate) fn new(expectation_timeout: Duration) -> Self {
        Cache {
            services: HashMap::new(),
            services_by_label: HashMap::new(),
            pods: PodSlab::default(),
            pods_by_label: HashMap::new(),
            node_zones: BTreeMap::new(),
            nodes: Arc::new(NodeZones::new()),
            slices: HashMap::new(),
            slice_service: HashMap::new(),
            endpoints: HashMap::new(),
            triggers: HashMap::new(),
            expectations: Expectations::new(expectation_timeout),
            interner: Interner::default(),
            record_triggers: false,
        }
    }

    pub(crate) fn start_recording_triggers(&mut self) {
        self.record_triggers = true;
    }

    fn triggered(&mut self, keys: &[ObjectKey], at: DateTime<Utc>) {
        if !self.record_triggers {
            return;
        }
        for key in keys {
            let t = self.triggers.entry(key.clone()).or_insert(at);
            *t = (*t).max(at);
        }
    }

    /// Every Service with a selector, and every Service name berth still has slices for.
    pub(crate) fn all_keys(&self) -> Vec<ObjectKey> {
        let mut keys: Vec<ObjectKey> = self
            .services
            .iter()
            .filter(|(_, s)| selector_of(s).is_some())
            .map(|(k, _)| k.clone())
            .chain(self.slices.keys().cloned())
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    // ---- Services -------------------------------------------------------------------------

    fn index_service(&mut self, key: &ObjectKey, service: &Service, add: bool) {
        let Some((k, v)) = selector_of(service).and_then(|s| s.iter().next()) else {
            return;
        };
        let label = label_key(&key.namespace, k, v);
        if add {
            self.services_by_label
                .entry(label)
                .or_default()
                .insert(key.clone());
        } else if let Some(set) = self.services_by_label.get_mut(&label) {
            set.remove(key);
            if set.is_empty() {
                self.services_by_label.remove(&label);
            }
        }
    }

    pub(crate) fn apply_service(
        &mut self,
        service: Arc<Service>,
        at: DateTime<Utc>,
    ) -> Vec<ObjectKey> {
        let key = ObjectKey::of(&service.metadata);
        let changed = match self.services.get(&key) {
            Some(old) if same_for_endpoints(old, &service) => false,
            Some(old) => {
                let old = old.clone();
                self.index_service(&key, &old, false);
                true
            }
            None => true,
        };
        if changed {
            self.index_service(&key, &service, true);
        }
        self.services.insert(key.clone(), service);
        if !changed {
            return Vec::new();
        }
        let keys = vec![key];
        self.triggered(&keys, at);
        keys
    }

    pub(crate) fn delete_service(&mut self, key: &ObjectKey, at: DateTime<Utc>) -> Vec<ObjectKey> {
        if let Some(old) = self.services.remove(key) {
            self.index_service(key, &old, false);
        }
        let keys = vec![key.clone()];
        self.triggered(&keys, at);
        keys
    }

    pub(crate) fn reset_services(&mut self, services: Vec<Arc<Service>>) -> Vec<ObjectKey> {
        let before: Vec<ObjectKey> = self.services.keys().cloned().collect();
        self.services.clear();
        self.services_by_label.clear();
        let mut keys = before;
        // A re-list shows state, not changes: it carries no trigger time.
        let recording = std::mem::replace(&mut self.record_triggers, false);
        for service in services {
            keys.extend(self.apply_service(service, Utc::now()));
        }
        self.record_triggers = recording;
        keys.sort();
        keys.dedup();
        keys
    }

    /// Services whose selector matches `labels` in `namespace`.
    fn services_selecting(
        &self,
        namespace: &str,
        labels: &[(Arc<str>, Arc<str>)],
    ) -> Vec<ObjectKey> {
        let mut out = Vec::new();
        for (k, v) in labels {
            let Some(candidates) = self.services_by_label.get(&label_key(namespace, k, v)) else {
                continue;
            };
            for key in candidates {
                let matched = self
                    .services
                    .get(key)
                    .and_then(|s| selector_of(s))
                    .is_some_and(|sel| selects(sel, labels));
                if matched {
                    out.push(key.clone());
                }
            }
        }
        out
    }

    // ---- Pods -----------------------------------------------------------------------------

    fn remove_pod(&mut self, key: &ObjectKey) -> Option<PodFacts> {
        let (id, old) = self.pods.remove(&key.namespace, &key.name)?;
        index_pod(&mut self.pods_by_label, id, &old, false);
        Some(old)
    }

    fn insert_pod(&mut self, facts: PodFacts) {
        let id = self.pods.insert(facts);
        if let Some(facts) = self.pods.get(id) {
            index_pod(&mut self.pods_by_label, id, facts, true);
        }
    }

    /// The Services of the old and the new labels: a pod that stops matching leaves them.
    pub(crate) fn apply_pod(&mut self, facts: PodFacts, at: DateTime<Utc>) -> Vec<ObjectKey> {
        let key = ObjectKey::new(&*facts.namespace, &*facts.name);
        let unchanged = self
            .pods
            .find(&key.namespace, &key.name)
            .is_some_and(|old| *old == facts);
        if unchanged {
            return Vec::new();
        }
        let mut keys = match self.remove_pod(&key) {
            Some(old) => self.services_selecting(&old.namespace, &old.labels),
            None => Vec::new(),
        };
        keys.extend(self.services_selecting(&facts.namespace, &facts.labels));
        self.insert_pod(facts);
        keys.sort();
        keys.dedup();
        self.triggered(&keys, at);
        keys
    }

    pub(crate) fn delete_pod(&mut self, key: &ObjectKey, at: DateTime<Utc>) -> Vec<ObjectKey> {
        let keys = match self.remove_pod(key) {
            Some(old) => self.services_selecting(&old.namespace, &old.labels),
            None => Vec::new(),
        };
        self.triggered(&keys, at);
        keys
    }

    pub(crate) fn reset_pods(&mut self, pods: Vec<PodFacts>) -> Vec<ObjectKey> {
        self.pods.reset(pods.len());
        self.pods_by_label.clear();
        for facts in pods {
            self.insert_pod(facts);
        }
        self.all_keys()
    }

    fn pods_of(&self, namespace: &str, selector: &BTreeMap<String, String>) -> Vec<Pod> {
        // The rarest pair of the selector bounds the candidates.
        let smallest = selector
            .iter()
            .map(|(k, v)| self.pods_by_label.get(&label_key(namespace, k, v)))
            .min_by_key(|set| set.map_or(0, HashSet::len));
        let Some(Some(candidates)) = smallest else {
            return Vec::new();
        };
        let mut pods: Vec<&PodFacts> = candidates
            .iter()
            .filter_map(|id| self.pods.get(*id))
            .filter(|p| selects(selector, &p.labels))
            .collect();
        // Hash order must not leak into which of two pods claiming one address wins.
        pods.sort_by(|a, b| a.name.cmp(&b.name));
        pods.into_iter().map(PodFacts::to_pod).collect()
    }

    // ---- Nodes ----------------------------------------------------------------------------

    fn zone_of(node: &Node) -> Option<String> {
        node.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_TOPOLOGY_ZONE))
            .cloned()
    }

    fn rebuild_zones(&mut self) -> Vec<ObjectKey> {
        let mut zones = NodeZones::new();
        for (node, zone) in &self.node_zones {
            zones.insert(node.clone(), zone.clone());
        }
        self.nodes = Arc::new(zones);
        // Nodes come and go rarely; a change reaches pods of any Service.
        self.all_keys()
    }

    pub(crate) fn apply_node(&mut self, node: &Node) -> Vec<ObjectKey> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let zone = Self::zone_of(node);
        if self.node_zones.get(&name) == Some(&zone) {
            return Vec::new();
        }
        self.node_zones.insert(name, zone);
        self.rebuild_zones()
    }

    pub(crate) fn delete_node(&mut self, name: &str) -> Vec<ObjectKey> {
        if self.node_zones.remove(name).is_none() {
            return Vec::new();
        }
        self.rebuild_zones()
    }

    pub(crate) fn reset_nodes(&mut self, nodes: &[Node]) -> Vec<ObjectKey> {
        self.node_zones = nodes
            .iter()
            .map(|n| {
                (
                    n.metadata.name.clone().unwrap_or_default(),
                    Self::zone_of(n),
                )
            })
            .collect();
        self.rebuild_zones()
    }

    // ---- EndpointSlices (berth's own, as the watch selects) -------------------------------

    /// Whether berth manages `slice`. The watch selects only berth's slices; the cache checks
    /// again, so that it never plans with a slice it does not own whatever feeds it.
    fn is_berth_slice(slice: &EndpointSlice) -> bool {
        slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_MANAGED_BY))
            .is_some_and(|v| v == MANAGED_BY_BERTH)
    }

    /// The Service a berth slice belongs to; `None` for anyone else's slice.
    fn service_of_slice(slice: &EndpointSlice) -> Option<ObjectKey> {
        if !Self::is_berth_slice(slice) {
            return None;
        }
        let service = slice.metadata.labels.as_ref()?.get(LABEL_SERVICE_NAME)?;
        Some(ObjectKey::new(
            slice.metadata.namespace.as_deref().unwrap_or("default"),
            service.clone(),
        ))
    }

    fn forget_slice(&mut self, slice_key: &ObjectKey) -> Option<ObjectKey> {
        let service = self.slice_service.remove(slice_key)?;
        if let Some(slices) = self.slices.get_mut(&service) {
            slices.retain(|s| s.metadata.name() != slice_key.name);
            if slices.is_empty() {
                self.slices.remove(&service);
            }
        }
        Some(service)
    }

    /// The Service the slice belongs to (and the one it left, if relabelled or handed to another
    /// manager), unless the event only shows the controller's own write.
    pub(crate) fn apply_slice(&mut self, slice: EndpointSlice) -> Vec<ObjectKey> {
        let slice_key = ObjectKey::of(&slice.metadata);
        let previous = self.forget_slice(&slice_key);
        let service = Self::service_of_slice(&slice);
        let mut keys = Vec::new();
        if let Some(service) = &service {
            let target = Target::Slice(slice_key.name.clone());
            let seen = self.expectations.observe(
                service,
                &target,
                slice.metadata.resource_version.as_deref(),
            );
            if seen == Seen::Other {
                keys.push(service.clone());
            }
            self.slice_service
                .insert(slice_key.clone(), service.clone());
            let slices = self.slices.entry(service.clone()).or_default();
            slices.push(StoredSlice::new(slice, &mut self.interner));
            // A first push reserves room for four; most Services have one slice.
            slices.shrink_to_fit();
        }
        if let Some(previous) = previous.filter(|p| Some(p) != service.as_ref()) {
            keys.push(previous);
        }
        keys
    }

    pub(crate) fn delete_slice(&mut self, slice: &EndpointSlice) -> Vec<ObjectKey> {
        let slice_key = ObjectKey::of(&slice.metadata);
        let Some(service) = self.forget_slice(&slice_key) else {
            return Vec::new();
        };
        let target = Target::Slice(slice_key.name.clone());
        match self.expectations.observe(&service, &target, None) {
            Seen::OwnWrite => Vec::new(),
            Seen::Other => vec![service],
        }
    }

    pub(crate) fn reset_slices(&mut self, slices: Vec<EndpointSlice>) -> Vec<ObjectKey> {
        let mut keys: Vec<ObjectKey> = self.slices.keys().cloned().collect();
        self.slices.clear();
        self.slice_service.clear();
        self.expectations.clear();
        for slice in slices {
            keys.extend(self.apply_slice(slice));
        }
        keys.sort();
        keys.dedup();
        keys
    }

    // ---- Endpoints ------------------------------------------------------------------------

    /// Endpoints changed by someone else bring back their Service's content; Endpoints without a
    /// Service are not berth's business.
    pub(crate) fn apply_endpoints(&mut self, endpoints: Endpoints) -> Vec<ObjectKey> {
        let key = ObjectKey::of(&endpoints.metadata);
        let seen = self.expectations.observe(
            &key,
            &Target::Endpoints,
            endpoints.metadata.resource_version.as_deref(),
        );
        self.endpoints
            .insert(key.clone(), Arc::new(StoredEndpoints::from(endpoints)));
        if seen == Seen::Other && self.services.contains_key(&key) {
            vec![key]
        } else {
            Vec::new()
        }
    }

    pub(crate) fn delete_endpoints(&mut self, key: &ObjectKey) -> Vec<ObjectKey> {
        self.endpoints.remove(key);
        let seen = self.expectations.observe(key, &Target::Endpoints, None);
        if seen == Seen::Other && self.services.contains_key(key) {
            vec![key.clone()]
        } else {
            Vec::new()
        }
    }

    pub(crate) fn reset_endpoints(&mut self, all: Vec<Endpoints>) -> Vec<ObjectKey> {
        self.endpoints.clear();
        self.expectations.clear();
        let mut keys = Vec::new();
        for endpoints in all {
            keys.extend(self.apply_endpoints(endpoints));
        }
        keys
    }

    // ---- Syncing --------------------------------------------------------------------------

    /// Records a write (or delete) the caches must show before `service` is synced again.
    pub(crate) fn expect(
        &mut self,
        service: &ObjectKey,
        target: Target,
        resource_version: Option<&str>,
        deleted: bool,
        now: Instant,
    ) {
        let cached: Option<Option<&str>> = match &target {
            Target::Endpoints => self
                .endpoints
                .get(service)
                .map(|e| e.metadata.resource_version()),
            Target::Slice(name) => self
                .slices
                .get(service)
                .and_then(|s| s.iter().find(|s| s.metadata.name() == name))
                .map(|s| s.metadata.resource_version()),
        };
        self.expectations
            .expect(service, target, resource_version, deleted, cached, now);
    }

    pub(crate) fn is_settled(&mut self, service: &ObjectKey, now: Instant) -> bool {
        self.expectations.is_settled(service, now)
    }

    /// The inputs of one sync; the trigger time is handed over with them.
    pub(crate) fn take_inputs(&mut self, key: &ObjectKey) -> Inputs {
        let service = self.services.get(key).cloned();
        let pods = service
            .as_deref()
            .and_then(selector_of)
            .map(|sel| self.pods_of(&key.namespace, sel))
            .unwrap_or_default();
        let slices = self
            .slices
            .get(key)
            .map(|s| s.iter().map(StoredSlice::to_slice).collect())
            .unwrap_or_default();
        Inputs {
            service,
            pods,
            nodes: self.nodes.clone(),
            slices,
            endpoints: self.endpoints.get(key).cloned(),
            trigger: self.triggers.remove(key),
        }
    }

    /// Gives back the trigger of a failed sync, so the retry still reports it.
    pub(crate) fn restore_trigger(&mut self, key: &ObjectKey, at: Option<DateTime<Utc>>) {
        if let Some(at) = at {
            let t = self.triggers.entry(key.clone()).or_insert(at);
            *t = (*t).max(at);
        }
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;

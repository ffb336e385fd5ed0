//! The agent's index: a synchronous state machine fed one watch event at a time (`apply_*`,
//! `delete_*`, `reset_*` per object kind). It keeps the node's [`NodeView`] up to date and
//! collects, until the sync loop takes them, the Services whose ports changed, the trigger times
//! of the EndpointSlice changes behind them and the conntrack entries they made stale.
//!
//! Only what the datapath reads is kept: the view's ports, and each slice's endpoints already
//! converted per port. A relist is streamed (`begin_*`, `apply_*` per listed object, `finish_*`)
//! so a 10,000-object list is never held whole; `reset_*` does all three for one list. Objects
//! that cannot be read are logged and skipped.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use berth_api::names::{annotation, label};
use berth_api::{check_service_size, PortSize};
use berth_core::{PortRange, Protocol};
use berth_datapath::plan::convert::{
    build_endpoints_with, build_node_info, build_service_ports_with, NodeNames, ProxyMode,
    ServicePolicy,
};
use berth_datapath::{EndpointList, NodeInfo, NodeView, ServicePort, ServicePortName};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::conntrack::{plan_conntrack_cleanup, ConntrackFlow};
use crate::node_ports::{admit_node_ports, uses_node_port, Refusal};

/// Services by namespace then name: lookups borrow `&str` without building a key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangedServices(BTreeMap<String, BTreeSet<String>>);

impl ChangedServices {
    pub fn insert(&mut self, namespace: &str, name: &str) {
        if let Some(names) = self.0.get_mut(namespace) {
            names.insert(name.to_string());
        } else {
            self.0
                .insert(namespace.to_string(), BTreeSet::from([name.to_string()]));
        }
    }

    pub fn contains(&self, namespace: &str, name: &str) -> bool {
        self.0
            .get(namespace)
            .is_some_and(|names| names.contains(name))
    }

    pub fn contains_port(&self, port: &ServicePortName) -> bool {
        self.contains(&port.namespace, &port.name)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.values().map(BTreeSet::len).sum()
    }

    /// `namespace/name` of every changed Service, in order.
    pub fn names(&self) -> Vec<String> {
        self.0
            .iter()
            .flat_map(|(ns, names)| names.iter().map(move |name| format!("{ns}/{name}")))
            .collect()
    }

    pub fn extend(&mut self, other: ChangedServices) {
        for (namespace, names) in other.0 {
            self.0.entry(namespace).or_default().extend(names);
        }
    }
}

/// What changed since the last [`Index::take_pending`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    pub services: ChangedServices,
    /// The Node's addresses or presence changed: every Service's plan may differ.
    pub node: bool,
    /// The cluster's Service CIDRs changed: every family's plan starts over.
    pub service_cidrs: bool,
    /// `last-change-trigger-time` of slice changes made after the index was created.
    pub triggers: Vec<DateTime<Utc>>,
    pub conntrack: Vec<ConntrackFlow>,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
            && !self.node
            && !self.service_cidrs
            && self.triggers.is_empty()
            && self.conntrack.is_empty()
    }

    /// Folds in `later`, for work carried over a failed sync.
    pub fn merge(&mut self, later: Pending) {
        self.services.extend(later.services);
        self.node |= later.node;
        self.service_cidrs |= later.service_cidrs;
        self.triggers.extend(later.triggers);
        self.conntrack.extend(later.conntrack);
        self.conntrack.sort();
        self.conntrack.dedup();
    }
}

type SliceKey = (String, String);

/// One port of one slice with its endpoints, as [`build_endpoints`] reads them.
#[derive(Debug, Clone)]
struct SlicePort {
    name: String,
    protocol: Protocol,
    /// Without duplicate addresses; the Service port it feeds alone shares it.
    endpoints: EndpointList,
}

#[derive(Debug, Clone)]
struct SliceEntry {
    /// The Service it belongs to (`kubernetes.io/service-name`), if labelled.
    service: Option<String>,
    trigger: Option<String>,
    ports: Box<[SlicePort]>,
}

/// One Service's slice names, sorted: nearly always one, where a `BTreeSet` allocates a node
/// for eleven (2.8 MB at 10,000 Services).
#[derive(Debug, Clone, Default)]
struct SliceNames(Vec<String>);

impl SliceNames {
    fn insert(&mut self, name: &str) {
        if let Err(at) = self.0.binary_search_by(|known| known.as_str().cmp(name)) {
            self.0.reserve_exact(1);
            self.0.insert(at, name.to_string());
        }
    }

    fn remove(&mut self, name: &str) {
        if let Ok(at) = self.0.binary_search_by(|known| known.as_str().cmp(name)) {
            self.0.remove(at);
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn iter(&self) -> impl Iterator<Item = &String> {
        self.0.iter()
    }
}

/// Ports of Services listed so far in a relist, without endpoints, by (namespace, name).
type Staged = BTreeMap<SliceKey, Vec<ServicePort>>;

#[derive(Debug, Clone)]
pub struct Index {
    node_name: String,
    mode: ProxyMode,
    /// Node ports outside it are not programmed (see [`crate::node_ports`]).
    node_port_range: PortRange,
    /// Set from the own Node on every change (see [`crate::schedule::node_eligible`]).
    node_eligibility: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// Trigger times before this are from before the agent watched, so not its latency.
    started: DateTime<Utc>,
    view: NodeView,
    slices: HashMap<SliceKey, SliceEntry>,
    /// Every endpoint's node name, held once (see [`NodeNames`]).
    node_names: NodeNames,
    /// Slice names by (namespace, Service name).
    slices_by_service: HashMap<SliceKey, SliceNames>,
    pending: Pending,
    /// Which kinds have been listed completely: syncing before all are would remove the rules
    /// of Services not yet seen.
    listed: Listed,
    relist_services: Option<Staged>,
    relist_slices: Option<HashSet<SliceKey>>,
    /// During a Node relist: whether our Node was in it.
    relist_node: Option<bool>,
    /// What Services may ask of this node (`--external-ip-cidrs`, `--max-service-*`).
    policy: ServicePolicy,
    /// Services over a size bound (see [`Index::admit_size`]): their ports without endpoints,
    /// kept so a slice change that brings one back within bounds programs it again.
    refused: HashMap<SliceKey, Vec<ServicePort>>,
    /// The Node's labels and whether it may announce, for the BGP speaker; `None` while the
    /// Node is unknown.
    node_state: Option<berth_bgp::NodeState>,
    /// The cluster's Service CIDRs (ServiceCIDR objects, else `--service-cidr`).
    service_cidrs: crate::service_cidrs::ServiceCidrs,
}

#[derive(Debug, Clone, Copy, Default)]
struct Listed {
    services: bool,
    slices: bool,
    node: bool,
}

fn sort_ports(ports: &mut [ServicePort]) {
    ports.sort_by(|a, b| (&a.name, a.protocol).cmp(&(&b.name, b.protocol)));
}

/// Records a Service whose ports go from `old` to `new`; false when they are the same.
fn note_change(
    pending: &mut Pending,
    namespace: &str,
    name: &str,
    old: &[ServicePort],
    new: &[ServicePort],
) -> bool {
    if old == new {
        return false;
    }
    pending.conntrack.extend(plan_conntrack_cleanup(old, new));
    pending.services.insert(namespace, name);
    true
}

fn log_refusals(namespace: &str, name: &str, refusals: &[Refusal]) {
    for refusal in refusals {
        tracing::warn!(%namespace, %name, port = %refusal.port_name, "not programmed: {refusal}");
    }
}

fn meta_key(meta: &ObjectMeta) -> Option<SliceKey> {
    Some((meta.namespace.clone()?, meta.name.clone()?))
}

fn service_of(slice: &EndpointSlice) -> Option<String> {
    slice
        .metadata
        .labels
        .as_ref()?
        .get(label::ENDPOINTSLICE_SERVICE_NAME)
        .cloned()
}

/// A slice's endpoints per port, converted once: a few dozen bytes per endpoint instead of the
/// whole object.
fn compact_slice(slice: &EndpointSlice, nodes: &mut NodeNames) -> Box<[SlicePort]> {
    let mut ports: Vec<SlicePort> = Vec::new();
    for port in slice.ports.iter().flatten() {
        let Some(protocol) = Protocol::from_spec(port.protocol.as_deref()) else {
            continue;
        };
        let name = port.name.clone().unwrap_or_default();
        if ports
            .iter()
            .any(|p| p.name == name && p.protocol == protocol)
        {
            continue;
        }
        let endpoints = build_endpoints_with(&[slice], &name, protocol, nodes);
        ports.push(SlicePort {
            name,
            protocol,
            endpoints,
        });
    }
    ports.into_boxed_slice()
}

impl Index {
    /// An empty index for `node_name`; `started` is when the agent began watching.
    pub fn new(node_name: &str, mode: ProxyMode, started: DateTime<Utc>) -> Self {
        Index {
            node_name: node_name.to_string(),
            mode,
            node_port_range: PortRange::DEFAULT,
            node_eligibility: None,
            started,
            view: NodeView {
                node: NodeInfo {
                    name: node_name.to_string(),
                    addresses: Vec::new(),
                    zone: None,
                },
                services: Vec::new(),
            },
            slices: HashMap::new(),
            node_names: NodeNames::default(),
            slices_by_service: HashMap::new(),
            pending: Pending::default(),
            listed: Listed::default(),
            relist_services: None,
            relist_slices: None,
            relist_node: None,
            policy: ServicePolicy::default(),
            refused: HashMap::new(),
            node_state: None,
            service_cidrs: crate::service_cidrs::ServiceCidrs::default(),
        }
    }

    /// The Service CIDRs to use until ServiceCIDR objects are listed (for good on a cluster
    /// without the kind): the agent's `--service-cidr`. [`Index::new`] has none.
    pub fn with_service_cidrs(mut self, fallback: Vec<ipnet::IpNet>) -> Self {
        self.service_cidrs = crate::service_cidrs::ServiceCidrs::new(fallback);
        self
    }

    /// The cluster's Service CIDRs, both families.
    pub fn service_cidrs(&self) -> &[ipnet::IpNet] {
        self.service_cidrs.current()
    }

    fn note_service_cidrs(&mut self, changed: bool) {
        self.pending.service_cidrs |= changed;
    }

    pub fn apply_service_cidr(&mut self, object: &ServiceCIDR) {
        let changed = self.service_cidrs.apply(object);
        self.note_service_cidrs(changed);
    }

    pub fn delete_service_cidr(&mut self, object: &ServiceCIDR) {
        let changed = self.service_cidrs.delete(object);
        self.note_service_cidrs(changed);
    }

    pub fn begin_service_cidrs(&mut self) {
        self.service_cidrs.begin();
    }

    pub fn finish_service_cidrs(&mut self) {
        let changed = self.service_cidrs.finish();
        self.note_service_cidrs(changed);
    }

    /// The index under `policy`; [`Index::new`] allows no external IP.
    pub fn with_policy(mut self, policy: ServicePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Node ports outside `range` are not programmed; the default is Kubernetes' 30000-32767.
    pub fn with_node_port_range(mut self, range: PortRange) -> Self {
        self.node_port_range = range;
        self
    }

    /// Keeps `flag` set to whether the own Node is eligible for load-balancer traffic, for
    /// `/healthz`.
    pub fn with_node_eligibility(
        mut self,
        flag: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> Self {
        self.node_eligibility = Some(flag);
        self
    }

    fn note_eligibility(&self, eligible: bool) {
        if let Some(flag) = &self.node_eligibility {
            flag.store(eligible, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The Node's labels and eligibility for announcing, once it has been seen.
    pub fn node_state(&self) -> Option<&berth_bgp::NodeState> {
        self.node_state.as_ref()
    }

    /// Whether Services, EndpointSlices and the Node have each been listed once.
    pub fn is_listed(&self) -> bool {
        self.listed.services && self.listed.slices && self.listed.node
    }

    /// The node's current view; its Service ports are sorted by namespace and name.
    pub fn view(&self) -> &NodeView {
        &self.view
    }

    pub fn take_pending(&mut self) -> Pending {
        std::mem::take(&mut self.pending)
    }

    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Where the ports of one Service sit in the sorted view.
    fn range_of(&self, namespace: &str, name: &str) -> std::ops::Range<usize> {
        let services = &self.view.services;
        let key = (namespace, name);
        let start =
            services.partition_point(|p| (p.name.namespace.as_str(), p.name.name.as_str()) < key);
        let end =
            services.partition_point(|p| (p.name.namespace.as_str(), p.name.name.as_str()) <= key);
        start..end
    }

    /// Fills each port's endpoints from the Service's slices, in slice-name order, keeping the
    /// first of duplicate addresses: what [`build_endpoints`] does over all slices at once. A
    /// port fed by one slice shares that slice's list (it holds no duplicates).
    fn with_endpoints(&self, namespace: &str, name: &str, ports: &mut [ServicePort]) {
        let key = (namespace.to_string(), name.to_string());
        let slices: Vec<&SliceEntry> = self
            .slices_by_service
            .get(&key)
            .into_iter()
            .flat_map(SliceNames::iter)
            .filter_map(|slice| self.slices.get(&(namespace.to_string(), slice.clone())))
            .collect();
        for port in ports.iter_mut() {
            let sources: Vec<&EndpointList> = slices
                .iter()
                .filter_map(|entry| {
                    entry
                        .ports
                        .iter()
                        .find(|p| p.name == port.name.port && p.protocol == port.protocol)
                })
                .map(|p| &p.endpoints)
                .collect();
            port.endpoints = match sources.as_slice() {
                [] => EndpointList::default(),
                [only] => (*only).clone(),
                several => {
                    let mut seen: HashSet<(IpAddr, u16)> = HashSet::new();
                    several
                        .iter()
                        .flat_map(|list| list.iter())
                        .filter(|ep| seen.insert((ep.ip, ep.port)))
                        .cloned()
                        .collect()
                }
            };
        }
    }

    /// Puts `ports` in place of the Service's current ones; a change is recorded only when they
    /// differ.
    fn replace(&mut self, namespace: &str, name: &str, mut ports: Vec<ServicePort>) {
        sort_ports(&mut ports);
        let range = self.range_of(namespace, name);
        let old = &self.view.services[range.clone()];
        if note_change(&mut self.pending, namespace, name, old, &ports) {
            self.view.services.splice(range, ports);
        }
    }

    /// The ports a Service should have, without endpoints; `None` when it cannot be read.
    fn service_ports(
        &self,
        svc: &Service,
        namespace: &str,
        name: &str,
    ) -> Option<Vec<ServicePort>> {
        if !berth_datapath::plan::convert::is_proxied(svc, self.mode) {
            return Some(Vec::new());
        }
        match build_service_ports_with(svc, &[], &self.policy) {
            Ok((mut ports, dropped)) => {
                for d in &dropped {
                    tracing::warn!(%namespace, %name, entry = %d, "left out of the Service's datapath");
                }
                sort_ports(&mut ports);
                Some(ports)
            }
            Err(err) => {
                tracing::warn!(%namespace, %name, error = %err, "skipping a Service that cannot be read");
                None
            }
        }
    }

    pub fn apply_service(&mut self, svc: &Service) {
        let Some((namespace, name)) = meta_key(&svc.metadata) else {
            return;
        };
        // `None`: keep what was programmed, a bad update must not take a working Service down.
        let ports = self.service_ports(svc, &namespace, &name);
        if self.relist_services.is_some() {
            let ports = ports
                .unwrap_or_else(|| self.view.services[self.range_of(&namespace, &name)].to_vec());
            if let Some(staged) = &mut self.relist_services {
                staged.insert((namespace, name), ports);
            }
            return;
        }
        if let Some(mut ports) = ports {
            let range = self.range_of(&namespace, &name);
            let services = &self.view.services;
            let refusals = admit_node_ports(
                &mut ports,
                &services[range.clone()],
                self.node_port_range,
                |port| {
                    uses_node_port(&services[..range.start], port)
                        || uses_node_port(&services[range.end..], port)
                },
            );
            log_refusals(&namespace, &name, &refusals);
            self.with_endpoints(&namespace, &name, &mut ports);
            let ports = self.admit_size(&namespace, &name, ports);
            self.replace(&namespace, &name, ports);
        }
    }

    pub fn delete_service(&mut self, svc: &Service) {
        if let Some((namespace, name)) = meta_key(&svc.metadata) {
            self.refused.remove(&(namespace.clone(), name.clone()));
            self.replace(&namespace, &name, Vec::new());
        }
    }

    /// `ports` (with their endpoints) when the Service fits the policy's bounds; otherwise
    /// nothing, and the ports are kept aside without endpoints. A Service past a bound gets no
    /// datapath at all rather than a truncated one: every node then does the same whatever its
    /// history, and the controller's condition (the same [`check_service_size`]) says so.
    fn admit_size(
        &mut self,
        namespace: &str,
        name: &str,
        mut ports: Vec<ServicePort>,
    ) -> Vec<ServicePort> {
        let key = (namespace.to_string(), name.to_string());
        let sizes: Vec<PortSize<'_>> = ports
            .iter()
            .map(|p| PortSize {
                name: &p.name.port,
                protocol: p.protocol,
                endpoints: p.endpoints.len(),
            })
            .collect();
        match check_service_size(&self.policy.bounds, &sizes) {
            Ok(()) => {
                if self.refused.remove(&key).is_some() {
                    tracing::info!(%namespace, %name, "Service within bounds again; programmed");
                }
                ports
            }
            Err(too_large) => {
                for port in &mut ports {
                    port.endpoints = EndpointList::default();
                }
                if self.refused.insert(key, ports).is_none() {
                    tracing::warn!(%namespace, %name, "not programmed: {too_large}");
                }
                Vec::new()
            }
        }
    }

    /// A Service list starts: until [`Index::finish_services`] listed Services are staged.
    pub fn begin_services(&mut self) {
        self.relist_services = Some(Staged::new());
    }

    /// The list is complete: Services not in it are deleted, and the view is rebuilt in one
    /// sorted pass (inserting 10,000 Services one by one would move the view each time).
    pub fn finish_services(&mut self) {
        let Some(staged) = self.relist_services.take() else {
            return;
        };
        self.refused.retain(|key, _| staged.contains_key(key));
        let old = std::mem::take(&mut self.view.services);
        // Node ports stay with the listed Service that had them programmed; new claims are
        // taken in list order.
        let mut owners: HashMap<u16, SliceKey> = HashMap::new();
        for port in &old {
            let key = (port.name.namespace.clone(), port.name.name.clone());
            if staged.contains_key(&key) {
                for taken in [port.node_port, port.health_check_node_port]
                    .into_iter()
                    .flatten()
                {
                    owners.entry(taken).or_insert_with(|| key.clone());
                }
            }
        }
        let mut view = Vec::with_capacity(old.len().max(staged.len()));
        let mut old = old.into_iter().peekable();
        let mut staged = staged.into_iter().peekable();
        loop {
            let old_key = old
                .peek()
                .map(|p| (p.name.namespace.clone(), p.name.name.clone()));
            let staged_key = staged.peek().map(|(key, _)| key.clone());
            let key = match (old_key, staged_key) {
                (None, None) => break,
                (Some(a), None) => a,
                (None, Some(b)) => b,
                (Some(a), Some(b)) => a.min(b),
            };
            let mut before = Vec::new();
            while let Some(port) =
                old.next_if(|p| p.name.namespace == key.0 && p.name.name == key.1)
            {
                before.push(port);
            }
            let mut after = match staged.next_if(|(k, _)| *k == key) {
                Some((_, ports)) => ports,
                None => Vec::new(),
            };
            let refusals = admit_node_ports(&mut after, &before, self.node_port_range, |port| {
                owners.get(&port).is_some_and(|owner| *owner != key)
            });
            log_refusals(&key.0, &key.1, &refusals);
            for port in &after {
                for taken in [port.node_port, port.health_check_node_port]
                    .into_iter()
                    .flatten()
                {
                    owners.entry(taken).or_insert_with(|| key.clone());
                }
            }
            self.with_endpoints(&key.0, &key.1, &mut after);
            let after = self.admit_size(&key.0, &key.1, after);
            note_change(&mut self.pending, &key.0, &key.1, &before, &after);
            view.extend(after);
        }
        self.view.services = view;
        self.listed.services = true;
    }

    /// The complete list of Services (a watch (re)started): those not in it are deleted.
    pub fn reset_services(&mut self, services: &[Service]) {
        self.relist(
            services,
            Self::begin_services,
            Self::apply_service,
            Self::finish_services,
        );
    }

    /// Recomputes the endpoints of a Service after one of its slices changed.
    fn refresh_endpoints(&mut self, namespace: &str, name: &str) {
        let range = self.range_of(namespace, name);
        let key = (namespace.to_string(), name.to_string());
        let mut ports = if range.is_empty() {
            match self.refused.get(&key) {
                // Node ports are admitted again: another Service may have taken one meanwhile.
                Some(ports) => {
                    let mut ports = ports.clone();
                    let services = &self.view.services;
                    let refusals =
                        admit_node_ports(&mut ports, &[], self.node_port_range, |port| {
                            uses_node_port(services, port)
                        });
                    log_refusals(namespace, name, &refusals);
                    ports
                }
                None => return,
            }
        } else {
            self.view.services[range].to_vec()
        };
        self.with_endpoints(namespace, name, &mut ports);
        let ports = self.admit_size(namespace, name, ports);
        self.replace(namespace, name, ports);
    }

    fn note_trigger(&mut self, value: Option<&String>, before: Option<&String>) {
        let Some(value) = value else {
            return;
        };
        if before == Some(value) {
            return;
        }
        match DateTime::parse_from_rfc3339(value) {
            Ok(time) if time >= self.started => self.pending.triggers.push(time.to_utc()),
            Ok(_) => {}
            Err(err) => tracing::debug!(%value, error = %err, "unreadable trigger time"),
        }
    }

    pub fn apply_slice(&mut self, slice: &EndpointSlice) {
        let Some(key) = meta_key(&slice.metadata) else {
            return;
        };
        let service = service_of(slice);
        let trigger = slice
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotation::ENDPOINTS_LAST_CHANGE_TRIGGER_TIME))
            .cloned();
        let before = self.slices.remove(&key);
        self.note_trigger(
            trigger.as_ref(),
            before.as_ref().and_then(|b| b.trigger.as_ref()),
        );
        let previous_service = before.and_then(|b| b.service);
        if let Some(old) = &previous_service {
            if Some(old) != service.as_ref() {
                self.unlink(&key, old);
            }
        }
        if let Some(service) = &service {
            self.slices_by_service
                .entry((key.0.clone(), service.clone()))
                .or_default()
                .insert(&key.1);
        }
        if let Some(seen) = &mut self.relist_slices {
            seen.insert(key.clone());
        }
        self.slices.insert(
            key.clone(),
            SliceEntry {
                service: service.clone(),
                trigger,
                ports: compact_slice(slice, &mut self.node_names),
            },
        );
        for affected in previous_service.iter().chain(service.iter()) {
            self.refresh_endpoints(&key.0, affected);
        }
    }

    fn unlink(&mut self, key: &SliceKey, service: &str) {
        let owner = (key.0.clone(), service.to_string());
        if let Some(names) = self.slices_by_service.get_mut(&owner) {
            names.remove(&key.1);
            if names.is_empty() {
                self.slices_by_service.remove(&owner);
            }
        }
    }

    pub fn delete_slice(&mut self, slice: &EndpointSlice) {
        if let Some(key) = meta_key(&slice.metadata) {
            self.delete_slice_key(&key);
        }
    }

    fn delete_slice_key(&mut self, key: &SliceKey) {
        if let Some(entry) = self.slices.remove(key) {
            let key = key.clone();
            if let Some(service) = entry.service {
                self.unlink(&key, &service);
                self.refresh_endpoints(&key.0, &service);
            }
        }
    }

    /// An EndpointSlice list starts; slices not applied before [`Index::finish_slices`] go.
    pub fn begin_slices(&mut self) {
        self.relist_slices = Some(HashSet::new());
    }

    pub fn finish_slices(&mut self) {
        let Some(seen) = self.relist_slices.take() else {
            return;
        };
        let gone: Vec<SliceKey> = self
            .slices
            .keys()
            .filter(|key| !seen.contains(*key))
            .cloned()
            .collect();
        for key in &gone {
            self.delete_slice_key(key);
        }
        self.node_names.prune();
        self.listed.slices = true;
    }

    pub fn reset_slices(&mut self, slices: &[EndpointSlice]) {
        self.relist(
            slices,
            Self::begin_slices,
            Self::apply_slice,
            Self::finish_slices,
        );
    }

    fn set_node(&mut self, info: NodeInfo) {
        if self.view.node != info {
            self.view.node = info;
            self.pending.node = true;
        }
    }

    pub fn apply_node(&mut self, node: &Node) {
        if node.metadata.name.as_deref() != Some(self.node_name.as_str()) {
            return;
        }
        if let Some(seen) = &mut self.relist_node {
            *seen = true;
        }
        self.note_eligibility(crate::schedule::node_eligible(node));
        self.node_state = Some(build_node_state(node));
        self.set_node(build_node_info(node));
    }

    fn forget_node(&mut self) {
        self.node_state = None;
        self.set_node(NodeInfo {
            name: self.node_name.clone(),
            addresses: Vec::new(),
            zone: None,
        });
    }

    pub fn delete_node(&mut self, node: &Node) {
        if node.metadata.name.as_deref() == Some(self.node_name.as_str()) {
            // Deleted: load balancers should stop sending here.
            self.note_eligibility(false);
            self.forget_node();
        }
    }

    pub fn begin_node(&mut self) {
        self.relist_node = Some(false);
    }

    pub fn finish_node(&mut self) {
        if self.relist_node.take() == Some(false) {
            self.forget_node();
        }
        self.listed.node = true;
    }

    pub fn reset_node(&mut self, nodes: &[Node]) {
        self.relist(nodes, Self::begin_node, Self::apply_node, Self::finish_node);
    }

    /// A whole list delivered at once, taken the way a watch delivers a relist: begin, each
    /// object, finish (which forgets what the list did not name).
    fn relist<K>(
        &mut self,
        objects: &[K],
        begin: fn(&mut Self),
        apply: fn(&mut Self, &K),
        finish: fn(&mut Self),
    ) {
        begin(self);
        for object in objects {
            apply(self, object);
        }
        finish(self);
    }
}

/// Whether the Node may announce, with its labels: Ready, not being deleted and not labelled
/// `node.kubernetes.io/exclude-from-external-load-balancers`.
pub fn build_node_state(node: &Node) -> berth_bgp::NodeState {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    let labels = kube::ResourceExt::labels(node).clone();
    let excluded = labels.contains_key(label::EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS);
    berth_bgp::NodeState {
        name: kube::ResourceExt::name_any(node),
        eligible: ready && !excluded && node.metadata.deletion_timestamp.is_none(),
        labels,
    }
}

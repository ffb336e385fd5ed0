//! The agent's index: a synchronous state machine fed one watch event at a time (`apply_*`,
//! `delete_*`, `reset_*` per object kind). It keeps the node's [`NodeView`] up to date and
//! collects, until the sync loop takes them, the Services whose ports changed, the trigger times
//! of the EndpointSlice changes behind them and the conntrack entries they made stale.
//!
//! Only what the datapath reads is kept: the view's ports, and slices stripped to their
//! endpoints and ports. Objects that cannot be read are logged and skipped.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use berth_api::names::{annotation, label};
use berth_datapath::convert::{build_endpoints, build_node_info, build_service_ports, ProxyMode};
use berth_datapath::{NodeInfo, NodeView, ServicePort, ServicePortName};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::conntrack::{plan_conntrack_cleanup, ConntrackFlow};

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
    /// `last-change-trigger-time` of slice changes made after the index was created.
    pub triggers: Vec<DateTime<Utc>>,
    pub conntrack: Vec<ConntrackFlow>,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
            && !self.node
            && self.triggers.is_empty()
            && self.conntrack.is_empty()
    }

    /// Folds in `later`, for work carried over a failed sync.
    pub fn merge(&mut self, later: Pending) {
        self.services.extend(later.services);
        self.node |= later.node;
        self.triggers.extend(later.triggers);
        self.conntrack.extend(later.conntrack);
        self.conntrack.sort();
        self.conntrack.dedup();
    }
}

type SliceKey = (String, String);

#[derive(Debug, Clone)]
struct SliceEntry {
    /// The Service it belongs to (`kubernetes.io/service-name`), if labelled.
    service: Option<String>,
    trigger: Option<String>,
    slice: EndpointSlice,
}

#[derive(Debug, Clone)]
pub struct Index {
    node_name: String,
    mode: ProxyMode,
    /// Trigger times before this are from before the agent watched, so not its latency.
    started: DateTime<Utc>,
    view: NodeView,
    slices: HashMap<SliceKey, SliceEntry>,
    /// Slice names by (namespace, Service name).
    slices_by_service: HashMap<SliceKey, BTreeSet<String>>,
    pending: Pending,
    /// Which kinds have been listed completely: syncing before all are would remove the rules
    /// of Services not yet seen.
    listed: Listed,
}

#[derive(Debug, Clone, Copy, Default)]
struct Listed {
    services: bool,
    slices: bool,
    node: bool,
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

/// Keeps only what [`build_endpoints`] and [`build_service_ports`] read, so 10,000 slices cost
/// their endpoints and little else.
fn strip_slice(slice: EndpointSlice, service: Option<&str>) -> EndpointSlice {
    let labels = service.map(|service| {
        BTreeMap::from([(
            label::ENDPOINTSLICE_SERVICE_NAME.to_string(),
            service.to_string(),
        )])
    });
    EndpointSlice {
        metadata: ObjectMeta {
            name: slice.metadata.name,
            namespace: slice.metadata.namespace,
            labels,
            ..ObjectMeta::default()
        },
        address_type: slice.address_type,
        ports: slice.ports,
        endpoints: slice
            .endpoints
            .into_iter()
            .map(|ep| Endpoint {
                addresses: ep.addresses.into_iter().take(1).collect(),
                conditions: ep.conditions,
                node_name: ep.node_name,
                ..Endpoint::default()
            })
            .collect(),
    }
}

impl Index {
    /// An empty index for `node_name`; `started` is when the agent began watching.
    pub fn new(node_name: &str, mode: ProxyMode, started: DateTime<Utc>) -> Self {
        Index {
            node_name: node_name.to_string(),
            mode,
            started,
            view: NodeView {
                node: NodeInfo {
                    name: node_name.to_string(),
                    addresses: Vec::new(),
                },
                services: Vec::new(),
            },
            slices: HashMap::new(),
            slices_by_service: HashMap::new(),
            pending: Pending::default(),
            listed: Listed::default(),
        }
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

    fn with_endpoints(&self, namespace: &str, name: &str, ports: &mut [ServicePort]) {
        let key = (namespace.to_string(), name.to_string());
        let slices: Vec<&EndpointSlice> = self
            .slices_by_service
            .get(&key)
            .into_iter()
            .flatten()
            .filter_map(|slice| self.slices.get(&(namespace.to_string(), slice.clone())))
            .map(|entry| &entry.slice)
            .collect();
        for port in ports.iter_mut() {
            port.endpoints = build_endpoints(&slices, &port.name.port, port.protocol);
        }
    }

    /// Puts `ports` in place of the Service's current ones; a change is recorded only when they
    /// differ.
    fn replace(&mut self, namespace: &str, name: &str, mut ports: Vec<ServicePort>) {
        ports.sort_by(|a, b| (&a.name, a.protocol).cmp(&(&b.name, b.protocol)));
        let range = self.range_of(namespace, name);
        let old = &self.view.services[range.clone()];
        if old == ports.as_slice() {
            return;
        }
        self.pending
            .conntrack
            .extend(plan_conntrack_cleanup(old, &ports));
        self.pending.services.insert(namespace, name);
        self.view.services.splice(range, ports);
    }

    pub fn apply_service(&mut self, svc: &Service) {
        let Some((namespace, name)) = meta_key(&svc.metadata) else {
            return;
        };
        if !berth_datapath::convert::is_proxied(svc, self.mode) {
            self.replace(&namespace, &name, Vec::new());
            return;
        }
        match build_service_ports(svc, &[]) {
            Ok(mut ports) => {
                self.with_endpoints(&namespace, &name, &mut ports);
                self.replace(&namespace, &name, ports);
            }
            Err(err) => {
                // Keep what was programmed: a bad update must not take a working Service down.
                tracing::warn!(%namespace, %name, error = %err, "skipping a Service that cannot be read");
            }
        }
    }

    pub fn delete_service(&mut self, svc: &Service) {
        if let Some((namespace, name)) = meta_key(&svc.metadata) {
            self.replace(&namespace, &name, Vec::new());
        }
    }

    /// The complete list of Services (a watch (re)started): those not in it are deleted.
    pub fn reset_services(&mut self, services: &[Service]) {
        let listed: BTreeSet<SliceKey> = services
            .iter()
            .filter_map(|svc| meta_key(&svc.metadata))
            .collect();
        let gone: BTreeSet<SliceKey> = self
            .view
            .services
            .iter()
            .map(|p| (p.name.namespace.clone(), p.name.name.clone()))
            .filter(|key| !listed.contains(key))
            .collect();
        for (namespace, name) in gone {
            self.replace(&namespace, &name, Vec::new());
        }
        for svc in services {
            self.apply_service(svc);
        }
        self.listed.services = true;
    }

    /// Recomputes the endpoints of a Service after one of its slices changed.
    fn refresh_endpoints(&mut self, namespace: &str, name: &str) {
        let range = self.range_of(namespace, name);
        if range.is_empty() {
            return;
        }
        let mut ports = self.view.services[range].to_vec();
        self.with_endpoints(namespace, name, &mut ports);
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
                .insert(key.1.clone());
        }
        let stripped = strip_slice(slice.clone(), service.as_deref());
        self.slices.insert(
            key.clone(),
            SliceEntry {
                service: service.clone(),
                trigger,
                slice: stripped,
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
        let Some(key) = meta_key(&slice.metadata) else {
            return;
        };
        if let Some(entry) = self.slices.remove(&key) {
            if let Some(service) = entry.service {
                self.unlink(&key, &service);
                self.refresh_endpoints(&key.0, &service);
            }
        }
    }

    pub fn reset_slices(&mut self, slices: &[EndpointSlice]) {
        let listed: BTreeSet<SliceKey> = slices
            .iter()
            .filter_map(|slice| meta_key(&slice.metadata))
            .collect();
        let gone: Vec<EndpointSlice> = self
            .slices
            .iter()
            .filter(|(key, _)| !listed.contains(*key))
            .map(|(_, entry)| entry.slice.clone())
            .collect();
        for slice in &gone {
            self.delete_slice(slice);
        }
        for slice in slices {
            self.apply_slice(slice);
        }
        self.listed.slices = true;
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
        self.set_node(build_node_info(node));
    }

    pub fn delete_node(&mut self, node: &Node) {
        if node.metadata.name.as_deref() == Some(self.node_name.as_str()) {
            self.set_node(NodeInfo {
                name: self.node_name.clone(),
                addresses: Vec::new(),
            });
        }
    }

    pub fn reset_node(&mut self, nodes: &[Node]) {
        self.listed.node = true;
        match nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(self.node_name.as_str()))
        {
            Some(node) => self.apply_node(node),
            None => self.set_node(NodeInfo {
                name: self.node_name.clone(),
                addresses: Vec::new(),
            }),
        }
    }

    pub fn service_port_count(&self) -> usize {
        self.view.services.len()
    }
}

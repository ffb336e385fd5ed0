//! discovery/v1 EndpointSlices, as the endpointslice controller publishes them.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::endpoints::pod_reference;
use crate::error::Error;
use crate::pod::{resolve_port, select_pods, PodView};
use crate::service::{ServiceView, DEFAULT_PROTOCOL};
use crate::{
    Computed, DEFAULT_MAX_ENDPOINTS_PER_SLICE, LABEL_HEADLESS, LABEL_MANAGED_BY,
    LABEL_SERVICE_NAME, MANAGED_BY_BERTH, MAX_ENDPOINTS_PER_SLICE_LIMIT,
};
use berth_core::IpFamily;

/// Longest object name the API server accepts (a DNS subdomain).
const MAX_NAME_LENGTH: usize = 253;

/// How slices are packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceConfig {
    max_endpoints_per_slice: usize,
}

impl SliceConfig {
    /// `max_endpoints_per_slice` must lie in 1..=1000, as the API server requires.
    pub fn new(max_endpoints_per_slice: usize) -> Result<Self, Error> {
        if !(1..=MAX_ENDPOINTS_PER_SLICE_LIMIT).contains(&max_endpoints_per_slice) {
            return Err(Error::InvalidMaxEndpointsPerSlice {
                got: max_endpoints_per_slice,
                max: MAX_ENDPOINTS_PER_SLICE_LIMIT,
            });
        }
        Ok(SliceConfig {
            max_endpoints_per_slice,
        })
    }

    pub fn max_endpoints_per_slice(&self) -> usize {
        self.max_endpoints_per_slice
    }
}

impl Default for SliceConfig {
    fn default() -> Self {
        SliceConfig {
            max_endpoints_per_slice: DEFAULT_MAX_ENDPOINTS_PER_SLICE,
        }
    }
}

/// The Nodes that exist, with their zone (label `topology.kubernetes.io/zone`).
///
/// Upstream leaves out the pods of a Node that does not exist (unless the
/// Service publishes not-ready addresses), so a pod bound to a deleted Node
/// cannot pin a stale endpoint. This must therefore hold every Node: build it
/// from a synced Node cache, never from a partial list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeZones {
    nodes: BTreeMap<String, Option<String>>,
}

impl NodeZones {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, node: impl Into<String>, zone: Option<String>) {
        self.nodes
            .insert(node.into(), zone.filter(|z| !z.is_empty()));
    }

    /// `None` when the node is unknown; `Some(None)` when it has no zone.
    fn get(&self, node: &str) -> Option<Option<&str>> {
        self.nodes.get(node).map(Option::as_deref)
    }
}

/// The identity of an endpoint across reconciles, as upstream hashes it:
/// its sorted addresses, hostname and pod. Conditions, node and zone are the
/// mutable part.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct EndpointKey {
    pub addresses: Vec<String>,
    pub hostname: String,
    pub namespace: String,
    pub name: String,
}

pub(crate) fn endpoint_key(endpoint: &Endpoint) -> EndpointKey {
    let mut addresses = endpoint.addresses.clone();
    addresses.sort();
    let target = endpoint.target_ref.as_ref();
    EndpointKey {
        addresses,
        hostname: endpoint.hostname.clone().unwrap_or_default(),
        namespace: target.and_then(|t| t.namespace.clone()).unwrap_or_default(),
        name: target.and_then(|t| t.name.clone()).unwrap_or_default(),
    }
}

/// Slice ports in their canonical order; unset fields read as the API defaults.
pub(crate) type PortKey = (String, Option<i32>, String, Option<String>);

pub(crate) fn port_key(port: &EndpointPort) -> PortKey {
    (
        port.name.clone().unwrap_or_default(),
        port.port,
        port.protocol
            .clone()
            .unwrap_or_else(|| DEFAULT_PROTOCOL.to_owned()),
        port.app_protocol.clone(),
    )
}

pub(crate) fn ports_key(ports: Option<&Vec<EndpointPort>>) -> Vec<PortKey> {
    let mut keys: Vec<PortKey> = ports.into_iter().flatten().map(port_key).collect();
    keys.sort();
    keys
}

/// The desired endpoints of one address type that resolve to one set of ports.
/// Slices never mix groups.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceGroup {
    address_type: &'static str,
    ports: Vec<EndpointPort>,
    /// Sorted by key, keys unique.
    endpoints: Vec<(EndpointKey, Endpoint)>,
}

impl SliceGroup {
    pub fn address_type(&self) -> &str {
        self.address_type
    }

    /// Sorted by name, port, protocol.
    pub fn ports(&self) -> &[EndpointPort] {
        &self.ports
    }

    /// Sorted by addresses, then pod.
    pub fn endpoints(&self) -> impl ExactSizeIterator<Item = &Endpoint> + '_ {
        self.endpoints.iter().map(|(_, e)| e)
    }

    pub(crate) fn keyed_endpoints(&self) -> &[(EndpointKey, Endpoint)] {
        &self.endpoints
    }
}

/// Everything the slices of one Service must contain, before it is cut into
/// slices: by [`DesiredSlices::build_slices`] from scratch, or by
/// [`crate::plan_endpoint_slices`] against the slices that exist.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredSlices {
    namespace: String,
    service_name: String,
    service_uid: String,
    labels: BTreeMap<String, String>,
    address_types: Vec<&'static str>,
    groups: Vec<SliceGroup>,
}

impl DesiredSlices {
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn service_name(&self) -> &str {
        &self.service_name
    }

    /// Address types the Service serves, sorted ("IPv4" before "IPv6").
    pub fn address_types(&self) -> &[&'static str] {
        &self.address_types
    }

    /// Non-empty groups, sorted by address type then ports.
    pub fn groups(&self) -> &[SliceGroup] {
        &self.groups
    }

    /// The labels every slice of the Service carries.
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }

    /// The Service as the controlling owner, so slices are garbage collected with it.
    pub fn owner_reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Service".to_owned(),
            name: self.service_name.clone(),
            uid: self.service_uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    pub(crate) fn is_owned(&self, slice: &EndpointSlice) -> bool {
        slice
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == self.service_uid && o.kind == "Service" && o.api_version == "v1")
    }

    /// Whether `slice` is one of ours for this Service (others are never touched).
    pub(crate) fn is_managed(&self, slice: &EndpointSlice) -> bool {
        let labels = slice.metadata.labels.as_ref();
        let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
        label(LABEL_SERVICE_NAME) == Some(self.service_name.as_str())
            && label(LABEL_MANAGED_BY) == Some(MANAGED_BY_BERTH)
            && slice
                .metadata
                .namespace
                .as_deref()
                .is_none_or(|ns| ns == self.namespace)
    }

    /// `<service>-`, the prefix the API server completes into a unique name.
    pub fn generate_name(&self) -> String {
        let prefix = format!("{}-", self.service_name);
        if prefix.len() <= MAX_NAME_LENGTH {
            prefix
        } else {
            self.service_name.clone()
        }
    }

    pub(crate) fn new_slice(
        &self,
        address_type: &str,
        ports: Vec<EndpointPort>,
        endpoints: Vec<Endpoint>,
    ) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                generate_name: Some(self.generate_name()),
                namespace: Some(self.namespace.clone()),
                labels: Some(self.labels.clone()),
                owner_references: Some(vec![self.owner_reference()]),
                ..ObjectMeta::default()
            },
            address_type: address_type.to_owned(),
            endpoints,
            ports: Some(ports),
        }
    }

    /// The slices to create when none exist: each group cut into chunks of at
    /// most `max_endpoints_per_slice`, and an empty placeholder slice for an
    /// address type without endpoints (so consumers can tell "no endpoints"
    /// from "not yet computed").
    pub fn build_slices(&self, config: &SliceConfig) -> Vec<EndpointSlice> {
        self.clone().into_slices(config)
    }

    /// [`DesiredSlices::build_slices`], moving the endpoints instead of copying them.
    pub fn into_slices(mut self, config: &SliceConfig) -> Vec<EndpointSlice> {
        let max = config.max_endpoints_per_slice;
        let mut slices = Vec::new();
        // Groups are sorted by address type, in the order of `address_types`.
        let mut groups = std::mem::take(&mut self.groups).into_iter().peekable();
        for address_type in &self.address_types {
            let mut any = false;
            while let Some(group) = groups.next_if(|g| g.address_type == *address_type) {
                any = true;
                let mut endpoints = group.endpoints.into_iter().map(|(_, e)| e).peekable();
                while endpoints.peek().is_some() {
                    let chunk: Vec<Endpoint> = endpoints.by_ref().take(max).collect();
                    slices.push(self.new_slice(address_type, group.ports.clone(), chunk));
                }
            }
            if !any {
                slices.push(self.new_slice(address_type, Vec::new(), Vec::new()));
            }
        }
        slices
    }
}

/// Service labels without the reserved ones, then the reserved ones as we set them.
fn slice_labels(svc: &ServiceView<'_>) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = svc
        .labels
        .into_iter()
        .flatten()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                LABEL_SERVICE_NAME | LABEL_MANAGED_BY | LABEL_HEADLESS
            )
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if svc.is_headless() {
        labels.insert(LABEL_HEADLESS.to_owned(), String::new());
    }
    labels.insert(LABEL_SERVICE_NAME.to_owned(), svc.name.to_owned());
    labels.insert(LABEL_MANAGED_BY.to_owned(), MANAGED_BY_BERTH.to_owned());
    labels
}

/// The slice ports for one outcome of resolving the Service ports on a pod
/// (`None`: the pod does not define that named port, so it is left out), sorted.
fn slice_ports(svc: &ServiceView<'_>, resolved: &[Option<i32>]) -> Vec<EndpointPort> {
    let mut ports: Vec<EndpointPort> = svc
        .ports
        .iter()
        .zip(resolved)
        .filter_map(|(port, number)| {
            number.map(|number| EndpointPort {
                name: Some(port.name.to_owned()),
                port: Some(number),
                protocol: Some(port.protocol.to_owned()),
                app_protocol: port.app_protocol.map(str::to_owned),
            })
        })
        .collect();
    ports.sort_by_key(port_key);
    ports
}

fn pod_endpoint(
    svc: &ServiceView<'_>,
    pod: &PodView<'_>,
    family: IpFamily,
    zone: Option<&str>,
) -> Option<Endpoint> {
    let mut addresses: Vec<String> = pod.ips_of(family).map(str::to_owned).collect();
    if addresses.is_empty() {
        return None;
    }
    addresses.sort();
    let serving = pod.ready;
    let terminating = pod.terminating;
    Some(Endpoint {
        addresses,
        conditions: Some(EndpointConditions {
            // Never ready while terminating, unless the Service asks for everything.
            ready: Some(svc.publish_not_ready || (serving && !terminating)),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        hostname: pod.hostname.map(str::to_owned),
        node_name: pod.node_name.map(str::to_owned),
        target_ref: Some(pod_reference(pod)),
        hints: svc.distribution.hints(pod.node_name, zone),
        zone: zone.map(str::to_owned),
        ..Endpoint::default()
    })
}

/// What the slices of `service` must contain, or `None` when the Service gets
/// none from a controller (no selector, or ExternalName).
///
/// Terminating pods stay in (with `terminating: true`) so the datapath can fall
/// back to serving-terminating endpoints. Pods whose Node is not in `nodes`
/// are skipped and reported, unless the Service publishes not-ready addresses.
pub fn compute_desired_slices(
    service: &Service,
    pods: &[Pod],
    nodes: &NodeZones,
) -> Computed<Option<DesiredSlices>> {
    let mut skipped = Vec::new();
    let Some(svc) = ServiceView::new(service) else {
        return Computed {
            value: None,
            skipped,
        };
    };
    let families = svc.address_families();
    let selected = select_pods(&svc, pods, true, &mut skipped);
    // Pods mostly resolve ports alike: build each distinct port set once.
    let mut port_sets: HashMap<Vec<Option<i32>>, usize> = HashMap::new();
    let mut port_lists: Vec<Vec<EndpointPort>> = Vec::new();
    let mut groups: HashMap<(IpFamily, usize), SliceGroup> = HashMap::new();
    for pod in &selected {
        let node = pod.node_name.unwrap_or("");
        let zone = match nodes.get(node) {
            Some(zone) => zone,
            None if svc.publish_not_ready => None,
            None => {
                skipped.push(Error::NodeNotFound {
                    namespace: pod.namespace.to_owned(),
                    pod: pod.name.to_owned(),
                    service: svc.name.to_owned(),
                    node: node.to_owned(),
                });
                continue;
            }
        };
        let resolved: Vec<Option<i32>> =
            svc.ports.iter().map(|p| resolve_port(pod.pod, p)).collect();
        let set = *port_sets.entry(resolved).or_insert_with_key(|resolved| {
            port_lists.push(slice_ports(&svc, resolved));
            port_lists.len() - 1
        });
        for family in &families {
            let Some(endpoint) = pod_endpoint(&svc, pod, *family, zone) else {
                continue;
            };
            groups
                .entry((*family, set))
                .or_insert_with(|| SliceGroup {
                    address_type: family.as_str(),
                    ports: port_lists[set].clone(),
                    endpoints: Vec::new(),
                })
                .endpoints
                .push((endpoint_key(&endpoint), endpoint));
        }
    }
    let desired = DesiredSlices {
        namespace: svc.namespace.to_owned(),
        service_name: svc.name.to_owned(),
        service_uid: svc.uid.to_owned(),
        labels: slice_labels(&svc),
        address_types: families.iter().map(|f| f.as_str()).collect(),
        groups: sorted_groups(groups),
    };
    Computed {
        value: Some(desired),
        skipped,
    }
}

/// Groups in canonical order, each with its endpoints sorted and unique.
/// Sorting once beats keeping an ordered map: endpoints are large to move.
fn sorted_groups(groups: HashMap<(IpFamily, usize), SliceGroup>) -> Vec<SliceGroup> {
    let mut groups: Vec<((IpFamily, Vec<PortKey>), SliceGroup)> = groups
        .into_iter()
        .map(|((family, _), g)| ((family, g.ports.iter().map(port_key).collect()), g))
        .collect();
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    groups
        .into_iter()
        .map(|(_, mut g)| {
            g.endpoints = sorted_unique(std::mem::take(&mut g.endpoints));
            g
        })
        .collect()
}

/// Sorts by key, moving each (large) endpoint once. Of two pods claiming one
/// identity the later one wins, as a map insert would have it.
fn sorted_unique(endpoints: Vec<(EndpointKey, Endpoint)>) -> Vec<(EndpointKey, Endpoint)> {
    let mut order: Vec<usize> = (0..endpoints.len()).collect();
    order.sort_by(|a, b| endpoints[*a].0.cmp(&endpoints[*b].0));
    let mut slots: Vec<Option<(EndpointKey, Endpoint)>> = endpoints.into_iter().map(Some).collect();
    let mut sorted: Vec<(EndpointKey, Endpoint)> = Vec::with_capacity(slots.len());
    for (n, i) in order.iter().enumerate() {
        let next_is_same = order
            .get(n + 1)
            .and_then(|j| Some((slots[*i].as_ref()?, slots[*j].as_ref()?)))
            .is_some_and(|(a, b)| a.0 == b.0);
        if next_is_same {
            continue;
        }
        if let Some(item) = slots[*i].take() {
            sorted.push(item);
        }
    }
    sorted
}

/// The slices of `service` built from scratch (see [`DesiredSlices::build_slices`]).
pub fn build_endpoint_slices(
    service: &Service,
    pods: &[Pod],
    nodes: &NodeZones,
    config: &SliceConfig,
) -> Computed<Option<Vec<EndpointSlice>>> {
    let Computed { value, skipped } = compute_desired_slices(service, pods, nodes);
    Computed {
        value: value.map(|d| d.into_slices(config)),
        skipped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_entry(ip: &str, pod: &str, node: &str) -> (EndpointKey, Endpoint) {
        let endpoint = Endpoint {
            addresses: vec![ip.to_owned()],
            node_name: Some(node.to_owned()),
            target_ref: Some(k8s_openapi::api::core::v1::ObjectReference {
                name: Some(pod.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        };
        (endpoint_key(&endpoint), endpoint)
    }

    #[test]
    fn sorted_unique_orders_by_key_and_keeps_the_last_duplicate() {
        let sorted = sorted_unique(vec![
            mk_entry("10.0.0.2", "b", "n1"),
            mk_entry("10.0.0.1", "a", "n1"),
            mk_entry("10.0.0.2", "b", "n2"),
            mk_entry("10.0.0.10", "c", "n1"),
        ]);
        let got: Vec<(&str, &str)> = sorted
            .iter()
            .map(|(k, e)| {
                (
                    k.addresses[0].as_str(),
                    e.node_name.as_deref().unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![("10.0.0.1", "n1"), ("10.0.0.10", "n1"), ("10.0.0.2", "n2")]
        );
        assert!(sorted_unique(Vec::new()).is_empty());
    }
}

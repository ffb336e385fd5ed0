//! core/v1 Endpoints, as the endpoints controller publishes them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Pod, Service,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::error::EndpointsError;
use crate::pod::{resolve_port, select_pods, PodView};
use crate::service::{PortSpec, ServiceView};
use crate::{Computed, ANNOTATION_OVER_CAPACITY, MAX_ENDPOINTS_ADDRESSES, OVER_CAPACITY_TRUNCATED};

pub(crate) fn pod_reference(pod: &PodView<'_>) -> ObjectReference {
    ObjectReference {
        kind: Some("Pod".to_owned()),
        namespace: Some(pod.namespace.to_owned()),
        name: Some(pod.name.to_owned()),
        uid: pod.uid.map(str::to_owned),
        ..ObjectReference::default()
    }
}

/// Identity of an address across subsets: the same IP of two pods stays two addresses.
type AddressKey = (String, String);

/// A port with the order subsets list ports in. `None` stands for "no ports"
/// (a headless Service without ports).
type PortKey = Option<(String, i32, String, Option<String>)>;

fn port_key(port: &PortSpec<'_>, number: i32) -> PortKey {
    Some((
        port.name.to_owned(),
        number,
        port.protocol.to_owned(),
        port.app_protocol.map(str::to_owned),
    ))
}

/// Collects (address, port, ready) facts and repacks them into the canonical
/// subsets: addresses that serve exactly the same ports with the same
/// readiness share one subset.
#[derive(Default)]
struct Repacker {
    addresses: BTreeMap<AddressKey, EndpointAddress>,
    by_port: BTreeMap<PortKey, BTreeMap<AddressKey, bool>>,
}

impl Repacker {
    fn add(&mut self, address: &EndpointAddress, port: PortKey, ready: bool) {
        let uid = address
            .target_ref
            .as_ref()
            .and_then(|r| r.uid.clone())
            .unwrap_or_default();
        let key = (address.ip.clone(), uid);
        self.addresses
            .entry(key.clone())
            .or_insert_with(|| address.clone());
        // Not ready wins: one not-ready report for a port makes the address not ready there.
        self.by_port
            .entry(port)
            .or_default()
            .entry(key)
            .and_modify(|r| *r = *r && ready)
            .or_insert(ready);
    }

    fn subsets(self) -> Vec<EndpointSubset> {
        let mut groups: BTreeMap<Vec<(AddressKey, bool)>, Vec<PortKey>> = BTreeMap::new();
        for (port, addrs) in self.by_port {
            groups
                .entry(addrs.into_iter().collect())
                .or_default()
                .push(port);
        }
        let lookup = |key: &AddressKey| self.addresses.get(key).cloned();
        groups
            .into_iter()
            .map(|(addrs, ports)| {
                let ready: Vec<EndpointAddress> = addrs
                    .iter()
                    .filter(|(_, r)| *r)
                    .filter_map(|(k, _)| lookup(k))
                    .collect();
                let not_ready: Vec<EndpointAddress> = addrs
                    .iter()
                    .filter(|(_, r)| !*r)
                    .filter_map(|(k, _)| lookup(k))
                    .collect();
                let ports: Vec<EndpointPort> = ports
                    .into_iter()
                    .flatten()
                    .map(|(name, port, protocol, app_protocol)| EndpointPort {
                        name: Some(name).filter(|n| !n.is_empty()),
                        port,
                        protocol: Some(protocol),
                        app_protocol,
                    })
                    .collect();
                EndpointSubset {
                    addresses: Some(ready).filter(|a| !a.is_empty()),
                    not_ready_addresses: Some(not_ready).filter(|a| !a.is_empty()),
                    ports: Some(ports).filter(|p| !p.is_empty()),
                }
            })
            .collect()
    }
}

fn count(addrs: &Option<Vec<EndpointAddress>>) -> usize {
    addrs.as_ref().map_or(0, Vec::len)
}

fn keep_first(addrs: &mut Option<Vec<EndpointAddress>>, n: usize) {
    if let Some(list) = addrs.as_mut() {
        list.truncate(n);
    }
    if addrs.as_ref().is_some_and(Vec::is_empty) {
        *addrs = None;
    }
}

/// Cuts the subsets to [`MAX_ENDPOINTS_ADDRESSES`] as upstream does: ready
/// addresses first, each subset keeping its proportional share (rounded up,
/// the last ones taking what is left). Returns whether anything was cut.
fn truncate(subsets: &mut Vec<EndpointSubset>) -> bool {
    let total_ready: usize = subsets.iter().map(|s| count(&s.addresses)).sum();
    let total_not_ready: usize = subsets.iter().map(|s| count(&s.not_ready_addresses)).sum();
    if total_ready + total_not_ready <= MAX_ENDPOINTS_ADDRESSES {
        return false;
    }
    let truncate_ready = total_ready > MAX_ENDPOINTS_ADDRESSES;
    let (budget, total) = if truncate_ready {
        (MAX_ENDPOINTS_ADDRESSES, total_ready)
    } else {
        (MAX_ENDPOINTS_ADDRESSES - total_ready, total_not_ready)
    };
    let mut left = budget;
    for subset in subsets.iter_mut() {
        let in_subset = if truncate_ready {
            count(&subset.addresses)
        } else {
            count(&subset.not_ready_addresses)
        };
        // Same floating-point share as upstream so both cut at the same place.
        let share = ((in_subset as f64 / total as f64) * budget as f64).ceil() as usize;
        let take = share.min(left);
        if truncate_ready {
            keep_first(&mut subset.addresses, take);
            subset.not_ready_addresses = None;
            left -= count(&subset.addresses);
        } else {
            keep_first(&mut subset.not_ready_addresses, take);
            left -= count(&subset.not_ready_addresses);
        }
    }
    // A subset left without addresses publishes nothing; drop it.
    subsets.retain(|s| s.addresses.is_some() || s.not_ready_addresses.is_some());
    true
}

/// The Endpoints object of `service`, or `None` when the Service gets none from
/// a controller (no selector, or ExternalName).
///
/// A pod is listed under `addresses` when Ready or when the Service sets
/// `publishNotReadyAddresses`, else under `notReadyAddresses`; terminating pods
/// are left out unless `publishNotReadyAddresses`. Only the Service's primary IP
/// family is used. Past [`MAX_ENDPOINTS_ADDRESSES`] the addresses are cut and
/// the object is annotated [`ANNOTATION_OVER_CAPACITY`].
pub fn build_endpoints(service: &Service, pods: &[Pod]) -> Computed<Option<Endpoints>> {
    let mut skipped = Vec::new();
    let Some(svc) = ServiceView::new(service) else {
        return Computed {
            value: None,
            skipped,
        };
    };
    let selected = select_pods(&svc, pods, svc.publish_not_ready, &mut skipped);
    let mut packer = Repacker::default();
    for pod in &selected {
        let family = svc.endpoints_family(pod.ips.first().map(|(_, ip)| ip));
        let Some(ip) = pod.ips_of(family).next() else {
            skipped.push(EndpointsError::NoAddressForFamily {
                namespace: pod.namespace.to_owned(),
                pod: pod.name.to_owned(),
                service: svc.name.to_owned(),
                family: family.address_type(),
            });
            continue;
        };
        let address = EndpointAddress {
            ip: ip.to_owned(),
            hostname: pod.hostname.map(str::to_owned),
            node_name: pod.node_name.map(str::to_owned),
            target_ref: Some(pod_reference(pod)),
        };
        let ready = svc.publish_not_ready || pod.ready;
        if svc.ports.is_empty() {
            if svc.is_cluster_ip_none() {
                packer.add(&address, None, ready);
            }
            continue;
        }
        for port in &svc.ports {
            if let Some(number) = resolve_port(pod.pod, port) {
                packer.add(&address, port_key(port, number), ready);
            }
        }
    }
    let mut subsets = packer.subsets();
    let truncated = truncate(&mut subsets);
    let annotations = truncated.then(|| {
        BTreeMap::from([(
            ANNOTATION_OVER_CAPACITY.to_owned(),
            OVER_CAPACITY_TRUNCATED.to_owned(),
        )])
    });
    let labels = svc.object_labels();
    let endpoints = Endpoints {
        metadata: ObjectMeta {
            name: Some(svc.name.to_owned()),
            namespace: Some(svc.namespace.to_owned()),
            labels: Some(labels).filter(|l| !l.is_empty()),
            annotations,
            ..ObjectMeta::default()
        },
        subsets: Some(subsets).filter(|s| !s.is_empty()),
    };
    Computed {
        value: Some(endpoints),
        skipped,
    }
}

fn without_resource_versions(subsets: &Option<Vec<EndpointSubset>>) -> Vec<EndpointSubset> {
    let mut subsets = subsets.clone().unwrap_or_default();
    for subset in &mut subsets {
        for list in [&mut subset.addresses, &mut subset.not_ready_addresses] {
            for address in list.iter_mut().flatten() {
                if let Some(r) = address.target_ref.as_mut() {
                    r.resource_version = None;
                }
            }
        }
    }
    subsets
}

/// Whether the stored `existing` object differs from `desired` in what the
/// controller owns: subsets (ignoring pod resourceVersions), labels and the
/// over-capacity annotation. Other annotations belong to other writers.
pub fn endpoints_need_update(existing: &Endpoints, desired: &Endpoints) -> bool {
    let over_capacity = |e: &Endpoints| {
        e.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_OVER_CAPACITY).cloned())
    };
    let labels = |e: &Endpoints| e.metadata.labels.clone().unwrap_or_default();
    without_resource_versions(&existing.subsets) != without_resource_versions(&desired.subsets)
        || labels(existing) != labels(desired)
        || over_capacity(existing) != over_capacity(desired)
}

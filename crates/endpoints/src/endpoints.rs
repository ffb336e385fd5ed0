//! core/v1 Endpoints, as the endpoints controller publishes them.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Pod, Service,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::error::Error;
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

/// A Service port as resolved on one pod: its index in the Service and the
/// number. `None` stands for "no ports" (a headless Service without ports).
type PortId = Option<(usize, i32)>;

/// Collects (address, ports, ready) facts and repacks them into the canonical
/// subsets: addresses that serve exactly the same ports with the same
/// readiness share one subset. Addresses are ordered by IP then pod UID, ports
/// by name, number, protocol; subsets by their address lists.
struct Repacker<'a> {
    ports: &'a [PortSpec<'a>],
    addresses: Vec<EndpointAddress>,
    /// Identity of an address: the same IP of two pods stays two addresses.
    index: HashMap<(&'a str, &'a str), usize>,
    by_port: HashMap<PortId, HashMap<usize, bool>>,
}

impl<'a> Repacker<'a> {
    fn new(ports: &'a [PortSpec<'a>]) -> Self {
        Repacker {
            ports,
            addresses: Vec::new(),
            index: HashMap::new(),
            by_port: HashMap::new(),
        }
    }

    fn add(
        &mut self,
        key: (&'a str, &'a str),
        address: EndpointAddress,
        ports: &[PortId],
        ready: bool,
    ) {
        let addresses = &mut self.addresses;
        let at = *self.index.entry(key).or_insert_with(|| {
            addresses.push(address);
            addresses.len() - 1
        });
        for port in ports {
            // Not ready wins: one not-ready report for a port makes the address not ready there.
            self.by_port
                .entry(*port)
                .or_default()
                .entry(at)
                .and_modify(|r| *r = *r && ready)
                .or_insert(ready);
        }
    }

    fn endpoint_port(&self, id: (usize, i32)) -> Option<EndpointPort> {
        let spec = self.ports.get(id.0)?;
        Some(EndpointPort {
            name: Some(spec.name.to_owned()).filter(|n| !n.is_empty()),
            port: id.1,
            protocol: Some(spec.protocol.to_owned()),
            app_protocol: spec.app_protocol.map(str::to_owned),
        })
    }

    fn subsets(self) -> Vec<EndpointSubset> {
        let mut order: Vec<usize> = (0..self.addresses.len()).collect();
        let uid = |a: &EndpointAddress| {
            a.target_ref
                .as_ref()
                .and_then(|r| r.uid.clone())
                .unwrap_or_default()
        };
        order.sort_by_cached_key(|i| (self.addresses[*i].ip.clone(), uid(&self.addresses[*i])));
        let mut rank = vec![0; order.len()];
        for (r, i) in order.iter().enumerate() {
            rank[*i] = r;
        }
        let mut groups: BTreeMap<Vec<(usize, bool)>, Vec<PortId>> = BTreeMap::new();
        for (port, addrs) in &self.by_port {
            let mut members: Vec<(usize, bool)> =
                addrs.iter().map(|(i, r)| (rank[*i], *r)).collect();
            members.sort_unstable();
            groups.entry(members).or_default().push(*port);
        }
        groups
            .into_iter()
            .map(|(members, ports)| {
                let pick = |want: bool| -> Vec<EndpointAddress> {
                    members
                        .iter()
                        .filter(|(_, r)| *r == want)
                        .map(|(rank, _)| self.addresses[order[*rank]].clone())
                        .collect()
                };
                let mut ports: Vec<EndpointPort> = ports
                    .into_iter()
                    .flatten()
                    .filter_map(|id| self.endpoint_port(id))
                    .collect();
                ports.sort_by(|a, b| {
                    (&a.name, a.port, &a.protocol, &a.app_protocol).cmp(&(
                        &b.name,
                        b.port,
                        &b.protocol,
                        &b.app_protocol,
                    ))
                });
                EndpointSubset {
                    addresses: Some(pick(true)).filter(|a| !a.is_empty()),
                    not_ready_addresses: Some(pick(false)).filter(|a| !a.is_empty()),
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
    let mut packer = Repacker::new(&svc.ports);
    let mut ports: Vec<PortId> = Vec::with_capacity(svc.ports.len());
    for pod in &selected {
        let family = svc.endpoints_family(pod.ips.first().map(|(_, ip)| ip));
        let Some(ip) = pod.ips_of(family).next() else {
            skipped.push(Error::NoAddressForFamily {
                namespace: pod.namespace.to_owned(),
                pod: pod.name.to_owned(),
                service: svc.name.to_owned(),
                family: family.as_str(),
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
        ports.clear();
        if svc.ports.is_empty() {
            if svc.is_cluster_ip_none() {
                ports.push(None);
            }
        } else {
            let resolved = svc.ports.iter().enumerate();
            ports.extend(resolved.filter_map(|(i, port)| {
                resolve_port(pod.pod, port).map(|number| Some((i, number)))
            }));
        }
        if !ports.is_empty() {
            packer.add((ip, pod.uid.unwrap_or("")), address, &ports, ready);
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

/// Subsets as they are compared: absent = empty, pod resourceVersions ignored (a
/// pod's resourceVersion moves with every write to the pod, which need not change its endpoint).
pub fn comparable_subsets(subsets: Option<&[EndpointSubset]>) -> Vec<EndpointSubset> {
    let mut subsets = subsets.map(<[_]>::to_vec).unwrap_or_default();
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
    comparable_subsets(existing.subsets.as_deref())
        != comparable_subsets(desired.subsets.as_deref())
        || labels(existing) != labels(desired)
        || over_capacity(existing) != over_capacity(desired)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ServicePort;

    use super::*;

    fn mk_addresses(prefix: &str, n: usize) -> Option<Vec<EndpointAddress>> {
        Some(
            (0..n)
                .map(|i| EndpointAddress {
                    ip: format!("{prefix}.{i}"),
                    ..Default::default()
                })
                .collect(),
        )
    }

    fn mk_subset(ready: usize, not_ready: usize, tag: &str) -> EndpointSubset {
        EndpointSubset {
            addresses: mk_addresses(&format!("r{tag}"), ready).filter(|a| !a.is_empty()),
            not_ready_addresses: mk_addresses(&format!("n{tag}"), not_ready)
                .filter(|a| !a.is_empty()),
            ports: None,
        }
    }

    fn sizes(subsets: &[EndpointSubset]) -> Vec<(usize, usize)> {
        subsets
            .iter()
            .map(|s| (count(&s.addresses), count(&s.not_ready_addresses)))
            .collect()
    }

    #[test]
    fn under_capacity_is_untouched() {
        let mut subsets = vec![mk_subset(600, 0, "a"), mk_subset(300, 100, "b")];
        assert!(!truncate(&mut subsets));
        assert_eq!(sizes(&subsets), vec![(600, 0), (300, 100)]);
    }

    #[test]
    fn ready_addresses_are_shared_in_proportion_and_not_ready_dropped() {
        let mut subsets = vec![mk_subset(600, 5, "a"), mk_subset(600, 0, "b")];
        assert!(truncate(&mut subsets));
        assert_eq!(sizes(&subsets), vec![(500, 0), (500, 0)]);
    }

    #[test]
    fn rounding_up_leaves_the_last_subset_short() {
        let mut subsets = vec![
            mk_subset(501, 0, "a"),
            mk_subset(300, 0, "b"),
            mk_subset(300, 0, "c"),
        ];
        assert!(truncate(&mut subsets));
        // ceil(501/1101*1000)=456, ceil(300/1101*1000)=273, then the 271 left.
        assert_eq!(sizes(&subsets), vec![(456, 0), (273, 0), (271, 0)]);
        // The first addresses of each subset are the ones kept.
        assert_eq!(subsets[0].addresses.as_ref().unwrap()[0].ip, "ra.0");
    }

    #[test]
    fn not_ready_addresses_fill_what_ready_ones_leave() {
        let mut subsets = vec![mk_subset(700, 200, "a"), mk_subset(0, 400, "b")];
        assert!(truncate(&mut subsets));
        assert_eq!(sizes(&subsets), vec![(700, 100), (0, 200)]);
    }

    #[test]
    fn subsets_left_empty_are_dropped() {
        let mut subsets = vec![mk_subset(1001, 0, "a"), mk_subset(0, 10, "b")];
        assert!(truncate(&mut subsets));
        assert_eq!(sizes(&subsets), vec![(1000, 0)]);
    }

    #[test]
    fn not_ready_report_wins_when_an_address_repeats() {
        let address = EndpointAddress {
            ip: "10.0.0.1".into(),
            ..Default::default()
        };
        let svc_port = ServicePort {
            name: Some("http".into()),
            port: 80,
            ..Default::default()
        };
        let specs = [PortSpec::new(&svc_port)];
        let mut packer = Repacker::new(&specs);
        packer.add(("10.0.0.1", ""), address.clone(), &[Some((0, 80))], true);
        packer.add(("10.0.0.1", ""), address, &[Some((0, 80))], false);
        let subsets = packer.subsets();
        assert_eq!(sizes(&subsets), vec![(0, 1)]);
        assert_eq!(
            subsets[0].ports.as_ref().unwrap()[0].protocol.as_deref(),
            Some("TCP")
        );
    }

    fn mk_endpoints(rv: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Endpoints {
        let map = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect::<BTreeMap<_, _>>(),
            )
            .filter(|m| !m.is_empty())
        };
        Endpoints {
            metadata: ObjectMeta {
                name: Some("web".into()),
                labels: map(labels),
                annotations: map(annotations),
                ..Default::default()
            },
            subsets: Some(vec![EndpointSubset {
                addresses: Some(vec![EndpointAddress {
                    ip: "10.0.0.1".into(),
                    target_ref: Some(ObjectReference {
                        kind: Some("Pod".into()),
                        name: Some("a".into()),
                        resource_version: Some(rv.into()).filter(|v: &String| !v.is_empty()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }]),
        }
    }

    #[test]
    fn update_ignores_pod_versions_and_foreign_annotations() {
        let desired = mk_endpoints("", &[("team", "a")], &[]);
        let stored = mk_endpoints(
            "123",
            &[("team", "a")],
            &[("endpoints.kubernetes.io/last-change-trigger-time", "x")],
        );
        assert!(!endpoints_need_update(&stored, &desired));
        let relabelled = mk_endpoints("", &[("team", "b")], &[]);
        assert!(endpoints_need_update(&relabelled, &desired));
        let stale_mark = mk_endpoints(
            "",
            &[("team", "a")],
            &[(ANNOTATION_OVER_CAPACITY, "truncated")],
        );
        assert!(endpoints_need_update(&stale_mark, &desired));
    }
}

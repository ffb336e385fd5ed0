//! The reconcile planner: the fewest slice writes that turn what exists into
//! what is desired, reusing existing slices so that unchanged endpoints stay
//! where they are and watchers see little churn.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};

use crate::slices::{
    endpoint_key, ports_key, DesiredSlices, EndpointKey, PortKey, SliceConfig, SliceGroup,
};

/// The writes that reconcile one Service's slices.
///
/// `create` slices carry `generateName`, not a name. `update` slices are
/// existing slices (with their resourceVersion, for conflict detection) whose
/// content was replaced. `delete` and `unchanged` hold names. Slices of other
/// managers are never mentioned.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlicePlan {
    pub create: Vec<EndpointSlice>,
    pub update: Vec<EndpointSlice>,
    pub delete: Vec<String>,
    pub unchanged: Vec<String>,
}

impl SlicePlan {
    /// True when the existing slices already match: nothing to write.
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.update.is_empty() && self.delete.is_empty()
    }
}

/// An existing endpoint as it would be written back: addresses sorted, and
/// without the pod's resourceVersion, which upstream ignores too.
fn normalized(endpoint: &Endpoint) -> Endpoint {
    let mut endpoint = endpoint.clone();
    endpoint.addresses.sort();
    if let Some(r) = endpoint.target_ref.as_mut() {
        r.resource_version = None;
    }
    endpoint
}

/// Compares `stored` with the sorted `want` without allocating when `stored`
/// is sorted too, as every slice berth writes is.
fn same_addresses(stored: &[String], want: &[String]) -> bool {
    if stored.len() != want.len() {
        return false;
    }
    if stored.windows(2).all(|w| w[0] <= w[1]) {
        return stored == want;
    }
    let mut sorted = stored.to_vec();
    sorted.sort();
    sorted == want
}

fn same_reference(stored: &Option<ObjectReference>, want: &Option<ObjectReference>) -> bool {
    match (stored, want) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            let ObjectReference {
                api_version,
                field_path,
                kind,
                name,
                namespace,
                resource_version: _,
                uid,
            } = a;
            *api_version == b.api_version
                && *field_path == b.field_path
                && *kind == b.kind
                && *name == b.name
                && *namespace == b.namespace
                && *uid == b.uid
        }
        _ => false,
    }
}

/// Whether a stored endpoint already says what `want` says. Runs for every
/// endpoint of every slice on each reconcile, so it compares in place.
fn same_endpoint(stored: &Endpoint, want: &Endpoint) -> bool {
    // Destructured so that a new Endpoint field cannot be forgotten here.
    let Endpoint {
        addresses,
        conditions,
        deprecated_topology,
        hints,
        hostname,
        node_name,
        target_ref,
        zone,
    } = stored;
    same_addresses(addresses, &want.addresses)
        && *conditions == want.conditions
        && *deprecated_topology == want.deprecated_topology
        && *hints == want.hints
        && *hostname == want.hostname
        && *node_name == want.node_name
        && *zone == want.zone
        && same_reference(target_ref, &want.target_ref)
}

/// Whether `stored` has the identity `key`, without building its key.
fn has_key(stored: &Endpoint, key: &EndpointKey) -> bool {
    let target = stored.target_ref.as_ref();
    stored.hostname.as_deref().unwrap_or("") == key.hostname
        && target.and_then(|t| t.namespace.as_deref()).unwrap_or("") == key.namespace
        && target.and_then(|t| t.name.as_deref()).unwrap_or("") == key.name
        && same_addresses(&stored.addresses, &key.addresses)
}

fn labels_match(slice: &EndpointSlice, desired: &DesiredSlices) -> bool {
    match &slice.metadata.labels {
        Some(labels) => labels == desired.labels(),
        None => desired.labels().is_empty(),
    }
}

fn name_of(slice: &EndpointSlice) -> String {
    slice.metadata.name.clone().unwrap_or_default()
}

/// An existing slice being rewritten, endpoints keyed for a sorted result.
struct Rewrite<'a> {
    existing: &'a EndpointSlice,
    endpoints: BTreeMap<EndpointKey, Endpoint>,
}

fn owned(kept: &[(&EndpointKey, &Endpoint)]) -> BTreeMap<EndpointKey, Endpoint> {
    kept.iter()
        .map(|(k, e)| ((*k).clone(), (*e).clone()))
        .collect()
}

/// The desired endpoints of a group not yet placed in a slice. They come
/// sorted from the group; taking marks them, so nothing is re-sorted.
struct Remaining<'g> {
    items: Vec<(&'g EndpointKey, &'g Endpoint)>,
    taken: Vec<bool>,
    left: usize,
    /// Everything before this index is taken.
    cursor: usize,
    /// A pod has at most one endpoint per group, so it finds its endpoint.
    by_pod: HashMap<(&'g str, &'g str), usize>,
}

impl<'g> Remaining<'g> {
    fn new(group: Option<&'g SliceGroup>) -> Self {
        let items: Vec<(&EndpointKey, &Endpoint)> = group
            .map(|g| g.keyed_endpoints().iter().map(|(k, e)| (k, e)).collect())
            .unwrap_or_default();
        let by_pod = items
            .iter()
            .enumerate()
            .map(|(i, (k, _))| ((k.namespace.as_str(), k.name.as_str()), i))
            .collect();
        Remaining {
            taken: vec![false; items.len()],
            left: items.len(),
            cursor: 0,
            items,
            by_pod,
        }
    }

    fn len(&self) -> usize {
        self.left
    }

    fn is_empty(&self) -> bool {
        self.left == 0
    }

    /// Takes the desired endpoint with the identity of `stored`, if still there.
    fn take(&mut self, stored: &Endpoint) -> Option<(&'g EndpointKey, &'g Endpoint)> {
        let target = stored.target_ref.as_ref();
        let pod = (
            target.and_then(|t| t.namespace.as_deref()).unwrap_or(""),
            target.and_then(|t| t.name.as_deref()).unwrap_or(""),
        );
        let i = *self.by_pod.get(&pod)?;
        let (key, endpoint) = self.items[i];
        if self.taken[i] || !has_key(stored, key) {
            return None;
        }
        self.taken[i] = true;
        self.left -= 1;
        Some((key, endpoint))
    }

    /// Takes the smallest endpoint left, as an owned pair for a slice being written.
    fn pop(&mut self) -> Option<(EndpointKey, Endpoint)> {
        while self.cursor < self.items.len() {
            let i = self.cursor;
            self.cursor += 1;
            if !self.taken[i] {
                self.taken[i] = true;
                self.left -= 1;
                let (key, endpoint) = self.items[i];
                return Some((key.clone(), endpoint.clone()));
            }
        }
        None
    }
}

/// The outcome for one address type.
#[derive(Default)]
struct TypePlan<'a> {
    create: Vec<EndpointSlice>,
    update: Vec<Rewrite<'a>>,
    /// Owned slices that may be recycled for a create.
    delete: Vec<&'a EndpointSlice>,
    unchanged: Vec<&'a EndpointSlice>,
}

/// One group (address type and ports): keep the endpoints that stay where
/// they are, then top up slices already being rewritten (fullest first), then
/// fill the unchanged slice that ends closest to full, then create new ones.
fn plan_group<'a>(
    desired: &DesiredSlices,
    address_type: &str,
    group: Option<&SliceGroup>,
    existing: Vec<&'a EndpointSlice>,
    max: usize,
    out: &mut TypePlan<'a>,
) {
    let mut remaining = Remaining::new(group);
    let mut rewrites: Vec<Rewrite<'a>> = Vec::new();
    let mut unchanged: Vec<&'a EndpointSlice> = Vec::new();
    for slice in existing {
        // Borrowed until the slice turns out to need a rewrite: most do not.
        let mut kept: Vec<(&EndpointKey, &Endpoint)> = Vec::new();
        let mut changed = false;
        for endpoint in &slice.endpoints {
            if let Some((key, want)) = remaining.take(endpoint) {
                changed |= !same_endpoint(endpoint, want);
                kept.push((key, want));
            }
        }
        if changed || kept.len() != slice.endpoints.len() {
            if kept.is_empty() {
                out.delete.push(slice);
            } else {
                rewrites.push(Rewrite {
                    existing: slice,
                    endpoints: owned(&kept),
                });
            }
        } else if !labels_match(slice, desired) {
            rewrites.push(Rewrite {
                existing: slice,
                endpoints: owned(&kept),
            });
        } else {
            unchanged.push(slice);
        }
    }

    if !remaining.is_empty() {
        rewrites.sort_by(|a, b| {
            b.endpoints
                .len()
                .cmp(&a.endpoints.len())
                .then_with(|| name_of(a.existing).cmp(&name_of(b.existing)))
        });
        for rewrite in &mut rewrites {
            while rewrite.endpoints.len() < max {
                let Some((k, e)) = remaining.pop() else {
                    break;
                };
                rewrite.endpoints.insert(k, e);
            }
        }
    }

    while !remaining.is_empty() {
        let fill = if remaining.len() < max {
            closest_fit(&unchanged, remaining.len(), max)
        } else {
            None
        };
        let mut endpoints = BTreeMap::new();
        let existing = fill.map(|i| unchanged.remove(i));
        if let Some(slice) = existing {
            for endpoint in &slice.endpoints {
                endpoints.insert(endpoint_key(endpoint), normalized(endpoint));
            }
        }
        while endpoints.len() < max {
            let Some((k, e)) = remaining.pop() else {
                break;
            };
            endpoints.insert(k, e);
        }
        match existing {
            Some(slice) => rewrites.push(Rewrite {
                existing: slice,
                endpoints,
            }),
            None => out.create.push(desired.new_slice(
                address_type,
                group.map(|g| g.ports().to_vec()).unwrap_or_default(),
                endpoints.into_values().collect(),
            )),
        }
    }
    out.update.extend(rewrites);
    out.unchanged.extend(unchanged);
}

/// The unchanged slice that `adding` endpoints would bring closest to full
/// without overflowing; ties go to the first (slices come sorted by name).
fn closest_fit(slices: &[&EndpointSlice], adding: usize, max: usize) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (i, slice) in slices.iter().enumerate() {
        let Some(room) = max.checked_sub(adding + slice.endpoints.len()) else {
            continue;
        };
        if best.is_none_or(|(_, r)| room < r) {
            best = Some((i, room));
        }
        if room == 0 {
            break;
        }
    }
    best.map(|(i, _)| i)
}

fn is_placeholder(slice: &EndpointSlice, desired: &DesiredSlices) -> bool {
    slice.endpoints.is_empty()
        && slice.ports.as_ref().is_none_or(Vec::is_empty)
        && labels_match(slice, desired)
}

/// Plans the writes that make `existing` (the slices the API holds, in any
/// order, possibly including other controllers' slices, which are ignored)
/// match `desired`, packing at most `config.max_endpoints_per_slice()`
/// endpoints into a slice it fills.
///
/// Slices of an address type the Service no longer has, or owned by an
/// older Service of the same name, are deleted. An address type without any
/// endpoint keeps one empty placeholder slice. A slice that would be deleted
/// while another is created is rewritten instead.
///
/// While the Service is being deleted, apply only the updates and deletes:
/// creating slices then would race the garbage collector (upstream skips
/// creates in that case too).
pub fn plan_endpoint_slices(
    desired: &DesiredSlices,
    existing: &[EndpointSlice],
    config: &SliceConfig,
) -> SlicePlan {
    let max = config.max_endpoints_per_slice();
    let mut mine: Vec<&EndpointSlice> = existing
        .iter()
        .filter(|s| s.metadata.name.is_some() && desired.is_managed(s))
        .collect();
    mine.sort_by_key(|s| name_of(s));

    let mut plan = SlicePlan::default();
    let mut buckets: BTreeMap<(&str, Vec<PortKey>), Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in mine {
        let served = desired
            .address_types()
            .contains(&slice.address_type.as_str());
        if !served || !desired.is_owned(slice) {
            plan.delete.push(name_of(slice));
            continue;
        }
        buckets
            .entry((slice.address_type.as_str(), ports_key(slice.ports.as_ref())))
            .or_default()
            .push(slice);
    }

    for &address_type in desired.address_types() {
        let mut out = TypePlan::default();
        let mut seen = BTreeSet::new();
        for group in desired
            .groups()
            .iter()
            .filter(|g| g.address_type() == address_type)
        {
            let key = (address_type, ports_key(Some(&group.ports().to_vec())));
            let existing = buckets.remove(&key).unwrap_or_default();
            seen.insert(key);
            plan_group(desired, address_type, Some(group), existing, max, &mut out);
        }
        let stale: Vec<(&str, Vec<PortKey>)> = buckets
            .keys()
            .filter(|(t, _)| *t == address_type)
            .cloned()
            .collect();
        // Port sets no pod resolves to any more: their slices go, even empty ones.
        for key in stale {
            out.delete.extend(buckets.remove(&key).unwrap_or_default());
        }

        if out.unchanged.is_empty() && out.update.is_empty() && out.create.is_empty() {
            // Keep an existing placeholder rather than delete and recreate it.
            match out.delete.iter().position(|s| is_placeholder(s, desired)) {
                Some(i) => out.unchanged.push(out.delete.remove(i)),
                None => out
                    .create
                    .push(desired.new_slice(address_type, Vec::new(), Vec::new())),
            }
        }

        // Recycle slices about to be deleted for slices about to be created.
        while !out.delete.is_empty() {
            let Some(created) = out.create.pop() else {
                break;
            };
            let recycled = out.delete.remove(0);
            let mut slice = recycled.clone();
            slice.metadata.labels = Some(desired.labels().clone());
            slice.ports = created.ports;
            slice.endpoints = created.endpoints;
            plan.update.push(slice);
        }

        plan.create.append(&mut out.create);
        plan.delete.extend(out.delete.iter().map(|s| name_of(s)));
        plan.unchanged
            .extend(out.unchanged.iter().map(|s| name_of(s)));
        for rewrite in out.update {
            let mut slice = rewrite.existing.clone();
            slice.metadata.labels = Some(desired.labels().clone());
            slice.endpoints = rewrite.endpoints.into_values().collect();
            plan.update.push(slice);
        }
    }
    plan.update.sort_by_key(name_of);
    plan.delete.sort();
    plan.unchanged.sort();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_slice(endpoints: usize) -> EndpointSlice {
        EndpointSlice {
            endpoints: vec![Endpoint::default(); endpoints],
            ..Default::default()
        }
    }

    #[test]
    fn closest_fit_prefers_the_slice_that_ends_fullest() {
        let slices = [mk_slice(2), mk_slice(6), mk_slice(5), mk_slice(9)];
        let refs: Vec<&EndpointSlice> = slices.iter().collect();
        assert_eq!(closest_fit(&refs, 3, 10), Some(1));
        assert_eq!(closest_fit(&refs, 4, 10), Some(1));
        assert_eq!(closest_fit(&refs, 5, 10), Some(2));
        assert_eq!(closest_fit(&refs, 9, 10), None);
        assert_eq!(closest_fit(&[], 1, 10), None);
    }
}

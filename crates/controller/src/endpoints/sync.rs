//! One Service's sync, planned without I/O: from the cached inputs to the writes that make the
//! API match (docs/architecture.md, "Endpoints semantics").

use std::collections::BTreeMap;

use berth_api::names::annotation::ENDPOINTS_LAST_CHANGE_TRIGGER_TIME;
use berth_endpoints::{
    build_endpoints, compute_desired_slices, plan_endpoint_slices, Error as EndpointsError,
    SliceConfig, SlicePlan, ANNOTATION_OVER_CAPACITY,
};
use chrono::{DateTime, SecondsFormat, Utc};
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::cache::Inputs;
use super::stored::StoredEndpoints;

/// What to do with the Service's Endpoints object.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum EndpointsWrite {
    Create(Endpoints),
    /// The stored object with new content, keeping its resourceVersion for conflict detection.
    Replace(Endpoints),
    Delete,
}

impl EndpointsWrite {
    /// berth's word for the write, in logs, metrics and errors.
    pub(crate) fn verb(&self) -> &'static str {
        match self {
            EndpointsWrite::Create(_) => "create",
            EndpointsWrite::Replace(_) => "update",
            EndpointsWrite::Delete => "delete",
        }
    }
}

/// Every write of one sync. Slices: creates first, then updates, then deletes, so consumers never
/// see fewer endpoints than there are while a change is half applied.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Writes {
    pub(crate) endpoints: Option<EndpointsWrite>,
    pub(crate) slices: SlicePlan,
    /// Inputs that could not be used, for the log.
    pub(crate) skipped: Vec<EndpointsError>,
}

impl Writes {
    pub(crate) fn is_empty(&self) -> bool {
        self.endpoints.is_none() && self.slices.is_empty()
    }
}

/// With its fraction of a second, as upstream writes it (RFC3339Nano): whole seconds would add
/// up to a second to every latency measured from it.
fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// Sets (or, without a known trigger, removes) the trigger-time annotation, as upstream does:
/// a stale time on a newer write would misreport how long programming took.
fn set_trigger(annotations: &mut Option<BTreeMap<String, String>>, trigger: Option<DateTime<Utc>>) {
    let map = annotations.get_or_insert_with(BTreeMap::new);
    match trigger {
        Some(at) => {
            map.insert(ENDPOINTS_LAST_CHANGE_TRIGGER_TIME.to_owned(), rfc3339(at));
        }
        None => {
            map.remove(ENDPOINTS_LAST_CHANGE_TRIGGER_TIME);
        }
    }
    if map.is_empty() {
        *annotations = None;
    }
}

fn plan_endpoints(
    existing: Option<&StoredEndpoints>,
    desired: Endpoints,
    trigger: Option<DateTime<Utc>>,
) -> Option<EndpointsWrite> {
    let Some(existing) = existing else {
        let mut created = desired;
        set_trigger(&mut created.metadata.annotations, trigger);
        return Some(EndpointsWrite::Create(created));
    };
    if !existing.needs_update(&desired) {
        return None;
    }
    let mut replaced = Endpoints {
        metadata: existing.metadata.to_meta(),
        subsets: None,
    };
    replaced.metadata.labels = desired.metadata.labels;
    // Other writers' annotations stay; the two berth owns follow the desired object.
    let mut annotations = replaced.metadata.annotations.take().unwrap_or_default();
    annotations.remove(ANNOTATION_OVER_CAPACITY);
    annotations.extend(desired.metadata.annotations.unwrap_or_default());
    replaced.metadata.annotations = Some(annotations);
    set_trigger(&mut replaced.metadata.annotations, trigger);
    replaced.subsets = desired.subsets;
    Some(EndpointsWrite::Replace(replaced))
}

fn slice_name(slice: &EndpointSlice) -> String {
    slice.metadata.name.clone().unwrap_or_default()
}

/// The writes that bring the Service's Endpoints and EndpointSlices in line with its pods.
///
/// A Service that is gone loses both. A Service without a selector (or of type ExternalName)
/// keeps its Endpoints, which someone else writes; slices berth made for it while it had a selector
/// are deleted, since they would keep advertising pods the Service no longer chose.
pub(crate) fn plan_sync(inputs: &Inputs, config: &SliceConfig) -> Writes {
    let Some(service) = inputs.service.as_deref() else {
        return Writes {
            endpoints: inputs.endpoints.as_ref().map(|_| EndpointsWrite::Delete),
            slices: SlicePlan {
                delete: inputs.slices.iter().map(slice_name).collect(),
                ..SlicePlan::default()
            },
            skipped: Vec::new(),
        };
    };
    let built = build_endpoints(service, &inputs.pods);
    let desired_slices = compute_desired_slices(service, &inputs.pods, &inputs.nodes);
    let (Some(desired), Some(slices)) = (built.value, desired_slices.value) else {
        return Writes {
            endpoints: None,
            slices: SlicePlan {
                delete: inputs.slices.iter().map(slice_name).collect(),
                ..SlicePlan::default()
            },
            skipped: Vec::new(),
        };
    };
    let mut skipped = built.skipped;
    skipped.extend(desired_slices.skipped);
    skipped.sort_by_key(ToString::to_string);
    skipped.dedup();

    let mut plan = plan_endpoint_slices(&slices, &inputs.slices, config);
    if service.metadata.deletion_timestamp.is_some() {
        // Created now, a slice would outlive the Service it belongs to.
        plan.create.clear();
    }
    for slice in plan.create.iter_mut().chain(plan.update.iter_mut()) {
        slice.metadata.managed_fields = None;
        set_trigger(&mut slice.metadata.annotations, inputs.trigger);
    }
    Writes {
        endpoints: plan_endpoints(inputs.endpoints.as_deref(), desired, inputs.trigger),
        slices: plan,
        skipped,
    }
}

#[cfg(test)]
#[path = "sync_tests.rs"]
mod tests;

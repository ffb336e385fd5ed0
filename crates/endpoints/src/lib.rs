//! berth-endpoints: the pure core of the endpoints component.
//!
//! From a Service, the Pods of the cluster and the zone of each Node it computes
//! the core/v1 `Endpoints` and the discovery/v1 `EndpointSlice`s that
//! kube-controller-manager's endpoints and endpointslice controllers would
//! publish, and plans the minimal create/update/delete set that turns the
//! slices that exist into the desired ones. Nothing here performs I/O: the
//! controller fetches, calls these functions and applies the result.
//!
//! Every result is deterministic (endpoints, addresses, ports, subsets and
//! slices are sorted) so the controller can compare with what exists and skip
//! no-op writes. Inputs that cannot be used (an unparsable pod IP, a pod on an
//! unknown node, ...) are skipped and reported in [`Computed::skipped`].
//!
//! Where berth's output differs from kube-controller-manager's, on purpose:
//! - subsets, ports and slice groups are ordered by value (addresses by IP
//!   then pod UID, ports by name, number, protocol) instead of by hash, and
//!   endpoints inside a slice are sorted, so equal inputs give equal objects;
//! - a subset emptied by the 1000-address cut is dropped rather than kept
//!   without addresses; `nodeName` is omitted when the pod has none;
//! - slices are labelled `managed-by: endpointslice-controller.berth.dev`, so berth and
//!   kube-controller-manager never adopt each other's slices;
//! - a pod that reports only `podIP` is read as if `podIPs` held it, as the
//!   API server's defaulting does;
//! - topology hints follow `spec.trafficDistribution` (`PreferSameZone`, its
//!   older name `PreferClose`, `PreferSameNode`) as upstream's `trafficdist`
//!   heuristics do; a Service annotated `service.kubernetes.io/topology-mode`
//!   (upstream's CPU-proportional topology cache) gets no hints;
//! - not computed here: the `last-change-trigger-time` annotation, which needs a clock.

mod endpoints;
mod error;
mod hints;
mod plan;
mod pod;
mod service;
mod slices;

pub use endpoints::{build_endpoints, comparable_subsets, endpoints_need_update};
pub use error::Error;
pub use plan::{plan_endpoint_slices, SlicePlan};
pub use pod::find_port;
pub use slices::{
    build_endpoint_slices, compute_desired_slices, DesiredSlices, NodeZones, SliceConfig,
    SliceGroup,
};

// The well-known names live in berth-api with every other name berth reads or writes; the
// short aliases keep this crate's code readable.
pub use berth_api::names::annotation::{
    ENDPOINTS_OVER_CAPACITY as ANNOTATION_OVER_CAPACITY,
    ENDPOINTS_OVER_CAPACITY_TRUNCATED as OVER_CAPACITY_TRUNCATED,
    TOPOLOGY_AWARE_HINTS as ANNOTATION_TOPOLOGY_AWARE_HINTS,
    TOPOLOGY_MODE as ANNOTATION_TOPOLOGY_MODE,
};
pub use berth_api::names::label::{
    ENDPOINTSLICE_MANAGED_BY as LABEL_MANAGED_BY,
    ENDPOINTSLICE_MANAGED_BY_BERTH as MANAGED_BY_BERTH,
    ENDPOINTSLICE_SERVICE_NAME as LABEL_SERVICE_NAME, HEADLESS as LABEL_HEADLESS,
    TOPOLOGY_ZONE as LABEL_TOPOLOGY_ZONE,
};

/// Most addresses (ready and not ready, counted per subset) one Endpoints object carries.
pub const MAX_ENDPOINTS_ADDRESSES: usize = 1000;
/// Default for the endpoints-per-slice limit (kube-controller-manager's default too).
pub const DEFAULT_MAX_ENDPOINTS_PER_SLICE: usize = 100;
/// Upper bound the API server enforces on the endpoints of one slice.
pub const MAX_ENDPOINTS_PER_SLICE_LIMIT: usize = 1000;

/// A computed value together with the inputs that were skipped on the way.
#[derive(Debug, Clone, PartialEq)]
pub struct Computed<T> {
    pub value: T,
    pub skipped: Vec<Error>,
}

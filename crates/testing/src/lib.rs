//! Builders, fakes and the lab harness shared by berth's integration tests and benches.
//!
//! Builders are named `mk_*` and take what their callers vary; everything else gets one fixed
//! default, so two tests building "the same" object really build the same object. Test input
//! that does not parse is a bug in the test, so builders panic with the reason rather than
//! returning errors.
//!
//! [`require`] says what a test needs from the machine: a missing requirement skips the test
//! with a printed reason, or fails it under `CI=true` / `BERTH_REQUIRE_ROOT=1`.
//!
//! Features: `datapath` (the datapath's input model and iptables hooks), `lab` (the lab API
//! server and namespace harness) and `bgp` (FRR routers for BGP tests); without them, the
//! Kubernetes object builders alone.
//!
//! Address plan the defaults follow: Services 10.96.0.0/16, pods 10.244.<node>.0/24, nodes and
//! clients on 198.18.0.0/24, load-balancer addresses 198.18.0.200 upward.

#[cfg(feature = "bgp")]
pub mod bgp;
#[cfg(feature = "datapath")]
pub mod datapath;
#[cfg(feature = "datapath")]
pub mod iptables;
#[cfg(feature = "lab")]
pub mod lab;
pub mod moto;
pub mod objects;
pub mod require;

#[cfg(feature = "datapath")]
pub use datapath::{mk_endpoint, mk_node_info, mk_service_port, port_name};
#[cfg(feature = "datapath")]
pub use iptables::{FailSwitch, Hooked, RestoreHook, RestoreTimer};
#[cfg(feature = "lab")]
pub use lab::{eventually, install_crds, start_lab, start_lab_with, unique_dir, WatchGate};
pub use objects::{
    from_json, mk_node, mk_node_json, mk_pod, mk_selector_service, mk_service, mk_service_json,
    mk_slice, mk_slice_json, PodFacts,
};
pub use require::{require, require_for, Requirement, DATAPATH_NEEDS};

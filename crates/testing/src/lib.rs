//! Builders, fakes and harness helpers shared by berth's integration tests and benches.
//!
//! Builders are named `mk_*` and take what their callers vary; everything else gets one fixed
//! default, so two tests building "the same" object really build the same object. Test input
//! that does not parse is a bug in the test, so builders panic with the reason rather than
//! returning errors.
//!
//! Address plan the defaults follow: Services 10.96.0.0/16, pods 10.244.<node>.0/24, nodes and
//! clients on 198.18.0.0/24, load-balancer addresses 198.18.0.200 upward.

pub mod datapath;
pub mod iptables;
pub mod lab;
pub mod objects;

pub use datapath::{mk_endpoint, mk_node_info, mk_service_port, port_name};
pub use iptables::{FailSwitch, Hooked, RestoreHook, RestoreTimer};
pub use lab::{
    eventually, install_crds, netns_ready, start_lab, start_lab_with, unique_dir, DATAPATH_TOOLS,
};
pub use objects::{
    from_json, mk_node, mk_node_json, mk_pod, mk_selector_service, mk_service, mk_service_json,
    mk_slice, mk_slice_json, PodFacts,
};

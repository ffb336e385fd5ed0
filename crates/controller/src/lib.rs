//! berth-controller: the kube-runtime controllers — allocation (ClusterIPs, NodePorts,
//! LoadBalancer IPs), Endpoints and EndpointSlices, load balancers, status, Events and leader
//! election (docs/architecture.md, "How a Service flows in the controller"). The decisions are
//! made by the pure crates (`berth-ipam`, `berth-endpoints`) and the pure modules here (the
//! allocation state machine with its `facts`, `plan`, `fresh` and `pools`, `lease::decide_lease`,
//! the patch builders in `allocation::write`); the rest reads the cluster, feeds them, and writes
//! their answers back.

pub mod allocation;
pub mod config;
mod controller;
pub mod datapath_report;
pub mod endpoints;
mod error;
pub mod events;
pub mod lease;
pub mod load_balancer;
pub mod metrics;
mod run;
mod service_feed;
mod written;

pub use config::{
    parse_default_class, parse_grace, parse_node_port_range, parse_reserved_addresses,
    parse_service_cidrs, ControllerConfig, ControllerOptions, LeaseConfig,
};
pub use controller::AllocationController;
pub use error::{Error, ErrorCategory, Retry};
pub use run::{run_controller, RunOptions};

// Re-exported so the binary can name the flags' types and stop the controller without
// dependencies of its own.
pub use berth_core::{AddressRange, PortRange};
pub use ipnet::IpNet;
pub use tokio_util::sync::CancellationToken;

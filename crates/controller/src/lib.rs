//! berth-controller: the kube-runtime controllers of DESIGN.md §2–5 — allocation (ClusterIPs,
//! NodePorts, LoadBalancer IPs), Endpoints and EndpointSlices, load balancers, status, Events and
//! leader election. The decisions are made by the pure crates (`berth-ipam`, `berth-endpoints`)
//! and the pure modules here (the allocation state machine with its `facts`, `plan`, `fresh` and
//! `pools`, `lease::decide_lease`, the patch builders in `allocation::apply`); the rest reads the
//! cluster, feeds them, and writes their answers back.

pub mod allocation;
pub mod config;
mod controller;
pub mod endpoints;
mod error;
pub mod events;
pub mod lease;
pub mod load_balancer;
pub mod metrics;
mod run;
mod service_feed;
mod written;

pub use config::{parse_default_class, parse_service_cidrs, ControllerConfig, LeaseConfig};
pub use controller::AllocationController;
pub use error::{api_error_category, Error};
pub use run::{run_controller, RunOptions};
/// Re-exported so the binary can stop the controller without its own dependency.
pub use tokio_util::sync::CancellationToken;

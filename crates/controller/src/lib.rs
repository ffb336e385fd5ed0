//! berth-controller: the kube-runtime controllers of DESIGN.md §2–5 — allocation (ClusterIPs,
//! NodePorts, LoadBalancer IPs), Endpoints and EndpointSlices, load balancers, status, Events and
//! leader election. The decisions are made by the pure crates (`berth-ipam`, `berth-endpoints`)
//! and the pure modules here (`facts`, `plan`, `pools`, `lease`); the rest reads the cluster,
//! feeds them, and writes their answers back.

mod error;
pub mod facts;
pub mod plan;
pub mod pools;

pub use error::Error;

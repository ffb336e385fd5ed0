//! berth-controller: the kube-runtime controllers of DESIGN.md §2–5 — allocation (ClusterIPs,
//! NodePorts, LoadBalancer IPs), Endpoints and EndpointSlices, load balancers, status, Events and
//! leader election. The decisions are made by the pure crates (`berth-ipam`, `berth-endpoints`);
//! this crate reads the cluster, feeds them, and writes their answers back.

pub mod endpoints;

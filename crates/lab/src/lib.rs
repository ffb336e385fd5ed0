//! berth-lab: the pieces of `berth lab`.
//!
//! [`apiserver`] is the `berth-apiserver` crate, re-exported: an in-memory Kubernetes API server that
//! speaks the real HTTP API, so that kube-rs clients, watchers and `kubectl` run against it unchanged.
//! It allocates nothing and runs no controllers: it is the ground truth that berth's controller and
//! agents are tested against. Its own crate keeps it out of what the rest of the lab compiles and
//! changes; the lab adds the cluster around it.
//!
//! [`netns`] binds sockets inside named network namespaces, so that one process can serve the lab's
//! namespaces (agents in node namespaces reach the API server there) and loopback in its own.
//!
//! [`workloads`] is the lab's controller-manager for `apps/v1`: Deployments roll out through
//! ReplicaSets whose pods the lab kubelet runs.
//!
//! [`topology`] builds the lab's network out of namespaces (a LAN bridge, nodes, pods, clients)
//! and deletes it again; [`echo`] is the small TCP/UDP server pods run, answering with the pod's
//! name and the client address it sees, which is what datapath tests assert on.

pub mod cluster;
pub mod echo;
pub mod kubelet;
pub mod netns;
pub mod topology;
pub mod workloads;

pub use berth_apiserver as apiserver;
pub use berth_apiserver::{
    run_apiserver, ApiServerOptions, Faults, LabApiServer, LabApiServerBuilder, LabApiServerHandle,
    Listener, RecordedRequest, RequestCounts,
};

//! berth-apiserver: the lab API server (docs/architecture.md, "The lab").
//!
//! An in-memory Kubernetes API server that speaks the real HTTP API, so that kube-rs clients,
//! watchers and `kubectl` run against it unchanged. It allocates nothing and runs no controllers:
//! it is the ground truth that berth's controller and agents are tested against. `berth-lab`
//! re-exports it as `berth_lab::apiserver` and builds the lab cluster around it; the production
//! binary built without the `lab` feature links neither.

pub mod columns;
pub mod defaults;
pub mod discovery;
pub mod error;
pub mod events;
pub mod faults;
pub mod fields;
mod http;
pub mod kubernetes;
pub mod managed;
pub mod patch;
pub mod protobuf;
pub mod resource;
pub mod scale;
pub mod schema;
pub mod selector;
mod server;
pub mod store;
pub mod table;
pub mod watch;
pub mod write;

#[cfg(test)]
mod store_tests;

pub use error::{ApiError, Error};
pub use faults::Faults;
pub use http::{RecordedRequest, RequestCounts};
pub use server::{
    kubeconfig_yaml, run_apiserver, write_kubeconfig, ApiServerOptions, LabApiServer,
    LabApiServerBuilder, LabApiServerHandle, Listener,
};

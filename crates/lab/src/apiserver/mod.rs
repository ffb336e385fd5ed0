//! The lab API server (docs/architecture.md, "The lab").

pub mod defaults;
pub mod discovery;
pub mod error;
pub mod events;
pub mod faults;
pub mod fields;
mod http;
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

pub use error::{ApiError, LabError};
pub use faults::Faults;
pub use http::{RecordedRequest, RequestCounts};
pub use server::{
    kubeconfig_yaml, run_apiserver, write_kubeconfig, ApiServerOptions, LabApiServer,
    LabApiServerBuilder, LabApiServerHandle, Listener,
};

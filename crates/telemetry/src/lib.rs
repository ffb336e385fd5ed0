//! Telemetry shared by every berth process: tracing setup, the `berth_` metrics registry and the admin
//! HTTP router (`/healthz`, `/readyz`, `/metrics`).
//!
//! Nothing here is global except the tracing subscriber, which `tracing` itself makes global: the
//! metrics registry and the readiness checks are values that the binary creates and hands down.

mod admin;
mod error;
mod logging;
mod metrics;
mod readiness;

pub use admin::{admin_router, serve_admin};
pub use error::Error;
pub use logging::{
    build_filter, build_subscriber, init_tracing, resolve_log_filter, LogConfig, LogFormat,
    DEFAULT_LOG_FILTER,
};
pub use metrics::{
    encode_registry, MetricsRegistry, SharedRegistry, METRIC_PREFIX, OPENMETRICS_CONTENT_TYPE,
};
pub use readiness::{CheckStatus, Readiness, ReadinessCheck, ReadinessReport};

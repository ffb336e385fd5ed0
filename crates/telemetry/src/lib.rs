//! Telemetry shared by every berth process: tracing setup, the `berth_` metrics registry and the admin
//! HTTP router (`/healthz`, `/readyz`, `/metrics`).
//!
//! Nothing here is global except the tracing subscriber, which `tracing` itself makes global: the
//! metrics registry, the readiness checks and the count of dropped log lines are values that the
//! binary creates and hands down.

mod admin;
mod error;
mod logging;
mod metrics;
mod readiness;
mod writer;

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
pub use writer::{build_non_blocking, DroppedLines, LogGuard, LOG_QUEUE_LINES};

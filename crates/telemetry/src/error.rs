use tracing_subscriber::filter::ParseError;
use tracing_subscriber::util::TryInitError;

/// Everything that can fail while setting up or serving telemetry.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown log format {0:?}: expected \"text\" or \"json\"")]
    UnknownLogFormat(String),

    #[error("invalid log filter {filter:?}")]
    InvalidLogFilter {
        filter: String,
        #[source]
        source: ParseError,
    },

    #[error("a global tracing subscriber is already installed")]
    TracingAlreadyInitialized(#[source] TryInitError),

    #[error("readiness check {0:?} is already registered and still held")]
    DuplicateReadinessCheck(String),

    #[error("encoding metrics as OpenMetrics text")]
    EncodeMetrics(#[source] std::fmt::Error),

    #[error("serving the admin endpoint")]
    Serve(#[source] std::io::Error),
}

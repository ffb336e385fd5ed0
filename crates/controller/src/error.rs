//! The crate's error type. Each variant has a stable category, used as a metric label.

/// Everything that can fail in berth-controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("allocator setup: {0}")]
    Allocator(#[from] berth_ipam::IpamError),
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("admin endpoint: {0}")]
    Telemetry(#[from] berth_telemetry::Error),
    #[error("binding the admin endpoint {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("leader election: {0}")]
    Lease(String),
    #[error("endpoints controller: {0}")]
    Endpoints(Box<crate::endpoints::Error>),
}

impl Error {
    pub(crate) fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            action: action.into(),
            source,
        }
    }

    /// A bounded label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Config(_) | Self::Allocator(_) => "config",
            Self::Kube { source, .. } => api_error_category(source),
            Self::Telemetry(_) | Self::Bind { .. } => "admin",
            Self::Lease(_) => "lease",
            Self::Endpoints(_) => "endpoints",
        }
    }
}

/// A bounded category for an API error: `conflict`, `not_found`, `invalid`, `throttled`,
/// `server`, `transport`.
pub fn api_error_category(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(s) => match s.code {
            409 => "conflict",
            404 => "not_found",
            400 | 422 => "invalid",
            429 => "throttled",
            _ => "server",
        },
        _ => "transport",
    }
}

use berth_endpoints::EndpointsError;

/// What went wrong in the endpoints controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid endpoints configuration")]
    Config(#[source] EndpointsError),
    #[error("{verb} {kind} {namespace}/{name}")]
    Write {
        verb: &'static str,
        kind: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("watching {kind}")]
    Watch {
        kind: &'static str,
        #[source]
        source: kube::runtime::watcher::Error,
    },
    #[error("a {kind} watcher ended")]
    WatcherEnded { kind: &'static str },
}

/// A bounded label for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCategory {
    Config,
    /// 409: someone wrote first; the next sync reads the newer object.
    Conflict,
    /// 404 on an update: the object went away under us.
    NotFound,
    /// 429.
    Throttled,
    /// 5xx and connection failures.
    Server,
    /// Other 4xx: berth sent something the API server refuses.
    Rejected,
    Watch,
}

impl ErrorCategory {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCategory::Config => "config",
            ErrorCategory::Conflict => "conflict",
            ErrorCategory::NotFound => "not_found",
            ErrorCategory::Throttled => "throttled",
            ErrorCategory::Server => "server",
            ErrorCategory::Rejected => "rejected",
            ErrorCategory::Watch => "watch",
        }
    }
}

pub(crate) fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

impl Error {
    pub fn category(&self) -> ErrorCategory {
        match self {
            Error::Config(_) => ErrorCategory::Config,
            Error::Watch { .. } | Error::WatcherEnded { .. } => ErrorCategory::Watch,
            Error::Write { source, .. } => match status_code(source) {
                Some(409) => ErrorCategory::Conflict,
                Some(404) => ErrorCategory::NotFound,
                Some(429) => ErrorCategory::Throttled,
                Some(code) if (400..500).contains(&code) => ErrorCategory::Rejected,
                _ => ErrorCategory::Server,
            },
        }
    }

    /// Whether trying again can help; a rejected write needs a different input first, but a
    /// change of the Service or its pods queues it again anyway.
    pub fn is_retryable(&self) -> bool {
        !matches!(
            self.category(),
            ErrorCategory::Config | ErrorCategory::Rejected
        )
    }
}

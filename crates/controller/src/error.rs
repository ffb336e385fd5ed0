//! The crate's one error type, and the one set of categories that every failure is counted,
//! reported and retried by: the allocation queue, the endpoints controller, the event writer
//! and the pool status writer all go through [`ErrorCategory`].

use kube::runtime::watcher;

/// What kind of failure: a bounded label for metrics (`category="..."`) and logs, and the
/// answer to whether trying again can help.
///
/// | category      | cause                                   | retried                              |
/// |---------------|-----------------------------------------|--------------------------------------|
/// | `conflict`    | 409                                     | at once: the newer object is already on its way through the watch |
/// | `throttled`   | 429                                     | with backoff                         |
/// | `server`      | 5xx                                     | with backoff                         |
/// | `transport`   | no answer: connection, timeout, TLS     | with backoff                         |
/// | `provider`    | a load balancer provider failed         | with the provider's slower backoff   |
/// | `watch`       | a watch failed or ended                 | with backoff (the watcher resumes)   |
/// | `lease`       | leader election                         | with backoff (the next attempt)      |
/// | `not_found`   | 404: the object went away under the write | with backoff, once the cache has seen it go (the allocation takes a 404 as the Service gone and releases it) |
/// | `invalid`     | 400, 422: the API server refuses what berth sent | with backoff: an admission policy or RBAC change can heal it while the object stays as it is |
/// | `rejected`    | any other 4xx (401, 403, ...)            | with backoff, as `invalid`           |
/// | `not_leading` | leadership was lost before the write    | no: the next term decides afresh     |
/// | `config`      | bad flags or allocator settings         | no                                   |
/// | `admin`       | the admin endpoint                      | no                                   |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCategory {
    Conflict,
    Throttled,
    Server,
    Transport,
    Provider,
    Watch,
    Lease,
    NotFound,
    Invalid,
    Rejected,
    NotLeading,
    Config,
    Admin,
}

/// How a failure of a category is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// After a short pause, without backoff.
    AtOnce,
    /// With exponential backoff.
    Backoff,
    /// Not until the object (or the configuration) changes.
    Never,
}

impl ErrorCategory {
    /// Every category, so error counters show each at zero from the start: an alert's
    /// `increase()` then sees a category's first error.
    pub const ALL: [ErrorCategory; 13] = [
        Self::Conflict,
        Self::Throttled,
        Self::Server,
        Self::Transport,
        Self::Provider,
        Self::Watch,
        Self::Lease,
        Self::NotFound,
        Self::Invalid,
        Self::Rejected,
        Self::NotLeading,
        Self::Config,
        Self::Admin,
    ];

    /// The category of a failed API call.
    pub fn of_api(error: &kube::Error) -> Self {
        match error {
            kube::Error::Api(status) => match status.code {
                409 => Self::Conflict,
                404 => Self::NotFound,
                429 => Self::Throttled,
                400 | 422 => Self::Invalid,
                code if (400..500).contains(&code) => Self::Rejected,
                _ => Self::Server,
            },
            _ => Self::Transport,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Conflict => "conflict",
            Self::Throttled => "throttled",
            Self::Server => "server",
            Self::Transport => "transport",
            Self::Provider => "provider",
            Self::Watch => "watch",
            Self::Lease => "lease",
            Self::NotFound => "not_found",
            Self::Invalid => "invalid",
            Self::Rejected => "rejected",
            Self::NotLeading => "not_leading",
            Self::Config => "config",
            Self::Admin => "admin",
        }
    }

    pub fn retry(self) -> Retry {
        match self {
            Self::Conflict => Retry::AtOnce,
            Self::Throttled
            | Self::Server
            | Self::Transport
            | Self::Provider
            | Self::Watch
            | Self::Lease
            | Self::NotFound
            | Self::Invalid
            | Self::Rejected => Retry::Backoff,
            Self::NotLeading | Self::Config | Self::Admin => Retry::Never,
        }
    }

    /// Whether trying again, unchanged, can help.
    pub fn is_retryable(self) -> bool {
        self.retry() != Retry::Never
    }
}

impl std::fmt::Display for ErrorCategory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything that can fail in berth-controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    #[error("allocator setup: {0}")]
    Allocator(#[from] berth_ipam::Error),
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("admin endpoint: {0}")]
    Telemetry(#[from] berth_telemetry::Error),
    #[error("leader election: {0}")]
    Lease(String),
    /// A write of the endpoints controller.
    #[error("{verb} {kind} {namespace}/{name}")]
    Write {
        verb: &'static str,
        kind: &'static str,
        namespace: String,
        name: String,
        // Boxed: the names would make every `Result` of the crate larger.
        #[source]
        source: Box<kube::Error>,
    },
    #[error("watching {kind}")]
    Watch {
        kind: &'static str,
        #[source]
        source: watcher::Error,
    },
    #[error("a {kind} watcher ended")]
    WatchEnded { kind: &'static str },
}

impl Error {
    pub(crate) fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            action: action.into(),
            source,
        }
    }

    pub fn category(&self) -> ErrorCategory {
        match self {
            Self::InvalidConfig(_) | Self::Allocator(_) => ErrorCategory::Config,
            Self::Kube { source, .. } => ErrorCategory::of_api(source),
            Self::Write { source, .. } => ErrorCategory::of_api(source),
            Self::Telemetry(_) => ErrorCategory::Admin,
            Self::Lease(_) => ErrorCategory::Lease,
            Self::Watch { .. } | Self::WatchEnded { .. } => ErrorCategory::Watch,
        }
    }

    /// Whether trying again can help; a write refused as invalid needs a different input
    /// first, and a change of its object queues it again anyway.
    pub fn is_retryable(&self) -> bool {
        self.category().is_retryable()
    }
}

/// The status code of a failed API call, when the API server answered.
pub(crate) fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn all_lists_every_category_once() {
        use super::ErrorCategory::{self, *};
        // No wildcard: a new variant does not compile here until it has a place in ALL.
        let place = |category: ErrorCategory| match category {
            Conflict => 0,
            Throttled => 1,
            Server => 2,
            Transport => 3,
            Provider => 4,
            Watch => 5,
            Lease => 6,
            NotFound => 7,
            Invalid => 8,
            Rejected => 9,
            NotLeading => 10,
            Config => 11,
            Admin => 12,
        };
        let places: Vec<usize> = ErrorCategory::ALL.into_iter().map(place).collect();
        assert_eq!(places, (0..ErrorCategory::ALL.len()).collect::<Vec<_>>());
    }

    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("test", "Test")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn api_errors_map_to_one_category_each() {
        for (code, category, retry) in [
            (409, "conflict", Retry::AtOnce),
            (429, "throttled", Retry::Backoff),
            (500, "server", Retry::Backoff),
            (503, "server", Retry::Backoff),
            (404, "not_found", Retry::Backoff),
            (400, "invalid", Retry::Backoff),
            (422, "invalid", Retry::Backoff),
            (403, "rejected", Retry::Backoff),
            (401, "rejected", Retry::Backoff),
        ] {
            let got = ErrorCategory::of_api(&api_error(code));
            assert_eq!((got.as_str(), got.retry()), (category, retry), "{code}");
        }
        let transport = kube::Error::LinesCodecMaxLineLengthExceeded;
        assert_eq!(ErrorCategory::of_api(&transport), ErrorCategory::Transport);
        assert!(ErrorCategory::Transport.is_retryable());
    }

    #[test]
    fn crate_errors_carry_the_category_of_their_cause() {
        let write = Error::Write {
            verb: "create",
            kind: "EndpointSlice",
            namespace: "ns".into(),
            name: "web-abc".into(),
            source: Box::new(api_error(422)),
        };
        assert_eq!(write.category(), ErrorCategory::Invalid);
        assert!(write.is_retryable());
        let conflict = Error::kube("patching", api_error(409));
        assert_eq!(conflict.category(), ErrorCategory::Conflict);
        assert!(conflict.is_retryable());
        assert!(!Error::InvalidConfig("bad".into()).is_retryable());
        assert!(Error::WatchEnded { kind: "Pod" }.is_retryable());
    }
}

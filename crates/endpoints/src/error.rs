use std::net::AddrParseError;

/// Why an input was skipped, or a configuration rejected.
///
/// The skip variants are not failures of the computation: the result is still
/// complete for every other pod. The controller turns them into log lines or
/// Events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("pod {namespace}/{pod}: invalid IP address {ip:?}")]
    InvalidPodIp {
        namespace: String,
        pod: String,
        ip: String,
        #[source]
        source: AddrParseError,
    },
    #[error("pod {namespace}/{pod} has no {family} address for Service {service}")]
    NoAddressForFamily {
        namespace: String,
        pod: String,
        service: String,
        family: &'static str,
    },
    #[error("skipping pod {namespace}/{pod} for Service {service}: node {node:?} not found")]
    NodeNotFound {
        namespace: String,
        pod: String,
        service: String,
        node: String,
    },
    #[error("max endpoints per slice must be between 1 and {max}, got {got}")]
    InvalidMaxEndpointsPerSlice { got: usize, max: usize },
}

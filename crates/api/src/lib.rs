//! berth's API: the `IPPool`, `L2Advertisement`, `BGPPeer`, `BGPAdvertisement`, `BFDProfile`
//! `ServiceL2Status` and `BGPSessionState` custom resources, their validation, the CRD manifests, and every
//! well-known name (annotations, labels, finalizers, classes, conditions).

mod annotations;
mod bgp;
mod bgpsession;
mod condition;
mod convert;
mod crds;
mod ippool;
mod l2advertisement;
mod l2status;
pub mod names;
mod schema;
mod service_checks;

pub use annotations::{
    ip_pool, requested_ips, requested_ips_with_spec, sharing_key, sharing_namespaces,
    AnnotationValue, RequestSource, RequestedIps,
};
pub use bgp::{
    parse_community, parse_seconds, BFDProfile, BFDProfileSpec, BGPAdvertisement,
    BGPAdvertisementSpec, BGPPeer, BGPPeerSpec, BGPStatus, Community, SecretRef,
    DEFAULT_BFD_INTERVAL_MS, DEFAULT_BFD_MULTIPLIER, DEFAULT_HOLD_TIME_SECS,
    DEFAULT_KEEPALIVE_TIME_SECS, DEFAULT_PEER_PORT,
};
pub use bgpsession::{BGPSessionState, BGPSessionStateSpec};
pub use condition::{
    bounded, find_condition, set_condition, MAX_CONDITION_MESSAGE, MAX_EVENT_NOTE,
};
pub use convert::{selector_matches, to_selector, validate_label_selector};
pub use crds::{crds, crds_yaml};
pub use ippool::{IPPool, IPPoolSpec, IPPoolStatus, ServiceAllocation};
pub use l2advertisement::{L2Advertisement, L2AdvertisementSpec};
pub use l2status::{ServiceL2Status, ServiceL2StatusSpec};
pub use schema::{address_rules, MAX_ADDRESSES, MAX_INTERFACES, MAX_PRIORITY, MIN_PRIORITY};
pub use service_checks::{
    check_service_size, dropped_entries, filter_external_ips, filter_source_ranges, Dropped,
    PortSize, ServiceBounds, ServicePolicy, TooLarge,
};

/// Everything that can fail in berth-api.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("annotation {key}: invalid value {value:?}: {reason}")]
    InvalidAnnotation {
        key: &'static str,
        value: String,
        reason: String,
    },
    #[error("spec.loadBalancerIP: invalid value {value:?}: {reason}")]
    InvalidLoadBalancerIp { value: String, reason: String },
    #[error("rendering the CRD {name} as YAML")]
    RenderCrd {
        name: String,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("converting the CRD {name} to JSON")]
    ConvertCrd {
        name: String,
        #[source]
        source: serde_json::Error,
    },
}

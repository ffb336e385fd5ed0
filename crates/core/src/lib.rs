//! berth-core: the words every berth crate shares, said once.
//!
//! Address families, protocols, traffic policies, ports and port ranges, label selectors,
//! field errors in the apiserver's wording, DNS-1123 and label names, and pool address
//! ranges. Plain data and pure functions: no Kubernetes client, no Kubernetes API types, no
//! async runtime. Conversions from Kubernetes types live in berth-api.
//!
//! # Decisions
//!
//! - **One parsing rule for pool addresses**: a CIDR with host bits set (`198.18.0.1/24`) is an
//!   error, as the apiserver and MetalLB treat it, never silently truncated.
//! - **Field errors** print as the apiserver's `field.Error` does, so users and tools recognise
//!   them, whichever crate found the problem.
//! - **Label selectors** are validated on their wire form (string operators), so the same
//!   checks serve a selector read from a Kubernetes object and one built in code.

mod address;
mod family;
mod field;
mod name;
mod pool;
mod port;
mod protocol;
mod selector;
mod traffic;

pub use address::{
    from_u128, is_buggy_ip, parse_address, to_u128, AddressError, AddressProblem, AddressRange,
    MAX_ADDRESS_LEN,
};
pub use family::{IpFamily, IpFamilyPolicy};
pub use field::{quoted, quoted_list, FieldError, FieldErrorKind, FieldErrors};
pub use name::{
    dns1123_label_problem, dns1123_subdomain_problem, interface_name_problem, label_key_problem,
    label_value_problem, DNS1123_LABEL_MAX_LEN, DNS1123_LABEL_PATTERN, DNS1123_SUBDOMAIN_MAX_LEN,
    DNS1123_SUBDOMAIN_PATTERN, INTERFACE_NAME_MAX_LEN, INTERFACE_NAME_PATTERN,
};
pub use pool::overlapping_pools;
pub use port::{PortRange, PortRangeError};
pub use protocol::Protocol;
pub use selector::{
    validate_selector, LabelSelector, LabelSelectorRequirement, Labels, SelectorOperator,
};
pub use traffic::TrafficPolicy;

/// A value that is not one of the spellings the API allows.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unsupported {what} {value:?}")]
pub struct UnknownValue {
    /// What was being parsed, e.g. `IP family`.
    pub what: &'static str,
    pub value: String,
}

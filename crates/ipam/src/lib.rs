//! berth-ipam: the ClusterIP, NodePort and LoadBalancer-IP allocators.
//!
//! Pure and single-writer: no Kubernetes client, no async runtime, no I/O. The controller
//! rebuilds state from the Services themselves (adopting what is already set, oldest
//! Service first) and then drives these allocators with plain data.
//!
//! - [`ClusterIpAllocator`] and [`plan_cluster_ips`]: `--service-cidr`, `ipFamilies`,
//!   `ipFamilyPolicy`, with the API server's static band and wording.
//! - [`NodePortAllocator`]: `--node-port-range`, one owner per port number.
//! - [`LbIpAllocator`]: IPPools, requested addresses, named pools, priority, sharing.
//!
//! Randomness is injected as a seeded [`rand::rngs::SmallRng`], so every run can be
//! replayed.

mod band;
mod cluster_ip;
mod error;
mod family;
mod hash;
mod lb;
mod node_port;
mod offsets;
mod pool;
mod runset;
mod selector;
mod sharing;
mod types;

pub use cluster_ip::ClusterIpAllocator;
pub use error::{FieldError, FieldErrorKind, FieldErrors, IpamError, PortField};
pub use family::{
    plan_cluster_ips, ClusterIpPlan, ClusterIpRequest, ClusterIpSlot, IpFamily, IpFamilyPolicy,
};
pub use lb::{LbIpAllocator, Orphan, ServiceView};
pub use node_port::{
    NodePortAllocator, NodePortAssignment, NodePortRequest, PortRange, ServicePortSpec,
};
pub use pool::{PoolSpec, PoolStatus};
pub use selector::{LabelSelector, LabelSelectorRequirement, Labels, SelectorOperator};
pub use sharing::{LbPort, TrafficPolicy};
pub use types::{OwnerKey, Protocol, ServiceKey};

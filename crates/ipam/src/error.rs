//! The crate's one error type. Where the Kubernetes API server reports the same failure,
//! the Display text is its wording, so users and tools recognise it; the LoadBalancer
//! sharing errors follow MetalLB's wording.

use std::fmt;
use std::net::IpAddr;

use berth_core::{FieldErrors, IpFamily, PortRange, PortRangeError};

/// Where a node port was asked for: printed as the API server's field prefix
/// (`spec.ports[0].nodePort: Invalid value: 40000: `), or nothing for a bare allocator call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortField {
    pub path: Option<String>,
    pub port: u16,
}

impl fmt::Display for PortField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{path}: Invalid value: {}: ", self.port),
            None => Ok(()),
        }
    }
}

/// Every failure of berth-ipam.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    // ---- configuration ----
    /// `--service-cidr` is unusable.
    #[error("invalid service CIDR {cidr}: {reason}")]
    InvalidServiceCidr { cidr: String, reason: String },
    /// `--node-port-range` is unusable.
    #[error(transparent)]
    InvalidPortRange(#[from] PortRangeError),
    /// An IPPool is unusable; the controller reports it on the pool.
    #[error("invalid IPPool {pool:?}: {reason}")]
    InvalidPool { pool: String, reason: String },

    // ---- ClusterIP ----
    /// Field validation of `ipFamilies`/`ipFamilyPolicy`/`clusterIPs`.
    #[error("{0}")]
    Invalid(FieldErrors),
    /// A ClusterIP asked for outside the service CIDR, or its network/broadcast address.
    #[error("failed to allocate IP {ip}: provided IP is not in the valid range. The range of valid IPs is {range}")]
    IpNotInRange { ip: IpAddr, range: String },
    /// A ClusterIP asked for inside a ServiceCIDR that is being deleted (or not Ready): it
    /// serves the addresses it holds and no new ones.
    #[error("failed to allocate IP {ip}: allocator not ready")]
    IpRangeNotReady { ip: IpAddr },
    /// A ClusterIP of a family the cluster has no CIDR for.
    #[error("failed to allocate IP {ip}: {family} is not configured on this cluster")]
    IpFamilyNotConfigured { ip: IpAddr, family: IpFamily },
    /// Dynamic allocation for a family the cluster has no CIDR for.
    #[error("failed to allocate a serviceIP: {family} is not configured on this cluster")]
    FamilyNotConfigured { family: IpFamily },
    /// A ClusterIP held by another Service.
    #[error("failed to allocate IP {ip}: provided IP is already allocated")]
    IpAlreadyAllocated { ip: IpAddr },
    /// Every address of the family's CIDR is taken.
    #[error("failed to allocate a serviceIP: range is full")]
    IpRangeFull { family: IpFamily },
    /// The Service already holds another ClusterIP of this family.
    #[error("failed to allocate IP {ip}: the Service already holds {held}, and a cluster IP may not change once set")]
    ClusterIpImmutable { ip: IpAddr, held: IpAddr },

    // ---- NodePort ----
    #[error("{at}provided port is not in the valid range. The range of valid ports is {range}")]
    PortNotInRange { at: PortField, range: PortRange },
    #[error("{at}provided port is already allocated")]
    PortAlreadyAllocated { at: PortField },
    #[error("failed to allocate a nodePort: range is full")]
    PortRangeFull,
    #[error("failed to allocate requested HealthCheck NodePort {port}: {reason}")]
    HealthCheckPort { port: u16, reason: String },
    #[error("failed to allocate a HealthCheck NodePort: range is full")]
    HealthCheckPortRangeFull,

    // ---- LoadBalancer IP ----
    /// A requested address lies in no IPPool.
    #[error("\"{ip}\" is not allowed in config")]
    NotAllowedByConfig { ip: IpAddr },
    /// The pool exists but its serviceAllocation does not admit the Service.
    #[error("pool {pool} not compatible for ip assignment")]
    PoolNotCompatible { pool: String },
    /// The named pool does not exist.
    #[error("unknown pool {pool:?}")]
    UnknownPool { pool: String },
    /// A requested address is not in the requested pool.
    #[error("{ip} is not in pool {pool:?}")]
    IpNotInPool { ip: IpAddr, pool: String },
    /// A requested address of a family the Service does not use, or two of one family.
    #[error("requested address {ip} does not match the Service's IP families")]
    RequestedFamilyMismatch { ip: IpAddr },
    /// The named pool has no usable address of the family left.
    #[error("no available IPs in pool {pool:?} for {family} IPFamily")]
    PoolExhausted { pool: String, family: IpFamily },
    /// No admitting autoAssign pool has a usable address of the family left.
    #[error("no available IPs for {family} IPFamily")]
    NoAvailableIps { family: IpFamily },
    /// The address is held by Services this one may not share with.
    #[error("can't share {ip} with {holders}: {reason}")]
    CannotShare {
        ip: IpAddr,
        holders: String,
        reason: String,
    },
    /// A port of the Service is already used on a shared address.
    #[error("port {port} is already in use on \"{ip}\"")]
    PortInUse { port: String, ip: IpAddr },
}

impl Error {
    /// Attaches the field path to a node-port error from a bare allocator call.
    pub fn at_field(self, path: impl Into<String>) -> Self {
        match self {
            Self::PortNotInRange { at, range } => Self::PortNotInRange {
                at: PortField {
                    path: Some(path.into()),
                    port: at.port,
                },
                range,
            },
            Self::PortAlreadyAllocated { at } => Self::PortAlreadyAllocated {
                at: PortField {
                    path: Some(path.into()),
                    port: at.port,
                },
            },
            other => other,
        }
    }

    /// A stable, bounded reason for Events, conditions and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidServiceCidr { .. }
            | Self::InvalidPortRange(_)
            | Self::InvalidPool { .. } => "InvalidConfig",
            Self::Invalid(_)
            | Self::IpFamilyNotConfigured { .. }
            | Self::FamilyNotConfigured { .. } => "InvalidIPFamilies",
            Self::IpNotInRange { .. }
            | Self::IpRangeNotReady { .. }
            | Self::PortNotInRange { .. } => "NotInRange",
            Self::IpAlreadyAllocated { .. }
            | Self::PortAlreadyAllocated { .. }
            | Self::CannotShare { .. }
            | Self::PortInUse { .. } => "AlreadyAllocated",
            Self::ClusterIpImmutable { .. } => "Immutable",
            Self::IpRangeFull { .. }
            | Self::PortRangeFull
            | Self::HealthCheckPortRangeFull
            | Self::PoolExhausted { .. }
            | Self::NoAvailableIps { .. } => "RangeFull",
            Self::HealthCheckPort { .. } => "HealthCheckNodePort",
            Self::NotAllowedByConfig { .. }
            | Self::PoolNotCompatible { .. }
            | Self::UnknownPool { .. }
            | Self::IpNotInPool { .. }
            | Self::RequestedFamilyMismatch { .. } => "NotAllowed",
        }
    }
}

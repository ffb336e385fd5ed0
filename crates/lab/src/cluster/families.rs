//! The address families of a lab's cluster and the pod CIDRs they take.

use berth_core::IpFamily;

use crate::topology::{SERVICE6_CIDR, SERVICE_CIDR};

use super::ClusterError;

/// The pod CIDR of the whole lab: every node's 10.244.<n>.0/24 lies inside.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The IPv6 pod CIDR of the whole lab: every node's fd00:244:<n>::/64 lies inside.
pub const CLUSTER6_CIDR: &str = "fd00:244::/48";

/// The address families of a lab's cluster: its Nodes' InternalIPs, pod addresses, Service
/// CIDRs and the families its agents program. The lab's namespaces carry IPv6 as soon as the
/// cluster uses it, IPv4 always (an IPv6-only cluster on dual-stack hosts); the control plane
/// is reached over the primary family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LabFamilies {
    #[default]
    Ipv4,
    Ipv6,
    /// IPv4 primary, as kind and kubeadm order a dual-stack cluster.
    Dual,
}

impl LabFamilies {
    /// The families in their cluster order, the primary first.
    pub fn families(self) -> &'static [IpFamily] {
        match self {
            LabFamilies::Ipv4 => &[IpFamily::V4],
            LabFamilies::Ipv6 => &[IpFamily::V6],
            LabFamilies::Dual => &[IpFamily::V4, IpFamily::V6],
        }
    }

    pub fn has(self, family: IpFamily) -> bool {
        self.families().contains(&family)
    }

    pub fn primary(self) -> IpFamily {
        self.families()[0]
    }

    /// The `--ip-family` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            LabFamilies::Ipv4 => "ipv4",
            LabFamilies::Ipv6 => "ipv6",
            LabFamilies::Dual => "dual",
        }
    }

    /// The controller's `--service-cidr`, one CIDR per family in cluster order.
    pub fn service_cidrs(self) -> String {
        self.per_family(SERVICE_CIDR, SERVICE6_CIDR)
    }

    /// The agents' `--cluster-cidr`.
    pub fn cluster_cidrs(self) -> String {
        self.per_family(CLUSTER_CIDR, CLUSTER6_CIDR)
    }

    fn per_family(self, v4: &str, v6: &str) -> String {
        let parts: Vec<&str> = self
            .families()
            .iter()
            .map(|f| match f {
                IpFamily::V4 => v4,
                IpFamily::V6 => v6,
            })
            .collect();
        parts.join(",")
    }
}

impl std::str::FromStr for LabFamilies {
    type Err = ClusterError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "ipv4" => Ok(LabFamilies::Ipv4),
            "ipv6" => Ok(LabFamilies::Ipv6),
            "dual" => Ok(LabFamilies::Dual),
            other => Err(ClusterError::Invalid(format!(
                "--ip-family {other:?}: expected ipv4, ipv6 or dual"
            ))),
        }
    }
}

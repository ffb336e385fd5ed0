//! `PlanOptions`: what a node's agent decides once for every plan it makes.

use ipnet::IpNet;

use crate::plan::dispatch::Dispatch;
use berth_core::IpFamily;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanOptions {
    pub family: IpFamily,
    pub dispatch: Dispatch,
    /// Pod CIDR of the cluster: traffic to a ClusterIP from outside it is masqueraded, and pod
    /// traffic to external destinations of Local Services short-circuits to all endpoints.
    pub cluster_cidr: Option<IpNet>,
    /// Masquerade all ClusterIP traffic (kube-proxy's `--masquerade-all`).
    pub masquerade_all: bool,
    pub random_fully: bool,
    /// Most rules in one dispatch-tree leaf chain.
    pub leaf_size: usize,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            family: IpFamily::V4,
            dispatch: Dispatch::Tree,
            cluster_cidr: None,
            masquerade_all: false,
            random_fully: true,
            leaf_size: 16,
        }
    }
}

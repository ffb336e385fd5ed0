//! `PlanOptions`: what a node's agent decides once for every plan it makes.

use ipnet::IpNet;

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
    /// kube-proxy's `--nodeport-addresses`: the node addresses node ports answer on.
    pub node_port_addresses: NodePortAddresses,
    /// The cluster's Service CIDRs (its `ServiceCIDR` objects, or the agent's `--service-cidr`):
    /// new connections to an address inside one of this family's that was not translated are
    /// rejected when it is a Service's ClusterIP (a port the Service does not have) and dropped
    /// otherwise (no Service holds it), as kube-proxy's nftables mode does. Empty: no such check.
    pub service_cidrs: Vec<IpNet>,
}

/// How the entry chains find a Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dispatch {
    /// kube-proxy's layout: one rule per Service address and port in `BERTH-SERVICES`.
    Linear,
    /// A tree of chains keyed by destination address (node ports by port range).
    #[default]
    Tree,
}

/// kube-proxy's `--nodeport-addresses`: CIDRs and the keyword `primary`. Node ports answer on
/// the node's own addresses inside the CIDRs (any family's `0.0.0.0/0` or `::/0`: all of them),
/// and on its primary address of the family when `primary` is given. Empty (the default): on
/// every local address, as kube-proxy's iptables mode without the flag.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodePortAddresses {
    pub cidrs: Vec<IpNet>,
    pub primary: bool,
}

impl NodePortAddresses {
    /// Whether the flag was given at all.
    pub fn is_set(&self) -> bool {
        self.primary || !self.cidrs.is_empty()
    }
}

impl std::str::FromStr for NodePortAddresses {
    type Err = String;

    /// A comma-separated list of CIDRs and `primary`, as kube-proxy's flag takes it.
    fn from_str(value: &str) -> Result<Self, String> {
        let mut out = NodePortAddresses::default();
        for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if entry == "primary" {
                out.primary = true;
                continue;
            }
            let net: IpNet = entry.parse().map_err(|_| {
                format!("{entry:?} is neither a CIDR (198.18.0.0/24, fd00::/64) nor \"primary\"")
            })?;
            if net.trunc() != net {
                return Err(format!(
                    "{entry:?} has host bits set: write {} instead",
                    net.trunc()
                ));
            }
            if !out.cidrs.contains(&net) {
                out.cidrs.push(net);
            }
        }
        Ok(out)
    }
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
            node_port_addresses: NodePortAddresses::default(),
            service_cidrs: Vec::new(),
        }
    }
}

impl PlanOptions {
    /// The Service CIDRs of the options' family, in the order given, without repeats.
    pub fn family_service_cidrs(&self) -> Vec<IpNet> {
        let mut out: Vec<IpNet> = Vec::new();
        for cidr in &self.service_cidrs {
            if self.family.contains(cidr.addr()) && !out.contains(cidr) {
                out.push(*cidr);
            }
        }
        out
    }

    /// Whether `addr` lies inside one of the family's Service CIDRs.
    pub fn in_service_cidrs(&self, addr: std::net::IpAddr) -> bool {
        self.service_cidrs
            .iter()
            .any(|cidr| self.family.contains(cidr.addr()) && cidr.contains(&addr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_port_addresses_parse_as_kube_proxy_takes_them() {
        let parsed: NodePortAddresses = "198.18.0.0/24, primary,fd00::/64,198.18.0.0/24"
            .parse()
            .unwrap();
        assert!(parsed.primary && parsed.is_set());
        let cidrs: Vec<String> = parsed.cidrs.iter().map(ToString::to_string).collect();
        assert_eq!(cidrs, ["198.18.0.0/24", "fd00::/64"]);
        assert!(!"".parse::<NodePortAddresses>().unwrap().is_set());
        for bad in [
            "198.18.0.1/24",
            "primary,eth0",
            "198.18.0.300/24",
            "Primary",
        ] {
            assert!(bad.parse::<NodePortAddresses>().is_err(), "{bad}");
        }
    }
}

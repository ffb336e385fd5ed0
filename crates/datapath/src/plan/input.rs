//! The node's view of Services and endpoints, as plain data: what `plan` consumes.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use berth_core::{IpFamily, Protocol, TrafficPolicy};
use ipnet::IpNet;

/// Default `sessionAffinityConfig.clientIP.timeoutSeconds` (three hours), as on the apiserver.
pub const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10_800;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SessionAffinity {
    #[default]
    None,
    ClientIp {
        timeout_seconds: u32,
    },
}

/// `status.loadBalancer.ingress[].ipMode`: only `Vip` addresses are captured on the node; `Proxy`
/// means the load balancer rewrites the destination itself, so the node must not short-circuit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum IpMode {
    #[default]
    Vip,
    Proxy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LoadBalancerIngress {
    pub ip: IpAddr,
    pub mode: IpMode,
}

/// `namespace/name:port`, kube-proxy's `ServicePortName`; the port part is omitted when unnamed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    pub namespace: String,
    pub name: String,
    pub port: String,
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port.is_empty() {
            write!(f, "{}/{}", self.namespace, self.name)
        } else {
            write!(f, "{}/{}:{}", self.namespace, self.name, self.port)
        }
    }
}

/// One endpoint of one Service port, with the EndpointSlice conditions already defaulted
/// (`serving` defaults to `ready`, `terminating` to false).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub port: u16,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// Shared: an agent holds every endpoint of the cluster twice (its slice's and its Service
    /// port's list), on a few nodes each; a string per endpoint was 7 MB at 100,000 endpoints.
    pub node_name: Option<Arc<str>>,
    /// The slice's `hints`; `None` when it gives neither zones nor nodes. Boxed: most endpoints
    /// have none, and an agent holds every endpoint of the cluster.
    pub hints: Option<Box<TopologyHints>>,
}

/// EndpointSlice `hints.forZones` and `hints.forNodes`: where the endpoints controller wants an
/// endpoint used (`trafficDistribution`). Read by [`crate::plan::categorize`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct TopologyHints {
    pub zones: Vec<String>,
    pub nodes: Vec<String>,
}

impl TopologyHints {
    /// `None` when both lists are empty, as kube-proxy reads a missing and an empty hint alike.
    pub fn boxed(zones: Vec<String>, nodes: Vec<String>) -> Option<Box<TopologyHints>> {
        (!zones.is_empty() || !nodes.is_empty()).then(|| Box::new(TopologyHints { zones, nodes }))
    }
}

impl Endpoint {
    pub fn is_local(&self, node: &NodeInfo) -> bool {
        self.node_name.as_deref() == Some(node.name.as_str())
    }

    /// The zones this endpoint is hinted for (empty: no zone hint).
    pub fn zone_hints(&self) -> &[String] {
        self.hints.as_deref().map_or(&[], |h| h.zones.as_slice())
    }

    /// The nodes this endpoint is hinted for (empty: no node hint).
    pub fn node_hints(&self) -> &[String] {
        self.hints.as_deref().map_or(&[], |h| h.nodes.as_slice())
    }

    /// The `ip:port` form used in DNAT targets, comments and chain-name hashes.
    pub fn address(&self) -> String {
        match self.ip {
            IpAddr::V4(ip) => format!("{ip}:{}", self.port),
            IpAddr::V6(ip) => format!("[{ip}]:{}", self.port),
        }
    }
}

/// One port of one Service, with everything the datapath needs and its endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServicePort {
    pub name: ServicePortName,
    pub protocol: Protocol,
    pub port: u16,
    pub cluster_ips: Vec<IpAddr>,
    pub node_port: Option<u16>,
    pub external_ips: Vec<IpAddr>,
    pub load_balancer_ingress: Vec<LoadBalancerIngress>,
    pub source_ranges: Vec<IpNet>,
    pub session_affinity: SessionAffinity,
    pub external_traffic_policy: TrafficPolicy,
    pub internal_traffic_policy: TrafficPolicy,
    pub health_check_node_port: Option<u16>,
    pub endpoints: EndpointList,
}

/// A Service port's endpoints, shared rather than copied: the agent's index keeps each slice's
/// list once, and a Service port fed by one slice (nearly all: a slice holds 100) reads the same
/// list; a full sync's copy of the view's ports copies none of them. Compared by content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct EndpointList(Arc<[Endpoint]>);

impl EndpointList {
    /// Changes the list through a `Vec`: a copy of it, which then replaces the list (another
    /// holder of the same list keeps the old one).
    pub fn edit<R>(&mut self, change: impl FnOnce(&mut Vec<Endpoint>) -> R) -> R {
        let mut endpoints = self.0.to_vec();
        let out = change(&mut endpoints);
        *self = EndpointList::from(endpoints);
        out
    }

    /// The endpoints to change in place; copied first when another holder shares them.
    pub fn make_mut(&mut self) -> &mut [Endpoint] {
        Arc::make_mut(&mut self.0)
    }

    /// Whether both are the same list, not merely equal ones.
    pub fn shares(&self, other: &EndpointList) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::ops::Deref for EndpointList {
    type Target = [Endpoint];

    fn deref(&self) -> &[Endpoint] {
        &self.0
    }
}

impl From<Vec<Endpoint>> for EndpointList {
    fn from(endpoints: Vec<Endpoint>) -> Self {
        EndpointList(Arc::from(endpoints))
    }
}

impl FromIterator<Endpoint> for EndpointList {
    fn from_iter<I: IntoIterator<Item = Endpoint>>(endpoints: I) -> Self {
        EndpointList(endpoints.into_iter().collect())
    }
}

impl<'a> IntoIterator for &'a EndpointList {
    type Item = &'a Endpoint;
    type IntoIter = std::slice::Iter<'a, Endpoint>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl ServicePort {
    /// Load-balancer addresses the node captures itself (`ipMode: VIP`) in one family.
    pub fn load_balancer_vips(&self, family: IpFamily) -> Vec<IpAddr> {
        self.load_balancer_ingress
            .iter()
            .filter(|ingress| ingress.mode == IpMode::Vip && family.contains(ingress.ip))
            .map(|ingress| ingress.ip)
            .collect()
    }

    pub fn externally_accessible(&self, family: IpFamily) -> bool {
        self.node_port.is_some()
            || self.external_ips.iter().any(|ip| family.contains(*ip))
            || !self.load_balancer_vips(family).is_empty()
    }

    pub fn external_policy_local(&self, family: IpFamily) -> bool {
        self.externally_accessible(family) && self.external_traffic_policy == TrafficPolicy::Local
    }

    pub fn internal_policy_local(&self) -> bool {
        self.internal_traffic_policy == TrafficPolicy::Local
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct NodeInfo {
    pub name: String,
    /// InternalIP then ExternalIP addresses of the Node's status, each in status order.
    pub addresses: Vec<IpAddr>,
    /// The Node's `topology.kubernetes.io/zone` label, for topology hints.
    pub zone: Option<String>,
}

impl NodeInfo {
    /// The node's primary address of `family`, as kube-proxy's `primary` reads it: the first
    /// InternalIP of that family, else the first ExternalIP.
    pub fn primary_address(&self, family: IpFamily) -> Option<IpAddr> {
        self.addresses
            .iter()
            .copied()
            .find(|ip| family.contains(*ip))
    }
}

/// Everything one node's datapath depends on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeView {
    pub node: NodeInfo,
    pub services: Vec<ServicePort>,
}

#[cfg(test)]
pub(crate) mod tests {
    //! Builders for the plan room's unit tests (berth-testing's depend on this crate).
    use super::*;
    use berth_core::TrafficPolicy;

    /// A TCP port 80 of `ns/svc:p` at ClusterIP 10.96.0.1 with Cluster policies.
    pub(crate) fn mk_port(endpoints: Vec<Endpoint>) -> ServicePort {
        ServicePort {
            name: ServicePortName {
                namespace: "ns".into(),
                name: "svc".into(),
                port: "p".into(),
            },
            protocol: berth_core::Protocol::Tcp,
            port: 80,
            cluster_ips: vec!["10.96.0.1".parse().unwrap()],
            node_port: None,
            external_ips: vec![],
            load_balancer_ingress: vec![],
            source_ranges: vec![],
            session_affinity: Default::default(),
            external_traffic_policy: TrafficPolicy::Cluster,
            internal_traffic_policy: TrafficPolicy::Cluster,
            health_check_node_port: None,
            endpoints: endpoints.into(),
        }
    }
}

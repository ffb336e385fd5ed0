//! Kubernetes objects -> the plain input model, with the proxy-mode and label filters.

use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::{EndpointHints, EndpointSlice};

use crate::error::Error;
use crate::plan::input::{
    Endpoint, EndpointList, IpMode, LoadBalancerIngress, NodeInfo, NodeView, ServicePort,
    ServicePortName, SessionAffinity, TopologyHints, DEFAULT_AFFINITY_TIMEOUT_SECONDS,
};
use berth_api::names::label;
use berth_core::{Protocol, TrafficPolicy};

/// `--proxy-mode`: which Services this agent programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyMode {
    /// Replaces kube-proxy: every Service not claimed by another proxy.
    #[default]
    Full,
    /// Only Services labelled `service-proxy-name: berth`, which kube-proxy ignores.
    Labeled,
    /// No datapath at all (kube-proxy does it).
    None,
}

impl FromStr for ProxyMode {
    type Err = Error;

    fn from_str(value: &str) -> Result<Self, Error> {
        match value {
            "full" => Ok(ProxyMode::Full),
            "labeled" => Ok(ProxyMode::Labeled),
            "none" => Ok(ProxyMode::None),
            _ => Err(invalid("--proxy-mode", "value", value)),
        }
    }
}

fn invalid(object: &str, field: &str, value: &str) -> Error {
    Error::InvalidInput {
        object: object.into(),
        field: field.into(),
        value: value.into(),
    }
}

/// Whether the Service gets a datapath on this agent at all.
pub fn is_proxied(svc: &Service, mode: ProxyMode) -> bool {
    let labels = svc.metadata.labels.as_ref();
    let label_value = |key: &str| {
        labels
            .and_then(|labels| labels.get(key))
            .map(String::as_str)
    };
    let spec = svc.spec.as_ref();
    let kind = spec
        .and_then(|spec| spec.type_.as_deref())
        .unwrap_or("ClusterIP");
    let headless = spec.and_then(|spec| spec.cluster_ip.as_deref()) == Some("None");
    if kind == "ExternalName" || headless || label_value(label::HEADLESS).is_some() {
        return false;
    }
    match (mode, label_value(label::SERVICE_PROXY_NAME)) {
        (ProxyMode::None, _) => false,
        (ProxyMode::Full, None) => true,
        (ProxyMode::Full | ProxyMode::Labeled, Some(name)) => {
            name == label::SERVICE_PROXY_NAME_BERTH
        }
        (ProxyMode::Labeled, None) => false,
    }
}

/// The Node's name, its InternalIP then ExternalIP addresses (so the first of a family is its
/// primary address, as kube-proxy picks it) and its zone label.
pub fn build_node_info(node: &Node) -> NodeInfo {
    let status = node
        .status
        .as_ref()
        .and_then(|status| status.addresses.as_deref())
        .unwrap_or_default();
    let of_type = |kind: &'static str| {
        status
            .iter()
            .filter(move |a| a.type_ == kind)
            .filter_map(|a| a.address.parse::<IpAddr>().ok())
    };
    let addresses = of_type("InternalIP").chain(of_type("ExternalIP")).collect();
    let zone = node
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(label::TOPOLOGY_ZONE))
        .filter(|zone| !zone.is_empty())
        .cloned();
    NodeInfo {
        name: node.metadata.name.clone().unwrap_or_default(),
        addresses,
        zone,
    }
}

pub use berth_api::{filter_external_ips, filter_source_ranges, Dropped, ServicePolicy};

/// An endpoint's `hints`, or `None` when it gives no zone and no node.
fn build_hints(hints: Option<&EndpointHints>) -> Option<Box<TopologyHints>> {
    let hints = hints?;
    let zones = hints
        .for_zones
        .iter()
        .flatten()
        .map(|z| z.name.clone())
        .collect();
    let nodes = hints
        .for_nodes
        .iter()
        .flatten()
        .map(|n| n.name.clone())
        .collect();
    TopologyHints::boxed(zones, nodes)
}

fn parse_ips(object: &str, field: &str, values: &[String]) -> Result<Vec<IpAddr>, Error> {
    values
        .iter()
        .filter(|value| !value.is_empty() && value.as_str() != "None")
        .map(|value| value.parse().map_err(|_| invalid(object, field, value)))
        .collect()
}

fn port_u16(object: &str, field: &str, value: Option<i32>) -> Result<Option<u16>, Error> {
    match value {
        None | Some(0) => Ok(None),
        Some(v) => u16::try_from(v)
            .map(Some)
            .map_err(|_| invalid(object, field, &v.to_string())),
    }
}

/// Node names, each held once however many endpoints name it: a Deployment's endpoints sit on
/// many nodes, so a name made per slice was still one allocation per endpoint (2.4 MB at
/// 100,000 endpoints). An agent keeps one for all slices ([`build_endpoints_with`]); a name no
/// endpoint holds any more is forgotten when the set has doubled since the last look, or on
/// [`NodeNames::prune`].
#[derive(Debug, Clone, Default)]
pub struct NodeNames {
    names: HashSet<Arc<str>>,
    /// How many names the last prune kept.
    kept: usize,
}

/// Fewer names than this are never pruned on the way: looking costs more than they hold.
const PRUNE_FLOOR: usize = 64;

impl NodeNames {
    /// `node`'s name, shared with every other endpoint on it.
    pub fn intern(&mut self, node: &str) -> Arc<str> {
        if let Some(known) = self.names.get(node) {
            return known.clone();
        }
        if self.names.len() >= 2 * self.kept.max(PRUNE_FLOOR) {
            self.prune();
        }
        let name: Arc<str> = Arc::from(node);
        self.names.insert(name.clone());
        name
    }

    /// Forgets the names no endpoint holds any more.
    pub fn prune(&mut self) {
        self.names.retain(|name| Arc::strong_count(name) > 1);
        self.kept = self.names.len();
    }

    /// How many names are held.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// Endpoints of one Service port, from the Service's EndpointSlices (first address of each
/// endpoint, as kube-proxy does; duplicates across slices are kept once).
pub fn build_endpoints(
    slices: &[&EndpointSlice],
    port_name: &str,
    protocol: Protocol,
) -> EndpointList {
    build_endpoints_with(slices, port_name, protocol, &mut NodeNames::default())
}

/// [`build_endpoints`], the node names taken from (and added to) `nodes`.
pub fn build_endpoints_with(
    slices: &[&EndpointSlice],
    port_name: &str,
    protocol: Protocol,
    nodes: &mut NodeNames,
) -> EndpointList {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for slice in slices {
        if slice.address_type == "FQDN" {
            continue;
        }
        let Some(target) = slice.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or("") == port_name
                && Protocol::from_spec(p.protocol.as_deref()) == Some(protocol)
        }) else {
            continue;
        };
        let Some(port) = target.port.and_then(|p| u16::try_from(p).ok()) else {
            continue;
        };
        for ep in &slice.endpoints {
            let Some(ip) = ep.addresses.first().and_then(|a| a.parse::<IpAddr>().ok()) else {
                continue;
            };
            if !seen.insert((ip, port)) {
                continue;
            }
            let conditions = ep.conditions.as_ref();
            let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
            let serving = conditions.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
            out.push(Endpoint {
                ip,
                port,
                ready,
                serving,
                terminating,
                node_name: ep.node_name.as_deref().map(|node| nodes.intern(node)),
                hints: build_hints(ep.hints.as_ref()),
            });
        }
    }
    // Held by the agent's index until the slice changes, in an allocation of its exact size.
    EndpointList::from(out)
}

/// The ports of one Service with their endpoints. `slices` may hold any slices: only those
/// labelled with this Service's name in its namespace are used. Everything the policy allows.
pub fn build_service_ports(
    svc: &Service,
    slices: &[EndpointSlice],
) -> Result<Vec<ServicePort>, Error> {
    build_service_ports_with(svc, slices, &ServicePolicy::allow_all()).map(|(ports, _)| ports)
}

/// The ports of one Service under `policy`, and the entries left out: an external IP the
/// policy does not allow, an entry of `externalIPs` or `loadBalancerSourceRanges` that does
/// not parse. One bad entry never costs the Service the rest of its datapath; when every
/// source range is bad, its load-balancer addresses are left out (closed, not open to all).
pub fn build_service_ports_with(
    svc: &Service,
    slices: &[EndpointSlice],
    policy: &ServicePolicy,
) -> Result<(Vec<ServicePort>, Vec<Dropped>), Error> {
    let mut dropped = Vec::new();
    let namespace = svc.metadata.namespace.clone().unwrap_or_default();
    let name = svc.metadata.name.clone().unwrap_or_default();
    let object = format!("Service {namespace}/{name}");
    let Some(spec) = svc.spec.as_ref() else {
        return Ok((Vec::new(), dropped));
    };
    let mut cluster_ips = parse_ips(
        &object,
        "spec.clusterIPs",
        spec.cluster_ips.as_deref().unwrap_or_default(),
    )?;
    if cluster_ips.is_empty() {
        cluster_ips = parse_ips(&object, "spec.clusterIP", spec.cluster_ip.as_slice())?;
    }
    let external_ips = filter_external_ips(
        spec.external_ips.as_deref().unwrap_or_default(),
        policy,
        &mut dropped,
    );
    let mut load_balancer_ingress: Vec<LoadBalancerIngress> = svc
        .status
        .as_ref()
        .and_then(|status| status.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|ingress| {
            ingress
                .iter()
                .filter_map(|i| {
                    let ip = i.ip.as_deref()?.parse().ok()?;
                    let mode = if i.ip_mode.as_deref() == Some("Proxy") {
                        IpMode::Proxy
                    } else {
                        IpMode::Vip
                    };
                    Some(LoadBalancerIngress { ip, mode })
                })
                .collect()
        })
        .unwrap_or_default();
    let is_lb = spec.type_.as_deref() == Some("LoadBalancer");
    let source_ranges = if is_lb {
        let given = spec
            .load_balancer_source_ranges
            .as_deref()
            .unwrap_or_default();
        filter_source_ranges(given, &mut dropped).unwrap_or_else(|| {
            load_balancer_ingress.clear();
            Vec::new()
        })
    } else {
        Vec::new()
    };
    let session_affinity = if spec.session_affinity.as_deref() == Some("ClientIP") {
        let timeout = spec
            .session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT_SECONDS);
        SessionAffinity::ClientIp {
            timeout_seconds: timeout,
        }
    } else {
        SessionAffinity::None
    };
    let external_traffic_policy = TrafficPolicy::from_spec(spec.external_traffic_policy.as_deref());
    let health_check_node_port = if is_lb && external_traffic_policy == TrafficPolicy::Local {
        port_u16(
            &object,
            "spec.healthCheckNodePort",
            spec.health_check_node_port,
        )?
    } else {
        None
    };
    let node_ports_apply = matches!(spec.type_.as_deref(), Some("NodePort" | "LoadBalancer"));
    let service_slices: Vec<&EndpointSlice> = slices
        .iter()
        .filter(|slice| {
            slice.metadata.namespace.as_deref().unwrap_or_default() == namespace
                && slice
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(label::ENDPOINTSLICE_SERVICE_NAME))
                    == Some(&name)
        })
        .collect();
    let mut ports = Vec::new();
    for (i, port) in spec.ports.iter().flatten().enumerate() {
        let protocol = Protocol::from_spec(port.protocol.as_deref()).ok_or_else(|| {
            invalid(
                &object,
                &format!("spec.ports[{i}].protocol"),
                port.protocol.as_deref().unwrap_or_default(),
            )
        })?;
        let number = port_u16(&object, &format!("spec.ports[{i}].port"), Some(port.port))?
            .ok_or_else(|| invalid(&object, &format!("spec.ports[{i}].port"), "0"))?;
        let node_port = if node_ports_apply {
            port_u16(
                &object,
                &format!("spec.ports[{i}].nodePort"),
                port.node_port,
            )?
        } else {
            None
        };
        let port_name = port.name.clone().unwrap_or_default();
        ports.push(ServicePort {
            name: ServicePortName {
                namespace: namespace.clone(),
                name: name.clone(),
                port: port_name.clone(),
            },
            protocol,
            port: number,
            cluster_ips: cluster_ips.clone(),
            node_port,
            external_ips: external_ips.clone(),
            load_balancer_ingress: if is_lb {
                load_balancer_ingress.clone()
            } else {
                Vec::new()
            },
            source_ranges: source_ranges.clone(),
            session_affinity,
            external_traffic_policy,
            internal_traffic_policy: TrafficPolicy::from_spec(
                spec.internal_traffic_policy.as_deref(),
            ),
            health_check_node_port,
            endpoints: build_endpoints(&service_slices, &port_name, protocol),
        });
    }
    Ok((ports, dropped))
}

/// The node's whole view. Services that cannot be read are skipped and returned as errors, so
/// one bad object never blocks the others.
pub fn build_node_view(
    node: &Node,
    services: &[Service],
    slices: &[EndpointSlice],
    mode: ProxyMode,
) -> (NodeView, Vec<Error>) {
    let mut view = NodeView {
        node: build_node_info(node),
        services: Vec::new(),
    };
    let mut errors = Vec::new();
    for svc in services.iter().filter(|svc| is_proxied(svc, mode)) {
        match build_service_ports(svc, slices) {
            Ok(ports) => view.services.extend(ports),
            Err(err) => errors.push(err),
        }
    }
    (view, errors)
}

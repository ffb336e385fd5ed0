//! The desired model: (Service, eligible nodes, config) -> the NLB, its target groups,
//! listeners and targets. Pure; every refusal is a [`ModelError`] naming the field or
//! annotation at fault.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use berth_api::names::{annotation as ann, aws_tag};
use berth_core::{Protocol, TrafficPolicy};

use crate::annotations::{parse_list, parse_map, parse_u16, parse_u8};
use crate::names::{build_name, name_problem};

/// A Service as the provider needs it: plain data, converted from the Kubernetes object by
/// the controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceFacts {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub ports: Vec<PortFacts>,
    pub annotations: BTreeMap<String, String>,
    pub external_traffic_policy: TrafficPolicy,
    pub health_check_node_port: Option<u16>,
}

impl ServiceFacts {
    /// `<namespace>/<name>`, the value of the `berth.dev/service` tag.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// One entry of `spec.ports`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortFacts {
    pub name: Option<String>,
    pub port: u16,
    pub protocol: Protocol,
    pub node_port: Option<u16>,
}

/// A node that may receive load-balancer traffic (the controller has already left out
/// excluded and deleting nodes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    /// `spec.providerID`, e.g. `aws:///us-east-1a/i-0123456789abcdef0`.
    pub provider_id: Option<String>,
    /// For `aws-load-balancer-target-node-labels`.
    pub labels: BTreeMap<String, String>,
}

/// Ready pod addresses for `ip` targets, per Service port number, with the port each listens on.
pub type IpTargets = BTreeMap<u16, BTreeSet<(IpAddr, u16)>>;

/// Provider settings (controller flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    /// `--cluster-name`: the value of the `berth.dev/cluster` tag.
    pub cluster_name: String,
    /// `--aws-subnets`: used when a Service names none.
    pub default_subnets: Vec<String>,
    pub quotas: Quotas,
}

/// The AWS quotas a Service is checked against before any call, so that one that cannot fit
/// is refused whole rather than half made. AWS's defaults; an account may have raised them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    /// "Listeners per Network Load Balancer".
    pub listeners_per_load_balancer: usize,
    /// "Target groups per Region" (every owner's, not only berth's).
    pub target_groups_per_region: usize,
    /// "Targets per target group per Region" (instances or IP addresses).
    pub targets_per_target_group: usize,
    /// "Targets per Network Load Balancer per Availability Zone" (registrations: a node
    /// counts once per target group).
    pub targets_per_zone: usize,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            listeners_per_load_balancer: 50,
            target_groups_per_region: 3000,
            targets_per_target_group: 1000,
            targets_per_zone: 500,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scheme {
    Internal,
    InternetFacing,
}

impl Scheme {
    pub const ALL: [Scheme; 2] = [Scheme::Internal, Scheme::InternetFacing];

    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Internal => "internal",
            Scheme::InternetFacing => "internet-facing",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == value)
    }
}

/// A listener's and target group's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TgProtocol {
    Tcp,
    Udp,
    TcpUdp,
}

impl TgProtocol {
    pub const ALL: [TgProtocol; 3] = [TgProtocol::Tcp, TgProtocol::Udp, TgProtocol::TcpUdp];

    pub fn as_str(self) -> &'static str {
        match self {
            TgProtocol::Tcp => "TCP",
            TgProtocol::Udp => "UDP",
            TgProtocol::TcpUdp => "TCP_UDP",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == value)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TargetType {
    Instance,
    Ip,
}

impl TargetType {
    pub fn as_str(self) -> &'static str {
        match self {
            TargetType::Instance => "instance",
            TargetType::Ip => "ip",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        [TargetType::Instance, TargetType::Ip]
            .into_iter()
            .find(|t| t.as_str() == value)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HcProtocol {
    Tcp,
    Http,
    Https,
}

impl HcProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            HcProtocol::Tcp => "TCP",
            HcProtocol::Http => "HTTP",
            HcProtocol::Https => "HTTPS",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        [HcProtocol::Tcp, HcProtocol::Http, HcProtocol::Https]
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(value))
    }
}

/// `traffic-port` or a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HcPort {
    TrafficPort,
    Port(u16),
}

impl fmt::Display for HcPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HcPort::TrafficPort => f.write_str("traffic-port"),
            HcPort::Port(p) => write!(f, "{p}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HealthCheck {
    pub protocol: HcProtocol,
    pub port: HcPort,
    /// HTTP(S) only.
    pub path: Option<String>,
    pub interval_seconds: u16,
    pub timeout_seconds: u16,
    pub healthy_threshold: u8,
    pub unhealthy_threshold: u8,
    /// HTTP(S) only: success codes, e.g. `200-399`.
    pub matcher: Option<String>,
}

/// A registered target: an instance ID or an IP address, and the port traffic goes to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Target {
    pub id: String,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LoadBalancerSpec {
    pub name: String,
    pub scheme: Scheme,
    pub subnets: BTreeSet<String>,
    /// Only the keys the Service names are managed.
    pub attributes: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TargetGroupSpec {
    /// `<port>/<protocol>`: the `berth.dev/resource` tag that matches it to what exists.
    pub resource: String,
    pub name: String,
    pub protocol: TgProtocol,
    /// The node port (instance targets) or the pod port (ip targets).
    pub port: u16,
    pub target_type: TargetType,
    pub health_check: HealthCheck,
    pub attributes: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
    pub targets: BTreeSet<Target>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ListenerSpec {
    pub port: u16,
    /// The target group's protocol; with `tls`, the listener itself is `TLS` (over `TCP`).
    pub protocol: TgProtocol,
    /// The `resource` of the target group it forwards to.
    pub target_group: String,
    /// TLS termination at the NLB (`aws-load-balancer-ssl-cert` and `-ssl-ports`).
    pub tls: Option<ListenerTls>,
}

/// A TLS listener's certificate and security policy.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ListenerTls {
    /// The ACM (or IAM) certificate ARN: the listener's default certificate.
    pub certificate: String,
    /// The security policy, e.g. `ELBSecurityPolicy-2016-08`.
    pub policy: String,
}

/// The security policy when `aws-load-balancer-ssl-negotiation-policy` names none (the AWS Load
/// Balancer Controller's default).
pub const DEFAULT_SSL_POLICY: &str = "ELBSecurityPolicy-2016-08";

/// Everything one Service needs in AWS.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Stack {
    /// `<namespace>/<name>`.
    pub service: String,
    pub load_balancer: LoadBalancerSpec,
    /// By `resource`.
    pub target_groups: BTreeMap<String, TargetGroupSpec>,
    /// By port.
    pub listeners: BTreeMap<u16, ListenerSpec>,
    /// Nodes left out because their `spec.providerID` names no EC2 instance (for an Event).
    pub skipped_nodes: Vec<String>,
}

/// Why a Service cannot be modelled; the message says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("annotation {annotation}: invalid value {value:?}: {reason}")]
    Annotation {
        annotation: &'static str,
        value: String,
        reason: String,
    },
    #[error("no subnets: set the {annotation} annotation or the controller's --aws-subnets", annotation = ann::AWS_LOAD_BALANCER_SUBNETS)]
    NoSubnets,
    #[error("spec.ports[{index}]: {reason}")]
    Port { index: usize, reason: String },
    #[error("spec.healthCheckNodePort: not assigned yet (externalTrafficPolicy: Local needs it)")]
    NoHealthCheckNodePort,
    #[error("spec.ports: a LoadBalancer Service needs at least one port")]
    NoPorts,
    #[error("{quota}: the Service needs {needed}, AWS allows {limit}{hint}")]
    Quota {
        /// The quota's name as AWS's Service Quotas console shows it.
        quota: &'static str,
        limit: usize,
        needed: usize,
        /// What to change, starting with "; ".
        hint: &'static str,
    },
}

fn annotation_error(
    annotation: &'static str,
    value: &str,
    reason: impl Into<String>,
) -> ModelError {
    ModelError::Annotation {
        annotation,
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// The tags every resource of the Service carries.
pub fn base_tags(
    config: &ProviderConfig,
    service: &str,
    resource: &str,
) -> BTreeMap<String, String> {
    BTreeMap::from([
        (aws_tag::CLUSTER.to_string(), config.cluster_name.clone()),
        (aws_tag::SERVICE.to_string(), service.to_string()),
        (aws_tag::RESOURCE.to_string(), resource.to_string()),
    ])
}

/// The target-group attribute that turns proxy protocol v2 on.
pub const PROXY_PROTOCOL_V2: &str = "proxy_protocol_v2.enabled";

/// The `berth.dev/resource` value of the load balancer.
pub const LOAD_BALANCER_RESOURCE: &str = "LoadBalancer";

/// The name of the Service's NLB for a scheme (the annotation's name wins when set).
pub fn load_balancer_name(config: &ProviderConfig, svc: &ServiceFacts, scheme: Scheme) -> String {
    build_name(
        &svc.namespace,
        &svc.name,
        &[&config.cluster_name, &svc.uid, scheme.as_str()],
    )
}

/// Every name the Service's NLB may have, whatever its scheme: where to look before creating.
pub fn load_balancer_names(config: &ProviderConfig, svc: &ServiceFacts) -> Vec<String> {
    let mut names: Vec<String> = Scheme::ALL
        .into_iter()
        .map(|s| load_balancer_name(config, svc, s))
        .collect();
    if let Some(custom) = svc.annotations.get(ann::AWS_LOAD_BALANCER_NAME) {
        if name_problem(custom).is_none() && !names.contains(custom) {
            names.push(custom.clone());
        }
    }
    names
}

pub(crate) fn scheme_of(svc: &ServiceFacts) -> Result<Scheme, ModelError> {
    match svc.annotations.get(ann::AWS_LOAD_BALANCER_SCHEME) {
        None => Ok(Scheme::Internal),
        Some(v) => Scheme::parse(v.trim()).ok_or_else(|| {
            annotation_error(
                ann::AWS_LOAD_BALANCER_SCHEME,
                v,
                "must be \"internal\" or \"internet-facing\"",
            )
        }),
    }
}

fn subnets_of(svc: &ServiceFacts, config: &ProviderConfig) -> Result<BTreeSet<String>, ModelError> {
    let (subnets, from_annotation) = match svc.annotations.get(ann::AWS_LOAD_BALANCER_SUBNETS) {
        Some(v) => (parse_list(v), Some(v)),
        None => (config.default_subnets.clone(), None),
    };
    if subnets.is_empty() {
        return Err(ModelError::NoSubnets);
    }
    if let (Some(v), Some(bad)) = (
        from_annotation,
        subnets.iter().find(|s| !s.starts_with("subnet-")),
    ) {
        // Names (the subnet's Name tag) would need ec2:DescribeSubnets, which berth does not call.
        return Err(annotation_error(
            ann::AWS_LOAD_BALANCER_SUBNETS,
            v,
            format!("{bad:?} is not a subnet ID (subnet-...); berth resolves no subnet names"),
        ));
    }
    Ok(subnets.into_iter().collect())
}

fn extra_tags(svc: &ServiceFacts) -> Result<BTreeMap<String, String>, ModelError> {
    let Some(v) = svc.annotations.get(ann::AWS_ADDITIONAL_RESOURCE_TAGS) else {
        return Ok(BTreeMap::new());
    };
    let tags = parse_map(v)
        .map_err(|reason| annotation_error(ann::AWS_ADDITIONAL_RESOURCE_TAGS, v, reason))?;
    if let Some(key) = tags.keys().find(|k| k.starts_with("berth.dev/")) {
        return Err(annotation_error(
            ann::AWS_ADDITIONAL_RESOURCE_TAGS,
            v,
            format!("{key:?}: the berth.dev/ tags are berth's own"),
        ));
    }
    Ok(tags)
}

fn attributes(
    svc: &ServiceFacts,
    annotation: &'static str,
) -> Result<BTreeMap<String, String>, ModelError> {
    match svc.annotations.get(annotation) {
        None => Ok(BTreeMap::new()),
        Some(v) => parse_map(v).map_err(|reason| annotation_error(annotation, v, reason)),
    }
}

fn health_check(svc: &ServiceFacts) -> Result<HealthCheck, ModelError> {
    let a = &svc.annotations;
    let local = svc.external_traffic_policy == TrafficPolicy::Local;
    let protocol = match a.get(ann::AWS_HEALTHCHECK_PROTOCOL) {
        Some(v) => HcProtocol::parse(v.trim()).ok_or_else(|| {
            annotation_error(
                ann::AWS_HEALTHCHECK_PROTOCOL,
                v,
                "must be TCP, HTTP or HTTPS",
            )
        })?,
        None if local => HcProtocol::Http,
        None => HcProtocol::Tcp,
    };
    let port = match a.get(ann::AWS_HEALTHCHECK_PORT).map(|v| v.trim()) {
        Some("traffic-port") => HcPort::TrafficPort,
        Some(v) => HcPort::Port(parse_u16(v).filter(|p| *p > 0).ok_or_else(|| {
            annotation_error(
                ann::AWS_HEALTHCHECK_PORT,
                v,
                "must be \"traffic-port\" or a port number",
            )
        })?),
        None if local => HcPort::Port(
            svc.health_check_node_port
                .ok_or(ModelError::NoHealthCheckNodePort)?,
        ),
        None => HcPort::TrafficPort,
    };
    let http = protocol != HcProtocol::Tcp;
    let path = match a.get(ann::AWS_HEALTHCHECK_PATH) {
        Some(v) if !v.starts_with('/') => {
            return Err(annotation_error(
                ann::AWS_HEALTHCHECK_PATH,
                v,
                "must start with /",
            ))
        }
        Some(v) => Some(v.clone()),
        None if local => Some("/healthz".to_string()),
        None => Some("/".to_string()),
    };
    let number = |key: &'static str, default: u16, range: (u16, u16)| -> Result<u16, ModelError> {
        match a.get(key) {
            None => Ok(default),
            Some(v) => parse_u16(v)
                .filter(|n| (range.0..=range.1).contains(n))
                .ok_or_else(|| {
                    annotation_error(
                        key,
                        v,
                        format!("must be a number from {} to {}", range.0, range.1),
                    )
                }),
        }
    };
    let threshold = |key: &'static str| -> Result<u8, ModelError> {
        match a.get(key) {
            None => Ok(3),
            Some(v) => parse_u8(v)
                .filter(|n| (2..=10).contains(n))
                .ok_or_else(|| annotation_error(key, v, "must be a number from 2 to 10")),
        }
    };
    let interval_seconds = number(ann::AWS_HEALTHCHECK_INTERVAL, 10, (5, 300))?;
    let timeout_seconds = number(
        ann::AWS_HEALTHCHECK_TIMEOUT,
        if http { 6 } else { 10 },
        (2, 120),
    )?;
    let matcher = if http {
        Some(
            a.get(ann::AWS_HEALTHCHECK_SUCCESS_CODES)
                .cloned()
                .unwrap_or_else(|| "200-399".to_string()),
        )
    } else {
        None
    };
    Ok(HealthCheck {
        protocol,
        port,
        path: if http { path } else { None },
        interval_seconds,
        timeout_seconds,
        healthy_threshold: threshold(ann::AWS_HEALTHCHECK_HEALTHY_THRESHOLD)?,
        unhealthy_threshold: threshold(ann::AWS_HEALTHCHECK_UNHEALTHY_THRESHOLD)?,
        matcher,
    })
}

/// The Availability Zone in a node's `spec.providerID` (`aws:///<zone>/<instance-id>`).
pub fn zone_of(provider_id: &str) -> Option<&str> {
    let rest = provider_id.strip_prefix("aws:///")?;
    let (zone, _) = rest.split_once('/')?;
    (!zone.is_empty()).then_some(zone)
}

/// The nodes `aws-load-balancer-target-node-labels` selects (all of them without it): every
/// label listed must be on the node with that value, as the AWS Load Balancer Controller's
/// node selector matches them.
fn target_nodes<'a>(
    svc: &ServiceFacts,
    nodes: &'a [NodeFacts],
) -> Result<Vec<&'a NodeFacts>, ModelError> {
    let Some(v) = svc.annotations.get(ann::AWS_TARGET_NODE_LABELS) else {
        return Ok(nodes.iter().collect());
    };
    let wanted =
        parse_map(v).map_err(|reason| annotation_error(ann::AWS_TARGET_NODE_LABELS, v, reason))?;
    Ok(nodes
        .iter()
        .filter(|n| wanted.iter().all(|(k, v)| n.labels.get(k) == Some(v)))
        .collect())
}

/// Refuses a stack that AWS would refuse part-way: checked before the first call.
fn check_quotas(
    stack: &Stack,
    quotas: &Quotas,
    zones: &BTreeMap<String, String>,
) -> Result<(), ModelError> {
    let listeners = stack.listeners.len();
    if listeners > quotas.listeners_per_load_balancer {
        return Err(ModelError::Quota {
            quota: "Listeners per Network Load Balancer",
            limit: quotas.listeners_per_load_balancer,
            needed: listeners,
            hint: "; split the ports over several Services",
        });
    }
    let mut per_zone: BTreeMap<&str, usize> = BTreeMap::new();
    for tg in stack.target_groups.values() {
        if tg.targets.len() > quotas.targets_per_target_group {
            return Err(ModelError::Quota {
                quota: "Targets per target group per Region",
                limit: quotas.targets_per_target_group,
                needed: tg.targets.len(),
                hint: TARGETS_HINT,
            });
        }
        for t in &tg.targets {
            if let Some(zone) = zones.get(&t.id) {
                *per_zone.entry(zone.as_str()).or_default() += 1;
            }
        }
    }
    if let Some((_, &needed)) = per_zone.iter().max_by_key(|(_, n)| **n) {
        if needed > quotas.targets_per_zone {
            return Err(ModelError::Quota {
                quota: "Targets per Network Load Balancer per Availability Zone",
                limit: quotas.targets_per_zone,
                needed,
                hint: TARGETS_HINT,
            });
        }
    }
    Ok(())
}

const TARGETS_HINT: &str = "; register fewer nodes with the service.beta.kubernetes.io/aws-load-balancer-target-node-labels annotation";

/// The EC2 instance ID in a node's `spec.providerID` (`aws:///<zone>/<instance-id>`).
pub fn instance_id(provider_id: &str) -> Option<&str> {
    let rest = provider_id.strip_prefix("aws://")?;
    let id = rest.rsplit('/').next()?;
    let hex = id.strip_prefix("i-")?;
    let valid = (hex.len() == 8 || hex.len() == 17) && hex.chars().all(|c| c.is_ascii_hexdigit());
    valid.then_some(id)
}

/// One listener's worth of Service ports: TCP, UDP, or both on one port (TCP_UDP).
struct Listening {
    port: u16,
    protocol: TgProtocol,
    node_port: Option<u16>,
    /// The names of the Service ports it serves (for `aws-load-balancer-ssl-ports`).
    names: Vec<String>,
}

/// The ports that get a TLS listener, as the AWS Load Balancer Controller reads
/// `aws-load-balancer-ssl-cert` and `-ssl-ports`: none without a certificate; with one, the
/// ports `-ssl-ports` lists by number or name, or every port when it is absent.
fn tls_of(
    svc: &ServiceFacts,
    listenings: &[Listening],
) -> Result<BTreeMap<u16, ListenerTls>, ModelError> {
    let Some(certs) = svc.annotations.get(ann::AWS_SSL_CERT) else {
        return Ok(BTreeMap::new());
    };
    let certificate = match parse_list(certs).as_slice() {
        [one] => one.clone(),
        [] => {
            return Err(annotation_error(
                ann::AWS_SSL_CERT,
                certs,
                "names no certificate",
            ))
        }
        _ => {
            return Err(annotation_error(
                ann::AWS_SSL_CERT,
                certs,
                "berth sets one certificate per listener; more are not supported yet",
            ))
        }
    };
    let policy = match svc.annotations.get(ann::AWS_SSL_NEGOTIATION_POLICY) {
        None => DEFAULT_SSL_POLICY.to_string(),
        Some(p) if p.trim().is_empty() => {
            return Err(annotation_error(
                ann::AWS_SSL_NEGOTIATION_POLICY,
                p,
                "is empty",
            ))
        }
        Some(p) => p.trim().to_string(),
    };
    let wanted: Option<Vec<String>> = svc
        .annotations
        .get(ann::AWS_SSL_PORTS)
        .map(|v| parse_list(v));
    let mut out = BTreeMap::new();
    for l in listenings {
        let chosen = match &wanted {
            None => true,
            Some(list) => list
                .iter()
                .any(|w| *w == l.port.to_string() || l.names.contains(w)),
        };
        if !chosen {
            continue;
        }
        if l.protocol != TgProtocol::Tcp {
            let value = svc.annotations.get(ann::AWS_SSL_PORTS).unwrap_or(certs);
            return Err(annotation_error(
                if wanted.is_some() {
                    ann::AWS_SSL_PORTS
                } else {
                    ann::AWS_SSL_CERT
                },
                value,
                format!(
                    "port {} is {}: TLS listeners serve TCP only (list the TCP ports in {})",
                    l.port,
                    l.protocol.as_str(),
                    ann::AWS_SSL_PORTS
                ),
            ));
        }
        out.insert(
            l.port,
            ListenerTls {
                certificate: certificate.clone(),
                policy: policy.clone(),
            },
        );
    }
    Ok(out)
}

fn listenings(svc: &ServiceFacts) -> Result<Vec<Listening>, ModelError> {
    if svc.ports.is_empty() {
        return Err(ModelError::NoPorts);
    }
    let mut by_port: BTreeMap<u16, Vec<(usize, &PortFacts)>> = BTreeMap::new();
    for (index, p) in svc.ports.iter().enumerate() {
        if p.protocol == Protocol::Sctp {
            return Err(ModelError::Port {
                index,
                reason: "SCTP is not supported by Network Load Balancers".to_string(),
            });
        }
        by_port.entry(p.port).or_default().push((index, p));
    }
    by_port
        .into_iter()
        .map(|(port, entries)| {
            let protocol = match entries.as_slice() {
                [(_, p)] if p.protocol == Protocol::Udp => TgProtocol::Udp,
                [_] => TgProtocol::Tcp,
                [(_, a), (index, b)] if a.protocol != b.protocol => {
                    if a.node_port != b.node_port {
                        return Err(ModelError::Port {
                            index: *index,
                            reason: format!(
                                "TCP and UDP on port {port} need the same nodePort to share one TCP_UDP listener"
                            ),
                        });
                    }
                    TgProtocol::TcpUdp
                }
                [.., (index, _)] => {
                    return Err(ModelError::Port {
                        index: *index,
                        reason: format!("port {port} is declared more than once for one protocol"),
                    })
                }
                [] => unreachable_empty(port)?,
            };
            Ok(Listening {
                port,
                protocol,
                node_port: entries[0].1.node_port,
                names: entries.iter().filter_map(|(_, p)| p.name.clone()).collect(),
            })
        })
        .collect()
}

// A group is built from at least one port, so this cannot happen; it is an error rather than
// a panic all the same.
fn unreachable_empty(port: u16) -> Result<TgProtocol, ModelError> {
    Err(ModelError::Port {
        index: 0,
        reason: format!("port {port} has no protocol"),
    })
}

/// The Service's stack. `ip_targets` is used only with `nlb-target-type: ip`.
pub fn build_stack(
    svc: &ServiceFacts,
    nodes: &[NodeFacts],
    ip_targets: &IpTargets,
    config: &ProviderConfig,
) -> Result<Stack, ModelError> {
    let service = svc.key();
    let scheme = scheme_of(svc)?;
    let name = load_balancer_name_of(svc, config, scheme)?;
    let extra = extra_tags(svc)?;
    let tags_for = |resource: &str| {
        let mut tags = extra.clone();
        tags.extend(base_tags(config, &service, resource));
        tags
    };
    let target_type = target_type_of(svc)?;
    let health_check = health_check(svc)?;
    let tg_attributes = target_group_attributes(svc)?;
    let instances = match target_type {
        TargetType::Instance => instances_of(&target_nodes(svc, nodes)?),
        TargetType::Ip => Instances::default(),
    };
    let mut target_groups = BTreeMap::new();
    let mut listeners = BTreeMap::new();
    let listenings = listenings(svc)?;
    let mut tls = tls_of(svc, &listenings)?;
    for (index, l) in listenings.into_iter().enumerate() {
        let resource = format!("{}/{}", l.port, l.protocol.as_str());
        let (port, targets) = match target_type {
            TargetType::Instance => instance_targets(index, &l, &instances.ids)?,
            TargetType::Ip => ip_targets_of(&l, ip_targets),
        };
        let name = build_name(
            &svc.namespace,
            &svc.name,
            &[
                &config.cluster_name,
                &svc.uid,
                &resource,
                &port.to_string(),
                target_type.as_str(),
            ],
        );
        target_groups.insert(
            resource.clone(),
            TargetGroupSpec {
                resource: resource.clone(),
                name,
                protocol: l.protocol,
                port,
                target_type,
                health_check: health_check.clone(),
                attributes: tg_attributes.clone(),
                tags: tags_for(&resource),
                targets,
            },
        );
        listeners.insert(
            l.port,
            ListenerSpec {
                port: l.port,
                protocol: l.protocol,
                target_group: resource,
                tls: tls.remove(&l.port),
            },
        );
    }
    let stack = Stack {
        load_balancer: LoadBalancerSpec {
            name,
            scheme,
            subnets: subnets_of(svc, config)?,
            attributes: attributes(svc, ann::AWS_LOAD_BALANCER_ATTRIBUTES)?,
            tags: tags_for(LOAD_BALANCER_RESOURCE),
        },
        service,
        target_groups,
        listeners,
        skipped_nodes: instances.skipped_nodes,
    };
    check_quotas(&stack, &config.quotas, &instances.zones)?;
    Ok(stack)
}

/// The load balancer's name: the annotation's, checked, or one derived from the Service.
fn load_balancer_name_of(
    svc: &ServiceFacts,
    config: &ProviderConfig,
    scheme: Scheme,
) -> Result<String, ModelError> {
    match svc.annotations.get(ann::AWS_LOAD_BALANCER_NAME) {
        Some(custom) => match name_problem(custom) {
            Some(problem) => Err(annotation_error(
                ann::AWS_LOAD_BALANCER_NAME,
                custom,
                problem,
            )),
            None => Ok(custom.clone()),
        },
        None => Ok(load_balancer_name(config, svc, scheme)),
    }
}

fn target_type_of(svc: &ServiceFacts) -> Result<TargetType, ModelError> {
    match svc.annotations.get(ann::AWS_NLB_TARGET_TYPE) {
        None => Ok(TargetType::Instance),
        Some(v) => TargetType::parse(v.trim()).ok_or_else(|| {
            annotation_error(
                ann::AWS_NLB_TARGET_TYPE,
                v,
                "must be \"instance\" or \"ip\"",
            )
        }),
    }
}

/// The target groups' attributes, with proxy protocol v2 when the Service asks for it.
fn target_group_attributes(svc: &ServiceFacts) -> Result<BTreeMap<String, String>, ModelError> {
    let mut tg_attributes = attributes(svc, ann::AWS_TARGET_GROUP_ATTRIBUTES)?;
    // As the AWS Load Balancer Controller: `*` is the only value, and it wins over the
    // attribute given through `target-group-attributes`.
    if let Some(v) = svc.annotations.get(ann::AWS_PROXY_PROTOCOL) {
        if v.trim() != "*" {
            return Err(annotation_error(
                ann::AWS_PROXY_PROTOCOL,
                v,
                "must be \"*\" (proxy protocol v2 on every port)",
            ));
        }
        tg_attributes.insert(PROXY_PROTOCOL_V2.to_string(), "true".to_string());
    }
    Ok(tg_attributes)
}

/// The EC2 instances behind the selected nodes, their zones, and the nodes that name none.
#[derive(Default)]
struct Instances {
    ids: BTreeSet<String>,
    zones: BTreeMap<String, String>,
    skipped_nodes: Vec<String>,
}

fn instances_of(selected: &[&NodeFacts]) -> Instances {
    let mut out = Instances::default();
    for node in selected {
        let provider_id = node.provider_id.as_deref();
        match provider_id.and_then(instance_id) {
            Some(id) => {
                out.ids.insert(id.to_string());
                if let Some(zone) = provider_id.and_then(zone_of) {
                    out.zones.insert(id.to_string(), zone.to_string());
                }
            }
            None => out.skipped_nodes.push(node.name.clone()),
        }
    }
    out
}

/// Instance targets: every instance on the port's nodePort.
fn instance_targets(
    index: usize,
    l: &Listening,
    instances: &BTreeSet<String>,
) -> Result<(u16, BTreeSet<Target>), ModelError> {
    let node_port = l.node_port.ok_or_else(|| ModelError::Port {
        index,
        reason: format!(
            "port {} has no nodePort, which instance targets need",
            l.port
        ),
    })?;
    let targets = instances
        .iter()
        .map(|id| Target {
            id: id.clone(),
            port: node_port,
        })
        .collect();
    Ok((node_port, targets))
}

/// IP targets: the port's ready pods, each on its own port.
fn ip_targets_of(l: &Listening, ip_targets: &IpTargets) -> (u16, BTreeSet<Target>) {
    let pods = ip_targets.get(&l.port).cloned().unwrap_or_default();
    // The target group's own port is only a default; each IP target carries its port.
    let port = pods.iter().map(|(_, p)| *p).min().unwrap_or(l.port);
    let targets = pods
        .into_iter()
        .map(|(ip, p)| Target {
            id: ip.to_string(),
            port: p,
        })
        .collect();
    (port, targets)
}

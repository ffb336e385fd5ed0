//! What `berth explain service` says about a Service from the API alone (pure): its addresses
//! and ports, who announces each LoadBalancer address and why (the election's inputs, as the
//! agents compute it), and its endpoints per node with their conditions.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use berth_api::L2AdvertisementSpec;
use berth_l2::election::{election_key, Pool};
use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// Everything read from the API for one Service.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub service: Service,
    pub slices: Vec<EndpointSlice>,
    pub nodes: Vec<Node>,
    /// The agents' liveness Leases (`berth-agent-<node>`).
    pub leases: Vec<Lease>,
    pub pools: Vec<Pool>,
    pub advertisements: Vec<(String, L2AdvertisementSpec)>,
    /// The announcing agents' records (`ServiceL2Status`, any namespace).
    pub records: Vec<berth_api::ServiceL2Status>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortLine {
    pub name: String,
    pub protocol: String,
    pub port: i32,
    pub target: String,
    pub node_port: Option<i32>,
}

/// One node's standing in the election for one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub node: String,
    /// Why the node cannot announce; empty when it is a candidate.
    pub excluded_because: Vec<String>,
    /// The first 8 bytes of sha256(node + "#" + ip), hex: the smallest candidate wins.
    pub key: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    pub ip: IpAddr,
    pub pools: Vec<String>,
    pub advertised_by: Vec<String>,
    pub candidates: Vec<Candidate>,
    /// The candidate with the smallest key, as every agent computes it.
    pub elected: Option<String>,
    /// The node whose agent records announcing the address (its `ServiceL2Status`).
    pub annotated: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointLine {
    pub address: String,
    pub pod: String,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub namespace: String,
    pub name: String,
    pub type_: String,
    pub external_policy: String,
    pub internal_policy: String,
    pub cluster_ips: Vec<String>,
    pub load_balancer_ips: Vec<IpAddr>,
    pub external_ips: Vec<String>,
    pub ports: Vec<PortLine>,
    pub announcements: Vec<Announcement>,
    /// Node name ("" when a slice names none) -> endpoints.
    pub endpoints: BTreeMap<String, Vec<EndpointLine>>,
}

/// Whether the agent on `node` holds an unexpired Lease at `now`.
fn lease_live(leases: &[Lease], node: &str, now: DateTime<Utc>) -> bool {
    let name = berth_api::names::lease::agent_lease_name(node);
    leases.iter().any(|l| {
        l.metadata.name.as_deref() == Some(name.as_str())
            && l.spec.as_ref().is_some_and(|s| {
                let renewed = s.renew_time.as_ref().map(|t| t.0.as_second()).unwrap_or(0);
                let duration = i64::from(s.lease_duration_seconds.unwrap_or(0));
                renewed + duration >= now.timestamp()
            })
    })
}

fn node_labels(node: &Node) -> BTreeMap<String, String> {
    node.metadata.labels.clone().unwrap_or_default()
}

fn hex8(key: &[u8; 32]) -> String {
    key[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Nodes with a Ready endpoint of the Service.
fn ready_nodes(slices: &[EndpointSlice]) -> BTreeSet<String> {
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
        .filter_map(|e| e.node_name.clone())
        .collect()
}

fn announcement(inputs: &Inputs, ip: IpAddr, local_only: bool, now: DateTime<Utc>) -> Announcement {
    let pools: Vec<&Pool> = inputs.pools.iter().filter(|p| p.contains(ip)).collect();
    let advertised_by: Vec<String> = inputs
        .advertisements
        .iter()
        .filter(|(_, adv)| pools.iter().any(|p| adv.selects_pool(&p.name, &p.labels)))
        .map(|(name, _)| name.clone())
        .collect();
    let with_endpoint = ready_nodes(&inputs.slices);
    let mut candidates: Vec<Candidate> = inputs
        .nodes
        .iter()
        .filter_map(|node| {
            let name = node.metadata.name.clone()?;
            let labels = node_labels(node);
            let mut why = Vec::new();
            if !lease_live(&inputs.leases, &name, now) {
                why.push("its agent holds no live Lease".to_owned());
            }
            if labels.contains_key(berth_api::names::label::EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS) {
                why.push("excluded from external load balancers".to_owned());
            }
            if node.metadata.deletion_timestamp.is_some() {
                why.push("being deleted".to_owned());
            }
            let unavailable = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == "NetworkUnavailable" && c.status == "True")
                });
            if unavailable {
                why.push("NetworkUnavailable".to_owned());
            }
            let selected = inputs.advertisements.iter().any(|(_, adv)| {
                pools.iter().any(|p| adv.selects_pool(&p.name, &p.labels))
                    && adv.selects_node(&labels)
            });
            if !selected {
                why.push("no L2Advertisement selects it".to_owned());
            }
            if local_only && !with_endpoint.contains(&name) {
                why.push("no Ready endpoint here (externalTrafficPolicy: Local)".to_owned());
            }
            Some(Candidate {
                key: hex8(&election_key(&name, ip)),
                node: name,
                excluded_because: why,
            })
        })
        .collect();
    candidates.sort_by(|a, b| (&a.key, &a.node).cmp(&(&b.key, &b.node)));
    let elected = if pools.is_empty() || advertised_by.is_empty() {
        None
    } else {
        candidates
            .iter()
            .find(|c| c.excluded_because.is_empty())
            .map(|c| c.node.clone())
    };
    let meta = &inputs.service.metadata;
    let ip_text = ip.to_string();
    let annotated = inputs
        .records
        .iter()
        .find(|r| {
            Some(&r.spec.service_namespace) == meta.namespace.as_ref()
                && Some(&r.spec.service_name) == meta.name.as_ref()
                && r.spec.addresses.contains(&ip_text)
        })
        .map(|r| r.spec.node.clone());
    Announcement {
        ip,
        pools: pools.iter().map(|p| p.name.clone()).collect(),
        advertised_by,
        candidates,
        elected,
        annotated,
    }
}

pub fn build_report(inputs: &Inputs, now: DateTime<Utc>) -> Report {
    let svc = &inputs.service;
    let spec = svc.spec.clone().unwrap_or_default();
    let external_policy = spec
        .external_traffic_policy
        .clone()
        .unwrap_or_else(|| "Cluster".into());
    let load_balancer_ips: Vec<IpAddr> = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect();
    let local_only = external_policy == "Local";
    let announcements = load_balancer_ips
        .iter()
        .map(|ip| announcement(inputs, *ip, local_only, now))
        .collect();
    let mut endpoints: BTreeMap<String, Vec<EndpointLine>> = BTreeMap::new();
    for slice in &inputs.slices {
        let port = slice
            .ports
            .as_ref()
            .and_then(|p| p.first())
            .and_then(|p| p.port);
        for e in &slice.endpoints {
            let c = e.conditions.clone().unwrap_or_default();
            for address in &e.addresses {
                endpoints
                    .entry(e.node_name.clone().unwrap_or_default())
                    .or_default()
                    .push(EndpointLine {
                        address: port.map_or_else(|| address.clone(), |p| format!("{address}:{p}")),
                        pod: e
                            .target_ref
                            .as_ref()
                            .and_then(|r| r.name.clone())
                            .unwrap_or_default(),
                        ready: c.ready.unwrap_or(false),
                        serving: c.serving.unwrap_or(false),
                        terminating: c.terminating.unwrap_or(false),
                    });
            }
        }
    }
    for list in endpoints.values_mut() {
        list.sort_by(|a, b| a.address.cmp(&b.address));
    }
    Report {
        namespace: svc.metadata.namespace.clone().unwrap_or_default(),
        name: svc.metadata.name.clone().unwrap_or_default(),
        type_: spec.type_.clone().unwrap_or_else(|| "ClusterIP".into()),
        external_policy,
        internal_policy: spec
            .internal_traffic_policy
            .clone()
            .unwrap_or_else(|| "Cluster".into()),
        cluster_ips: spec.cluster_ips.clone().unwrap_or_default(),
        load_balancer_ips,
        external_ips: spec.external_ips.clone().unwrap_or_default(),
        ports: spec
            .ports
            .iter()
            .flatten()
            .map(|p| PortLine {
                name: p.name.clone().unwrap_or_default(),
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                port: p.port,
                target: match &p.target_port {
                    Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n)) => {
                        n.to_string()
                    }
                    Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s)) => {
                        s.clone()
                    }
                    None => p.port.to_string(),
                },
                node_port: p.node_port,
            })
            .collect(),
        announcements,
        endpoints,
    }
}

fn yes(b: bool, word: &str) -> Option<&str> {
    b.then_some(word)
}

/// The report as text.
pub fn render(r: &Report) -> String {
    let mut out = format!(
        "Service {}/{}: {}, externalTrafficPolicy {}, internalTrafficPolicy {}\n",
        r.namespace, r.name, r.type_, r.external_policy, r.internal_policy
    );
    out.push_str("Addresses:\n");
    for ip in &r.cluster_ips {
        out.push_str(&format!("  ClusterIP     {ip}\n"));
    }
    for ip in &r.load_balancer_ips {
        out.push_str(&format!("  LoadBalancer  {ip}\n"));
    }
    for ip in &r.external_ips {
        out.push_str(&format!("  ExternalIP    {ip}\n"));
    }
    out.push_str("Ports:\n");
    for p in &r.ports {
        let node_port = p
            .node_port
            .map_or_else(String::new, |n| format!(", node port {n} on every node"));
        let name = if p.name.is_empty() {
            String::new()
        } else {
            format!(" ({})", p.name)
        };
        out.push_str(&format!(
            "  {}/{}{name} -> target {}{node_port}\n",
            p.port, p.protocol, p.target
        ));
    }
    for a in &r.announcements {
        out.push_str(&format!(
            "Announcing {} (pools: {}; advertised by: {}):\n",
            a.ip,
            or_none(&a.pools),
            or_none(&a.advertised_by)
        ));
        match (&a.elected, &a.annotated) {
            (Some(e), Some(n)) if e == n => out.push_str(&format!("  {e} announces it: the candidate with the smallest sha256(node#ip), and its agent records it (ServiceL2Status)\n")),
            (Some(e), Some(n)) => out.push_str(&format!("  elected from the API's view: {e}; the records say {n} announces it (the agents' membership view differs, or an update is in flight)\n")),
            (Some(e), None) => out.push_str(&format!("  elected from the API's view: {e}; no agent has reported announcing it yet\n")),
            (None, _) => out.push_str("  nobody can announce it: no pool holds it, no advertisement selects its pool, or no node qualifies\n"),
        }
        for c in &a.candidates {
            let standing = if c.excluded_because.is_empty() {
                "candidate".to_owned()
            } else {
                format!("not a candidate: {}", c.excluded_because.join("; "))
            };
            out.push_str(&format!("    {:<12} key {}  {standing}\n", c.node, c.key));
        }
    }
    out.push_str("Endpoints:\n");
    if r.endpoints.is_empty() {
        out.push_str("  none: clients are rejected (connection refused)\n");
    }
    for (node, list) in &r.endpoints {
        let node = if node.is_empty() {
            "(no node)"
        } else {
            node.as_str()
        };
        for e in list {
            let conditions: Vec<&str> = [
                yes(e.ready, "ready"),
                yes(!e.ready, "not ready"),
                yes(e.serving, "serving"),
                yes(e.terminating, "terminating"),
            ]
            .into_iter()
            .flatten()
            .collect();
            out.push_str(&format!(
                "  {node:<12} {:<22} {:<28} {}\n",
                e.address,
                e.pod,
                conditions.join(", ")
            ));
        }
    }
    out
}

fn or_none(v: &[String]) -> String {
    if v.is_empty() {
        "none".to_owned()
    } else {
        v.join(", ")
    }
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;

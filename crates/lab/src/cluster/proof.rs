//! The lab's proof and its summary: for each Service, where a request can reach it from (the
//! client through the LoadBalancer IP and a node port, a node through the ClusterIP), and a table
//! of what answered.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use berth_api::ServiceL2Status;
use berth_core::IpFamily;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::plan::node_ip;
use crate::echo::EchoReply;
use crate::netns::http_get;
use crate::topology::Layout;

/// One way in to a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `LoadBalancer`, `NodePort` or `ClusterIP`.
    pub path: &'static str,
    /// Where the request is sent from.
    pub from: String,
    pub netns: String,
    pub addr: SocketAddr,
}

/// The Service as the summary shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceFacts {
    pub key: String,
    pub kind: String,
    /// `spec.clusterIPs` (else `spec.clusterIP`), primary family first.
    pub cluster_ips: Vec<IpAddr>,
    /// The ingress addresses in `status.loadBalancer`.
    pub lb_ips: Vec<IpAddr>,
    /// How many LoadBalancer addresses the Service wants: one per family of `spec.ipFamilies`.
    pub wanted_lb_ips: usize,
    /// Each LoadBalancer address with the nodes that report announcing it (one, unless it is
    /// changing hands; two families may be announced by two nodes).
    pub announcers: Vec<(IpAddr, Vec<String>)>,
    pub targets: Vec<Target>,
}

impl ServiceFacts {
    /// The ANNOUNCED BY cell: the node, or each address's nodes when they differ.
    pub fn announced_by(&self) -> Option<String> {
        let all: BTreeSet<&str> = self
            .announcers
            .iter()
            .flat_map(|(_, nodes)| nodes.iter().map(String::as_str))
            .collect();
        if all.is_empty() {
            return None;
        }
        let same = self
            .announcers
            .iter()
            .all(|(_, nodes)| nodes.len() == all.len());
        if same {
            return Some(all.into_iter().collect::<Vec<_>>().join(","));
        }
        let each: Vec<String> = self
            .announcers
            .iter()
            .map(|(ip, nodes)| {
                let nodes = if nodes.is_empty() {
                    "-".to_string()
                } else {
                    nodes.join(",")
                };
                format!("{nodes} ({ip})")
            })
            .collect();
        Some(each.join(" "))
    }

    /// Whether every LoadBalancer address it wants is there and announced by some node.
    pub fn announced(&self) -> bool {
        self.lb_ips.len() >= self.wanted_lb_ips
            && self.announcers.iter().all(|(_, nodes)| !nodes.is_empty())
    }
}

fn parse_ips<'a>(texts: impl IntoIterator<Item = &'a str>) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::new();
    for ip in texts.into_iter().filter_map(|t| t.parse().ok()) {
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    out
}

/// Reads a Service; ways in are those its allocated fields allow, through its first TCP port:
/// every LoadBalancer address from the client (ARP for IPv4, NDP for IPv6), the node port on
/// the first node's LAN address of each of the Service's families from the client, and every
/// ClusterIP from the first node. The announcing nodes come from the agents'
/// `ServiceL2Status` records (`records`, from any namespace).
pub fn service_facts(
    svc: &Service,
    layout: &Layout,
    records: &[ServiceL2Status],
) -> Option<ServiceFacts> {
    let meta = &svc.metadata;
    let key = format!("{}/{}", meta.namespace.as_deref()?, meta.name.as_deref()?);
    let spec = svc.spec.as_ref()?;
    let kind = spec.type_.clone().unwrap_or_else(|| "ClusterIP".into());
    let cluster_ips = match spec.cluster_ips.as_ref().filter(|ips| !ips.is_empty()) {
        Some(ips) => parse_ips(ips.iter().map(String::as_str)),
        None => parse_ips(spec.cluster_ip.as_deref()),
    };
    let lb_ips = parse_ips(
        svc.status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|i| i.ip.as_deref()),
    );
    let wanted_lb_ips = spec.ip_families.as_ref().map_or(1, |f| f.len().max(1));
    let own: Vec<&ServiceL2Status> = records
        .iter()
        .filter(|r| {
            Some(&r.spec.service_namespace) == meta.namespace.as_ref()
                && Some(&r.spec.service_name) == meta.name.as_ref()
        })
        .collect();
    let announcers = lb_ips
        .iter()
        .map(|ip| {
            let nodes: BTreeSet<String> = own
                .iter()
                .filter(|r| {
                    // A record without addresses (an older agent) speaks for all of them.
                    r.spec.addresses.is_empty()
                        || r.spec.addresses.iter().any(|a| a.parse() == Ok(*ip))
                })
                .map(|r| r.spec.node.clone())
                .collect();
            (*ip, nodes.into_iter().collect())
        })
        .collect();
    let port = spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP");
    let mut targets = Vec::new();
    if let (Some(port), Some(client), Some(node)) =
        (port, layout.clients.first(), layout.nodes.first())
    {
        let service_port = u16::try_from(port.port).unwrap_or(0);
        for ip in &lb_ips {
            targets.push(Target {
                path: "LoadBalancer",
                from: client.name.clone(),
                netns: client.netns.clone(),
                addr: SocketAddr::new(*ip, service_port),
            });
        }
        if let Some(node_port) = port.node_port.and_then(|p| u16::try_from(p).ok()) {
            // The Service's families, primary first; IPv4 while it has no ClusterIP yet.
            let mut order: Vec<IpFamily> = Vec::new();
            for family in cluster_ips.iter().map(|ip| IpFamily::of(*ip)) {
                if !order.contains(&family) {
                    order.push(family);
                }
            }
            if order.is_empty() {
                order.push(IpFamily::V4);
            }
            for family in order {
                if let Some(ip) = node_ip(node, family) {
                    targets.push(Target {
                        path: "NodePort",
                        from: client.name.clone(),
                        netns: client.netns.clone(),
                        addr: SocketAddr::new(ip, node_port),
                    });
                }
            }
        }
        for ip in &cluster_ips {
            targets.push(Target {
                path: "ClusterIP",
                from: node.name.clone(),
                netns: node.netns.clone(),
                addr: SocketAddr::new(*ip, service_port),
            });
        }
    }
    Some(ServiceFacts {
        key,
        kind,
        cluster_ips,
        lb_ips,
        wanted_lb_ips,
        announcers,
        targets,
    })
}

/// With a BGP router (`berth lab up --bgp`): a LoadBalancer address outside the LAN is reached
/// from the client behind the router (`outside`), and announced by the nodes that are its next
/// hops in the router's kernel FIB (`fib`, next hops by node name).
pub fn route_facts(
    facts: &mut ServiceFacts,
    layout: &Layout,
    outside: &super::bgp::Outside,
    fib: &std::collections::BTreeMap<IpAddr, Vec<String>>,
) {
    let routed = |ip: IpAddr| super::bgp::is_routed(layout, ip);
    for target in facts
        .targets
        .iter_mut()
        .filter(|t| t.path == "LoadBalancer" && routed(t.addr.ip()))
    {
        target.from = outside.name.clone();
        target.netns = outside.netns.clone();
    }
    for (ip, nodes) in facts.announcers.iter_mut().filter(|(ip, _)| routed(*ip)) {
        *nodes = fib.get(ip).cloned().unwrap_or_default();
    }
}

/// `pod@ip` of every ready endpoint in the Service's slices, sorted; a pod in the slices of
/// both families shows both addresses, `pod@ipv4+ipv6` (in the order of the slices).
pub fn ready_endpoints(slices: &[EndpointSlice]) -> Vec<String> {
    let mut by_pod: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for e in slices
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
    {
        let pod = e
            .target_ref
            .as_ref()
            .and_then(|t| t.name.clone())
            .unwrap_or_else(|| "?".into());
        let ip = e.addresses.first().cloned().unwrap_or_default();
        let ips = by_pod.entry(pod).or_default();
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    by_pod
        .into_iter()
        .map(|(pod, mut ips)| {
            // IPv4 before IPv6, whatever order the slices were listed in.
            ips.sort_by_key(|ip| ip.contains(':'));
            format!("{pod}@{}", ips.join("+"))
        })
        .collect()
}

/// Whether the lab is ready to be proven: every Service has a ClusterIP and a ready endpoint,
/// every LoadBalancer Service an address per family and a node announcing each, and every Pod that is not
/// being deleted is Ready. The summary then shows the settled cluster, not a moment of its start.
pub fn settled(rows: &[(ServiceFacts, Vec<String>)], pods: &[Pod]) -> bool {
    let services = rows.iter().all(|(facts, endpoints)| {
        !endpoints.is_empty()
            && !facts.cluster_ips.is_empty()
            && (facts.kind != "LoadBalancer" || facts.announced())
    });
    services
        && pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .all(pod_ready)
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// What one way in answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub target: Target,
    pub result: Result<EchoReply, String>,
}

impl Answer {
    pub fn line(&self) -> String {
        let t = &self.target;
        match &self.result {
            Ok(reply) => format!(
                "{} {} from {}: pod {} answered (saw {})",
                t.path, t.addr, t.from, reply.pod, reply.client
            ),
            Err(reason) => format!("{} {} from {}: FAILED: {reason}", t.path, t.addr, t.from),
        }
    }
}

/// The PROOF cell of a Service: the pods that answered through its LoadBalancer addresses
/// (else through its first way in), or how many ways in failed.
pub fn proof_cell(answers: &[Answer]) -> String {
    let failed = answers.iter().filter(|a| a.result.is_err()).count();
    if failed > 0 {
        return format!("FAILED ({failed} of {} ways in)", answers.len());
    }
    let through_lb: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.target.path == "LoadBalancer")
        .collect();
    let shown: Vec<&Answer> = if through_lb.is_empty() {
        answers.iter().take(1).collect()
    } else {
        through_lb
    };
    let Some(first) = shown.first() else {
        return "no way in".into();
    };
    let pods: Vec<&str> = shown
        .iter()
        .filter_map(|a| a.result.as_ref().ok().map(|r| r.pod.as_str()))
        .collect();
    format!("{} answered {}", first.target.path, pods.join(", "))
}

/// Sends `GET /` until the echo server answers or `limit` passes. Blocking.
pub fn prove(target: &Target, limit: Duration) -> Answer {
    let deadline = Instant::now() + limit;
    let result = loop {
        let attempt = http_get(&target.netns, target.addr, "/", Duration::from_secs(2))
            .map_err(|e| format!("{e}"))
            .and_then(|(code, body)| {
                if code != 200 {
                    return Err(format!("HTTP {code}"));
                }
                EchoReply::parse(&body).map_err(|e| e.to_string())
            });
        match attempt {
            Ok(reply) => break Ok(reply),
            Err(reason) if Instant::now() >= deadline => break Err(reason),
            Err(_) => std::thread::sleep(Duration::from_millis(300)),
        }
    };
    Answer {
        target: target.clone(),
        result,
    }
}

/// A plain text table, columns padded to their widest cell.
pub fn render_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{layout, TopologySpec};
    use serde_json::json;

    fn mk_layout() -> Layout {
        layout(
            &TopologySpec::new("berth-lab")
                .control_plane("cp")
                .node("node1", Vec::<String>::new())
                .node("node2", Vec::<String>::new())
                .client("client"),
        )
        .unwrap()
    }

    fn mk_record(node: &str, namespace: &str, name: &str) -> ServiceL2Status {
        serde_json::from_value(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "ServiceL2Status",
            "metadata": {"name": format!("l2-{node}"), "namespace": "kube-system"},
            "spec": {"node": node, "serviceNamespace": namespace, "serviceName": name,
                     "addresses": ["198.18.0.200"]}
        }))
        .unwrap()
    }

    #[test]
    fn a_load_balancer_is_reached_three_ways() {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "echo", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10",
                "ports": [{"port": 53, "protocol": "UDP", "nodePort": 30001},
                          {"port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.200", "ipMode": "VIP"}]}}
        }))
        .unwrap();
        let records = [
            mk_record("node2", "default", "echo"),
            mk_record("node1", "other", "echo"),
            mk_record("node1", "default", "echo2"),
        ];
        let facts = service_facts(&svc, &mk_layout(), &records).unwrap();
        assert_eq!(facts.key, "default/echo");
        assert_eq!(facts.announced_by().as_deref(), Some("node2"));
        let split = [
            mk_record("node2", "default", "echo"),
            mk_record("node1", "default", "echo"),
        ];
        assert_eq!(
            service_facts(&svc, &mk_layout(), &split)
                .unwrap()
                .announced_by()
                .as_deref(),
            Some("node1,node2")
        );
        let ways: Vec<(&str, &str, String)> = facts
            .targets
            .iter()
            .map(|t| (t.path, t.netns.as_str(), t.addr.to_string()))
            .collect();
        assert_eq!(
            ways,
            [
                (
                    "LoadBalancer",
                    "berth-lab-client",
                    "198.18.0.200:80".to_string()
                ),
                (
                    "NodePort",
                    "berth-lab-client",
                    "198.18.0.11:30080".to_string()
                ),
                ("ClusterIP", "berth-lab-node1", "10.96.0.10:80".to_string()),
            ]
        );
    }

    #[test]
    fn a_service_without_allocations_has_no_way_in() {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "x", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}
        }))
        .unwrap();
        let facts = service_facts(&svc, &mk_layout(), &[]).unwrap();
        assert!(facts.targets.is_empty());
        assert!(facts.lb_ips.is_empty());
        assert!(!facts.announced());
    }

    fn mk_dual_layout() -> Layout {
        layout(
            &TopologySpec::new("berth-lab")
                .control_plane("cp")
                .node("node1", Vec::<String>::new())
                .client("client")
                .with_ipv6(),
        )
        .unwrap()
    }

    fn mk_dual_service() -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "echo-dual", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "clusterIP": "fd00:96::10",
                "clusterIPs": ["fd00:96::10", "10.96.0.10"],
                "ipFamilies": ["IPv6", "IPv4"], "ipFamilyPolicy": "RequireDualStack",
                "ports": [{"port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [
                {"ip": "fd00:198:18::200", "ipMode": "VIP"},
                {"ip": "198.18.0.200", "ipMode": "VIP"}]}}
        }))
        .unwrap()
    }

    fn mk_record_for(node: &str, addresses: &[&str]) -> ServiceL2Status {
        let mut record = mk_record(node, "default", "echo-dual");
        record.metadata.name = Some(format!("l2-{node}-{}", addresses.len()));
        record.spec.addresses = addresses.iter().map(|a| a.to_string()).collect();
        record
    }

    #[test]
    fn a_dual_stack_load_balancer_is_reached_through_every_address() {
        let records = [
            mk_record_for("node1", &["198.18.0.200"]),
            mk_record_for("node3", &["fd00:198:18::200"]),
        ];
        let facts = service_facts(&mk_dual_service(), &mk_dual_layout(), &records).unwrap();
        let ways: Vec<(&str, &str, String)> = facts
            .targets
            .iter()
            .map(|t| (t.path, t.netns.as_str(), t.addr.to_string()))
            .collect();
        assert_eq!(
            ways,
            [
                (
                    "LoadBalancer",
                    "berth-lab-client",
                    "[fd00:198:18::200]:80".to_string()
                ),
                (
                    "LoadBalancer",
                    "berth-lab-client",
                    "198.18.0.200:80".to_string()
                ),
                (
                    "NodePort",
                    "berth-lab-client",
                    "[fd00:198:18::11]:30080".to_string()
                ),
                (
                    "NodePort",
                    "berth-lab-client",
                    "198.18.0.11:30080".to_string()
                ),
                (
                    "ClusterIP",
                    "berth-lab-node1",
                    "[fd00:96::10]:80".to_string()
                ),
                ("ClusterIP", "berth-lab-node1", "10.96.0.10:80".to_string()),
            ]
        );
        assert!(facts.announced());
        // Two nodes, one per address: each named with its address.
        assert_eq!(
            facts.announced_by().as_deref(),
            Some("node3 (fd00:198:18::200) node1 (198.18.0.200)")
        );
        // One family not announced yet: not settled.
        let half = service_facts(&mk_dual_service(), &mk_dual_layout(), &records[..1]).unwrap();
        assert!(!half.announced());
        let row = (half, vec!["a@10.244.1.2".to_string()]);
        assert!(!settled(&[row], &[]));
        // One node for both.
        let both = [mk_record_for(
            "node2",
            &["198.18.0.200", "fd00:198:18::200"],
        )];
        let facts = service_facts(&mk_dual_service(), &mk_dual_layout(), &both).unwrap();
        assert_eq!(facts.announced_by().as_deref(), Some("node2"));
    }

    #[test]
    fn a_dual_stack_service_waits_for_its_second_address() {
        let mut svc = mk_dual_service();
        if let Some(status) = svc.status.as_mut() {
            status.load_balancer = serde_json::from_value(
                json!({"ingress": [{"ip": "198.18.0.200", "ipMode": "VIP"}]}),
            )
            .unwrap();
        }
        let records = [mk_record_for("node1", &["198.18.0.200"])];
        let facts = service_facts(&svc, &mk_dual_layout(), &records).unwrap();
        assert_eq!((facts.lb_ips.len(), facts.wanted_lb_ips), (1, 2));
        assert!(!facts.announced());
    }

    #[test]
    fn a_single_stack_service_on_a_dual_stack_lab_keeps_to_its_family() {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"],
                "ipFamilies": ["IPv4"], "ports": [{"port": 80, "nodePort": 30081}]}
        }))
        .unwrap();
        let facts = service_facts(&svc, &mk_dual_layout(), &[]).unwrap();
        let addrs: Vec<String> = facts.targets.iter().map(|t| t.addr.to_string()).collect();
        assert_eq!(addrs, ["198.18.0.11:30081", "10.96.0.20:80"]);
    }

    #[test]
    fn only_ready_endpoints_are_listed() {
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "s"}, "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.244.1.2"], "conditions": {"ready": true}, "targetRef": {"kind": "Pod", "name": "b"}},
                {"addresses": ["10.244.2.2"], "conditions": {"ready": false}, "targetRef": {"kind": "Pod", "name": "c"}},
                {"addresses": ["10.244.1.3"], "conditions": {"ready": true}, "targetRef": {"kind": "Pod", "name": "a"}}
            ]
        }))
        .unwrap();
        assert_eq!(
            ready_endpoints(std::slice::from_ref(&slice)),
            ["a@10.244.1.3", "b@10.244.1.2"]
        );
        let slice6: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "s6"}, "addressType": "IPv6",
            "endpoints": [
                {"addresses": ["fd00:244:1::2"], "conditions": {"ready": true}, "targetRef": {"kind": "Pod", "name": "b"}},
                {"addresses": ["fd00:244:2::2"], "conditions": {"ready": true}, "targetRef": {"kind": "Pod", "name": "c"}}
            ]
        }))
        .unwrap();
        assert_eq!(
            ready_endpoints(&[slice6, slice]),
            [
                "a@10.244.1.3",
                "b@10.244.1.2+fd00:244:1::2",
                "c@fd00:244:2::2"
            ]
        );
    }

    fn mk_pod(name: &str, ready: &str, deleting: bool) -> Pod {
        let mut metadata = json!({"name": name, "namespace": "default"});
        if deleting {
            metadata["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(json!({
            "metadata": metadata,
            "status": {"conditions": [{"type": "Ready", "status": ready}]}
        }))
        .unwrap()
    }

    #[test]
    fn the_lab_settles_when_addresses_announcers_and_pods_are_there() {
        let row = |announced: bool, endpoints: &[&str]| {
            let records = if announced {
                vec![mk_record("node1", "default", "echo")]
            } else {
                Vec::new()
            };
            let svc: Service = serde_json::from_value(json!({
                "metadata": {"name": "echo", "namespace": "default"},
                "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10",
                    "ports": [{"port": 80, "nodePort": 30080}]},
                "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.200"}]}}
            }))
            .unwrap();
            (
                service_facts(&svc, &mk_layout(), &records).unwrap(),
                endpoints.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            )
        };
        let pods = [mk_pod("a", "True", false), mk_pod("b", "False", true)];
        assert!(settled(&[row(true, &["a@10.244.1.2"])], &pods));
        // The announcer has not reported yet.
        assert!(!settled(&[row(false, &["a@10.244.1.2"])], &pods));
        // No ready endpoint.
        assert!(!settled(&[row(true, &[])], &pods));
        // A pod that is not being deleted is not Ready yet.
        let starting = [mk_pod("a", "True", false), mk_pod("c", "False", false)];
        assert!(!settled(&[row(true, &["a@10.244.1.2"])], &starting));
    }

    #[test]
    fn the_proof_cell_names_the_pods_behind_every_load_balancer_address() {
        let target = |path: &'static str, addr: &str| Target {
            path,
            from: "client".into(),
            netns: "berth-lab-client".into(),
            addr: addr.parse().unwrap(),
        };
        let ok = |t: Target, pod: &str| Answer {
            result: Ok(EchoReply {
                pod: pod.into(),
                client: "198.18.0.100:4000".parse().unwrap(),
            }),
            target: t,
        };
        let answers = vec![
            ok(target("LoadBalancer", "198.18.0.200:80"), "echo-1"),
            ok(target("LoadBalancer", "[fd00:198:18::200]:80"), "echo-3"),
            ok(target("NodePort", "198.18.0.11:30080"), "echo-2"),
        ];
        assert_eq!(proof_cell(&answers), "LoadBalancer answered echo-1, echo-3");
        assert_eq!(proof_cell(&answers[2..]), "NodePort answered echo-2");
        assert_eq!(proof_cell(&[]), "no way in");
        let mut failing = answers;
        failing[1].result = Err("timed out".into());
        assert_eq!(proof_cell(&failing), "FAILED (1 of 3 ways in)");
    }

    #[test]
    fn tables_pad_columns() {
        let table = render_table(
            &["A", "BB"],
            &[vec!["long".into(), "x".into()], vec!["y".into(), "".into()]],
        );
        assert_eq!(table, "A     BB\nlong  x\ny\n");
    }

    #[test]
    fn a_bgp_address_is_reached_from_behind_the_router_and_announced_by_its_next_hops() {
        let l = layout(
            &TopologySpec::new("berth-lab")
                .control_plane("cp")
                .node("node1", Vec::<String>::new())
                .node("node2", Vec::<String>::new())
                .client("client")
                .client("router")
                .with_ipv6(),
        )
        .unwrap();
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "echo-bgp", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10",
                "clusterIPs": ["10.96.0.10", "fd00:96::10"], "ipFamilies": ["IPv4", "IPv6"],
                "ports": [{"port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [
                {"ip": "198.19.10.1", "ipMode": "VIP"}, {"ip": "fd00:19:10::1", "ipMode": "VIP"},
                {"ip": "198.18.0.200", "ipMode": "VIP"}]}}
        }))
        .unwrap();
        let mut facts =
            service_facts(&svc, &l, &[mk_record("node1", "default", "echo-bgp")]).unwrap();
        let outside = crate::cluster::bgp::outside(&l);
        let fib = std::collections::BTreeMap::from([(
            "198.19.10.1".parse().unwrap(),
            vec!["node1".to_string(), "node2".to_string()],
        )]);
        route_facts(&mut facts, &l, &outside, &fib);
        let lb: Vec<(String, &str)> = facts
            .targets
            .iter()
            .filter(|t| t.path == "LoadBalancer")
            .map(|t| (t.addr.to_string(), t.netns.as_str()))
            .collect();
        assert_eq!(
            lb,
            [
                ("198.19.10.1:80".to_string(), "berth-lab-outside"),
                ("[fd00:19:10::1]:80".to_string(), "berth-lab-outside"),
                ("198.18.0.200:80".to_string(), "berth-lab-client"),
            ]
        );
        // The IPv6 address has no route yet: not announced, so the lab keeps waiting.
        assert!(!facts.announced());
        assert_eq!(
            facts.announced_by().as_deref(),
            Some("node1,node2 (198.19.10.1) - (fd00:19:10::1) node1 (198.18.0.200)")
        );
        let fib6 = std::collections::BTreeMap::from([
            (
                "198.19.10.1".parse().unwrap(),
                vec!["node1".to_string(), "node2".to_string()],
            ),
            ("fd00:19:10::1".parse().unwrap(), vec!["node2".to_string()]),
        ]);
        route_facts(&mut facts, &l, &outside, &fib6);
        assert!(facts.announced());
    }
}

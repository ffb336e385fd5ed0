//! The lab's proof and its summary: for each Service, where a request can reach it from (the
//! client through the LoadBalancer IP and a node port, a node through the ClusterIP), and a table
//! of what answered.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use berth_api::ServiceL2Status;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::echo::EchoReply;
use crate::kubelet::server::http_get;
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
    pub cluster_ip: Option<IpAddr>,
    pub lb_ip: Option<IpAddr>,
    pub announcing_node: Option<String>,
    pub targets: Vec<Target>,
}

/// Reads a Service; ways in are those its allocated fields allow, through its first TCP port.
/// The announcing node comes from the agents' `ServiceL2Status` records (`records`, from any
/// namespace): several nodes, which should never be, are shown together.
pub fn service_facts(
    svc: &Service,
    layout: &Layout,
    records: &[ServiceL2Status],
) -> Option<ServiceFacts> {
    let meta = &svc.metadata;
    let key = format!("{}/{}", meta.namespace.as_deref()?, meta.name.as_deref()?);
    let spec = svc.spec.as_ref()?;
    let kind = spec.type_.clone().unwrap_or_else(|| "ClusterIP".into());
    let cluster_ip = spec
        .cluster_ip
        .as_deref()
        .and_then(|ip| ip.parse::<IpAddr>().ok());
    let lb_ip = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .and_then(|ingress| ingress.iter().find_map(|i| i.ip.as_deref()?.parse().ok()));
    let announcers: std::collections::BTreeSet<&str> = records
        .iter()
        .filter(|r| {
            Some(&r.spec.service_namespace) == meta.namespace.as_ref()
                && Some(&r.spec.service_name) == meta.name.as_ref()
        })
        .map(|r| r.spec.node.as_str())
        .collect();
    let announcing_node =
        (!announcers.is_empty()).then(|| announcers.into_iter().collect::<Vec<_>>().join(","));
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
        if let Some(ip) = lb_ip {
            targets.push(Target {
                path: "LoadBalancer",
                from: client.name.clone(),
                netns: client.netns.clone(),
                addr: SocketAddr::new(ip, service_port),
            });
        }
        if let Some(node_port) = port.node_port.and_then(|p| u16::try_from(p).ok()) {
            targets.push(Target {
                path: "NodePort",
                from: client.name.clone(),
                netns: client.netns.clone(),
                addr: SocketAddr::from((node.lan_ip, node_port)),
            });
        }
        if let Some(ip) = cluster_ip {
            targets.push(Target {
                path: "ClusterIP",
                from: node.name.clone(),
                netns: node.netns.clone(),
                addr: SocketAddr::new(ip, service_port),
            });
        }
    }
    Some(ServiceFacts {
        key,
        kind,
        cluster_ip,
        lb_ip,
        announcing_node,
        targets,
    })
}

/// `pod@ip` of every ready endpoint in the Service's slices, sorted.
pub fn ready_endpoints(slices: &[EndpointSlice]) -> Vec<String> {
    let mut out: Vec<String> = slices
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
        .map(|e| {
            let pod = e
                .target_ref
                .as_ref()
                .and_then(|t| t.name.clone())
                .unwrap_or_else(|| "?".into());
            format!("{pod}@{}", e.addresses.first().cloned().unwrap_or_default())
        })
        .collect();
    out.sort();
    out
}

/// Whether the lab is ready to be proven: every Service has a ClusterIP and a ready endpoint,
/// every LoadBalancer Service an address and the node announcing it, and every Pod that is not
/// being deleted is Ready. The summary then shows the settled cluster, not a moment of its start.
pub fn settled(rows: &[(ServiceFacts, Vec<String>)], pods: &[Pod]) -> bool {
    let services = rows.iter().all(|(facts, endpoints)| {
        !endpoints.is_empty()
            && facts.cluster_ip.is_some()
            && (facts.kind != "LoadBalancer"
                || (facts.lb_ip.is_some() && facts.announcing_node.is_some()))
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
        assert_eq!(facts.announcing_node.as_deref(), Some("node2"));
        let split = [
            mk_record("node2", "default", "echo"),
            mk_record("node1", "default", "echo"),
        ];
        assert_eq!(
            service_facts(&svc, &mk_layout(), &split)
                .unwrap()
                .announcing_node
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
        assert_eq!(facts.lb_ip, None);
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
        assert_eq!(ready_endpoints(&[slice]), ["a@10.244.1.3", "b@10.244.1.2"]);
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
    fn tables_pad_columns() {
        let table = render_table(
            &["A", "BB"],
            &[vec!["long".into(), "x".into()], vec!["y".into(), "".into()]],
        );
        assert_eq!(table, "A     BB\nlong  x\ny\n");
    }
}

//! What the lab kubelet does with the pods it sees (pure): bind, start, gate, stop, finalize;
//! and the status it reports.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

use super::{DEFAULT_POD_PORT, READY_ANNOTATION};

/// The facts of one Pod the kubelet acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub node: Option<String>,
    pub node_selector: BTreeMap<String, String>,
    /// TCP ports the echo server answers on: the containers' TCP ports, or 8080 when none.
    pub ports: Vec<u16>,
    /// The readiness probe's HTTP path and port.
    pub probe: (String, u16),
    /// `false` when the pod carries `lab.berth.dev/ready: "false"`: its server then fails
    /// readiness probes.
    pub ready_gate: bool,
    pub deletion: Option<DateTime<Utc>>,
    /// The first container's name and image, reported in `containerStatuses`.
    pub container: (String, String),
}

/// Reads a Pod; `None` when it lacks a name, namespace or uid.
pub fn pod_view(pod: &Pod) -> Option<PodView> {
    let meta = &pod.metadata;
    let spec = pod.spec.clone().unwrap_or_default();
    let mut ports: Vec<u16> = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .filter_map(|p| u16::try_from(p.container_port).ok())
        .filter(|p| *p != 0)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    if ports.is_empty() {
        ports.push(DEFAULT_POD_PORT);
    }
    let first = spec.containers.first();
    let probe_get = first
        .and_then(|c| c.readiness_probe.as_ref())
        .and_then(|p| p.http_get.as_ref());
    let probe_port = probe_get
        .and_then(|g| match &g.port {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => {
                u16::try_from(*n).ok()
            }
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(name) => first
                .and_then(|c| c.ports.as_ref())
                .and_then(|ps| ps.iter().find(|p| p.name.as_deref() == Some(name.as_str())))
                .and_then(|p| u16::try_from(p.container_port).ok()),
        })
        .unwrap_or(ports[0]);
    let probe_path = probe_get
        .and_then(|g| g.path.clone())
        .unwrap_or_else(|| "/healthz".to_string());
    let ready_gate = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(READY_ANNOTATION))
        .is_none_or(|v| v != "false");
    Some(PodView {
        uid: meta.uid.clone()?,
        namespace: meta.namespace.clone()?,
        name: meta.name.clone()?,
        node: spec.node_name.clone().filter(|n| !n.is_empty()),
        node_selector: spec.node_selector.clone().unwrap_or_default(),
        ports,
        probe: (probe_path, probe_port),
        ready_gate,
        deletion: meta.deletion_timestamp.as_ref().and_then(|t| {
            DateTime::from_timestamp(
                t.0.as_second(),
                u32::try_from(t.0.subsec_nanosecond()).unwrap_or(0),
            )
        }),
        container: first
            .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
            .unwrap_or_else(|| ("echo".into(), String::new())),
    })
}

/// Pods the kubelet bound whose binding the watch has not shown yet are taken as bound; once
/// the watch shows a node (or the pod is gone), the entry is dropped.
pub fn overlay_binds(pods: &mut [PodView], binding: &mut BTreeMap<String, String>) {
    let present: BTreeSet<&str> = pods.iter().map(|p| p.uid.as_str()).collect();
    binding.retain(|uid, _| present.contains(uid.as_str()));
    for pod in pods.iter_mut() {
        match (&pod.node, binding.get(&pod.uid)) {
            (None, Some(node)) => pod.node = Some(node.clone()),
            (Some(_), Some(_)) => {
                binding.remove(&pod.uid);
            }
            _ => {}
        }
    }
}

/// A pod the kubelet runs: its node and readiness gate as last set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub node: String,
    pub gate: bool,
}

/// A lab node as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub ready: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Set `spec.nodeName` of an unbound pod.
    Bind {
        namespace: String,
        name: String,
        node: String,
    },
    /// Make the pod's namespace and start its server.
    Start { uid: String },
    /// Open or close the readiness gate of a running pod's server.
    Gate { uid: String, ready: bool },
    /// Stop the server and delete the pod's namespace.
    Stop { uid: String },
    /// Delete the Pod object with grace period 0: its grace period is over.
    Finalize {
        namespace: String,
        name: String,
        uid: String,
    },
}

/// The Ready node with the fewest pods that matches the pod's `nodeSelector`, by name on ties.
pub fn choose_node<'a>(
    pod: &PodView,
    nodes: &'a [NodeView],
    load: &BTreeMap<String, usize>,
) -> Option<&'a NodeView> {
    nodes
        .iter()
        .filter(|n| n.ready)
        .filter(|n| {
            pod.node_selector
                .iter()
                .all(|(k, v)| n.labels.get(k) == Some(v))
        })
        .min_by_key(|n| (load.get(&n.name).copied().unwrap_or(0), n.name.clone()))
}

/// Everything to do now, given the pods in the API, the ones running and the time.
/// Pods bound to nodes that are not the lab's are left alone.
pub fn plan_pods(
    pods: &[PodView],
    running: &BTreeMap<String, Running>,
    nodes: &[NodeView],
    now: DateTime<Utc>,
) -> Vec<Action> {
    let ours: BTreeSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let mut load: BTreeMap<String, usize> = BTreeMap::new();
    for pod in pods {
        if let Some(node) = &pod.node {
            *load.entry(node.clone()).or_default() += 1;
        }
    }
    let mut actions = Vec::new();
    let mut seen = BTreeSet::new();
    for pod in pods {
        seen.insert(pod.uid.as_str());
        let is_running = running.get(&pod.uid);
        if let Some(deadline) = pod.deletion {
            let bound_here = pod.node.as_deref().is_some_and(|n| ours.contains(n));
            if deadline <= now || is_running.is_none() {
                if is_running.is_some() {
                    actions.push(Action::Stop {
                        uid: pod.uid.clone(),
                    });
                }
                if bound_here {
                    actions.push(Action::Finalize {
                        namespace: pod.namespace.clone(),
                        name: pod.name.clone(),
                        uid: pod.uid.clone(),
                    });
                }
                continue;
            }
        }
        match (&pod.node, is_running) {
            (None, _) if pod.deletion.is_none() => {
                if let Some(node) = choose_node(pod, nodes, &load) {
                    *load.entry(node.name.clone()).or_default() += 1;
                    actions.push(Action::Bind {
                        namespace: pod.namespace.clone(),
                        name: pod.name.clone(),
                        node: node.name.clone(),
                    });
                }
            }
            (Some(node), None) if ours.contains(node.as_str()) && pod.deletion.is_none() => {
                actions.push(Action::Start {
                    uid: pod.uid.clone(),
                });
            }
            (Some(node), Some(run)) if run.node != *node => {
                // A pod cannot move; one that claims to has been replaced under the same uid.
                actions.push(Action::Stop {
                    uid: pod.uid.clone(),
                });
            }
            (_, Some(run)) if run.gate != pod.ready_gate => actions.push(Action::Gate {
                uid: pod.uid.clone(),
                ready: pod.ready_gate,
            }),
            _ => {}
        }
    }
    for uid in running.keys() {
        if !seen.contains(uid.as_str()) {
            actions.push(Action::Stop { uid: uid.clone() });
        }
    }
    actions
}

/// What the kubelet knows of a running pod for its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    /// One per family of the cluster, primary first.
    pub pod_ips: Vec<IpAddr>,
    /// The node's InternalIPs.
    pub host_ips: Vec<IpAddr>,
    pub started: String,
    pub ready: bool,
    /// When readiness last changed (RFC 3339).
    pub ready_since: String,
}

/// `status` of a running pod: phase Running, its addresses (`podIP` the primary one, `podIPs`
/// all, as on a dual-stack cluster), and Ready from the probe.
pub fn build_pod_status(pod: &PodView, facts: &PodFacts) -> Value {
    let ip_list = |ips: &[IpAddr]| -> Vec<Value> {
        ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect()
    };
    let first = |ips: &[IpAddr]| ips.first().map(ToString::to_string);
    let ready = if facts.ready { "True" } else { "False" };
    let condition = |kind: &str, status: &str, since: &str| json!({"type": kind, "status": status, "lastProbeTime": null, "lastTransitionTime": since});
    let (container, image) = &pod.container;
    json!({
        "phase": "Running",
        "hostIP": first(&facts.host_ips),
        "hostIPs": ip_list(&facts.host_ips),
        "podIP": first(&facts.pod_ips),
        "podIPs": ip_list(&facts.pod_ips),
        "startTime": facts.started,
        "conditions": [
            condition("PodScheduled", "True", &facts.started),
            condition("Initialized", "True", &facts.started),
            condition("ContainersReady", ready, &facts.ready_since),
            condition("Ready", ready, &facts.ready_since),
        ],
        "containerStatuses": [{
            "name": container,
            "image": image,
            "imageID": "",
            "containerID": format!("berth-lab://{}", pod.uid),
            "ready": facts.ready,
            "started": true,
            "restartCount": 0,
            "state": {"running": {"startedAt": facts.started}},
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_pod(name: &str, node: Option<&str>) -> PodView {
        PodView {
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            name: name.into(),
            node: node.map(str::to_string),
            node_selector: BTreeMap::new(),
            ports: vec![8080],
            probe: ("/healthz".into(), 8080),
            ready_gate: true,
            deletion: None,
            container: ("echo".into(), "echo".into()),
        }
    }

    fn mk_nodes() -> Vec<NodeView> {
        ["node1", "node2", "node3"]
            .iter()
            .map(|n| NodeView {
                name: n.to_string(),
                labels: BTreeMap::from([("kubernetes.io/hostname".into(), n.to_string())]),
                ready: true,
            })
            .collect()
    }

    fn running(entries: &[(&str, &str, bool)]) -> BTreeMap<String, Running> {
        entries
            .iter()
            .map(|(uid, node, gate)| {
                (
                    uid.to_string(),
                    Running {
                        node: node.to_string(),
                        gate: *gate,
                    },
                )
            })
            .collect()
    }

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap_or_default()
    }

    #[test]
    fn unbound_pods_spread_over_the_least_loaded_ready_nodes() {
        let mut nodes = mk_nodes();
        nodes[2].ready = false;
        let pods = [
            mk_pod("a", Some("node1")),
            mk_pod("b", None),
            mk_pod("c", None),
            mk_pod("d", None),
        ];
        let actions = plan_pods(&pods, &BTreeMap::new(), &nodes, t(0));
        let binds: Vec<(&str, &str)> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Bind { name, node, .. } => Some((name.as_str(), node.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(binds, [("b", "node2"), ("c", "node1"), ("d", "node2")]);
        assert!(actions.contains(&Action::Start {
            uid: "uid-a".into()
        }));
    }

    #[test]
    fn a_bind_the_watch_has_not_shown_yet_is_not_made_twice() {
        let mut binding = BTreeMap::from([
            ("uid-a".to_string(), "node2".to_string()),
            ("uid-gone".to_string(), "node1".to_string()),
        ]);
        let mut pods = vec![mk_pod("a", None), mk_pod("b", Some("node3"))];
        overlay_binds(&mut pods, &mut binding);
        assert_eq!(pods[0].node.as_deref(), Some("node2"));
        assert_eq!(binding.len(), 1, "the pod that is gone is forgotten");
        let actions = plan_pods(&pods, &BTreeMap::new(), &mk_nodes(), t(0));
        assert!(
            actions.iter().all(|a| !matches!(a, Action::Bind { .. })),
            "{actions:?}"
        );
        // The watch caught up: the entry goes.
        let mut pods = vec![mk_pod("a", Some("node2"))];
        overlay_binds(&mut pods, &mut binding);
        assert!(binding.is_empty());
    }

    #[test]
    fn node_selectors_and_foreign_nodes_are_honoured() {
        let mut pinned = mk_pod("p", None);
        pinned
            .node_selector
            .insert("kubernetes.io/hostname".into(), "node3".into());
        let mut nowhere = mk_pod("q", None);
        nowhere
            .node_selector
            .insert("kubernetes.io/hostname".into(), "elsewhere".into());
        let foreign = mk_pod("f", Some("other-cluster-node"));
        let actions = plan_pods(
            &[pinned, nowhere, foreign],
            &BTreeMap::new(),
            &mk_nodes(),
            t(0),
        );
        assert_eq!(
            actions,
            [Action::Bind {
                namespace: "default".into(),
                name: "p".into(),
                node: "node3".into()
            }]
        );
    }

    #[test]
    fn the_readiness_gate_follows_the_annotation() {
        let mut pod = mk_pod("a", Some("node1"));
        pod.ready_gate = false;
        let actions = plan_pods(
            &[pod.clone()],
            &running(&[("uid-a", "node1", true)]),
            &mk_nodes(),
            t(0),
        );
        assert_eq!(
            actions,
            [Action::Gate {
                uid: "uid-a".into(),
                ready: false
            }]
        );
        let steady = plan_pods(
            &[pod],
            &running(&[("uid-a", "node1", false)]),
            &mk_nodes(),
            t(0),
        );
        assert!(steady.is_empty(), "{steady:?}");
    }

    #[test]
    fn a_terminating_pod_serves_until_its_grace_period_ends() {
        let mut pod = mk_pod("a", Some("node1"));
        pod.deletion = Some(t(30));
        let run = running(&[("uid-a", "node1", true)]);
        assert!(plan_pods(&[pod.clone()], &run, &mk_nodes(), t(29)).is_empty());
        assert_eq!(
            plan_pods(&[pod.clone()], &run, &mk_nodes(), t(30)),
            [
                Action::Stop {
                    uid: "uid-a".into()
                },
                Action::Finalize {
                    namespace: "default".into(),
                    name: "a".into(),
                    uid: "uid-a".into()
                }
            ]
        );
        // Never started: nothing to wait for.
        assert_eq!(
            plan_pods(&[pod], &BTreeMap::new(), &mk_nodes(), t(0)),
            [Action::Finalize {
                namespace: "default".into(),
                name: "a".into(),
                uid: "uid-a".into()
            }]
        );
    }

    #[test]
    fn pods_gone_from_the_api_or_moved_are_stopped() {
        let run = running(&[("uid-gone", "node1", true), ("uid-a", "node2", true)]);
        let actions = plan_pods(&[mk_pod("a", Some("node1"))], &run, &mk_nodes(), t(0));
        assert_eq!(
            actions,
            [
                Action::Stop {
                    uid: "uid-a".into()
                },
                Action::Stop {
                    uid: "uid-gone".into()
                }
            ]
        );
    }

    #[test]
    fn pod_view_reads_ports_probe_and_gate() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                "annotations": {READY_ANNOTATION: "false"}},
            "spec": {"nodeName": "node1", "containers": [{
                "name": "web", "image": "echo",
                "ports": [{"name": "http", "containerPort": 9000},
                          {"containerPort": 53, "protocol": "UDP"}],
                "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}}
            }]}
        }))
        .unwrap();
        let view = pod_view(&pod).unwrap();
        assert_eq!(view.ports, [9000]);
        assert_eq!(view.probe, ("/ready".to_string(), 9000));
        assert!(!view.ready_gate);
        assert_eq!(view.node.as_deref(), Some("node1"));
        let bare: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": "c"}]}
        }))
        .unwrap();
        let view = pod_view(&bare).unwrap();
        assert_eq!(
            (view.ports, view.probe.1, view.ready_gate),
            (vec![8080], 8080, true)
        );
        let nameless: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}})).unwrap();
        assert!(pod_view(&nameless).is_none());
    }

    #[test]
    fn status_reports_addresses_and_readiness() {
        let facts = PodFacts {
            pod_ips: vec!["10.244.1.2".parse().unwrap()],
            host_ips: vec!["198.18.0.11".parse().unwrap()],
            started: "t0".into(),
            ready: false,
            ready_since: "t1".into(),
        };
        let status = build_pod_status(&mk_pod("a", Some("node1")), &facts);
        assert_eq!(status["podIP"], "10.244.1.2");
        assert_eq!(status["podIPs"], json!([{"ip": "10.244.1.2"}]));
        assert_eq!(status["hostIP"], "198.18.0.11");
        assert_eq!(status["phase"], "Running");
        let ready = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap();
        assert_eq!(ready["status"], "False");
        assert_eq!(ready["lastTransitionTime"], "t1");
    }

    #[test]
    fn a_dual_stack_pod_reports_both_addresses_primary_first() {
        let facts = PodFacts {
            pod_ips: vec![
                "fd00:244:1::2".parse().unwrap(),
                "10.244.1.2".parse().unwrap(),
            ],
            host_ips: vec![
                "fd00:198:18::11".parse().unwrap(),
                "198.18.0.11".parse().unwrap(),
            ],
            started: "t0".into(),
            ready: true,
            ready_since: "t0".into(),
        };
        let status = build_pod_status(&mk_pod("a", Some("node1")), &facts);
        assert_eq!(status["podIP"], "fd00:244:1::2");
        assert_eq!(
            status["podIPs"],
            json!([{"ip": "fd00:244:1::2"}, {"ip": "10.244.1.2"}])
        );
        assert_eq!(status["hostIP"], "fd00:198:18::11");
        assert_eq!(
            status["hostIPs"],
            json!([{"ip": "fd00:198:18::11"}, {"ip": "198.18.0.11"}])
        );
    }
}

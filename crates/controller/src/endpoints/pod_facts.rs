//! The part of a Pod that endpoints depend on, kept instead of the whole object: a cluster's pods
//! are the largest thing the controller caches, and most of a Pod (container specs, statuses,
//! managed fields) never reaches an Endpoints object.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Pod, PodCondition, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::intern::{Interner, Labels, NamedPort, Ports};
use super::slim_pod::{SlimContainer, SlimPod};
use super::stored::{Address, Uid};

const SIDECAR_RESTART_POLICY: &str = "Always";

/// Everything `berth-endpoints` reads from a Pod. Two pods with equal facts give equal endpoints,
/// so a change that leaves the facts equal (a restart count, an unrelated condition) needs no sync.
/// Strings that repeat across pods are shared through an [`Interner`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodFacts {
    pub(crate) namespace: Arc<str>,
    pub(crate) name: Box<str>,
    /// Sorted by key: a pod has few labels, and a map would cost a node of eleven pairs. Shared
    /// with the other pods that carry the same labels.
    pub(crate) labels: Labels,
    uid: Option<Uid>,
    node_name: Option<Arc<str>>,
    phase: Word,
    /// The Ready condition's status, as reported.
    ready: Word,
    /// Whether `status.podIP` is `status.podIPs[0]`, as it is unless the kubelet is mid-update;
    /// otherwise it is kept in `rare`.
    pod_ip_is_first: bool,
    /// `status.podIPs[0]`; the rest (a dual-stack pod's second family) are in `rare`.
    first_ip: Option<Address>,
    /// Ports of regular containers, in container order.
    ports: Ports,
    /// What most pods leave unset, so that it costs one pointer when unset.
    rare: Option<Box<RareFacts>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct RareFacts {
    deletion_timestamp: Option<Time>,
    /// A phase or Ready status outside the known words.
    phase: Option<Box<str>>,
    ready: Option<Box<str>>,
    /// `status.podIP` when it is not `status.podIPs[0]`.
    pod_ip: Option<Address>,
    /// `status.podIPs` after the first.
    more_ips: Box<[Address]>,
    hostname: Option<Box<str>>,
    subdomain: Option<Box<str>>,
    /// Ports of sidecars (init containers with `restartPolicy: Always`), in order.
    sidecar_ports: Ports,
}

const PHASES: [&str; 5] = ["Pending", "Running", "Succeeded", "Failed", "Unknown"];
const CONDITION_STATUSES: [&str; 3] = ["True", "False", "Unknown"];

/// A status word as one byte: unset, its place in a list of known words, or `OTHER`, with the
/// text kept in [`RareFacts`]. An interned string would cost sixteen bytes on each of 100,000 pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Word(u8);

impl Word {
    const UNSET: Word = Word(0);
    const OTHER: Word = Word(u8::MAX);

    /// The word for `text`, and the text to keep aside when it is not a known one.
    fn new(text: Option<&str>, known: &[&str]) -> (Word, Option<Box<str>>) {
        let Some(text) = text else {
            return (Word::UNSET, None);
        };
        match known
            .iter()
            .position(|w| *w == text)
            .and_then(|i| u8::try_from(i + 1).ok())
        {
            Some(code) if code != Word::OTHER.0 => (Word(code), None),
            _ => (Word::OTHER, Some(Box::from(text))),
        }
    }

    fn text(self, known: &[&str], other: Option<&str>) -> Option<String> {
        match self {
            Word::UNSET => None,
            Word::OTHER => other.map(str::to_owned),
            Word(code) => known.get(usize::from(code - 1)).map(|w| (*w).to_owned()),
        }
    }
}

fn named_ports<'c>(
    containers: impl Iterator<Item = &'c SlimContainer>,
    interner: &mut Interner,
) -> Ports {
    let ports: Vec<NamedPort> = containers
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let name = p.name.as_deref().filter(|n| !n.is_empty())?;
            Some(NamedPort {
                name: interner.intern(name),
                number: p.container_port,
                protocol: p.protocol.as_deref().map(|s| interner.intern(s)),
            })
        })
        .collect();
    interner.intern_ports(ports)
}

fn container(name: &str, ports: &[NamedPort], restart_policy: Option<&str>) -> Container {
    Container {
        name: name.to_owned(),
        restart_policy: restart_policy.map(str::to_owned),
        ports: Some(
            ports
                .iter()
                .map(|p| ContainerPort {
                    name: Some(p.name.to_string()),
                    container_port: p.number,
                    protocol: p.protocol.as_deref().map(str::to_owned),
                    ..ContainerPort::default()
                })
                .collect(),
        ),
        ..Container::default()
    }
}

fn boxed(s: Option<&String>) -> Option<Box<str>> {
    s.map(|s| Box::from(s.as_str()))
}

fn text<S: AsRef<str> + ?Sized>(s: Option<&S>) -> Option<String> {
    s.map(|s| s.as_ref().to_owned())
}

impl PodFacts {
    pub(crate) fn from_pod(pod: &SlimPod, interner: &mut Interner) -> Self {
        let meta = &pod.metadata;
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        let sidecars = spec
            .and_then(|s| s.init_containers.as_ref())
            .into_iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some(SIDECAR_RESTART_POLICY));
        let containers = spec
            .and_then(|s| s.containers.as_ref())
            .into_iter()
            .flatten();
        let mut shared = |s: Option<&String>| s.map(|s| interner.intern(s));
        let (phase, other_phase) = Word::new(status.and_then(|s| s.phase.as_deref()), &PHASES);
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status.as_str());
        let (ready, other_ready) = Word::new(ready, &CONDITION_STATUSES);
        let mut pod_ips = status
            .and_then(|s| s.pod_ips.as_ref())
            .into_iter()
            .flatten()
            .map(|p| Address::new(&p.ip));
        let first_ip = pod_ips.next();
        let pod_ip = status
            .and_then(|s| s.pod_ip.as_ref())
            .map(|ip| Address::new(ip));
        let pod_ip_is_first = pod_ip.is_some() && pod_ip == first_ip;
        PodFacts {
            namespace: shared(meta.namespace.as_ref()).unwrap_or_else(|| Arc::from("default")),
            name: boxed(meta.name.as_ref()).unwrap_or_default(),
            uid: meta.uid.as_deref().map(Uid::new),
            node_name: shared(spec.and_then(|s| s.node_name.as_ref())),
            phase,
            ready,
            pod_ip_is_first,
            first_ip,
            // From a BTreeMap, so already sorted.
            labels: interner.intern_labels(meta.labels.iter().flatten()),
            ports: named_ports(containers, interner),
            rare: Some(Box::new(RareFacts {
                deletion_timestamp: meta.deletion_timestamp.clone(),
                phase: other_phase,
                ready: other_ready,
                pod_ip: pod_ip.filter(|_| !pod_ip_is_first),
                more_ips: pod_ips.collect(),
                hostname: boxed(spec.and_then(|s| s.hostname.as_ref())),
                subdomain: boxed(spec.and_then(|s| s.subdomain.as_ref())),
                sidecar_ports: named_ports(sidecars, interner),
            }))
            .filter(|r| **r != RareFacts::default()),
        }
    }

    /// A Pod that carries exactly these facts, for the pure endpoint builders.
    pub(crate) fn to_pod(&self) -> Pod {
        let rare = self.rare.as_deref().cloned().unwrap_or_default();
        let mut init_containers = Vec::new();
        if !rare.sidecar_ports.is_empty() {
            init_containers.push(container(
                "sidecars",
                &rare.sidecar_ports,
                Some(SIDECAR_RESTART_POLICY),
            ));
        }
        Pod {
            metadata: ObjectMeta {
                namespace: Some(self.namespace.to_string()),
                name: Some(self.name.to_string()),
                labels: Some(
                    self.labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                uid: self.uid.as_ref().map(Uid::text),
                deletion_timestamp: rare.deletion_timestamp,
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![container("containers", &self.ports, None)],
                init_containers: Some(init_containers),
                node_name: text(self.node_name.as_deref()),
                hostname: text(rare.hostname.as_deref()),
                subdomain: text(rare.subdomain.as_deref()),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: self.phase.text(&PHASES, rare.phase.as_deref()),
                pod_ip: if self.pod_ip_is_first {
                    self.first_ip.as_ref().map(Address::text)
                } else {
                    rare.pod_ip.as_ref().map(Address::text)
                },
                pod_ips: Some(
                    self.first_ip
                        .iter()
                        .chain(rare.more_ips.iter())
                        .map(|ip| PodIP { ip: ip.text() })
                        .collect(),
                ),
                conditions: self
                    .ready
                    .text(&CONDITION_STATUSES, rare.ready.as_deref())
                    .map(|status| {
                        vec![PodCondition {
                            type_: "Ready".to_owned(),
                            status,
                            ..PodCondition::default()
                        }]
                    }),
                ..PodStatus::default()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_endpoints::{build_endpoints, compute_desired_slices, NodeZones};
    use k8s_openapi::api::core::v1::Service;
    use serde_json::json;

    /// The facts of `pod` as decoded from its JSON, the way the watch gets them.
    fn facts(pod: &Pod) -> PodFacts {
        let slim: SlimPod = serde_json::from_value(serde_json::to_value(pod).unwrap()).unwrap();
        PodFacts::from_pod(&slim, &mut Interner::default())
    }

    fn mk_pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn mk_service(target_port: serde_json::Value, publish_not_ready: bool) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "svc-1"},
            "spec": {
                "selector": {"app": "web"},
                "clusterIP": "10.96.0.10",
                "ipFamilies": ["IPv4"],
                "publishNotReadyAddresses": publish_not_ready,
                "ports": [
                    {"name": "http", "port": 80, "targetPort": target_port},
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "dns"}
                ]
            }
        }))
        .unwrap()
    }

    fn fixtures() -> Vec<Pod> {
        vec![
            mk_pod(json!({
                "metadata": {"name": "a", "namespace": "shop", "uid": "u-a",
                             "labels": {"app": "web", "tier": "x"},
                             "annotations": {"big": "ignored"}, "resourceVersion": "7"},
                "spec": {"nodeName": "n1", "hostname": "a", "subdomain": "web",
                         "containers": [
                            {"name": "app", "image": "x", "ports": [
                                {"containerPort": 8080, "name": "http"},
                                {"containerPort": 9000},
                                {"containerPort": 5353, "name": "dns", "protocol": "UDP"}]}],
                         "initContainers": [
                            {"name": "setup", "ports": [{"containerPort": 1, "name": "http"}]},
                            {"name": "proxy", "restartPolicy": "Always",
                             "ports": [{"containerPort": 15001, "name": "admin"}]}]},
                "status": {"phase": "Running", "podIP": "10.244.1.5",
                           "podIPs": [{"ip": "10.244.1.5"}, {"ip": "fd00::5"}],
                           "conditions": [{"type": "PodScheduled", "status": "True"},
                                          {"type": "Ready", "status": "True"}],
                           "containerStatuses": [{"name": "app", "ready": true, "restartCount": 3,
                                                  "image": "x", "imageID": ""}]}
            })),
            mk_pod(json!({
                "metadata": {"name": "b", "namespace": "shop", "uid": "u-b",
                             "labels": {"app": "web"},
                             "deletionTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"nodeName": "n2", "containers": [
                    {"name": "app", "ports": [{"containerPort": 8081, "name": "http"}]}]},
                "status": {"phase": "Running", "podIP": "10.244.2.6",
                           "conditions": [{"type": "Ready", "status": "False"}]}
            })),
            mk_pod(json!({
                "metadata": {"name": "c", "namespace": "shop", "labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app"}]},
                "status": {"phase": "Succeeded", "podIP": "10.244.2.7"}
            })),
            mk_pod(json!({
                "metadata": {"name": "d", "namespace": "shop", "labels": {"app": "web"}},
                "spec": {"nodeName": "n1", "initContainers": [
                    {"name": "proxy", "restartPolicy": "Always",
                     "ports": [{"containerPort": 15000, "name": "http"}]}],
                    "containers": [{"name": "app"}]},
                "status": {"phase": "Running", "podIP": "10.244.1.9"}
            })),
            // Words outside the known ones, and a podIP that is not podIPs[0].
            mk_pod(json!({
                "metadata": {"name": "e", "namespace": "shop", "labels": {"app": "web"}},
                "spec": {"nodeName": "n2", "containers": [
                    {"name": "app", "ports": [{"containerPort": 8080, "name": "http"}]}]},
                "status": {"phase": "Evicting", "podIP": "10.244.2.20",
                           "podIPs": [{"ip": "10.244.2.21"}],
                           "conditions": [{"type": "Ready", "status": "Maybe"}]}
            })),
            mk_pod(json!({
                "metadata": {"name": "f", "namespace": "shop", "labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app"}]}
            })),
        ]
    }

    #[test]
    fn pod_facts_stay_small() {
        // One per pod in the cluster, in one slab.
        assert!(std::mem::size_of::<PodFacts>() <= 144);
    }

    #[test]
    fn replicas_share_labels_and_ports() {
        let mut interner = Interner::default();
        let mut facts_of = |pod: &Pod| {
            let slim: SlimPod = serde_json::from_value(serde_json::to_value(pod).unwrap()).unwrap();
            PodFacts::from_pod(&slim, &mut interner)
        };
        let a = fixtures().remove(0);
        let mut b = a.clone();
        b.metadata.name = Some("a-2".to_owned());
        let (fa, fb) = (facts_of(&a), facts_of(&b));
        assert!(Arc::ptr_eq(&fa.labels, &fb.labels));
        assert!(Arc::ptr_eq(&fa.ports, &fb.ports));
        assert_eq!(fa.ports.len(), 2);
        let other = facts_of(&fixtures().remove(1));
        assert!(!Arc::ptr_eq(&fa.ports, &other.ports));
    }

    #[test]
    fn facts_keep_status_words_and_addresses_as_written() {
        for pod in fixtures() {
            let back = facts(&pod).to_pod();
            let (want, got) = (pod.status.clone().unwrap_or_default(), back.status.unwrap());
            assert_eq!(got.phase, want.phase);
            assert_eq!(got.pod_ip, want.pod_ip);
            assert_eq!(
                got.pod_ips.clone().unwrap_or_default(),
                want.pod_ips.clone().unwrap_or_default()
            );
            let ready = |s: &PodStatus| {
                s.conditions
                    .iter()
                    .flatten()
                    .find(|c| c.type_ == "Ready")
                    .map(|c| c.status.clone())
            };
            assert_eq!(ready(&got), ready(&want));
            assert_eq!(facts(&facts(&pod).to_pod()), facts(&pod));
        }
        let words = |pod: &Pod| {
            let f = facts(pod);
            (f.phase, f.ready, f.pod_ip_is_first, f.rare.is_some())
        };
        let all = fixtures();
        assert_eq!(words(&all[0]), (Word(2), Word(1), true, true));
        assert_eq!(words(&all[3]), (Word(2), Word::UNSET, false, true));
        assert_eq!(words(&all[4]), (Word::OTHER, Word::OTHER, false, true));
        assert_eq!(words(&all[5]), (Word::UNSET, Word::UNSET, false, false));
    }

    #[test]
    fn facts_give_the_same_endpoints_and_slices_as_the_pod() {
        let pods = fixtures();
        let slim: Vec<Pod> = pods.iter().map(|p| facts(p).to_pod()).collect();
        let mut nodes = NodeZones::new();
        nodes.insert("n1", Some("z1".to_owned()));
        nodes.insert("n2", None);
        for publish in [false, true] {
            for target in [json!("http"), json!(8443), json!("admin")] {
                let svc = mk_service(target.clone(), publish);
                assert_eq!(
                    build_endpoints(&svc, &pods).value,
                    build_endpoints(&svc, &slim).value,
                    "{target} {publish}"
                );
                assert_eq!(
                    compute_desired_slices(&svc, &pods, &nodes).value,
                    compute_desired_slices(&svc, &slim, &nodes).value,
                    "{target} {publish}"
                );
            }
        }
    }

    #[test]
    fn facts_ignore_what_endpoints_do_not_read() {
        let pod = fixtures().remove(0);
        let mut changed = pod.clone();
        changed.metadata.resource_version = Some("8".to_owned());
        changed.metadata.annotations = None;
        if let Some(status) = changed.status.as_mut() {
            status.container_statuses = None;
        }
        assert_eq!(facts(&pod), facts(&changed));

        let mut unready = pod.clone();
        if let Some(c) = unready
            .status
            .as_mut()
            .and_then(|s| s.conditions.as_mut())
            .and_then(|c| c.last_mut())
        {
            c.status = "False".to_owned();
        }
        assert_ne!(facts(&pod), facts(&unready));
    }
}

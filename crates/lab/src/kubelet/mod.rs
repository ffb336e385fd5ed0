//! The lab kubelet: Node objects for the lab's node namespaces, and Pods as pod namespaces.
//!
//! - Each node namespace becomes a Node: an `InternalIP` per family of the cluster (its LAN
//!   addresses), `podCIDRs` likewise, `providerID` (`berth-lab://<prefix>/<node>`), and a Ready
//!   condition renewed every heartbeat.
//! - A Pod without `spec.nodeName` is bound to the Ready node with the fewest pods that matches
//!   its `nodeSelector`. A Pod bound to a lab node becomes a namespace hanging off that node (the
//!   topology's pod links, address 10.244.<n>.(slot+1), and fd00:244:<n>::(slot+1) when the
//!   lab has IPv6) running the HTTP echo server ([`server`]) on each TCP `containerPort` (8080
//!   when none), on every address of the pod.
//! - Status: `podIP(s)`, `hostIP(s)` (one per family of the cluster, primary first), phase
//!   Running, and Ready from a real HTTP readiness probe sent from the node's namespace to the
//!   pod's primary address, IPv4 or IPv6 (the container's `readinessProbe.httpGet`, else
//!   `GET /healthz` on the first port) every probe period.
//! - Flipping readiness: the annotation `lab.berth.dev/ready: "false"` closes the pod's gate, so
//!   its server answers the probe with 503 and the next probe turns Ready False; removing the
//!   annotation (or any other value) opens it again. `kubectl annotate pod NAME
//!   lab.berth.dev/ready=false --overwrite` is the whole demo.
//! - Deletion: with the API server's graceful pod deletion the Pod keeps serving, terminating,
//!   until `deletionTimestamp`; then the kubelet stops it, deletes its namespace and deletes the
//!   Pod with grace period 0.
//!
//! Decisions are pure ([`pods::plan_pods`], [`pods::build_pod_status`], [`node`]); [`Kubelet::run`]
//! carries them out.

pub mod node;
pub mod pods;
pub mod server;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use berth_core::IpFamily;

use chrono::{SecondsFormat, Utc};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::Client;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::cluster::plan::{node_ip, LabFamilies};
use crate::netns::{http_get, NetnsError};
use crate::topology::{
    free_pod_slot, parse_link_names, plan_add_pod, plan_destroy, pod_layout, remove_leftovers,
    IpCommand, Layout, PodLayout, Runner, TopologyError,
};
use pods::{plan_pods, Action, NodeView, PodFacts, PodView, Running};
use server::PodServer;

/// A pod annotated with `"false"` here fails its readiness probe.
pub const READY_ANNOTATION: &str = berth_api::names::annotation::LAB_READY;
/// The port a pod's echo server listens on when its containers declare no TCP port.
pub const DEFAULT_POD_PORT: u16 = 8080;
const FIELD_MANAGER: &str = "berth-lab-kubelet";

#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("node {0} has no free pod slot (253 pods at most)")]
    Full(String),
    #[error("pod watch ended")]
    WatchEnded,
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> KubeletError {
    let what = what.into();
    move |source| KubeletError::Api { what, source }
}

fn now_rfc3339() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The kubelet's settings.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    pub layout: Layout,
    /// The cluster's families: which of a node's and a pod's addresses are reported, in order.
    pub families: LabFamilies,
    /// Time between readiness probes (and pod reconciles without a watch event).
    pub probe_period: Duration,
    /// Time between Node heartbeats.
    pub heartbeat_period: Duration,
}

impl KubeletConfig {
    pub fn new(layout: Layout) -> Self {
        KubeletConfig {
            layout,
            families: LabFamilies::Ipv4,
            probe_period: Duration::from_millis(500),
            heartbeat_period: Duration::from_secs(10),
        }
    }

    /// The cluster's families (IPv4 unless set).
    pub fn with_families(mut self, families: LabFamilies) -> Self {
        self.families = families;
        self
    }
}

/// A pod's addresses of the cluster's families, primary first.
pub fn pod_ips(pod: &PodLayout, families: LabFamilies) -> Vec<IpAddr> {
    families
        .families()
        .iter()
        .filter_map(|family| match family {
            IpFamily::V4 => Some(IpAddr::V4(pod.ip)),
            IpFamily::V6 => pod.ip6.map(IpAddr::V6),
        })
        .collect()
}

struct RunningPod {
    view: PodView,
    node: String,
    layout: PodLayout,
    /// The pod's addresses the cluster knows, primary first, and its node's.
    pod_ips: Vec<IpAddr>,
    host_ips: Vec<IpAddr>,
    server: PodServer,
    gate: bool,
    started: String,
    ready: bool,
    ready_since: String,
    written: Option<Value>,
}

pub struct Kubelet {
    client: Client,
    config: KubeletConfig,
    running: BTreeMap<String, RunningPod>,
    /// Binds written but not yet seen in the watch, by uid: the watch lags behind the kubelet's
    /// own writes, and a pod must not be bound twice.
    binding: BTreeMap<String, String>,
}

impl Kubelet {
    pub fn new(client: Client, config: KubeletConfig) -> Self {
        Kubelet {
            client,
            config,
            running: BTreeMap::new(),
            binding: BTreeMap::new(),
        }
    }

    /// Runs until `shutdown`; then stops every pod and deletes its namespace.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), KubeletError> {
        let since = now_rfc3339();
        self.apply_nodes(&since, true).await?;
        self.remove_stale_pods().await?;
        let (reader, writer) = reflector::store::<Pod>();
        let pods: Api<Pod> = Api::all(self.client.clone());
        let mut events = reflector(writer, watcher(pods, watcher::Config::default()))
            .default_backoff()
            .boxed();
        let mut tick = tokio::time::interval(self.config.probe_period);
        let mut heartbeat = tokio::time::interval(self.config.heartbeat_period);
        let mut listed = false;
        let result = loop {
            tokio::select! {
                _ = shutdown.cancelled() => break Ok(()),
                event = events.next() => match event {
                    Some(Ok(watcher::Event::InitDone)) => listed = true,
                    Some(Ok(_)) => {}
                    Some(Err(err)) => tracing::warn!(error = %err, "pod watch"),
                    None => break Err(KubeletError::WatchEnded),
                },
                _ = tick.tick() => self.probe_all().await,
                _ = heartbeat.tick() => {
                    if let Err(err) = self.apply_nodes(&since, false).await {
                        tracing::warn!(error = %err, "node heartbeat");
                    }
                }
            }
            if listed {
                let mut snapshot: Vec<PodView> = reader
                    .state()
                    .iter()
                    .filter_map(|p| pods::pod_view(p))
                    .collect();
                pods::overlay_binds(&mut snapshot, &mut self.binding);
                self.reconcile(&snapshot).await;
            }
        };
        let all: Vec<String> = self.running.keys().cloned().collect();
        for uid in all {
            self.stop(&uid).await;
        }
        result
    }

    fn node_views(&self) -> Vec<NodeView> {
        self.config
            .layout
            .nodes
            .iter()
            .map(|n| NodeView {
                name: n.name.clone(),
                labels: BTreeMap::from([("kubernetes.io/hostname".to_string(), n.name.clone())]),
                ready: true,
            })
            .collect()
    }

    async fn apply_nodes(&self, since: &str, with_spec: bool) -> Result<(), KubeletError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let prefix = &self.config.layout.prefix;
        let families = self.config.families;
        for n in &self.config.layout.nodes {
            if with_spec {
                nodes
                    .patch(
                        &n.name,
                        &params,
                        &Patch::Apply(node::build_node(prefix, n, families)),
                    )
                    .await
                    .map_err(api_err(format!("applying Node {}", n.name)))?;
            }
            let status = node::build_node_status(n, families, since, &now_rfc3339());
            // A merge patch, which replaces lists whole: applied, `addresses` is a map keyed by
            // `type`, and a dual-stack node's two InternalIPs would collapse into one.
            nodes
                .patch_status(
                    &n.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": status["status"]})),
                )
                .await
                .map_err(api_err(format!("applying the status of Node {}", n.name)))?;
        }
        Ok(())
    }

    /// Pod namespaces a previous kubelet of this lab left (it was killed): their servers died
    /// with it.
    async fn remove_stale_pods(&self) -> Result<(), KubeletError> {
        let prefixes: Vec<String> = self
            .config
            .layout
            .nodes
            .iter()
            .map(|n| n.netns.clone())
            .collect();
        tokio::task::spawn_blocking(move || {
            for prefix in prefixes {
                remove_leftovers(&prefix)?;
            }
            Ok::<_, KubeletError>(())
        })
        .await
        .map_err(|e| KubeletError::Io {
            what: "removing stale pod namespaces".into(),
            source: std::io::Error::other(e),
        })?
    }

    async fn reconcile(&mut self, pods: &[PodView]) {
        let running: BTreeMap<String, Running> = self
            .running
            .iter()
            .map(|(uid, p)| {
                (
                    uid.clone(),
                    Running {
                        node: p.node.clone(),
                        gate: p.gate,
                    },
                )
            })
            .collect();
        let by_uid: BTreeMap<&str, &PodView> = pods.iter().map(|p| (p.uid.as_str(), p)).collect();
        for action in plan_pods(pods, &running, &self.node_views(), Utc::now()) {
            let outcome = match &action {
                Action::Bind {
                    namespace,
                    name,
                    node,
                } => {
                    let bound = self.bind(namespace, name, node).await;
                    if bound.is_ok() {
                        if let Some(view) = pods
                            .iter()
                            .find(|p| &p.namespace == namespace && &p.name == name)
                        {
                            self.binding.insert(view.uid.clone(), node.clone());
                        }
                    }
                    bound
                }
                Action::Start { uid } => match by_uid.get(uid.as_str()) {
                    Some(view) => self.start(view).await,
                    None => Ok(()),
                },
                Action::Gate { uid, ready } => {
                    if let Some(p) = self.running.get_mut(uid) {
                        p.server.set_ready(*ready);
                        p.gate = *ready;
                    }
                    Ok(())
                }
                Action::Stop { uid } => {
                    self.stop(uid).await;
                    Ok(())
                }
                Action::Finalize {
                    namespace,
                    name,
                    uid,
                } => self.finalize(namespace, name, uid).await,
            };
            if let Err(err) = outcome {
                tracing::warn!(?action, error = %err, "lab kubelet");
            }
        }
        for (uid, p) in self.running.iter_mut() {
            if let Some(view) = by_uid.get(uid.as_str()) {
                p.view = (*view).clone();
            }
        }
        self.write_statuses().await;
    }

    async fn bind(&self, namespace: &str, name: &str, node: &str) -> Result<(), KubeletError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        pods.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeName": node}})),
        )
        .await
        .map_err(api_err(format!("binding pod {namespace}/{name} to {node}")))?;
        tracing::info!(pod = %format!("{namespace}/{name}"), %node, "bound");
        Ok(())
    }

    async fn start(&mut self, view: &PodView) -> Result<(), KubeletError> {
        let Some(node_name) = view.node.clone() else {
            return Ok(());
        };
        let layout = &self.config.layout;
        let Some(node) = layout.node(&node_name).cloned() else {
            return Ok(());
        };
        let mut taken: BTreeSet<String> = self
            .running
            .values()
            .filter(|p| p.node == node_name)
            .flat_map(|p| [p.layout.node_veth.clone(), p.layout.netns.clone()])
            .collect();
        let node_netns = node.netns.clone();
        taken.extend(
            tokio::task::spawn_blocking(move || existing_links_and_namespaces(&node_netns))
                .await
                .map_err(|e| KubeletError::Io {
                    what: "listing a node's links".into(),
                    source: std::io::Error::other(e),
                })??,
        );
        let slot = free_pod_slot(&layout.prefix, &node, &taken)
            .ok_or_else(|| KubeletError::Full(node_name.clone()))?;
        let pod = pod_layout(&layout.prefix, &node, slot, &view.name)?;
        let steps = plan_add_pod(&node, &pod);
        let netns = pod.netns.clone();
        tokio::task::spawn_blocking(move || {
            let mut runner = IpCommand;
            let mut result = Ok(());
            for step in steps {
                if let Err(err) = runner.run(&step.argv()) {
                    result = Err(err);
                    break;
                }
            }
            if result.is_err() {
                for step in plan_destroy(std::iter::once(netns.as_str())) {
                    let _ = runner.run(&step.argv());
                }
            }
            result
        })
        .await
        .map_err(|e| KubeletError::Io {
            what: "making a pod namespace".into(),
            source: std::io::Error::other(e),
        })??;
        let server = match PodServer::start(
            &pod.netns,
            &view.name,
            &view.ports,
            pod.ip6.is_some(),
            view.ready_gate,
        ) {
            Ok(server) => server,
            Err(err) => {
                delete_netns(pod.netns.clone()).await;
                return Err(err);
            }
        };
        let now = now_rfc3339();
        let families = self.config.families;
        let pod_ips = pod_ips(&pod, families);
        let host_ips: Vec<IpAddr> = families
            .families()
            .iter()
            .filter_map(|family| node_ip(&node, *family))
            .collect();
        tracing::info!(pod = %format!("{}/{}", view.namespace, view.name), node = %node_name, ips = ?pod_ips, "started");
        self.running.insert(
            view.uid.clone(),
            RunningPod {
                view: view.clone(),
                node: node_name,
                layout: pod,
                pod_ips,
                host_ips,
                server,
                gate: view.ready_gate,
                started: now.clone(),
                ready: false,
                ready_since: now,
                written: None,
            },
        );
        Ok(())
    }

    async fn stop(&mut self, uid: &str) {
        if let Some(p) = self.running.remove(uid) {
            drop(p.server);
            tracing::info!(pod = %format!("{}/{}", p.view.namespace, p.view.name), "stopped");
            delete_netns(p.layout.netns).await;
        }
    }

    async fn finalize(&self, namespace: &str, name: &str, uid: &str) -> Result<(), KubeletError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match pods.delete(name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
            Err(err) => Err(api_err(format!("deleting pod {namespace}/{name}"))(err)),
        }
    }

    /// Probes every running pod once, all at the same time, from its node's namespace.
    async fn probe_all(&mut self) {
        let layout = &self.config.layout;
        let probes: Vec<_> = self
            .running
            .iter()
            .filter_map(|(uid, p)| {
                let node_ns = layout.node(&p.node)?.netns.clone();
                let (path, port) = p.view.probe.clone();
                // The primary address, as a kubelet probes the pod's podIP.
                let addr = SocketAddr::new(*p.pod_ips.first()?, port);
                let uid = uid.clone();
                Some(tokio::task::spawn_blocking(move || {
                    let ok = http_get(&node_ns, addr, &path, Duration::from_secs(1))
                        .is_ok_and(|(code, _)| (200..400).contains(&code));
                    (uid, ok)
                }))
            })
            .collect();
        for probe in futures::future::join_all(probes).await {
            let Ok((uid, ok)) = probe else { continue };
            if let Some(p) = self.running.get_mut(&uid) {
                if p.ready != ok {
                    p.ready = ok;
                    p.ready_since = now_rfc3339();
                }
            }
        }
    }

    async fn write_statuses(&mut self) {
        for p in self.running.values_mut() {
            let facts = PodFacts {
                pod_ips: p.pod_ips.clone(),
                host_ips: p.host_ips.clone(),
                started: p.started.clone(),
                ready: p.ready,
                ready_since: p.ready_since.clone(),
            };
            let status = pods::build_pod_status(&p.view, &facts);
            if p.written.as_ref() == Some(&status) {
                continue;
            }
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &p.view.namespace);
            match api
                .patch_status(
                    &p.view.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": status})),
                )
                .await
            {
                Ok(_) => p.written = Some(status),
                Err(err) => tracing::warn!(pod = %p.view.name, error = %err, "writing pod status"),
            }
        }
    }
}

/// The links of `node_netns` and every named namespace: a pod slot whose veth or namespace is
/// still among them is not free.
fn existing_links_and_namespaces(node_netns: &str) -> Result<Vec<String>, KubeletError> {
    let argv: Vec<String> = ["ip", "-n", node_netns, "-o", "link", "show"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let mut names = parse_link_names(&IpCommand.run(&argv)?);
    match std::fs::read_dir(crate::netns::NETNS_RUN_DIR) {
        Ok(dir) => names.extend(
            dir.filter_map(Result::ok)
                .map(|entry| entry.file_name().to_string_lossy().into_owned()),
        ),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(KubeletError::Io {
                what: format!("reading {}", crate::netns::NETNS_RUN_DIR),
                source,
            })
        }
    }
    Ok(names)
}

async fn delete_netns(netns: String) {
    let _ = tokio::task::spawn_blocking(move || {
        for step in plan_destroy(std::iter::once(netns.as_str())) {
            let _ = IpCommand.run(&step.argv());
        }
    })
    .await;
}

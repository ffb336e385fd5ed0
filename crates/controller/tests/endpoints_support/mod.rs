//! Shared setup for the endpoints controller tests: a lab API server on 127.0.0.1, the controller
//! running against it over real HTTP, and builders for Services, Pods and Nodes.

#![allow(clippy::unwrap_used, dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use berth_controller::endpoints::{EndpointsConfig, EndpointsController, Error};
use berth_endpoints::{LABEL_MANAGED_BY, LABEL_SERVICE_NAME, MANAGED_BY_BERTH};
use berth_lab::{LabApiServer, LabApiServerHandle};
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const NS: &str = "default";

pub struct Env {
    pub server: LabApiServerHandle,
    pub client: Client,
    pub registry: Registry,
    shutdown: CancellationToken,
    task: Option<JoinHandle<Result<(), Error>>>,
}

impl Env {
    pub async fn start() -> Env {
        Env::start_with(LabApiServer::builder(), EndpointsConfig::default()).await
    }

    /// Nodes n1 (zone z1) and n2 (zone z2) exist before the controller starts.
    pub async fn start_with(
        builder: berth_lab::LabApiServerBuilder,
        config: EndpointsConfig,
    ) -> Env {
        let (server, client) = berth_testing::start_lab_with(builder).await;
        for (name, zone) in [("n1", "z1"), ("n2", "z2")] {
            Api::<Node>::all(client.clone())
                .create(&PostParams::default(), &mk_node(name, zone))
                .await
                .unwrap();
        }
        let mut env = Env {
            server,
            client,
            registry: Registry::default(),
            shutdown: CancellationToken::new(),
            task: None,
        };
        env.start_controller(config);
        env
    }

    pub fn start_controller(&mut self, config: EndpointsConfig) {
        let controller = EndpointsController::new(self.client.clone(), config, &mut self.registry);
        let shutdown = CancellationToken::new();
        self.shutdown = shutdown.clone();
        self.task = Some(tokio::spawn(controller.run(shutdown)));
    }

    /// Stops the controller and checks that it stopped cleanly.
    pub async fn stop_controller(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }

    pub async fn stop(mut self) {
        self.stop_controller().await;
        self.server.shutdown().await.unwrap();
    }

    pub fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub fn endpoints(&self) -> Api<Endpoints> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub fn slices(&self) -> Api<EndpointSlice> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub async fn create_service(&self, svc: Value) -> Service {
        let svc: Service = serde_json::from_value(svc).unwrap();
        self.services()
            .create(&PostParams::default(), &svc)
            .await
            .unwrap()
    }

    /// Creates a pod on `node` and reports its IP and readiness, as a kubelet would.
    pub async fn create_pod(&self, pod: Value, ip: &str, ready: bool) -> Pod {
        let pod: Pod = serde_json::from_value(pod).unwrap();
        let name = pod.metadata.name.clone().unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        self.set_pod_status(&name, ip, ready).await
    }

    pub async fn set_pod_status(&self, name: &str, ip: &str, ready: bool) -> Pod {
        let status = json!({"status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]
        }});
        self.pods()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap()
    }

    /// berth's slices of `service`, sorted by name.
    pub async fn berth_slices(&self, service: &str) -> Vec<EndpointSlice> {
        // The managed-by value is not valid in a label selector, so filter here.
        let selector = format!("{LABEL_SERVICE_NAME}={service}");
        let mut slices: Vec<EndpointSlice> = self
            .slices()
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|s| {
                s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_MANAGED_BY))
                    .map(String::as_str)
                    == Some(MANAGED_BY_BERTH)
            })
            .collect();
        slices.sort_by_key(|s| s.metadata.name.clone());
        slices
    }

    /// Ready and not-ready IPs of the Endpoints object, sorted; `None` when it does not exist.
    pub async fn endpoint_ips(&self, service: &str) -> Option<(Vec<String>, Vec<String>)> {
        let ep = self.endpoints().get_opt(service).await.unwrap()?;
        let mut ready = Vec::new();
        let mut not_ready = Vec::new();
        for subset in ep.subsets.into_iter().flatten() {
            ready.extend(subset.addresses.into_iter().flatten().map(|a| a.ip));
            not_ready.extend(
                subset
                    .not_ready_addresses
                    .into_iter()
                    .flatten()
                    .map(|a| a.ip),
            );
        }
        for list in [&mut ready, &mut not_ready] {
            list.sort();
            list.dedup();
        }
        Some((ready, not_ready))
    }

    /// (ip, ready, serving, terminating) of every endpoint in berth's slices, sorted.
    pub async fn slice_endpoints(&self, service: &str) -> Vec<(String, bool, bool, bool)> {
        let mut out = Vec::new();
        for slice in self.berth_slices(service).await {
            for e in slice.endpoints {
                let c = e.conditions.unwrap_or_default();
                out.push((
                    e.addresses[0].clone(),
                    c.ready.unwrap_or(false),
                    c.serving.unwrap_or(false),
                    c.terminating.unwrap_or(false),
                ));
            }
        }
        out.sort();
        out
    }
}

pub fn mk_node(name: &str, zone: &str) -> Node {
    berth_testing::mk_node(name, json!({"topology.kubernetes.io/zone": zone}), &[])
}

/// A ClusterIP Service selecting `app: <app>`, one TCP port 80 -> `target`.
pub fn mk_service(name: &str, app: &str, cluster_ip: &str, target: Value) -> Value {
    let mut service = berth_testing::mk_service_json(
        NS,
        name,
        json!({
            "selector": {"app": app},
            "clusterIP": cluster_ip,
            "clusterIPs": [cluster_ip],
            "ipFamilies": ["IPv4"],
            "ports": [{"name": "http", "port": 80, "targetPort": target, "protocol": "TCP"}]
        }),
    );
    service["metadata"]["labels"] = json!({"team": "shop"});
    service
}

/// A pod labelled `app: <app>` on `node`, with a container port named `http` = `http_port`.
pub fn mk_pod(name: &str, app: &str, node: &str, http_port: i32) -> Value {
    json!({
        "metadata": {"name": name, "namespace": NS, "labels": {"app": app}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "echo",
                            "ports": [{"name": "http", "containerPort": http_port}]}]
        }
    })
}

pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Polls `check` until it returns `Some`, failing with `what` after `limit`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    berth_testing::eventually(what, limit, Duration::from_millis(20), check).await
}

pub const WAIT: Duration = Duration::from_secs(15);

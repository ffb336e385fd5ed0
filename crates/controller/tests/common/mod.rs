//! Shared helpers for the controller tests against the lab API server (127.0.0.1, free port).
//!
//! Address plan: service CIDR 10.96.0.0/16 (and fd00:96::/112 for dual-stack tests), node
//! ports 30000-32767, LoadBalancer pools inside 198.18.0.0/24.

#![allow(clippy::unwrap_used, dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use berth_controller::{AllocationController, ControllerConfig};
use berth_lab::LabApiServerHandle;
use berth_telemetry::Readiness;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub async fn start_lab() -> (LabApiServerHandle, Client) {
    let (server, client) = berth_testing::start_lab().await;
    berth_testing::install_crds(&client).await;
    (server, client)
}

pub fn mk_config() -> ControllerConfig {
    ControllerConfig::new(vec!["10.96.0.0/16".parse().unwrap()])
}

/// How long a cancelled controller may take to return. Not a performance bound: a controller
/// that has not returned by then hangs on shutdown, which fails the test.
pub const SHUTDOWN_LIMIT: Duration = Duration::from_secs(30);

pub struct Running {
    pub token: CancellationToken,
    pub task: JoinHandle<Result<(), berth_controller::Error>>,
    pub registry: std::sync::Arc<Registry>,
    /// Ready once this controller has listed and adopted what is already allocated.
    pub readiness: Readiness,
}

impl Running {
    /// The value of a metric line `name` (exact label set included), 0 when absent.
    pub fn metric(&self, name: &str) -> f64 {
        let text = berth_telemetry::encode_registry(&self.registry).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or(0.0)
    }

    /// Ends the task as a crash would: no lease release, writes in flight dropped. A controller
    /// that already failed on its own fails the test.
    pub async fn crash(self) {
        assert!(
            !self.task.is_finished(),
            "the controller ended before the crash: {:?}",
            self.task.await
        );
        self.task.abort();
        let _ = self.task.await;
    }

    /// Waits until this controller has adopted what the cluster already holds (its readiness).
    pub async fn adopted(&self) {
        wait_until("the controller to list and adopt", || async {
            assert!(!self.task.is_finished(), "the controller ended on its own");
            self.readiness.is_ready()
        })
        .await;
    }

    /// Cancels the controller and fails the test unless it returns `Ok` within
    /// [`SHUTDOWN_LIMIT`]: an error, a panic or a hang on shutdown is a failure.
    pub async fn stop(self) {
        self.token.cancel();
        finish("controller", self.task).await;
    }
}

/// Fails the test unless `task` (already told to stop) returns `Ok` within [`SHUTDOWN_LIMIT`].
pub async fn finish<E: std::fmt::Display>(what: &str, task: JoinHandle<Result<(), E>>) {
    match tokio::time::timeout(SHUTDOWN_LIMIT, task).await {
        Err(_) => panic!("the {what} did not return within {SHUTDOWN_LIMIT:?} of its cancellation"),
        Ok(Err(join)) => panic!("the {what} task panicked or was aborted: {join}"),
        Ok(Ok(Err(err))) => panic!("the {what} returned an error: {err}"),
        Ok(Ok(Ok(()))) => {}
    }
}

pub fn spawn_controller(client: Client, cfg: ControllerConfig) -> Running {
    spawn_controller_with(client, cfg, |ctrl| ctrl)
}

/// [`spawn_controller`], with `customize` applied to the controller first (a provider, ...).
pub fn spawn_controller_with(
    client: Client,
    cfg: ControllerConfig,
    customize: impl FnOnce(AllocationController) -> AllocationController,
) -> Running {
    let mut registry = Registry::with_prefix("berth_controller");
    let readiness = Readiness::new();
    let check = readiness.register("controller").unwrap();
    let ctrl =
        customize(AllocationController::new(client, cfg, &mut registry)).with_readiness(check);
    let token = CancellationToken::new();
    let task = tokio::spawn(ctrl.run(token.clone()));
    Running {
        token,
        task,
        registry: std::sync::Arc::new(registry),
        readiness,
    }
}

/// `client`, except that before sending its `nth` PATCH of `path` (1 for the first) it runs
/// `before` to completion: another writer's change lands just ahead of it, or the write waits
/// for something to happen first.
pub fn before_patch<F>(client: Client, path: &'static str, nth: usize, before: F) -> Client
where
    F: Fn(Client) -> BoxFuture<'static, ()> + Send + Sync + 'static,
{
    let seen = Arc::new(AtomicUsize::new(0));
    let before = Arc::new(before);
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (client, seen, before) = (client.clone(), seen.clone(), before.clone());
        async move {
            if req.method() == http::Method::PATCH
                && req.uri().path() == path
                && seen.fetch_add(1, Ordering::SeqCst) + 1 == nth
            {
                before(client.clone()).await;
            }
            client.send(req).await
        }
    });
    Client::new(service, "default")
}

/// The requests a client sent, as (method, path), in order.
#[derive(Clone, Default)]
pub struct Requests(Arc<std::sync::Mutex<Vec<(http::Method, String)>>>);

impl Requests {
    pub fn all(&self) -> Vec<(http::Method, String)> {
        self.0.lock().unwrap().clone()
    }

    /// How many requests `method` sent to exactly `path`.
    pub fn count(&self, method: &http::Method, path: &str) -> usize {
        self.all()
            .iter()
            .filter(|(m, p)| m == method && p == path)
            .count()
    }

    /// Every request that was not a read (GET), outside paths starting with `except`.
    pub fn writes_outside(&self, except: &str) -> Vec<(http::Method, String)> {
        self.all()
            .into_iter()
            .filter(|(m, p)| m != http::Method::GET && !p.starts_with(except))
            .collect()
    }
}

/// `client`, recording every request it sends.
pub fn recording(client: Client) -> (Client, Requests) {
    let requests = Requests::default();
    let seen = requests.clone();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (client, seen) = (client.clone(), seen.clone());
        seen.0
            .lock()
            .unwrap()
            .push((req.method().clone(), req.uri().path().to_string()));
        async move { client.send(req).await }
    });
    (Client::new(service, "default"), requests)
}

pub async fn create_pool(client: &Client, name: &str, spec: Value) {
    let api: Api<berth_api::IPPool> = Api::all(client.clone());
    let pool: berth_api::IPPool = serde_json::from_value(json!({
        "apiVersion": "berth.dev/v1alpha1", "kind": "IPPool",
        "metadata": {"name": name}, "spec": spec}))
    .unwrap();
    api.create(&PostParams::default(), &pool).await.unwrap();
}

pub async fn create_svc(client: &Client, name: &str, spec: Value) -> Service {
    create_svc_full(client, json!({"metadata": {"name": name}, "spec": spec})).await
}

pub async fn create_svc_full(client: &Client, v: Value) -> Service {
    let ns = v["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_string();
    let api: Api<Service> = Api::namespaced(client.clone(), &ns);
    let svc: Service = serde_json::from_value(v).unwrap();
    api.create(&PostParams::default(), &svc).await.unwrap()
}

pub async fn patch_svc(client: &Client, name: &str, patch: Value) {
    let api: Api<Service> = Api::default_namespaced(client.clone());
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

pub async fn delete_svc(client: &Client, name: &str) {
    let api: Api<Service> = Api::default_namespaced(client.clone());
    api.delete(name, &DeleteParams::default()).await.unwrap();
}

pub async fn get_svc(client: &Client, name: &str) -> Service {
    Api::<Service>::default_namespaced(client.clone())
        .get(name)
        .await
        .unwrap()
}

pub async fn all_services(client: &Client) -> Vec<Service> {
    Api::<Service>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

/// Polls `check` on the Service until it holds (20 s at most).
pub async fn wait_svc<F>(client: &Client, name: &str, what: &str, check: F) -> Service
where
    F: Fn(&Service) -> bool,
{
    let mut last = None;
    for _ in 0..400 {
        if let Ok(svc) = Api::<Service>::default_namespaced(client.clone())
            .get(name)
            .await
        {
            if check(&svc) {
                return svc;
            }
            last = Some(svc);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {name}: {what}; last seen {last:#?}");
}

/// Waits until the controller has caught up with everything that happened before this call:
/// it creates a new ClusterIP Service and waits for its allocation. The controller decides
/// Services in the order its watch delivers them, in one loop, so once it has decided (and
/// written) a Service created now, it has seen every earlier event, including the echoes of its
/// own earlier writes, and made every decision they caused; with `max_in_flight` 1 its earlier
/// writes have also landed. A test that then finds a value unchanged has seen the decisions
/// that could have changed it, where a sleep only hoped to.
pub async fn settled(client: &Client) {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let name = format!("settled-{}", NEXT.fetch_add(1, Ordering::SeqCst));
    create_svc(client, &name, json!({"ports": [{"port": 80}]})).await;
    wait_svc(client, &name, "allocated (the controller caught up)", |s| {
        allocated(s).is_some_and(|c| c.0 == "True")
    })
    .await;
}

/// Polls until `f` returns true (30 s at most).
pub async fn wait_until<F, Fut>(what: &str, f: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    let check = || {
        let holds = f();
        async move { holds.await.then_some(()) }
    };
    berth_testing::eventually(
        what,
        Duration::from_secs(30),
        Duration::from_millis(50),
        check,
    )
    .await
}

pub fn cluster_ip(svc: &Service) -> Option<String> {
    svc.spec
        .as_ref()?
        .cluster_ip
        .clone()
        .filter(|s| !s.is_empty())
}

pub fn node_ports(svc: &Service) -> Vec<Option<i32>> {
    svc.spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default()
        .iter()
        .map(|p| p.node_port)
        .collect()
}

pub fn ingress_ips(svc: &Service) -> Vec<String> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.clone())
        .unwrap_or_default()
        .iter()
        .filter_map(|i| i.ip.clone())
        .collect()
}

/// The `berth.dev/Allocated` condition as (status, reason, message).
pub fn allocated(svc: &Service) -> Option<(String, String, String)> {
    svc.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "berth.dev/Allocated")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Notes of events.k8s.io Events about `name`.
pub async fn events_for(client: &Client, name: &str) -> Vec<(String, String)> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

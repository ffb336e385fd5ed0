//! The lab as a test harness: an API server per test and a client for it, and waiting for
//! something to become true.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_apiserver::{LabApiServer, LabApiServerBuilder, LabApiServerHandle};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::Notify;

/// A lab API server on 127.0.0.1 (a free port) and a client for it.
pub async fn start_lab() -> (LabApiServerHandle, Client) {
    start_lab_with(LabApiServer::builder()).await
}

/// The lab API server `builder` describes, started, and a client for it.
pub async fn start_lab_with(builder: LabApiServerBuilder) -> (LabApiServerHandle, Client) {
    let server = builder
        .start()
        .await
        .unwrap_or_else(|err| panic!("starting the lab API server: {err}"));
    let client = server
        .client()
        .unwrap_or_else(|err| panic!("a client for the lab API server: {err}"));
    (server, client)
}

/// Creates berth's CRDs, so its custom resources can be served.
pub async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in berth_api::crds() {
        crds.create(&PostParams::default(), &crd)
            .await
            .unwrap_or_else(|err| panic!("creating CRD {:?}: {err}", crd.metadata.name));
    }
}

/// Polls `check` every `every` until it returns `Some`, failing with `what` after `limit`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, every: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(every).await;
    }
}

/// Holds a client's watch requests for one path while closed: a watcher that falls behind on
/// purpose, so a test can change (and compact) the history it would have read.
#[derive(Default)]
pub struct WatchGate {
    closed: AtomicBool,
    opened: Notify,
    held: AtomicUsize,
}

impl WatchGate {
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    pub fn open(&self) {
        self.closed.store(false, Ordering::SeqCst);
        self.opened.notify_waiters();
    }

    /// Watch requests that arrived while the gate was closed.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// `client`, except that its watches of exactly `path` (e.g. `/api/v1/services`) wait while
    /// the gate is closed.
    pub fn wrap(self: &Arc<Self>, client: Client, path: &'static str) -> Client {
        let gate = self.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let (client, gate) = (client.clone(), gate.clone());
            async move {
                let watch = req.uri().path() == path
                    && req.uri().query().is_some_and(|q| {
                        q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1")
                    });
                if watch && gate.closed.load(Ordering::SeqCst) {
                    // Registered before the second look, so an `open` in between is not missed.
                    let opened = gate.opened.notified();
                    gate.held.fetch_add(1, Ordering::SeqCst);
                    if gate.closed.load(Ordering::SeqCst) {
                        opened.await;
                    }
                }
                client.send(req).await
            }
        });
        Client::new(service, "default")
    }
}

/// A new directory under the system's temporary directory, unique to this process and moment.
pub fn unique_dir(prefix: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("{prefix}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|err| panic!("creating {}: {err}", dir.display()));
    dir
}

/// Server-side applies `object` (its `apiVersion` and `kind` set here) under the field manager
/// `manager`, finding its resource by discovery: namespaced when it names a namespace.
pub async fn apply_object(
    client: &Client,
    api_version: &str,
    kind: &str,
    mut object: serde_json::Value,
    manager: &str,
) {
    object["apiVersion"] = serde_json::json!(api_version);
    object["kind"] = serde_json::json!(kind);
    let name = object["metadata"]["name"]
        .as_str()
        .expect("the object names itself")
        .to_string();
    let ns = object["metadata"]["namespace"].as_str().map(str::to_string);
    let gvk = kube::core::GroupVersionKind::try_from(&kube::core::TypeMeta {
        api_version: api_version.into(),
        kind: kind.into(),
    })
    .unwrap_or_else(|err| panic!("{api_version} {kind}: {err}"));
    let (resource, _) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|err| panic!("discovering {kind}: {err}"));
    let api: Api<kube::core::DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), &ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    api.patch(
        &name,
        &kube::api::PatchParams::apply(manager).force(),
        &kube::api::Patch::Apply(&object),
    )
    .await
    .unwrap_or_else(|err| panic!("applying {kind} {name}: {err}"));
}

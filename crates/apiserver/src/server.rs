//! Running the server: in-process for tests ([`LabApiServer::builder`]) and as `berth lab apiserver`
//! ([`run_apiserver`]).

use super::error::{ApiError, Error};
use super::faults::Faults;
use super::http::{router, App, RecordedRequest, RequestCounts};
use super::store::Store;
use super::write::{Door, Managed, WriteCtx};
use serde_json::Value;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// Where to listen. A pre-bound socket lets a caller bind inside another network namespace first.
#[derive(Debug)]
pub enum Listener {
    Addr(SocketAddr),
    Bound(std::net::TcpListener),
}

pub struct LabApiServer;

impl LabApiServer {
    pub fn builder() -> LabApiServerBuilder {
        LabApiServerBuilder::default()
    }
}

pub struct LabApiServerBuilder {
    listeners: Vec<Listener>,
    history_capacity: usize,
    faults: Faults,
    bookmark_interval: Duration,
    graceful_pod_deletion: bool,
    record_requests: bool,
    kubernetes_endpoint: Option<SocketAddr>,
    service_cidrs: Vec<String>,
}

impl Default for LabApiServerBuilder {
    fn default() -> Self {
        Self {
            listeners: Vec::new(),
            history_capacity: 100_000,
            faults: Faults::default(),
            bookmark_interval: Duration::from_secs(10),
            graceful_pod_deletion: false,
            record_requests: false,
            kubernetes_endpoint: None,
            service_cidrs: Vec::new(),
        }
    }
}

impl LabApiServerBuilder {
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listeners.push(Listener::Addr(addr));
        self
    }

    pub fn listener(mut self, listener: Listener) -> Self {
        self.listeners.push(listener);
        self
    }

    /// How many changes watches can resume from; older versions get 410 Gone.
    pub fn history_capacity(mut self, n: usize) -> Self {
        self.history_capacity = n;
        self
    }

    pub fn faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// How long a watch stays idle before it gets a BOOKMARK (when it asked for bookmarks).
    pub fn bookmark_interval(mut self, d: Duration) -> Self {
        self.bookmark_interval = d;
        self
    }

    /// Pods bound to a node stay, terminating, until deleted with grace period 0 (what a kubelet
    /// does); off by default, since the lab API server alone has no kubelet.
    pub fn graceful_pod_deletion(mut self, on: bool) -> Self {
        self.graceful_pod_deletion = on;
        self
    }

    /// Record what each client asks of the API (verb, group, resource, subresource), served at
    /// `/lab/requests` and by [`LabApiServerHandle::recorded_requests`].
    pub fn record_requests(mut self, on: bool) -> Self {
        self.record_requests = on;
        self
    }

    /// Start with `default/kubernetes` (Service, Endpoints, EndpointSlice) pointing at
    /// `endpoint`, the address in-cluster clients reach this server at, as a cluster has.
    pub fn kubernetes_endpoint(mut self, endpoint: SocketAddr) -> Self {
        self.kubernetes_endpoint = Some(endpoint);
        self
    }

    /// Start with the default ServiceCIDR `kubernetes` holding `cidrs` (one per family, primary
    /// first), as an API server keeps its `--service-cluster-ip-range`; none when empty.
    pub fn service_cidrs(mut self, cidrs: Vec<String>) -> Self {
        self.service_cidrs = cidrs;
        self
    }

    /// Bind (127.0.0.1 on a free port when no listener was given) and start serving.
    pub async fn start(self) -> Result<LabApiServerHandle, Error> {
        self.faults.validate().map_err(Error::Faults)?;
        let now = super::http::now();
        let mut store = Store::new(self.history_capacity, &now);
        store.set_graceful_pod_deletion(self.graceful_pod_deletion);
        if let Some(endpoint) = self.kubernetes_endpoint {
            super::kubernetes::seed_kubernetes_service(&mut store, endpoint, &now)
                .map_err(Error::Seed)?;
        }
        if !self.service_cidrs.is_empty() {
            super::kubernetes::seed_default_service_cidr(&mut store, &self.service_cidrs, &now)
                .map_err(Error::Seed)?;
        }
        let app = Arc::new(App::new(store, self.faults, self.bookmark_interval));
        app.requests.set_enabled(self.record_requests);
        let mut listeners = self.listeners;
        if listeners.is_empty() {
            listeners.push(Listener::Addr(SocketAddr::from(([127, 0, 0, 1], 0))));
        }
        let mut bound = Vec::new();
        for l in listeners {
            let listener = match l {
                Listener::Addr(addr) => {
                    tokio::net::TcpListener::bind(addr)
                        .await
                        .map_err(|source| Error::Bind {
                            addr: addr.to_string(),
                            source,
                        })?
                }
                Listener::Bound(std) => {
                    std.set_nonblocking(true).map_err(Error::Listener)?;
                    tokio::net::TcpListener::from_std(std).map_err(Error::Listener)?
                }
            };
            bound.push(listener);
        }
        let mut addrs = Vec::new();
        for l in &bound {
            addrs.push(l.local_addr().map_err(Error::Listener)?);
        }
        let first = *addrs.first().ok_or(Error::NoListener)?;
        if let Ok(mut a) = app.server_address.lock() {
            *a = first.to_string();
        }
        let mut tasks = Vec::new();
        for listener in bound {
            let token = app.shutdown.clone();
            let svc = router(app.clone());
            tasks.push(tokio::spawn(async move {
                axum::serve(listener, svc)
                    .with_graceful_shutdown(token.cancelled_owned())
                    .await
                    .map_err(Error::Serve)
            }));
        }
        Ok(LabApiServerHandle { app, addrs, tasks })
    }
}

/// A running server. Dropping it does not stop it; call [`LabApiServerHandle::shutdown`].
pub struct LabApiServerHandle {
    app: Arc<App>,
    addrs: Vec<SocketAddr>,
    tasks: Vec<JoinHandle<Result<(), Error>>>,
}

impl LabApiServerHandle {
    /// The first listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addrs[0]
    }

    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// A real kube client that talks HTTP to this server.
    pub fn client(&self) -> Result<kube::Client, Error> {
        let url = self.url();
        let uri: http::Uri = url.parse().map_err(|_| Error::NoListener)?;
        let mut config = kube::Config::new(uri);
        config.default_namespace = "default".to_owned();
        kube::Client::try_from(config).map_err(|source| Error::Client { url, source })
    }

    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), Error> {
        write_kubeconfig(path, &self.url())
    }

    pub fn faults(&self) -> Faults {
        self.app.fault_state().faults().clone()
    }

    pub fn set_faults(&self, faults: Faults) -> Result<(), Error> {
        self.app.set_faults(faults).map_err(Error::Faults)
    }

    /// Forget the watch history: every watch resumed from an earlier version gets 410 Gone.
    pub fn compact(&self) {
        self.app.write(Store::compact);
    }

    /// Create objects directly, bypassing HTTP (for loading large fixtures quickly). Each object names
    /// its resource through `apiVersion` and `kind`; namespaces come from `metadata.namespace`.
    pub fn seed(&self, objects: impl IntoIterator<Item = Value>) -> Result<usize, ApiError> {
        let now = super::http::now();
        let ctx = WriteCtx {
            now: &now,
            door: Door::Main,
            managed: Managed::Track("berth-lab-seed"),
        };
        self.app.write(|s| {
            let mut n = 0;
            for obj in objects {
                let (api_version, kind) = (
                    obj["apiVersion"].as_str().unwrap_or_default(),
                    obj["kind"].as_str().unwrap_or_default(),
                );
                let info = s
                    .catalogue()
                    .all()
                    .iter()
                    .find(|r| r.api_version() == api_version && r.kind == kind)
                    .cloned()
                    .ok_or_else(|| {
                        ApiError::bad_request(format!("no resource for {api_version} {kind}"))
                    })?;
                let ns = obj["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                s.create(&info, &ns, obj, &ctx)?;
                n += 1;
            }
            Ok(n)
        })
    }

    /// Kubernetes API requests served so far.
    pub fn request_counts(&self) -> RequestCounts {
        self.app.request_counts()
    }

    /// The request log (empty unless the server records requests), sorted.
    pub fn recorded_requests(&self) -> Vec<RecordedRequest> {
        self.app.requests.snapshot()
    }

    pub fn resource_version(&self) -> u64 {
        self.app.store().resource_version()
    }

    /// Stop serving: open watches end, listeners close.
    pub async fn shutdown(self) -> Result<(), Error> {
        self.app.shutdown.cancel();
        for t in self.tasks {
            if let Ok(r) = t.await {
                r?;
            }
        }
        Ok(())
    }
}

/// A kubeconfig for a plain-HTTP server without authentication.
pub fn kubeconfig_yaml(server: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: berth-lab\n  cluster:\n    server: {server}\ncontexts:\n- name: berth-lab\n  context:\n    cluster: berth-lab\n    user: berth-lab\n    namespace: default\ncurrent-context: berth-lab\nusers:\n- name: berth-lab\n  user: {{}}\npreferences: {{}}\n"
    )
}

pub fn write_kubeconfig(path: &Path, server: &str) -> Result<(), Error> {
    std::fs::write(path, kubeconfig_yaml(server)).map_err(|source| Error::WriteKubeconfig {
        path: path.display().to_string(),
        source,
    })
}

/// Options of `berth lab apiserver`.
#[derive(Debug, Default)]
pub struct ApiServerOptions {
    pub listeners: Vec<Listener>,
    pub kubeconfig: Option<PathBuf>,
    pub faults: Faults,
    pub history_capacity: Option<usize>,
    pub graceful_pod_deletion: bool,
    pub record_requests: bool,
    /// Where in-cluster clients reach the server: `default/kubernetes` points there.
    pub kubernetes_endpoint: Option<SocketAddr>,
    /// The cluster's Service CIDRs: the default ServiceCIDR `kubernetes` holds them.
    pub service_cidrs: Vec<String>,
}

/// Serve until `shutdown` resolves. Prints each address, and writes the kubeconfig for the first.
pub async fn run_apiserver(
    opts: ApiServerOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let mut builder = LabApiServer::builder()
        .faults(opts.faults)
        .graceful_pod_deletion(opts.graceful_pod_deletion)
        .record_requests(opts.record_requests)
        .service_cidrs(opts.service_cidrs);
    if let Some(n) = opts.history_capacity {
        builder = builder.history_capacity(n);
    }
    if let Some(endpoint) = opts.kubernetes_endpoint {
        builder = builder.kubernetes_endpoint(endpoint);
    }
    for l in opts.listeners {
        builder = builder.listener(l);
    }
    let handle = builder.start().await?;
    for addr in handle.addrs() {
        println!("lab apiserver listening on http://{addr}");
    }
    if let Some(path) = &opts.kubeconfig {
        handle.write_kubeconfig(path)?;
        println!("kubeconfig written to {}", path.display());
    }
    shutdown.await;
    handle.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_is_valid_yaml() {
        let v: serde_yaml::Value =
            serde_yaml::from_str(&kubeconfig_yaml("http://127.0.0.1:1234")).unwrap();
        assert_eq!(
            v["clusters"][0]["cluster"]["server"].as_str(),
            Some("http://127.0.0.1:1234")
        );
        assert_eq!(v["current-context"].as_str(), Some("berth-lab"));
    }
}

//! `healthCheckNodePort` servers: for each LoadBalancer Service with `externalTrafficPolicy:
//! Local`, an HTTP listener on its health-check port that tells the load balancer whether this
//! node has a Ready endpoint (200) or not (503), as kube-proxy's do.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use berth_datapath::NodeView;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::schedule::AgentHealth;
use crate::Error;

/// What one health-check port reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthTarget {
    pub namespace: String,
    pub name: String,
    /// Distinct Ready endpoint addresses on this node.
    pub local_endpoints: usize,
}

/// The health-check ports the view asks for, with their local Ready endpoint counts.
pub fn build_health_targets(view: &NodeView) -> BTreeMap<u16, HealthTarget> {
    let mut local: BTreeMap<u16, (HealthTarget, BTreeSet<IpAddr>)> = BTreeMap::new();
    for port in &view.services {
        let Some(hc_port) = port.health_check_node_port else {
            continue;
        };
        let entry = local.entry(hc_port).or_insert_with(|| {
            (
                HealthTarget {
                    namespace: port.name.namespace.clone(),
                    name: port.name.name.clone(),
                    local_endpoints: 0,
                },
                BTreeSet::new(),
            )
        });
        if entry.0.namespace != port.name.namespace || entry.0.name != port.name.name {
            // The apiserver gives each Service its own port; a clash keeps the first owner.
            continue;
        }
        entry.1.extend(
            port.endpoints
                .iter()
                .filter(|ep| ep.ready && ep.is_local(&view.node))
                .map(|ep| ep.ip),
        );
    }
    local
        .into_iter()
        .map(|(port, (mut target, ips))| {
            target.local_endpoints = ips.len();
            (port, target)
        })
        .collect()
}

/// The status and JSON body one health-check request gets.
pub fn health_response(target: &HealthTarget, agent_healthy: bool) -> (StatusCode, String) {
    let body = serde_json::json!({
        "service": {"namespace": target.namespace, "name": target.name},
        "localEndpoints": target.local_endpoints,
    });
    let status = if agent_healthy && target.local_endpoints > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body.to_string())
}

struct Running {
    target: watch::Sender<HealthTarget>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// The running health-check servers, one per port.
pub struct HealthCheckServers {
    bind: IpAddr,
    health: AgentHealth,
    servers: BTreeMap<u16, Running>,
}

fn bind(addr: SocketAddr) -> Result<TcpListener, Error> {
    let err = |source| Error::Bind {
        what: "a health-check node port",
        addr,
        source,
    };
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4(),
        SocketAddr::V6(_) => TcpSocket::new_v6(),
    }
    .map_err(err)?;
    // A restarted agent must get its ports back while old connections linger in TIME_WAIT.
    socket.set_reuseaddr(true).map_err(err)?;
    socket.bind(addr).map_err(err)?;
    socket.listen(128).map_err(err)
}

async fn answer(target: watch::Receiver<HealthTarget>, health: AgentHealth) -> Response {
    let (status, body) = health_response(&target.borrow(), health.is_healthy());
    (status, [(CONTENT_TYPE, "application/json")], body).into_response()
}

impl HealthCheckServers {
    pub fn new(bind: IpAddr, health: AgentHealth) -> Self {
        HealthCheckServers {
            bind,
            health,
            servers: BTreeMap::new(),
        }
    }

    pub fn ports(&self) -> Vec<u16> {
        self.servers.keys().copied().collect()
    }

    /// Serves exactly `targets`: new ports start, gone ones stop, the rest answer with the new
    /// counts. A port that cannot be bound is logged and tried again on the next update.
    pub async fn update(&mut self, targets: &BTreeMap<u16, HealthTarget>) {
        let gone: Vec<u16> = self
            .servers
            .keys()
            .filter(|port| !targets.contains_key(port))
            .copied()
            .collect();
        for port in gone {
            if let Some(running) = self.servers.remove(&port) {
                tracing::info!(port, "stopping health-check server");
                running.stop.cancel();
                let _ = running.task.await;
            }
        }
        for (port, target) in targets {
            if let Some(running) = self.servers.get(port) {
                running.target.send_if_modified(|current| {
                    let changed = current != target;
                    if changed {
                        *current = target.clone();
                    }
                    changed
                });
                continue;
            }
            let addr = SocketAddr::new(self.bind, *port);
            let listener = match bind(addr) {
                Ok(listener) => listener,
                Err(err) => {
                    tracing::warn!(error = %err, service = %format!("{}/{}", target.namespace, target.name), "health-check server not started");
                    continue;
                }
            };
            tracing::info!(%addr, namespace = %target.namespace, name = %target.name, "health-check server listening");
            let (sender, receiver) = watch::channel(target.clone());
            let health = self.health.clone();
            let router = Router::new().fallback(move || answer(receiver.clone(), health.clone()));
            let stop = CancellationToken::new();
            let shutdown = stop.clone().cancelled_owned();
            let task = tokio::spawn(async move {
                if let Err(err) = axum::serve(listener, router)
                    .with_graceful_shutdown(shutdown)
                    .await
                {
                    tracing::warn!(%addr, error = %err, "health-check server failed");
                }
            });
            self.servers.insert(
                *port,
                Running {
                    target: sender,
                    stop,
                    task,
                },
            );
        }
    }

    pub async fn stop_all(&mut self) {
        self.update(&BTreeMap::new()).await;
    }
}

//! `healthCheckNodePort` servers: for each LoadBalancer Service with `externalTrafficPolicy:
//! Local`, an HTTP listener on its health-check port that tells the load balancer whether this
//! node has a Ready endpoint (200) or not (503), as kube-proxy's do. They listen where node ports
//! answer: on the addresses `--nodeport-addresses` selects ([`build_health_check_addresses`]), or
//! on `--healthz-bind-address` (every address, by default) when it is unset, as kube-proxy
//! serves them on its node-port addresses.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use berth_core::IpFamily;
use berth_datapath::{NodeInfo, NodePortAddresses, NodeView};
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

/// The addresses health-check node ports listen on. `--nodeport-addresses` unset, or naming a
/// CIDR of all addresses: `all` alone (`--healthz-bind-address`). Otherwise the node's `local`
/// addresses inside its CIDRs and, with `primary`, the Node's primary address of each of the
/// agent's `families`, sorted; none when nothing matches (then no health-check port answers,
/// as no node port does).
pub fn build_health_check_addresses(
    wanted: &NodePortAddresses,
    all: IpAddr,
    local: &[IpAddr],
    node: &NodeInfo,
    families: &[IpFamily],
) -> Vec<IpAddr> {
    if !wanted.is_set() || wanted.cidrs.iter().any(|cidr| cidr.prefix_len() == 0) {
        return vec![all];
    }
    let mut out: BTreeSet<IpAddr> = local
        .iter()
        .copied()
        .filter(|ip| wanted.cidrs.iter().any(|cidr| cidr.contains(ip)))
        .collect();
    if wanted.primary {
        out.extend(
            families
                .iter()
                .filter_map(|family| node.primary_address(*family)),
        );
    }
    out.into_iter().collect()
}

/// The node's own addresses, from its interfaces (what `--nodeport-addresses` CIDRs select).
pub fn fetch_local_addresses() -> Result<Vec<IpAddr>, Error> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(Error::LocalAddresses)?;
    let mut out: Vec<IpAddr> = addrs
        .filter_map(|ifaddr| ifaddr.address)
        .filter_map(|storage| {
            if let Some(v4) = storage.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                storage.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
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
    /// One per address listened on.
    tasks: Vec<JoinHandle<()>>,
}

/// The running health-check servers, one per port, each listening on every address of
/// [`HealthCheckServers::set_addresses`].
pub struct HealthCheckServers {
    addresses: Vec<IpAddr>,
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
    /// Servers that listen on `bind` until [`HealthCheckServers::set_addresses`] says otherwise.
    pub fn new(bind: IpAddr, health: AgentHealth) -> Self {
        HealthCheckServers {
            addresses: vec![bind],
            health,
            servers: BTreeMap::new(),
        }
    }

    /// Listens on `addresses` from now on: when they differ, every server stops, and the next
    /// [`HealthCheckServers::update`] starts them again there.
    pub async fn set_addresses(&mut self, addresses: Vec<IpAddr>) {
        if addresses == self.addresses {
            return;
        }
        tracing::info!(?addresses, "health-check node ports move");
        let servers = std::mem::take(&mut self.servers);
        for (_, running) in servers {
            running.stop.cancel();
            for task in running.tasks {
                let _ = task.await;
            }
        }
        self.addresses = addresses;
    }

    pub fn addresses(&self) -> &[IpAddr] {
        &self.addresses
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
                for task in running.tasks {
                    let _ = task.await;
                }
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
            let service = format!("{}/{}", target.namespace, target.name);
            let mut listeners = Vec::new();
            for ip in &self.addresses {
                let addr = SocketAddr::new(*ip, *port);
                match bind(addr) {
                    Ok(listener) => listeners.push((addr, listener)),
                    Err(err) => {
                        tracing::warn!(error = %err, %service, "health-check server not listening there");
                    }
                }
            }
            if listeners.is_empty() {
                // Tried again on the next update.
                continue;
            }
            let (sender, receiver) = watch::channel(target.clone());
            let stop = CancellationToken::new();
            let mut tasks = Vec::new();
            for (addr, listener) in listeners {
                tracing::info!(%addr, %service, "health-check server listening");
                let (receiver, health) = (receiver.clone(), self.health.clone());
                let router =
                    Router::new().fallback(move || answer(receiver.clone(), health.clone()));
                let shutdown = stop.clone().cancelled_owned();
                tasks.push(tokio::spawn(async move {
                    if let Err(err) = axum::serve(listener, router)
                        .with_graceful_shutdown(shutdown)
                        .await
                    {
                        tracing::warn!(%addr, error = %err, "health-check server failed");
                    }
                }));
            }
            self.servers.insert(
                *port,
                Running {
                    target: sender,
                    stop,
                    tasks,
                },
            );
        }
    }

    pub async fn stop_all(&mut self) {
        self.update(&BTreeMap::new()).await;
    }
}

//! The HTTP echo server a lab pod runs (the readiness probe against it is
//! [`crate::netns::http_get`]).
//!
//! `GET /healthz` answers 200 while the pod's readiness gate is open and 503 once it is closed
//! (the `lab.berth.dev/ready: "false"` annotation); every other path answers 200 with
//! `{"pod":"<name>","client":"<addr:port>"}`, the same line [`crate::echo`] speaks, so the
//! client's proof names the pod that answered and the source address it saw.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use crate::echo::EchoReply;
use crate::netns::bind_tcp_family_in_netns;

use super::KubeletError;

#[derive(Clone)]
struct PodState {
    pod: Arc<str>,
    gate: Arc<AtomicBool>,
}

async fn healthz(State(state): State<PodState>) -> (StatusCode, &'static str) {
    if state.gate.load(Ordering::SeqCst) {
        (StatusCode::OK, "ok\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready (lab.berth.dev/ready=false)\n",
        )
    }
}

async fn echo(
    State(state): State<PodState>,
    ConnectInfo(client): ConnectInfo<SocketAddr>,
) -> ([(&'static str, &'static str); 1], String) {
    let reply = EchoReply {
        pod: state.pod.to_string(),
        client,
    };
    ([("content-type", "application/json")], reply.to_line())
}

/// A pod's servers; dropping it stops them.
pub struct PodServer {
    gate: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl PodServer {
    /// Binds `0.0.0.0:<port>` for each port inside `netns`, and `[::]:<port>` (IPv6 only, so
    /// each client is seen in its own family) with `ipv6`, and serves on the current runtime.
    pub fn start(
        netns: &str,
        pod: &str,
        ports: &[u16],
        ipv6: bool,
        ready: bool,
    ) -> Result<Self, KubeletError> {
        let gate = Arc::new(AtomicBool::new(ready));
        let state = PodState {
            pod: Arc::from(pod),
            gate: gate.clone(),
        };
        let app = Router::new()
            .route("/healthz", get(healthz))
            .fallback(get(echo))
            .with_state(state);
        let mut tasks = Vec::new();
        let mut addrs: Vec<SocketAddr> = ports
            .iter()
            .map(|port| SocketAddr::from(([0, 0, 0, 0], *port)))
            .collect();
        if ipv6 {
            addrs.extend(
                ports
                    .iter()
                    .map(|port| SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, *port))),
            );
        }
        for addr in addrs {
            let listener = bind_tcp_family_in_netns(netns, addr)?;
            listener
                .set_nonblocking(true)
                .map_err(|source| KubeletError::Io {
                    what: format!("serving {addr} in {netns}"),
                    source,
                })?;
            let listener =
                tokio::net::TcpListener::from_std(listener).map_err(|source| KubeletError::Io {
                    what: format!("serving {addr} in {netns}"),
                    source,
                })?;
            let service = app
                .clone()
                .into_make_service_with_connect_info::<SocketAddr>();
            tasks.push(tokio::spawn(async move {
                let _ = axum::serve(listener, service).await;
            }));
        }
        Ok(PodServer { gate, tasks })
    }

    pub fn set_ready(&self, ready: bool) {
        self.gate.store(ready, Ordering::SeqCst);
    }
}

impl Drop for PodServer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

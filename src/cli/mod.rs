//! The subcommands. Each follows one pattern: clap options (every flag also a `BERTH_*`
//! variable) -> the crate's `validate()` -> a typed config, parsed once; then [`run`] with the
//! shared client builder and admin endpoint.

pub mod agent;
pub mod controller;
pub mod explain;
#[cfg(feature = "lab")]
pub mod lab;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use berth_controller::CancellationToken;
use tokio::net::TcpListener;

/// One duration syntax for every flag: `500ms`, `2s`, `1m`, `1h`; a bare number is seconds.
pub(crate) fn parse_duration(value: &str) -> Result<Duration, String> {
    berth_agent::parse_duration(value).map_err(|e| e.to_string())
}

/// Runs one long-running component on a fresh runtime until it ends. SIGTERM and SIGINT
/// cancel the token it is given, the same way for every component, so Ctrl-C and `kill` both
/// stop it cleanly.
pub(crate) fn run<F, Fut>(component: F) -> anyhow::Result<()>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        let shutdown = CancellationToken::new();
        let on_signal = shutdown.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            on_signal.cancel();
        });
        component(shutdown).await
    })
}

/// Binds the admin endpoint (`/healthz`, `/readyz`, `/metrics`) for a component to serve.
pub(crate) async fn bind_admin(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the admin endpoint on {addr}"))
}

/// The client for `--kubeconfig`; without one, the usual lookup (`KUBECONFIG`,
/// `~/.kube/config`), then the in-cluster service account. One function for every command
/// that talks to a cluster.
pub(crate) async fn build_client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading the kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no Kubernetes client configuration found (in-cluster or kubeconfig)")?,
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

//! `berth controller` end to end: metrics, readiness, the admin endpoint and the controller,
//! stopped together by one token. The binary builds the client.

use std::net::SocketAddr;

use berth_telemetry::{admin_router, serve_admin, MetricsRegistry, Readiness};
use kube::Client;
use tokio_util::sync::CancellationToken;

use crate::{AllocationController, ControllerConfig, Error};

/// Everything `berth controller` needs, parsed by the binary.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub config: ControllerConfig,
    pub admin_listen: SocketAddr,
    /// Reported as `berth_build_info`.
    pub version: String,
}

/// Runs until `shutdown` is cancelled (or the controller fails).
pub async fn run_controller(
    client: Client,
    opts: RunOptions,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let mut registry = MetricsRegistry::new();
    registry.register_build_info(&opts.version);
    let readiness = Readiness::new();
    let check = readiness.register("controller")?;
    let controller =
        AllocationController::new(client, opts.config, registry.sub_registry("controller"))
            .with_readiness(check);
    let router = admin_router(registry.into_shared(), readiness);
    let listener = tokio::net::TcpListener::bind(opts.admin_listen)
        .await
        .map_err(|source| Error::Bind {
            addr: opts.admin_listen.to_string(),
            source,
        })?;
    let admin = tokio::spawn(serve_admin(
        listener,
        router,
        shutdown.clone().cancelled_owned(),
    ));
    let result = controller.run(shutdown.clone()).await;
    shutdown.cancel();
    match admin.await {
        Ok(r) => r?,
        Err(e) => tracing::warn!(error = %e, "admin endpoint task ended abnormally"),
    }
    result
}

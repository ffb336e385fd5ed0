//! `berth agent` end to end: metrics, readiness, the admin endpoint and the agent with the real
//! iptables and conntrack commands, stopped together by one token. The binary builds the client
//! and binds the admin endpoint, as it does for the controller.

use berth_datapath::exec::CommandIptables;
use berth_datapath::nft_exec::CommandNft;
use berth_telemetry::{MetricsRegistry, Readiness};
use kube::Client;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::conntrack::CommandConntrack;
use crate::datapath::BoxedNft;
use crate::{Agent, AgentConfig, Error};

/// Everything `berth agent` needs, parsed by the binary.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub config: AgentConfig,
    /// Reported as `berth_build_info`.
    pub version: String,
}

/// Runs until `shutdown` is cancelled (or the agent fails), serving the admin endpoint on
/// `admin`. Stopping leaves the programmed rules in place.
pub async fn run_agent(
    client: Client,
    admin: TcpListener,
    opts: RunOptions,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let mut registry = MetricsRegistry::new();
    registry.register_build_info(&opts.version);
    let readiness = Readiness::new();
    // `auto` probes the kernel once (`nft --check`, which changes nothing); the backend not
    // chosen has berth's rules removed before the first sync.
    let backend = opts.config.backend().resolve(|| CommandNft::new().usable());
    tracing::info!(backend = backend.as_str(), "datapath backend");
    let agent = Agent::with_nft(
        opts.config.with_backend(backend),
        client,
        CommandIptables::new,
        |_| -> BoxedNft { Box::new(CommandNft::new()) },
        CommandConntrack::new(),
        &mut registry,
        &readiness,
    )?;
    agent
        .run(admin, registry.into_shared(), shutdown.cancelled_owned())
        .await
}

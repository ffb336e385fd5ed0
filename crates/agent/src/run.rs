//! `berth agent` end to end: metrics, readiness, the admin endpoint and the agent with the real
//! iptables and conntrack commands, stopped together by one token. The binary builds the client
//! and binds the admin endpoint, as it does for the controller.

use berth_datapath::iptables::CommandIptables;
use berth_datapath::nft::NftWriter;
use berth_membership::{AnswerUntil, LiveNodes, Membership, MembershipConfig};
use berth_telemetry::{DroppedLines, MetricsRegistry, Readiness};
use kube::Client;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::conntrack::CommandConntrack;
use crate::datapath::BoxedNft;
use crate::{Agent, AgentConfig, Error, NodeFacts};

/// Everything `berth agent` needs, parsed by the binary.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub config: AgentConfig,
    /// Reported as `berth_build_info`.
    pub version: String,
    /// Agent liveness (this agent's Lease, SWIM between agents) for the L2 announcer; `None`
    /// runs none.
    pub membership: Option<MembershipConfig>,
    /// Counts the log lines the process dropped, for `berth_log_lines_dropped_total`.
    pub log_drops: Option<DroppedLines>,
    /// How the nftables backend writes the kernel.
    pub nft_writer: NftWriter,
}

/// Starts agent liveness: its metrics go into `registry` as `berth_membership_*`, and the
/// returned receivers hold the live nodes and until when this node may answer, for the
/// announcer, which says through `ready` whether it is ready to answer. It runs on a thread of
/// its own, so the agent's busy moments cannot make it miss heartbeats. Stops with
/// `shutdown`, withdrawing this node and deleting its Lease first.
pub fn start_membership(
    config: MembershipConfig,
    client: Client,
    registry: &mut MetricsRegistry,
    ready: Option<watch::Receiver<bool>>,
    shutdown: CancellationToken,
) -> (
    JoinHandle<Result<(), berth_membership::Error>>,
    watch::Receiver<LiveNodes>,
    watch::Receiver<AnswerUntil>,
) {
    let (membership, live) = Membership::new(config, client);
    let membership = match ready {
        Some(ready) => membership.with_ready(ready),
        None => membership,
    };
    let until = membership.answer_until();
    membership.register_metrics(registry.sub_registry("membership"));
    (membership.spawn_dedicated(shutdown), live, until)
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
    if let Some(dropped) = opts.log_drops.clone() {
        registry.register_log_drops(dropped);
    }
    let readiness = Readiness::new();
    // The announcer tells liveness when it is ready to answer; dropped unused, it counts as
    // ready.
    let (ready_tx, ready_rx) = watch::channel(false);
    let (membership, live) = match opts.membership {
        Some(config) => {
            let (task, live, until) = start_membership(
                config,
                client.clone(),
                &mut registry,
                Some(ready_rx),
                shutdown.child_token(),
            );
            let stop = shutdown.clone();
            let task = tokio::spawn(async move {
                let result = task.await;
                // Liveness ending on its own stops the agent: without it nothing is announced.
                stop.cancel();
                result
            });
            (Some(task), Some((live, until)))
        }
        None => (None, None),
    };
    // `auto` looks once (the nftables writer's probe on a scratch table and `iptables-save -t
    // filter`, which leave nothing behind); the backend not chosen has berth's rules removed
    // before the first sync.
    let families = opts.config.families().to_vec();
    let backend = opts.config.backend().resolve(|| {
        let facts = NodeFacts {
            nft_usable: opts.nft_writer.usable(),
            iptables_forward_drops: families
                .iter()
                .any(|family| CommandIptables::new(*family).forward_drops()),
        };
        tracing::info!(
            nft_usable = facts.nft_usable,
            iptables_forward_drops = facts.iptables_forward_drops,
            "backend auto"
        );
        facts
    });
    tracing::info!(
        backend = backend.as_str(),
        nft_writer = opts.nft_writer.as_str(),
        "datapath backend"
    );
    let mut agent = Agent::with_nft(
        opts.config.with_backend(backend),
        client,
        CommandIptables::new,
        |_| -> BoxedNft { opts.nft_writer.writer() },
        CommandConntrack::new(),
        &mut registry,
        &readiness,
    )?;
    if let Some((live, until)) = live {
        agent.set_live_nodes(live);
        agent.set_answer_gate(until, ready_tx);
    }
    let ran = agent
        .run(
            admin,
            registry.into_shared(),
            shutdown.clone().cancelled_owned(),
        )
        .await;
    // Liveness stops with the agent, whichever way the agent stopped.
    shutdown.cancel();
    let lived = match membership {
        Some(task) => match task.await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(err))) => Err(Error::Task(format!("agent liveness: {err}"))),
            Ok(Err(err)) | Err(err) => Err(Error::Task(format!("agent liveness: {err}"))),
        },
        None => Ok(()),
    };
    ran.and(lived)
}

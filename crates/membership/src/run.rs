//! The I/O shell: the UDP socket, the Lease and Node watches, the renewing task and the clock
//! around the pure parts. One task owns all the state, so nothing is locked; a second one only
//! receives, behind the [`crate::gate`], and hands what it admits over a bounded queue.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_api::names::{field_manager, lease as lease_names};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use prometheus_client::registry::Registry;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::MembershipConfig;
use crate::frame::{Key, Refusal, MAX_DATAGRAM};
use crate::gate::{Gate, Sources};
use crate::identity::Peer;
use crate::lease::{build_lease, LeaseView};
use crate::live::{
    cluster_peers, compute_live, live_set, next_change, LeaseState, Mode, PeerFacts, SelfHold,
    SwimState,
};
use crate::metrics::MembershipMetrics;
use crate::swim::{Heard, Outgoing, Swim, SwimEvent};
use crate::Error;

/// The set of nodes whose agents are live now, this node included when it counts itself.
pub type LiveNodes = Arc<BTreeSet<String>>;

/// Until when this node may answer for its addresses: `None` without limit, `Some(t)` only
/// before `t` (a past instant: not at all). Responders check it on every request, so a
/// node that stops hearing its peers, or was stopped, falls silent on time whatever its
/// tasks are doing.
pub type AnswerUntil = Option<Instant>;

/// How often peers with a fresh Lease that SWIM does not count alive are asked to let this
/// node join.
const REJOIN_PERIOD: Duration = Duration::from_secs(1);

/// Datagrams admitted by the gate and waiting for the membership task; beyond it they are
/// dropped (`backlog`), never queued without bound.
const RECEIVE_QUEUE: usize = 256;

/// How often the key files are read again (a rotated Secret reaches the files within about a
/// minute through the kubelet).
const KEY_POLL: Duration = Duration::from_secs(10);

/// How long a stopping agent waits for the API server to delete its Lease.
const DELETE_TIMEOUT: Duration = Duration::from_secs(2);
/// A peer's clock further than this from this node's is reported (a log line); the metric
/// always shows the largest offset.
const SKEW_REPORTED: Duration = Duration::from_secs(1);

/// Agent liveness: this agent's Lease, the others' Leases, and SWIM between the agents.
pub struct Membership {
    config: MembershipConfig,
    client: Client,
    live: watch::Sender<LiveNodes>,
    until: watch::Sender<AnswerUntil>,
    ready: Option<watch::Receiver<bool>>,
    metrics: MembershipMetrics,
    socket: Option<std::net::UdpSocket>,
}

impl Membership {
    /// Builds it; nothing runs until [`Membership::run`]. The receiver holds an empty set until
    /// the Leases have been listed.
    pub fn new(
        config: MembershipConfig,
        client: Client,
    ) -> (Membership, watch::Receiver<LiveNodes>) {
        let (live, receiver) = watch::channel(LiveNodes::default());
        // Nothing is answered before the first verdict.
        let (until, _) = watch::channel(Some(Instant::now()));
        let membership = Membership {
            config,
            client,
            live,
            until,
            ready: None,
            metrics: MembershipMetrics::default(),
            socket: None,
        };
        (membership, receiver)
    }

    /// Uses `socket` (bound by the caller, e.g. inside another network namespace) instead of
    /// binding the configured address. Its address is advertised unless one is configured.
    pub fn with_socket(mut self, socket: std::net::UdpSocket) -> Self {
        self.socket = Some(socket);
        self
    }

    /// Until when this node may answer (see [`AnswerUntil`]).
    pub fn answer_until(&self) -> watch::Receiver<AnswerUntil> {
        self.until.subscribe()
    }

    /// This node counts itself live (and says so to its peers) only while `ready` holds
    /// true: the announcer says whether it is ready to answer. A dropped sender counts as
    /// ready. Without this, the node is always ready.
    pub fn with_ready(mut self, ready: watch::Receiver<bool>) -> Self {
        self.ready = Some(ready);
        self
    }

    /// The metrics, shared with the run loop.
    pub fn metrics(&self) -> &MembershipMetrics {
        &self.metrics
    }

    /// Registers the metrics into `registry`, which the caller prefixes (`berth_membership_`).
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.metrics.register(registry);
    }

    /// Runs [`Membership::run`] on an OS thread of its own, with a current-thread runtime of
    /// its own, so no task of the caller's runtime (watches, indexes, an election over every
    /// Service) can delay a heartbeat, a receive or a timer: a busy agent must not look dead
    /// to its peers, nor take its peers for dead. The Lease requests still go through
    /// `client`'s connections on the runtime that built it; Leases are judged in seconds, not
    /// in heartbeats. Call it inside a tokio runtime; the handle is that runtime's.
    /// The thread is named `berth-membership`, so it can be told apart in `top -H` or `perf`,
    /// and asks for real-time priority ([`berth_realtime::priority`]): other processes of a loaded node
    /// must not delay it either.
    pub fn spawn_dedicated(self, shutdown: CancellationToken) -> JoinHandle<Result<(), Error>> {
        let thread = berth_realtime::spawn_dedicated("berth-membership", "agent liveness", || {
            self.run(shutdown)
        });
        tokio::spawn(async move {
            thread.join().await.map_err(|err| match err {
                berth_realtime::Error::Spawn { source, .. }
                | berth_realtime::Error::Runtime { source, .. } => Error::Runtime { source },
                berth_realtime::Error::Ended(_) => Error::ThreadEnded,
            })?
        })
    }

    /// Runs until `shutdown`. A graceful stop withdraws this node from the published set,
    /// deletes its Lease (so peers take over at once), then tells SWIM peers it leaves.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let Membership {
            config,
            client,
            live,
            until,
            mut ready,
            metrics,
            socket,
        } = self;
        let node = config.node_name().to_string();
        let leases: Api<Lease> = Api::namespaced(client.clone(), config.lease_namespace());

        let (socket, mut swim) = match config.key() {
            Some(key) if config.enabled() => {
                let (socket, swim) = open_swim(&config, key, &client, socket).await?;
                (Some(socket), Some(swim))
            }
            _ => (None, None),
        };
        let socket = socket.map(Arc::new);
        let endpoint = swim.as_ref().map(|s| s.identity().addr);
        // Receiving runs in a task of its own behind the gate, so a flood costs that task a
        // receive and a few comparisons per datagram and cannot delay SWIM's timers here.
        let (sources_tx, sources_rx) = watch::channel(Sources::default());
        let (datagram_tx, mut datagrams) = mpsc::channel(RECEIVE_QUEUE);
        let receiver_stop = CancellationToken::new();
        let _receiver = socket.clone().map(|socket| {
            AbortOnDrop(tokio::spawn(receive_gated(
                socket,
                sources_rx,
                datagram_tx,
                metrics.clone(),
                receiver_stop.clone(),
            )))
        });
        tracing::info!(node = %node, membership = config.enabled(), endpoint = ?endpoint, "agent liveness starting");

        let renewer_stop = CancellationToken::new();
        // Aborted if this future is dropped: a Lease must not outlive its agent's liveness.
        let mut renewer = AbortOnDrop(tokio::spawn(renew_lease(
            leases.clone(),
            node.clone(),
            config.clone(),
            endpoint,
            renewer_stop.clone(),
        )));

        let mut state = LoopState {
            node: node.clone(),
            mode: if swim.is_some() {
                Mode::Membership(config.timing())
            } else {
                Mode::LeaseOnly
            },
            ready: ready.as_ref().is_none_or(|r| *r.borrow()),
            ..LoopState::new(&node, &config, &metrics, live, until)
        };
        let mut stream = watcher(leases.clone(), watcher::Config::default())
            .default_backoff()
            .boxed();
        // The cluster's Nodes: only they take part in the majority and the live set.
        let mut node_stream = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .boxed();
        // The key files are read by a task of their own through the blocking pool: this
        // thread never waits on a file.
        let (mut keys, _key_reader) = match (swim.is_some(), config.key_files()) {
            (true, Some((key, previous))) => {
                let (tx, rx) = watch::channel(None);
                let reader = tokio::spawn(poll_key_files(
                    key.to_path_buf(),
                    previous.map(std::path::Path::to_path_buf),
                    tx,
                ));
                (Some(rx), Some(AbortOnDrop(reader)))
            }
            _ => (None, None),
        };
        let mut keys_applied: Option<KeyBytes> = None;
        let mut rejoin = tokio::time::interval(REJOIN_PERIOD);
        rejoin.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let result = loop {
            let now = Instant::now();
            let wake = state.next_wake(swim.as_ref(), now);
            // Biased: timers before anything that arrives, whatever arrives.
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break Ok(()),
                () = tokio::time::sleep_until(wake.into()) => {
                    on_wake(wake, &state, swim.as_mut(), &mut datagrams, &metrics).await;
                }
                changed = async {
                    match ready.as_mut() {
                        Some(rx) => rx.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                } => {
                    state.ready = match ready.as_ref() {
                        Some(rx) if changed => *rx.borrow(),
                        _ => true,
                    };
                    if !changed {
                        ready = None;
                    }
                }
                changed = async {
                    match keys.as_mut() {
                        Some(rx) => rx.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                } => {
                    let read = keys.as_mut().and_then(|rx| rx.borrow_and_update().clone());
                    match (swim.as_mut(), read) {
                        (Some(swim), Some(read)) if changed => {
                            apply_keys(swim, read, &mut keys_applied);
                        }
                        _ => keys = None,
                    }
                }
                _ = rejoin.tick(), if swim.is_some() => {
                    if let Some(swim) = swim.as_mut() {
                        state.announce_to_unreached(swim);
                    }
                }
                event = stream.next() => match event {
                    Some(Ok(event)) => {
                        state.on_lease_event(event, swim.as_mut());
                        publish_sources(&sources_tx, state.sources());
                    }
                    Some(Err(err)) => tracing::warn!(error = %err, "Lease watch failed; retrying"),
                    None => break Err(Error::WatchEnded),
                },
                event = node_stream.next() => match event {
                    Some(Ok(event)) => {
                        if state.nodes.on_event(event) {
                            if let Some(swim) = swim.as_mut() {
                                state.announce_to_unreached(swim);
                            }
                        }
                        publish_sources(&sources_tx, state.sources());
                    }
                    Some(Err(err)) => tracing::warn!(error = %err, "Node watch failed; retrying"),
                    None => break Err(Error::WatchEnded),
                },
                Some((datagram, from)) = datagrams.recv() => {
                    receive_one(swim.as_mut(), &datagram, from, &metrics);
                }
            }
            end_round(&mut state, swim.as_mut(), socket.as_deref()).await;
        };

        receiver_stop.cancel();
        // Stop: withdraw, tell the peers (they take over at once), delete the Lease, then
        // leave SWIM.
        state.publish(swim.as_ref(), true);
        if let Some(swim) = swim.as_mut() {
            let beats = state.heartbeats(swim);
            send_all(socket.as_deref(), beats).await;
        }
        renewer_stop.cancel();
        if let Err(err) = (&mut renewer.0).await {
            tracing::warn!(error = %err, "the Lease renewer stopped abnormally");
        }
        delete_own_lease(&leases, &node).await;
        if let Some(swim) = swim.as_mut() {
            swim.leave(Instant::now());
            let (out, _) = swim.drain(unix_micros());
            send_all(socket.as_deref(), out).await;
        }
        result
    }
}

/// The loop's timer fired (at `wake`): what arrived while this thread waited is read first,
/// then SWIM's due timers run.
async fn on_wake(
    wake: Instant,
    state: &LoopState,
    mut swim: Option<&mut Swim>,
    datagrams: &mut mpsc::Receiver<(Vec<u8>, SocketAddr)>,
    metrics: &MembershipMetrics,
) {
    let late = Instant::now().saturating_duration_since(wake);
    metrics.wake_delay.observe(late.as_secs_f64());
    if late > 2 * state.heartbeat_interval() {
        tracing::info!(
            late_ms = late.as_millis() as u64,
            "the membership loop woke late"
        );
    }
    // What arrived while this task waited (or while the process was not running at all) is
    // read before anyone is judged silent: a busy node must not take its own lateness for its
    // peers' silence. Bounded by the queue, which only the gate fills.
    tokio::task::yield_now().await;
    while let Ok((datagram, from)) = datagrams.try_recv() {
        receive_one(swim.as_deref_mut(), &datagram, from, metrics);
    }
    if let Some(swim) = swim {
        swim.fire_due(Instant::now());
    }
}

/// After whatever woke the loop: SWIM's messages out and its verdicts in, the live set
/// published, heartbeats when due (or when this node's own liveness changed), and a node cut
/// off from everyone starts SWIM over as a new identity.
async fn end_round(state: &mut LoopState, mut swim: Option<&mut Swim>, socket: Option<&UdpSocket>) {
    if let Some(swim) = swim.as_deref_mut() {
        let (out, events) = swim.drain(unix_micros());
        send_all(socket, out).await;
        state.on_swim_events(events);
        state.on_heard(swim.take_heard(), Instant::now());
    }
    let was_live = state.self_live;
    let cut_off = state.publish(swim.as_deref(), false);
    if let Some(swim) = swim.as_deref_mut() {
        let now = Instant::now();
        if now >= state.next_beat || state.self_live != was_live {
            let beats = state.heartbeats(swim);
            send_all(socket, beats).await;
            state.next_beat = now + state.heartbeat_interval();
        }
    }
    if !cut_off {
        return;
    }
    if let Some(swim) = swim.filter(|s| s.has_members()) {
        tracing::warn!("cut off from the other agents; SWIM starts over as a new identity");
        swim.restart();
        state.announce_to_unreached(swim);
        let (out, _) = swim.drain(unix_micros());
        send_all(socket, out).await;
    }
}

/// Deletes this node's Lease on a graceful stop, so peers take over at once rather than when
/// it expires.
async fn delete_own_lease(leases: &Api<Lease>, node: &str) {
    let name = lease_names::agent_lease_name(node);
    match tokio::time::timeout(
        DELETE_TIMEOUT,
        leases.delete(&name, &DeleteParams::default()),
    )
    .await
    {
        Ok(Ok(_)) => tracing::info!(lease = %name, "deleted the agent Lease"),
        Ok(Err(kube::Error::Api(status))) if status.code == 404 => {}
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "deleting the agent Lease failed; peers wait for it to expire")
        }
        Err(_) => tracing::warn!("deleting the agent Lease timed out; peers wait for it to expire"),
    }
}

/// Binds the socket and builds this node's SWIM identity, advertised at the Node's address
/// unless one is configured.
async fn open_swim(
    config: &MembershipConfig,
    key: &Key,
    client: &Client,
    given: Option<std::net::UdpSocket>,
) -> Result<(UdpSocket, Swim), Error> {
    let socket = match given {
        Some(socket) => {
            let addr = socket.local_addr().unwrap_or(config.bind());
            socket
                .set_nonblocking(true)
                .and_then(|()| UdpSocket::from_std(socket))
                .map_err(|source| Error::Bind { addr, source })?
        }
        None => UdpSocket::bind(config.bind())
            .await
            .map_err(|source| Error::Bind {
                addr: config.bind(),
                source,
            })?,
    };
    let bind = socket.local_addr().map_err(|source| Error::Bind {
        addr: config.bind(),
        source,
    })?;
    let advertise = match config.advertise_address() {
        Some(address) => address,
        None if !bind.ip().is_unspecified() => bind.ip(),
        None => {
            let nodes: Api<Node> = Api::all(client.clone());
            let node = nodes
                .get(config.node_name())
                .await
                .map_err(|source| Error::Kube {
                    what: "reading this agent's Node",
                    source,
                })?;
            let addresses = node.status.and_then(|s| s.addresses).unwrap_or_default();
            pick_advertise_address(&addresses, bind).ok_or_else(|| Error::NoAddress {
                node: config.node_name().to_string(),
                reason: format!(
                    "the Node has no InternalIP usable from {bind}; set the advertise address"
                ),
            })?
        }
    };
    let me = Peer {
        node: config.node_name().to_string(),
        addr: SocketAddr::new(advertise, bind.port()),
        generation: unix_micros() / 1000,
    };
    let swim = Swim::new(me, config.foca_config(), key.clone(), config.clock_window())
        .with_previous_key(config.previous_key().cloned());
    Ok((socket, swim))
}

/// The Node's first InternalIP a socket bound to `bind` can use: the same family, or any
/// family for an unspecified IPv6 bind (dual stack).
pub fn pick_advertise_address(addresses: &[NodeAddress], bind: SocketAddr) -> Option<IpAddr> {
    addresses
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse::<IpAddr>().ok())
        .find(|ip| ip.is_ipv4() == bind.is_ipv4() || bind.ip() == IpAddr::from([0u16; 8]))
}

/// Renews this agent's Lease every third of its duration until `stop`.
async fn renew_lease(
    leases: Api<Lease>,
    node: String,
    config: MembershipConfig,
    endpoint: Option<SocketAddr>,
    stop: CancellationToken,
) {
    let name = lease_names::agent_lease_name(&node);
    let params = PatchParams::apply(field_manager::AGENT).force();
    let interval = config.lease_renew_interval();
    loop {
        let lease = build_lease(
            &node,
            config.lease_namespace(),
            config.lease_duration(),
            endpoint,
            // The clock the stamps use, so peers' estimate of this node's offset fits them.
            Timestamp::from_microsecond(i64::try_from(unix_micros()).unwrap_or(i64::MAX))
                .unwrap_or_else(|_| Timestamp::now()),
        );
        let patch = Patch::Apply(&lease);
        let attempt = tokio::select! {
            () = stop.cancelled() => return,
            attempt = tokio::time::timeout(interval, leases.patch(&name, &params, &patch)) => attempt,
        };
        match attempt {
            Ok(Ok(_)) => tracing::trace!(lease = %name, "renewed"),
            Ok(Err(err)) => {
                tracing::warn!(lease = %name, error = %err, "renewing the agent Lease failed")
            }
            Err(_) => tracing::warn!(lease = %name, "renewing the agent Lease timed out"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The names of the cluster's Nodes, from their watch.
#[derive(Default)]
struct NodeNames {
    names: BTreeSet<String>,
    relisting: BTreeSet<String>,
    listed: bool,
}

impl NodeNames {
    /// Applies a watch event; returns whether a Node became known (peers to ask to join).
    fn on_event(&mut self, event: watcher::Event<Node>) -> bool {
        match event {
            watcher::Event::Init => {
                self.relisting.clear();
                false
            }
            watcher::Event::InitApply(node) => {
                if let Some(name) = node.metadata.name {
                    self.relisting.insert(name);
                }
                false
            }
            watcher::Event::InitDone => {
                let grew = !self.relisting.is_subset(&self.names) || !self.listed;
                self.names = std::mem::take(&mut self.relisting);
                self.listed = true;
                grew
            }
            watcher::Event::Apply(node) => node
                .metadata
                .name
                .is_some_and(|name| self.names.insert(name)),
            watcher::Event::Delete(node) => {
                if let Some(name) = node.metadata.name {
                    self.names.remove(&name);
                }
                false
            }
        }
    }
}

/// Everything the loop keeps besides SWIM.
struct LoopState {
    node: String,
    mode: Mode,
    view: LeaseView,
    listed: bool,
    nodes: NodeNames,
    /// Whether this node was eligible at the last look.
    was_eligible: bool,
    hold: SelfHold,
    metrics: MembershipMetrics,
    live: watch::Sender<LiveNodes>,
    /// Each peer's last authenticated datagram, and what its last heartbeat said: ready, and
    /// whether it hears this node.
    sight: BTreeMap<String, (Instant, bool, bool)>,
    /// Whether this node counted itself at the last look (what its heartbeats say).
    self_live: bool,
    /// Whether the announcer is ready to answer.
    ready: bool,
    until: watch::Sender<AnswerUntil>,
    next_beat: Instant,
    /// When the verdict changes next with nothing heard.
    next_change: Option<Instant>,
    /// Peers whose clocks were last reported off this node's.
    skewed: BTreeSet<String>,
}

impl LoopState {
    /// Nothing seen yet; Lease-only and ready until the caller says otherwise.
    fn new(
        node: &str,
        config: &MembershipConfig,
        metrics: &MembershipMetrics,
        live: watch::Sender<LiveNodes>,
        until: watch::Sender<AnswerUntil>,
    ) -> Self {
        LoopState {
            node: node.to_string(),
            mode: Mode::LeaseOnly,
            sight: BTreeMap::new(),
            self_live: false,
            ready: true,
            until,
            next_beat: Instant::now(),
            next_change: None,
            skewed: BTreeSet::new(),
            view: LeaseView::default(),
            listed: false,
            nodes: NodeNames::default(),
            was_eligible: false,
            hold: SelfHold::new(config.takeover_hold()),
            metrics: metrics.clone(),
            live,
        }
    }

    fn on_lease_event(&mut self, event: watcher::Event<Lease>, swim: Option<&mut Swim>) {
        let touched: Vec<String> = match event {
            watcher::Event::Init => {
                self.view.begin_relist();
                Vec::new()
            }
            watcher::Event::InitApply(lease) => {
                self.view.apply(&lease, unix_millis()).into_iter().collect()
            }
            watcher::Event::InitDone => {
                self.view.finish_relist();
                self.listed = true;
                self.view.nodes().map(String::from).collect()
            }
            watcher::Event::Apply(lease) => {
                self.view.apply(&lease, unix_millis()).into_iter().collect()
            }
            watcher::Event::Delete(lease) => {
                self.view.delete(&lease);
                Vec::new()
            }
        };
        // A peer SWIM does not count alive is asked to let this node join, each time its
        // Lease is renewed: that is how agents find each other, and how they retry.
        if let Some(swim) = swim {
            let me = self.node.clone();
            for node in touched.iter().filter(|node| **node != me) {
                let offset_ms = self.view.clock_offset_ms(node);
                swim.set_clock_offset(node, offset_ms.map(|ms| ms.saturating_mul(1000)));
                self.report_clock_offset(node, offset_ms);
            }
            let now = Instant::now();
            for node in touched {
                if node == self.node
                    || !self.nodes.names.contains(&node)
                    || swim.state(&node) == SwimState::Alive
                {
                    continue;
                }
                if let Some(endpoint) = self.view.endpoint(&node) {
                    swim.announce(Peer::from_lease(node, endpoint), now);
                }
            }
        }
    }

    /// Says when a peer's clock is off this node's by more than [`SKEW_REPORTED`] (and when it
    /// is back), and keeps the largest offset in the metrics: harmless to membership now, but
    /// what else on the node compares clocks (certificates, logs) wants to know.
    fn report_clock_offset(&mut self, node: &str, offset_ms: Option<i64>) {
        let off = offset_ms.is_some_and(|ms| ms.unsigned_abs() > SKEW_REPORTED.as_millis() as u64);
        if off && self.skewed.insert(node.to_string()) {
            tracing::warn!(
                peer = node,
                offset_ms = offset_ms.unwrap_or(0),
                "a peer's clock is off this node's; its membership datagrams are judged by its own clock"
            );
        } else if !off && self.skewed.remove(node) {
            tracing::info!(
                peer = node,
                offset_ms = offset_ms.unwrap_or(0),
                "a peer's clock agrees with this node's again"
            );
        }
        let largest = self
            .view
            .nodes()
            .filter(|peer| *peer != self.node && self.nodes.names.contains(*peer))
            .filter_map(|peer| self.view.clock_offset_ms(peer))
            .map(i64::unsigned_abs)
            .max()
            .unwrap_or(0);
        self.metrics.clock_offset.set(largest as f64 / 1000.0);
    }

    /// The endpoints datagrams may come from: those advertised on the Leases of the cluster's
    /// Nodes, this node's own left out.
    fn sources(&self) -> HashMap<SocketAddr, String> {
        self.view
            .nodes()
            .filter(|node| *node != self.node && self.nodes.names.contains(*node))
            .filter_map(|node| Some((self.view.endpoint(node)?, node.to_string())))
            .collect()
    }

    /// Announces to every peer whose Lease is fresh but whom SWIM does not count alive.
    fn announce_to_unreached(&self, swim: &mut Swim) {
        let now_ms = unix_millis();
        let now = Instant::now();
        let unreached: Vec<(String, SocketAddr)> = self
            .view
            .nodes()
            .filter(|node| *node != self.node && self.nodes.names.contains(*node))
            .filter(|node| self.view.state(node, now_ms) == LeaseState::Fresh)
            .filter(|node| swim.state(node) != SwimState::Alive)
            .filter_map(|node| Some((node.to_string(), self.view.endpoint(node)?)))
            .collect();
        for (node, endpoint) in unreached {
            swim.announce(Peer::from_lease(node, endpoint), now);
        }
    }

    /// Records what was heard; a SWIM message keeps the sender's last heartbeat's word.
    fn on_heard(&mut self, heard: Vec<Heard>, now: Instant) {
        for Heard {
            node,
            ready,
            hears_me,
        } in heard
        {
            let entry = self.sight.entry(node).or_insert((now, false, false));
            entry.0 = now;
            if let Some(ready) = ready {
                entry.1 = ready;
            }
            if let Some(hears_me) = hears_me {
                entry.2 = hears_me;
            }
        }
    }

    fn heartbeat_interval(&self) -> Duration {
        match self.mode {
            Mode::Membership(timing) => timing.heartbeat,
            Mode::LeaseOnly => Duration::from_secs(3600),
        }
    }

    /// A heartbeat to every peer that advertises an endpoint, saying whether this node counts
    /// itself live.
    fn heartbeats(&self, swim: &mut Swim) -> Vec<Outgoing> {
        let micros = unix_micros();
        let now = Instant::now();
        let withdraw = match self.mode {
            Mode::Membership(timing) => timing.withdraw,
            Mode::LeaseOnly => Duration::ZERO,
        };
        self.sources()
            .into_iter()
            .map(|(endpoint, node)| {
                let hears = self
                    .sight
                    .get(&node)
                    .is_some_and(|(heard, ..)| now < *heard + withdraw);
                swim.heartbeat(&node, endpoint, self.self_live, hears, micros)
            })
            .collect()
    }

    fn on_swim_events(&mut self, events: Vec<SwimEvent>) {
        for event in events {
            match event {
                SwimEvent::Up(node) => tracing::debug!(peer = %node, "SWIM: up"),
                SwimEvent::Down { node, silent_for } => {
                    tracing::info!(peer = %node, silent_for = ?silent_for, "SWIM: declared down");
                }
                SwimEvent::Rejoined => {
                    tracing::warn!("declared down by the other agents; rejoining");
                    self.hold.restart(Instant::now());
                }
            }
        }
    }

    fn next_wake(&self, swim: Option<&Swim>, now: Instant) -> Instant {
        let now_ms = unix_millis();
        let lease = self.view.next_expiry(now_ms).map(|end| {
            // One millisecond late, so the Lease has expired when we look.
            now + Duration::from_millis(u64::try_from(end - now_ms).unwrap_or(0) + 1)
        });
        let beat = swim.map(|_| self.next_beat);
        [
            swim.and_then(Swim::next_timer),
            lease,
            self.hold.wake_at(now),
            beat,
            self.next_change,
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(now + Duration::from_secs(3600))
    }

    /// Computes the set and publishes it when it changed; `stopping` withdraws this node.
    /// Returns whether this node just lost eligibility with SWIM on and its Lease there: it is
    /// on the losing side of a split.
    fn publish(&mut self, swim: Option<&Swim>, stopping: bool) -> bool {
        if !self.listed || !self.nodes.listed {
            return false;
        }
        let now_ms = unix_millis();
        let now = Instant::now();
        let mut peers: BTreeMap<String, PeerFacts> = BTreeMap::new();
        for node in self.view.nodes() {
            let sight = self.sight.get(node);
            peers.insert(
                node.to_string(),
                PeerFacts {
                    lease: self.view.state(node, now_ms),
                    member: swim.is_some() && self.view.endpoint(node).is_some(),
                    heard: sight.map(|s| s.0),
                    ready: sight.is_some_and(|s| s.1),
                    hears_me: sight.is_some_and(|s| s.2),
                },
            );
        }
        // Heard, but without a Lease (deleted by a stopping agent, or not seen yet).
        for (node, (heard, ready, hears_me)) in &self.sight {
            peers.entry(node.clone()).or_insert(PeerFacts {
                lease: LeaseState::Absent,
                member: true,
                heard: Some(*heard),
                ready: *ready,
                hears_me: *hears_me,
            });
        }
        peers.remove(&self.node);
        let peers = cluster_peers(peers, &self.node, &self.nodes.names);
        let own_lease = self.view.state(&self.node, now_ms);
        let verdict = compute_live(self.mode, &self.node, own_lease, &peers, now);
        self.next_change = next_change(self.mode, &peers, now);
        // Only on losing eligibility: a starting node that has heard few peers yet is not
        // cut off, it is joining.
        let cut_off = matches!(self.mode, Mode::Membership(_))
            && own_lease != LeaseState::Absent
            && self.was_eligible
            && !verdict.self_eligible;
        self.was_eligible = verdict.self_eligible;
        let eligible = verdict.self_eligible && !stopping;
        let held = self.hold.observe(eligible, now);
        let self_live = held && (self.ready || self.mode == Mode::LeaseOnly);
        self.self_live = self_live;
        // The responders' limit goes first: when this node stops, it stops before anything
        // else hears of it.
        let until = if self_live { verdict.until } else { Some(now) };
        self.until.send_if_modified(|current| {
            let changed = *current != until;
            *current = until;
            changed
        });
        let set = live_set(verdict, &self.node, self_live);
        // Peers that leave the live set for their silence: the detection time, from the last
        // datagram heard (a leave or a lost Lease is no detection).
        if let Mode::Membership(timing) = self.mode {
            for peer in self.live.borrow().difference(&set) {
                if let Some((heard, ..)) = self.sight.get(peer) {
                    let silent = now.saturating_duration_since(*heard);
                    if silent >= timing.failure {
                        self.metrics.detection.observe(silent.as_secs_f64());
                    }
                }
            }
        }
        let metrics = &self.metrics;
        let node = &self.node;
        self.live.send_if_modified(|current| {
            if **current == set {
                return false;
            }
            let up = set.difference(current).count();
            let down = current.difference(&set).count();
            metrics.change(true, up);
            metrics.change(false, down);
            metrics.live_nodes.set(set.len() as i64);
            if set.contains(node) != current.contains(node) {
                tracing::info!(node = %node, live = set.contains(node), "this agent's liveness changed");
            }
            tracing::info!(live = ?set, "live agents changed");
            *current = Arc::new(set);
            true
        });
        cut_off
    }
}

/// Receives datagrams until `stop`, passing on those the gate admits; the rest are counted by
/// reason and dropped here.
async fn receive_gated(
    socket: Arc<UdpSocket>,
    sources: watch::Receiver<Sources>,
    admitted: mpsc::Sender<(Vec<u8>, SocketAddr)>,
    metrics: MembershipMetrics,
    stop: CancellationToken,
) {
    let mut gate = Gate::default();
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    loop {
        let received = tokio::select! {
            () = stop.cancelled() => return,
            received = socket.recv_from(&mut buf) => received,
        };
        let (len, from) = match received {
            Ok(received) => received,
            Err(err) => {
                // ICMP errors of earlier sends surface here on some kernels; keep receiving.
                tracing::debug!(error = %err, "receiving membership datagrams");
                continue;
            }
        };
        let verdict = gate.admit(&buf[..len], from, &sources.borrow(), Instant::now());
        let refusal = match verdict {
            Ok(()) => match admitted.try_send((buf[..len].to_vec(), from)) {
                Ok(()) => continue,
                Err(mpsc::error::TrySendError::Full(_)) => Refusal::Backlog,
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            },
            Err(refusal) => refusal,
        };
        tracing::trace!(from = %from, reason = refusal.label(), "membership datagram dropped");
        metrics.refuse(refusal);
    }
}

/// The key files' bytes as last applied.
type KeyBytes = (Vec<u8>, Option<Vec<u8>>);

/// Reads the key files now and every [`KEY_POLL`], publishing their bytes when they change. A
/// file that cannot be read changes nothing (logged). `tokio::fs` reads on the runtime's
/// blocking pool, so a slow disk holds this task, never the thread it was spawned from.
async fn poll_key_files(
    key_file: std::path::PathBuf,
    previous_file: Option<std::path::PathBuf>,
    tx: watch::Sender<Option<KeyBytes>>,
) {
    let mut poll = tokio::time::interval(KEY_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        poll.tick().await;
        let key = match tokio::fs::read(&key_file).await {
            Ok(bytes) => bytes,
            Err(err) => {
                tracing::warn!(file = %key_file.display(), error = %err, "reading the membership key failed; keeping the one in use");
                continue;
            }
        };
        // A Secret without `previous` has no such file: no previous key.
        let previous = match &previous_file {
            Some(file) => tokio::fs::read(file).await.ok(),
            None => None,
        };
        let read = (key, previous);
        tx.send_if_modified(|current| {
            if current.as_ref() == Some(&read) {
                return false;
            }
            *current = Some(read);
            true
        });
    }
}

/// When the key files' bytes changed, seals with the new key and accepts both. Bytes that hold
/// no valid key change nothing (logged).
fn apply_keys(swim: &mut Swim, read: KeyBytes, last: &mut Option<KeyBytes>) {
    if last.as_ref() == Some(&read) {
        return;
    }
    let first = last.is_none();
    let parsed = Key::new(&read.0).and_then(|key| {
        let previous = read.1.as_deref().map(Key::new).transpose()?;
        Ok((key, previous))
    });
    match parsed {
        Ok((key, previous)) => {
            swim.set_keys(key, previous);
            if !first {
                tracing::info!("the membership key files changed; sealing with the new key");
            }
        }
        Err(reason) => {
            tracing::warn!(%reason, "the membership key files hold no valid key; keeping the one in use")
        }
    }
    *last = Some(read);
}

/// One datagram the gate admitted, into SWIM (and the heartbeat view, through it).
fn receive_one(
    swim: Option<&mut Swim>,
    datagram: &[u8],
    from: SocketAddr,
    metrics: &MembershipMetrics,
) {
    let Some(swim) = swim else { return };
    if let Err(refusal) = swim.receive(datagram, Instant::now(), unix_micros()) {
        tracing::debug!(from = %from, reason = refusal.label(), "membership datagram refused");
        metrics.refuse(refusal);
    }
}

fn publish_sources(tx: &watch::Sender<Sources>, sources: HashMap<SocketAddr, String>) {
    tx.send_if_modified(|current| {
        if **current == sources {
            return false;
        }
        *current = Arc::new(sources);
        true
    });
}

async fn send_all(socket: Option<&UdpSocket>, out: Vec<Outgoing>) {
    let Some(socket) = socket else { return };
    for Outgoing { to, datagram } in out {
        if let Err(err) = socket.send_to(&datagram, to).await {
            tracing::debug!(to = %to, error = %err, "sending a membership datagram");
        }
    }
}

/// This agent's wall clock for membership ([`crate::clock`]): steps of the system clock do not
/// move it.
fn unix_micros() -> u64 {
    crate::clock::process_clock().micros_at(Instant::now())
}

fn unix_millis() -> i64 {
    i64::try_from(unix_micros() / 1000).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn address(type_: &str, address: &str) -> NodeAddress {
        NodeAddress {
            type_: type_.into(),
            address: address.into(),
        }
    }

    #[test]
    fn the_advertised_address_is_the_first_internal_ip_of_the_bind_family() {
        let addresses = [
            address("Hostname", "node-a"),
            address("ExternalIP", "203.0.113.5"),
            address("InternalIP", "fd00::11"),
            address("InternalIP", "198.18.0.11"),
        ];
        let v4: SocketAddr = "0.0.0.0:7947".parse().unwrap();
        let v6: SocketAddr = "[::]:7947".parse().unwrap();
        assert_eq!(
            pick_advertise_address(&addresses, v4),
            Some("198.18.0.11".parse().unwrap())
        );
        assert_eq!(
            pick_advertise_address(&addresses, v6),
            Some("fd00::11".parse().unwrap())
        );
        assert_eq!(pick_advertise_address(&addresses[..2], v4), None);
        assert_eq!(
            pick_advertise_address(&[address("InternalIP", "bogus")], v4),
            None
        );
    }
}

//! The L2 announcer inside the agent: IPPools, L2Advertisements, Nodes, Services and
//! EndpointSlices feed berth-l2's [`L2Index`] (all but L2Advertisements through the agent's
//! shared watches, [`Feeds`]); with the live set and the local interfaces'
//! state it becomes the table of answers each interface's speaker reads. What it announces is
//! kept in this node's `ServiceL2Status` records ([`crate::l2status`]); when the record of an
//! address this node took over is written, the Services holding it get an Event "announcing
//! from node X". The agent writes nothing on the Services themselves.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use berth_api::L2Advertisement;
use berth_l2::{
    build_announced, diff_ownership, local_interfaces, Answers, InterfaceHold, L2Index, L2Metrics,
    LinkOptions, PacketLink, StartupSettle, TakeoverDelay,
};
use berth_telemetry::MetricsRegistry;
use kube::api::Api;
use kube::runtime::watcher;
use kube::Client;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use crate::l2events::{build_announcing_event, build_conflict_event};
use crate::l2events::{run_reports, Report};
use crate::l2status::{run_status_records, AnnouncedSet};
use crate::watch::{run_watch, Feeds, Handlers};
use crate::Error;

/// The nodes whose agents are live, as berth-membership publishes them.
pub type LiveSet = watch::Receiver<berth_membership::LiveNodes>;

/// How often the local interfaces' state is read.
const INTERFACE_POLL: Duration = Duration::from_millis(200);
/// How long an interface that was down must stay up before it answers again.
const INTERFACE_HOLD: Duration = Duration::from_secs(1);
/// How long the live set must stay unchanged before a starting announcer answers.
const STARTUP_SETTLE: Duration = Duration::from_secs(1);
/// How long a takeover from a live owner waits for that owner to stop.
const TAKEOVER_DELAY: Duration = Duration::from_millis(300);
/// How long a node that just became live waits before answering what it gains: its first
/// heartbeat saying so reaches its peers, which stop at once, within this.
const HANDOVER_DELAY: Duration = Duration::from_millis(60);
/// How often one address's conflict is recorded as an Event (the metric counts every one).
const CONFLICT_EVENT_EVERY: Duration = Duration::from_secs(60);
/// Announcements waiting to be reported; a full queue drops the oldest news, never the work.
const REPORT_QUEUE: usize = 4096;

/// The announcer's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnnouncerConfig {
    /// Interfaces to answer on; empty: every interface with an Ethernet address but loopback.
    pub interfaces: Vec<String>,
    /// Namespace of this node's `ServiceL2Status` records.
    pub status_namespace: String,
    /// Owned addresses are announced again this often after their takeover rounds; `None`:
    /// only on takeover.
    pub gratuitous_interval: Option<Duration>,
}

pub struct Announcer {
    node: String,
    config: AnnouncerConfig,
    client: Client,
    metrics: L2Metrics,
    live: Option<LiveSet>,
    /// What the watches tell the announcer, and the signal that they told it something.
    index: Arc<Mutex<L2Index>>,
    wake: Arc<Notify>,
    until: Option<watch::Receiver<berth_membership::AnswerUntil>>,
    ready: Option<watch::Sender<bool>>,
}

fn lock(index: &Mutex<L2Index>) -> std::sync::MutexGuard<'_, L2Index> {
    index.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The interfaces to open: those configured, or every non-loopback one with a MAC.
fn choose_interfaces(config: &AnnouncerConfig) -> Result<Vec<String>, Error> {
    if !config.interfaces.is_empty() {
        return Ok(config.interfaces.clone());
    }
    let found = local_interfaces().map_err(Error::L2)?;
    Ok(found
        .into_iter()
        .filter(|(_, s)| !s.loopback && s.mac.is_some_and(|m| m != [0; 6]))
        .map(|(name, _)| name)
        .collect())
}

/// The opened interfaces that are up now.
fn interfaces_up(opened: &[String]) -> BTreeSet<String> {
    match local_interfaces() {
        Ok(found) => opened
            .iter()
            .filter(|name| found.get(*name).is_some_and(|s| s.up))
            .cloned()
            .collect(),
        Err(err) => {
            tracing::warn!(error = %err, "reading the interfaces failed; taking them as down");
            BTreeSet::new()
        }
    }
}

impl Announcer {
    /// Builds the announcer; nothing runs until [`Announcer::run`]. `live`: the membership's
    /// live set; without one every Node counts as live.
    pub fn new(
        node: &str,
        config: AnnouncerConfig,
        client: Client,
        registry: &mut MetricsRegistry,
        live: Option<LiveSet>,
    ) -> Self {
        Announcer {
            node: node.to_string(),
            config,
            client,
            metrics: L2Metrics::register(registry.sub_registry("l2")),
            live,
            index: Arc::new(Mutex::new(L2Index::new(node))),
            wake: Arc::new(Notify::new()),
            until: None,
            ready: None,
        }
    }

    /// Answers only while `until` allows (berth-membership's verdict), and says through
    /// `ready` when it is ready to answer: settled, listed, an interface up.
    pub fn with_answer_gate(
        mut self,
        until: watch::Receiver<berth_membership::AnswerUntil>,
        ready: watch::Sender<bool>,
    ) -> Self {
        self.until = Some(until);
        self.ready = Some(ready);
        self
    }

    /// Takes liveness from `live` (the membership's live set).
    pub fn with_live(mut self, live: LiveSet) -> Self {
        self.live = Some(live);
        self
    }

    pub fn metrics(&self) -> &L2Metrics {
        &self.metrics
    }

    /// Feeds the announcer's index from the agent's shared watches of IPPools, Nodes, Services
    /// and EndpointSlices (the kinds other components read too).
    pub(crate) fn subscribe(&self, feeds: &mut Feeds) {
        let (index, wake) = (&self.index, &self.wake);
        feeds.pools.feed(
            index,
            wake,
            Handlers {
                kind: "IPPool",
                apply: |i: &mut L2Index, o| {
                    i.apply_pool(o);
                },
                delete: |i: &mut L2Index, o| {
                    i.delete_pool(o);
                },
                begin: L2Index::begin_pools,
                finish: |i: &mut L2Index| {
                    i.finish_pools();
                },
            },
        );
        feeds.nodes.feed(
            index,
            wake,
            Handlers {
                kind: "Node",
                apply: |i: &mut L2Index, o| {
                    i.apply_node(o);
                },
                delete: |i: &mut L2Index, o| {
                    i.delete_node(o);
                },
                begin: L2Index::begin_nodes,
                finish: |i: &mut L2Index| {
                    i.finish_nodes();
                },
            },
        );
        feeds.services.feed(
            index,
            wake,
            Handlers {
                kind: "Service",
                apply: |i: &mut L2Index, o| {
                    i.apply_service(o);
                },
                delete: |i: &mut L2Index, o| {
                    i.delete_service(o);
                },
                begin: L2Index::begin_services,
                finish: |i: &mut L2Index| {
                    i.finish_services();
                },
            },
        );
        feeds.slices.feed(
            index,
            wake,
            Handlers {
                kind: "EndpointSlice",
                apply: |i: &mut L2Index, o| {
                    i.apply_slice(o);
                },
                delete: |i: &mut L2Index, o| {
                    i.delete_slice(o);
                },
                begin: L2Index::begin_slices,
                finish: |i: &mut L2Index| {
                    i.finish_slices();
                },
            },
        );
    }

    /// The watch of the one kind only the announcer reads.
    fn spawn_advertisements(&self, stop: &CancellationToken) -> JoinHandle<()> {
        tokio::spawn(run_watch(
            Api::<L2Advertisement>::all(self.client.clone()),
            watcher::Config::default(),
            self.index.clone(),
            self.wake.clone(),
            Handlers {
                kind: "L2Advertisement",
                apply: |i: &mut L2Index, o| {
                    i.apply_advertisement(o);
                },
                delete: |i: &mut L2Index, o| {
                    i.delete_advertisement(o);
                },
                begin: L2Index::begin_advertisements,
                finish: |i: &mut L2Index| {
                    i.finish_advertisements();
                },
            },
            stop.clone(),
        ))
    }

    /// Runs until `stop` is cancelled. Fails only when no interface can be opened.
    pub async fn run(self, stop: CancellationToken) -> Result<(), Error> {
        let interfaces = choose_interfaces(&self.config)?;
        let (answers_tx, answers_rx) = watch::channel(Arc::new(Answers::default()));
        let (conflict_tx, mut conflicts) = mpsc::unbounded_channel();
        // The speakers answer on a thread of their own: a busy or stalled runtime here delays
        // no answer.
        let speakers = berth_l2::spawn_speakers(
            interfaces.clone(),
            PacketLink::open,
            answers_rx,
            self.metrics.clone(),
            LinkOptions {
                refresh: self.config.gratuitous_interval,
                until: self.until.clone(),
                conflicts: Some(conflict_tx.clone()),
            },
            stop.clone(),
        );
        let (opened, speakers) = speakers.opened().await;
        if opened.is_empty() {
            return Err(Error::NoInterface(interfaces.join(",")));
        }
        let mut tasks = vec![self.spawn_advertisements(&stop)];
        let (report_tx, records_tx) = self.spawn_records(&mut tasks, &stop);
        drop(conflict_tx);
        let Announcer {
            node,
            config: _,
            client: _,
            metrics,
            mut live,
            until: _,
            ready,
            index,
            wake,
        } = self;
        let mut answering = Answering::new(
            live.is_some(),
            Outputs {
                answers: answers_tx,
                records: records_tx,
                reports: report_tx,
                ready,
            },
            node,
            metrics,
            index,
            opened,
        );
        let mut poll = tokio::time::interval(INTERFACE_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let settle_at = answering.next_due();
            let recompute = tokio::select! {
                () = stop.cancelled() => break,
                () = wake.notified() => true,
                () = async {
                    match settle_at {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                } => true,
                Some(conflict) = conflicts.recv() => {
                    answering.on_conflict(&conflict);
                    false
                }
                _ = poll.tick() => answering.on_poll(),
                changed = async {
                    match &mut live {
                        Some(rx) => rx.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                } => answering.on_live(&mut live, changed),
            };
            if recompute {
                answering.recompute();
            }
        }
        // The speakers stop with the same token. The record
        // writer and the reporter keep their inputs until they end.
        let Outputs {
            answers,
            records,
            reports,
            ready,
        } = answering.out;
        drop(answers);
        for task in tasks {
            let _ = task.await;
        }
        if let Err(err) = speakers.join().await {
            tracing::warn!(error = %err, "the ARP and NDP speakers stopped abnormally");
        }
        drop((records, reports, ready));
        Ok(())
    }

    /// Starts the Event reporter and the `ServiceL2Status` writer; returns their inputs.
    fn spawn_records(
        &self,
        tasks: &mut Vec<JoinHandle<()>>,
        stop: &CancellationToken,
    ) -> (mpsc::Sender<Report>, watch::Sender<AnnouncedSet>) {
        let (report_tx, report_rx) = mpsc::channel(REPORT_QUEUE);
        tasks.push(tokio::spawn(run_reports(
            self.client.clone(),
            self.node.clone(),
            report_rx,
            stop.clone(),
        )));
        let (records_tx, records_rx) = watch::channel(AnnouncedSet::default());
        tasks.push(tokio::spawn(run_status_records(
            self.client.clone(),
            self.node.clone(),
            self.config.status_namespace.clone(),
            records_rx,
            report_tx.clone(),
            stop.clone(),
        )));
        (report_tx, records_tx)
    }
}

/// Where the announcer's decisions go.
struct Outputs {
    /// The table the speakers answer from.
    answers: watch::Sender<Arc<Answers>>,
    /// What this node announces, for its `ServiceL2Status` records.
    records: watch::Sender<AnnouncedSet>,
    /// Events to record.
    reports: mpsc::Sender<Report>,
    /// Whether this node is ready to answer (settled, listed, an interface up).
    ready: Option<watch::Sender<bool>>,
}

/// The announcer between wake-ups: the table it answers from now, and the clocks that decide
/// when that table may change (interfaces held down, the start-up settle, takeover delays).
struct Answering {
    node: String,
    metrics: L2Metrics,
    index: Arc<Mutex<L2Index>>,
    out: Outputs,
    opened: Vec<String>,
    up: BTreeSet<String>,
    self_live: bool,
    conflict_reported: BTreeMap<IpAddr, Instant>,
    current: Arc<Answers>,
    hold: InterfaceHold,
    settle: StartupSettle,
    delay: TakeoverDelay,
}

impl Answering {
    fn new(
        has_live: bool,
        out: Outputs,
        node: String,
        metrics: L2Metrics,
        index: Arc<Mutex<L2Index>>,
        opened: Vec<String>,
    ) -> Self {
        let mut settle = StartupSettle::new(STARTUP_SETTLE);
        if !has_live {
            // Without liveness there is nothing to converge.
            let now = Instant::now();
            settle.changed(now.checked_sub(STARTUP_SETTLE).unwrap_or(now));
        } else {
            // The first live set may be the empty one the channel starts with (no peer ready
            // yet, this node not either): it counts as arrived.
            settle.changed(Instant::now());
        }
        Answering {
            node,
            metrics,
            index,
            out,
            opened,
            up: BTreeSet::new(),
            self_live: false,
            conflict_reported: BTreeMap::new(),
            current: Arc::new(Answers::default()),
            hold: InterfaceHold::new(INTERFACE_HOLD),
            settle,
            delay: TakeoverDelay::new(TAKEOVER_DELAY).with_handover(HANDOVER_DELAY),
        }
    }

    /// When the table must be looked at again without any news.
    fn next_due(&self) -> Option<Instant> {
        self.settle.next_check().or(self.delay.next_due())
    }

    /// Another host announced an address this node answers for: an Event per Service holding
    /// it, at most once a [`CONFLICT_EVENT_EVERY`] per address.
    fn on_conflict(&mut self, conflict: &berth_l2::Conflict) {
        let now = Instant::now();
        let due = self
            .conflict_reported
            .get(&conflict.ip)
            .is_none_or(|at| now.saturating_duration_since(*at) >= CONFLICT_EVENT_EVERY);
        if due {
            self.conflict_reported.insert(conflict.ip, now);
            let services = self
                .current
                .entry(conflict.ip)
                .map(|e| e.services.clone())
                .unwrap_or_default();
            for service in services {
                let _ = self
                    .out
                    .reports
                    .try_send(Report::Conflict(service, conflict.clone()));
            }
        }
    }

    /// Reads the interfaces' state; true when the table must be looked at again.
    fn on_poll(&mut self) -> bool {
        self.up = self
            .hold
            .observe(Instant::now(), &self.opened, &interfaces_up(&self.opened));
        let (changed, listed) = {
            let mut index = lock(&self.index);
            (index.set_local_up(self.up.clone()), index.is_listed())
        };
        if !changed {
            let open = self.settle.is_open(Instant::now());
            publish_ready(
                self.out.ready.as_ref(),
                open && listed && !self.up.is_empty(),
            );
        }
        changed
    }

    /// Takes a new live set (or the loss of the channel); true when the table must be looked
    /// at again.
    fn on_live(&mut self, live: &mut Option<LiveSet>, changed: bool) -> bool {
        let Some(rx) = live else { return false };
        if !changed {
            tracing::warn!("the live set is gone; keeping the last one");
            *live = None;
            return false;
        }
        let set = rx.borrow_and_update().clone();
        let now_live = set.contains(&self.node);
        if now_live && !self.self_live {
            // A planned handover: the peers stop on hearing this node is live.
            self.delay.returned(Instant::now());
        }
        self.self_live = now_live;
        if !lock(&self.index).set_live(set) {
            return false;
        }
        self.settle.changed(Instant::now());
        true
    }

    /// Publishes readiness, and once settled the new table to the speakers and the records.
    fn recompute(&mut self) {
        let open = self.settle.is_open(Instant::now());
        // Ready once settled, listed, and with an interface to answer on: a node whose
        // every announcing interface is down tells its peers it is not live.
        let listed = lock(&self.index).is_listed();
        publish_ready(
            self.out.ready.as_ref(),
            open && listed && !self.up.is_empty(),
        );
        if !open {
            return;
        }
        let next = {
            let mut index = lock(&self.index);
            if !index.is_listed() {
                return;
            }
            let live = index.live_nodes();
            Arc::new(
                self.delay
                    .apply(&self.current, index.answers(), &live, Instant::now()),
            )
        };
        if next == self.current {
            return;
        }
        self.metrics.observe_answers(&next);
        let changes = diff_ownership(&self.current, &next);
        self.metrics
            .ownership_changes
            .inc_by((changes.gained.len() + changes.lost.len()) as u64);
        self.out.answers.send_replace(next.clone());
        let announced = build_announced(&next);
        self.out.records.send_if_modified(|current| {
            if **current == announced {
                return false;
            }
            *current = Arc::new(announced);
            true
        });
        self.current = next;
    }
}

fn publish_ready(ready: Option<&watch::Sender<bool>>, now_ready: bool) {
    if let Some(ready) = ready {
        ready.send_if_modified(|current| {
            let changed = *current != now_ready;
            *current = now_ready;
            changed
        });
    }
}

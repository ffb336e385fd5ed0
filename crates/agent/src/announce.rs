//! The L2 announcer inside the agent: IPPools, L2Advertisements, Nodes, Services and
//! EndpointSlices feed berth-l2's [`L2Index`] (all but L2Advertisements through the agent's
//! shared watches, [`Feeds`]); with the live set and the local interfaces'
//! state it becomes the table of answers each interface's speaker reads. What it announces is
//! kept in this node's `ServiceL2Status` records ([`crate::l2status`]); when the record of an
//! address this node took over is written, the Services holding it get an Event "announcing
//! from node X". The agent writes nothing on the Services themselves.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use berth_api::names::event;
use berth_api::L2Advertisement;
use berth_l2::{
    build_announced, diff_ownership, local_interfaces, Answers, InterfaceHold, L2Index, L2Metrics,
    LinkOptions, PacketLink, StartupSettle, TakeoverDelay,
};
use berth_telemetry::MetricsRegistry;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kube::Client;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

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

/// What the report task records.
#[derive(Debug)]
pub(crate) enum Report {
    /// This node took over the Service's address.
    Announcing(berth_l2::ServiceKey, std::net::IpAddr),
    /// Another host announced the Service's address, which this node answers for.
    Conflict(berth_l2::ServiceKey, berth_l2::Conflict),
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
        let mut tasks = Vec::new();
        let mut opened = Vec::new();
        for name in &interfaces {
            match PacketLink::open(name) {
                Ok(link) => {
                    tracing::info!(interface = %name, "answering ARP and NDP");
                    opened.push(name.clone());
                    tasks.push(tokio::spawn(berth_l2::run_link_with(
                        link,
                        answers_rx.clone(),
                        self.metrics.clone(),
                        LinkOptions {
                            refresh: self.config.gratuitous_interval,
                            until: self.until.clone(),
                            conflicts: Some(conflict_tx.clone()),
                        },
                        stop.clone().cancelled_owned(),
                    )));
                }
                Err(err) => {
                    tracing::warn!(interface = %name, error = %err, "cannot answer on this interface")
                }
            }
        }
        if opened.is_empty() {
            return Err(Error::NoInterface(interfaces.join(",")));
        }
        tasks.push(self.spawn_advertisements(&stop));
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
        let mut up = BTreeSet::new();
        let mut self_live = false;
        let mut conflict_reported: std::collections::BTreeMap<std::net::IpAddr, Instant> =
            std::collections::BTreeMap::new();
        let mut current = Arc::new(Answers::default());
        let mut hold = InterfaceHold::new(INTERFACE_HOLD);
        let mut settle = StartupSettle::new(STARTUP_SETTLE);
        let mut delay = TakeoverDelay::new(TAKEOVER_DELAY).with_handover(HANDOVER_DELAY);
        if live.is_none() {
            // Without liveness there is nothing to converge.
            let now = Instant::now();
            settle.changed(now.checked_sub(STARTUP_SETTLE).unwrap_or(now));
        } else {
            // The first live set may be the empty one the channel starts with (no peer ready
            // yet, this node not either): it counts as arrived.
            settle.changed(Instant::now());
        }
        let mut poll = tokio::time::interval(INTERFACE_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let settle_at = settle.next_check().or(delay.next_due());
            tokio::select! {
                () = stop.cancelled() => break,
                () = wake.notified() => {}
                () = async {
                    match settle_at {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                } => {}
                Some(conflict) = conflicts.recv() => {
                    let now = Instant::now();
                    let due = conflict_reported
                        .get(&conflict.ip)
                        .is_none_or(|at| now.saturating_duration_since(*at) >= CONFLICT_EVENT_EVERY);
                    if due {
                        conflict_reported.insert(conflict.ip, now);
                        let services = current
                            .entry(conflict.ip)
                            .map(|e| e.services.clone())
                            .unwrap_or_default();
                        for service in services {
                            let _ = report_tx.try_send(Report::Conflict(service, conflict.clone()));
                        }
                    }
                    continue;
                }
                _ = poll.tick() => {
                    up = hold.observe(Instant::now(), &opened, &interfaces_up(&opened));
                    let (changed, listed) = {
                        let mut index = lock(&index);
                        (index.set_local_up(up.clone()), index.is_listed())
                    };
                    if !changed {
                        let open = settle.is_open(Instant::now());
                        publish_ready(ready.as_ref(), open && listed && !up.is_empty());
                        continue;
                    }
                }
                changed = async {
                    match &mut live {
                        Some(rx) => rx.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                } => {
                    let Some(rx) = &mut live else { continue };
                    if !changed {
                        tracing::warn!("the live set is gone; keeping the last one");
                        live = None;
                        continue;
                    }
                    let set = rx.borrow_and_update().clone();
                    let now_live = set.contains(&node);
                    if now_live && !self_live {
                        // A planned handover: the peers stop on hearing this node is live.
                        delay.returned(Instant::now());
                    }
                    self_live = now_live;
                    if !lock(&index).set_live(set) {
                        continue;
                    }
                    settle.changed(Instant::now());
                }
            }
            let open = settle.is_open(Instant::now());
            // Ready once settled, listed, and with an interface to answer on: a node whose
            // every announcing interface is down tells its peers it is not live.
            let listed = lock(&index).is_listed();
            publish_ready(ready.as_ref(), open && listed && !up.is_empty());
            if !open {
                continue;
            }
            let next = {
                let mut index = lock(&index);
                if !index.is_listed() {
                    continue;
                }
                let live = index.live_nodes();
                Arc::new(delay.apply(&current, index.answers(), &live, Instant::now()))
            };
            if next == current {
                continue;
            }
            metrics.observe_answers(&next);
            let changes = diff_ownership(&current, &next);
            metrics
                .ownership_changes
                .inc_by((changes.gained.len() + changes.lost.len()) as u64);
            answers_tx.send_replace(next.clone());
            let announced = build_announced(&next);
            records_tx.send_if_modified(|current| {
                if **current == announced {
                    return false;
                }
                *current = Arc::new(announced);
                true
            });
            current = next;
        }
        // The speakers stop with the same token; answers are dropped with them.
        drop(answers_tx);
        for task in tasks {
            let _ = task.await;
        }
        Ok(())
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

/// Records the Event for each taken-over Service, one at a time: there are as many as this
/// node's takeovers, not as Services.
async fn run_reports(
    client: Client,
    node: String,
    mut rx: mpsc::Receiver<Report>,
    stop: CancellationToken,
) {
    let mut seq: u64 = 0;
    loop {
        let next = tokio::select! {
            () = stop.cancelled() => return,
            next = rx.recv() => next,
        };
        let Some(report) = next else {
            return;
        };
        seq += 1;
        let (namespace, name, event) = match report {
            Report::Announcing((namespace, name), ip) => {
                let event = build_announcing_event(&namespace, &name, &node, ip, seq);
                (namespace, name, event)
            }
            Report::Conflict((namespace, name), conflict) => {
                let event = build_conflict_event(&namespace, &name, &node, &conflict, seq);
                (namespace, name, event)
            }
        };
        if let Err(err) = Api::<Event>::namespaced(client.clone(), &namespace)
            .create(&PostParams::default(), &event)
            .await
        {
            tracing::warn!(%namespace, %name, error = %err, "recording the announcing Event failed");
        }
    }
}

/// The Warning Event: another host announced the Service's address, which `node` answers for.
pub fn build_conflict_event(
    namespace: &str,
    name: &str,
    node: &str,
    conflict: &berth_l2::Conflict,
    seq: u64,
) -> Event {
    let mac = conflict
        .mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let mut event = build_announcing_event(namespace, name, node, conflict.ip, seq);
    event.action = Some("Announce".into());
    event.reason = Some(event::ADDRESS_CONFLICT.into());
    event.type_ = Some("Warning".into());
    event.note = Some(format!(
        "another host ({mac}) announces {} on {}, which node {node} answers for: two hosts claim the address",
        conflict.ip, conflict.interface
    ));
    event
}

/// The events.k8s.io/v1 Event "announcing from node X" about a Service.
pub fn build_announcing_event(
    namespace: &str,
    name: &str,
    node: &str,
    ip: std::net::IpAddr,
    seq: u64,
) -> Event {
    let now = Timestamp::now();
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{:x}{seq:x}", now.as_nanosecond())),
            namespace: Some(namespace.to_string()),
            ..ObjectMeta::default()
        },
        action: Some("Announce".into()),
        reason: Some(event::ANNOUNCING.into()),
        note: Some(format!("announcing from node {node} ({ip})")),
        type_: Some("Normal".into()),
        event_time: Some(MicroTime(now)),
        regarding: Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: Some(namespace.to_string()),
            name: Some(name.to_string()),
            ..ObjectReference::default()
        }),
        reporting_controller: Some(event::AGENT_COMPONENT.into()),
        reporting_instance: Some(node.to_string()),
        ..Event::default()
    }
}

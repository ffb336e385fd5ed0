//! The agent: watch tasks feed the [`Index`]; one loop decides when to sync
//! ([`SyncSchedule`]), plans and applies each family's datapath off the async threads, clears
//! stale UDP flows, and keeps the health-check servers and metrics current.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use berth_core::IpFamily;
use berth_datapath::backend::SyncKind;
use berth_datapath::iptables::Iptables;
use berth_datapath::plan::convert::ProxyMode;
use berth_telemetry::{MetricsRegistry, Readiness, ReadinessCheck, SharedRegistry};
use chrono::Utc;
use kube::runtime::watcher;
use kube::Client;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::announce::{Announcer, LiveSet};
use crate::config::AgentConfig;
use crate::config::Backend;
use crate::conntrack::Conntrack;
use crate::datapath::{BoxedNft, FamilyDatapath};
use crate::healthcheck::{
    build_health_check_addresses, build_health_targets, fetch_local_addresses, HealthCheckServers,
    HealthTarget,
};
use crate::index::{Index, Pending};
use crate::metrics::{AgentMetrics, FamilyOutcome};
use crate::schedule::{AgentHealth, SyncSchedule, SyncScope};
use crate::speaker::SpeakerObjects;
use crate::watch::{Feeds, Handlers};
use crate::Error;

/// What the sync loop last did, published for tests and diagnostics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentStatus {
    /// Successful syncs.
    pub syncs: u64,
    pub failures: u64,
    /// Kind of the last successful sync (full when any family's was).
    pub last_kind: Option<SyncKind>,
    pub last_error: Option<String>,
    /// Rules in the berth chains, all families.
    pub rules: usize,
    pub health_check_ports: Vec<u16>,
}

/// The blocking half of a sync: planners, Syncers and conntrack.
struct Engine<I, C> {
    datapaths: Vec<FamilyDatapath<I>>,
    conntrack: C,
}

struct Outcome {
    kind: SyncKind,
    rules: usize,
    /// Each family's own apply, for kube-proxy's per-family metrics.
    families: Vec<FamilyOutcome>,
    error: Option<Error>,
    targets: BTreeMap<u16, HealthTarget>,
    conntrack_failures: u64,
}

/// `err: cause: cause...`, as one log field.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Where health-check node ports listen now (see [`build_health_check_addresses`]); `None`
/// when the node's addresses cannot be read, so they stay where they are.
fn health_check_addresses(
    config: &AgentConfig,
    node: &berth_datapath::NodeInfo,
) -> Option<Vec<std::net::IpAddr>> {
    let wanted = config.node_port_addresses();
    let local = if wanted.cidrs.is_empty() {
        Vec::new()
    } else {
        match fetch_local_addresses() {
            Ok(local) => local,
            Err(err) => {
                tracing::warn!(error = %error_chain(&err), "health-check node ports stay where they are");
                return None;
            }
        }
    };
    Some(build_health_check_addresses(
        wanted,
        config.healthz_bind_address(),
        &local,
        node,
        config.families(),
    ))
}

fn lock(index: &Mutex<Index>) -> std::sync::MutexGuard<'_, Index> {
    index.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<I: Iptables + Send + 'static, C: Conntrack> Engine<I, C> {
    fn sync(&mut self, index: &Mutex<Index>, work: &Pending, scope: SyncScope) -> Outcome {
        // A full sync's peak comes on top of whatever the allocator still holds freed (the
        // initial lists' decoded objects before the first): returned first, so it is not.
        if scope.rewrite {
            crate::memory::release_free_memory();
        }
        let targets = {
            let index = lock(index);
            for datapath in &mut self.datapaths {
                datapath.set_service_cidrs(index.service_cidrs());
                datapath.plan(index.view(), &work.services, scope);
            }
            build_health_targets(index.view())
        };
        let mut kind = SyncKind::Partial;
        let mut rules = 0;
        let mut error = None;
        let mut families = Vec::new();
        for datapath in &mut self.datapaths {
            let began = Instant::now();
            let result = datapath.apply(scope.rewrite, index);
            families.push(FamilyOutcome {
                family: datapath.family_name(),
                backend: datapath.backend_name(),
                seconds: began.elapsed().as_secs_f64(),
                kind: result.as_ref().ok().map(|report| report.kind),
                rules_by_table: datapath.rules_by_table(),
            });
            match result {
                Ok(report) => {
                    rules += report.rule_count;
                    if report.kind == SyncKind::Full {
                        kind = SyncKind::Full;
                    }
                }
                Err(source) => {
                    error.get_or_insert(Error::Sync {
                        family: datapath.family_name(),
                        source,
                    });
                }
            }
        }
        if kind == SyncKind::Full {
            crate::memory::release_free_memory();
        }
        let mut conntrack_failures = 0;
        if error.is_none() {
            for flow in &work.conntrack {
                if let Err(err) = self.conntrack.delete(flow) {
                    tracing::warn!(error = %err, "clearing stale UDP flows failed");
                    conntrack_failures += 1;
                }
            }
        }
        Outcome {
            kind,
            rules,
            families,
            error,
            targets,
            conntrack_failures,
        }
    }
}

pub struct Agent<I, C> {
    config: AgentConfig,
    client: Client,
    engine: Engine<I, C>,
    metrics: AgentMetrics,
    readiness: Readiness,
    datapath_ready: ReadinessCheck,
    status: watch::Sender<AgentStatus>,
    announcer: Option<Announcer>,
    /// Counts successful syncs, for the BGP speaker: it announces only what is programmed.
    synced: watch::Sender<u64>,
}

/// `/healthz` from the sync health and the Node's eligibility, `/livez` from the sync health
/// alone (kube-proxy's meanings since KEP-3836), `/debug/ruleset` (the kernel's
/// ruleset on `backend`, for `berth explain`), the rest from berth-telemetry.
pub fn admin_router(
    registry: SharedRegistry,
    readiness: Readiness,
    health: AgentHealth,
    backend: crate::config::Backend,
    node: String,
) -> Router {
    // One read-back at a time: each runs iptables-save or a netlink dump over the whole table,
    // and the admin port is reachable from the node network.
    let one_at_a_time = Arc::new(tokio::sync::Semaphore::new(1));
    Router::new()
        .route(
            "/debug/ruleset",
            get(move |query| {
                let (node, permit) = (node.clone(), one_at_a_time.clone());
                async move {
                    match permit.try_acquire_owned() {
                        Ok(_held) => crate::ruleset::serve(backend, node, query).await,
                        Err(_) => (
                            StatusCode::TOO_MANY_REQUESTS,
                            "a ruleset read-back is already running\n",
                        )
                            .into_response(),
                    }
                }
            }),
        )
        .route("/healthz", {
            let health = health.clone();
            get(move || {
                let answer = health_answer(health.is_healthy(), health.is_node_eligible());
                async move { answer }
            })
        })
        .route(
            "/livez",
            get(move || {
                let answer = health_answer(health.is_healthy(), true);
                async move { answer }
            }),
        )
        .fallback_service(berth_telemetry::admin_router(registry, readiness))
}

/// `/healthz` (and, with `node_eligible` true, `/livez`): 503 when no sync succeeded within two
/// sync periods, or when the Node is being deleted.
fn health_answer(synced: bool, node_eligible: bool) -> (StatusCode, &'static str) {
    match (synced, node_eligible) {
        (true, true) => (StatusCode::OK, "ok\n"),
        (false, _) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "no datapath sync succeeded within two sync periods\n",
        ),
        (true, false) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the node is being deleted (ToBeDeletedByClusterAutoscaler or deletionTimestamp)\n",
        ),
    }
}

impl<I, C> Agent<I, C>
where
    I: Iptables + Send + 'static,
    C: Conntrack + Send + 'static,
{
    /// Builds the agent on the iptables backend; nothing runs until [`Agent::run`]. `iptables`
    /// gives the iptables of one family; with `--proxy-mode=none` it is never called and
    /// iptables is never touched. berth's nftables tables are left alone: only
    /// [`Agent::with_nft`] knows where they are.
    pub fn new(
        config: AgentConfig,
        client: Client,
        iptables: impl FnMut(IpFamily) -> I,
        conntrack: C,
        registry: &mut MetricsRegistry,
        readiness: &Readiness,
    ) -> Result<Self, Error> {
        Self::build(
            config, client, iptables, None, conntrack, registry, readiness,
        )
    }

    /// Builds the agent on the backend `config` names (resolved: not `Auto`), given the
    /// iptables and the nftables of each family. The backend not chosen has berth's rules
    /// removed before the first sync, so switching backends leaves nothing stale behind.
    pub fn with_nft(
        config: AgentConfig,
        client: Client,
        iptables: impl FnMut(IpFamily) -> I,
        mut nft: impl FnMut(IpFamily) -> BoxedNft,
        conntrack: C,
        registry: &mut MetricsRegistry,
        readiness: &Readiness,
    ) -> Result<Self, Error> {
        Self::build(
            config,
            client,
            iptables,
            Some(&mut nft),
            conntrack,
            registry,
            readiness,
        )
    }

    fn build(
        config: AgentConfig,
        client: Client,
        mut iptables: impl FnMut(IpFamily) -> I,
        mut nft: Option<&mut dyn FnMut(IpFamily) -> BoxedNft>,
        conntrack: C,
        registry: &mut MetricsRegistry,
        readiness: &Readiness,
    ) -> Result<Self, Error> {
        let backend = config.backend();
        if backend == Backend::Auto {
            return Err(Error::InvalidConfig {
                field: "backend",
                reason: "auto must be resolved before the agent is built".into(),
            });
        }
        if backend == Backend::Nftables && nft.is_none() {
            return Err(Error::InvalidConfig {
                field: "backend",
                reason: "the nftables backend needs an nft executor".into(),
            });
        }
        let mut datapaths = Vec::new();
        if config.proxy_mode() != ProxyMode::None {
            for family in config.families() {
                let options = config.plan_options(*family);
                let ipt = iptables(*family);
                let nft = nft.as_mut().map(|nft| nft(*family));
                datapaths.push(match (backend, nft) {
                    (Backend::Nftables, Some(nft)) => {
                        FamilyDatapath::nftables(options, nft, ipt, config.nft_shards())
                    }
                    (_, nft) => FamilyDatapath::new(options, ipt, nft),
                });
            }
        }
        let datapath_ready = readiness.register("datapath").map_err(Error::Telemetry)?;
        let announcer = config.announcer().map(|announcer| {
            Announcer::new(
                config.node_name(),
                announcer,
                client.clone(),
                registry,
                None,
            )
        });
        Ok(Agent {
            config,
            client,
            engine: Engine {
                datapaths,
                conntrack,
            },
            metrics: AgentMetrics::register(registry),
            readiness: readiness.clone(),
            datapath_ready,
            status: watch::channel(AgentStatus::default()).0,
            announcer,
            synced: watch::channel(0).0,
        })
    }

    /// Gives the announcer the membership's live set; without one every Node counts as live.
    pub fn set_live_nodes(&mut self, live: LiveSet) {
        if let Some(announcer) = self.announcer.take() {
            self.announcer = Some(announcer.with_live(live));
        }
    }

    /// Gives the announcer until when it may answer, and where to say it is ready to.
    pub fn set_answer_gate(
        &mut self,
        until: watch::Receiver<berth_membership::AnswerUntil>,
        ready: watch::Sender<bool>,
    ) {
        if let Some(announcer) = self.announcer.take() {
            self.announcer = Some(announcer.with_answer_gate(until, ready));
        }
    }

    pub fn status(&self) -> watch::Receiver<AgentStatus> {
        self.status.subscribe()
    }

    pub fn metrics(&self) -> &AgentMetrics {
        &self.metrics
    }

    /// Feeds the datapath's index from the agent's shared watches; ServiceCIDRs only when the
    /// cluster serves them (else the index keeps `--service-cidr`).
    fn subscribe(
        feeds: &mut Feeds,
        index: &Arc<Mutex<Index>>,
        wake: &Arc<Notify>,
        service_cidrs: bool,
    ) {
        if service_cidrs {
            feeds.service_cidrs.feed(
                index,
                wake,
                Handlers {
                    kind: "ServiceCIDR",
                    apply: Index::apply_service_cidr,
                    delete: Index::delete_service_cidr,
                    begin: Index::begin_service_cidrs,
                    finish: Index::finish_service_cidrs,
                },
            );
        }
        feeds.services.feed(
            index,
            wake,
            Handlers {
                kind: "Service",
                apply: Index::apply_service,
                delete: Index::delete_service,
                begin: Index::begin_services,
                finish: Index::finish_services,
            },
        );
        feeds.slices.feed(
            index,
            wake,
            Handlers {
                kind: "EndpointSlice",
                apply: Index::apply_slice,
                delete: Index::delete_slice,
                begin: Index::begin_slices,
                finish: Index::finish_slices,
            },
        );
        // Other nodes' objects, when the announcer has them watched, are ignored.
        feeds.nodes.feed(
            index,
            wake,
            Handlers {
                kind: "Node",
                apply: Index::apply_node,
                delete: Index::delete_node,
                begin: Index::begin_node,
                finish: Index::finish_node,
            },
        );
    }

    /// One watch per kind, whatever reads it: the datapath, the announcer, the BGP speaker.
    fn spawn_watches(
        &self,
        index: &Arc<Mutex<Index>>,
        wake: &Arc<Notify>,
        speaker: Option<&SpeakerObjects>,
        service_cidrs: bool,
        stop: &CancellationToken,
    ) -> Vec<JoinHandle<()>> {
        let mut feeds = Feeds::new();
        if !service_cidrs {
            tracing::info!(cidrs = ?self.config.service_cidrs(), "ServiceCIDRs not watched; --service-cidr holds");
        }
        Self::subscribe(&mut feeds, index, wake, service_cidrs);
        match &self.announcer {
            Some(announcer) => announcer.subscribe(&mut feeds),
            // Nothing else reads Nodes: watch this node's alone.
            None => feeds.nodes.set_config(
                watcher::Config::default()
                    .fields(&format!("metadata.name={}", self.config.node_name())),
            ),
        }
        if let Some(speaker) = speaker {
            speaker.subscribe(&mut feeds);
        }
        feeds.spawn(&self.client, stop)
    }

    /// Runs until `shutdown` resolves, serving the admin endpoint on `admin`. Stopping leaves the
    /// programmed rules in place.
    pub async fn run(
        mut self,
        admin: TcpListener,
        registry: SharedRegistry,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        let health = AgentHealth::new(self.config.sync_period(), Instant::now());
        let stop = CancellationToken::new();
        let on_shutdown = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = shutdown => on_shutdown.cancel(),
                () = on_shutdown.cancelled() => {}
            }
        });
        let index = Arc::new(Mutex::new(
            Index::new(
                self.config.node_name(),
                self.config.proxy_mode(),
                Utc::now(),
            )
            .with_policy(self.config.service_policy())
            .with_node_port_range(self.config.node_port_range())
            .with_service_cidrs(self.config.service_cidrs().to_vec())
            .with_node_eligibility(health.node_eligibility()),
        ));
        let wake = Arc::new(Notify::new());
        let speaker_objects = self.config.speaker().map(|_| SpeakerObjects::default());
        // Without a datapath nothing reads them.
        let client = self.client.clone();
        let service_cidrs =
            !self.engine.datapaths.is_empty() && crate::watch::service_cidrs_served(&client).await;
        let watches = self.spawn_watches(
            &index,
            &wake,
            speaker_objects.as_ref(),
            service_cidrs,
            &stop,
        );
        let announcer = self.announcer.take().map(|announcer| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let result = announcer.run(stop).await;
                if let Err(err) = &result {
                    tracing::error!(error = %error_chain(err), "the L2 announcer stopped");
                }
                result
            })
        });
        let speaker = self
            .config
            .speaker()
            .zip(speaker_objects)
            .map(|(config, objects)| {
                let task = crate::speaker::run_speaker(
                    config,
                    self.client.clone(),
                    objects,
                    index.clone(),
                    self.synced.subscribe(),
                    stop.clone(),
                );
                let stop = stop.clone();
                tokio::spawn(async move {
                    let result = task.await;
                    if let Err(err) = &result {
                        tracing::error!(error = %error_chain(err), "the BGP speaker stopped");
                        // Without the speaker nothing is announced: stop rather than run half.
                        stop.cancel();
                    }
                    result
                })
            });
        let router = admin_router(
            registry,
            self.readiness.clone(),
            health.clone(),
            self.config.backend(),
            self.config.node_name().to_owned(),
        );
        let admin_task = tokio::spawn(berth_telemetry::serve_admin(
            admin,
            router,
            stop.clone().cancelled_owned(),
        ));
        let mut servers =
            HealthCheckServers::new(self.config.healthz_bind_address(), health.clone());
        let result = self
            .sync_loop(&index, &wake, &stop, &health, &mut servers)
            .await;
        servers.stop_all().await;
        stop.cancel();
        for task in watches {
            let _ = task.await;
        }
        let announced = match announcer {
            Some(task) => task.await.map_err(|err| Error::Task(err.to_string()))?,
            None => Ok(()),
        };
        let spoken = match speaker {
            Some(task) => task.await.map_err(|err| Error::Task(err.to_string()))?,
            None => Ok(()),
        };
        let admin_result = admin_task
            .await
            .map_err(|err| Error::Task(err.to_string()))?;
        tracing::info!("agent stopped; the programmed rules stay in place");
        result?;
        announced?;
        spoken?;
        admin_result.map_err(Error::Admin)
    }

    async fn sync_loop(
        self,
        index: &Arc<Mutex<Index>>,
        wake: &Notify,
        stop: &CancellationToken,
        health: &AgentHealth,
        servers: &mut HealthCheckServers,
    ) -> Result<(), Error> {
        let Agent {
            config,
            client: _,
            engine,
            metrics,
            readiness: _,
            datapath_ready,
            status,
            announcer: _,
            synced,
        } = self;
        let mut schedule = SyncSchedule::new(config.min_sync_interval(), config.sync_period());
        let mut carried = Pending::default();
        let mut engine = Some(engine);
        loop {
            let (listed, pending) = {
                let index = lock(index);
                (
                    index.is_listed(),
                    index.has_pending() || !carried.is_empty(),
                )
            };
            if !listed {
                tokio::select! {
                    () = stop.cancelled() => return Ok(()),
                    () = wake.notified() => continue,
                }
            }
            let (at, reason) = schedule.next_sync(Instant::now(), pending);
            tokio::select! {
                biased;
                () = stop.cancelled() => return Ok(()),
                () = tokio::time::sleep_until(at.into()) => {}
                () = wake.notified(), if !pending => continue,
            }
            let mut work = std::mem::take(&mut carried);
            work.merge(lock(index).take_pending());
            let Some(mut running) = engine.take() else {
                return Err(Error::Task("the datapath engine was lost".into()));
            };
            let shared = index.clone();
            // `record` derives the scope again from the same instant, so both agree.
            let began = Instant::now();
            let scope = schedule.scope(reason, began);
            let (running, work, outcome) = tokio::task::spawn_blocking(move || {
                let outcome = running.sync(&shared, &work, scope);
                (running, work, outcome)
            })
            .await
            .map_err(|err| Error::Task(err.to_string()))?;
            engine = Some(running);
            let elapsed = began.elapsed();
            let was_failing = schedule.failures() > 0;
            schedule.record(began, elapsed, reason, outcome.error.is_none());
            metrics
                .conntrack_failures
                .inc_by(outcome.conntrack_failures);
            let now = Utc::now();
            for family in &outcome.families {
                metrics.kube_proxy.observe_family(family, now);
            }
            match outcome.error {
                None => {
                    health.record_success(Instant::now());
                    datapath_ready.set_ready(true);
                    metrics.observe_sync(outcome.kind, elapsed.as_secs_f64());
                    metrics
                        .rules
                        .set(i64::try_from(outcome.rules).unwrap_or(i64::MAX));
                    for trigger in &work.triggers {
                        let latency = (now - *trigger).to_std().unwrap_or_default();
                        metrics.network_programming.observe(latency.as_secs_f64());
                        for family in &outcome.families {
                            metrics
                                .kube_proxy
                                .observe_network_programming(family.family, latency.as_secs_f64());
                        }
                    }
                    if was_failing || status.borrow().syncs == 0 {
                        tracing::info!(
                            kind = ?outcome.kind,
                            rules = outcome.rules,
                            ms = elapsed.as_millis(),
                            "datapath in sync"
                        );
                    }
                    tracing::debug!(
                        ?reason,
                        kind = ?outcome.kind,
                        services = work.services.len(),
                        rules = outcome.rules,
                        ms = elapsed.as_millis(),
                        "datapath synced"
                    );
                    synced.send_modify(|n| *n += 1);
                    status.send_modify(|s| {
                        s.syncs += 1;
                        s.last_kind = Some(outcome.kind);
                        s.last_error = None;
                        s.rules = outcome.rules;
                    });
                }
                Some(err) => {
                    metrics.restore_failures.inc();
                    let message = error_chain(&err);
                    tracing::warn!(
                        error = %message,
                        category = err.category(),
                        retryable = err.is_retryable(),
                        retry_in = ?schedule.backoff(),
                        "datapath sync failed; the next one is full"
                    );
                    // Trigger times and stale flows still wait for a successful sync.
                    carried = work;
                    status.send_modify(|s| {
                        s.failures += 1;
                        s.last_error = Some(message);
                    });
                }
            }
            let node = lock(index).view().node.clone();
            if let Some(addresses) = health_check_addresses(&config, &node) {
                servers.set_addresses(addresses).await;
            }
            servers.update(&outcome.targets).await;
            let ports = servers.ports();
            metrics
                .health_check_servers
                .set(i64::try_from(ports.len()).unwrap_or(i64::MAX));
            status.send_if_modified(|s| {
                let changed = s.health_check_ports != ports;
                s.health_check_ports = ports;
                changed
            });
        }
    }
}

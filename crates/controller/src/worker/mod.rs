//! The one task that owns the allocators (single writer). It watches Services, IPPools,
//! Namespaces and Nodes (`watch`); adopts every existing value oldest-first once all four are
//! listed; then decides dirty Services one at a time (`queue` says which) and hands their writes
//! to a bounded set of concurrent jobs. A Service never has two jobs at once, so its writes
//! stay in order.

mod held;
mod pool_status;
mod queue;
mod watch;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use berth_api::names::condition::reason;
use berth_api::{IPPool, IPPoolStatus};
use berth_core::Labels;
use berth_ipam::ServiceKey;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::Client;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::apply::{
    self, build_conditions, build_spec_patch, ingress_differs, JobOutcome, Write, WriteCtx,
    WriteJob,
};
use crate::config::ControllerConfig;
use crate::facts::{read_service, LbClass};
use crate::fresh::{compute_fresh, Holding};
use crate::metrics::{Metrics, ReconcileTimer};
use crate::plan::{adopt_all, plan_service, Allocators};
use crate::pools::build_pool_specs;
use crate::provider::eligible_nodes;
use crate::service_feed::ServiceFeedSender;
use crate::Error;
use held::Unwritten;
use queue::Queue;
use watch::{name_of, Cache};

enum Done {
    Service(ServiceKey, JobOutcome, Option<apply::WrittenSpec>),
    /// A deleted Service's provider cleanup finished.
    Deleted(ServiceKey, Result<(), String>),
    Pool(String, Result<IPPoolStatus, &'static str>),
}

const POOL_STATUS_DELAY: Duration = Duration::from_millis(200);
/// How long the end of a term waits for its writes without leader election.
const FINISH_WRITES_LIMIT: Duration = Duration::from_secs(10);

pub(crate) struct Worker {
    cfg: ControllerConfig,
    metrics: Metrics,
    client: Client,
    ctx: Arc<WriteCtx>,
    alloc: Allocators,
    services: HashMap<ServiceKey, Arc<Service>>,
    svc_buffer: Option<HashMap<ServiceKey, Arc<Service>>>,
    svc_synced: bool,
    pools: Cache<IPPool>,
    pool_problems: BTreeMap<String, String>,
    namespaces: Cache<Namespace>,
    nodes: Cache<Node>,
    started: bool,
    queue: Queue,
    failed: HashSet<ServiceKey>,
    /// Services whose LoadBalancer addresses stay held until the write clearing their
    /// status has landed (see `withhold_until_cleared`).
    clearing: HashSet<ServiceKey>,
    /// Services whose spec write drops values their type no longer uses (node ports, an
    /// ExternalName Service's ClusterIPs): decided again once it lands, which frees them
    /// (the write's echo alone would not be decided).
    dropping: HashSet<ServiceKey>,
    /// What the decision behind each job in flight newly gave its Service; kept in
    /// `refused` when the write naming it is refused.
    fresh: HashMap<ServiceKey, Unwritten>,
    /// What refused writes would have named: held until the Service is decided again from a
    /// newer version, which lets go of what that version does not name (see `settle_refused`).
    refused: HashMap<ServiceKey, Unwritten>,
    pool_status_due: Option<Instant>,
    pools_in_flight: HashSet<String>,
    jobs: FuturesUnordered<BoxFuture<'static, Done>>,
    /// Service write jobs among `jobs` (the rest are provider cleanups and pool statuses).
    service_jobs: usize,
    on_started: Box<dyn FnMut() + Send>,
    /// The endpoints controller's view of the Services, when it runs: every watch event is
    /// passed on with the same shared objects, so the Services are watched and held once.
    service_feed: Option<ServiceFeedSender>,
}

impl Worker {
    pub(crate) fn new(
        cfg: ControllerConfig,
        metrics: Metrics,
        client: Client,
        ctx: Arc<WriteCtx>,
        on_started: Box<dyn FnMut() + Send>,
    ) -> Result<Self, Error> {
        let alloc = Allocators::new(&cfg.service_cidrs, cfg.node_port_range, cfg.seed)?;
        Ok(Self {
            cfg,
            metrics,
            client,
            ctx,
            alloc,
            services: HashMap::new(),
            svc_buffer: None,
            svc_synced: false,
            pools: Cache::default(),
            pool_problems: BTreeMap::new(),
            namespaces: Cache::default(),
            nodes: Cache::default(),
            started: false,
            queue: Queue::default(),
            failed: HashSet::new(),
            clearing: HashSet::new(),
            dropping: HashSet::new(),
            fresh: HashMap::new(),
            refused: HashMap::new(),
            pool_status_due: None,
            pools_in_flight: HashSet::new(),
            jobs: FuturesUnordered::new(),
            service_jobs: 0,
            service_feed: None,
            on_started,
        })
    }

    /// Passes every Service watch event on to the endpoints controller of this term.
    pub(crate) fn feed_services(&mut self, feed: ServiceFeedSender) {
        self.service_feed = Some(feed);
    }

    /// Runs until `token` is cancelled, then lets the writes already sent finish (see
    /// `finish_writes`).
    pub(crate) async fn run(mut self, token: CancellationToken) {
        let mut inputs = self.inputs();
        loop {
            self.pump();
            let next_retry = self.queue.next_retry();
            let pool_due = self.pool_status_due;
            // Unbiased: with jobs preferred, a steady stream of finished jobs (Services whose
            // writes keep conflicting with newer versions) starved the watches that would
            // deliver those newer versions, and the loop spun on a stale cache for good.
            tokio::select! {
                _ = token.cancelled() => break,
                Some(done) = self.jobs.next(), if !self.jobs.is_empty() => self.on_done(done),
                input = inputs.next() => match input {
                    Some(input) => self.on_input(input),
                    None => break,
                },
                _ = sleep_until(next_retry), if next_retry.is_some() => {
                    self.queue.due(Instant::now());
                }
                _ = sleep_until(pool_due), if pool_due.is_some() => self.write_pool_statuses(),
            }
        }
        self.finish_writes().await;
    }

    /// Waits for the jobs in flight when the term ends: a write already sent lands whether
    /// its job is dropped or not, and dropped, it could land after the next term of this
    /// replica (leadership lost, then regained at the next renewal) has listed, naming a
    /// value that term hands out again. A job starts no further write unless this replica
    /// leads (again). At most a lease duration: by then a standby may have taken over anyway.
    async fn finish_writes(&mut self) {
        if self.jobs.is_empty() {
            return;
        }
        let limit = self
            .cfg
            .lease
            .as_ref()
            .map_or(FINISH_WRITES_LIMIT, |l| l.lease_duration);
        let jobs = self.jobs.len();
        let drain = async { while self.jobs.next().await.is_some() {} };
        if tokio::time::timeout(limit, drain).await.is_err() {
            tracing::warn!(
                jobs,
                ?limit,
                "writes still in flight when the term ended; left behind"
            );
        }
    }

    fn maybe_start(&mut self) {
        if self.started
            || !(self.svc_synced
                && self.pools.synced
                && self.namespaces.synced
                && self.nodes.synced)
        {
            return;
        }
        self.apply_pool_specs();
        let labels: HashMap<String, Labels> = self.namespace_labels();
        let empty = Labels::new();
        let facts: Vec<_> = self
            .services
            .values()
            .map(|s| read_service(s, self.cfg.default_class))
            .collect();
        let refused = adopt_all(
            &mut self.alloc,
            facts
                .iter()
                .map(|f| (f, labels.get(&f.key.namespace).unwrap_or(&empty))),
        );
        for (key, e) in &refused {
            self.metrics.conflicts.inc();
            tracing::warn!(service = %key, error = %e, "conflicting value on an existing Service; the older Service keeps it");
        }
        self.started = true;
        tracing::info!(
            services = self.services.len(),
            pools = self.pools.objects.len(),
            conflicts = refused.len(),
            "adopted existing allocations"
        );
        let mut keys: Vec<ServiceKey> = self.services.keys().cloned().collect();
        keys.sort();
        for k in keys {
            self.queue.mark(k);
        }
        self.schedule_pool_status();
        (self.on_started)();
    }

    fn namespace_labels(&self) -> HashMap<String, Labels> {
        self.namespaces
            .objects
            .iter()
            .map(|(n, ns)| (n.clone(), ns.metadata.labels.clone().unwrap_or_default()))
            .collect()
    }

    /// The labels of one namespace (none while it is unknown).
    fn labels_of_namespace(&self, namespace: &str) -> Labels {
        self.namespaces
            .objects
            .get(namespace)
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default()
    }

    fn apply_pool_specs(&mut self) {
        let pools: Vec<IPPool> = self.pools.objects.values().cloned().collect();
        let (specs, problems) = build_pool_specs(&pools);
        self.pool_problems = problems;
        match self.alloc.lb.set_pools(specs) {
            Ok(orphans) => {
                for o in orphans {
                    tracing::info!(service = %o.owner, ip = %o.ip, "address left every pool; the Service gets a new one");
                }
            }
            Err(e) => {
                self.metrics.error("config");
                tracing::warn!(error = %e, "IPPools not installed; keeping the previous ones");
            }
        }
    }

    fn apply_pools(&mut self) {
        self.apply_pool_specs();
        self.mark_lb_services();
        self.schedule_pool_status();
    }

    /// LoadBalancer Services, and Services still showing an ingress, decide again.
    fn mark_lb_services(&mut self) {
        let keys: Vec<ServiceKey> = self
            .services
            .iter()
            .filter(|(_, s)| {
                s.spec.as_ref().and_then(|sp| sp.type_.as_deref()) == Some("LoadBalancer")
                    || s.status
                        .as_ref()
                        .and_then(|st| st.load_balancer.as_ref())
                        .is_some_and(|lb| lb.ingress.as_ref().is_some_and(|i| !i.is_empty()))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            self.queue.mark(k);
        }
    }

    fn schedule_pool_status(&mut self) {
        if self.pool_status_due.is_none() {
            self.pool_status_due = Some(Instant::now() + POOL_STATUS_DELAY);
        }
    }

    /// Decides dirty Services while there is room for their writes.
    fn pump(&mut self) {
        if !self.started {
            return;
        }
        while self.service_jobs < self.cfg.max_in_flight {
            let Some(key) = self.queue.pop() else {
                break;
            };
            self.decide(key);
        }
    }

    fn decide(&mut self, key: ServiceKey) {
        let Some(svc) = self.services.get(&key).cloned() else {
            return;
        };
        let span = tracing::info_span!("reconcile", namespace = %key.namespace, name = %key.name);
        let _enter = span.enter();
        let metrics = self.metrics.clone();
        let timer = ReconcileTimer::start(&metrics, "service");
        let facts = read_service(&svc, self.cfg.default_class);
        let labels = self.labels_of_namespace(&key.namespace);
        let carried = self.settle_refused(&key, &svc, &facts);
        let before = Holding::of(&self.alloc, &key);
        let out = plan_service(&mut self.alloc, &facts, &labels);
        if self.alloc.lb.ips_of(&key) != before.lb_ips {
            self.schedule_pool_status();
        }
        let failure = match &out.result {
            Some(Err(f)) => {
                self.metrics
                    .allocations
                    .get_or_create(&vec![("result", "failed")])
                    .inc();
                if f.reason == reason::IP_ALREADY_ALLOCATED
                    || f.reason == reason::PORT_ALREADY_ALLOCATED
                {
                    self.metrics.conflicts.inc();
                }
                self.failed.insert(key.clone());
                Some(f.message.clone())
            }
            Some(Ok(())) => {
                self.metrics
                    .allocations
                    .get_or_create(&vec![("result", "ok")])
                    .inc();
                self.failed.remove(&key);
                None
            }
            None => {
                self.failed.remove(&key);
                None
            }
        };
        if before.any_released(&self.alloc, &key) {
            self.wake_waiting(Some(&key));
        }
        let conditions = build_conditions(&svc, &out, apply::now());
        let ingress = out.ingress.clone().filter(|ips| ingress_differs(&svc, ips));
        self.withhold_until_cleared(&key, &facts, &labels, &before.lb_ips, ingress.as_ref());
        let nodes = if ingress.is_some() && facts.lb_class != LbClass::None {
            eligible_nodes(&self.nodes.objects)
        } else {
            Vec::new()
        };
        if out.fill.drop_node_ports
            || out.fill.drop_health_check_node_port
            || out.fill.drop_cluster_ips
        {
            self.dropping.insert(key.clone());
        }
        let job = WriteJob {
            key: key.clone(),
            spec_patch: build_spec_patch(&svc, &out.fill),
            // A failure is announced once, when the condition says so for the first time.
            failure: failure.filter(|_| conditions.is_some()),
            conditions,
            ingress,
            nodes,
            new_lb_ips: out.new_lb_ips.clone(),
            svc,
        };
        drop(timer);
        if job.is_empty() {
            tracing::debug!("nothing to write");
            self.queue.settled(&key);
            self.hold_refused(&key, job.svc.metadata.resource_version.clone(), carried);
            return;
        }
        tracing::info!(
            spec = job.spec_patch.is_some(),
            status = job.conditions.is_some() || job.ingress.is_some(),
            "writing allocation"
        );
        let mut fresh = compute_fresh(&before, &facts, &out.fill, job.ingress.as_deref());
        fresh.merge(carried);
        if !fresh.is_empty() {
            let version = job.svc.metadata.resource_version.clone();
            self.fresh.insert(key.clone(), Unwritten { version, fresh });
        }
        self.queue.started(key);
        self.service_jobs += 1;
        let ctx = self.ctx.clone();
        self.jobs.push(
            apply::run_job(ctx, job)
                .map(|(k, o, w)| Done::Service(k, o, w))
                .instrument(span.clone())
                .boxed(),
        );
    }

    fn on_done(&mut self, done: Done) {
        match done {
            Done::Service(key, outcome, written) => {
                self.service_jobs = self.service_jobs.saturating_sub(1);
                // The version a status write carried when the spec write before it landed.
                let spec_version = written
                    .as_ref()
                    .and_then(|w| w.svc.metadata.resource_version.clone());
                if let Some(w) = written {
                    self.remember_written(&key, w);
                }
                let landed = matches!(outcome, JobOutcome::Done { .. });
                if landed {
                    self.release_cleared(&key);
                }
                let fresh = self.fresh.remove(&key);
                if let (JobOutcome::Rejected { write }, Some(u)) = (&outcome, fresh) {
                    let version = match write {
                        Write::Status => spec_version.or(u.version),
                        Write::Spec => u.version,
                    };
                    self.hold_refused(&key, version, u.fresh.unwritten(*write));
                }
                if let Some(category) = self.queue.finished(&key, outcome, Instant::now()) {
                    self.metrics.error(category);
                }
                // Any other outcome decides again by itself.
                if self.dropping.remove(&key) && landed {
                    self.queue.mark(key);
                }
            }
            Done::Deleted(key, result) => {
                if let Err(e) = result {
                    self.metrics.error("provider");
                    tracing::warn!(service = %key, error = %e, "load balancer cleanup failed");
                }
            }
            Done::Pool(name, result) => {
                self.pools_in_flight.remove(&name);
                match result {
                    Ok(status) => {
                        if let Some(p) = self.pools.objects.get_mut(&name) {
                            p.status = Some(status);
                        }
                    }
                    Err(category) => {
                        self.metrics.error(category);
                        self.schedule_pool_status();
                    }
                }
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => futures::future::pending().await,
    }
}

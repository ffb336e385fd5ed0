//! The I/O loop around the allocation state machine: the four watches feed `observe`, the
//! writes `decide` returns run as a bounded set of concurrent jobs whose outcomes feed `done`,
//! and timers bring retries and pool status writes due. A Service never has two jobs at once,
//! so its writes stay in order.

use std::sync::Arc;
use std::time::Duration;

use berth_api::{IPPool, IPPoolStatus};
use berth_ipam::ServiceKey;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use kube::api::{Api, Patch};
use kube::Client;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::apply::{self, writer_params, WriteCtx};
use super::pool_status::PoolStatusWrite;
use super::state::{AllocationState, Observed};
use super::watch::{service_cidrs_served, watch_all, Input};
use super::write::{JobOutcome, WrittenSpec};
use crate::config::ControllerConfig;
use crate::error::ErrorCategory;
use crate::events::EventType;
use crate::metrics::Metrics;
use crate::service_feed::{map_event, ServiceFeedSender};
use crate::Error;
use berth_api::names::event as ev;
use kube::Resource;

enum Done {
    Service(ServiceKey, JobOutcome, Option<WrittenSpec>),
    /// A deleted Service's provider cleanup finished.
    Deleted(ServiceKey, Result<(), String>),
    Pool(String, Result<IPPoolStatus, ErrorCategory>),
}

const POOL_STATUS_DELAY: Duration = Duration::from_millis(200);
/// How long the end of a term waits for its writes without leader election.
const FINISH_WRITES_LIMIT: Duration = Duration::from_secs(10);

pub(crate) struct Worker {
    cfg: ControllerConfig,
    metrics: Metrics,
    client: Client,
    ctx: Arc<WriteCtx>,
    state: AllocationState,
    pool_status_due: Option<Instant>,
    /// The next periodic resync.
    resync_due: Instant,
    jobs: FuturesUnordered<BoxFuture<'static, Done>>,
    on_started: Box<dyn FnMut() + Send>,
    /// The endpoints controller's view of the Services, when it runs: every watch event is
    /// passed on with the same shared objects, so the Services are watched and held once.
    service_feeds: Vec<ServiceFeedSender>,
}

impl Worker {
    pub(crate) fn new(
        cfg: ControllerConfig,
        metrics: Metrics,
        client: Client,
        ctx: Arc<WriteCtx>,
        on_started: Box<dyn FnMut() + Send>,
    ) -> Result<Self, Error> {
        let state = AllocationState::new(&cfg, metrics.clone())?;
        let resync_due = Instant::now() + cfg.resync_period;
        Ok(Self {
            resync_due,
            cfg,
            metrics,
            client,
            ctx,
            state,
            pool_status_due: None,
            jobs: FuturesUnordered::new(),
            service_feeds: Vec::new(),
            on_started,
        })
    }

    /// Passes every Service watch event on to another consumer of this term (the endpoints
    /// controller, the datapath report).
    pub(crate) fn feed_services(&mut self, feed: ServiceFeedSender) {
        self.service_feeds.push(feed);
    }

    /// Runs until `token` is cancelled, then lets the writes already sent finish (see
    /// `finish_writes`).
    pub(crate) async fn run(mut self, token: CancellationToken) {
        let service_cidrs = tokio::select! {
            _ = token.cancelled() => return,
            served = service_cidrs_served(&self.client) => served,
        };
        if service_cidrs {
            self.state.watch_service_cidrs();
        } else {
            tracing::info!(cidrs = ?self.cfg.service_cidrs, "ServiceCIDRs not served; --service-cidr holds");
        }
        let mut inputs = watch_all(&self.client, service_cidrs);
        loop {
            self.pump();
            let next_retry = self.state.next_retry().map(Instant::from_std);
            let pool_due = self.pool_status_due;
            let grace_due = self.state.next_deadline().map(instant_of);
            let resync_due = self.resync_due;
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
                    self.state.due(Instant::now().into_std());
                }
                _ = sleep_until(pool_due), if pool_due.is_some() => self.write_pool_statuses(),
                _ = sleep_until(grace_due), if grace_due.is_some() => {
                    self.state.deadlines_due(&apply::now());
                }
                _ = tokio::time::sleep_until(resync_due) => {
                    self.resync_due = Instant::now() + self.cfg.resync_period;
                    self.state.resync();
                }
            }
            self.after_step();
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

    fn on_input(&mut self, input: Input) {
        let was_started = self.state.started();
        let observed = match input {
            Input::Svc(r) => (*r).map(|e| {
                let event = map_event(e, |s| Arc::new(super::cache::trim(s)));
                for feed in &self.service_feeds {
                    // Gone only when its consumer has stopped, which ends the term.
                    let _ = feed.send(event.clone());
                }
                Observed::Service(event)
            }),
            Input::Pool(r) => (*r).map(Observed::Pool),
            Input::Ns(r) => (*r).map(Observed::Namespace),
            Input::Node(r) => (*r).map(Observed::Node),
            Input::Cidr(r) => (*r).map(Observed::ServiceCidr),
        };
        match observed {
            Ok(o) => self.state.observe(o),
            Err(e) => {
                self.metrics.error(ErrorCategory::Watch);
                tracing::warn!(error = %e, "watch failed; retrying");
            }
        }
        if !was_started && self.state.started() {
            (self.on_started)();
        }
    }

    /// Turns what the state machine asked for into timers and jobs.
    fn after_step(&mut self) {
        if self.state.take_pool_status_wanted() && self.pool_status_due.is_none() {
            self.pool_status_due = Some(Instant::now() + POOL_STATUS_DELAY);
        }
        for key in self.state.take_cleanups() {
            let provider = self.ctx.provider.clone();
            // Providers with outside state clean up; the Service itself is gone.
            self.jobs.push(
                async move {
                    let result = provider.delete(&key).await.map_err(|e| e.to_string());
                    Done::Deleted(key, result)
                }
                .boxed(),
            );
        }
    }

    /// Starts the writes of dirty Services while there is room for them.
    fn pump(&mut self) {
        let now = apply::now();
        while let Some(job) = self.state.decide(&now) {
            let span = tracing::info_span!("reconcile", namespace = %job.key.namespace, name = %job.key.name);
            let ctx = self.ctx.clone();
            self.jobs.push(
                apply::run_job(ctx, job)
                    .map(|(k, o, w)| Done::Service(k, o, w))
                    .instrument(span)
                    .boxed(),
            );
        }
        self.after_step();
    }

    fn on_done(&mut self, done: Done) {
        match done {
            Done::Service(key, outcome, written) => {
                self.state
                    .done(key, outcome, written, Instant::now().into_std());
            }
            Done::Deleted(key, result) => {
                if let Err(e) = result {
                    self.metrics.error(ErrorCategory::Provider);
                    tracing::warn!(service = %key, error = %e, "load balancer cleanup failed");
                }
            }
            Done::Pool(name, result) => self.state.pool_status_done(&name, result),
        }
    }

    fn write_pool_statuses(&mut self) {
        self.pool_status_due = None;
        for write in self.state.pool_status_writes(&apply::now()) {
            let PoolStatusWrite {
                pool: name,
                status,
                collision_event,
                object,
            } = write;
            let api: Api<IPPool> = Api::all(self.client.clone());
            let ctx = self.ctx.clone();
            self.jobs.push(
                async move {
                    if !*ctx.leading.borrow() {
                        return Done::Pool(name, Err(ErrorCategory::NotLeading));
                    }
                    ctx.metrics.write("pool_status");
                    let patch = serde_json::json!({ "status": status });
                    let result = api
                        .patch_status(&name, &writer_params(), &Patch::Merge(&patch))
                        .await
                        .map(|_| status)
                        .map_err(|e| ErrorCategory::of_api(&e));
                    // Recorded once the status says the same, so a failed write that is
                    // tried again does not repeat it.
                    if let (Ok(_), Some(note)) = (&result, collision_event) {
                        let regarding = Arc::new(object.object_ref(&()));
                        ctx.event(
                            &regarding,
                            EventType::Warning,
                            ev::POOL_OVERLAPS_CLUSTER,
                            note,
                        )
                        .await;
                    }
                    Done::Pool(name, result)
                }
                .boxed(),
            );
        }
    }
}

/// The monotonic instant of a wall-clock time (now, when it has passed).
fn instant_of(at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> Instant {
    let wait = at.0.duration_since(apply::now().0);
    Instant::now() + Duration::try_from(wait).unwrap_or(Duration::ZERO)
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => futures::future::pending().await,
    }
}

//! The one task that owns the allocators (single writer). It watches Services, IPPools,
//! Namespaces and Nodes; adopts every existing value oldest-first once all four are listed;
//! then decides dirty Services one at a time and hands their writes to a bounded set of
//! concurrent jobs. A Service never has two jobs at once, so its writes stay in order.

mod pool_status;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use berth_api::names::condition::reason;
use berth_api::{IPPool, IPPoolStatus};
use berth_ipam::{Labels, ServiceKey};
use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, FuturesUnordered};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::apply::{
    self, build_conditions, build_spec_patch, ingress_differs, JobOutcome, WriteCtx, WriteJob,
};
use crate::config::ControllerConfig;
use crate::facts::{read_service, LbClass};
use crate::metrics::{Metrics, ReconcileTimer};
use crate::plan::{adopt_all, plan_service, Allocators};
use crate::pools::build_pool_specs;
use crate::provider::eligible_nodes;
use crate::Error;

// Boxed: a Node or Namespace event is far larger than the others, and events are moved
// through the merged stream one by one.
enum Input {
    Svc(Box<Result<watcher::Event<Service>, watcher::Error>>),
    Pool(Box<Result<watcher::Event<IPPool>, watcher::Error>>),
    Ns(Box<Result<watcher::Event<Namespace>, watcher::Error>>),
    Node(Box<Result<watcher::Event<Node>, watcher::Error>>),
}

enum Done {
    Service(ServiceKey, JobOutcome, Option<apply::WrittenSpec>),
    /// A deleted Service's provider cleanup finished.
    Deleted(ServiceKey, Result<(), String>),
    Pool(String, Result<IPPoolStatus, &'static str>),
}

/// A watched kind's objects and its relist buffer.
struct Cache<K> {
    objects: BTreeMap<String, K>,
    buffer: Option<BTreeMap<String, K>>,
    synced: bool,
}

impl<K> Default for Cache<K> {
    fn default() -> Self {
        Self {
            objects: BTreeMap::new(),
            buffer: None,
            synced: false,
        }
    }
}

fn name_of<K: kube::Resource>(obj: &K) -> String {
    obj.meta().name.clone().unwrap_or_default()
}

impl<K: kube::Resource> Cache<K> {
    /// Applies a watch event; true when the set of objects changed.
    fn apply(&mut self, event: watcher::Event<K>) -> bool {
        match event {
            watcher::Event::Apply(o) => {
                self.objects.insert(name_of(&o), o);
                true
            }
            watcher::Event::Delete(o) => self.objects.remove(&name_of(&o)).is_some(),
            watcher::Event::Init => {
                self.buffer = Some(BTreeMap::new());
                false
            }
            watcher::Event::InitApply(o) => {
                self.buffer
                    .get_or_insert_with(BTreeMap::new)
                    .insert(name_of(&o), o);
                false
            }
            watcher::Event::InitDone => {
                self.objects = self.buffer.take().unwrap_or_default();
                self.synced = true;
                true
            }
        }
    }
}

const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(30);
const PROVIDER_RETRY_MIN: Duration = Duration::from_secs(5);
const PROVIDER_RETRY_MAX: Duration = Duration::from_secs(300);
const POOL_STATUS_DELAY: Duration = Duration::from_millis(200);

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
    dirty: VecDeque<ServiceKey>,
    dirty_set: HashSet<ServiceKey>,
    in_flight: HashSet<ServiceKey>,
    failed: HashSet<ServiceKey>,
    /// Services whose LoadBalancer addresses stay held until the write clearing their
    /// status has landed (see `withhold_until_cleared`).
    clearing: HashSet<ServiceKey>,
    retries: BTreeMap<(Instant, u64), ServiceKey>,
    attempts: HashMap<ServiceKey, u32>,
    seq: u64,
    pool_status_due: Option<Instant>,
    pools_in_flight: HashSet<String>,
    jobs: FuturesUnordered<BoxFuture<'static, Done>>,
    on_started: Box<dyn FnMut() + Send>,
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
            dirty: VecDeque::new(),
            dirty_set: HashSet::new(),
            in_flight: HashSet::new(),
            failed: HashSet::new(),
            clearing: HashSet::new(),
            retries: BTreeMap::new(),
            attempts: HashMap::new(),
            seq: 0,
            pool_status_due: None,
            pools_in_flight: HashSet::new(),
            jobs: FuturesUnordered::new(),
            on_started,
        })
    }

    fn inputs(&self) -> BoxStream<'static, Input> {
        let cfg = watcher::Config::default();
        let svc = watcher(Api::<Service>::all(self.client.clone()), cfg.clone())
            .default_backoff()
            .map(|e| Input::Svc(Box::new(e)));
        let pool = watcher(Api::<IPPool>::all(self.client.clone()), cfg.clone())
            .default_backoff()
            .map(|e| Input::Pool(Box::new(e)));
        let ns = watcher(Api::<Namespace>::all(self.client.clone()), cfg.clone())
            .default_backoff()
            .map(|e| Input::Ns(Box::new(e)));
        let node = watcher(Api::<Node>::all(self.client.clone()), cfg)
            .default_backoff()
            .map(|e| Input::Node(Box::new(e)));
        stream::select_all([svc.boxed(), pool.boxed(), ns.boxed(), node.boxed()]).boxed()
    }

    /// Runs until `token` is cancelled. Jobs in flight are dropped with the loop.
    pub(crate) async fn run(mut self, token: CancellationToken) {
        let mut inputs = self.inputs();
        loop {
            self.pump();
            let next_retry = self.retries.keys().next().map(|(t, _)| *t);
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
                _ = sleep_until(next_retry), if next_retry.is_some() => self.due_retries(),
                _ = sleep_until(pool_due), if pool_due.is_some() => self.write_pool_statuses(),
            }
        }
    }

    fn on_input(&mut self, input: Input) {
        let failed = match input {
            Input::Svc(r) => r.map(|e| self.on_service(e)).err(),
            Input::Pool(r) => r
                .map(|e| {
                    if self.pools.apply(e) && self.started {
                        self.apply_pools();
                    }
                })
                .err(),
            Input::Ns(r) => r
                .map(|e| {
                    if self.namespaces.apply(e) && self.started {
                        // Pools may select namespaces by label: their Services decide again.
                        self.mark_lb_services(|_| true);
                    }
                })
                .err(),
            Input::Node(r) => r
                .map(|e| {
                    self.nodes.apply(e);
                })
                .err(),
        };
        if let Some(e) = failed {
            self.metrics.error("watch");
            tracing::warn!(error = %e, "watch failed; retrying");
        }
        self.maybe_start();
    }

    fn on_service(&mut self, event: watcher::Event<Service>) {
        let key_of = |s: &Service| {
            ServiceKey::new(
                s.metadata.namespace.clone().unwrap_or_default(),
                s.metadata.name.clone().unwrap_or_default(),
            )
        };
        match event {
            watcher::Event::Apply(s) => {
                let key = key_of(&s);
                self.upsert(key, Arc::new(trim(s)));
            }
            watcher::Event::Delete(s) => self.remove(&key_of(&s)),
            watcher::Event::Init => self.svc_buffer = Some(HashMap::new()),
            watcher::Event::InitApply(s) => {
                let key = key_of(&s);
                self.svc_buffer
                    .get_or_insert_with(HashMap::new)
                    .insert(key, Arc::new(trim(s)));
            }
            watcher::Event::InitDone => {
                let listed = self.svc_buffer.take().unwrap_or_default();
                if !self.started {
                    self.services = listed;
                } else {
                    // A relist after a broken watch: whatever is gone was deleted meanwhile.
                    let gone: Vec<ServiceKey> = self
                        .services
                        .keys()
                        .filter(|k| !listed.contains_key(*k))
                        .cloned()
                        .collect();
                    for k in gone {
                        self.remove(&k);
                    }
                    for (k, s) in listed {
                        self.upsert(k, s);
                    }
                }
                self.svc_synced = true;
            }
        }
        self.metrics.services.set(self.services.len() as i64);
    }

    fn upsert(&mut self, key: ServiceKey, svc: Arc<Service>) {
        if self.started {
            if let Some(old) = self.services.get(&key) {
                if old.metadata.uid != svc.metadata.uid {
                    // Deleted and created again under the same name between two events.
                    self.release(&key);
                }
            }
        }
        self.services.insert(key.clone(), svc);
        if self.started {
            self.mark(key);
        }
    }

    fn remove(&mut self, key: &ServiceKey) {
        if self.services.remove(key).is_none() {
            return;
        }
        if self.started {
            self.release(key);
            let provider = self.ctx.provider.clone();
            let key = key.clone();
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

    fn release(&mut self, key: &ServiceKey) {
        if self.alloc.release_all(key) {
            self.schedule_pool_status();
            // Something was freed: Services waiting for space try again.
            let waiting: Vec<ServiceKey> = self.failed.iter().cloned().collect();
            for k in waiting {
                self.mark(k);
            }
        }
        self.failed.remove(key);
        self.attempts.remove(key);
        self.clearing.remove(key);
    }

    /// Takes the version a spec write returned as the cached one, unless the watch has
    /// already moved the cache past the version the decision was made from.
    fn remember_written(&mut self, key: &ServiceKey, w: apply::WrittenSpec) {
        let Some(cached) = self.services.get(key) else {
            return;
        };
        if cached.metadata.resource_version == w.base_version
            && cached.metadata.uid == w.svc.metadata.uid
        {
            let svc = trim(Service::clone(&w.svc));
            self.services.insert(key.clone(), Arc::new(svc));
        }
    }

    /// Frees the LoadBalancer addresses of a Service whose status no longer names them.
    fn release_cleared(&mut self, key: &ServiceKey) {
        if self.clearing.remove(key) && !self.alloc.lb.release_owner(key).is_empty() {
            self.schedule_pool_status();
            let waiting: Vec<ServiceKey> = self.failed.iter().cloned().collect();
            for k in waiting {
                self.mark(k);
            }
        }
    }

    /// The plan frees the addresses of a Service that stops being a LoadBalancer at once,
    /// but its status names them until the clearing write (`ingress`) lands. Given to another Service
    /// meanwhile, a crash in between would leave two Services naming one address, and the
    /// next leader would take it from one of them. So they stay held until then.
    fn withhold_until_cleared(
        &mut self,
        key: &ServiceKey,
        facts: &crate::facts::ServiceFacts,
        labels: &berth_ipam::Labels,
        before: &[std::net::IpAddr],
        ingress: Option<&Vec<std::net::IpAddr>>,
    ) {
        let clears = ingress.is_some_and(Vec::is_empty);
        if !clears || before.is_empty() || !self.alloc.lb.ips_of(key).is_empty() {
            return;
        }
        let mut view = facts.lb_view.clone();
        view.namespace_labels = labels.clone();
        if self.alloc.lb.adopt(key, &view, before).is_ok() {
            self.clearing.insert(key.clone());
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
            self.mark(k);
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
        self.mark_lb_services(|_| true);
        self.schedule_pool_status();
    }

    fn mark_lb_services(&mut self, filter: impl Fn(&Service) -> bool) {
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
            .filter(|(_, s)| filter(s))
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            self.mark(k);
        }
    }

    fn mark(&mut self, key: ServiceKey) {
        if self.dirty_set.insert(key.clone()) {
            self.dirty.push_back(key);
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
        let mut deferred = Vec::new();
        while self.jobs.len() < self.cfg.max_in_flight {
            let Some(key) = self.dirty.pop_front() else {
                break;
            };
            if self.in_flight.contains(&key) {
                deferred.push(key);
                continue;
            }
            self.dirty_set.remove(&key);
            self.decide(key);
        }
        for key in deferred {
            self.dirty.push_back(key);
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
        let labels = self
            .namespaces
            .objects
            .get(&key.namespace)
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default();
        let lb_before = self.alloc.lb.ips_of(&key);
        let out = plan_service(&mut self.alloc, &facts, &labels);
        if self.alloc.lb.ips_of(&key) != lb_before {
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
        let conditions = build_conditions(&svc, &out, apply::now());
        let ingress = out.ingress.clone().filter(|ips| ingress_differs(&svc, ips));
        self.withhold_until_cleared(&key, &facts, &labels, &lb_before, ingress.as_ref());
        let nodes = if ingress.is_some() && facts.lb_class != LbClass::None {
            eligible_nodes(&self.nodes.objects)
        } else {
            Vec::new()
        };
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
            self.attempts.remove(&key);
            return;
        }
        tracing::info!(
            spec = job.spec_patch.is_some(),
            status = job.conditions.is_some() || job.ingress.is_some(),
            "writing allocation"
        );
        self.in_flight.insert(key.clone());
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
                self.in_flight.remove(&key);
                if let Some(w) = written {
                    self.remember_written(&key, w);
                }
                if outcome == JobOutcome::Done {
                    self.release_cleared(&key);
                }
                match outcome {
                    JobOutcome::Done | JobOutcome::Gone => {
                        self.attempts.remove(&key);
                    }
                    // Leadership dropped while the job ran. When it comes back before this
                    // term notices (a renewal that missed its deadline, then a quick
                    // re-acquire), the term goes on and nothing else would decide the
                    // Service again; when the term ends, the retry goes with it.
                    JobOutcome::NotLeading => {
                        self.attempts.remove(&key);
                        self.seq += 1;
                        self.retries
                            .insert((Instant::now() + RETRY_MIN, self.seq), key);
                    }
                    JobOutcome::Retry { category } => {
                        self.metrics.error(category);
                        let n = self.attempts.entry(key.clone()).or_insert(0);
                        *n += 1;
                        let delay = if category == "conflict" {
                            // The newer object is on its way through the watch.
                            Duration::from_millis(50)
                        } else if category == "provider" {
                            // Load balancers back off as the cloud-controller-manager does.
                            PROVIDER_RETRY_MIN
                                .saturating_mul(1u32 << (*n).min(6))
                                .min(PROVIDER_RETRY_MAX)
                        } else {
                            RETRY_MIN
                                .saturating_mul(1u32 << (*n).min(12))
                                .min(RETRY_MAX)
                        };
                        self.seq += 1;
                        self.retries.insert((Instant::now() + delay, self.seq), key);
                    }
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

    fn due_retries(&mut self) {
        let now = Instant::now();
        while let Some(entry) = self.retries.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.mark(key);
        }
    }
}

/// What the loop keeps of a Service: managedFields are most of a written object's size and
/// nothing here reads them.
fn trim(mut svc: Service) -> Service {
    svc.metadata.managed_fields = None;
    svc
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => futures::future::pending().await,
    }
}

//! The endpoints controller (docs/architecture.md, "Endpoints semantics"): keeps each selector Service's `Endpoints` and its
//! berth-managed `EndpointSlice`s in line with the pods it selects.
//!
//! Watches on Services, Pods, Nodes, berth's EndpointSlices and Endpoints feed one [`cache`] that
//! knows, for each change, which Services it touches; those go into a coalescing [`queue`], and
//! workers sync one Service at a time each: read the inputs from the cache, plan the writes with
//! the pure `berth-endpoints` functions ([`sync`]), write them ([`apply`]). Own writes are
//! remembered ([`tracker`]) so that no sync plans against a cache that has not seen them yet.

mod apply;
mod cache;
mod intern;
mod key;
mod metrics;
mod pod_facts;
mod pod_slab;
mod queue;
mod slim_pod;
mod stored;
mod sync;
mod tracker;

use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use berth_endpoints::{SliceConfig, LABEL_MANAGED_BY, MANAGED_BY_BERTH};
use chrono::Utc;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Endpoints, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use prometheus_client::registry::Registry;
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, info_span, warn, Instrument};

/// The crate's one error type, under the name this module's users know.
pub use crate::Error;

use apply::Applier;
use cache::Cache;
use intern::Interner;
use key::ObjectKey;
use metrics::Metrics;
use pod_facts::PodFacts;
use queue::{Outcome, WorkQueue};
use slim_pod::SlimPod;

use crate::service_feed::{map_event, ServiceFeed};

/// How the endpoints controller works; every value is already valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointsConfig {
    /// Endpoints per slice (`--max-endpoints-per-slice`).
    pub slices: SliceConfig,
    /// Services synced at the same time.
    pub workers: usize,
    /// How long a change waits before its Service is synced, so that a burst of pod changes
    /// becomes one write. Zero syncs at once; changes during a sync still coalesce.
    pub batch_period: Duration,
}

impl Default for EndpointsConfig {
    fn default() -> Self {
        EndpointsConfig {
            slices: SliceConfig::default(),
            // Measured at a cold start of 10,000 Services and 100,000 pods: 8 -> 32 took 10-20%
            // off the time, 7-15% off the CPU of the controller and the API server, and 0.3
            // writes off each Service.
            workers: 32,
            batch_period: Duration::ZERO,
        }
    }
}

/// How long a Service waits for the caches to show the controller's own writes before it is
/// synced regardless (an event lost for good must not hold it forever).
const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(30);
/// How soon a Service waiting for the caches is looked at again.
const WAIT_FOR_CACHE: Duration = Duration::from_millis(20);

/// Writes Endpoints and EndpointSlices for Services with a selector. Run it only while leading.
/// A clone shares the metrics, so each leadership term can run a fresh one.
#[derive(Clone)]
pub struct EndpointsController {
    client: Client,
    config: EndpointsConfig,
    metrics: Metrics,
}

struct Shared {
    client: Client,
    config: EndpointsConfig,
    metrics: Metrics,
    cache: Mutex<Cache>,
    queue: WorkQueue,
}

impl Shared {
    fn cache(&self) -> MutexGuard<'_, Cache> {
        // Cache updates do not unwind half way in practice; a poisoned lock still holds usable state.
        match self.cache.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    async fn sync(&self, key: &ObjectKey) -> Outcome {
        let started = Instant::now();
        let inputs = {
            let mut cache = self.cache();
            if !cache.is_settled(key, started) {
                self.metrics.sync("waiting", 0.0);
                return Outcome::After(WAIT_FOR_CACHE);
            }
            cache.take_inputs(key)
        };
        let trigger = inputs.trigger;
        let writes = sync::plan_sync(&inputs, &self.config.slices);
        drop(inputs);
        for skipped in &writes.skipped {
            debug!(reason = %skipped, "input skipped");
        }
        if writes.is_empty() {
            self.metrics
                .sync("unchanged", started.elapsed().as_secs_f64());
            debug!("endpoints up to date");
            return Outcome::Done;
        }
        let applier = Applier {
            client: &self.client,
            cache: &self.cache,
            metrics: &self.metrics,
        };
        match applier.apply(key, writes).await {
            Ok(()) => {
                self.metrics
                    .sync("changed", started.elapsed().as_secs_f64());
                Outcome::Done
            }
            Err(error) => {
                self.cache().restore_trigger(key, trigger);
                let category = error.category();
                self.metrics.sync("error", started.elapsed().as_secs_f64());
                self.metrics.error(category);
                warn!(error = %error, cause = %source_text(&error), category = category.as_str(), "endpoints sync failed");
                if error.is_retryable() {
                    Outcome::Failed
                } else {
                    Outcome::Done
                }
            }
        }
    }
}

fn source_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = Vec::new();
    let mut next = error.source();
    while let Some(e) = next {
        parts.push(e.to_string());
        next = e.source();
    }
    parts.join(": ")
}

/// A watched object as the cache takes it.
enum Change<S> {
    Apply(S),
    Delete(S),
    /// The full set after a (re-)list.
    Reset(Vec<S>),
}

impl EndpointsController {
    /// Builds the controller and registers its metrics in `registry`; nothing runs until
    /// [`EndpointsController::run`].
    pub fn new(client: Client, config: EndpointsConfig, registry: &mut Registry) -> Self {
        EndpointsController {
            client,
            config,
            metrics: Metrics::register(registry),
        }
    }

    /// Watches and writes until `shutdown` fires. Errors from the API server are retried inside;
    /// only a watch that ends for good stops it with an error.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        self.run_fed(shutdown, None).await
    }

    /// [`EndpointsController::run`] with the Services from the allocation worker's watch
    /// instead of a watch of its own (see `service_feed`).
    pub(crate) async fn run_with_service_feed(
        self,
        shutdown: CancellationToken,
        services: ServiceFeed,
    ) -> Result<(), Error> {
        self.run_fed(shutdown, Some(services)).await
    }

    async fn run_fed(
        self,
        shutdown: CancellationToken,
        services: Option<ServiceFeed>,
    ) -> Result<(), Error> {
        let shared = Arc::new(Shared {
            client: self.client.clone(),
            metrics: self.metrics,
            cache: Mutex::new(Cache::new(EXPECTATION_TIMEOUT)),
            queue: WorkQueue::new(self.config.batch_period),
            config: self.config,
        });
        let stop = shutdown.child_token();
        let mut tasks: JoinSet<Result<(), Error>> = JoinSet::new();
        let synced = spawn_watches(&mut tasks, &shared, &stop, &self.client, services);

        // Nothing is synced from a partial view: a missing Node would drop its pods' endpoints.
        let all_synced = futures::future::join_all(synced);
        tokio::select! {
            () = stop.cancelled() => {}
            _ = all_synced => {
                let keys = {
                    let mut cache = shared.cache();
                    cache.start_recording_triggers();
                    cache.all_keys()
                };
                info!(services = keys.len(), "endpoints caches synced");
                shared.queue.add_all(keys);
                spawn_workers(&mut tasks, &shared, &stop);
            }
        }
        join_tasks(tasks, &stop).await
    }
}

/// One watch per kind the cache holds (Services from `services` when given), each feeding
/// the cache; the receivers fire when their watch has listed everything once.
fn spawn_watches(
    tasks: &mut JoinSet<Result<(), Error>>,
    shared: &Arc<Shared>,
    stop: &CancellationToken,
    client: &Client,
    services: Option<ServiceFeed>,
) -> Vec<oneshot::Receiver<()>> {
    let all = watcher::Config::default;
    let services = match services {
        Some(feed) => futures::stream::unfold(feed, |mut feed| async move {
            feed.recv().await.map(|event| (Ok(event), feed))
        })
        .boxed(),
        None => watched(Api::<Service>::all(client.clone()), all())
            .map(|event| event.map(|e| map_event(e, Arc::new)))
            .boxed(),
    };
    let service = spawn_watch(
        tasks,
        shared,
        stop,
        "Service",
        services,
        Some,
        |cache, change| {
            let now = Utc::now();
            match change {
                Change::Apply(s) => cache.apply_service(s, now),
                Change::Delete(s) => cache.delete_service(&key_of(&s.metadata), now),
                Change::Reset(all) => cache.reset_services(all),
            }
        },
    );
    let pod = spawn_watch(
        tasks,
        shared,
        stop,
        "Pod",
        watched(Api::<SlimPod>::all(client.clone()), all()),
        {
            let mut interner = Interner::default();
            move |pod: SlimPod| Some(PodFacts::from_pod(&pod, &mut interner))
        },
        |cache, change| {
            let now = Utc::now();
            match change {
                Change::Apply(p) => cache.apply_pod(p, now),
                Change::Delete(p) => {
                    cache.delete_pod(&ObjectKey::new(&*p.namespace, &*p.name), now)
                }
                Change::Reset(all) => cache.reset_pods(all),
            }
        },
    );
    let node = spawn_watch(
        tasks,
        shared,
        stop,
        "Node",
        watched(Api::<Node>::all(client.clone()), all()),
        Some,
        |cache, change| match change {
            Change::Apply(n) => cache.apply_node(&n),
            Change::Delete(n) => cache.delete_node(n.metadata.name.as_deref().unwrap_or("")),
            Change::Reset(all) => cache.reset_nodes(&all),
        },
    );
    let slice = spawn_watch(
        tasks,
        shared,
        stop,
        "EndpointSlice",
        // Only berth's slices: other managers' would cost memory for nothing. A slice
        // relabelled away from berth arrives as a delete.
        watched(
            Api::<EndpointSlice>::all(client.clone()),
            all().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY_BERTH}")),
        ),
        Some,
        |cache, change| match change {
            Change::Apply(s) => cache.apply_slice(s),
            Change::Delete(s) => cache.delete_slice(&s),
            Change::Reset(all) => cache.reset_slices(all),
        },
    );
    let endpoints = spawn_watch(
        tasks,
        shared,
        stop,
        "Endpoints",
        watched(Api::<Endpoints>::all(client.clone()), all()),
        Some,
        |cache, change| match change {
            Change::Apply(e) => cache.apply_endpoints(e),
            Change::Delete(e) => cache.delete_endpoints(&key_of(&e.metadata)),
            Change::Reset(all) => cache.reset_endpoints(all),
        },
    );
    vec![service, pod, node, slice, endpoints]
}

/// The sync workers, taking Services off the queue until `stop`.
fn spawn_workers(
    tasks: &mut JoinSet<Result<(), Error>>,
    shared: &Arc<Shared>,
    stop: &CancellationToken,
) {
    for _ in 0..shared.config.workers.max(1) {
        let (shared, stop) = (shared.clone(), stop.clone());
        tasks.spawn(async move {
            while let Some(key) = shared.queue.next(&stop).await {
                let span =
                    info_span!("endpoints_sync", namespace = %key.namespace, service = %key.name);
                // A sync in flight is dropped on shutdown: a request that cannot
                // reach the API server must not hold the process up.
                let outcome = tokio::select! {
                    outcome = shared.sync(&key).instrument(span) => outcome,
                    () = stop.cancelled() => break,
                };
                shared.queue.finish(&key, outcome);
                shared.metrics.queue_depth.set(gauge(shared.queue.len()));
            }
            Ok(())
        });
    }
}

/// Every task to its end; the first that fails for good stops the others and is the result.
async fn join_tasks(
    mut tasks: JoinSet<Result<(), Error>>,
    stop: &CancellationToken,
) -> Result<(), Error> {
    let mut result = Ok(());
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                stop.cancel();
                result = result.and(Err(error));
            }
            Err(join) => {
                stop.cancel();
                warn!(error = %join, "endpoints task ended abnormally");
            }
        }
    }
    result
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectKey {
    ObjectKey::new(
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or(""),
    )
}

/// A watch that backs off and resumes by itself after errors.
fn watched<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + Debug + Send + 'static,
{
    watcher::watcher(api, config).default_backoff()
}

/// Runs one watch into the cache; the receiver fires after its first full list.
fn spawn_watch<K, S>(
    tasks: &mut JoinSet<Result<(), Error>>,
    shared: &Arc<Shared>,
    stop: &CancellationToken,
    kind: &'static str,
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    slim: impl FnMut(K) -> Option<S> + Send + 'static,
    apply: impl Fn(&mut Cache, Change<S>) -> Vec<ObjectKey> + Send + 'static,
) -> oneshot::Receiver<()>
where
    K: Send + 'static,
    S: Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let (shared, stop) = (shared.clone(), stop.clone());
    tasks.spawn(async move {
        let watched = feed(stream, kind, &shared, slim, apply, tx);
        tokio::select! {
            biased;
            () = stop.cancelled() => Ok(()),
            // A feed that ends because the controller is stopping (the allocation loop's
            // Service feed closes with its term) is a stop, not a failure.
            result = watched => if stop.is_cancelled() { Ok(()) } else { result },
        }
    });
    rx
}

async fn feed<K, S>(
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>>,
    kind: &'static str,
    shared: &Shared,
    mut slim: impl FnMut(K) -> Option<S>,
    apply: impl Fn(&mut Cache, Change<S>) -> Vec<ObjectKey>,
    synced: oneshot::Sender<()>,
) -> Result<(), Error> {
    let mut synced = Some(synced);
    let mut buffer: Vec<S> = Vec::new();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let change = match event {
            Ok(Event::Init) => {
                buffer = Vec::new();
                continue;
            }
            Ok(Event::InitApply(obj)) => {
                buffer.extend(slim(obj));
                continue;
            }
            Ok(Event::InitDone) => Change::Reset(std::mem::take(&mut buffer)),
            Ok(Event::Apply(obj)) => match slim(obj) {
                Some(s) => Change::Apply(s),
                None => continue,
            },
            Ok(Event::Delete(obj)) => match slim(obj) {
                Some(s) => Change::Delete(s),
                None => continue,
            },
            Err(source) => {
                // The stream backs off and resumes by itself; the error is only reported.
                let error = Error::Watch { kind, source };
                shared.metrics.error(error.category());
                warn!(kind, error = %error, cause = %source_text(&error), "watch failed, retrying");
                continue;
            }
        };
        let is_reset = matches!(change, Change::Reset(_));
        let keys = apply(&mut shared.cache(), change);
        shared.queue.add_all(keys);
        if is_reset {
            if let Some(tx) = synced.take() {
                // The receiver is gone only when the controller is stopping.
                let _ = tx.send(());
            }
        }
    }
    Err(Error::WatchEnded { kind })
}

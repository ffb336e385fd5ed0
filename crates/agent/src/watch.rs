//! Watch tasks: one kube-rs watcher per kind of object, whose events enter every index that
//! reads that kind (the datapath's [`Index`](crate::index::Index), the announcer's, the BGP
//! speaker's), each woken after its own update. The agent opens its watches through [`Feeds`],
//! so a kind two components read is still watched once.

use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};

use berth_api::IPPool;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How one kind of object enters the index `S`.
pub(crate) struct Handlers<S, K> {
    pub kind: &'static str,
    pub apply: fn(&mut S, &K),
    pub delete: fn(&mut S, &K),
    /// A (re)list starts; listed objects then come through `apply`.
    pub begin: fn(&mut S),
    /// The list is complete: what it did not name is gone.
    pub finish: fn(&mut S),
}

/// One watch event, as every consumer of the kind receives it.
enum Step<'a, K> {
    Begin,
    /// An object of a list in progress: the reader waits for the end of the list anyway, so
    /// nobody is woken.
    Listed(&'a K),
    Finish,
    Apply(&'a K),
    Delete(&'a K),
}

/// An index fed by a watch: the index, how the kind enters it, and whom to wake.
trait Consumer<K>: Send {
    fn take(&self, step: &Step<'_, K>);
}

struct Fed<S, K> {
    index: Arc<Mutex<S>>,
    wake: Arc<Notify>,
    handlers: Handlers<S, K>,
}

impl<S: Send, K> Consumer<K> for Fed<S, K> {
    fn take(&self, step: &Step<'_, K>) {
        let mut index = self.index.lock().unwrap_or_else(PoisonError::into_inner);
        let h = &self.handlers;
        match step {
            Step::Begin => (h.begin)(&mut index),
            Step::Listed(obj) => {
                (h.apply)(&mut index, obj);
                return;
            }
            Step::Finish => (h.finish)(&mut index),
            Step::Apply(obj) => (h.apply)(&mut index, obj),
            Step::Delete(obj) => (h.delete)(&mut index, obj),
        }
        drop(index);
        self.wake.notify_one();
    }
}

/// The consumers of one kind, before its watch starts.
pub(crate) struct Feed<K> {
    kind: &'static str,
    config: watcher::Config,
    consumers: Vec<Box<dyn Consumer<K>>>,
}

impl<K> Feed<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    pub fn new(kind: &'static str, config: watcher::Config) -> Self {
        Feed {
            kind,
            config,
            consumers: Vec::new(),
        }
    }

    /// Feeds `index` (and wakes `wake`) from this kind's watch.
    pub fn feed<S: Send + 'static>(
        &mut self,
        index: &Arc<Mutex<S>>,
        wake: &Arc<Notify>,
        handlers: Handlers<S, K>,
    ) {
        self.consumers.push(Box::new(Fed {
            index: index.clone(),
            wake: wake.clone(),
            handlers,
        }));
    }

    /// Narrows what the watch asks for (a field selector); every consumer must accept it.
    pub fn set_config(&mut self, config: watcher::Config) {
        self.config = config;
    }

    /// Starts the watch when anything reads the kind.
    pub fn spawn(self, api: Api<K>, stop: &CancellationToken) -> Option<JoinHandle<()>> {
        (!self.consumers.is_empty()).then(|| tokio::spawn(self.run(api, stop.clone())))
    }

    async fn run(self, api: Api<K>, stop: CancellationToken) {
        let Feed {
            kind,
            config,
            consumers,
        } = self;
        let mut stream = watcher(api, config).default_backoff().boxed();
        let mut listed = 0usize;
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => return,
                event = stream.next() => event,
            };
            let Some(event) = event else {
                tracing::warn!(kind, "watch stream ended");
                return;
            };
            let event = match event {
                Ok(event) => event,
                Err(err) => {
                    tracing::warn!(kind, error = %err, "watch failed; retrying");
                    continue;
                }
            };
            let step = match &event {
                watcher::Event::Init => {
                    listed = 0;
                    Step::Begin
                }
                watcher::Event::InitApply(obj) => {
                    listed += 1;
                    Step::Listed(obj)
                }
                watcher::Event::InitDone => {
                    tracing::debug!(kind, objects = listed, "listed");
                    Step::Finish
                }
                watcher::Event::Apply(obj) => Step::Apply(obj),
                watcher::Event::Delete(obj) => Step::Delete(obj),
            };
            for consumer in &consumers {
                consumer.take(&step);
            }
        }
    }
}

/// A watch with one consumer: for kinds only one component reads.
pub(crate) async fn run_watch<S, K>(
    api: Api<K>,
    config: watcher::Config,
    index: Arc<Mutex<S>>,
    wake: Arc<Notify>,
    handlers: Handlers<S, K>,
    stop: CancellationToken,
) where
    S: Send + 'static,
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let mut feed = Feed::new(handlers.kind, config);
    feed.feed(&index, &wake, handlers);
    feed.run(api, stop).await;
}

/// The kinds more than one component reads, each watched once for all of them.
pub(crate) struct Feeds {
    pub services: Feed<Service>,
    pub slices: Feed<EndpointSlice>,
    /// Every Node when the announcer reads them; else only this node's (a field selector).
    pub nodes: Feed<Node>,
    pub pools: Feed<IPPool>,
    /// Read only where the cluster serves the kind (see [`service_cidrs_served`]).
    pub service_cidrs: Feed<ServiceCIDR>,
}

impl Feeds {
    pub fn new() -> Self {
        Feeds {
            services: Feed::new("Service", watcher::Config::default()),
            slices: Feed::new("EndpointSlice", watcher::Config::default()),
            nodes: Feed::new("Node", watcher::Config::default()),
            pools: Feed::new("IPPool", watcher::Config::default()),
            service_cidrs: Feed::new("ServiceCIDR", watcher::Config::default()),
        }
    }

    /// Starts one watch per kind that anything reads.
    pub fn spawn(self, client: &Client, stop: &CancellationToken) -> Vec<JoinHandle<()>> {
        let Feeds {
            services,
            slices,
            nodes,
            pools,
            service_cidrs,
        } = self;
        [
            services.spawn(Api::all(client.clone()), stop),
            slices.spawn(Api::all(client.clone()), stop),
            nodes.spawn(Api::all(client.clone()), stop),
            pools.spawn(Api::all(client.clone()), stop),
            service_cidrs.spawn(Api::all(client.clone()), stop),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// Whether the cluster serves `networking.k8s.io/v1` ServiceCIDRs (Kubernetes 1.33 and later).
/// Only a clear "not found" answers no: on any other failure the kind is watched anyway, and
/// the watch retries; until it lists, the agent's `--service-cidr` holds.
pub(crate) async fn service_cidrs_served(client: &Client) -> bool {
    match client
        .list_api_group_resources("networking.k8s.io/v1")
        .await
    {
        Ok(list) => list.resources.iter().any(|r| r.name == "servicecidrs"),
        Err(kube::Error::Api(status)) if status.code == 404 => false,
        Err(err) => {
            tracing::warn!(error = %err, "cannot tell whether ServiceCIDRs are served; watching them");
            true
        }
    }
}

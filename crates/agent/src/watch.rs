//! Watch tasks: each turns one kube-rs watcher stream into index calls and wakes the loop that
//! reads the index (the datapath's [`Index`](crate::index::Index) or the announcer's).

use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Resource;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
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
    let mut stream = watcher(api, config).default_backoff().boxed();
    let mut listed = 0usize;
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            event = stream.next() => event,
        };
        let Some(event) = event else {
            tracing::warn!(kind = handlers.kind, "watch stream ended");
            return;
        };
        let event = match event {
            Ok(event) => event,
            Err(err) => {
                tracing::warn!(kind = handlers.kind, error = %err, "watch failed; retrying");
                continue;
            }
        };
        let mut index = index.lock().unwrap_or_else(PoisonError::into_inner);
        match event {
            watcher::Event::Init => {
                listed = 0;
                (handlers.begin)(&mut index);
            }
            watcher::Event::InitApply(obj) => {
                listed += 1;
                (handlers.apply)(&mut index, &obj);
                // The sync loop waits for the end of the list anyway.
                continue;
            }
            watcher::Event::InitDone => {
                (handlers.finish)(&mut index);
                tracing::debug!(kind = handlers.kind, objects = listed, "listed");
            }
            watcher::Event::Apply(obj) => (handlers.apply)(&mut index, &obj),
            watcher::Event::Delete(obj) => (handlers.delete)(&mut index, &obj),
        }
        drop(index);
        wake.notify_one();
    }
}

//! The four watches the allocation loop follows, merged into one stream.

use berth_api::IPPool;
use futures::stream::{self, BoxStream};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;

// Boxed: a Node or Namespace event is far larger than the others, and events are moved
// through the merged stream one by one.
pub(super) enum Input {
    Svc(Box<Result<watcher::Event<Service>, watcher::Error>>),
    Pool(Box<Result<watcher::Event<IPPool>, watcher::Error>>),
    Ns(Box<Result<watcher::Event<Namespace>, watcher::Error>>),
    Node(Box<Result<watcher::Event<Node>, watcher::Error>>),
}

pub(super) fn watch_all(client: &Client) -> BoxStream<'static, Input> {
    let cfg = watcher::Config::default();
    let svc = watcher(Api::<Service>::all(client.clone()), cfg.clone())
        .default_backoff()
        .map(|e| Input::Svc(Box::new(e)));
    let pool = watcher(Api::<IPPool>::all(client.clone()), cfg.clone())
        .default_backoff()
        .map(|e| Input::Pool(Box::new(e)));
    let ns = watcher(Api::<Namespace>::all(client.clone()), cfg.clone())
        .default_backoff()
        .map(|e| Input::Ns(Box::new(e)));
    let node = watcher(Api::<Node>::all(client.clone()), cfg)
        .default_backoff()
        .map(|e| Input::Node(Box::new(e)));
    stream::select_all([svc.boxed(), pool.boxed(), ns.boxed(), node.boxed()]).boxed()
}

//! The watches the allocation loop follows (ServiceCIDRs where the cluster serves them),
//! merged into one stream.

use berth_api::IPPool;
use futures::stream::{self, BoxStream};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::networking::v1::ServiceCIDR;
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
    Cidr(Box<Result<watcher::Event<ServiceCIDR>, watcher::Error>>),
}

/// Whether the cluster serves `networking.k8s.io/v1` ServiceCIDRs (Kubernetes 1.33 and later).
/// Only a clear "not found" answers no: on any other failure the kind is watched anyway, and
/// the watch retries (adoption waits for its list).
pub(super) async fn service_cidrs_served(client: &Client) -> bool {
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

pub(super) fn watch_all(client: &Client, service_cidrs: bool) -> BoxStream<'static, Input> {
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
    let node = watcher(Api::<Node>::all(client.clone()), cfg.clone())
        .default_backoff()
        .map(|e| Input::Node(Box::new(e)));
    let mut all = vec![svc.boxed(), pool.boxed(), ns.boxed(), node.boxed()];
    if service_cidrs {
        let cidr = watcher(Api::<ServiceCIDR>::all(client.clone()), cfg)
            .default_backoff()
            .map(|e| Input::Cidr(Box::new(e)));
        all.push(cidr.boxed());
    }
    stream::select_all(all).boxed()
}

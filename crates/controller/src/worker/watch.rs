//! What the loop knows of the cluster: the four watches merged into one stream, the cached
//! objects, and how a Service change, delete or relist reaches the allocators and the queue.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use berth_api::IPPool;
use berth_ipam::ServiceKey;
use futures::stream::{self, BoxStream};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};

use super::{Done, Worker};
use crate::error::ErrorCategory;
use crate::facts::{read_service, LbClass};
use crate::service_feed::map_event;

// Boxed: a Node or Namespace event is far larger than the others, and events are moved
// through the merged stream one by one.
pub(super) enum Input {
    Svc(Box<Result<watcher::Event<Service>, watcher::Error>>),
    Pool(Box<Result<watcher::Event<IPPool>, watcher::Error>>),
    Ns(Box<Result<watcher::Event<Namespace>, watcher::Error>>),
    Node(Box<Result<watcher::Event<Node>, watcher::Error>>),
}

/// A watched kind's objects and its relist buffer.
pub(super) struct Cache<K> {
    pub(super) objects: BTreeMap<String, K>,
    buffer: Option<BTreeMap<String, K>>,
    pub(super) synced: bool,
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

pub(super) fn name_of<K: kube::Resource>(obj: &K) -> String {
    obj.meta().name.clone().unwrap_or_default()
}

impl<K: kube::Resource> Cache<K> {
    /// Applies a watch event; true when the set of objects changed.
    pub(super) fn apply(&mut self, event: watcher::Event<K>) -> bool {
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

    /// [`Cache::apply`], where an update counts as a change only when `differs(old, new)`: the
    /// loop's own status writes come back as updates, and must not set every Service deciding
    /// again.
    pub(super) fn apply_with(
        &mut self,
        event: watcher::Event<K>,
        differs: impl Fn(&K, &K) -> bool,
    ) -> bool {
        match event {
            watcher::Event::Apply(o) => {
                let name = name_of(&o);
                let changed = self.objects.get(&name).is_none_or(|old| differs(old, &o));
                self.objects.insert(name, o);
                changed
            }
            other => self.apply(other),
        }
    }
}

/// What the loop keeps of a Service: managedFields are most of a written object's size and
/// nothing here reads them. Lists are decoded by doubling from four slots, so a one-port
/// Service would keep room for four: each is cut to its length.
pub(super) fn trim(mut svc: Service) -> Service {
    fn fit<T>(v: &mut Option<Vec<T>>) {
        if let Some(v) = v {
            v.shrink_to_fit();
        }
    }
    svc.metadata.managed_fields = None;
    fit(&mut svc.metadata.finalizers);
    fit(&mut svc.metadata.owner_references);
    if let Some(spec) = &mut svc.spec {
        fit(&mut spec.ports);
        fit(&mut spec.cluster_ips);
        fit(&mut spec.external_ips);
        fit(&mut spec.ip_families);
        fit(&mut spec.load_balancer_source_ranges);
    }
    if let Some(status) = &mut svc.status {
        fit(&mut status.conditions);
        if let Some(lb) = &mut status.load_balancer {
            fit(&mut lb.ingress);
            for ingress in lb.ingress.iter_mut().flatten() {
                fit(&mut ingress.ports);
            }
        }
    }
    svc
}

fn key_of(s: &Service) -> ServiceKey {
    ServiceKey::new(
        s.metadata.namespace.clone().unwrap_or_default(),
        s.metadata.name.clone().unwrap_or_default(),
    )
}

impl Worker {
    pub(super) fn inputs(&self) -> BoxStream<'static, Input> {
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

    pub(super) fn on_input(&mut self, input: Input) {
        let failed = match input {
            Input::Svc(r) => r.map(|e| self.on_service(e)).err(),
            Input::Pool(r) => r
                .map(|e| {
                    let changed = self.pools.apply_with(e, |a, b| a.spec != b.spec);
                    if changed && self.started {
                        self.apply_pools();
                    } else if self.started {
                        // Only a status changed: put it right if it is not what berth counts.
                        self.schedule_pool_status();
                    }
                })
                .err(),
            Input::Ns(r) => r
                .map(|e| {
                    let changed = self
                        .namespaces
                        .apply_with(e, |a, b| a.metadata.labels != b.metadata.labels);
                    if changed && self.started {
                        // Pools may select namespaces by label: their Services decide again.
                        self.mark_lb_services();
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
            self.metrics.error(ErrorCategory::Watch);
            tracing::warn!(error = %e, "watch failed; retrying");
        }
        self.maybe_start();
    }

    fn on_service(&mut self, event: watcher::Event<Service>) {
        let event = map_event(event, |s| Arc::new(trim(s)));
        if let Some(feed) = &self.service_feed {
            // Gone only when the endpoints controller has stopped, which ends the term.
            let _ = feed.send(event.clone());
        }
        match event {
            watcher::Event::Apply(s) => {
                let key = key_of(&s);
                self.upsert(key, s);
            }
            watcher::Event::Delete(s) => self.remove(&key_of(&s)),
            watcher::Event::Init => self.svc_buffer = Some(HashMap::new()),
            watcher::Event::InitApply(s) => {
                let key = key_of(&s);
                self.svc_buffer
                    .get_or_insert_with(HashMap::new)
                    .insert(key, s);
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
        if !self.started {
            self.services.insert(key, svc);
            return;
        }
        let rv = svc.metadata.resource_version.clone();
        let recreated = self
            .services
            .insert(key.clone(), svc.clone())
            .is_some_and(|old| old.metadata.uid != svc.metadata.uid);
        if recreated {
            // Deleted and created again under the same name between two events.
            self.release(&key);
            self.queue.forget(&key);
            self.adopt_named(&key, &svc);
            self.queue.mark(key);
        } else {
            self.adopt_named(&key, &svc);
            self.queue.observe(key, rv.as_deref());
        }
    }

    /// A LoadBalancer Service seen naming addresses while it holds none — written after this
    /// term listed, by an earlier leader or an earlier term of this replica whose write was
    /// still on its way — holds them at once when they are free, as adoption at startup would
    /// have (the plan does the same when it decides the Service). Left free until then, they
    /// would go to whichever Service needing an address is decided first: the lowest free
    /// address is the one that earlier leader picked too.
    fn adopt_named(&mut self, key: &ServiceKey, svc: &Service) {
        let names = svc
            .status
            .as_ref()
            .and_then(|st| st.load_balancer.as_ref())
            .is_some_and(|lb| lb.ingress.as_ref().is_some_and(|i| !i.is_empty()));
        if !names || !self.alloc.lb.ips_of(key).is_empty() {
            return;
        }
        let facts = read_service(svc, self.cfg.default_class);
        if !facts.problems.is_empty()
            || facts.ingress_ips.is_empty()
            || facts.lb_class != LbClass::L2
        {
            return;
        }
        let mut view = facts.lb_view.clone();
        view.namespace_labels = self.labels_of_namespace(&key.namespace);
        // Refused: someone holds them already; deciding the Service sorts it out.
        if self.alloc.lb.adopt(key, &view, &facts.ingress_ips).is_ok() {
            tracing::debug!(service = %key, ips = ?facts.ingress_ips, "adopted addresses the Service names");
            self.schedule_pool_status();
        }
    }

    fn remove(&mut self, key: &ServiceKey) {
        if self.services.remove(key).is_none() {
            return;
        }
        if self.started {
            self.release(key);
            self.queue.forget(key);
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

    pub(super) fn release(&mut self, key: &ServiceKey) {
        if self.alloc.release_all(key) {
            self.schedule_pool_status();
            self.wake_waiting(Some(key));
        }
        self.failed.remove(key);
        self.clearing.remove(key);
        self.dropping.remove(key);
        self.fresh.remove(key);
        self.refused.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mk_pool(addresses: &str, assigned: u64) -> IPPool {
        serde_json::from_value(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "IPPool",
            "metadata": {"name": "p"},
            "spec": {"addresses": [addresses]},
            "status": {"assignedIPv4": assigned}
        }))
        .unwrap()
    }

    #[test]
    fn trim_drops_managed_fields_and_spare_room_only() {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "finalizers": ["a"],
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"type": "LoadBalancer", "clusterIPs": ["10.96.0.10"],
                "ipFamilies": ["IPv4"], "ports": [{"port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.200", "ipMode": "VIP",
                "ports": [{"port": 80, "protocol": "TCP"}]}]},
                "conditions": [{"type": "a", "status": "True", "reason": "R", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        }))
        .unwrap();
        let mut want = svc.clone();
        want.metadata.managed_fields = None;
        let trimmed = trim(svc);
        assert_eq!(trimmed, want);
        let spec = trimmed.spec.as_ref().unwrap();
        let status = trimmed.status.as_ref().unwrap();
        let ingress = status
            .load_balancer
            .as_ref()
            .unwrap()
            .ingress
            .as_ref()
            .unwrap();
        let fitted = [
            spec.ports.as_ref().map(|v| (v.len(), v.capacity())),
            spec.cluster_ips.as_ref().map(|v| (v.len(), v.capacity())),
            spec.ip_families.as_ref().map(|v| (v.len(), v.capacity())),
            status.conditions.as_ref().map(|v| (v.len(), v.capacity())),
            Some((ingress.len(), ingress.capacity())),
            ingress[0].ports.as_ref().map(|v| (v.len(), v.capacity())),
        ];
        assert!(
            fitted.iter().all(|f| matches!(f, Some((1, 1)))),
            "{fitted:?}"
        );
    }

    #[test]
    fn only_relevant_updates_count_as_changes() {
        let mut cache = Cache::<IPPool>::default();
        let spec_differs = |a: &IPPool, b: &IPPool| a.spec != b.spec;
        assert!(!cache.apply_with(watcher::Event::Init, spec_differs));
        assert!(!cache.apply_with(
            watcher::Event::InitApply(mk_pool("198.18.0.0/24", 0)),
            spec_differs
        ));
        assert!(cache.apply_with(watcher::Event::InitDone, spec_differs));
        // A status update is stored, but is no change.
        assert!(!cache.apply_with(
            watcher::Event::Apply(mk_pool("198.18.0.0/24", 5)),
            spec_differs
        ));
        let stored = cache.objects["p"].status.clone().unwrap();
        assert_eq!(stored.assigned_ipv4, 5);
        assert!(cache.apply_with(
            watcher::Event::Apply(mk_pool("198.18.1.0/24", 5)),
            spec_differs
        ));
        assert!(cache.apply_with(
            watcher::Event::Delete(mk_pool("198.18.1.0/24", 5)),
            spec_differs
        ));
        assert!(cache.objects.is_empty());
        // A new object is a change.
        assert!(cache.apply_with(
            watcher::Event::Apply(mk_pool("198.18.1.0/24", 0)),
            spec_differs
        ));
    }
}

//! How a watch event reaches the state machine: the cached objects, and what a Service change,
//! delete or relist does to the allocators and the queue.

use std::collections::HashMap;
use std::sync::Arc;

use berth_ipam::ServiceKey;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::watcher;

use super::cache::key_of;
use super::facts::LbClass;
use super::state::{AllocationState, Observed};

impl AllocationState {
    /// Takes one watch event; starts (adopts everything) once all four kinds are listed.
    pub(crate) fn observe(&mut self, observed: Observed) {
        match observed {
            Observed::Service(e) => self.on_service(e),
            Observed::Pool(e) => {
                let changed = self.pools.observe_with(e, |a, b| a.spec != b.spec);
                if changed && self.started {
                    self.pools_changed();
                } else if self.started {
                    // Only a status changed: put it right if it is not what berth counts.
                    self.schedule_pool_status();
                }
            }
            Observed::Namespace(e) => {
                let changed = self
                    .namespaces
                    .observe_with(e, |a, b| a.metadata.labels != b.metadata.labels);
                if changed && self.started {
                    // Pools may select namespaces by label: their Services decide again.
                    self.mark_lb_services();
                }
            }
            Observed::Node(e) => {
                self.nodes.observe(e);
                // A Node's addresses or pod CIDRs are cut out of every pool.
                if self.started && self.refresh_cluster_addresses() {
                    self.pools_changed();
                }
            }
            Observed::ServiceCidr(e) => {
                let changed = self
                    .service_cidr_objects
                    .as_mut()
                    .is_some_and(|c| c.observe(e));
                if changed && self.started {
                    self.service_cidrs_changed();
                }
            }
        }
        self.maybe_start();
    }

    fn on_service(&mut self, event: watcher::Event<Arc<Service>>) {
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
        let facts = self.read(svc);
        if !facts.problems.is_empty()
            || facts.ingress_ips.is_empty()
            || facts.lb_class != LbClass::L2
        {
            return;
        }
        let mut view = facts.lb_view.clone();
        view.namespace_labels = self.labels_of_namespace(&key.namespace);
        // Refused: someone holds them already; deciding the Service sorts it out. In no
        // pool, they are kept as its pool going away would have kept them.
        let adopted = match self.alloc.lb.adopt(key, &view, &facts.ingress_ips) {
            Err(berth_ipam::Error::NotAllowedByConfig { .. }) => {
                let kept = self.alloc.lb.keep(key, &view, &facts.ingress_ips);
                if kept.is_ok() {
                    self.start_keeping(key, None);
                }
                kept
            }
            other => other,
        };
        if adopted.is_ok() {
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
            // Providers with outside state clean up; the Service itself is gone.
            self.push_cleanup(key.clone());
        }
    }

    /// Frees everything the Service holds and forgets its state, at once.
    fn release(&mut self, key: &ServiceKey) {
        self.stop_keeping(key);
        if self.alloc.release_all(key) {
            self.schedule_pool_status();
            self.wake_waiting(Some(key));
        }
        self.held.forget(key);
        self.states.remove(key);
    }
}

//! Holding exactly what a Service's object names: a LoadBalancer address stays held until
//! the write clearing it has landed, a retry decides from the version berth's own spec write
//! returned, and what a refused write would have named is let go. The first two close windows
//! in which a crash would leave two Services naming one value; the last, one in which a
//! value nothing names stands against the value the Service does name.

use std::net::IpAddr;
use std::sync::Arc;

use berth_ipam::{Labels, ServiceKey};
use k8s_openapi::api::core::v1::Service;

use super::watch::trim;
use super::Worker;
use crate::apply::WrittenSpec;
use crate::facts::ServiceFacts;
use crate::fresh::{release_fresh, Fresh};

impl Worker {
    /// Takes the version a spec write returned as the cached one, unless the watch has
    /// already moved the cache past the version the decision was made from.
    pub(super) fn remember_written(&mut self, key: &ServiceKey, w: WrittenSpec) {
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
    pub(super) fn release_cleared(&mut self, key: &ServiceKey) {
        if self.clearing.remove(key) && !self.alloc.lb.release_owner(key).is_empty() {
            self.schedule_pool_status();
            self.wake_waiting(None);
        }
    }

    /// Something was freed: Services waiting for space try again, except `deciding` (whose
    /// job is about to start: marked now, it would be decided again while in flight; or
    /// which is being released and is queued again by its caller if it still exists).
    pub(super) fn wake_waiting(&mut self, deciding: Option<&ServiceKey>) {
        let waiting: Vec<ServiceKey> = self
            .failed
            .iter()
            .filter(|k| Some(*k) != deciding)
            .cloned()
            .collect();
        for k in waiting {
            self.queue.mark(k);
        }
    }

    /// Frees what a decision newly gave a Service once the write that would have named it
    /// was refused (409): no object names it. Held, it would stand against what the Service
    /// names now — such as values a killed leader's write set after this decision was made
    /// from the older version, which the next decision would refuse as a changed ClusterIP.
    pub(super) fn release_unwritten(&mut self, key: &ServiceKey, fresh: &Fresh) {
        if !release_fresh(&mut self.alloc, key, fresh) {
            return;
        }
        tracing::debug!(service = %key, ?fresh, "write refused; released what it would have named");
        if !fresh.lb_ips.is_empty() {
            self.schedule_pool_status();
        }
        self.wake_waiting(None);
    }

    /// The plan frees the addresses of a Service that stops being a LoadBalancer at once,
    /// but its status names them until the clearing write (`ingress`) lands. Given to another
    /// Service meanwhile, a crash in between would leave two Services naming one address, and
    /// the next leader would take it from one of them. So they stay held until then.
    pub(super) fn withhold_until_cleared(
        &mut self,
        key: &ServiceKey,
        facts: &ServiceFacts,
        labels: &Labels,
        before: &[IpAddr],
        ingress: Option<&Vec<IpAddr>>,
    ) {
        let clears = ingress.is_some_and(Vec::is_empty);
        if !clears {
            // The Service keeps (or is given) load-balancer addresses: what an earlier clearing
            // write that never landed withheld is its own again. Left marked, the next write
            // that lands would free addresses its status still names.
            self.clearing.remove(key);
            return;
        }
        if before.is_empty() || !self.alloc.lb.ips_of(key).is_empty() {
            return;
        }
        let mut view = facts.lb_view.clone();
        view.namespace_labels = labels.clone();
        if self.alloc.lb.adopt(key, &view, before).is_ok() {
            self.clearing.insert(key.clone());
        }
    }
}

//! Keeping what a Service's object still names: a LoadBalancer address stays held until the
//! write clearing it has landed, and a retry decides from the version berth's own spec write
//! returned. Both close windows in which a crash would leave two Services naming one value.

use std::net::IpAddr;
use std::sync::Arc;

use berth_ipam::{Labels, ServiceKey};
use k8s_openapi::api::core::v1::Service;

use super::watch::trim;
use super::Worker;
use crate::apply::WrittenSpec;
use crate::facts::ServiceFacts;

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
            let waiting: Vec<ServiceKey> = self.failed.iter().cloned().collect();
            for k in waiting {
                self.queue.mark(k);
            }
        }
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
        if !clears || before.is_empty() || !self.alloc.lb.ips_of(key).is_empty() {
            return;
        }
        let mut view = facts.lb_view.clone();
        view.namespace_labels = labels.clone();
        if self.alloc.lb.adopt(key, &view, before).is_ok() {
            self.clearing.insert(key.clone());
        }
    }
}

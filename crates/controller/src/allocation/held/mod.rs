//! Holding exactly what a Service's object names: a LoadBalancer address stays held until
//! the write clearing it has landed, a retry decides from the version berth's own spec write
//! returned, and what a refused write would have named is held until the Service is read
//! again, then let go unless named. The first two close windows in which a crash would leave
//! two Services naming one value; the last, one in which a value nothing names stands against
//! the value the Service does name, without freeing a value the write that won may name.

use std::net::IpAddr;
use std::sync::Arc;

use berth_core::Labels;
use berth_ipam::ServiceKey;
use k8s_openapi::api::core::v1::Service;

use self::ledger::Unwritten;
use super::cache::trim;
use super::facts::ServiceFacts;
use super::fresh::{release_fresh, Fresh};
use super::state::AllocationState;
use super::write::{Write, WrittenSpec};

pub(super) mod ledger;

impl AllocationState {
    /// Takes the version a spec write returned as the cached one, unless the watch has
    /// already moved the cache past the version the decision was made from.
    pub(crate) fn remember_written(&mut self, key: &ServiceKey, w: WrittenSpec) {
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
    pub(crate) fn release_cleared(&mut self, key: &ServiceKey) {
        let clearing = self.held.clearing.remove(key);
        if clearing && !self.alloc.lb.release_owner(key).is_empty() {
            self.schedule_pool_status();
            self.wake_waiting(None);
        }
    }

    /// Something was freed: Services waiting for space try again, except `deciding` (whose
    /// job is about to start: marked now, it would be decided again while in flight; or
    /// which is being released and is queued again by its caller if it still exists).
    pub(crate) fn wake_waiting(&mut self, deciding: Option<&ServiceKey>) {
        let waiting: Vec<ServiceKey> = self
            .states
            .iter()
            .filter(|(k, s)| s.waiting && Some(*k) != deciding)
            .map(|(k, _)| k.clone())
            .collect();
        for k in waiting {
            self.queue.mark(k);
        }
    }

    /// Keeps what a decision newly gave a Service after the write that would have named it
    /// was refused (409), made against `version`. Nothing of that write landed, but the write
    /// that made it stale may name the same values: a killed leader's, decided from the same
    /// state, picks the same lowest free address. Freed now, that address would go to the
    /// next Service decided while the status names it. So it stays held until
    /// `settle_refused` reads a newer version.
    pub(crate) fn hold_refused(&mut self, key: &ServiceKey, version: Option<String>, fresh: Fresh) {
        if !fresh.is_empty() {
            self.held
                .refused
                .insert(key.clone(), Unwritten { version, fresh });
        }
    }

    /// Lets go of what refused writes would have named, once it is known that no object
    /// names it: the Service's own when it is decided again from a newer version `svc` that
    /// does not name it (held, it would stand against what that version does name — such as
    /// values a killed leader's write set meanwhile, which would be refused as "a cluster IP
    /// may not change once set" or replaced); another Service's when `facts` name it and
    /// that Service, as last read, does not (two leaders handing out the same addresses in
    /// another order). Decided again from the version the refused write carried (a retry
    /// before the watch brought the newer one), nothing new is known: the values are
    /// returned, still held, for this decision's writes to name.
    pub(crate) fn settle_refused(
        &mut self,
        key: &ServiceKey,
        svc: &Service,
        facts: &ServiceFacts,
    ) -> Fresh {
        let mut freed = false;
        let mut carried = Fresh::default();
        if let Some(own) = self.held.refused.remove(key) {
            if own.version.is_some() && own.version == svc.metadata.resource_version {
                carried = own.fresh;
            } else {
                let unnamed = own.fresh.unnamed_by(facts);
                let named = own.fresh.without(&unnamed);
                if !named.is_empty() {
                    tracing::debug!(service = %key, ?named, "kept what a refused write would have named: the Service names it now");
                }
                freed |= self.let_go(key, &unnamed);
            }
        }
        let claimed: Vec<(ServiceKey, Fresh)> = self
            .held
            .refused
            .iter()
            .map(|(k, held)| (k.clone(), held.fresh.without(&held.fresh.unnamed_by(facts))))
            .filter(|(_, named)| !named.is_empty())
            .collect();
        for (other, named) in claimed {
            let give = match self.services.get(&other) {
                Some(svc) => named.unnamed_by(&self.read(svc)),
                None => named,
            };
            if let Some(held) = self.held.refused.get_mut(&other) {
                held.fresh = held.fresh.without(&give);
                if held.fresh.is_empty() {
                    self.held.refused.remove(&other);
                }
            }
            self.tidy(&other);
            if !give.is_empty() {
                tracing::debug!(service = %other, to = %key, ?give, "what a refused write would have named goes to the Service naming it");
            }
            freed |= self.let_go(&other, &give);
        }
        if freed {
            self.wake_waiting(Some(key));
        }
        carried
    }

    fn let_go(&mut self, key: &ServiceKey, fresh: &Fresh) -> bool {
        if !release_fresh(&mut self.alloc, key, fresh) {
            return false;
        }
        tracing::debug!(service = %key, ?fresh, "released what a refused write would have named");
        if !fresh.lb_ips.is_empty() {
            self.schedule_pool_status();
        }
        true
    }

    /// The write about to start names `fresh` for the first time, made against `version`.
    pub(super) fn hold_in_flight(
        &mut self,
        key: &ServiceKey,
        version: Option<String>,
        fresh: Fresh,
    ) {
        if !fresh.is_empty() {
            self.held
                .in_flight
                .insert(key.clone(), Unwritten { version, fresh });
        }
    }

    /// The write in flight for `key` ended: refused (`refused`, with the version the refused
    /// write carried when a spec write before it landed), what it would have named is held
    /// as refused; otherwise it is the Service's object's to name, and nothing more is held.
    pub(super) fn end_in_flight(
        &mut self,
        key: &ServiceKey,
        refused: Option<Write>,
        spec_version: Option<String>,
    ) {
        let Some(u) = self.held.in_flight.remove(key) else {
            return;
        };
        if let Some(write) = refused {
            let version = match write {
                Write::Status => spec_version.or(u.version),
                Write::Spec => u.version,
            };
            self.hold_refused(key, version, u.fresh.unwritten(write));
        }
    }

    /// The plan frees the addresses of a Service that stops being a LoadBalancer at once,
    /// but its status names them until the clearing write (`ingress`) lands. Given to another
    /// Service meanwhile, a crash in between would leave two Services naming one address, and
    /// the next leader would take it from one of them. So they stay held until then.
    pub(crate) fn withhold_until_cleared(
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
            self.held.clearing.remove(key);
            return;
        }
        if before.is_empty() || !self.alloc.lb.ips_of(key).is_empty() {
            return;
        }
        let mut view = facts.lb_view.clone();
        view.namespace_labels = labels.clone();
        // Held outside the pools too (`keep`): an address whose pool went (with no grace) is
        // in none now, but a pool re-created with it before the clearing lands — or after a
        // clearing refused as stale — would otherwise give it to another Service while this
        // one's status still names it.
        if self.alloc.lb.adopt(key, &view, before).is_ok()
            || self.alloc.lb.keep(key, &view, before).is_ok()
        {
            self.held.clearing.insert(key.clone());
        }
    }
}

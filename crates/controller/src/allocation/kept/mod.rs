//! Addresses a Service keeps although the pools no longer give them to it: an address that
//! left every IPPool (its pool deleted, or narrowed), or the address a Service held before it
//! named an IPPool that does not exist. The Service keeps it — nobody else is given it, and a
//! pool re-created with it counts it again and gives it back, so a delete and re-create changes
//! nothing clients can see — and is decided again when it changes (its requested addresses,
//! pool, sharing key, IP families or class) or when its grace runs out.
//!
//! A pool gone keeps the address for `--pool-gone-grace` (MetalLB's behaviour, `never`, by
//! default); a pool not found for the same grace when it is set, else for
//! [`POOL_NOT_FOUND_GRACE`]: long enough for a tool that applies the Service before the pool,
//! not so long that a misspelt name blocks the address for good.

use std::net::IpAddr;

use berth_api::names::condition::{self as cond, reason};
use berth_ipam::{PoolSpec, ServiceKey};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use self::keepers::{Keeping, LbAsk, POOL_NOT_FOUND_GRACE};
use super::cluster_addresses::is_cluster_address;
use super::facts::ServiceFacts;
use super::plan::{pools_give_held, Allocation, Failure, Keep, Kept};
use super::state::AllocationState;

pub(super) mod keepers;

impl AllocationState {
    /// After the pools changed (or a leader adopted what the Services name): every Service
    /// whose addresses the pools as they are would no longer give it keeps them, as it asks
    /// for now. `previous` are the pools before the change, to name the one an address was in.
    pub(super) fn note_pool_change(&mut self, previous: &[PoolSpec]) {
        let mut taken: Vec<ServiceKey> = Vec::new();
        for (key, svc) in &self.services {
            // Held for a pool not found, they were not given by the pools before either.
            let not_found = self.keepers.keeping.get(key).is_some_and(|k| !k.gone);
            if not_found || self.alloc.lb.ips_of(key).is_empty() {
                continue;
            }
            let facts = self.read(svc);
            let labels = self.labels_of_namespace(&key.namespace);
            if !pools_give_held(&mut self.alloc, &facts, &labels) {
                taken.push(key.clone());
            }
        }
        if taken.is_empty() {
            return;
        }
        let mut before = berth_ipam::LbIpAllocator::<ServiceKey>::new();
        let named = before.set_pools(previous.to_vec()).is_ok();
        taken.sort();
        for key in taken {
            let held = self.alloc.lb.ips_of(&key);
            // The cluster's own addresses are never kept: the Service is decided again at once
            // and loses them.
            if held.iter().any(|ip| is_cluster_address(&self.cluster, *ip)) {
                tracing::warn!(service = %key, ips = ?held, "the Service holds an address of the cluster's own; it loses it");
                self.keepers.keeping.remove(&key);
                self.queue.mark(key);
                continue;
            }
            let pool = held
                .iter()
                .filter(|_| named)
                .find_map(|ip| before.pool_of(*ip).map(str::to_string));
            tracing::info!(service = %key, ips = ?held, pool = ?pool, "the pools no longer give the Service its address; it keeps it");
            self.start_keeping(&key, pool);
        }
        self.schedule_pool_status();
    }

    /// The Service keeps what it holds as taken by a pool change (`pool`: the one it was in).
    pub(super) fn start_keeping(&mut self, key: &ServiceKey, pool: Option<String>) {
        let Some(svc) = self.services.get(key).cloned() else {
            return;
        };
        let ask = LbAsk::of(&self.read(&svc));
        let k = self.keepers.keeping.entry(key.clone()).or_insert(Keeping {
            ask,
            gone: true,
            pool: None,
            since: None,
            deadline: None,
        });
        k.gone = true;
        if k.pool.is_none() {
            k.pool = pool;
        }
    }

    /// What the Service may keep of what the pools no longer give it: what a pool change
    /// took, while it has not changed since and its grace has not run out; the address it
    /// held when it named a pool that does not exist, until that grace runs out.
    pub(super) fn may_keep(&mut self, key: &ServiceKey, facts: &ServiceFacts, now: &Time) -> Keep {
        let Some(k) = self.keepers.keeping.get(key) else {
            return Keep {
                pool_gone: false,
                pool_not_found: true,
            };
        };
        let changed = k.ask != LbAsk::of(facts);
        let expired = k.deadline.is_some_and(|d| d <= now.0);
        let gone = k.gone;
        if changed || expired {
            tracing::info!(service = %key, changed, expired, "the Service no longer keeps its address");
            self.stop_keeping(key);
            return Keep {
                pool_gone: false,
                pool_not_found: changed && !expired,
            };
        }
        Keep {
            pool_gone: gone,
            pool_not_found: true,
        }
    }

    /// After a decision: starts, goes on or stops keeping, and says in the condition and the
    /// Event what is kept and until when. False when the grace has run out already (a grace of
    /// nothing): the Service is to be decided without keeping.
    pub(super) fn note_kept(
        &mut self,
        key: &ServiceKey,
        svc: &Service,
        facts: &ServiceFacts,
        out: &mut Allocation,
        now: &Time,
    ) -> bool {
        let Some(kept) = out.kept.clone() else {
            self.stop_keeping(key);
            return true;
        };
        let grace = match &kept {
            Kept::PoolGone => self.keepers.grace,
            Kept::PoolNotFound { .. } => Some(self.keepers.grace.unwrap_or(POOL_NOT_FOUND_GRACE)),
        };
        let first_seen = kept_since(svc).unwrap_or(now.0);
        let k = self
            .keepers
            .keeping
            .entry(key.clone())
            .or_insert_with(|| Keeping {
                ask: LbAsk::of(facts),
                gone: false,
                pool: None,
                since: None,
                deadline: None,
            });
        let since = *k.since.get_or_insert(first_seen);
        let deadline = grace
            .and_then(|g| SignedDuration::try_from(g).ok())
            .and_then(|g| since.checked_add(g).ok());
        if deadline.is_some_and(|d| d <= now.0) {
            self.stop_keeping(key);
            return false;
        }
        let old = std::mem::replace(&mut k.deadline, deadline);
        let pool = k.pool.clone();
        self.keepers.reschedule(key, old, deadline);
        let held = self.alloc.lb.ips_of(key);
        let until = match deadline {
            Some(d) => format!("until {d}"),
            None => "until the Service changes".to_string(),
        };
        let message = match (&kept, &pool) {
            (Kept::PoolGone, Some(p)) => format!(
                "IPPool {p:?} no longer contains {}; the Service keeps it {until}",
                ip_texts(&held)
            ),
            (Kept::PoolGone, None) => format!(
                "{} is in no IPPool any more; the Service keeps it {until}",
                ip_texts(&held)
            ),
            (Kept::PoolNotFound { pool }, _) => format!(
                "IPPool {pool:?} not found; the Service keeps {} {until}",
                ip_texts(&held)
            ),
        };
        if let Some(Err(f)) = &mut out.result {
            *f = Failure {
                reason: f.reason,
                message,
            };
        }
        true
    }

    /// Ends keeping: the Service is decided as any other from now on.
    pub(super) fn stop_keeping(&mut self, key: &ServiceKey) {
        if self.keepers.forget(key) {
            self.schedule_pool_status();
        }
    }

    /// When the earliest grace runs out.
    pub(crate) fn next_deadline(&self) -> Option<Time> {
        self.keepers.deadlines.first().map(|(t, _)| Time(*t))
    }

    /// Services whose grace has run out by `now` are decided again.
    pub(crate) fn deadlines_due(&mut self, now: &Time) {
        while let Some((t, key)) = self.keepers.deadlines.first().cloned() {
            if t > now.0 {
                break;
            }
            self.keepers.deadlines.remove(&(t, key.clone()));
            self.queue.mark(key);
        }
    }

    /// LoadBalancer addresses held by Services that no pool contains.
    pub(super) fn count_kept(&self) -> usize {
        self.keepers
            .keeping
            .keys()
            .flat_map(|k| self.alloc.lb.ips_of(k))
            .filter(|ip| self.alloc.lb.pool_of(*ip).is_none())
            .count()
    }
}

/// When the Service's condition first said it keeps an address (a restart goes on counting
/// from there).
fn kept_since(svc: &Service) -> Option<Timestamp> {
    svc.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| {
            c.type_ == cond::ALLOCATED
                && c.status == cond::FALSE
                && (c.reason == reason::POOL_GONE || c.reason == reason::POOL_NOT_FOUND)
        })
        .map(|c| c.last_transition_time.0)
}

fn ip_texts(ips: &[IpAddr]) -> String {
    let texts: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
    texts.join(", ")
}

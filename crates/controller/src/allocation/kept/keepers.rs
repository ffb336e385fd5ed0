//! Who keeps addresses the pools no longer give them, and until when: the data of the keeping
//! room. The state machine owns one [`Keepers`]; only the room (`kept`) reads or changes its
//! fields.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use berth_api::names::event as ev;
use berth_ipam::ServiceKey;
use k8s_openapi::jiff::Timestamp;

use crate::allocation::facts::{LbClass, ServiceFacts};
use crate::allocation::plan::{Allocation, Kept};

/// How long a Service keeps its address after naming a pool that does not exist, unless
/// `--pool-gone-grace` says otherwise.
pub(crate) const POOL_NOT_FOUND_GRACE: Duration = Duration::from_secs(300);

/// What of a Service decides which address it gets: a change of any of it is a change of the
/// Service, which ends keeping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LbAsk {
    requested_ips: Vec<IpAddr>,
    requested_pool: Option<String>,
    sharing_key: Option<String>,
    families: Vec<berth_core::IpFamily>,
    l2: bool,
}

impl LbAsk {
    pub(crate) fn of(f: &ServiceFacts) -> Self {
        let v = &f.lb_view;
        Self {
            requested_ips: v.requested_ips.clone(),
            requested_pool: v.requested_pool.clone(),
            sharing_key: v.sharing_key.clone(),
            families: v.families.clone(),
            l2: f.lb_class == LbClass::L2,
        }
    }
}

/// A Service keeping addresses, or about to (its address left every pool and it has not been
/// decided since).
#[derive(Debug)]
pub(crate) struct Keeping {
    /// What the Service asked for when it started keeping.
    pub(super) ask: LbAsk,
    /// A pool change took the addresses (else: the Service named a pool not found).
    pub(super) gone: bool,
    /// The pool the address was in, when known (not after a restart).
    pub(super) pool: Option<String>,
    /// When it was first decided as keeping, and the time its grace runs out.
    pub(super) since: Option<Timestamp>,
    pub(super) deadline: Option<Timestamp>,
}

/// Every Service keeping addresses, and when each one's grace runs out. Only the keeping room
/// reads or changes it; the state machine asks and tells through that room's methods on its
/// state.
#[derive(Debug)]
pub(in crate::allocation) struct Keepers {
    /// `--pool-gone-grace`.
    pub(super) grace: Option<Duration>,
    pub(super) keeping: HashMap<ServiceKey, Keeping>,
    /// When the grace of each Service keeping an address runs out.
    pub(super) deadlines: BTreeSet<(Timestamp, ServiceKey)>,
}

impl Keepers {
    pub(in crate::allocation) fn new(grace: Option<Duration>) -> Self {
        Self {
            grace,
            keeping: HashMap::new(),
            deadlines: BTreeSet::new(),
        }
    }

    /// Whether `key` keeps (or is about to keep) addresses.
    #[cfg(test)]
    pub(in crate::allocation) fn keeps(&self, key: &ServiceKey) -> bool {
        self.keeping.contains_key(key)
    }

    /// Ends keeping for `key`; whether it kept anything.
    pub(super) fn forget(&mut self, key: &ServiceKey) -> bool {
        let Some(k) = self.keeping.remove(key) else {
            return false;
        };
        if let Some(d) = k.deadline {
            self.deadlines.remove(&(d, key.clone()));
        }
        true
    }

    /// Moves `key`'s deadline from `old` to `new`.
    pub(super) fn reschedule(
        &mut self,
        key: &ServiceKey,
        old: Option<Timestamp>,
        new: Option<Timestamp>,
    ) {
        if old != new {
            if let Some(d) = old {
                self.deadlines.remove(&(d, key.clone()));
            }
            if let Some(d) = new {
                self.deadlines.insert((d, key.clone()));
            }
        }
    }
}

/// The Event reason a kept address's condition is announced with.
pub(crate) fn event_reason(out: &Allocation) -> &'static str {
    match out.kept {
        Some(Kept::PoolGone) => ev::POOL_GONE,
        _ => ev::ALLOCATION_FAILED,
    }
}

//! What Services hold beyond what their objects name: the data of the holding room. The state
//! machine owns one [`Held`]; only the room (`held`) reads or changes its fields.

use std::collections::{HashMap, HashSet};

use berth_ipam::ServiceKey;

use crate::allocation::fresh::Fresh;

/// Values only a decision's writes would name (see `fresh`), and the version of the Service
/// those writes were made against.
#[derive(Debug)]
pub(super) struct Unwritten {
    pub(super) version: Option<String>,
    pub(super) fresh: Fresh,
}

/// What Services hold beyond what their objects name, per Service. Only the holding room reads
/// or changes it; the state machine asks and tells through that room's methods on its state.
#[derive(Debug, Default)]
pub(in crate::allocation) struct Held {
    /// Services holding LoadBalancer addresses their type no longer uses until the write
    /// clearing their status has landed (see `withhold_until_cleared`).
    pub(super) clearing: HashSet<ServiceKey>,
    /// What the decision behind a Service's write in flight newly gave it; kept as `refused`
    /// when the write naming it is refused.
    pub(super) in_flight: HashMap<ServiceKey, Unwritten>,
    /// What refused writes would have named: held until the Service is decided again from a
    /// newer version, which lets go of what that version does not name (see `settle_refused`).
    pub(super) refused: HashMap<ServiceKey, Unwritten>,
}

impl Held {
    /// Whether anything is held for `key`.
    #[cfg(test)]
    pub(in crate::allocation) fn holds(&self, key: &ServiceKey) -> bool {
        let Self {
            clearing,
            in_flight,
            refused,
        } = self;
        clearing.contains(key) || in_flight.contains_key(key) || refused.contains_key(key)
    }

    /// Forgets everything held for `key` (the allocators release its values).
    pub(in crate::allocation) fn forget(&mut self, key: &ServiceKey) {
        let Self {
            clearing,
            in_flight,
            refused,
        } = self;
        clearing.remove(key);
        in_flight.remove(key);
        refused.remove(key);
    }
}

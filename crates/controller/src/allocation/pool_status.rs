//! IPPool status from the allocators' counts: a write where a pool shows something else, at
//! most one per pool at a time, and the counts mirrored into the pool metrics.

use berth_api::{IPPool, IPPoolStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::cache::name_of;
use super::cluster_addresses::pool_collisions;
use super::pools::{build_pool_status, collision_event, pool_overlaps};
use super::state::AllocationState;
use crate::error::ErrorCategory;

/// What the loop is to do for the pools: their status writes, computed from the allocators.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PoolStatusWrite {
    pub(crate) pool: String,
    pub(crate) status: IPPoolStatus,
    /// The note of a Warning Event to record once the status is written: the pool newly
    /// collides with the cluster's own addresses.
    pub(crate) collision_event: Option<String>,
    /// The pool as the state machine knows it, for the Event's object reference.
    pub(crate) object: IPPool,
}

impl AllocationState {
    /// The status writes the pools need: their counts as the allocators see them, where the
    /// pool shows something else and no write for it is in flight. Mirrors the counts into
    /// the pool metrics.
    pub(crate) fn pool_status_writes(&mut self, now: &Time) -> Vec<PoolStatusWrite> {
        let kept = i64::try_from(self.count_kept()).unwrap_or(i64::MAX);
        self.metrics.kept_addresses.set(kept);
        let pools: Vec<IPPool> = self.pools.objects.values().cloned().collect();
        let overlaps = pool_overlaps(&pools);
        let collisions = pool_collisions(
            pools.iter().map(|p| {
                (
                    p.metadata.name.as_deref().unwrap_or_default(),
                    p.spec.addresses.as_slice(),
                )
            }),
            &self.cluster,
        );
        let mut writes = Vec::new();
        for pool in pools {
            let name = name_of(&pool);
            let counts = self.alloc.lb.pool_status(&name);
            for (family, assigned, available) in counts.iter().flat_map(|c| {
                [
                    ("IPv4", c.assigned_ipv4, c.available_ipv4),
                    ("IPv6", c.assigned_ipv6, c.available_ipv6),
                ]
            }) {
                for (state, v) in [("assigned", assigned), ("available", available)] {
                    self.metrics
                        .pool_addresses
                        .get_or_create(&vec![
                            ("pool", name.clone()),
                            ("family", family.to_string()),
                            ("state", state.to_string()),
                        ])
                        .set(i64::try_from(v).unwrap_or(i64::MAX));
                }
            }
            let status = build_pool_status(
                &pool,
                counts,
                self.pool_problems.get(&name).map(String::as_str),
                overlaps.get(&name).map(Vec::as_slice).unwrap_or(&[]),
                collisions.get(&name).map(String::as_str),
                now.clone(),
            );
            if pool.status.as_ref() == Some(&status) {
                continue;
            }
            if !self.pools_in_flight.insert(name.clone()) {
                self.schedule_pool_status();
                continue;
            }
            let collision_event = collision_event(pool.status.as_ref(), &status);
            writes.push(PoolStatusWrite {
                pool: name,
                status,
                collision_event,
                object: pool,
            });
        }
        writes
    }

    /// A pool status write ended: on success the pool shows `status` now.
    pub(crate) fn pool_status_done(
        &mut self,
        name: &str,
        result: Result<IPPoolStatus, ErrorCategory>,
    ) {
        self.pools_in_flight.remove(name);
        match result {
            Ok(status) => {
                if let Some(p) = self.pools.objects.get_mut(name) {
                    p.status = Some(status);
                }
            }
            Err(category) => {
                self.metrics.error(category);
                self.schedule_pool_status();
            }
        }
    }
}

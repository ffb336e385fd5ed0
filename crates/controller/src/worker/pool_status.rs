//! IPPool status from the allocator's counts: written when it differs from what the pool
//! shows, at most one write per pool at a time, and mirrored into the pool metrics.

use berth_api::IPPool;
use futures::FutureExt;
use kube::api::{Api, Patch};

use super::{name_of, Done, Worker};
use crate::apply::{self, writer_params};
use crate::error::ErrorCategory;
use crate::pools::{build_pool_status, pool_overlaps};

impl Worker {
    pub(super) fn write_pool_statuses(&mut self) {
        self.pool_status_due = None;
        let pools: Vec<IPPool> = self.pools.objects.values().cloned().collect();
        let overlaps = pool_overlaps(&pools);
        let now = apply::now();
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
                now.clone(),
            );
            if pool.status.as_ref() == Some(&status) {
                continue;
            }
            if !self.pools_in_flight.insert(name.clone()) {
                self.schedule_pool_status();
                continue;
            }
            let api: Api<IPPool> = Api::all(self.client.clone());
            let ctx = self.ctx.clone();
            self.jobs.push(
                async move {
                    if !*ctx.leading.borrow() {
                        return Done::Pool(name, Err(ErrorCategory::NotLeading));
                    }
                    ctx.metrics.write("pool_status");
                    let patch = serde_json::json!({ "status": status });
                    let result = api
                        .patch_status(&name, &writer_params(), &Patch::Merge(&patch))
                        .await
                        .map(|_| status)
                        .map_err(|e| ErrorCategory::of_api(&e));
                    Done::Pool(name, result)
                }
                .boxed(),
            );
        }
    }
}

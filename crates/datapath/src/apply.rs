//! A lean planner ([`Planner::lean`]) and a Syncer driven together, as the agent drives them:
//! plan what changed (for a full sync, every Service — or, when the Syncer takes Service chains
//! shard by shard, none of them, to be planned as the load reaches each shard), apply partially
//! when the Syncer can, else fill the planner and apply in full, and let the planner release the
//! chains a successful apply wrote. Two steps because the agent plans under its index's lock
//! and applies outside it.

use crate::backend::{SyncReport, SyncRuleset};
use crate::error::Error;
use crate::nft::Shards;
use crate::plan::input::NodeView;
use crate::plan::names::service_port_hash;
use crate::plan::{Changes, Planner, PortGroups};

/// Plans for the next apply: `update` brings `planner` to `view` when the sync will be
/// partial; a full sync not `streamed` fills the planner from `view`. A full sync over
/// `streamed` shards keeps no Service chain and returns a copy of the view's ports, shard by
/// shard, for [`apply_planned`] to plan them from. The changes are the planner's to take.
pub fn plan_for_sync(
    planner: &mut Planner,
    view: &NodeView,
    full_sync: bool,
    streamed: Option<Shards>,
    update: impl FnOnce(&mut Planner),
) -> Option<PortGroups> {
    match (full_sync, streamed) {
        (true, Some(shards)) => {
            planner.update_without_service_chains(view);
            Some(PortGroups::new(view, |name, protocol| {
                shards.of_service_port(&service_port_hash(name, protocol))
            }))
        }
        // A full sync's fill brings the planner to `view` itself: updating first would
        // fingerprint every port twice.
        (true, None) => {
            planner.fill(view);
            None
        }
        (false, _) => {
            update(planner);
            None
        }
    }
}

/// Applies what `planner` planned, `changes` being everything planned since the last
/// successful apply: in full from a complete ruleset, streamed over `ports` (from
/// [`plan_for_sync`]), else partially — and when the Syncer finds a full sync due that the
/// planner was not made ready for, `fill` brings the planner to the current view and fills it
/// first. After a success `changes` is empty and the planner has let the applied chains go.
pub fn apply_planned(
    syncer: &mut dyn SyncRuleset,
    planner: &mut Planner,
    changes: &mut Changes,
    ports: Option<PortGroups>,
    fill: impl FnOnce(&mut Planner),
) -> Result<SyncReport, Error> {
    let result = if planner.is_complete() {
        syncer.sync_changes(planner.ruleset(), changes)
    } else {
        let attempt = match ports {
            Some(mut ports) => syncer.sync_streamed(planner, &mut ports),
            None => syncer.sync_partial(planner.ruleset(), changes),
        };
        match attempt {
            Ok(Some(report)) => Ok(report),
            Ok(None) => {
                fill(planner);
                let filled = planner.take_changes();
                *changes = std::mem::replace(changes, Changes::All).merge(filled);
                syncer.sync_changes(planner.ruleset(), changes)
            }
            Err(err) => Err(err),
        }
    };
    if result.is_ok() {
        *changes = Changes::Chains(Default::default());
        planner.release();
    }
    result
}

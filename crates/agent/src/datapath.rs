//! One address family's datapath: the incremental planner and the Syncer that applies its
//! rulesets, plus [`SharedIptables`] so a caller can look at the iptables it handed over.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use berth_core::IpFamily;
use berth_datapath::apply::{apply_planned, plan_for_sync};
use berth_datapath::backend::{SyncReport, SyncRuleset};
use berth_datapath::iptables::{remove_berth_rules, Iptables, Syncer};
use berth_datapath::nft::shard::DEFAULT_SHARDS;
use berth_datapath::nft::{remove_table, Nft, NftSyncer, Shards};
use berth_datapath::{
    rewritten_every_sync, ChainName, Changes, JumpRule, NodeView, Payload, PlanOptions, Planner,
    PortGroups, Table,
};

use crate::index::{ChangedServices, Index};
use crate::schedule::SyncScope;

/// An [`Iptables`] behind a mutex; clones share it.
#[derive(Debug, Default)]
pub struct SharedIptables<I>(Arc<Mutex<I>>);

impl<I> Clone for SharedIptables<I> {
    fn clone(&self) -> Self {
        SharedIptables(self.0.clone())
    }
}

impl<I> SharedIptables<I> {
    pub fn new(iptables: I) -> Self {
        SharedIptables(Arc::new(Mutex::new(iptables)))
    }

    pub fn lock(&self) -> MutexGuard<'_, I> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<I: Iptables> Iptables for SharedIptables<I> {
    fn restore(&mut self, payload: &dyn Payload) -> Result<(), berth_datapath::Error> {
        self.lock().restore(payload)
    }

    fn save(&mut self, table: Table) -> Result<String, berth_datapath::Error> {
        self.lock().save(table)
    }

    fn ensure_chain(
        &mut self,
        table: Table,
        chain: &ChainName,
    ) -> Result<(), berth_datapath::Error> {
        self.lock().ensure_chain(table, chain)
    }

    fn chain_exists(
        &mut self,
        table: Table,
        chain: &ChainName,
    ) -> Result<bool, berth_datapath::Error> {
        self.lock().chain_exists(table, chain)
    }

    fn ensure_jump(&mut self, jump: &JumpRule) -> Result<(), berth_datapath::Error> {
        self.lock().ensure_jump(jump)
    }
}

/// An nftables executor the agent can move to its sync thread.
pub type BoxedNft = Box<dyn Nft + Send>;

/// One family's Syncer, on the backend the agent runs.
enum Applier<I> {
    Iptables(Syncer<I>),
    Nftables(NftSyncer<BoxedNft>),
}

/// Removes berth's rules from the backend the agent does not run, once, before its first sync.
type Cleanup = Box<dyn FnMut() -> Result<(), berth_datapath::Error> + Send>;

/// A node without the other backend's tool has nothing of berth's there to remove.
fn tool_absent_is_clean(
    result: Result<(), berth_datapath::Error>,
) -> Result<(), berth_datapath::Error> {
    match result {
        Err(berth_datapath::Error::Spawn { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(())
        }
        other => other,
    }
}

pub struct FamilyDatapath<I> {
    family: IpFamily,
    planner: Planner,
    syncer: Applier<I>,
    changes: Changes,
    cleanup: Option<Cleanup>,
    /// The Service ports a full sync plans its Service chains from, a group at a time, when
    /// the planner kept none of them ([`FamilyDatapath::plan`]).
    streamed: Option<PortGroups>,
}

impl<I: Iptables + Send + 'static> FamilyDatapath<I> {
    /// The iptables backend; `nft`, when given, is where berth's nftables table is removed.
    pub fn new(options: PlanOptions, iptables: I, nft: Option<BoxedNft>) -> Self {
        let syncer =
            Syncer::new(iptables).rewriting_every_sync(rewritten_every_sync(options.dispatch));
        let family = options.family;
        let cleanup =
            nft.map(|mut nft| -> Cleanup { Box::new(move || nft.apply(&remove_table(family))) });
        FamilyDatapath {
            family,
            // The Syncer keeps every chain's name: it shares the cache's.
            planner: Planner::new(options).lean().keeping_endpoint_names(),
            syncer: Applier::Iptables(syncer),
            changes: Changes::All,
            cleanup,
            streamed: None,
        }
    }

    /// The nftables backend; `iptables` is where berth's chains and jumps are removed.
    /// Service chains spread over `shards` nat shards.
    pub fn nftables(options: PlanOptions, nft: BoxedNft, mut iptables: I, shards: Shards) -> Self {
        let family = options.family;
        FamilyDatapath {
            family,
            planner: Planner::new(options).lean(),
            syncer: Applier::Nftables(
                NftSyncer::new(nft, family)
                    .with_shards(shards)
                    .with_staged_cold_load(true),
            ),
            changes: Changes::All,
            cleanup: Some(Box::new(move || {
                tool_absent_is_clean(remove_berth_rules(&mut iptables).map(|_| ()))
            })),
            streamed: None,
        }
    }
    pub fn family(&self) -> IpFamily {
        self.family
    }

    pub fn family_name(&self) -> &'static str {
        self.family.as_str()
    }

    /// Plans with `cidrs` as the cluster's Service CIDRs; a change makes the next plan and
    /// apply full.
    pub fn set_service_cidrs(&mut self, cidrs: &[ipnet::IpNet]) {
        self.planner.set_service_cidrs(cidrs);
    }

    /// Brings the planned ruleset to `view`: every Service when `scope.replan`, else those in
    /// `changed`. The planner is lean (it lets Service chains go once applied): when the apply
    /// that follows will be full (`scope.rewrite`, or the Syncer has no state), it keeps none
    /// and the apply plans them again as it writes them (unsharded nftables: every Service's
    /// chains are planned now). A replan alone (the periodic sync) is partial: what it finds
    /// changed, usually nothing.
    pub fn plan(&mut self, view: &NodeView, changed: &ChangedServices, scope: SyncScope) {
        let full = scope.replan;
        let full_sync = scope.rewrite || self.changes == Changes::All || self.full_sync_due();
        // A full sync plans the Service chains again as it writes them (iptables) or as the
        // load reaches each shard (nftables), from a copy of this view's ports (a tenth of the
        // plan's size): never all at once.
        let streamed = self.streamed_shards();
        self.streamed = plan_for_sync(&mut self.planner, view, full_sync, streamed, |planner| {
            if full {
                planner.update(view);
            } else {
                planner.update_changed(view, &|port| changed.contains_port(port));
            }
        });
        self.take_planned();
    }

    fn full_sync_due(&self) -> bool {
        match &self.syncer {
            Applier::Iptables(syncer) => SyncRuleset::full_sync_due(syncer),
            Applier::Nftables(syncer) => SyncRuleset::full_sync_due(syncer),
        }
    }

    /// How a full sync plans the Service chains, a group of ports at a time: by nftables
    /// shard (each shard a table of its own), or on iptables in as many groups as the default
    /// shards. Unsharded nftables keeps every Service chain in one table: planned whole.
    fn streamed_shards(&self) -> Option<Shards> {
        match &self.syncer {
            Applier::Nftables(syncer) if syncer.shards().is_sharded() => Some(syncer.shards()),
            Applier::Nftables(_) => None,
            Applier::Iptables(_) => Shards::new(DEFAULT_SHARDS).ok(),
        }
    }

    fn take_planned(&mut self) {
        let changes = self.planner.take_changes();
        self.changes = std::mem::replace(&mut self.changes, Changes::All).merge(changes);
    }

    /// Applies the planned ruleset: all of it when `full`, else the chains planned since the
    /// last successful apply. A full sync the planner was not made ready for (the Syncer found
    /// its state gone, or `full` without a full plan) first plans every Service again from
    /// `index`'s view; a successful apply lets the planner release the chains it applied.
    pub fn apply(
        &mut self,
        full: bool,
        index: &Mutex<Index>,
    ) -> Result<SyncReport, berth_datapath::Error> {
        if let Some(cleanup) = &mut self.cleanup {
            // Kept until it succeeds: a failure fails this sync and is tried again.
            cleanup()?;
            self.cleanup = None;
        }
        let syncer: &mut dyn SyncRuleset = match &mut self.syncer {
            Applier::Iptables(syncer) => syncer,
            Applier::Nftables(syncer) => syncer,
        };
        if full {
            syncer.force_full_sync();
        }
        apply_planned(
            syncer,
            &mut self.planner,
            &mut self.changes,
            self.streamed.take(),
            |planner| planner.fill(index.lock().unwrap_or_else(PoisonError::into_inner).view()),
        )
    }

    /// The iptables the datapath programs; `None` on the nftables backend.
    pub fn iptables(&self) -> Option<&I> {
        match &self.syncer {
            Applier::Iptables(syncer) => Some(syncer.iptables()),
            Applier::Nftables(_) => None,
        }
    }

    /// Rules of berth's chains in each table of the planned ruleset (what the last successful
    /// apply wrote), for kube-proxy's `sync_proxy_rules_iptables_total`.
    pub fn rules_by_table(&self) -> Vec<(&'static str, usize)> {
        self.planner
            .rule_counts()
            .into_iter()
            .map(|(table, count)| (table.as_str(), count))
            .collect()
    }

    pub fn backend_name(&self) -> &'static str {
        match &self.syncer {
            Applier::Iptables(_) => "iptables",
            Applier::Nftables(_) => "nftables",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_tool_means_nothing_to_remove() {
        let missing = berth_datapath::Error::Spawn {
            command: "nft -f -".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert!(tool_absent_is_clean(Err(missing)).is_ok());
        let denied = berth_datapath::Error::Spawn {
            command: "nft -f -".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        };
        assert!(tool_absent_is_clean(Err(denied)).is_err());
        let refused = berth_datapath::Error::Restore { reason: "x".into() };
        assert!(tool_absent_is_clean(Err(refused)).is_err());
    }
}

//! One address family's datapath: the incremental planner and the Syncer that applies its
//! rulesets, plus [`SharedIptables`] so a caller can look at the iptables it handed over.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use berth_core::IpFamily;
use berth_datapath::sync::{Iptables, SyncReport, Syncer};
use berth_datapath::{
    rewritten_every_sync, ChainName, Changes, JumpRule, NodeView, Payload, PlanOptions, Planner,
    Table,
};

use crate::index::ChangedServices;

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

pub struct FamilyDatapath<I> {
    family: IpFamily,
    planner: Planner,
    syncer: Syncer<I>,
    changes: Changes,
}

impl<I: Iptables> FamilyDatapath<I> {
    pub fn new(options: PlanOptions, iptables: I) -> Self {
        let syncer =
            Syncer::new(iptables).rewriting_every_sync(rewritten_every_sync(options.dispatch));
        FamilyDatapath {
            family: options.family,
            planner: Planner::new(options),
            syncer,
            changes: Changes::All,
        }
    }

    pub fn family(&self) -> IpFamily {
        self.family
    }

    pub fn family_name(&self) -> &'static str {
        self.family.as_str()
    }

    /// Brings the planned ruleset to `view`: every Service when `full`, else those in `changed`.
    pub fn plan(&mut self, view: &NodeView, changed: &ChangedServices, full: bool) {
        if full {
            self.planner.update(view);
        } else {
            self.planner
                .update_changed(view, &|port| changed.contains_port(port));
        }
        let changes = self.planner.take_changes();
        self.changes = match (std::mem::replace(&mut self.changes, Changes::All), changes) {
            (Changes::Chains(mut before), Changes::Chains(now)) => {
                before.extend(now);
                Changes::Chains(before)
            }
            _ => Changes::All,
        };
    }

    /// Applies the planned ruleset: all of it when `full`, else the chains planned since the
    /// last successful apply.
    pub fn apply(&mut self, full: bool) -> Result<SyncReport, berth_datapath::Error> {
        if full {
            self.syncer.force_full_sync();
        }
        let result = self
            .syncer
            .sync_changes(self.planner.ruleset(), &self.changes);
        if result.is_ok() {
            self.changes = Changes::Chains(Default::default());
        }
        result
    }

    pub fn iptables(&self) -> &I {
        self.syncer.iptables()
    }
}

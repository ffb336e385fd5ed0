//! What every backend shares: the text a tool reads ([`Payload`]), what a sync did
//! ([`SyncReport`]), and what the agent needs of a backend's syncer ([`SyncRuleset`]). The tool
//! traits themselves ([`crate::iptables::Iptables`], [`crate::nft::Nft`]) live with the syncer
//! that drives them, so no backend needs the other.

use std::io::{self, Write};

use crate::error::Error;
use crate::plan::incremental::Changes;
use crate::plan::model::Ruleset;
use crate::plan::{Planner, PortGroups};

/// A restore payload that writes itself into the pipe (or buffer) it is given.
pub trait Payload {
    fn write_to(&self, out: &mut dyn Write) -> io::Result<()>;
}

impl Payload for str {
    fn write_to(&self, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(self.as_bytes())
    }
}

impl Payload for String {
    fn write_to(&self, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(self.as_bytes())
    }
}

impl Payload for &str {
    fn write_to(&self, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(self.as_bytes())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncKind {
    Full,
    Partial,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncReport {
    pub kind: SyncKind,
    pub rewritten_chains: usize,
    pub deleted_chains: usize,
    pub payload_bytes: usize,
    pub rule_count: usize,
}

/// What the agent needs of a backend's Syncer, whichever programs the kernel.
pub trait SyncRuleset {
    /// See [`crate::iptables::Syncer::sync_changes`].
    fn sync_changes(&mut self, rs: &Ruleset, changes: &Changes) -> Result<SyncReport, Error>;
    /// [`SyncRuleset::sync_changes`] when it can be partial, reading only the chains `changes`
    /// names; `None`, having done nothing, when a full sync is due (it needs the whole ruleset:
    /// see [`crate::plan::Planner::is_complete`]).
    fn sync_partial(
        &mut self,
        rs: &Ruleset,
        changes: &Changes,
    ) -> Result<Option<SyncReport>, Error>;
    /// A full sync of a lean planner's ruleset without its Service ports' own chains (see
    /// [`crate::plan::Planner::update_without_service_chains`]), which it plans from `ports` a
    /// group at a time as it writes them: iptables as it writes the restore payload, nftables
    /// as a cold load or an adoption reaches each shard. `None`, having done nothing, when this
    /// Syncer cannot (nftables without shards, or over tables it cannot repair in place): then
    /// a full sync of the whole ruleset is due.
    fn sync_streamed(
        &mut self,
        planner: &Planner,
        ports: &mut PortGroups,
    ) -> Result<Option<SyncReport>, Error>;
    fn force_full_sync(&mut self);
    /// Whether the next sync is full whatever the changes, as far as is known without asking
    /// the kernel: no state of a last successful sync (the first, after a failure, forced).
    fn full_sync_due(&self) -> bool;
}

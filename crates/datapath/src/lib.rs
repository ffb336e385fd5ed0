//! berth-datapath: a node's view of Services and endpoints -> a typed iptables ruleset (`plan`)
//! -> `iptables-restore` text (`render`) -> applied by a [`sync::Syncer`] through the
//! [`sync::Iptables`] trait; or the same ruleset in nftables form ([`nft`]) applied by an
//! [`nft_sync::NftSyncer`] through the [`nft_sync::Nft`] trait.
//!
//! nftables backend decisions (see [`nft`] and [`nft_sync`] for the details):
//! - One plan for both backends: the nftables table holds the planned chains under
//!   `<table>-<chain>` names, so the planner, the incremental planner, the packet tracer and the
//!   golden tests serve both, and the semantics cannot drift apart.
//! - Own tables `ip berth` / `ip6 berth`; base chains hooked at the priorities of iptables'
//!   tables. Never another program's table. An `accept` in berth's table does not override a
//!   `drop` in another table on the same hook (nftables evaluates every base chain): on the
//!   iptables backend berth's `FORWARD` accept of marked traffic wins over a `DROP` policy set in
//!   iptables' own `filter` table (Docker's), on the nftables backend it does not.
//! - Linear dispatch becomes verdict maps with `jump` elements; a key two Services claim goes to
//!   the first, as the linear chain would.
//! - No anonymous set per Service: endpoint choice is the iptables cascade written with `numgen`.
//!   ClientIP affinity uses a dynamic timeout set per endpoint (named like its chain); a changed
//!   timeout is re-declared in place.
//! - No chain per endpoint ([`nft_inline`]): each endpoint's DNAT (and affinity update) is part of
//!   the rule that chooses it, and hairpin traffic is found in postrouting by one set of
//!   `ep . ep` pairs. `nft` reads every chain into its cache on each run, so the chain count, not
//!   the size of a change, sets the cost of every transaction.
//! - One transaction per sync; a full sync deletes and recreates the table inside it (no half-built
//!   table is ever visible, stale objects cannot survive, established connections keep their
//!   conntrack translation; affinity entries start over). Partial syncs are diffed in memory; every
//!   command names berth's table, so a deleted table fails the transaction and the next sync is
//!   full (no canary needed); a `flush table` of berth's table by someone else is repaired by the
//!   next full sync (the agent's hourly rewrite, as kube-proxy's `FullSyncPeriod`).
//! - Chains that become stale are deleted in the same transaction (kube-proxy defers this by a
//!   second for kernels before 6.2, which did not release a chain still named by a just-deleted
//!   map element; berth's kernels accept it, and a refusal only means the next sync is full).
//! - iptables-nft: a full restore starts each table with a chain-less `-S`
//!   ([`render::Rendered::listing_first`]) so iptables 1.8.x fetches all chains at once instead of
//!   keeping every named chain in a sorted list (quadratic in chains × rules); a listing, unlike
//!   the `-Z` that has the same effect, zeroes nobody's counters.
//!
//! Decisions beyond kube-proxy's iptables mode, which the semantics otherwise follow:
//! - Load-balancer traffic not admitted by `BERTH-FW-*` is dropped in the filter chain
//!   `BERTH-PROXY-FIREWALL` (nat cannot drop), as kube-proxy's `KUBE-PROXY-FIREWALL` does.
//! - Jumps from built-in chains are not part of the restore payload: the Syncer checks and inserts
//!   them one by one on full syncs, so berth never flushes a chain it does not own.
//! - `BERTH-CANARY` (filter and nat) is created after each full sync; when it is gone, someone
//!   flushed iptables and the next sync is full.
//! - Change detection hashes each planned chain; a partial payload declares (and so flushes) only
//!   the chains whose hash changed and deletes chains that are no longer planned. With tree
//!   dispatch the entry chains are rewritten only when their content changes; a Syncer running
//!   linear dispatch can be told to rewrite them on every sync, as kube-proxy does
//!   ([`plan::rewritten_every_sync`]).
//! - [`incremental::Planner`] re-plans only the Service ports whose inputs changed and reports
//!   which chains it touched, so a partial sync hashes and renders only those
//!   ([`sync::Syncer::sync_changes`]); [`plan`] stays the reference it is tested against.
//! - A payload is rendered straight into an anonymous in-memory file ([`render::Rendered`]
//!   through [`exec`]), which the restore (or `nft`) reads only once it is complete: a killed
//!   agent never hands the kernel a prefix, and the heap never holds a full sync's 50 MB of text
//!   as a `String` (the file's pages are shared memory, freed when the program exits). Rules share their chain names, comments and match lists (`Arc`), as the planner holds
//!   hundreds of thousands of them.
//! - Dispatch trees split on the first differing bit of the sorted keys (path-compressed binary
//!   trees), so a tree chain's name and rules change only when Services are added or removed
//!   below it.

pub mod categorize;
pub mod convert;
pub mod dispatch;
pub mod exec;
pub mod fixed;
pub mod incremental;
pub mod input;
pub mod memory;
pub mod model;
pub mod names;
pub mod nft;
pub mod nft_exec;
pub mod nft_inline;
pub mod nft_memory;
pub mod nft_sync;
pub mod plan;
pub mod render;
pub mod rule_text;
pub mod sync;
pub mod trace;

pub use dispatch::Dispatch;
pub use incremental::{Changes, Planner};
pub use input::*;
pub use model::*;
pub use plan::{plan, rewritten_every_sync, PlanOptions};
pub use render::{render, ChainSelection, Payload, Rendered};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot parse iptables line {line:?}: {reason}")]
    Parse { line: String, reason: String },
    #[error("iptables-restore rejected the payload: {reason}")]
    Restore { reason: String },
    #[error("running {command} failed")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} exited with {status}: {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("packet trace failed: {reason}")]
    Trace { reason: String },
    #[error("invalid {field} in {object}: {value:?}")]
    InvalidInput {
        object: String,
        field: String,
        value: String,
    },
}

impl Error {
    /// A bounded label for logs and metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Parse { .. } => "parse",
            Error::Restore { .. } => "restore",
            Error::Spawn { .. } => "spawn",
            Error::Command { .. } => "command",
            Error::Trace { .. } => "trace",
            Error::InvalidInput { .. } => "invalid",
        }
    }

    /// Whether the same step can succeed when tried again unchanged: a tool that failed to
    /// run or was refused (the xtables lock, a chain changed under it) can, a full resync
    /// rewriting every chain; input berth cannot express cannot.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Restore { .. } | Error::Spawn { .. } | Error::Command { .. } => true,
            Error::Parse { .. } | Error::Trace { .. } | Error::InvalidInput { .. } => false,
        }
    }
}

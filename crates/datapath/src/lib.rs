//! berth-datapath: a node's view of Services and endpoints -> a typed ruleset ([`plan()`]) ->
//! `iptables-restore` text applied by an [`iptables::Syncer`] through the [`iptables::Iptables`]
//! trait, or the same ruleset as nftables commands applied by an [`nft::NftSyncer`] through the
//! [`nft::Nft`] trait. [`backend`] holds what both backends share, [`trace`] follows a packet
//! through a planned ruleset, and the `fake` feature adds in-memory backends for tests.
//!
//! nftables backend decisions (see [`nft::render`] and [`nft::sync`] for the details):
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
//! - No chain per endpoint ([`nft::inline`]): each endpoint's DNAT (and affinity update) is part of
//!   the rule that chooses it, and hairpin traffic is found in postrouting by one set of
//!   `ep . ep` pairs. `nft` reads every chain into its cache on each run, so the chain count, not
//!   the size of a change, sets the cost of every transaction.
//! - One transaction per sync, written by default as berth's own nfnetlink batch
//!   ([`nft::netlink`]: one `send`, one kernel transaction, no `nft` process; the same
//!   transaction as `nft -f -` text with [`nft::NftWriter::Nft`]). A full sync on the netlink
//!   writer reads the table back and writes only what differs ([`nft::adopt`]): a matching table
//!   is left alone, so affinity entries and rule handles survive agent restarts and the hourly
//!   pass. Without a table to adopt (or one it cannot repair) a full sync deletes and recreates
//!   the table inside one transaction (no half-built table is ever visible, stale objects cannot
//!   survive, established connections keep their conntrack translation). Partial syncs are diffed in memory; every
//!   command names berth's table, so a deleted table fails the transaction and the next sync is
//!   full (no canary needed); a `flush table` of berth's table by someone else is repaired by the
//!   next full sync (the agent's hourly rewrite, as kube-proxy's `FullSyncPeriod`).
//! - Chains that become stale are deleted in the same transaction (kube-proxy defers this by a
//!   second for kernels before 6.2, which did not release a chain still named by a just-deleted
//!   map element; berth's kernels accept it, and a refusal only means the next sync is full).
//! - iptables-nft: a full restore starts each table with a chain-less `-S`
//!   ([`iptables::Rendered::listing_first`]) so iptables 1.8.x fetches all chains at once instead of
//!   keeping every named chain in a sorted list (quadratic in chains × rules); a listing, unlike
//!   the `-Z` that has the same effect, zeroes nobody's counters.
//!
//! Decisions beyond kube-proxy's iptables mode, which the semantics otherwise follow:
//! - Load-balancer traffic not admitted by `BERTH-FW-*` is dropped in the filter chain
//!   `BERTH-PROXY-FIREWALL` (nat cannot drop), as kube-proxy's `KUBE-PROXY-FIREWALL` does.
//! - With the cluster's Service CIDRs known ([`PlanOptions::service_cidrs`]), both backends do
//!   what kube-proxy's nftables mode does with ServiceCIDRs (its iptables mode ignores them): a
//!   new connection still addressed into a Service CIDR after DNAT leaves the filter
//!   `BERTH-SERVICES` for `BERTH-CLUSTER-IPS`, which rejects a ClusterIP (a port its Service does
//!   not have) and drops any other address. The ClusterIPs are laid out there as the Service
//!   addresses are in the nat dispatch (a tree with tree dispatch), so a Service change rewrites
//!   one leaf, and translated traffic never walks them.
//! - Jumps from built-in chains are not part of the restore payload: the Syncer checks and inserts
//!   them one by one on full syncs, so berth never flushes a chain it does not own.
//! - `BERTH-CANARY` (filter and nat) is created after each full sync; when it is gone, someone
//!   flushed iptables and the next sync is full.
//! - Change detection hashes each planned chain; a partial payload declares (and so flushes) only
//!   the chains whose hash changed and deletes chains that are no longer planned. With tree
//!   dispatch the entry chains are rewritten only when their content changes; a Syncer running
//!   linear dispatch can be told to rewrite them on every sync, as kube-proxy does
//!   ([`plan::rewritten_every_sync`]).
//! - [`plan::Planner`] re-plans only the Service ports whose inputs changed and reports
//!   which chains it touched, so a partial sync hashes and renders only those
//!   ([`iptables::Syncer::sync_changes`]); [`plan::full`] stays the reference it is tested against.
//! - A payload is rendered straight into an anonymous in-memory file ([`iptables::Rendered`]
//!   through [`exec`]), which the restore (or `nft`) reads only once it is complete: a killed
//!   agent never hands the kernel a prefix, and the heap never holds a full sync's 50 MB of text
//!   as a `String` (the file's pages are shared memory, freed when the program exits). Rules
//!   share their chain names, comments and match lists (`Arc`), as the planner holds hundreds of
//!   thousands of them.
//! - Dispatch trees split on the first differing bit of the sorted keys (path-compressed binary
//!   trees), so a tree chain's name and rules change only when Services are added or removed
//!   below it.

pub mod apply;
pub mod backend;
mod error;
pub mod exec;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod iptables;
pub mod nft;
pub mod plan;
pub mod trace;

pub use backend::{Payload, SyncKind, SyncReport, SyncRuleset};
pub use error::Error;
pub use iptables::{render, ChainSelection, Rendered};
pub use plan::input::*;
pub use plan::model::*;
pub use plan::{
    plan, rewritten_every_sync, Changes, Dispatch, DispatchChanges, NodePortAddresses, PlanOptions,
    Planner, PortGroups,
};

//! The nftables backend: a planned ruleset -> berth's own table as `nft` commands
//! ([`render`], with each endpoint's chain folded into the rule that chooses it by [`inline`])
//! -> applied one transaction per sync by an [`NftSyncer`] through the [`Nft`] trait, whose real
//! forms are berth's own netlink batches ([`netlink`], expressions by [`expr`], framing by
//! [`wire`]; the default) and the `nft` program reading the text ([`exec`]). Read back, the
//! kernel's table is a [`dump`]: adoption compares it with the plan ([`adopt`]), `berth explain`
//! decodes it into the typed [`table`] the packet tracer follows ([`decode`]).
//! [`shard`] says which of berth's tables (the main one, or one of the nat shards) holds each
//! chain, set and element.

pub mod adopt;
mod applied;
pub mod decode;
pub mod dump;
pub mod exec;
pub mod expr;
pub mod inline;
pub mod netlink;
mod observed;
mod partial;
pub mod render;
mod repair;
pub mod shard;
pub mod stage;
mod staged;
pub mod sync;
pub mod table;
mod text;
mod transaction;
pub mod wire;

pub use exec::CommandNft;
pub use netlink::NetlinkNft;
pub use render::{rule_jump, Command, Element, NftChain, NftRule, Transaction};
pub use shard::{Shard, Shards};
pub use sync::{remove_table, Nft, NftSyncer};
pub use table::NftTable;

/// How the nftables backend writes the kernel: its own netlink batches (the default), or the
/// `nft` program reading the same transaction as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NftWriter {
    #[default]
    Netlink,
    Nft,
}

impl NftWriter {
    pub fn as_str(self) -> &'static str {
        match self {
            NftWriter::Netlink => "netlink",
            NftWriter::Nft => "nft",
        }
    }

    /// The writer for the agent's own network namespace.
    pub fn writer(self) -> Box<dyn Nft + Send> {
        match self {
            NftWriter::Netlink => Box::new(NetlinkNft::new()),
            NftWriter::Nft => Box::new(CommandNft::new()),
        }
    }

    /// Whether this writer works here and the kernel accepts everything the backend programs
    /// (a probe that leaves nothing behind).
    pub fn usable(self) -> bool {
        match self {
            NftWriter::Netlink => NetlinkNft::new().usable(),
            NftWriter::Nft => CommandNft::new().usable(),
        }
    }
}

//! The nftables backend: a planned ruleset -> berth's own table as `nft -f` commands
//! ([`render`], with each endpoint's chain folded into the rule that chooses it by [`inline`])
//! -> applied one transaction per sync by an [`NftSyncer`] through the [`Nft`] trait, whose real
//! form runs `nft` ([`exec`]).

pub mod exec;
pub mod expr;
pub mod inline;
pub mod netlink;
pub mod render;
pub mod sync;
pub mod wire;

pub use exec::CommandNft;
pub use netlink::NetlinkNft;
pub use render::{rule_jump, Command, Element, NftChain, NftRule, Transaction};
pub use sync::{remove_table, Nft, NftSyncer};

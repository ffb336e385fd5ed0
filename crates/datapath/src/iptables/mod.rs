//! The iptables backend: a planned ruleset -> `iptables-restore --noflush` text ([`render()`],
//! one rule at a time by [`rule_text`]) -> applied by a [`Syncer`] through the [`Iptables`]
//! trait, whose real form runs the tools ([`exec`]).

pub mod exec;
pub mod render;
pub mod rule_text;
mod streamed;
pub mod sync;

pub use exec::{Backend, CommandIptables};
pub use render::{render, ChainSelection, Rendered};
pub use sync::{remove_berth_rules, Iptables, Syncer};

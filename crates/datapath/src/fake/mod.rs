//! In-memory backends for tests (the `fake` feature): each applies what berth sends with the
//! real tool's rules and refuses what the tool would refuse, so a test asserts outcomes against
//! the tool's behaviour without a kernel. Not part of the default API.

pub mod iptables;
pub mod nft;

pub use iptables::MemoryIptables;
pub use nft::{MemoryNft, NftTable};

//! An agent's identity in SWIM.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// One agent: its node (unique in the cluster, foca's "address"), where it listens, and a
/// generation. A restarted agent starts from its start time in milliseconds, and one declared
/// down renews itself with the next number, so the newer identity always wins.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Peer {
    pub node: String,
    pub addr: SocketAddr,
    pub generation: u64,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}#{}", self.node, self.addr, self.generation)
    }
}

impl Peer {
    /// A peer known only from its Lease: generation 0 loses to any identity it really has,
    /// and foca accepts an announce to it at the node's real identity.
    pub fn from_lease(node: impl Into<String>, addr: SocketAddr) -> Self {
        Peer {
            node: node.into(),
            addr,
            generation: 0,
        }
    }
}

impl foca::Identity for Peer {
    type Addr = String;

    fn renew(&self) -> Option<Self> {
        Some(Peer {
            node: self.node.clone(),
            addr: self.addr,
            generation: self.generation.saturating_add(1),
        })
    }

    fn addr(&self) -> String {
        self.node.clone()
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.generation > adversary.generation
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use foca::Identity;

    use super::*;

    #[test]
    fn a_renewed_identity_wins_over_the_old_one_on_the_same_node() {
        let old = Peer {
            node: "node-a".into(),
            addr: "198.18.0.11:7947".parse().unwrap(),
            generation: 1_700_000_000_000,
        };
        let new = old.renew().unwrap();
        assert_eq!(new.addr(), old.addr());
        assert!(new.win_addr_conflict(&old));
        assert!(!old.win_addr_conflict(&new));
        let seed = Peer::from_lease("node-a", old.addr);
        assert!(old.win_addr_conflict(&seed));
        assert_eq!(format!("{seed:?}"), "node-a@198.18.0.11:7947#0");
    }
}

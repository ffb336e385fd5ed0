//! A Service port's own chains as the planner's cache keeps them between plans: their names,
//! and nothing else, for as long as the port lives.

use crate::plan::changes::ChainKey;
use crate::plan::model::{ChainName, Table};
use crate::plan::names::ENDPOINT_CHAIN_PREFIX as ENDPOINT;

/// The hash that follows [`ENDPOINT`] in an endpoint chain's name.
type EndpointHash = [u8; 16];

/// A Service port's own chains. Nine in ten are its endpoint chains, whose names nothing else
/// holds once a lean planner has let its chains go and a Syncer folded them: kept as their
/// names' hash, 16 bytes where a name of its own costs 64 (its allocation and its handle).
/// 10,000 Services × 10 endpoints: 1.6 MB instead of 6.4.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct OwnedChains {
    /// Every chain but the nat endpoint chains, sorted: names shared with the plan and the
    /// Syncers' state.
    named: Box<[ChainKey]>,
    /// The nat endpoint chains, by hash.
    endpoints: Box<[EndpointHash]>,
}

/// The hash of `chain`'s name when it is a nat endpoint chain's.
fn endpoint_hash((table, chain): &ChainKey) -> Option<EndpointHash> {
    if *table != Table::Nat {
        return None;
    }
    let hash = chain.as_str().strip_prefix(ENDPOINT)?.as_bytes();
    // ASCII only, so that each byte is its own character again.
    hash.is_ascii().then(|| hash.try_into().ok()).flatten()
}

impl OwnedChains {
    /// `chains`, the endpoint chains by hash when `by_hash`.
    pub(super) fn new<'a>(chains: impl IntoIterator<Item = &'a ChainKey>, by_hash: bool) -> Self {
        let mut named = Vec::new();
        let mut endpoints = Vec::new();
        for chain in chains {
            match endpoint_hash(chain).filter(|_| by_hash) {
                Some(hash) => endpoints.push(hash),
                None => named.push(chain.clone()),
            }
        }
        named.sort_unstable();
        OwnedChains {
            named: named.into_boxed_slice(),
            endpoints: endpoints.into_boxed_slice(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.named.len() + self.endpoints.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every chain; the endpoint chains' names made again.
    pub(super) fn iter(&self) -> impl Iterator<Item = ChainKey> + '_ {
        let endpoints = self.endpoints.iter().map(|hash| {
            let mut name = String::with_capacity(ENDPOINT.len() + hash.len());
            name.push_str(ENDPOINT);
            name.extend(hash.iter().map(|byte| char::from(*byte)));
            (Table::Nat, ChainName::new(name))
        });
        self.named.iter().cloned().chain(endpoints)
    }

    /// The name the cache holds for `chain`, when it is not an endpoint chain: to be shared.
    pub(super) fn shared_name(&self, chain: &ChainKey) -> Option<&ChainName> {
        let at = self.named.binary_search(chain).ok()?;
        self.named.get(at).map(|(_, name)| name)
    }

    /// The tables its chains are in.
    pub(super) fn tables(&self) -> impl Iterator<Item = Table> + '_ {
        let nat = (!self.endpoints.is_empty()).then_some(Table::Nat);
        self.named.iter().map(|(table, _)| *table).chain(nat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn key(table: Table, name: &str) -> ChainKey {
        (table, ChainName::new(name))
    }

    /// Every chain comes back as it went in, endpoint chains by hash; only nat endpoint chains
    /// with a 16-character ASCII hash are kept as one, and only when asked.
    #[test]
    fn every_chain_comes_back_and_only_endpoint_chains_are_kept_by_hash() {
        let chains: BTreeSet<ChainKey> = [
            key(Table::Nat, "BERTH-SVC-2JCKEOP32VON2NVM"),
            key(Table::Nat, "BERTH-EXT-2JCKEOP32VON2NVM"),
            key(Table::Nat, "BERTH-SEP-W7QDGQOENCZUWC7S"),
            key(Table::Nat, "BERTH-SEP-AKCZDVIEDDIESFD4"),
            // Not a hash of 16: kept by name.
            key(Table::Nat, "BERTH-SEP-SHORT"),
            key(Table::Nat, "BERTH-SEP-"),
            key(Table::Nat, "BERTH-SEP-ÄKCZDVIEDDIESFD"),
            // Not nat: kept by name.
            key(Table::Filter, "BERTH-SEP-W7QDGQOENCZUWC7S"),
            key(Table::Filter, "BERTH-FW-2JCKEOP32VON2NVM"),
        ]
        .into();
        let owned = OwnedChains::new(&chains, true);
        assert_eq!(owned.endpoints.len(), 2);
        assert_eq!(owned.len(), chains.len());
        assert!(!owned.is_empty());
        assert_eq!(owned.iter().collect::<BTreeSet<_>>(), chains);
        let tables: BTreeSet<Table> = owned.tables().collect();
        assert_eq!(tables, [Table::Filter, Table::Nat].into());

        let svc = key(Table::Nat, "BERTH-SVC-2JCKEOP32VON2NVM");
        assert_eq!(owned.shared_name(&svc), Some(&svc.1));
        let sep = key(Table::Nat, "BERTH-SEP-W7QDGQOENCZUWC7S");
        assert_eq!(owned.shared_name(&sep), None);
        assert_eq!(owned.shared_name(&key(Table::Mangle, "BERTH-SVC-X")), None);

        // By name, every chain is shared.
        let by_name = OwnedChains::new(&chains, false);
        assert!(by_name.endpoints.is_empty());
        assert_eq!(by_name.iter().collect::<BTreeSet<_>>(), chains);
        assert_eq!(by_name.shared_name(&sep), Some(&sep.1));

        let only_endpoints = OwnedChains::new(std::slice::from_ref(&sep), true);
        assert_eq!(only_endpoints.tables().collect::<Vec<_>>(), [Table::Nat]);
        assert_eq!(only_endpoints.iter().collect::<Vec<_>>(), [sep]);
        let empty = OwnedChains::default();
        assert!(empty.is_empty());
        assert_eq!(empty.tables().count(), 0);
    }
}

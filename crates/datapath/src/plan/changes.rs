//! What changed between two plans, as [`crate::plan::Planner::take_changes`] reports it to the
//! Syncers: the chains written or removed, and with linear dispatch the dispatch entries
//! themselves, so that a backend keeping the entries as map elements (nftables) can update those
//! elements without reading the whole 10,000-rule `BERTH-SERVICES` chain (or, with Service CIDRs,
//! `BERTH-CLUSTER-IPS`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::plan::model::{ChainName, Rule, Table};
use berth_core::Protocol;

pub(crate) type ChainKey = (Table, ChainName);

/// Chains whose content may differ from what the last [`crate::plan::Planner::take_changes`]
/// reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changes {
    /// Everything may have changed (first plan, new node facts).
    All,
    /// Only these chains were written or removed since; every other chain is as it was.
    Chains(BTreeSet<ChainKey>),
    /// As [`Changes::Chains`], with linear dispatch: the chains, and the dispatch keys whose
    /// entries changed with all their entries now. `BERTH-SERVICES`, `BERTH-NODEPORTS` and the
    /// filter `BERTH-CLUSTER-IPS` are among the chains when their entries changed; apart from the
    /// entries these describe, they are as they were.
    Dispatch(BTreeSet<ChainKey>, DispatchChanges),
}

/// Linear dispatch keys whose entries changed, each with every entry it holds now, in the order
/// the chain lists them (an empty list: the key has no entry left).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DispatchChanges {
    /// Destination addresses of `BERTH-SERVICES` (ClusterIPs, external and LoadBalancer
    /// addresses) -> their entries.
    pub services: BTreeMap<IpAddr, Vec<Rule>>,
    /// Node ports of `BERTH-NODEPORTS` -> their entries.
    pub node_ports: BTreeMap<(Protocol, u16), Vec<Rule>>,
    /// ClusterIPs of the filter `BERTH-CLUSTER-IPS` (with Service CIDRs) -> their REJECTs.
    pub cluster_ips: BTreeMap<IpAddr, Vec<Rule>>,
}

impl DispatchChanges {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && self.node_ports.is_empty() && self.cluster_ips.is_empty()
    }

    /// Adds `later`'s keys; a key in both takes `later`'s entries, the newer.
    pub fn extend(&mut self, later: DispatchChanges) {
        self.services.extend(later.services);
        self.node_ports.extend(later.node_ports);
        self.cluster_ips.extend(later.cluster_ips);
    }
}

impl Changes {
    /// The changed chains; `None` for [`Changes::All`].
    pub fn chains(&self) -> Option<&BTreeSet<ChainKey>> {
        match self {
            Changes::All => None,
            Changes::Chains(chains) | Changes::Dispatch(chains, _) => Some(chains),
        }
    }

    /// The changed dispatch entries, when the planner reported them.
    pub fn dispatch(&self) -> Option<&DispatchChanges> {
        match self {
            Changes::Dispatch(_, dispatch) => Some(dispatch),
            _ => None,
        }
    }

    /// The changes of two plans in a row, as one: what the first or the second changed. The
    /// entries are reported only when both reported theirs (a plain [`Changes::Chains`] that
    /// names a dispatch chain says nothing of its entries).
    pub fn merge(self, later: Changes) -> Changes {
        let names_dispatch = |chains: &BTreeSet<ChainKey>| {
            chains.iter().any(|(table, chain)| match table {
                Table::Nat => matches!(
                    chain.as_str(),
                    crate::plan::names::SERVICES | crate::plan::names::NODEPORTS
                ),
                Table::Filter => chain.as_str() == crate::plan::names::CLUSTER_IPS,
                Table::Mangle => false,
            })
        };
        match (self, later) {
            (Changes::All, _) | (_, Changes::All) => Changes::All,
            (Changes::Dispatch(mut chains, mut dispatch), Changes::Dispatch(more, newer)) => {
                chains.extend(more);
                dispatch.extend(newer);
                Changes::Dispatch(chains, dispatch)
            }
            // A side without entries that left the dispatch chains alone changed no entry.
            (Changes::Dispatch(mut chains, dispatch), Changes::Chains(more))
                if !names_dispatch(&more) =>
            {
                chains.extend(more);
                Changes::Dispatch(chains, dispatch)
            }
            (Changes::Chains(mut chains), Changes::Dispatch(more, dispatch))
                if !names_dispatch(&chains) =>
            {
                chains.extend(more);
                Changes::Dispatch(chains, dispatch)
            }
            (first, second) => {
                let mut chains = first.chains().cloned().unwrap_or_default();
                chains.extend(second.chains().into_iter().flatten().cloned());
                Changes::Chains(chains)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::names;

    fn chains(names: &[&str]) -> BTreeSet<ChainKey> {
        names
            .iter()
            .map(|n| (Table::Nat, ChainName::new(*n)))
            .collect()
    }

    fn entries(addr: &str, target: &str) -> DispatchChanges {
        let rule = Rule::jump(Vec::new(), &ChainName::new(target));
        DispatchChanges {
            services: [(
                addr.parse().unwrap_or(IpAddr::from([0, 0, 0, 0])),
                vec![rule],
            )]
            .into(),
            node_ports: BTreeMap::new(),
            cluster_ips: BTreeMap::new(),
        }
    }

    /// Every pair of kinds: All wins, entries survive only when nothing hid a dispatch change,
    /// and the later entries of a key replace the earlier.
    #[test]
    fn merging_keeps_entries_only_when_both_sides_describe_them() {
        let svc = chains(&["BERTH-SVC-A"]);
        let dispatch = chains(&["BERTH-SVC-B", names::SERVICES]);
        let cluster_ips: BTreeSet<ChainKey> =
            [(Table::Filter, ChainName::new(names::CLUSTER_IPS))].into();
        let a = entries("10.96.0.1", "BERTH-SVC-A");
        let b = entries("10.96.0.1", "BERTH-SVC-B");
        let both = |x: &BTreeSet<ChainKey>, y: &BTreeSet<ChainKey>| -> BTreeSet<ChainKey> {
            x.union(y).cloned().collect()
        };
        let cases = [
            (Changes::All, Changes::Chains(svc.clone()), Changes::All),
            (Changes::Chains(svc.clone()), Changes::All, Changes::All),
            (
                Changes::Dispatch(dispatch.clone(), a.clone()),
                Changes::All,
                Changes::All,
            ),
            (
                Changes::Chains(svc.clone()),
                Changes::Chains(dispatch.clone()),
                Changes::Chains(both(&svc, &dispatch)),
            ),
            (
                Changes::Dispatch(dispatch.clone(), a.clone()),
                Changes::Dispatch(dispatch.clone(), b.clone()),
                Changes::Dispatch(dispatch.clone(), b.clone()),
            ),
            (
                Changes::Dispatch(dispatch.clone(), a.clone()),
                Changes::Chains(svc.clone()),
                Changes::Dispatch(both(&svc, &dispatch), a.clone()),
            ),
            (
                Changes::Chains(svc.clone()),
                Changes::Dispatch(dispatch.clone(), a.clone()),
                Changes::Dispatch(both(&svc, &dispatch), a.clone()),
            ),
            // A dispatch chain changed without its entries told: none can be told.
            (
                Changes::Dispatch(dispatch.clone(), a.clone()),
                Changes::Chains(dispatch.clone()),
                Changes::Chains(dispatch.clone()),
            ),
            (
                Changes::Chains(dispatch.clone()),
                Changes::Dispatch(svc.clone(), a.clone()),
                Changes::Chains(both(&svc, &dispatch)),
            ),
            // The filter chain of the ClusterIPs' REJECTs is a dispatch chain too.
            (
                Changes::Dispatch(dispatch.clone(), a.clone()),
                Changes::Chains(cluster_ips.clone()),
                Changes::Chains(both(&dispatch, &cluster_ips)),
            ),
            (
                Changes::Chains(cluster_ips.clone()),
                Changes::Dispatch(svc.clone(), a.clone()),
                Changes::Chains(both(&svc, &cluster_ips)),
            ),
        ];
        for (first, second, want) in cases {
            let got = first.clone().merge(second.clone());
            assert_eq!(got, want, "{first:?} then {second:?}");
        }
    }

    #[test]
    fn accessors_name_the_parts() {
        let svc = chains(&["BERTH-SVC-A"]);
        let a = entries("10.96.0.1", "BERTH-SVC-A");
        assert_eq!(Changes::All.chains(), None);
        assert_eq!(Changes::All.dispatch(), None);
        assert_eq!(Changes::Chains(svc.clone()).chains(), Some(&svc));
        assert_eq!(Changes::Chains(svc.clone()).dispatch(), None);
        let both = Changes::Dispatch(svc.clone(), a.clone());
        assert_eq!(both.chains(), Some(&svc));
        assert_eq!(both.dispatch(), Some(&a));
        assert!(DispatchChanges::default().is_empty());
        assert!(!a.is_empty());
    }
}

//! A lean planner: Service ports' own chains (SVC/SVL/EXT/FW/SEP, nine rules in ten of a
//! 10,000-Service ruleset) leave the planned ruleset once a Syncer has applied them, and come
//! back only to be applied again: planned anew for the ports that change, or for every port
//! before a full sync ([`Planner::fill`]). What stays is what planning needs — per port its
//! fingerprint, its own chains' names, its dispatch entries — and the fixed, shared and dispatch
//! chains. A Syncer's partial sync reads only the chains a change names, all of them planned
//! with it; a full sync, which reads every chain, must be given a complete ruleset
//! ([`Planner::is_complete`]).

use std::collections::{BTreeMap, BTreeSet};

use super::{key_of, ChainMerge, Planner, ServiceKey};
use crate::plan::input::{NodeView, ServicePort, ServicePortName};
use crate::plan::model::{ChainName, Rule, Ruleset, Table, Target};
use berth_core::Protocol;

impl Planner {
    /// The same planner, lean (see the module docs): after each [`Planner::release`] its
    /// ruleset holds only the fixed, shared and dispatch chains and the own chains of ports
    /// planned since.
    pub fn lean(mut self) -> Self {
        self.lean = true;
        self
    }

    /// The same planner, its cache keeping each port's endpoint chains by name rather than by
    /// hash: for a Syncer that keeps every chain's name (iptables), which then shares the
    /// cache's names instead of holding its own. A Syncer that folds endpoint chains (nftables)
    /// keeps none of them, and the hash costs a quarter of a name.
    pub fn keeping_endpoint_names(mut self) -> Self {
        self.endpoint_names = true;
        self
    }

    /// Whether [`Planner::ruleset`] holds every Service port's own chains: what a full sync
    /// must be given. Always true of a planner that is not lean.
    pub fn is_complete(&self) -> bool {
        !self.lean || self.complete
    }

    /// A lean planner lets go of the own chains of every Service port, once a Syncer holds
    /// them (after a successful sync). Nothing for a planner that is not lean.
    pub fn release(&mut self) {
        if self.lean {
            self.drop_service_chains();
        }
    }

    fn drop_service_chains(&mut self) {
        let held = std::mem::take(&mut self.held);
        let released: Box<dyn Iterator<Item = &ServiceKey>> = if self.complete {
            Box::new(self.services.keys())
        } else {
            Box::new(held.iter())
        };
        for key in released {
            let Some(cached) = self.services.get(key) else {
                continue;
            };
            for (table, chain) in cached.owned.iter() {
                if let Some(rules) = self.rs.tables.get_mut(&table) {
                    rules.chains.remove(&chain);
                }
            }
        }
        self.complete = self.services.is_empty();
    }

    /// Brings a lean planner to `view` as [`Planner::update`] does, keeping none of the Service
    /// ports' own chains (those it held go too): for a full sync that plans them again a few
    /// ports at a time ([`Planner::service_chains`]), so that they are never all held at once.
    /// A planner that is not lean updates as usual.
    pub fn update_without_service_chains(&mut self, view: &NodeView) {
        if !self.lean {
            self.update(view);
            return;
        }
        self.drop_service_chains();
        self.discard = true;
        self.update(view);
        self.discard = false;
    }

    /// The own chains of one Service port (all ports in `ports` share its name and protocol),
    /// planned from `ports` as an update would: for a full sync of a lean planner's ruleset,
    /// which must be given them all (`ports` from the view of the last update).
    pub fn service_chains(&self, ports: &[&ServicePort]) -> Ruleset {
        let (_, owned) = self.plan_group(ports, 0);
        // The cache holds the chains' names already (the endpoint chains' only when it keeps
        // them by name): the chains (and the jumps to them) take those, so a Syncer's state
        // shares them rather than a second copy.
        let known = ports
            .first()
            .and_then(|first| self.services.get(&(first.name.clone(), first.protocol)));
        let shared = |table: Table, chain: ChainName| -> ChainName {
            known
                .and_then(|cached| cached.owned.shared_name(&(table, chain.clone())))
                .map_or(chain, ChainName::clone)
        };
        let mut rs = Ruleset::default();
        for ((table, chain), rules) in owned {
            let rules = rules
                .into_iter()
                .map(|rule| match rule.target {
                    Some(Target::Jump(to)) => Rule {
                        matches: rule.matches,
                        target: Some(Target::Jump(shared(table, to))),
                    },
                    _ => rule,
                })
                .collect();
            rs.table_mut(table)
                .chains
                .insert(shared(table, chain), rules);
        }
        rs
    }

    /// Brings the planner to `view` (as [`Planner::update`]) and plans again the own chains of
    /// every port the ruleset does not hold, so that it is complete, as a full sync needs it.
    /// The chains planned again are not reported as changed: they are what was applied.
    pub fn fill(&mut self, view: &NodeView) {
        self.update(view);
        if self.is_complete() {
            return;
        }
        let mut ports: Vec<&ServicePort> = view.services.iter().collect();
        ports.sort_by(|a, b| key_of(a).cmp(&key_of(b)));
        let groups: Vec<(&[&ServicePort], u64)> = ports
            .chunk_by(|a, b| key_of(a) == key_of(b))
            .filter(|group| {
                group
                    .first()
                    .is_some_and(|first| !self.held.contains(&(first.name.clone(), first.protocol)))
            })
            // The fingerprint goes into a cache entry that is thrown away.
            .map(|group| (group, 0))
            .collect();
        let mut merged = ChainMerge::default();
        for (_, owned) in self.plan_groups(&groups) {
            merged.add(owned);
        }
        merged.into(&mut self.rs);
        self.complete = true;
        self.held = BTreeSet::new();
    }

    /// How many own chains the Service ports have.
    pub fn service_chain_count(&self) -> usize {
        self.services
            .values()
            .map(|cached| cached.owned.len())
            .sum()
    }

    /// The tables holding any Service port's own chains.
    pub fn service_chain_tables(&self) -> BTreeSet<Table> {
        let mut tables = BTreeSet::new();
        for cached in self.services.values() {
            tables.extend(cached.owned.tables());
            if tables.len() == Table::ALL.len() {
                break;
            }
        }
        tables
    }

    /// Rules per table of the ruleset as [`crate::plan::full::plan`] gives it, whether or not
    /// this planner holds every chain: what the Syncers have applied after a successful sync.
    pub fn rule_counts(&self) -> Vec<(Table, usize)> {
        Table::ALL
            .into_iter()
            .filter_map(|table| {
                let held: usize = self.rs.table(table)?.rule_count();
                let slot = super::table_slot(table);
                let owned_total = self.owned_rules.get(slot).copied().unwrap_or(0);
                let owned_held: usize = if self.is_complete() {
                    owned_total
                } else {
                    self.held
                        .iter()
                        .filter_map(|key| self.services.get(key))
                        .map(|cached| cached.owned_rules.get(slot).copied().unwrap_or(0) as usize)
                        .sum()
                };
                Some((table, held - owned_held.min(held) + owned_total))
            })
            .collect()
    }
}

/// A copy of a view's Service ports sorted into groups (nftables shards, for one), whose own
/// chains [`PortGroups::take_service_chains`] plans one group at a time, letting the group's
/// ports go: what a full sync after [`Planner::update_without_service_chains`] (with the same
/// view) writes, planned piece by piece, the copy shrinking as the load goes.
#[derive(Debug, Clone, Default)]
pub struct PortGroups {
    /// Each group's ports, those sharing a name and protocol together.
    groups: BTreeMap<u16, Vec<Vec<ServicePort>>>,
}

impl PortGroups {
    /// `view`'s Service ports in the groups `group_of` names.
    pub fn new(view: &NodeView, group_of: impl Fn(&ServicePortName, Protocol) -> u16) -> Self {
        let mut ports: Vec<&ServicePort> = view.services.iter().collect();
        ports.sort_by(|a, b| key_of(a).cmp(&key_of(b)));
        let mut groups: BTreeMap<u16, Vec<Vec<ServicePort>>> = BTreeMap::new();
        for same in ports.chunk_by(|a, b| key_of(a) == key_of(b)) {
            if let Some(first) = same.first() {
                let group = group_of(&first.name, first.protocol);
                let copy: Vec<ServicePort> = same.iter().map(|port| (*port).clone()).collect();
                groups.entry(group).or_default().push(copy);
            }
        }
        PortGroups { groups }
    }

    /// The groups, in order.
    pub fn groups(&self) -> Vec<u16> {
        self.groups.keys().copied().collect()
    }

    /// The own chains of every Service port in `group`, as `planner` plans them.
    pub fn service_chains(&self, planner: &Planner, group: u16) -> Ruleset {
        plan_groups(planner, self.groups.get(&group).into_iter().flatten())
    }

    /// [`PortGroups::service_chains`], the group's ports let go (a second call gives nothing).
    pub fn take_service_chains(&mut self, planner: &Planner, group: u16) -> Ruleset {
        plan_groups(planner, self.groups.remove(&group).iter().flatten())
    }
}

/// The own chains of Service ports, a name and protocol's ports at a time.
fn plan_groups<'p>(
    planner: &Planner,
    groups: impl Iterator<Item = &'p Vec<ServicePort>>,
) -> Ruleset {
    let mut rs = Ruleset::default();
    for ports in groups {
        let ports: Vec<&ServicePort> = ports.iter().collect();
        for (table, rules) in planner.service_chains(&ports).tables {
            rs.table_mut(table).chains.extend(rules.chains);
        }
    }
    rs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::input::tests::mk_port;
    use crate::plan::input::NodeInfo;
    use crate::plan::options::PlanOptions;

    /// Starting over for new node facts or new Service CIDRs keeps what the planner was told:
    /// lean, and what its cache keeps of endpoint chains.
    #[test]
    fn starting_over_keeps_the_planners_settings() {
        let mut planner = Planner::new(PlanOptions::default())
            .lean()
            .keeping_endpoint_names();
        let mut view = NodeView {
            node: NodeInfo::default(),
            services: vec![mk_port(vec![])],
        };
        planner.update(&view);
        view.node.name = "node-b".to_string();
        planner.update(&view);
        assert!(planner.lean && planner.endpoint_names);
        let cidr = ipnet::IpNet::V4(std::net::Ipv4Addr::new(10, 96, 0, 0).into());
        planner.set_service_cidrs(&[cidr]);
        assert!(planner.lean && planner.endpoint_names);
    }
}

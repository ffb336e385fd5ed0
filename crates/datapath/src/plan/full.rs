//! `plan::full`: the node's view -> the complete berth ruleset for one address family.
//!
//! Each Service port is decided ([`crate::plan::policy`]) and written ([`crate::plan::service`])
//! on its own; only the entry dispatch is shared (see [`crate::plan::dispatch`]).

use crate::plan::categorize::categorize;
use crate::plan::dispatch::{
    build_dispatch, node_ports_jumps, service_cidr_jumps, DispatchEntries,
};
use crate::plan::fixed::{builtin_jumps, plan_fixed_chains};
use crate::plan::input::{NodeView, ServicePort};
use crate::plan::model::{ChainName, Ruleset, Table};
use crate::plan::names;
use crate::plan::options::Dispatch;
use crate::plan::options::PlanOptions;
use crate::plan::service::{plan_service_port, EndpointRules};

/// Fixed chains kube-proxy declares and refills on every sync, partial ones included: its partial
/// syncs skip only unchanged SVC/SVL/EXT/FW/SEP chains (`pkg/proxy/iptables/proxier.go`). Linear
/// dispatch models that layout faithfully for comparison, so a [`crate::iptables::sync::Syncer`] running
/// it rewrites these every time; tree dispatch rewrites only the chains whose content changed.
pub fn rewritten_every_sync(dispatch: Dispatch) -> Vec<(Table, ChainName)> {
    match dispatch {
        Dispatch::Tree => Vec::new(),
        Dispatch::Linear => [
            (Table::Filter, names::SERVICES),
            (Table::Filter, names::EXTERNAL_SERVICES),
            (Table::Filter, names::FORWARD),
            (Table::Filter, names::NODEPORTS),
            (Table::Filter, names::PROXY_FIREWALL),
            (Table::Nat, names::SERVICES),
            (Table::Nat, names::NODEPORTS),
            (Table::Nat, names::POSTROUTING),
            (Table::Nat, names::MARK_MASQ),
        ]
        .into_iter()
        .map(|(table, chain)| (table, names::fixed(chain)))
        .collect(),
    }
}

/// Plans every berth chain for `options.family`. Deterministic: the same view gives the same ruleset.
pub fn plan(view: &NodeView, options: &PlanOptions) -> Ruleset {
    let mut rs = Ruleset {
        jumps: builtin_jumps(),
        ..Ruleset::default()
    };
    plan_fixed_chains(&mut rs, options.random_fully);
    let mut ports: Vec<&ServicePort> = view.services.iter().collect();
    ports.sort_by(|a, b| (&a.name, a.protocol).cmp(&(&b.name, b.protocol)));
    let mut entries = DispatchEntries::default();
    for port in ports {
        let categorized = categorize(port, &view.node, options.family);
        plan_service_port(
            &mut rs,
            &mut entries,
            &view.node,
            port,
            &categorized,
            options,
            EndpointRules::Full,
        );
    }
    build_dispatch(&mut rs, entries, options);
    for jump in node_ports_jumps(options, Some(&view.node)) {
        rs.table_mut(Table::Nat)
            .push(&names::fixed(names::SERVICES), jump);
    }
    for jump in service_cidr_jumps(options) {
        rs.table_mut(Table::Filter)
            .push(&names::fixed(names::SERVICES), jump);
    }
    rs
}

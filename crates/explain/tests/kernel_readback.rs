//! The ruleset `berth explain` traces is the one the kernel holds: a planned payload (the
//! datapath's golden tree-dispatch ruleset) was restored into a fresh network namespace with the
//! real `iptables-restore` (1.8.9, nf_tables), with the built-in jumps the agent ensures, and
//! read back with `iptables-save`; both files are kept here. Read back, it must be the planned
//! ruleset again, rule for rule, so a trace through it is a trace through what was planned.

#![allow(clippy::unwrap_used)]

use berth_datapath::fake::MemoryIptables;
use berth_datapath::Table;
use berth_explain::path::ruleset_from_save;

const PLANNED: &str = include_str!("fixtures/planned_payload.txt");
const SAVED: &str = include_str!("fixtures/kernel_save.txt");

/// A rule with its matches in a fixed order: iptables-save prints matches in its own order,
/// which changes nothing about what they match.
fn canonical(rule: &berth_datapath::Rule) -> (Vec<String>, String) {
    let mut matches: Vec<String> = rule.matches.iter().map(|m| format!("{m:?}")).collect();
    matches.sort();
    (matches, format!("{:?}", rule.target))
}

#[test]
fn the_kernels_ruleset_reads_back_as_planned() {
    let mut memory = MemoryIptables::default();
    memory.restore_text(PLANNED).unwrap();
    let planned = memory.berth_ruleset();
    let kernel = ruleset_from_save(SAVED).unwrap();
    for table in [Table::Nat, Table::Filter] {
        let (p, k) = (planned.table(table).unwrap(), kernel.table(table).unwrap());
        assert_eq!(
            p.chains.keys().collect::<Vec<_>>(),
            k.chains.keys().collect::<Vec<_>>(),
            "{table}: chains"
        );
        for (chain, rules) in &p.chains {
            assert_eq!(
                rules.iter().map(canonical).collect::<Vec<_>>(),
                k.chains[chain].iter().map(canonical).collect::<Vec<_>>(),
                "{table}/{chain}"
            );
        }
    }
    // The jumps from the built-in chains that the agent ensures, one by one.
    assert_eq!(kernel.jumps.len(), 12, "{:?}", kernel.jumps);
}

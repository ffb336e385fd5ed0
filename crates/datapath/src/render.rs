//! `render`: a ruleset (or the chains of it that changed) -> `iptables-restore --noflush` text.
//!
//! Declaring a chain in a restore payload creates it or flushes it, so a partial payload declares
//! only the chains it rewrites or deletes: every other berth chain keeps its rules untouched.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::model::{ChainName, Ruleset, Table};
use crate::rule_text::render_rule;

/// Which chains a payload rewrites and which stale chains it deletes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChainSelection {
    /// `None`: every planned chain (a full sync).
    pub rewrite: Option<BTreeSet<(Table, ChainName)>>,
    pub delete: BTreeSet<(Table, ChainName)>,
}

impl ChainSelection {
    pub fn all() -> Self {
        ChainSelection::default()
    }
}

/// Renders the selected chains; tables with nothing to do are left out. Chains without the
/// berth prefix are never declared, flushed or deleted.
pub fn render(rs: &Ruleset, selection: &ChainSelection) -> String {
    let mut out = String::new();
    for table in Table::ALL {
        let planned = rs.table(table);
        let rewrite: Vec<_> = match (planned, &selection.rewrite) {
            (None, _) => Vec::new(),
            (Some(rules), None) => rules
                .chains
                .iter()
                .filter(|(chain, _)| chain.is_berth())
                .collect(),
            // Walk the (small) selection, not the whole table: same order, as both are sorted.
            (Some(rules), Some(set)) => set
                .iter()
                .filter(|(t, _)| *t == table)
                .filter_map(|(_, chain)| rules.chains.get_key_value(chain))
                .filter(|(chain, _)| chain.is_berth())
                .collect(),
        };
        let delete: Vec<&ChainName> = selection
            .delete
            .iter()
            .filter(|(t, chain)| *t == table && chain.is_berth())
            .filter(|(_, chain)| planned.is_none_or(|rules| !rules.chains.contains_key(chain)))
            .map(|(_, chain)| chain)
            .collect();
        if rewrite.is_empty() && delete.is_empty() {
            continue;
        }
        let _ = writeln!(out, "*{table}");
        for (chain, _) in &rewrite {
            let _ = writeln!(out, ":{chain} - [0:0]");
        }
        for chain in &delete {
            let _ = writeln!(out, ":{chain} - [0:0]");
        }
        for (chain, rules) in &rewrite {
            for rule in rules.iter() {
                out.push_str(&render_rule(chain, rule));
                out.push('\n');
            }
        }
        // Deletions come last: by then no rewritten chain refers to them any more.
        for chain in &delete {
            let _ = writeln!(out, "-X {chain}");
        }
        out.push_str("COMMIT\n");
    }
    out
}

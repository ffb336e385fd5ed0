//! An in-memory iptables that applies restore payloads with iptables-restore's rules: declaring a
//! chain flushes it, jumps must name existing chains, a referenced chain cannot be deleted, and a
//! table is committed whole or not at all. Used to test the Syncer and by callers' tests.

use std::collections::BTreeMap;

use crate::backend::Payload;
use crate::error::Error;
use crate::iptables::rule_text::{parse_rule, render_rule, rule_args, split_words};
use crate::iptables::sync::Iptables;
use crate::plan::model::{ChainName, JumpRule, Rule, Ruleset, Table, TableRules};

fn builtins(table: Table) -> &'static [&'static str] {
    match table {
        Table::Filter => &["INPUT", "FORWARD", "OUTPUT"],
        Table::Nat => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
        Table::Mangle => &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
    }
}

/// Change `tables` only through the [`Iptables`] methods: they keep the reference counts.
#[derive(Debug, Clone)]
pub struct MemoryIptables {
    pub tables: BTreeMap<Table, BTreeMap<ChainName, Vec<Rule>>>,
    /// Makes the next restore fail before changing anything, as a kernel or lock error would.
    pub fail_next_restore: bool,
    pub restores: Vec<String>,
    /// How many rules jump to each chain, so deleting one need not scan every rule (the kernel
    /// keeps the same count).
    refs: BTreeMap<Table, Refs>,
}

type Refs = BTreeMap<ChainName, usize>;

impl PartialEq for MemoryIptables {
    fn eq(&self, other: &Self) -> bool {
        // The reference counts follow from the tables.
        (&self.tables, self.fail_next_restore, &self.restores)
            == (&other.tables, other.fail_next_restore, &other.restores)
    }
}

impl Eq for MemoryIptables {}

fn count_refs(refs: &mut Refs, rules: &[Rule], up: bool) {
    for target in rules.iter().filter_map(Rule::jump_target) {
        if up {
            *refs.entry(target.clone()).or_default() += 1;
        } else if let Some(count) = refs.get_mut(target) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                refs.remove(target);
            }
        }
    }
}

fn all_refs(chains: &BTreeMap<ChainName, Vec<Rule>>) -> Refs {
    let mut refs = Refs::new();
    for rules in chains.values() {
        count_refs(&mut refs, rules, true);
    }
    refs
}

impl Default for MemoryIptables {
    fn default() -> Self {
        let tables = Table::ALL
            .into_iter()
            .map(|table| {
                let chains = builtins(table)
                    .iter()
                    .map(|name| (ChainName::new(*name), Vec::new()))
                    .collect();
                (table, chains)
            })
            .collect();
        MemoryIptables {
            tables,
            fail_next_restore: false,
            restores: Vec::new(),
            refs: BTreeMap::new(),
        }
    }
}

fn restore_error(line: &str, reason: &str) -> Error {
    Error::Restore {
        reason: format!("{reason}: {line}"),
    }
}

fn check_chains<'a>(
    chains: &BTreeMap<ChainName, Vec<Rule>>,
    which: impl Iterator<Item = &'a ChainName>,
) -> Result<(), Error> {
    for chain in which {
        for rule in chains.get(chain).into_iter().flatten() {
            if let Some(target) = rule.jump_target() {
                if !chains.contains_key(target) {
                    return Err(restore_error(
                        &render_rule(chain, rule),
                        "jump to missing chain",
                    ));
                }
            }
        }
    }
    Ok(())
}

impl MemoryIptables {
    /// What someone else's `iptables -F; iptables -X` does: only built-in chains remain, empty.
    pub fn flush_everything(&mut self) {
        *self = MemoryIptables {
            restores: std::mem::take(&mut self.restores),
            ..Self::default()
        };
    }

    /// The berth chains and built-in jumps currently installed, comparable with a planned ruleset.
    pub fn berth_ruleset(&self) -> Ruleset {
        let mut rs = Ruleset::default();
        for (table, chains) in &self.tables {
            for (chain, rules) in chains {
                if chain.is_berth() && chain.as_str() != crate::plan::names::CANARY {
                    rs.table_mut(*table)
                        .chains
                        .insert(chain.clone(), rules.clone());
                } else if chain.is_builtin() {
                    for rule in rules {
                        rs.jumps.push(JumpRule {
                            table: *table,
                            from: chain.clone(),
                            rule: rule.clone(),
                        });
                    }
                }
            }
        }
        rs.tables
            .retain(|_, rules: &mut TableRules| !rules.chains.is_empty());
        rs
    }

    /// Applies one table's lines in place; on any error every chain it touched is put back, so
    /// the table is committed whole or not at all.
    fn apply_table(
        chains: &mut BTreeMap<ChainName, Vec<Rule>>,
        refs: &mut Refs,
        lines: &[&str],
    ) -> Result<(), Error> {
        let mut undo: BTreeMap<ChainName, Option<Vec<Rule>>> = BTreeMap::new();
        let result = Self::apply_lines(chains, refs, lines, &mut undo);
        if result.is_err() {
            for (chain, before) in undo {
                match before {
                    Some(rules) => chains.insert(chain, rules),
                    None => chains.remove(&chain),
                };
            }
            // Rare: recounting is simpler than undoing each count.
            *refs = all_refs(chains);
        }
        result
    }

    fn apply_lines(
        chains: &mut BTreeMap<ChainName, Vec<Rule>>,
        refs: &mut Refs,
        lines: &[&str],
        undo: &mut BTreeMap<ChainName, Option<Vec<Rule>>>,
    ) -> Result<(), Error> {
        let mut remember = |chains: &BTreeMap<ChainName, Vec<Rule>>, chain: &ChainName| {
            if !undo.contains_key(chain) {
                undo.insert(chain.clone(), chains.get(chain).cloned());
            }
        };
        let mut deleted = Vec::new();
        for line in lines {
            let words = split_words(line)?;
            let (Some(op), Some(name)) = (words.first(), words.get(1)) else {
                return Err(restore_error(line, "short line"));
            };
            let chain = ChainName::new(name.trim_start_matches(':'));
            match op.as_str() {
                s if s.starts_with(':') => {
                    let declared = ChainName::new(&s[1..]);
                    remember(chains, &declared);
                    if let Some(old) = chains.insert(declared, Vec::new()) {
                        count_refs(refs, &old, false);
                    }
                }
                "-A" => {
                    let rule = parse_rule(line, words[2..].to_vec())?;
                    remember(chains, &chain);
                    let rules = chains
                        .get_mut(&chain)
                        .ok_or_else(|| restore_error(line, "no such chain"))?;
                    count_refs(refs, std::slice::from_ref(&rule), true);
                    rules.push(rule);
                }
                "-D" => {
                    let rule = parse_rule(line, words[2..].to_vec())?;
                    remember(chains, &chain);
                    let rules = chains
                        .get_mut(&chain)
                        .ok_or_else(|| restore_error(line, "no such chain"))?;
                    let at = rules
                        .iter()
                        .position(|r| *r == rule)
                        .ok_or_else(|| restore_error(line, "no matching rule to delete"))?;
                    let removed = rules.remove(at);
                    count_refs(refs, std::slice::from_ref(&removed), false);
                }
                "-F" => {
                    remember(chains, &chain);
                    let rules = chains
                        .get_mut(&chain)
                        .ok_or_else(|| restore_error(line, "no such chain"))?;
                    count_refs(refs, rules, false);
                    rules.clear();
                }
                "-X" => {
                    remember(chains, &chain);
                    match chains.remove(&chain) {
                        Some(rules) if !chain.is_builtin() => count_refs(refs, &rules, false),
                        _ => return Err(restore_error(line, "cannot delete chain")),
                    }
                    deleted.push(chain);
                }
                _ => return Err(restore_error(line, "unsupported command")),
            }
        }
        // Only written chains can have gained a jump to a missing chain; only deletions can
        // have left a jump dangling anywhere else.
        let written: Vec<&ChainName> = undo.keys().filter(|c| chains.contains_key(*c)).collect();
        check_chains(chains, written.into_iter())?;
        for chain in &deleted {
            if !chains.contains_key(chain) && refs.contains_key(chain) {
                return Err(restore_error(
                    chain.as_str(),
                    "deleted chain is still referenced",
                ));
            }
        }
        Ok(())
    }
}

impl MemoryIptables {
    /// Applies a payload given as text, as `iptables-restore --noflush` would.
    pub fn restore_text(&mut self, payload: &str) -> Result<(), Error> {
        self.restores.push(payload.to_string());
        if std::mem::take(&mut self.fail_next_restore) {
            return Err(Error::Restore {
                reason: "injected failure".into(),
            });
        }
        let mut table: Option<Table> = None;
        let mut lines: Vec<&str> = Vec::new();
        for line in payload
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            if let Some(name) = line.strip_prefix('*') {
                table =
                    Some(Table::parse(name).ok_or_else(|| restore_error(line, "unknown table"))?);
                lines.clear();
            } else if line == "COMMIT" {
                let current = table
                    .take()
                    .ok_or_else(|| restore_error(line, "COMMIT outside a table"))?;
                Self::apply_table(
                    self.tables.entry(current).or_default(),
                    self.refs.entry(current).or_default(),
                    &lines,
                )?;
            } else if table.is_some() {
                lines.push(line);
            } else {
                return Err(restore_error(line, "line outside a table"));
            }
        }
        if table.is_some() {
            return Err(Error::Restore {
                reason: "missing COMMIT".into(),
            });
        }
        Ok(())
    }
}

impl Iptables for MemoryIptables {
    fn restore(&mut self, payload: &dyn Payload) -> Result<(), Error> {
        let mut text = Vec::new();
        payload.write_to(&mut text).map_err(|err| Error::Restore {
            reason: format!("rendering the payload failed: {err}"),
        })?;
        self.restore_text(&String::from_utf8_lossy(&text))
    }

    fn save(&mut self, table: Table) -> Result<String, Error> {
        let mut out = format!("*{table}\n");
        let chains = self.tables.get(&table).cloned().unwrap_or_default();
        for chain in chains.keys() {
            let policy = if chain.is_builtin() { "ACCEPT" } else { "-" };
            out.push_str(&format!(":{chain} {policy} [0:0]\n"));
        }
        for (chain, rules) in &chains {
            for rule in rules {
                out.push_str(&render_rule(chain, rule));
                out.push('\n');
            }
        }
        out.push_str("COMMIT\n");
        Ok(out)
    }

    fn ensure_chain(&mut self, table: Table, chain: &ChainName) -> Result<(), Error> {
        self.tables
            .entry(table)
            .or_default()
            .entry(chain.clone())
            .or_default();
        Ok(())
    }

    fn chain_exists(&mut self, table: Table, chain: &ChainName) -> Result<bool, Error> {
        Ok(self
            .tables
            .get(&table)
            .is_some_and(|chains| chains.contains_key(chain)))
    }

    fn ensure_jump(&mut self, jump: &JumpRule) -> Result<(), Error> {
        let chains = self.tables.entry(jump.table).or_default();
        if let Some(target) = jump.rule.jump_target() {
            if !chains.contains_key(target) {
                return Err(Error::Restore {
                    reason: format!("jump to missing chain {target}"),
                });
            }
        }
        let rules = chains.entry(jump.from.clone()).or_default();
        // Compare as text, as `iptables -C` does.
        let wanted = rule_args(&jump.rule);
        if !rules.iter().any(|rule| rule_args(rule) == wanted) {
            rules.insert(0, jump.rule.clone());
            count_refs(
                self.refs.entry(jump.table).or_default(),
                std::slice::from_ref(&jump.rule),
                true,
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nat_chains(ipt: &MemoryIptables) -> BTreeMap<ChainName, Vec<Rule>> {
        ipt.tables.get(&Table::Nat).cloned().unwrap_or_default()
    }

    #[test]
    fn failed_restores_leave_the_table_as_it_was() {
        let mut ipt = MemoryIptables::default();
        ipt.restore_text(
            "*nat\n:BERTH-A - [0:0]\n:BERTH-B - [0:0]\n-A BERTH-A -j BERTH-B\nCOMMIT\n",
        )
        .unwrap();
        let before = nat_chains(&ipt);
        // A referenced chain cannot be deleted, even by a payload that rewrote other chains.
        let err = ipt.restore_text("*nat\n:BERTH-C - [0:0]\n:BERTH-A - [0:0]\n:BERTH-B - [0:0]\n-A BERTH-A -j BERTH-C\n-A BERTH-C -j BERTH-B\n-X BERTH-B\nCOMMIT\n");
        assert!(err.is_err());
        assert_eq!(nat_chains(&ipt), before);
        assert_eq!(ipt.refs.get(&Table::Nat), Some(&all_refs(&before)));
        // A jump to a chain that does not exist.
        assert!(ipt
            .restore_text("*nat\n:BERTH-B - [0:0]\n-A BERTH-B -j BERTH-NOPE\nCOMMIT\n")
            .is_err());
        assert_eq!(nat_chains(&ipt), before);
        // Deleting an unreferenced chain works.
        ipt.restore_text("*nat\n:BERTH-A - [0:0]\n-X BERTH-B\nCOMMIT\n")
            .unwrap();
        assert!(!nat_chains(&ipt).contains_key(&ChainName::new("BERTH-B")));
        assert_eq!(
            ipt.refs.get(&Table::Nat),
            Some(&all_refs(&nat_chains(&ipt)))
        );
    }
}

//! `render`: a ruleset (or the chains of it that changed) -> `iptables-restore --noflush` text.
//!
//! Declaring a chain in a restore payload creates it or flushes it, so a partial payload declares
//! only the chains it rewrites or deletes: every other berth chain keeps its rules untouched.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::io::{self, Write};

use crate::backend::Payload;
use crate::iptables::rule_text::render_rule;
use crate::plan::model::{ChainName, Rule, Ruleset, Table};

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

/// One table's part of a payload: the chains it rewrites, then the stale ones it deletes.
struct TablePart<'a> {
    table: Table,
    rewrite: Vec<(&'a ChainName, &'a Vec<Rule>)>,
    delete: Vec<&'a ChainName>,
}

/// A payload rendered as it is written, so a full sync of 10,000 Services never holds its
/// 50 MB of text at once. Chains without the berth prefix are never declared, flushed or
/// deleted; tables with nothing to do are left out.
pub struct Rendered<'a> {
    parts: Vec<TablePart<'a>>,
    written: Cell<usize>,
    list_first: bool,
}

impl<'a> Rendered<'a> {
    pub fn new(rs: &'a Ruleset, selection: &'a ChainSelection) -> Self {
        let mut parts = Vec::new();
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
            parts.push(TablePart {
                table,
                rewrite,
                delete,
            });
        }
        Rendered {
            parts,
            written: Cell::new(0),
            list_first: false,
        }
    }

    /// Starts each table with a chain-less `-S`, which only lists the table. iptables-nft
    /// (1.8.x) otherwise keeps every chain a restore names, and every jump target, in a sorted
    /// linked list (`cache_chain_list_insert`), so a payload declaring tens of thousands of chains
    /// costs chains × rules string comparisons; one chain-less command makes it fetch the whole
    /// table's chains instead. Unlike `-Z` it changes nobody's counters.
    pub fn listing_first(mut self, list_first: bool) -> Self {
        self.list_first = list_first;
        self
    }

    /// Nothing to restore: no table has a chain to rewrite or delete.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// Bytes written by the last [`Payload::write_to`].
    pub fn written(&self) -> usize {
        self.written.get()
    }

    fn write_parts(&self, out: &mut dyn Write) -> io::Result<usize> {
        let mut written = 0;
        let mut emit = |out: &mut dyn Write, text: &str| {
            written += text.len();
            out.write_all(text.as_bytes())
        };
        for part in &self.parts {
            emit(out, &format!("*{}\n", part.table))?;
            if self.list_first {
                emit(out, "-S\n")?;
            }
            for (chain, _) in &part.rewrite {
                emit(out, &format!(":{chain} - [0:0]\n"))?;
            }
            for chain in &part.delete {
                emit(out, &format!(":{chain} - [0:0]\n"))?;
            }
            for (chain, rules) in &part.rewrite {
                for rule in rules.iter() {
                    let mut line = render_rule(chain, rule);
                    line.push('\n');
                    emit(out, &line)?;
                }
            }
            // Deletions come last: by then no rewritten chain refers to them any more.
            for chain in &part.delete {
                emit(out, &format!("-X {chain}\n"))?;
            }
            emit(out, "COMMIT\n")?;
        }
        Ok(written)
    }
}

impl Payload for Rendered<'_> {
    fn write_to(&self, out: &mut dyn Write) -> io::Result<()> {
        let result = self.write_parts(out);
        if let Ok(written) = result {
            self.written.set(written);
        }
        result.map(|_| ())
    }
}

/// The whole payload as one string; see [`Rendered`] for what it holds.
pub fn render(rs: &Ruleset, selection: &ChainSelection) -> String {
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = Rendered::new(rs, selection).write_to(&mut out);
    String::from_utf8(out)
        .unwrap_or_else(|err| String::from_utf8_lossy(err.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::model::{Match, Rule, Target};

    fn mk_ruleset() -> Ruleset {
        let mut rs = Ruleset::default();
        let nat = rs.table_mut(Table::Nat);
        let chain = ChainName::new("BERTH-SVC-A");
        nat.push(
            &chain,
            Rule::new(vec![Match::comment("ns/a:p")], Target::Return),
        );
        nat.chain_mut(&ChainName::new("KUBE-OTHER"));
        rs
    }

    /// Fails after `left` bytes, as a restore that exits early closes its input.
    struct ShortPipe {
        left: usize,
    }

    impl Write for ShortPipe {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if buf.len() > self.left {
                return Err(io::Error::from(io::ErrorKind::BrokenPipe));
            }
            self.left -= buf.len();
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn streamed_payload_counts_what_it_wrote_and_matches_the_text() {
        let rs = mk_ruleset();
        let selection = ChainSelection::all();
        let payload = Rendered::new(&rs, &selection);
        assert!(!payload.is_empty());
        assert_eq!(payload.written(), 0);
        let mut out = Vec::new();
        payload.write_to(&mut out).unwrap();
        let text = render(&rs, &selection);
        assert_eq!(String::from_utf8(out).unwrap(), text);
        assert_eq!(payload.written(), text.len());
        assert_eq!(
            text,
            "*nat\n:BERTH-SVC-A - [0:0]\n-A BERTH-SVC-A -m comment --comment \"ns/a:p\" -j RETURN\nCOMMIT\n"
        );
    }

    #[test]
    fn nothing_selected_is_an_empty_payload() {
        let rs = mk_ruleset();
        let selection = ChainSelection {
            rewrite: Some(BTreeSet::new()),
            delete: BTreeSet::from([(Table::Nat, ChainName::new("KUBE-OTHER"))]),
        };
        let payload = Rendered::new(&rs, &selection);
        assert!(payload.is_empty());
        assert_eq!(render(&rs, &selection), "");
    }

    #[test]
    fn a_closed_pipe_fails_the_payload() {
        let rs = mk_ruleset();
        let selection = ChainSelection::all();
        let payload = Rendered::new(&rs, &selection);
        let err = payload.write_to(&mut ShortPipe { left: 10 }).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }
}

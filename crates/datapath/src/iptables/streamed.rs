//! The payload of a streamed full sync: a lean planner's ruleset without its Service ports'
//! own chains, those planned a group of ports at a time as the payload is written
//! ([`crate::plan::PortGroups`]), so a full sync never holds the whole plan, typed or as text.
//!
//! Per table: the chains of the ruleset are declared first (the dispatch chains jump to every
//! Service's chains, so their rules come last); then each group's chains are declared and
//! their rules written (a Service port's chains jump only among themselves and to the fixed
//! chains); then the ruleset's rules; then the stale berth chains the kernel holds and the plan
//! does not are flushed and deleted. iptables-restore (legacy and nft) takes a declaration
//! anywhere before the rules that jump to it. Each chain's hash is recorded as it is written:
//! the Syncer's state after the restore.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::io::{self, Write};

use crate::backend::Payload;
use crate::iptables::rule_text::render_rule;
use crate::plan::model::{ChainName, Rule, Table};
use crate::plan::{Planner, PortGroups};

/// A chain's hash and rule count, by table and name: what [`Streamed`] recorded.
pub(super) type Hashed = Vec<((Table, ChainName), (u64, usize))>;

pub(super) struct Streamed<'a> {
    planner: &'a Planner,
    /// Let go a group at a time as its chains are written: the payload is written once.
    ports: RefCell<&'a mut PortGroups>,
    groups: Vec<u16>,
    /// Tables holding Service ports' own chains: the groups are planned for those only.
    service_tables: BTreeSet<Table>,
    /// Per table, the berth chains the kernel holds (from `iptables-save`).
    saved: Vec<(Table, Vec<ChainName>)>,
    list_first: bool,
    hash: fn(&[Rule]) -> u64,
    hashed: RefCell<Hashed>,
    written: Cell<usize>,
    /// Whether writing began: the groups' ports are gone after it.
    begun: Cell<bool>,
}

impl<'a> Streamed<'a> {
    pub(super) fn new(
        planner: &'a Planner,
        ports: &'a mut PortGroups,
        saved: Vec<(Table, Vec<ChainName>)>,
        list_first: bool,
        hash: fn(&[Rule]) -> u64,
    ) -> Self {
        let chains = planner.service_chain_count()
            + planner
                .ruleset()
                .tables
                .values()
                .map(|rules| rules.chains.len())
                .sum::<usize>();
        Streamed {
            planner,
            groups: ports.groups(),
            ports: RefCell::new(ports),
            service_tables: planner.service_chain_tables(),
            saved,
            list_first,
            hash,
            // Sized exactly: grown by doubling, it held room for twice its 110,000 chains.
            hashed: RefCell::new(Vec::with_capacity(chains)),
            written: Cell::new(0),
            begun: Cell::new(false),
        }
    }

    pub(super) fn written(&self) -> usize {
        self.written.get()
    }

    /// Every chain written, with its hash and rule count (after [`Payload::write_to`]).
    pub(super) fn take_hashed(&self) -> Hashed {
        self.hashed.take()
    }

    fn write_table(
        &self,
        table: Table,
        out: &mut dyn Write,
        emit: &mut dyn FnMut(&mut dyn Write, &str) -> io::Result<()>,
    ) -> io::Result<()> {
        let rs = self.planner.ruleset();
        let planned = rs.table(table);
        let saved = self
            .saved
            .iter()
            .find(|(t, _)| *t == table)
            .map_or(&[][..], |(_, chains)| chains.as_slice());
        let own: Vec<(&ChainName, &Vec<Rule>)> = planned
            .map(|rules| rules.chains.iter().filter(|(c, _)| c.is_berth()).collect())
            .unwrap_or_default();
        let services = self.service_tables.contains(&table);
        if own.is_empty() && !services && saved.is_empty() {
            return Ok(());
        }
        emit(out, &format!("*{table}\n"))?;
        if self.list_first {
            emit(out, "-S\n")?;
        }
        for (chain, _) in &own {
            emit(out, &format!(":{chain} - [0:0]\n"))?;
        }
        let mut written: BTreeSet<ChainName> = own.iter().map(|(c, _)| (*c).clone()).collect();
        if services {
            // Taken when the last table holding Service chains is written.
            let last = self.service_tables.last() == Some(&table);
            for group in &self.groups {
                let planned = match last {
                    true => self
                        .ports
                        .borrow_mut()
                        .take_service_chains(self.planner, *group),
                    false => self.ports.borrow().service_chains(self.planner, *group),
                };
                let Some(chains) = planned.table(table) else {
                    continue;
                };
                let chains: Vec<_> = chains.chains.iter().filter(|(c, _)| c.is_berth()).collect();
                for (chain, _) in &chains {
                    emit(out, &format!(":{chain} - [0:0]\n"))?;
                }
                for (chain, rules) in chains {
                    self.write_chain(table, chain, rules, out, emit)?;
                    written.insert(chain.clone());
                }
            }
        }
        for (chain, rules) in own {
            self.write_chain(table, chain, rules, out, emit)?;
        }
        let stale: Vec<&ChainName> = saved.iter().filter(|c| !written.contains(*c)).collect();
        for chain in &stale {
            emit(out, &format!(":{chain} - [0:0]\n"))?;
        }
        for chain in &stale {
            emit(out, &format!("-X {chain}\n"))?;
        }
        emit(out, "COMMIT\n")
    }

    fn write_chain(
        &self,
        table: Table,
        chain: &ChainName,
        rules: &[Rule],
        out: &mut dyn Write,
        emit: &mut dyn FnMut(&mut dyn Write, &str) -> io::Result<()>,
    ) -> io::Result<()> {
        for rule in rules {
            let mut line = render_rule(chain, rule);
            line.push('\n');
            emit(out, &line)?;
        }
        self.hashed
            .borrow_mut()
            .push(((table, chain.clone()), ((self.hash)(rules), rules.len())));
        Ok(())
    }
}

impl Payload for Streamed<'_> {
    fn write_to(&self, out: &mut dyn Write) -> io::Result<()> {
        // The ports are gone once written: a second writing would leave every Service out.
        if self.begun.replace(true) {
            return Err(io::Error::other(
                "a streamed restore payload is written once",
            ));
        }
        let mut written = 0;
        let mut emit = |out: &mut dyn Write, text: &str| {
            written += text.len();
            out.write_all(text.as_bytes())
        };
        for table in Table::ALL {
            self.write_table(table, out, &mut emit)?;
        }
        self.written.set(written);
        Ok(())
    }
}

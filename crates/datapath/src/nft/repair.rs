//! Adoption table by table: the repair of [`crate::nft::adopt::plan_repair`], built as a
//! streamed plan's pieces ([`TablePieces`]) and the kernel's tables arrive one at a time, so
//! that an agent restart or the periodic full pass over berth's tables never holds the whole
//! plan, its nftables form or the whole dump at once (at 10,000 Services that was ~170 MB
//! above the cold load's ~40).
//!
//! Each table's piece is compared with that table as read (its chains, affinity sets and map
//! elements); what is left of the table then (the chains no piece planned so far, its sets,
//! the hairpin set's elements in the main table) is kept for the end, when the pieces that
//! span tables arrive: the base chains of every table and the main table's leftover endpoint
//! chains. Then the hairpin set (it needs every table's chains), and last the stale chains and
//! sets of every table and the tables the plan no longer has. The commands are those of the
//! whole repair, per table in the same order, with the stale deletions of all tables moved to
//! the end (no jump crosses tables, so no command depends on another table's).

use std::collections::{BTreeMap, BTreeSet};
use std::iter::Peekable;

use crate::error::Error;
use crate::nft::adopt::{
    declared, fixed_sets_match, plan_affinity_sets, plan_chains, plan_hairpin, plan_map_elements,
    plan_stale, push_table_repair, ElementRepair, Observed,
};
use crate::nft::applied::{applied_state, Applied, Parts};
use crate::nft::inline::HAIRPIN_SET;
use crate::nft::render::{Command, NftRuleset};
use crate::nft::shard::{Shard, MAIN};
use crate::nft::stage::{Piece, TablePieces};
use berth_core::IpFamily;

/// A repair in progress; [`StreamedRepair::finish`] gives its commands and the state they
/// leave, or `None` when a table cannot be repaired in place (it is replaced then).
pub(super) struct StreamedRepair<'a> {
    family: IpFamily,
    pieces: Peekable<TablePieces<'a>>,
    /// The commands of the tables compared so far, in table order.
    commands: Vec<Command>,
    /// Each table's chains and sets not yet matched with a piece, and (main) its hairpin set.
    left: BTreeMap<Shard, Observed>,
    /// Each table's planned chains (their names in the kernel) and affinity sets so far.
    planned_chains: BTreeMap<Shard, BTreeSet<String>>,
    planned_sets: BTreeMap<Shard, BTreeSet<String>>,
    /// Tables the kernel holds and the plan has not.
    unplanned: Vec<Shard>,
    /// The state each piece leaves, joined in parts of like size ([`Parts`]).
    applied: Parts,
    repairable: bool,
}

impl<'a> StreamedRepair<'a> {
    pub(super) fn new(family: IpFamily, pieces: TablePieces<'a>) -> Self {
        StreamedRepair {
            family,
            pieces: pieces.peekable(),
            commands: Vec::new(),
            left: BTreeMap::new(),
            planned_chains: BTreeMap::new(),
            planned_sets: BTreeMap::new(),
            unplanned: Vec::new(),
            applied: Parts::default(),
            repairable: true,
        }
    }

    /// The kernel's table `shard`, read; tables must come in shard order (the main one first).
    /// The plan's tables before it that the kernel lacks are added first.
    pub(super) fn table(&mut self, shard: Shard, observed: Observed) -> Result<(), Error> {
        self.add_tables_before(Some(shard))?;
        match self
            .pieces
            .next_if(|p| matches!(p, Ok(Piece::Table(s, _)) if *s == shard))
        {
            Some(piece) => {
                let Piece::Table(_, piece) = piece? else {
                    unreachable_piece()?
                };
                self.compare(shard, observed, piece)
            }
            None => {
                self.unplanned.push(shard);
                Ok(())
            }
        }
    }

    /// The repair's commands and the state they leave; `None` when some table cannot be
    /// repaired in place.
    pub(super) fn finish(mut self) -> Result<Option<(Vec<Command>, Applied)>, Error> {
        self.add_tables_before(None)?;
        if !self.left.contains_key(&MAIN) {
            // No main table in the kernel: nothing to adopt.
            return Ok(None);
        }
        // The rest (the main table's endpoint chains no table's chains jumped to) and the
        // base chains of every table.
        let mut spanning = NftRuleset::default();
        for piece in self.pieces.by_ref() {
            let (Piece::Rest(mut piece) | Piece::Hooks(mut piece)) = piece? else {
                unreachable_piece()?
            };
            self.applied.push(applied_state(&mut piece)?);
            spanning.chains.append(&mut piece.chains);
            spanning.hooks.append(&mut piece.hooks);
            spanning.affinity.append(&mut piece.affinity);
        }
        if !self.repairable {
            return Ok(None);
        }
        let applied = std::mem::take(&mut self.applied).merge();
        let family = self.family;
        let mut stale = Vec::new();
        for (shard, left) in &self.left {
            let shard = *shard;
            let (Some(chains), Some(sets)) = (
                plan_chains(left, &spanning, family, shard),
                plan_affinity_sets(left, &spanning, family, shard),
            ) else {
                return Ok(None);
            };
            self.commands.extend(chains.added);
            self.commands.extend(sets);
            self.commands.extend(chains.rewritten);
            let planned_chains = self.planned_chains.entry(shard).or_default();
            planned_chains.extend(
                spanning
                    .chains
                    .keys()
                    .filter(|c| c.shard == shard)
                    .map(|c| c.to_string()),
            );
            let planned_sets = self.planned_sets.entry(shard).or_default();
            planned_sets.extend(
                spanning
                    .affinity
                    .keys()
                    .filter(|(s, _)| *s == shard)
                    .map(|(_, name)| name.to_string()),
            );
            if shard == MAIN {
                let mut hairpin = ElementRepair::default();
                plan_hairpin(left, applied.hairpin.keys().copied(), family, &mut hairpin);
                self.commands.extend(hairpin.deletes);
                self.commands.extend(hairpin.adds);
            }
            let Some(deletions) = plan_stale(
                left,
                &|chain| planned_chains.contains(chain),
                &|set| planned_sets.contains(set),
                shard,
            ) else {
                return Ok(None);
            };
            stale.extend(deletions);
        }
        self.commands.extend(stale);
        self.commands
            .extend(self.unplanned.into_iter().map(Command::DeleteTable));
        Ok(Some((self.commands, applied)))
    }

    /// Adds the plan's tables before `shard` (all that are left when `None`): tables the kernel
    /// does not hold, compared with a table just declared.
    fn add_tables_before(&mut self, shard: Option<Shard>) -> Result<(), Error> {
        while let Some(piece) = self.pieces.next_if(|p| match p {
            Ok(Piece::Table(s, _)) => shard.is_none_or(|until| *s < until),
            // A failed conversion: taken, so that it is returned.
            Err(_) => true,
            _ => false,
        }) {
            let Piece::Table(added, piece) = piece? else {
                unreachable_piece()?
            };
            if added == MAIN {
                // The kernel has no main table: not adopted, whatever else it has.
                self.repairable = false;
                continue;
            }
            self.commands.push(Command::AddTable(added));
            self.commands.push(Command::AddMaps(added));
            self.compare(added, declared(self.family, added), piece)?;
        }
        Ok(())
    }

    /// Compares the piece of table `shard` with the table, and keeps what is left of it.
    fn compare(
        &mut self,
        shard: Shard,
        mut observed: Observed,
        mut piece: NftRuleset,
    ) -> Result<(), Error> {
        let family = self.family;
        let repaired = fixed_sets_match(&observed, family, shard)
            .then(|| {
                let chains = plan_chains(&observed, &piece, family, shard)?;
                let sets = plan_affinity_sets(&observed, &piece, family, shard)?;
                Some((chains, sets))
            })
            .flatten();
        let Some((chains, sets)) = repaired else {
            self.repairable = false;
            return Ok(());
        };
        let elements = plan_map_elements(&observed, &piece, family, shard);
        push_table_repair(&mut self.commands, &observed, shard, chains, sets, elements);
        let names: BTreeSet<String> = piece
            .chains
            .keys()
            .filter(|c| c.shard == shard)
            .map(|c| c.to_string())
            .collect();
        observed.chains.retain(|name, _| !names.contains(name));
        observed.elements.retain(|set, _| set == HAIRPIN_SET);
        self.planned_chains.entry(shard).or_default().extend(names);
        self.planned_sets.entry(shard).or_default().extend(
            piece
                .affinity
                .keys()
                .filter(|(s, _)| *s == shard)
                .map(|(_, name)| name.to_string()),
        );
        self.left.insert(shard, observed);
        self.applied.push(applied_state(&mut piece)?);
        Ok(())
    }
}

/// The pieces come in a fixed order (tables, the rest, the base chains); any other is a bug
/// in [`TablePieces`], reported rather than a panic.
fn unreachable_piece<T>() -> Result<T, Error> {
    Err(Error::InvalidInput {
        object: "nftables adoption".to_string(),
        field: "pieces".to_string(),
        value: "a piece out of order".to_string(),
    })
}

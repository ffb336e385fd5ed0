//! The staged cold load: the pieces [`crate::nft::stage::TablePieces`] converts, turned into
//! the transactions a writer applies one by one, and the applied state the whole load leaves.
//! Beside `stage.rs`, not in it: the pieces are plain conversion (a public part of the plan's
//! nftables form), this is the Syncer's side of the load (transactions, its private state).

use std::net::IpAddr;

use crate::error::Error;
use crate::nft::applied::{applied_state, Applied, Parts};
use crate::nft::render::{Command, Element, NftRuleset, Transaction};
use crate::nft::stage::{Piece, TablePieces};
use berth_core::IpFamily;

/// A cold load's stages, each built when the writer asks for it ([`Nft::apply_staged`]), so
/// that the next table is converted while the kernel takes the last: per table (the main one
/// first) one transaction that replaces whatever a cut-short load left under its name and
/// fills it with everything but its base chains and the hairpin pairs, then any endpoint
/// chains no table's chains jumped to, the hairpin pairs in transactions of their own, and one
/// transaction adding every table's base chains with their rules. A conversion that fails
/// ends the stages (the failure is kept) before the base chains.
///
/// [`Nft::apply_staged`]: crate::nft::Nft::apply_staged
pub(super) struct StagedLoad<'a> {
    family: IpFamily,
    pieces: TablePieces<'a>,
    /// The state each piece so far leaves, joined in parts of like size ([`Parts`]).
    loaded: Parts,
    /// The whole load's state, once the last piece is converted.
    merged: Option<Applied>,
    failure: Option<Error>,
    /// Stages built ahead of the writer: a table's.
    ahead: std::collections::VecDeque<Transaction>,
    /// After the last piece: the hairpin pairs still to stage, from this one on (each stage
    /// built when the writer asks for it: 100,000 pairs at once were 7 MB of commands).
    hairpin_from: Option<IpAddr>,
    /// After the hairpin pairs: the base chains' stage.
    hooks: Option<Transaction>,
}

/// Hairpin pairs per stage of a cold load: about what one shard's stage costs the kernel at
/// 10,000 Services.
const HAIRPIN_STAGE: usize = 10_000;

impl<'a> StagedLoad<'a> {
    pub(super) fn new(family: IpFamily, pieces: TablePieces<'a>) -> Self {
        StagedLoad {
            family,
            pieces,
            loaded: Parts::default(),
            merged: None,
            failure: None,
            ahead: std::collections::VecDeque::new(),
            hairpin_from: None,
            hooks: None,
        }
    }

    /// Queues the stages of one piece, its state recorded: a table's (or the rest's)
    /// transaction; for the base chains, the whole load's state merged, the hairpin pairs' stages
    /// from it, then the base chains' transaction.
    fn stage(&mut self, piece: Piece) -> Result<(), Error> {
        let mut tx = Transaction::new(self.family);
        let (mut planned, table) = match piece {
            Piece::Table(shard, planned) => (planned, Some(shard)),
            Piece::Rest(planned) => (planned, None),
            Piece::Hooks(mut planned) => {
                self.loaded.push(applied_state(&mut planned)?);
                let merged = std::mem::take(&mut self.loaded).merge();
                self.hairpin_from = merged.hairpin.keys().next().copied();
                self.merged = Some(merged);
                for (chain, hook) in &planned.hooks {
                    tx.push(Command::AddChain(chain.clone(), Some(*hook)));
                }
                for (chain, rules) in std::mem::take(&mut planned.chains) {
                    for rule in rules {
                        tx.push(Command::AddRule(chain.clone(), rule));
                    }
                }
                self.hooks = Some(tx);
                return Ok(());
            }
        };
        self.loaded.push(applied_state(&mut planned)?);
        if let Some(shard) = table {
            tx.push(Command::AddTable(shard));
            tx.push(Command::DeleteTable(shard));
            tx.push(Command::AddTable(shard));
            tx.push(Command::AddMaps(shard));
        }
        let NftRuleset {
            chains,
            hooks: _,
            services,
            node_ports,
            cluster_ips,
            affinity,
            hairpin: _,
            endpoint_users: _,
            planned: _,
        } = planned;
        for chain in chains.keys() {
            tx.push(Command::AddChain(chain.clone(), None));
        }
        for ((shard, name), seconds) in affinity {
            tx.push(Command::AddAffinitySet(shard, name, seconds));
        }
        for (chain, rules) in chains {
            for rule in rules {
                tx.push(Command::AddRule(chain.clone(), rule));
            }
        }
        for (key, target) in services {
            tx.push(Command::AddElement(Element::Service(key, target)));
        }
        for (key, target) in node_ports {
            tx.push(Command::AddElement(Element::NodePort(key, target)));
        }
        for ip in cluster_ips {
            tx.push(Command::AddElement(Element::ClusterIp(ip)));
        }
        self.ahead.push_back(tx);
        Ok(())
    }

    /// The state the whole load leaves, or why it stopped.
    pub(super) fn finish(self) -> Result<Applied, Error> {
        match (self.failure, self.merged) {
            (Some(failure), _) => Err(failure),
            (None, Some(merged)) => Ok(merged),
            (None, None) => Err(Error::InvalidInput {
                object: "nftables cold load".to_string(),
                field: "stages".to_string(),
                value: "the writer stopped before the base chains".to_string(),
            }),
        }
    }
}

impl StagedLoad<'_> {
    /// The next stage of hairpin pairs, once the whole load's are known.
    fn hairpin_stage(&mut self) -> Option<Transaction> {
        let from = self.hairpin_from?;
        let hairpin = &self.merged.as_ref()?.hairpin;
        let mut pairs = hairpin.range(from..).map(|(ip, _)| *ip);
        let mut tx = Transaction::new(self.family);
        tx.commands.extend(
            pairs
                .by_ref()
                .take(HAIRPIN_STAGE)
                .map(|ip| Command::AddElement(Element::Hairpin(ip))),
        );
        self.hairpin_from = pairs.next();
        Some(tx)
    }
}

impl Iterator for StagedLoad<'_> {
    type Item = Transaction;

    fn next(&mut self) -> Option<Transaction> {
        while self.failure.is_none() {
            if let Some(tx) = self.ahead.pop_front() {
                return Some(tx);
            }
            if let Some(tx) = self.hairpin_stage() {
                return Some(tx);
            }
            if let Some(tx) = self.hooks.take() {
                return Some(tx);
            }
            if let Err(failure) = self.pieces.next()?.and_then(|piece| self.stage(piece)) {
                self.failure = Some(failure);
            }
        }
        None
    }
}

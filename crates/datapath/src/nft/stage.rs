//! A cold load converted one table at a time ([`TablePieces`]): what
//! [`NftRuleset::from_ruleset_in`] returns, in pieces, so that a staged cold load
//! ([`crate::nft::NftSyncer::with_staged_cold_load`]) converts the next table while the kernel
//! takes the last and never holds the nftables form of the whole plan.
//!
//! What spans tables is converted before the first piece: the chains placed in every table (the
//! mark chain) or split over the shards (the dispatch chains, whose entries become the map
//! elements) and the base chains (the last piece). The endpoint chains that stay chains are
//! converted with the first piece whose chains jump to them, and any other after all tables
//! (the rest, in the main table).

use std::collections::{BTreeMap, BTreeSet};

use crate::error::Error;
use crate::nft::render::{folds, planned_chains, rule_jump, NftChain, NftRuleset};
use crate::nft::shard::{Placement, Shard, Shards, MAIN};
use crate::plan::model::{ChainName, Rule, Ruleset, Table};
use crate::plan::names;

/// One piece of a cold load.
#[derive(Debug)]
pub enum Piece {
    /// Everything of one table but its base chains; the first piece of that table.
    Table(Shard, NftRuleset),
    /// Endpoint chains that stay chains and that no chain of a table's piece jumped to, in the
    /// main table (after every table's piece).
    Rest(NftRuleset),
    /// Every table's base chains with their rules (the hooks), last.
    Hooks(NftRuleset),
}

/// The pieces of one plan's conversion, in order: the main table, the shards, the rest, the
/// hooks. Their union is [`NftRuleset::from_ruleset_in`]'s result.
pub struct TablePieces<'a> {
    rs: &'a Ruleset,
    shards: Shards,
    /// Chains placed in one table, per table (the index is the shard).
    buckets: Vec<Vec<(Table, &'a ChainName, &'a [Rule])>>,
    /// What spans tables, converted up front and handed out with each table's piece.
    shared: NftRuleset,
    shared_endpoint_users: Vec<(Table, ChainName)>,
    /// Every chain handed out so far: jumps are checked against it.
    placed: BTreeSet<NftChain>,
    /// The endpoint chains that stay chains converted so far.
    with_user_done: BTreeSet<ChainName>,
    /// A streamed load's Service chains, planned for each shard's piece as it is converted
    /// ([`TablePieces::streamed`]).
    source: Option<&'a mut dyn FnMut(Shard) -> Ruleset>,
    /// A streamed load's endpoint chains that stay chains and that nothing in their shard's
    /// piece jumped to: converted with the rest.
    unused_endpoints: Ruleset,
    next: usize,
    done: bool,
}

impl<'a> TablePieces<'a> {
    pub fn new(rs: &'a Ruleset, shards: Shards) -> Result<Self, Error> {
        let tables = 1 + shards.shards().count();
        let mut buckets: Vec<Vec<(Table, &ChainName, &[Rule])>> = vec![Vec::new(); tables];
        let mut shared = NftRuleset::default();
        let mut shared_endpoint_users = Vec::new();
        for (table, tables_rules) in &rs.tables {
            for (chain, rules) in &tables_rules.chains {
                if !chain.is_berth() || chain.as_str() == names::CANARY {
                    continue;
                }
                let rules = rules.as_slice();
                let bucket = match shards.place(*table, chain) {
                    // With their first user, or in the rest; whether they fold is asked there,
                    // while the kernel takes a table.
                    Placement::WithUser => continue,
                    Placement::In(_) if folds(*table, chain, rules) => continue,
                    Placement::In(shard) => buckets.get_mut(usize::from(shard)),
                    Placement::Everywhere | Placement::Dispatch => None,
                };
                match bucket {
                    Some(bucket) => bucket.push((*table, chain, rules)),
                    None => {
                        shared.add_chain(
                            rs,
                            shards,
                            *table,
                            chain,
                            rules,
                            &mut shared_endpoint_users,
                        )?;
                    }
                }
            }
        }
        shared.add_hooks(rs, shards);
        Ok(TablePieces {
            rs,
            shards,
            buckets,
            shared,
            shared_endpoint_users,
            placed: BTreeSet::new(),
            with_user_done: BTreeSet::new(),
            source: None,
            unused_endpoints: Ruleset::default(),
            next: 0,
            done: false,
        })
    }

    /// The pieces of a plan whose Service ports' own chains `rs` does not hold (a lean
    /// planner's: see [`crate::plan::Planner::lean`]): `service_chains(shard)` gives them, for
    /// every shard, when that shard's piece is converted, so the whole plan is never held at
    /// once. It must give every chain of the Service ports placed in that shard (their endpoint
    /// chains too) and nothing else. Only for sharded tables: unsharded, the one table holds
    /// every Service chain anyway.
    pub fn streamed(
        rs: &'a Ruleset,
        shards: Shards,
        service_chains: &'a mut dyn FnMut(Shard) -> Ruleset,
    ) -> Result<Self, Error> {
        if !shards.is_sharded() {
            return Err(Error::InvalidInput {
                object: "nftables cold load".to_string(),
                field: "shards".to_string(),
                value: "a streamed load needs shards".to_string(),
            });
        }
        let mut pieces = TablePieces::new(rs, shards)?;
        pieces.source = Some(service_chains);
        Ok(pieces)
    }

    /// The piece of table `shard`: its own chains (and the endpoint chains they jump to that
    /// stay chains), its copies of the shared chains, its map elements; in the main table's also
    /// the shared chains' records.
    fn table(&mut self, shard: Shard) -> Result<NftRuleset, Error> {
        let mut piece = NftRuleset::default();
        let mut endpoint_users = Vec::new();
        let bucket = self
            .buckets
            .get_mut(usize::from(shard))
            .map(std::mem::take)
            .unwrap_or_default();
        let rs = self.rs;
        for (table, chain, rules) in bucket {
            let added =
                piece.add_chain(rs, self.shards, table, chain, rules, &mut endpoint_users)?;
            for endpoint in added.jumps {
                self.with_user(rs, &mut piece, &mut endpoint_users, table, &endpoint, shard)?;
            }
        }
        let streamed = match self.source.as_mut() {
            Some(source) if shard != MAIN => Some(source(shard)),
            _ => None,
        };
        if let Some(planned) = &streamed {
            self.add_streamed(planned, &mut piece, &mut endpoint_users, shard)?;
        }
        let hooks = &self.shared.hooks;
        piece
            .chains
            .append(&mut take_where(&mut self.shared.chains, |chain, _| {
                chain.shard == shard && !hooks.contains_key(chain)
            }));
        piece
            .services
            .append(&mut take_where(&mut self.shared.services, |_, t| {
                t.shard == shard
            }));
        piece
            .node_ports
            .append(&mut take_where(&mut self.shared.node_ports, |_, t| {
                t.shard == shard
            }));
        if shard == MAIN {
            piece.cluster_ips.append(&mut self.shared.cluster_ips);
            piece.planned.append(&mut self.shared.planned);
            piece.hairpin.append(&mut self.shared.hairpin);
            endpoint_users.append(&mut self.shared_endpoint_users);
        }
        piece.endpoint_users = endpoint_users.into_iter().collect();
        self.finish(piece)
    }

    /// Converts a streamed shard's Service chains (`planned`) into its piece; the endpoint
    /// chains no chain of the piece jumped to are kept for the rest.
    fn add_streamed(
        &mut self,
        planned: &Ruleset,
        piece: &mut NftRuleset,
        endpoint_users: &mut Vec<(Table, ChainName)>,
        shard: Shard,
    ) -> Result<(), Error> {
        for (table, chain, rules) in planned_chains(planned) {
            match self.shards.place(table, chain) {
                Placement::In(home) if home == shard => {}
                Placement::WithUser => continue,
                _ => {
                    return Err(Error::InvalidInput {
                        object: "nftables cold load".to_string(),
                        field: chain.to_string(),
                        value: format!("given with the Service chains of shard {shard}"),
                    })
                }
            }
            let added =
                piece.add_chain(planned, self.shards, table, chain, rules, endpoint_users)?;
            for endpoint in added.jumps {
                self.with_user(planned, piece, endpoint_users, table, &endpoint, shard)?;
            }
        }
        for (table, chain, rules) in planned_chains(planned) {
            if self.shards.place(table, chain) == Placement::WithUser
                && !self.with_user_done.contains(chain)
            {
                self.unused_endpoints
                    .table_mut(table)
                    .chains
                    .insert(chain.clone(), rules.to_vec());
            }
        }
        Ok(())
    }

    /// Converts the endpoint chain `chain` of `rs`, which stays a chain, into `piece` and
    /// places it in `shard` (its users'), unless an earlier piece did.
    fn with_user(
        &mut self,
        rs: &Ruleset,
        piece: &mut NftRuleset,
        endpoint_users: &mut Vec<(Table, ChainName)>,
        table: Table,
        chain: &ChainName,
        shard: Shard,
    ) -> Result<(), Error> {
        if self.shards.place(table, chain) != Placement::WithUser
            || !self.with_user_done.insert(chain.clone())
        {
            return Ok(());
        }
        let Some(rules) = rs.chain(table, chain) else {
            return Ok(());
        };
        let added = piece.add_chain(rs, self.shards, table, chain, rules, endpoint_users)?;
        if let Some(rules) = added.unplaced {
            piece.place_with_user(self.shards, table, chain, rules, shard);
        }
        Ok(())
    }

    /// Affinity sets and the jump check of a piece, which joins the chains handed out.
    fn finish(&mut self, mut piece: NftRuleset) -> Result<NftRuleset, Error> {
        piece.fill_affinity();
        if self.shards.is_sharded() {
            for (chain, rules) in &piece.chains {
                for target in rules.iter().filter_map(rule_jump) {
                    let to = NftChain::in_shard(chain.table, target, chain.shard);
                    if !piece.chains.contains_key(&to) && !self.placed.contains(&to) {
                        return Err(Error::InvalidInput {
                            object: "nftables shards".to_string(),
                            field: chain.to_string(),
                            value: format!("jumps to {target}, which is not in the same table"),
                        });
                    }
                }
            }
        }
        self.placed.extend(piece.chains.keys().cloned());
        Ok(piece)
    }

    /// The endpoint chains that stay chains and that no table's chains jumped to, in the main
    /// table.
    fn rest(&mut self) -> Result<Option<NftRuleset>, Error> {
        let mut piece = NftRuleset::default();
        let mut endpoint_users = Vec::new();
        let rs = self.rs;
        for (table, chain, _) in planned_chains(rs) {
            self.with_user(rs, &mut piece, &mut endpoint_users, table, chain, MAIN)?;
        }
        let unused = std::mem::take(&mut self.unused_endpoints);
        for (table, chain, _) in planned_chains(&unused) {
            self.with_user(&unused, &mut piece, &mut endpoint_users, table, chain, MAIN)?;
        }
        if piece.chains.is_empty() {
            return Ok(None);
        }
        piece.endpoint_users = endpoint_users.into_iter().collect();
        self.finish(piece).map(Some)
    }

    fn hooks(&mut self) -> Result<NftRuleset, Error> {
        let mut piece = NftRuleset {
            hooks: std::mem::take(&mut self.shared.hooks),
            ..NftRuleset::default()
        };
        piece.chains = std::mem::take(&mut self.shared.chains);
        self.finish(piece)
    }
}

/// The entries of `map` that `wanted` picks, taken out of it.
fn take_where<K: Ord + Clone, V>(
    map: &mut BTreeMap<K, V>,
    wanted: impl Fn(&K, &V) -> bool,
) -> BTreeMap<K, V> {
    let keys: Vec<K> = map
        .iter()
        .filter(|(k, v)| wanted(k, v))
        .map(|(k, _)| k.clone())
        .collect();
    keys.into_iter()
        .filter_map(|k| map.remove(&k).map(|v| (k, v)))
        .collect()
}

impl Iterator for TablePieces<'_> {
    type Item = Result<Piece, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let tables = self.buckets.len();
        let at = self.next;
        self.next += 1;
        let piece = if at < tables {
            let shard = Shard::try_from(at).unwrap_or(MAIN);
            self.table(shard).map(|p| Piece::Table(shard, p))
        } else if at == tables {
            match self.rest() {
                Ok(Some(p)) => Ok(Piece::Rest(p)),
                Ok(None) => {
                    self.done = true;
                    self.hooks().map(Piece::Hooks)
                }
                Err(e) => Err(e),
            }
        } else {
            self.done = true;
            self.hooks().map(Piece::Hooks)
        };
        if piece.is_err() {
            self.done = true;
        }
        Some(piece)
    }
}

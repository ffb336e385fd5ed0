//! The nftables form of a planned ruleset.
//!
//! The iptables [`Ruleset`] stays the one plan: every chain keeps its rules and meaning, and lives
//! in berth's own table (`ip berth` or `ip6 berth`) as `<table>-<chain>` (`nat-BERTH-SVC-…`), so
//! both backends share the planner, the incremental planner and the packet tracer. Three things
//! change on the way:
//! - The jumps from the built-in chains become base chains of berth's table, hooked where
//!   iptables' tables are (`filter` at priority 0, `nat` at dstnat/srcnat). berth never writes into
//!   another program's table or chain.
//! - Linear dispatch becomes two verdict maps: `service-ips` (destination address · protocol ·
//!   port → `jump` to the Service's chain) and `node-ports` (protocol · port → `jump`), so the first
//!   packet of a connection costs one lookup however many Services there are. `jump`, not `goto`,
//!   so a chain that returns continues exactly where the linear chain would have.
//! - With Service CIDRs, the filter chain `BERTH-CLUSTER-IPS` (one REJECT per ClusterIP, then the
//!   drop of unallocated addresses) becomes one rule, `ip daddr @cluster-ips reject`, and a plain
//!   set of the ClusterIPs (kube-proxy's `cluster-ips`): adding or removing a ClusterIP is one
//!   element, and a set without verdicts costs the kernel no validation of the table.
//! - Endpoint choice keeps iptables' cascade (`numgen random mod n == 0` with n = N, N−1, …, 2):
//!   no anonymous set per Service, whose binding makes the kernel walk the whole transaction
//!   (quadratic cold loads). ClientIP affinity uses one dynamic timeout set per endpoint, named
//!   after the endpoint chain, as `-m recent` names its list.
//! - Endpoint chains are folded into the rules that choose them, and hairpin traffic is marked
//!   in postrouting by a set of `ep . ep` pairs ([`crate::nft::inline`]): a table holds one chain
//!   per Service, not one per endpoint.
//! - With nat shards ([`crate::nft::shard`]) each Service port's chains live in one of K tables
//!   `berth-<n>`, each with its own maps and dispatch; [`NftRuleset::from_ruleset_in`] places
//!   every chain, set and element ([`place_rules`]), and every [`Command`] names its table.
//!
//! The transaction a sync hands a writer ([`Command`], [`Element`], [`Transaction`]) lives in
//! `transaction.rs`, and its `nft -f -` text ([`command_text`], [`rule_text`], …) in `text.rs`;
//! both are re-exported here, so their `nft::render` paths keep working.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::error::Error;
use crate::nft::inline::{inline_endpoint, inline_rule, is_endpoint_chain};
use crate::nft::shard::{
    node_port_base, Placement, Shard, Shards, MAIN, NODE_PORT_JUMPS, NODE_PORT_PRIORITY,
};
use crate::plan::model::{ChainName, Match, PortMatch, RecentAction, Rule, Ruleset, Table, Target};
use crate::plan::names;
use berth_core::Protocol;

// Moved to their own modules; re-exported so that every `nft::render::…` path keeps working.
pub use crate::nft::text::{
    check_expressible, command_text, comment_text, element_text, family_keyword, rule_text,
};
pub use crate::nft::transaction::{Command, Element, Transaction};

/// The name of berth's table in each family.
pub const TABLE: &str = "berth";
/// The verdict map of Service addresses.
pub const SERVICE_MAP: &str = "service-ips";
/// The verdict map of node ports.
pub const NODE_PORT_MAP: &str = "node-ports";
/// The plain set of ClusterIPs inside the Service CIDRs (main table).
pub const CLUSTER_IP_SET: &str = "cluster-ips";
/// The comment of the `cluster-ips` reject rule.
pub const CLUSTER_IP_COMMENT: &str = "berth: cluster IP, on a port it does not have";
/// Default timeout of an affinity entry when no rule names one (kube-proxy's default).
pub const DEFAULT_AFFINITY_SECONDS: u32 = 10800;

/// One chain of berth's tables: the iptables table it was planned in, its name there, and the
/// table of berth's that holds it ([`crate::nft::shard`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NftChain {
    pub table: Table,
    pub name: ChainName,
    pub shard: Shard,
}

impl NftChain {
    /// A chain of the main table.
    pub fn new(table: Table, name: &ChainName) -> Self {
        NftChain {
            table,
            name: name.clone(),
            shard: MAIN,
        }
    }

    /// A chain of the table `shard`.
    pub fn in_shard(table: Table, name: &ChainName, shard: Shard) -> Self {
        NftChain {
            table,
            name: name.clone(),
            shard,
        }
    }
}

impl std::fmt::Display for NftChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.table, self.name)
    }
}

/// Where a base chain hooks in: the built-in chain it stands for, in its iptables table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hook {
    pub table: Table,
    /// `prerouting`, `input`, `forward`, `output` or `postrouting`.
    pub hook: &'static str,
    pub priority: &'static str,
}

impl Hook {
    /// The hook of a built-in chain of `table`, at the priority iptables' table has there.
    pub fn of_builtin(table: Table, chain: &ChainName) -> Option<Hook> {
        let hook = match chain.as_str() {
            "PREROUTING" => "prerouting",
            "INPUT" => "input",
            "FORWARD" => "forward",
            "OUTPUT" => "output",
            "POSTROUTING" => "postrouting",
            _ => return None,
        };
        let priority = match (table, hook) {
            (Table::Nat, "prerouting") => "dstnat",
            (Table::Nat, "output") => "-100",
            (Table::Nat, "postrouting") => "srcnat",
            (Table::Nat, _) => "100",
            (Table::Mangle, _) => "mangle",
            (Table::Filter, _) => "filter",
        };
        Some(Hook {
            table,
            hook,
            priority,
        })
    }

    /// The chain type: `nat`, `route` or `filter`.
    pub fn kind(self) -> &'static str {
        match self.table {
            Table::Nat => "nat",
            Table::Mangle if self.hook == "output" => "route",
            Table::Filter | Table::Mangle => "filter",
        }
    }

    /// The hook's number (`NF_INET_PRE_ROUTING` …).
    pub fn number(self) -> u32 {
        match self.hook {
            "prerouting" => 0,
            "input" => 1,
            "forward" => 2,
            "output" => 3,
            _ => 4,
        }
    }

    /// A shard's node-port base chain: right after every shard's Service-address lookup.
    pub fn node_ports(hook: &'static str) -> Hook {
        Hook {
            table: Table::Nat,
            hook,
            priority: NODE_PORT_PRIORITY,
        }
    }

    /// The priority as a number (`dstnat` is -100, `srcnat` 100, `mangle` -150, `filter` 0).
    pub fn priority_number(self) -> i32 {
        match self.priority {
            "dstnat" => -100,
            "srcnat" => 100,
            "mangle" => -150,
            "filter" => 0,
            other => other.parse().unwrap_or(0),
        }
    }

    /// The built-in iptables chain this hook stands for.
    pub fn builtin(self) -> ChainName {
        ChainName::new(self.hook.to_ascii_uppercase())
    }
}

/// A Service map key: destination address, protocol and port.
pub type ServiceKey = (IpAddr, Protocol, u16);
/// A node-port map key: protocol and port.
pub type NodePortKey = (Protocol, u16);

/// A rule of berth's table: a planned rule, or a lookup in one of the verdict maps.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NftRule {
    Rule(Rule),
    /// `ip daddr . meta l4proto . th dport vmap @service-ips`
    ServiceMap,
    /// `meta l4proto . th dport vmap @node-ports`
    NodePortMap,
    /// `ip daddr @cluster-ips reject`: a new connection to a ClusterIP that no Service port
    /// translated (the per-ClusterIP REJECT rules of `BERTH-CLUSTER-IPS`).
    ClusterIpSet,
    /// `ct status dnat ip saddr . ip daddr @hairpin jump <mark chain>`: a pod that reached itself
    /// through a Service is marked for masquerade (the hairpin rule of every folded endpoint).
    Hairpin(ChainName),
}

/// A planned chain in nftables form, with the map elements its dispatch rules became.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConvertedChain {
    pub rules: Vec<NftRule>,
    pub services: Vec<(ServiceKey, ChainName)>,
    pub node_ports: Vec<(NodePortKey, ChainName)>,
    /// The ClusterIPs of `cluster-ips` (each once, in the chain's order).
    pub cluster_ips: Vec<IpAddr>,
    /// The endpoint chains this chain's rules fold or jump to: a change to one of them changes
    /// this chain.
    pub endpoints: BTreeSet<ChainName>,
    /// The endpoints whose hairpin pair those rules need.
    pub hairpin: BTreeSet<IpAddr>,
}

fn is_services(table: Table, chain: &ChainName) -> bool {
    table == Table::Nat && chain.as_str() == names::SERVICES
}

fn is_node_ports(table: Table, chain: &ChainName) -> bool {
    table == Table::Nat && chain.as_str() == names::NODEPORTS
}

fn is_cluster_ips(table: Table, chain: &ChainName) -> bool {
    table == Table::Filter && chain.as_str() == names::CLUSTER_IPS
}

fn is_postrouting(table: Table, chain: &ChainName) -> bool {
    table == Table::Nat && chain.as_str() == names::POSTROUTING
}

/// Whether a planned chain is folded into the rules that jump to it and has no chain of its own.
/// The chains of a plan the nftables tables hold, in the plan's order: berth's own, not the
/// iptables canary, not the endpoint chains folded into their users.
pub(crate) fn planned_chains(rs: &Ruleset) -> impl Iterator<Item = (Table, &ChainName, &[Rule])> {
    rs.tables.iter().flat_map(|(table, rules)| {
        rules
            .chains
            .iter()
            .filter(move |(chain, chain_rules)| {
                chain.is_berth()
                    && chain.as_str() != names::CANARY
                    && !folds(*table, chain, chain_rules)
            })
            .map(move |(chain, chain_rules)| (*table, chain, chain_rules.as_slice()))
    })
}

/// The endpoint chain a converted rule jumps to (one not folded into it).
fn jumped_endpoint(rule: &NftRule) -> Option<&ChainName> {
    match rule {
        NftRule::Rule(rule) => rule.jump_target().filter(|t| is_endpoint_chain(t)),
        _ => None,
    }
}

pub fn is_folded(rs: &Ruleset, table: Table, chain: &ChainName) -> bool {
    rs.chain(table, chain)
        .is_some_and(|rules| folds(table, chain, rules))
}

/// [`is_folded`] for a chain whose rules are at hand.
pub(crate) fn folds(table: Table, chain: &ChainName, rules: &[Rule]) -> bool {
    table == Table::Nat && inline_endpoint(chain, rules).is_some()
}

/// `-p proto -d host --dport port -j CHAIN` (a comment aside): a Service map element.
fn service_entry(rule: &Rule) -> Option<(ServiceKey, ChainName)> {
    let target = rule.jump_target()?;
    let (mut proto, mut addr, mut port) = (None, None, None);
    for m in rule.matches.iter() {
        match m {
            Match::Comment(_) => {}
            Match::Protocol(p) => proto = Some(*p),
            Match::Destination {
                net,
                negated: false,
            } if net.prefix_len() == net.max_prefix_len() => addr = Some(net.addr()),
            Match::DestPort(PortMatch::Single(p)) => port = Some(*p),
            _ => return None,
        }
    }
    Some(((addr?, proto?, port?), target.clone()))
}

/// `-d host -j REJECT` (a comment aside): a `cluster-ips` element.
fn cluster_ip_entry(rule: &Rule) -> Option<IpAddr> {
    if rule.target != Some(Target::Reject) {
        return None;
    }
    let mut addr = None;
    for m in rule.matches.iter() {
        match m {
            Match::Comment(_) => {}
            Match::Destination {
                net,
                negated: false,
            } if net.prefix_len() == net.max_prefix_len() && addr.is_none() => {
                addr = Some(net.addr())
            }
            _ => return None,
        }
    }
    addr
}

/// `-p proto --dport port -j CHAIN` (a comment aside): a node-port map element.
fn node_port_entry(rule: &Rule) -> Option<(NodePortKey, ChainName)> {
    let target = rule.jump_target()?;
    let (mut proto, mut port) = (None, None);
    for m in rule.matches.iter() {
        match m {
            Match::Comment(_) => {}
            Match::Protocol(p) => proto = Some(*p),
            Match::DestPort(PortMatch::Single(p)) => port = Some(*p),
            _ => return None,
        }
    }
    Some(((proto?, port?), target.clone()))
}

/// The dispatch rules at the head of `rest` that `entry` turns into map or set elements, the
/// first of each key kept (as the first matching rule wins); `rest` is left at the first rule
/// that is not one.
fn leading_entries<T, K: Ord>(
    rest: &mut &[Rule],
    entry: impl Fn(&Rule) -> Option<T>,
    key: impl Fn(&T) -> K,
) -> Vec<T> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    while let Some((found, tail)) = rest
        .split_first()
        .and_then(|(first, tail)| Some((entry(first)?, tail)))
    {
        if seen.insert(key(&found)) {
            out.push(found);
        }
        *rest = tail;
    }
    out
}

/// One planned chain of `rs` in nftables form. In the nat dispatch chains the leading rules that
/// select one address, protocol and port (linear dispatch) become map elements and the map
/// lookup takes their place; what follows them stays a rule, in order. A key two rules share
/// goes to the first, the one the linear chain would have taken. A nat rule that jumps to a
/// foldable endpoint chain becomes that chain's DNAT; the nat postrouting chain starts with the
/// hairpin rule. In the filter `BERTH-CLUSTER-IPS` the leading ClusterIP REJECTs become
/// `cluster-ips` elements and the set's reject rule takes their place.
pub fn convert_chain(
    rs: &Ruleset,
    table: Table,
    chain: &ChainName,
    rules: &[Rule],
) -> ConvertedChain {
    let mut out = ConvertedChain::default();
    if is_postrouting(table, chain) {
        out.rules
            .push(NftRule::Hairpin(names::fixed(names::MARK_MASQ)));
    }
    let mut rest = rules;
    if is_services(table, chain) {
        out.rules.push(NftRule::ServiceMap);
        out.services = leading_entries(&mut rest, service_entry, |entry| entry.0);
    } else if is_cluster_ips(table, chain) {
        out.rules.push(NftRule::ClusterIpSet);
        out.cluster_ips = leading_entries(&mut rest, cluster_ip_entry, |ip| *ip);
    } else if is_node_ports(table, chain) {
        out.rules.push(NftRule::NodePortMap);
        out.node_ports = leading_entries(&mut rest, node_port_entry, |entry| entry.0);
    }
    for rule in rest {
        let folded = (table == Table::Nat)
            .then(|| {
                inline_rule(rule, |target| {
                    rs.chain(Table::Nat, target).map(Vec::as_slice)
                })
            })
            .flatten();
        match folded {
            Some((rule, endpoint, inlined)) => {
                out.hairpin.insert(inlined.hairpin());
                out.endpoints.insert(endpoint);
                out.rules.push(NftRule::Rule(rule));
            }
            None => {
                if let Some(target) = rule.jump_target().filter(|t| is_endpoint_chain(t)) {
                    out.endpoints.insert(target.clone());
                }
                out.rules.push(NftRule::Rule(rule.clone()));
            }
        }
    }
    out
}

/// Affinity sets a rule reads or writes, with the timeout a check names.
pub fn affinity_refs(rule: &NftRule) -> impl Iterator<Item = (&ChainName, Option<u32>)> {
    let matches: &[Match] = match rule {
        NftRule::Rule(rule) => &rule.matches,
        _ => &[],
    };
    matches.iter().filter_map(|m| match m {
        Match::Recent {
            name,
            action: RecentAction::Rcheck { seconds, .. },
        } => Some((name, Some(*seconds))),
        Match::Recent {
            name,
            action: RecentAction::Set,
        } => Some((name, None)),
        _ => None,
    })
}

/// The chains a rule jumps to.
pub fn rule_jump(rule: &NftRule) -> Option<&ChainName> {
    match rule {
        NftRule::Rule(rule) => rule.jump_target(),
        NftRule::Hairpin(target) => Some(target),
        NftRule::ServiceMap | NftRule::NodePortMap | NftRule::ClusterIpSet => None,
    }
}

/// A whole planned ruleset in nftables form.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NftRuleset {
    pub chains: BTreeMap<NftChain, Vec<NftRule>>,
    pub hooks: BTreeMap<NftChain, Hook>,
    pub services: BTreeMap<ServiceKey, NftChain>,
    pub node_ports: BTreeMap<NodePortKey, NftChain>,
    /// The elements of `cluster-ips` (main table).
    pub cluster_ips: BTreeSet<IpAddr>,
    /// Affinity set (in the table of the chains naming it) -> timeout of its entries.
    pub affinity: BTreeMap<(Shard, ChainName), u32>,
    /// The hairpin endpoints (`ep . ep` in the hairpin set) each chain's rules need.
    pub hairpin: BTreeMap<NftChain, BTreeSet<IpAddr>>,
    /// The chains whose rules fold or jump to endpoint chains. Which endpoint chains is not
    /// kept: 100,000 pairs at 10,000 Services, that only a reverse look-up needed, and the
    /// partial sync finds an endpoint chain's users among the chains that change with it.
    pub endpoint_users: BTreeSet<(Table, ChainName)>,
    /// Each planned chain but the base chains: its table, the hash of its converted rules and
    /// how many rules its copies hold, as the partial syncs diff them.
    pub planned: BTreeMap<(Table, ChainName), PlannedChain>,
}

/// What [`NftRuleset::add_chain`] converted.
pub(crate) struct AddedChain {
    /// The chain's table.
    pub home: Shard,
    /// The endpoint chains its rules jump to (those stay chains).
    pub jumps: Vec<ChainName>,
    /// An endpoint chain that stays a chain: its rules, to place with its users.
    pub unplaced: Option<Vec<NftRule>>,
}

/// One planned chain in berth's tables, as the partial syncs diff it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedChain {
    /// The table of its rules (the main table for the copied and split chains).
    pub home: Shard,
    /// [`rules_hash`] of its converted rules.
    pub hash: u64,
    /// Rules over all its copies.
    pub rules: usize,
}

/// A hash of a chain's converted rules: equal rules, equal hash.
pub fn rules_hash(rules: &[NftRule]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    rules.hash(&mut hasher);
    hasher.finish()
}

/// The total of rules over a chain's copies.
pub fn placed_rule_count(placed: &[(NftChain, Vec<NftRule>)]) -> usize {
    placed.iter().map(|(_, rules)| rules.len()).sum()
}

/// Where the rules of one planned chain go: one chain of one table, or (the mark chain, the
/// sharded dispatch chains) a copy or a part in each table. `placement` has its endpoint chains
/// resolved to the table of their users ([`Placement::WithUser`] left is the main table).
pub fn place_rules(
    shards: Shards,
    table: Table,
    chain: &ChainName,
    placement: Placement,
    rules: Vec<NftRule>,
) -> Vec<(NftChain, Vec<NftRule>)> {
    match placement {
        Placement::In(shard) => vec![(NftChain::in_shard(table, chain, shard), rules)],
        Placement::WithUser => vec![(NftChain::new(table, chain), rules)],
        Placement::Everywhere => std::iter::once(MAIN)
            .chain(shards.shards())
            .map(|shard| (NftChain::in_shard(table, chain, shard), rules.clone()))
            .collect(),
        Placement::Dispatch => {
            let jumps = ChainName::new(NODE_PORT_JUMPS);
            let mut out = Vec::new();
            for shard in shards.shards() {
                match rules.split_first() {
                    // BERTH-SERVICES: the Service-address lookup, and apart from it the jumps to
                    // node-port dispatch that the node-port base chains run after every shard's
                    // lookup.
                    Some((NftRule::ServiceMap, tail)) => {
                        out.push((
                            NftChain::in_shard(table, chain, shard),
                            vec![NftRule::ServiceMap],
                        ));
                        out.push((NftChain::in_shard(table, &jumps, shard), tail.to_vec()));
                    }
                    _ => out.push((NftChain::in_shard(table, chain, shard), rules.clone())),
                }
            }
            out
        }
    }
}

fn unshardable(chain: &NftChain, reason: String) -> Error {
    Error::InvalidInput {
        object: "nftables shards".to_string(),
        field: chain.to_string(),
        value: reason,
    }
}

/// The chain a map element jumps to, in its shard; sharded, only a Service port's own chains
/// are map targets (a plan with tree dispatch, say, cannot be sharded).
fn element_target(shards: Shards, target: &ChainName) -> Result<NftChain, Error> {
    match shards.place(Table::Nat, target) {
        Placement::In(shard) if shard != MAIN || !shards.is_sharded() => {
            Ok(NftChain::in_shard(Table::Nat, target, shard))
        }
        _ if !shards.is_sharded() => Ok(NftChain::new(Table::Nat, target)),
        _ => Err(unshardable(
            &NftChain::new(Table::Nat, target),
            "a map element jumps to a chain that is not a Service port's".to_string(),
        )),
    }
}

/// A map element's target chain in the table it belongs to (the main table for a chain that
/// cannot be a sharded target: the kernel then refuses it, and the next full sync says why).
pub fn element_chain(shards: Shards, target: &ChainName) -> NftChain {
    element_target(shards, target).unwrap_or_else(|_| NftChain::new(Table::Nat, target))
}

impl NftRuleset {
    /// Converts a plan (best made with linear dispatch, which becomes the maps) into one table.
    pub fn from_ruleset(rs: &Ruleset) -> Self {
        // One table places every chain: nothing to refuse.
        Self::from_ruleset_in(rs, Shards::default()).unwrap_or_default()
    }

    /// Converts a plan into the main table and `shards` nat shards. Refuses a plan whose
    /// chains would jump from one table into another (the kernel cannot).
    pub fn from_ruleset_in(rs: &Ruleset, shards: Shards) -> Result<Self, Error> {
        let mut out = NftRuleset::default();
        // Collected, then built in one go: a set built from a sorted list fills its nodes, where
        // inserting in order leaves them about half empty (a chain per Service port).
        let mut endpoint_users = Vec::new();
        // Endpoint chains that stay chains go with their users, known once all are converted.
        let mut with_user = Vec::new();
        let mut user_shard: BTreeMap<ChainName, Shard> = BTreeMap::new();
        for (table, chain, chain_rules) in planned_chains(rs) {
            let added =
                out.add_chain(rs, shards, table, chain, chain_rules, &mut endpoint_users)?;
            for endpoint in added.jumps {
                user_shard.entry(endpoint).or_insert(added.home);
            }
            if let Some(rules) = added.unplaced {
                with_user.push((table, chain.clone(), rules));
            }
        }
        for (table, chain, rules) in with_user {
            let home = user_shard.get(&chain).copied().unwrap_or(MAIN);
            out.place_with_user(shards, table, &chain, rules, home);
        }
        out.endpoint_users = endpoint_users.into_iter().collect();
        out.add_hooks(rs, shards);
        out.fill_affinity();
        if shards.is_sharded() {
            out.check_jumps()?;
        }
        Ok(out)
    }

    /// Converts one planned chain into `self`: its map elements, hairpin pairs, whether it
    /// uses endpoint chains (into `endpoint_users`), and its rules placed in their tables — but
    /// an endpoint chain that stays a chain, whose rules are handed back to be placed with its
    /// users.
    pub(crate) fn add_chain(
        &mut self,
        rs: &Ruleset,
        shards: Shards,
        table: Table,
        chain: &ChainName,
        chain_rules: &[Rule],
        endpoint_users: &mut Vec<(Table, ChainName)>,
    ) -> Result<AddedChain, Error> {
        let converted = convert_chain(rs, table, chain, chain_rules);
        let jumps: Vec<ChainName> = converted
            .rules
            .iter()
            .filter_map(jumped_endpoint)
            .cloned()
            .collect();
        let placement = shards.place(table, chain);
        let home = match placement {
            Placement::In(shard) => shard,
            _ => MAIN,
        };
        let here = NftChain::in_shard(table, chain, home);
        if !converted.endpoints.is_empty() {
            endpoint_users.push((table, chain.clone()));
        }
        if !converted.hairpin.is_empty() {
            self.hairpin.insert(here, converted.hairpin);
        }
        for (key, target) in converted.services {
            self.services.insert(key, element_target(shards, &target)?);
        }
        for (key, target) in converted.node_ports {
            self.node_ports
                .insert(key, element_target(shards, &target)?);
        }
        self.cluster_ips.extend(converted.cluster_ips);
        let unplaced = match placement {
            Placement::WithUser => Some(converted.rules),
            _ => {
                self.place(shards, table, chain, placement, home, converted.rules);
                None
            }
        };
        Ok(AddedChain {
            home,
            jumps,
            unplaced,
        })
    }

    /// Places an endpoint chain that stays a chain in `home`, its users' table.
    pub(crate) fn place_with_user(
        &mut self,
        shards: Shards,
        table: Table,
        chain: &ChainName,
        rules: Vec<NftRule>,
        home: Shard,
    ) {
        self.place(shards, table, chain, Placement::In(home), home, rules);
    }

    /// Places a converted chain's rules and records it for the partial syncs' diffs.
    fn place(
        &mut self,
        shards: Shards,
        table: Table,
        chain: &ChainName,
        placement: Placement,
        home: Shard,
        rules: Vec<NftRule>,
    ) {
        let hash = rules_hash(&rules);
        let placed = place_rules(shards, table, chain, placement, rules);
        self.planned.insert(
            (table, chain.clone()),
            PlannedChain {
                home,
                hash,
                rules: placed_rule_count(&placed),
            },
        );
        self.chains.extend(placed);
    }

    /// The base chains: each jump berth puts in a built-in chain, on its hook; sharded, every
    /// shard's Service-address lookup where the jump to it was and its node-port lookup one
    /// priority later.
    pub(crate) fn add_hooks(&mut self, rs: &Ruleset, shards: Shards) {
        for jump in &rs.jumps {
            let Some(hook) = Hook::of_builtin(jump.table, &jump.from) else {
                continue;
            };
            let to_dispatch = jump
                .rule
                .jump_target()
                .is_some_and(|t| shards.place(jump.table, t) == Placement::Dispatch);
            if !to_dispatch {
                let base = NftChain::new(jump.table, &jump.from);
                self.hooks.insert(base.clone(), hook);
                self.chains
                    .entry(base)
                    .or_default()
                    .push(NftRule::Rule(jump.rule.clone()));
                continue;
            }
            let node_ports = node_port_base(&jump.from);
            let to_jumps = Rule::jump(
                vec![Match::comment("berth service nodeports")],
                &ChainName::new(NODE_PORT_JUMPS),
            );
            for shard in shards.shards() {
                let base = NftChain::in_shard(jump.table, &jump.from, shard);
                self.hooks.insert(base.clone(), hook);
                self.chains
                    .entry(base)
                    .or_default()
                    .push(NftRule::Rule(jump.rule.clone()));
                let base = NftChain::in_shard(jump.table, &node_ports, shard);
                self.hooks.insert(base.clone(), Hook::node_ports(hook.hook));
                let rules = self.chains.entry(base).or_default();
                if rules.is_empty() {
                    rules.push(NftRule::Rule(to_jumps.clone()));
                }
            }
        }
    }

    /// The affinity sets the rules name, in the table of the chains naming them.
    pub(crate) fn fill_affinity(&mut self) {
        for (chain, rules) in &self.chains {
            for rule in rules {
                for (name, seconds) in affinity_refs(rule) {
                    let entry = self
                        .affinity
                        .entry((chain.shard, name.clone()))
                        .or_insert(DEFAULT_AFFINITY_SECONDS);
                    if let Some(seconds) = seconds {
                        *entry = seconds;
                    }
                }
            }
        }
    }

    /// Every jump lands in its own table.
    pub(crate) fn check_jumps(&self) -> Result<(), Error> {
        for (chain, rules) in &self.chains {
            for target in rules.iter().filter_map(rule_jump) {
                let to = NftChain::in_shard(chain.table, target, chain.shard);
                if !self.chains.contains_key(&to) {
                    return Err(unshardable(
                        chain,
                        format!("jumps to {target}, which is not in the same table"),
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn rule_count(&self) -> usize {
        self.chains.values().map(Vec::len).sum()
    }

    /// Every endpoint of the hairpin set.
    pub fn hairpin_endpoints(&self) -> BTreeSet<IpAddr> {
        self.hairpin.values().flatten().copied().collect()
    }

    /// The tables this ruleset fills: the main table and the shards.
    pub fn tables(&self) -> BTreeSet<Shard> {
        std::iter::once(MAIN)
            .chain(self.chains.keys().map(|c| c.shard))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reject(comment: &str, dst: &str) -> Rule {
        Rule::new(
            vec![
                Match::comment(comment),
                Match::dst_net(dst.parse().unwrap()),
            ],
            Target::Reject,
        )
    }

    /// The leading single-address REJECTs of `BERTH-CLUSTER-IPS` become `cluster-ips` elements
    /// (each address once, in order) behind one set rule; from the first rule of another shape on
    /// (a range, a port, another verdict) every rule stays a rule, in order. Another chain keeps
    /// the same rules as rules.
    #[test]
    fn cluster_ip_rejects_become_set_elements() {
        let chain = names::fixed(names::CLUSTER_IPS);
        let drop = Rule::new(vec![Match::comment("unallocated")], Target::Drop);
        let with_port = Rule::new(
            vec![
                Match::dst_net("10.96.0.3/32".parse().unwrap()),
                Match::Protocol(Protocol::Tcp),
                Match::DestPort(PortMatch::Single(80)),
            ],
            Target::Reject,
        );
        let range = reject("range", "10.96.1.0/24");
        let two_addresses = Rule::new(
            vec![
                Match::dst_net("10.96.0.4/32".parse().unwrap()),
                Match::dst_net("10.96.0.5/32".parse().unwrap()),
            ],
            Target::Reject,
        );
        let ips =
            |list: &[&str]| -> Vec<IpAddr> { list.iter().map(|s| s.parse().unwrap()).collect() };
        let a = reject("a:80", "10.96.0.2/32");
        let a_other_port = reject("a:443", "10.96.0.2/32");
        let b = reject("b", "10.96.0.1/32");
        // (rules, elements, the rules left after the set rule)
        let rows: Vec<(Vec<Rule>, Vec<IpAddr>, Vec<Rule>)> = vec![
            (vec![drop.clone()], vec![], vec![drop.clone()]),
            (
                vec![a.clone(), a_other_port.clone(), b.clone(), drop.clone()],
                ips(&["10.96.0.2", "10.96.0.1"]),
                vec![drop.clone()],
            ),
            (
                vec![a.clone(), with_port.clone(), b.clone(), drop.clone()],
                ips(&["10.96.0.2"]),
                vec![with_port.clone(), b.clone(), drop.clone()],
            ),
            (
                vec![range.clone(), a.clone()],
                vec![],
                vec![range.clone(), a.clone()],
            ),
            (
                vec![two_addresses.clone(), a.clone()],
                vec![],
                vec![two_addresses.clone(), a.clone()],
            ),
            (
                vec![Rule::new(
                    vec![Match::dst_net("10.96.0.2/32".parse().unwrap())],
                    Target::Drop,
                )],
                vec![],
                vec![Rule::new(
                    vec![Match::dst_net("10.96.0.2/32".parse().unwrap())],
                    Target::Drop,
                )],
            ),
        ];
        let rs = Ruleset::default();
        for (rules, elements, rest) in rows {
            let converted = convert_chain(&rs, Table::Filter, &chain, &rules);
            let mut want = vec![NftRule::ClusterIpSet];
            want.extend(rest.iter().cloned().map(NftRule::Rule));
            assert_eq!(converted.rules, want, "{rules:?}");
            assert_eq!(converted.cluster_ips, elements, "{rules:?}");
            // Elsewhere nothing is converted.
            let other = convert_chain(&rs, Table::Nat, &chain, &rules);
            assert!(other.cluster_ips.is_empty());
            assert_eq!(
                other.rules,
                rules.iter().cloned().map(NftRule::Rule).collect::<Vec<_>>()
            );
        }
    }
}

//! berth's nftables table read back from the kernel ([`RawTable`], a netlink dump) into the
//! typed table berth wrote ([`NftTable`]), for the packet tracer: [`decode_table`]. Total over
//! what berth writes (either writer: its own netlink batches or `nft -f`), and strict about the
//! rest: a chain, set, element, rule or expression berth never writes (a table another program
//! changed) is an [`Error::Decode`] naming it, never a guess.
//!
//! Decisions:
//! - Decoding is from the dump, not from `nft list` text: the dump is what adoption already
//!   reads, it needs no `nft` on the node, and it is the kernel's own form, stable across `nft`
//!   versions whose text changes.
//! - A decoded table equals the planned one as the kernel can hold it ([`NftTable::kernel_form`]:
//!   see [`kernel_rule`] for what a rule loses on the way); the equality test in
//!   `tests/nft_netlink.rs` holds the two together through full and partial syncs.
//! - The affinity sets' entries are not read: they are state (who was sent where), not the
//!   ruleset; a trace follows a client without an entry.

mod expr;
mod kernel;
mod rule;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::IpAddr;

pub use kernel::kernel_rule;

use crate::error::Error;
use crate::nft::adopt::split_tables;
use crate::nft::dump::{chain_msg, element_msg, rule_msg, set_msg, RawTable, SetMsg};
use crate::nft::inline::HAIRPIN_SET;
use crate::nft::render::{Hook, NftChain, CLUSTER_IP_SET, NODE_PORT_MAP, SERVICE_MAP, TABLE};
use crate::nft::shard::{node_port_hook, Shard, MAIN};
use crate::nft::table::NftTable;
use crate::nft::wire::{
    NFT_DATA_VERDICT, NFT_SET_EVAL, NFT_SET_INTERVAL, NFT_SET_MAP, NFT_SET_OBJECT, NFT_SET_TIMEOUT,
    NF_ACCEPT, TYPE_INET_PROTO, TYPE_INET_SERVICE, TYPE_IPV4_ADDR, TYPE_IPV6_ADDR,
};
use crate::plan::model::{ChainName, Table};
use berth_core::IpFamily;

/// The flags that change what a set is; others (`constant`, the kernel's own) do not.
const SHAPE_FLAGS: u32 =
    NFT_SET_INTERVAL | NFT_SET_MAP | NFT_SET_TIMEOUT | NFT_SET_EVAL | NFT_SET_OBJECT;
/// `NFTA_SET_ELEM_*`: key, data, flags.
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_FLAGS: u16 = 3;

fn decode_error(object: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::Decode {
        object: object.into(),
        reason: reason.into(),
    }
}

/// `<table>-<chain>`, the name berth gives a planned chain in its nftables table.
fn chain_of(name: &str) -> Result<NftChain, Error> {
    let planned = name
        .split_once('-')
        .and_then(|(table, chain)| Some((Table::parse(table)?, ChainName::new(chain))))
        .filter(|(_, chain)| chain.is_berth() || chain.is_builtin());
    match planned {
        Some((table, chain)) => Ok(NftChain::new(table, &chain)),
        None => Err(decode_error(
            format!("chain {name}"),
            "not a chain berth plans (<table>-BERTH-… or a built-in)",
        )),
    }
}

/// The key of each fixed set and its length, and whether it is a map.
fn fixed_set(family: IpFamily, name: &str) -> Option<(u32, u32, bool)> {
    let (addr, len) = match family {
        IpFamily::V4 => (TYPE_IPV4_ADDR, 4),
        IpFamily::V6 => (TYPE_IPV6_ADDR, 16),
    };
    match name {
        SERVICE_MAP => Some((
            (addr << 12) | (TYPE_INET_PROTO << 6) | TYPE_INET_SERVICE,
            len + 8,
            true,
        )),
        NODE_PORT_MAP => Some(((TYPE_INET_PROTO << 6) | TYPE_INET_SERVICE, 8, true)),
        HAIRPIN_SET => Some(((addr << 6) | addr, len * 2, false)),
        CLUSTER_IP_SET => Some((addr, len, false)),
        _ => None,
    }
}

/// One set: a fixed one of the declared shape (`Ok(None)`), or an affinity set and the seconds
/// its entries live.
fn decode_set(family: IpFamily, set: &SetMsg<'_>) -> Result<Option<u32>, Error> {
    let fail = |reason: String| decode_error(format!("set {}", set.name), reason);
    let shape = set.flags & SHAPE_FLAGS;
    if let Some((key_type, key_len, map)) = fixed_set(family, set.name) {
        let flags = if map { NFT_SET_MAP } else { 0 };
        let data = map.then_some(NFT_DATA_VERDICT);
        if (set.key_type, set.key_len, shape, set.data_type) != (key_type, key_len, flags, data) {
            return Err(fail(format!(
                "key type {:#x} of {} bytes, flags {:#x}, data {:?}: not the one berth declares",
                set.key_type, set.key_len, set.flags, set.data_type
            )));
        }
        return Ok(None);
    }
    let (addr, len) = match family {
        IpFamily::V4 => (TYPE_IPV4_ADDR, 4),
        IpFamily::V6 => (TYPE_IPV6_ADDR, 16),
    };
    if (set.key_type, set.key_len, shape, set.data_type)
        != (addr, len, NFT_SET_TIMEOUT | NFT_SET_EVAL, None)
    {
        return Err(fail(
            "neither a map of berth's nor an affinity set (a dynamic timeout set of source addresses)"
                .to_string(),
        ));
    }
    if set.timeout_ms == 0 || !set.timeout_ms.is_multiple_of(1000) {
        return Err(fail(format!(
            "an entry timeout of {} ms, not whole seconds",
            set.timeout_ms
        )));
    }
    u32::try_from(set.timeout_ms / 1000)
        .map(Some)
        .map_err(|_| fail(format!("an entry timeout of {} ms", set.timeout_ms)))
}

/// A base chain's hook must be the one berth gives its built-in (and the policy accept); any
/// other chain has none.
fn decode_hook(
    chain: &NftChain,
    name: &str,
    hook: Option<&(String, u32, i32)>,
    policy: Option<u32>,
) -> Result<Option<Hook>, Error> {
    let fail = |reason: &str| decode_error(format!("chain {name}"), reason);
    let want = match (chain.shard, node_port_hook(&chain.name)) {
        (shard, Some(hook)) if shard != MAIN && chain.table == Table::Nat => {
            Some(Hook::node_ports(hook))
        }
        _ => Hook::of_builtin(chain.table, &chain.name),
    };
    match (want, hook) {
        (None, None) => Ok(None),
        (Some(want), Some((kind, number, priority)))
            if (kind.as_str(), *number, *priority)
                == (want.kind(), want.number(), want.priority_number()) =>
        {
            if policy.unwrap_or(NF_ACCEPT) != NF_ACCEPT {
                return Err(fail("a base chain whose policy is not accept"));
            }
            Ok(Some(want))
        }
        (Some(_), _) => Err(fail("hooked elsewhere than berth hooks it")),
        (None, Some(_)) => Err(fail("a base chain berth never hooks")),
    }
}

fn ip_of(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

/// One element of a fixed set: its key and, in a map, the nat chain it jumps to.
fn element_parts(
    set: &str,
    element: crate::nft::wire::Attr<'_>,
) -> Result<(Vec<u8>, Option<NftChain>), String> {
    let mut key = None;
    let mut target = None;
    for attr in expr::checked(element.value)? {
        match attr.kind {
            NFTA_SET_ELEM_KEY => {
                let mut inner = attr.nested();
                key = match (inner.next(), inner.next()) {
                    (Some(v), None) if v.kind == 1 => Some(v.value.to_vec()),
                    _ => return Err("a key that is not a value".to_string()),
                }
            }
            NFTA_SET_ELEM_DATA => {
                let verdict = attr.nested().get(2).ok_or("data that is not a verdict")?;
                let code = verdict.nested().get(1).and_then(|a| a.u32());
                let chain = verdict.nested().get(2).and_then(|a| a.str());
                target = match (code, chain) {
                    (Some(c), Some(chain)) if c == crate::nft::expr::NFT_JUMP => {
                        let chain = chain_of(chain).map_err(|e| e.to_string())?;
                        if chain.table != Table::Nat {
                            return Err(format!("a jump to {chain}, outside nat"));
                        }
                        Some(chain)
                    }
                    _ => return Err("a verdict other than a jump".to_string()),
                };
            }
            NFTA_SET_ELEM_FLAGS if attr.u32() == Some(0) => {}
            other => return Err(format!("element attribute {other} in {set}")),
        }
    }
    Ok((key.ok_or("an element without a key")?, target))
}

/// Puts one element of a fixed set into `table`.
fn decode_element(
    family: IpFamily,
    table: &mut NftTable,
    set: &str,
    key: &[u8],
    target: Option<NftChain>,
) -> Result<(), String> {
    let len = match family {
        IpFamily::V4 => 4,
        IpFamily::V6 => 16,
    };
    // Each field of a concatenation is padded to 4 bytes; the padding is zero.
    let proto_port = |b: &[u8]| -> Result<(berth_core::Protocol, u16), String> {
        match b {
            [p, 0, 0, 0, hi, lo, 0, 0] => {
                Ok((rule::protocol_of(*p)?, u16::from_be_bytes([*hi, *lo])))
            }
            _ => Err("a protocol and port of another shape".to_string()),
        }
    };
    let duplicate = || "a key twice".to_string();
    match (set, target) {
        (SERVICE_MAP, Some(target)) if key.len() == len + 8 => {
            let addr = ip_of(&key[..len]).ok_or("an address of another length")?;
            let (proto, port) = proto_port(&key[len..])?;
            if table.services.insert((addr, proto, port), target).is_some() {
                return Err(duplicate());
            }
        }
        (NODE_PORT_MAP, Some(target)) if key.len() == 8 => {
            if table.node_ports.insert(proto_port(key)?, target).is_some() {
                return Err(duplicate());
            }
        }
        (HAIRPIN_SET, None) if key.len() == len * 2 => {
            let (ep, again) = key.split_at(len);
            if ep != again {
                return Err("a pair of two addresses (berth pairs an endpoint with itself)".into());
            }
            let ep = ip_of(ep).ok_or("an address of another length")?;
            if !table.hairpin.insert(ep) {
                return Err(duplicate());
            }
        }
        (CLUSTER_IP_SET, None) if key.len() == len => {
            let ip = ip_of(key).ok_or("an address of another length")?;
            if !table.cluster_ips.insert(ip) {
                return Err(duplicate());
            }
        }
        _ => return Err("a key or verdict of another shape".to_string()),
    }
    Ok(())
}

/// berth's tables of `family` as the kernel holds them (the main table and its nat shards, in
/// one dump whose messages name their tables), typed; an error names the first thing in them
/// that berth never writes.
pub fn decode_table(family: IpFamily, raw: &RawTable) -> Result<NftTable, Error> {
    let mut table = NftTable::default();
    table.tables.insert(MAIN);
    for (shard, part) in split_tables(TABLE, raw) {
        table.tables.insert(shard);
        decode_one(family, shard, &part, &mut table)?;
    }
    for target in table.services.values().chain(table.node_ports.values()) {
        if !table.chains.contains_key(target) {
            return Err(decode_error(
                format!("an element jumping to {target}"),
                "the chain was not dumped",
            ));
        }
    }
    Ok(table)
}

/// The affinity sets of the table `shard` and their timeouts.
fn sets_of(table: &NftTable, shard: Shard) -> BTreeMap<ChainName, u32> {
    table
        .affinity
        .iter()
        .filter(|((s, _), _)| *s == shard)
        .map(|((_, name), seconds)| (name.clone(), *seconds))
        .collect()
}

/// One table of berth's, `shard`, into `table`.
fn decode_one(
    family: IpFamily,
    shard: Shard,
    raw: &RawTable,
    table: &mut NftTable,
) -> Result<(), Error> {
    let mut fixed = 0;
    for message in &raw.sets {
        let set = set_msg(message).ok_or_else(|| decode_error("a set", "without a name"))?;
        if shard != MAIN && (set.name == HAIRPIN_SET || set.name == CLUSTER_IP_SET) {
            return Err(decode_error(
                format!("set {}", set.name),
                "in a shard (the main table holds it)",
            ));
        }
        match decode_set(family, &set)? {
            None => fixed += 1,
            Some(seconds) => {
                table
                    .affinity
                    .insert((shard, ChainName::new(set.name)), seconds);
            }
        }
    }
    let all = if shard == MAIN { 4 } else { 2 };
    match fixed {
        0 => {}
        n if n == all => {
            table.maps.insert(shard);
        }
        _ => {
            return Err(decode_error(
                "the maps",
                "only some of service-ips, node-ports, hairpin and cluster-ips are declared",
            ))
        }
    }
    let affinity = sets_of(table, shard);
    let mut names: BTreeMap<String, NftChain> = BTreeMap::new();
    for message in &raw.chains {
        let chain = chain_msg(message).ok_or_else(|| decode_error("a chain", "without a name"))?;
        let mut planned = chain_of(chain.name)?;
        planned.shard = shard;
        if let Some(hook) = decode_hook(&planned, chain.name, chain.hook.as_ref(), chain.policy)? {
            table.hooks.insert(planned.clone(), hook);
        }
        table.chains.insert(planned.clone(), Vec::new());
        names.insert(chain.name.to_string(), planned);
    }
    for message in &raw.rules {
        let msg = rule_msg(message).ok_or_else(|| decode_error("a rule", "without a chain"))?;
        let chain = names.get(msg.chain).ok_or_else(|| {
            decode_error(
                format!("a rule of chain {}", msg.chain),
                "the chain was not dumped",
            )
        })?;
        let rules = table.chains.get(chain).map_or(0, Vec::len);
        let object = format!("rule {} of chain {}", rules + 1, msg.chain);
        if msg.compat {
            return Err(decode_error(object, "an xtables rule (iptables-nft's)"));
        }
        let cx = rule::Context {
            family,
            table: chain.table,
            affinity: &affinity,
        };
        let decoded = expr::parse_exprs(msg.exprs)
            .and_then(|exprs| rule::decode_rule(&cx, &exprs, msg.userdata))
            .map_err(|reason| decode_error(object, reason))?;
        if let Some(rules) = table.chains.get_mut(chain) {
            rules.push(decoded);
        }
    }
    for message in &raw.elements {
        let (set, list) =
            element_msg(message).ok_or_else(|| decode_error("elements", "without a set"))?;
        if affinity.contains_key(&ChainName::new(set)) {
            continue;
        }
        if fixed_set(family, set).is_none() || !table.maps.contains(&shard) {
            return Err(decode_error(
                format!("elements of {set}"),
                "a set that was not dumped",
            ));
        }
        for (i, element) in expr::checked(list.0)
            .map_err(|reason| decode_error(format!("elements of {set}"), reason))?
            .enumerate()
        {
            element_parts(set, element)
                .and_then(|(key, target)| {
                    let target = target.map(|t| NftChain { shard, ..t });
                    decode_element(family, table, set, &key, target)
                })
                .map_err(|reason| decode_error(format!("element {} of {set}", i + 1), reason))?;
        }
    }
    Ok(())
}

impl NftTable {
    /// The table as the kernel can hold it: each planned rule as the decoder reads it back
    /// ([`kernel_rule`]). A decoded table is its own kernel form.
    pub fn kernel_form(&self) -> NftTable {
        let mut out = self.clone();
        let sets: BTreeMap<Shard, BTreeMap<ChainName, u32>> = self
            .tables
            .iter()
            .map(|shard| (*shard, sets_of(self, *shard)))
            .collect();
        let none = BTreeMap::new();
        for (chain, rules) in out.chains.iter_mut() {
            let affinity = sets.get(&chain.shard).unwrap_or(&none);
            for rule in rules.iter_mut() {
                *rule = kernel_rule(rule, affinity);
            }
        }
        out
    }
}

//! berth's tables as the kernel holds them, read from a netlink dump into the form adoption
//! compares ([`Observed`]): chains with their hooks, rules in canonical form ([`canonical_rule`];
//! what that form leaves out is said in `adopt.rs`), sets, and the fixed maps' elements. Apart
//! from the repair because reading needs no plan: the netlink reader observes, the sync repairs.

use std::collections::BTreeMap;

use crate::nft::dump::{
    chain_msg, element_msg, rule_msg, set_msg, shard_of_message, ObservedHook, RawTable,
};
use crate::nft::inline::HAIRPIN_SET;
use crate::nft::render::{CLUSTER_IP_SET, NODE_PORT_MAP, SERVICE_MAP};
use crate::nft::shard::Shard;
use crate::nft::wire::{Attr, Attrs};

/// One chain of berth's table in the kernel: its hook and its rules, canonical.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObservedChain {
    pub hook: Option<ObservedHook>,
    pub rules: Vec<Vec<u8>>,
}

/// One set or map: flags, key type and length, timeout of its entries (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ObservedSet {
    pub flags: u32,
    pub key_type: u32,
    pub key_len: u32,
    pub timeout_ms: u64,
}

/// berth's table of one family as the kernel holds it. Elements are read for the two maps,
/// the hairpin set and `cluster-ips` only: the dynamic sets' entries are state berth never
/// rewrites.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Observed {
    pub chains: BTreeMap<String, ObservedChain>,
    pub sets: BTreeMap<String, ObservedSet>,
    /// set -> key -> the chain the element jumps to (maps) or `None` (sets).
    pub elements: BTreeMap<String, BTreeMap<Vec<u8>, Option<String>>>,
}

/// The attributes of one expression that say what it does, as `(type, value)`; values of
/// nested attributes canonical too.
fn canonical_expr(name: &str, data: Attrs<'_>, out: &mut Vec<u8>) {
    let mut attrs: Vec<(u16, Vec<u8>)> = Vec::new();
    for attr in data {
        let keep = match (name, attr.kind) {
            ("counter", _) => false,
            // lookup: set id, flags 0
            ("lookup", 4) => false,
            ("lookup", 5) => attr.u32() != Some(0),
            // dynset: set id, timeout 0, pad, flags 0
            ("dynset", 2) | ("dynset", 8) => false,
            ("dynset", 6) => attr.u64() != Some(0),
            ("dynset", 9) => attr.u32() != Some(0),
            // bitwise: a boolean operation
            ("bitwise", 6) => attr.u32() != Some(0),
            // nat: range maxima (the kernel repeats the minima) and flags it sets itself
            ("nat", 4) | ("nat", 6) | ("nat", 7) => false,
            _ => true,
        };
        if !keep {
            continue;
        }
        let value = match (name, attr.kind) {
            ("cmp", 3) | ("immediate", 2) | ("bitwise", 4) | ("bitwise", 5) => canonical_data(attr),
            _ => attr.value.to_vec(),
        };
        attrs.push((attr.kind, value));
    }
    attrs.sort();
    push_field(out, name.as_bytes());
    for (kind, value) in attrs {
        out.extend_from_slice(&kind.to_be_bytes());
        push_field(out, &value);
    }
}

/// `NFTA_DATA_VALUE` as is; `NFTA_DATA_VERDICT` as its code and chain.
fn canonical_data(attr: Attr<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    for inner in attr.nested() {
        out.extend_from_slice(&inner.kind.to_be_bytes());
        if inner.kind == 2 {
            for v in inner.nested() {
                out.extend_from_slice(&v.kind.to_be_bytes());
                push_field(&mut out, v.value);
            }
        } else {
            push_field(&mut out, inner.value);
        }
    }
    out
}

fn push_field(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// berth's tables of one family: the main table and the shards, as adoption compares them.
pub type ObservedTables = BTreeMap<Shard, Observed>;

/// A dump of several tables of `base`'s as one dump per table.
pub fn split_tables(base: &str, raw: &RawTable) -> BTreeMap<Shard, RawTable> {
    let mut parts: BTreeMap<Shard, RawTable> = BTreeMap::new();
    let mut put = |messages: &[Vec<u8>], field: fn(&mut RawTable) -> &mut Vec<Vec<u8>>| {
        for m in messages {
            if let Some(shard) = shard_of_message(base, m) {
                field(parts.entry(shard).or_default()).push(m.clone());
            }
        }
    };
    put(&raw.chains, |t| &mut t.chains);
    put(&raw.rules, |t| &mut t.rules);
    put(&raw.sets, |t| &mut t.sets);
    put(&raw.elements, |t| &mut t.elements);
    parts
}

/// One table as adoption compares it: a dump's chains with their hooks and canonical rules,
/// its sets, and the elements of the maps and the hairpin set. Messages without a name are left
/// out (the kernel never sends one).
pub fn observe_table(raw: &RawTable) -> Observed {
    let mut observed = Observed::default();
    for chain in raw.chains.iter().filter_map(|m| chain_msg(m)) {
        observed.chains.insert(
            chain.name.to_string(),
            ObservedChain {
                hook: chain.hook,
                rules: Vec::new(),
            },
        );
    }
    for rule in raw.rules.iter().filter_map(|m| rule_msg(m)) {
        if let Some(c) = observed.chains.get_mut(rule.chain) {
            c.rules.push(canonical_rule(rule.exprs, rule.userdata));
        }
    }
    for set in raw.sets.iter().filter_map(|m| set_msg(m)) {
        observed.sets.insert(
            set.name.to_string(),
            ObservedSet {
                flags: set.flags,
                key_type: set.key_type,
                key_len: set.key_len,
                timeout_ms: set.timeout_ms,
            },
        );
    }
    for set in [SERVICE_MAP, NODE_PORT_MAP, HAIRPIN_SET, CLUSTER_IP_SET] {
        if observed.sets.contains_key(set) {
            observed.elements.entry(set.to_string()).or_default();
        }
    }
    for (set, list) in raw.elements.iter().filter_map(|m| element_msg(m)) {
        let elements = observed.elements.entry(set.to_string()).or_default();
        for element in list {
            let e = element.nested();
            let Some(key) = e.get(1).and_then(|k| k.nested().get(1)) else {
                continue;
            };
            let target = e
                .get(2)
                .and_then(|d| d.nested().get(2))
                .and_then(|v| v.nested().get(2))
                .and_then(|c| c.str())
                .map(str::to_string);
            elements.insert(key.value.to_vec(), target);
        }
    }
    observed
}

/// A rule in canonical form, from the value of its `NFTA_RULE_EXPRESSIONS` and its userdata.
pub fn canonical_rule(expressions: &[u8], userdata: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for elem in Attrs(expressions) {
        let attrs = elem.nested();
        let name = attrs.get(1).and_then(|a| a.str()).unwrap_or("");
        let data = attrs.get(2).map_or(Attrs(&[]), |a| a.nested());
        canonical_expr(name, data, &mut out);
    }
    out.push(0xff);
    push_field(&mut out, userdata.unwrap_or(&[]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::wire::Writer;

    #[test]
    fn what_the_kernel_adds_to_a_rule_is_not_a_difference() {
        // lookup with flags 0, dynset with timeout 0 and flags 0, counter values, a NAT range's
        // maxima and flags: the kernel's dump of what berth wrote.
        let mut w = Writer::default();
        let expr = |w: &mut Writer, name: &str, data: &dyn Fn(&mut Writer)| {
            let e = w.begin_nest(1);
            w.put_str(1, name);
            let d = w.begin_nest(2);
            data(w);
            w.end_nest(d);
            w.end_nest(e);
        };
        expr(&mut w, "lookup", &|w| {
            w.put_str(1, "s");
            w.put_u32(2, 1);
            w.put_u32(5, 0);
        });
        expr(&mut w, "dynset", &|w| {
            w.put_str(1, "s");
            w.put_u32(3, 1);
            w.put_u32(4, 1);
            w.put_u64(6, 0);
            w.put_u32(9, 0);
        });
        expr(&mut w, "counter", &|w| {
            w.put_u64(1, 1234);
            w.put_u64(2, 5);
        });
        let dumped = canonical_rule(w.bytes(), None);
        let mut w = Writer::default();
        expr(&mut w, "lookup", &|w| {
            w.put_u32(2, 1);
            w.put_str(1, "s");
        });
        expr(&mut w, "dynset", &|w| {
            w.put_u32(4, 1);
            w.put_u32(3, 1);
            w.put_str(1, "s");
        });
        expr(&mut w, "counter", &|_| {});
        assert_eq!(dumped, canonical_rule(w.bytes(), None));
        // A real difference stays one: another set.
        let lookup = |set: &'static str| {
            let mut w = Writer::default();
            expr(&mut w, "lookup", &|w| {
                w.put_u32(2, 1);
                w.put_str(1, set);
            });
            canonical_rule(w.bytes(), None)
        };
        assert_ne!(lookup("s"), lookup("t"));
    }
}

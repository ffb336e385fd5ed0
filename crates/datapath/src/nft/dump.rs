//! berth's table as a netlink dump returns it ([`RawTable`]: the attributes of every chain, rule,
//! set and element message, as the kernel wrote them), and small views of those messages. Both
//! readers of the table start here: adoption compares canonical rules with the plan
//! ([`crate::nft::observed::observe_table`]), `berth explain` decodes the whole table back
//! into berth's typed form ([`crate::nft::decode`]). A [`RawTable`] also travels as bytes
//! ([`RawTable::to_bytes`]), from the agent that dumped it to the `berth explain` that decodes
//! it; attribute headers and host-order numbers are the node's, so both ends must share a byte
//! order (every platform berth is built for is little-endian).

use crate::error::Error;
use crate::nft::wire::{Attr, Attrs};

/// A base chain's hook as the kernel reports it: type, hook number, priority.
pub type ObservedHook = (String, u32, i32);

/// The attributes (after `nfgenmsg`) of each message a dump of berth's table returned.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RawTable {
    pub chains: Vec<Vec<u8>>,
    pub rules: Vec<Vec<u8>>,
    pub sets: Vec<Vec<u8>>,
    /// Element lists of the two maps, the hairpin set and `cluster-ips` (the dynamic affinity
    /// sets' entries are state, not ruleset, and are not read).
    pub elements: Vec<Vec<u8>>,
}

// Attribute numbers from nf_tables.h.
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_COMPAT: u16 = 5;
const NFTA_RULE_USERDATA: u16 = 7;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_DATA_TYPE: u16 = 6;
const NFTA_SET_TIMEOUT: u16 = 11;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;

/// The table a message names (its first attribute, in every object's message).
pub fn table_of(attrs: &[u8]) -> Option<&str> {
    Attrs(attrs).get(1)?.str()
}

/// The table of berth's (`base` or a shard of it) a message names.
pub fn shard_of_message(base: &str, attrs: &[u8]) -> Option<crate::nft::shard::Shard> {
    crate::nft::shard::parse_table_name(base, table_of(attrs)?)
}

/// One chain message: its name, hook (type, number, priority) and policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainMsg<'a> {
    pub name: &'a str,
    pub hook: Option<ObservedHook>,
    pub policy: Option<u32>,
}

pub fn chain_msg(attrs: &[u8]) -> Option<ChainMsg<'_>> {
    let attrs = Attrs(attrs);
    let name = attrs.get(NFTA_CHAIN_NAME)?.str()?;
    let hook = attrs.get(NFTA_CHAIN_HOOK).map(|h| {
        let kind = attrs
            .get(NFTA_CHAIN_TYPE)
            .and_then(|a| a.str())
            .unwrap_or("")
            .to_string();
        let num = h
            .nested()
            .get(NFTA_HOOK_HOOKNUM)
            .and_then(|a| a.u32())
            .unwrap_or(u32::MAX);
        let prio = h
            .nested()
            .get(NFTA_HOOK_PRIORITY)
            .and_then(|a| a.u32())
            .unwrap_or(0) as i32;
        (kind, num, prio)
    });
    let policy = attrs.get(NFTA_CHAIN_POLICY).and_then(|a| a.u32());
    Some(ChainMsg { name, hook, policy })
}

/// One rule message: its chain, expressions (the value of `NFTA_RULE_EXPRESSIONS`), userdata,
/// and whether it carries xtables compatibility data (iptables-nft's rules do; berth's never).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleMsg<'a> {
    pub chain: &'a str,
    pub exprs: &'a [u8],
    pub userdata: Option<&'a [u8]>,
    pub compat: bool,
}

pub fn rule_msg(attrs: &[u8]) -> Option<RuleMsg<'_>> {
    let attrs = Attrs(attrs);
    Some(RuleMsg {
        chain: attrs.get(NFTA_RULE_CHAIN)?.str()?,
        exprs: attrs
            .get(NFTA_RULE_EXPRESSIONS)
            .map_or(&[][..], |a| a.value),
        userdata: attrs.get(NFTA_RULE_USERDATA).map(|a| a.value),
        compat: attrs.get(NFTA_RULE_COMPAT).is_some(),
    })
}

/// One set message: name, flags, key type and length, data type (maps), entries' timeout (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetMsg<'a> {
    pub name: &'a str,
    pub flags: u32,
    pub key_type: u32,
    pub key_len: u32,
    pub data_type: Option<u32>,
    pub timeout_ms: u64,
}

pub fn set_msg(attrs: &[u8]) -> Option<SetMsg<'_>> {
    let attrs = Attrs(attrs);
    let u32_of = |kind| attrs.get(kind).and_then(|a| a.u32());
    Some(SetMsg {
        name: attrs.get(NFTA_SET_NAME)?.str()?,
        flags: u32_of(NFTA_SET_FLAGS).unwrap_or(0),
        key_type: u32_of(NFTA_SET_KEY_TYPE).unwrap_or(0),
        key_len: u32_of(NFTA_SET_KEY_LEN).unwrap_or(0),
        data_type: u32_of(NFTA_SET_DATA_TYPE),
        timeout_ms: attrs
            .get(NFTA_SET_TIMEOUT)
            .and_then(|a| a.u64())
            .unwrap_or(0),
    })
}

/// One element list message: its set and its elements (each a nested `NFTA_LIST_ELEM`).
pub fn element_msg(attrs: &[u8]) -> Option<(&str, Attrs<'_>)> {
    let attrs = Attrs(attrs);
    let set = attrs.get(NFTA_SET_ELEM_LIST_SET)?.str()?;
    let list = attrs
        .get(NFTA_SET_ELEM_LIST_ELEMENTS)
        .map_or(Attrs(&[]), |a: Attr<'_>| a.nested());
    Some((set, list))
}

/// The kinds of message in [`RawTable::to_bytes`].
const KINDS: [u8; 4] = [1, 2, 3, 4];

impl RawTable {
    fn lists(&self) -> [&Vec<Vec<u8>>; 4] {
        [&self.chains, &self.rules, &self.sets, &self.elements]
    }

    /// The table as one buffer: per message its kind (1 chain, 2 rule, 3 set, 4 elements), its
    /// length as a big-endian `u32`, its bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let size: usize = self
            .lists()
            .iter()
            .flat_map(|l| l.iter())
            .map(|m| m.len() + 5)
            .sum();
        let mut out = Vec::with_capacity(size);
        for (kind, list) in KINDS.iter().zip(self.lists()) {
            for message in list {
                out.push(*kind);
                out.extend_from_slice(&(message.len() as u32).to_be_bytes());
                out.extend_from_slice(message);
            }
        }
        out
    }

    /// What a dump would return after the kernel applied `batch` (the bytes of
    /// [`crate::nft::netlink::build_batch`]) to an empty ruleset, for tests without a kernel:
    /// the attributes of each new chain, rule, set and element list, in order. Deletions are
    /// not applied, so only a batch that builds a whole table gives a whole table.
    #[cfg(any(test, feature = "fake"))]
    pub fn of_batch(batch: &[u8]) -> RawTable {
        // NFT_MSG_NEWCHAIN, NEWRULE, NEWSET, NEWSETELEM in the nftables subsystem.
        const SUBSYS: u16 = 10 << 8;
        let mut out = RawTable::default();
        let mut at = 0;
        while let Some(header) = batch.get(at..at + 16) {
            let len = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]) as usize;
            let kind = u16::from_ne_bytes([header[4], header[5]]);
            let Some(body) = batch.get(at + 20..at + len.max(20)) else {
                break;
            };
            let list = match kind.checked_sub(SUBSYS) {
                Some(3) => Some(&mut out.chains),
                Some(6) => Some(&mut out.rules),
                Some(9) => Some(&mut out.sets),
                Some(12) => Some(&mut out.elements),
                _ => None,
            };
            if let Some(list) = list {
                list.push(body.to_vec());
            }
            at += (len.max(20) + 3) & !3;
        }
        out
    }

    /// The inverse of [`RawTable::to_bytes`]; a cut or unknown record is an error.
    pub fn from_bytes(mut bytes: &[u8]) -> Result<RawTable, Error> {
        let bad = |reason: String| Error::Decode {
            object: "the dumped table's framing".to_string(),
            reason,
        };
        let mut out = RawTable::default();
        while let Some((&kind, rest)) = bytes.split_first() {
            let len = rest
                .get(..4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
                .ok_or_else(|| bad("a record is cut short in its length".into()))?;
            let message = rest
                .get(4..4 + len)
                .ok_or_else(|| bad(format!("a record of {len} bytes is cut short")))?;
            let list = match kind {
                1 => &mut out.chains,
                2 => &mut out.rules,
                3 => &mut out.sets,
                4 => &mut out.elements,
                other => return Err(bad(format!("unknown record kind {other}"))),
            };
            list.push(message.to_vec());
            bytes = &rest[4 + len..];
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_travels_as_bytes_and_back() {
        let raw = RawTable {
            chains: vec![vec![1, 2, 3, 4], vec![]],
            rules: vec![vec![9; 300]],
            sets: vec![],
            elements: vec![vec![7, 7]],
        };
        let bytes = raw.to_bytes();
        assert_eq!(RawTable::from_bytes(&bytes).unwrap(), raw);
        assert_eq!(RawTable::from_bytes(&[]).unwrap(), RawTable::default());
        for cut in 1..bytes.len() {
            // Every cut that ends inside a record is refused; a cut between records is a
            // shorter table, which only the decoder can judge.
            let at_boundary = [5 + 4, 5 + 4 + 5, 5 + 4 + 5 + 305].contains(&cut);
            assert_eq!(
                RawTable::from_bytes(&bytes[..cut]).is_ok(),
                at_boundary,
                "cut at {cut}"
            );
        }
        let err = RawTable::from_bytes(&[9, 0, 0, 0, 0]).unwrap_err();
        assert!(err.to_string().contains("unknown record kind 9"), "{err}");
    }
}

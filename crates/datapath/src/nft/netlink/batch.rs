//! A transaction as one nfnetlink batch, and the kernel's answers to it: pure encoding and
//! decoding, no socket. Apart from the socket so that the bytes can be built, inspected and
//! tested without a kernel (and, in a staged load, built while the socket sends the last batch).

use crate::nft::expr::{
    element_key, nfproto, put_verdict, rule_userdata, write_rule_exprs, NFTA_DATA_VALUE, NFT_JUMP,
};
use crate::nft::inline::HAIRPIN_SET;
use crate::nft::render::{
    command_text, Command, Element, NftChain, Transaction, CLUSTER_IP_SET, NODE_PORT_MAP,
    SERVICE_MAP,
};
use crate::nft::shard::{table_name, Shard, MAIN};
use crate::nft::transaction::element_set;
use crate::nft::wire::{
    Mark, Writer, NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, NFNL_SUBSYS_NFTABLES, NFT_DATA_VERDICT,
    NFT_SET_EVAL, NFT_SET_MAP, NFT_SET_TIMEOUT, NF_ACCEPT, NLMSG_HDRLEN, NLM_F_ACK, NLM_F_APPEND,
    NLM_F_CREATE, NLM_F_REQUEST, TYPE_INET_PROTO, TYPE_INET_SERVICE, TYPE_IPV4_ADDR,
    TYPE_IPV6_ADDR,
};
use berth_core::IpFamily;

// nf_tables message types (`NFT_MSG_*`), in the nftables subsystem.
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_DELSET: u16 = 11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;

pub(super) const NLMSG_ERROR: u16 = 2;

/// The largest element list one message carries: an attribute's length is a `u16`.
const ELEMENTS_PER_MESSAGE_BYTES: usize = 60_000;

pub(super) fn msg_type(kind: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | kind
}
/// One batch ready to send, and what each of its messages does, for errors.
#[derive(Debug, Clone)]
pub struct Batch {
    pub bytes: Vec<u8>,
    /// The sequence number of the batch's begin message; its messages follow it.
    pub first_seq: u32,
    /// The sequence number of the last message before the end (the one acknowledged).
    pub last_seq: u32,
    /// (first sequence number, index of the command it came from), ascending.
    commands: Vec<(u32, usize)>,
    /// How many messages carry commands.
    pub messages: usize,
}

impl Batch {
    /// The index of the command whose message had sequence number `seq`.
    pub fn command_of(&self, seq: u32) -> Option<usize> {
        let at = self.commands.partition_point(|(s, _)| *s <= seq);
        at.checked_sub(1).map(|i| self.commands[i].1)
    }
}

/// Set userdata as `nft` writes it (`NFTNL_UDATA_SET_*` type-length-value entries): the key's
/// byte order and, for concatenations, nft's description of the key expression. The kernel keeps
/// it opaque; `nft list` reads it to print keys as it printed them.
fn set_userdata(concat: bool, map: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut tlv = |kind: u8, value: &[u8]| {
        out.push(kind);
        out.push(value.len() as u8);
        out.extend_from_slice(value);
    };
    // Key byte order: big-endian for a plain address, none for a concatenation.
    let key_order: u32 = if concat { 0 } else { 2 };
    tlv(0, &key_order.to_ne_bytes());
    if map {
        tlv(1, &0u32.to_ne_bytes());
    }
    if concat {
        // The key expression: a concatenation (nft's expression type 13), fields unnamed.
        let mut typeof_key = vec![0u8, 4];
        typeof_key.extend_from_slice(&13u32.to_ne_bytes());
        typeof_key.extend_from_slice(&[1, 0]);
        tlv(3, &typeof_key);
    }
    if map {
        tlv(6, &0u32.to_ne_bytes());
    }
    out
}

fn addr_type(family: IpFamily) -> (u32, u32) {
    match family {
        IpFamily::V4 => (TYPE_IPV4_ADDR, 4),
        IpFamily::V6 => (TYPE_IPV6_ADDR, 16),
    }
}

/// One set or map declaration: key type and length, whether it maps to verdicts, its
/// entries' timeout, whether its key is a concatenation.
struct SetSpec<'a> {
    name: &'a str,
    flags: u32,
    key: (u32, u32),
    map: bool,
    timeout_ms: Option<u64>,
    concat: bool,
}

/// Builds nfnetlink batches for berth's table in one family.
struct Builder<'a> {
    w: Writer,
    family: IpFamily,
    /// The main table's name; a shard's is `<table>-<n>`.
    table: &'a str,
    /// The table of the command being written, and its name.
    current_shard: Shard,
    current: String,
    seq: u32,
    commands: Vec<(u32, usize)>,
    messages: usize,
    set_ids: u32,
}

impl Builder<'_> {
    fn begin(&mut self, kind: u16, flags: u16, command: usize) -> Mark {
        self.seq = self.seq.wrapping_add(1);
        if self.commands.last().map(|(_, c)| *c) != Some(command) {
            self.commands.push((self.seq, command));
        }
        self.messages += 1;
        self.w.begin_message(
            msg_type(kind),
            NLM_F_REQUEST | flags,
            self.seq,
            nfproto(self.family),
            0,
        )
    }

    fn table_message(&mut self, kind: u16, flags: u16, command: usize) {
        let m = self.begin(kind, flags, command);
        self.w.put_str(1, &self.current);
        if kind == NFT_MSG_NEWTABLE {
            self.w.put_u32(2, 0);
        }
        self.w.end_message(m);
    }

    fn set(&mut self, spec: SetSpec<'_>, command: usize) {
        let SetSpec {
            name,
            flags,
            key,
            map,
            timeout_ms,
            concat,
        } = spec;
        let m = self.begin(NFT_MSG_NEWSET, NLM_F_CREATE, command);
        self.w.put_str(1, &self.current);
        self.w.put_str(2, name);
        self.w.put_u32(3, flags);
        self.w.put_u32(4, key.0);
        self.w.put_u32(5, key.1);
        if map {
            self.w.put_u32(6, NFT_DATA_VERDICT);
            self.w.put_u32(7, 0);
        }
        // The kernel requires an id, by which later messages of the batch may name the set.
        self.set_ids += 1;
        self.w.put_u32(10, self.set_ids);
        if let Some(ms) = timeout_ms {
            self.w.put_u64(11, ms);
        }
        self.w.put(13, &set_userdata(concat, map));
        self.w.end_message(m);
    }

    fn maps(&mut self, hairpin: bool, command: usize) {
        let (addr, addr_len) = addr_type(self.family);
        let concat_map = |name, key| SetSpec {
            name,
            flags: NFT_SET_MAP,
            key,
            map: true,
            timeout_ms: None,
            concat: true,
        };
        let service_type = (addr << 12) | (TYPE_INET_PROTO << 6) | TYPE_INET_SERVICE;
        let node_port_type = (TYPE_INET_PROTO << 6) | TYPE_INET_SERVICE;
        self.set(
            concat_map(SERVICE_MAP, (service_type, addr_len + 8)),
            command,
        );
        self.set(concat_map(NODE_PORT_MAP, (node_port_type, 8)), command);
        if !hairpin {
            return;
        }
        let hairpin = SetSpec {
            name: HAIRPIN_SET,
            flags: 0,
            key: ((addr << 6) | addr, addr_len * 2),
            map: false,
            timeout_ms: None,
            concat: true,
        };
        self.set(hairpin, command);
        let cluster_ips = SetSpec {
            name: CLUSTER_IP_SET,
            flags: 0,
            key: (addr, addr_len),
            map: false,
            timeout_ms: None,
            concat: false,
        };
        self.set(cluster_ips, command);
    }

    /// Writes the next messages into the table of `shard`.
    fn enter(&mut self, shard: Shard) {
        // Named only when the table changes: a cold load's 130,000 commands come table by table.
        if self.current_shard != shard {
            self.current_shard = shard;
            self.current = table_name(self.table, shard);
        }
    }

    fn command(&mut self, index: usize, command: &Command) {
        self.enter(command.shard());
        match command {
            Command::AddTable(_) => self.table_message(NFT_MSG_NEWTABLE, NLM_F_CREATE, index),
            Command::DeleteTable(_) => self.table_message(NFT_MSG_DELTABLE, 0, index),
            Command::AddMaps(shard) => self.maps(*shard == MAIN, index),
            Command::AddChain(chain, hook) => {
                let m = self.begin(NFT_MSG_NEWCHAIN, NLM_F_CREATE, index);
                self.w.put_str(1, &self.current);
                self.w.put_str(3, &chain.to_string());
                if let Some(hook) = hook {
                    self.w.put_str(7, hook.kind());
                    self.w.put_u32(5, NF_ACCEPT);
                    let h = self.w.begin_nest(4);
                    self.w.put_u32(1, hook.number());
                    self.w.put_u32(2, hook.priority_number() as u32);
                    self.w.end_nest(h);
                }
                self.w.end_message(m);
            }
            Command::FlushChain(chain) => {
                let m = self.begin(NFT_MSG_DELRULE, 0, index);
                self.w.put_str(1, &self.current);
                self.w.put_str(2, &chain.to_string());
                self.w.end_message(m);
            }
            Command::DeleteChain(chain) => {
                let m = self.begin(NFT_MSG_DELCHAIN, 0, index);
                self.w.put_str(1, &self.current);
                self.w.put_str(3, &chain.to_string());
                self.w.end_message(m);
            }
            Command::AddRule(chain, rule) => {
                let m = self.begin(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, index);
                self.w.put_str(1, &self.current);
                self.w.put_str(2, &chain.to_string());
                let exprs = self.w.begin_nest(4);
                write_rule_exprs(&mut self.w, self.family, chain.table, rule);
                self.w.end_nest(exprs);
                if let Some(userdata) = rule_userdata(rule) {
                    self.w.put(7, &userdata);
                }
                self.w.end_message(m);
            }
            Command::AddAffinitySet(_, name, seconds) => {
                let (addr, len) = addr_type(self.family);
                let spec = SetSpec {
                    name: name.as_str(),
                    flags: NFT_SET_TIMEOUT | NFT_SET_EVAL,
                    key: (addr, len),
                    map: false,
                    timeout_ms: Some(u64::from(*seconds) * 1000),
                    concat: false,
                };
                self.set(spec, index);
            }
            Command::DeleteAffinitySet(_, name) => {
                let m = self.begin(NFT_MSG_DELSET, 0, index);
                self.w.put_str(1, &self.current);
                self.w.put_str(2, name.as_str());
                self.w.end_message(m);
            }
            Command::AddElement(_) | Command::DeleteElement(_) => {
                // Written in runs by `elements`.
            }
        }
    }

    /// A run of element commands for one set, as few messages as the attribute size allows.
    fn elements(&mut self, first: usize, run: &[Command]) {
        let Some((add, set, shard)) =
            element_of(&run[0]).map(|(add, e)| (add, element_set(e), e.shard()))
        else {
            return;
        };
        self.enter(shard);
        let kind = if add {
            NFT_MSG_NEWSETELEM
        } else {
            NFT_MSG_DELSETELEM
        };
        let flags = if add { NLM_F_CREATE } else { 0 };
        let mut open: Option<(Mark, Mark, u16)> = None;
        for (i, command) in run.iter().enumerate() {
            let Some((_, element)) = element_of(command) else {
                continue;
            };
            let (m, list, n) = match open.take() {
                Some(open) => open,
                None => {
                    let m = self.begin(kind, flags, first + i);
                    self.w.put_str(1, &self.current);
                    self.w.put_str(2, set);
                    let list = self.w.begin_nest(3);
                    (m, list, 0)
                }
            };
            let n = n + 1;
            let e = self.w.begin_nest(n);
            let key = self.w.begin_nest(1);
            self.w.put(NFTA_DATA_VALUE, &element_key(element));
            self.w.end_nest(key);
            if let (true, Some(target)) = (add, element_target(element)) {
                let data = self.w.begin_nest(2);
                put_verdict(&mut self.w, NFT_JUMP, Some(&target.to_string()));
                self.w.end_nest(data);
            }
            self.w.end_nest(e);
            if self.w.since(list) > ELEMENTS_PER_MESSAGE_BYTES {
                self.w.end_nest(list);
                self.w.end_message(m);
            } else {
                open = Some((m, list, n));
            }
        }
        if let Some((m, list, _)) = open {
            self.w.end_nest(list);
            self.w.end_message(m);
        }
    }
}

fn element_of(command: &Command) -> Option<(bool, &Element)> {
    match command {
        Command::AddElement(e) => Some((true, e)),
        Command::DeleteElement(e) => Some((false, e)),
        _ => None,
    }
}

fn element_target(element: &Element) -> Option<&NftChain> {
    match element {
        Element::Service(_, target) | Element::NodePort(_, target) => Some(target),
        Element::Hairpin(_) | Element::ClusterIp(_) => None,
    }
}

/// The batch that applies `tx` to the table `table` of its family; its sequence numbers start
/// after `seq`.
pub fn build_batch(tx: &Transaction, table: &str, seq: u32) -> Batch {
    let mut b = Builder {
        w: Writer::with_capacity(4096 + tx.commands.len() * 160),
        family: tx.family,
        table,
        current_shard: MAIN,
        current: table.to_string(),
        seq,
        commands: Vec::new(),
        messages: 0,
        set_ids: 0,
    };
    b.seq = b.seq.wrapping_add(1);
    let first_seq = b.seq;
    let begin = b.w.begin_message(
        NFNL_MSG_BATCH_BEGIN,
        NLM_F_REQUEST,
        first_seq,
        0,
        NFNL_SUBSYS_NFTABLES,
    );
    b.w.end_message(begin);
    let mut rest = tx.commands.as_slice();
    let mut index = 0;
    while let Some(first) = rest.first() {
        let run = match element_of(first) {
            Some((add, e)) => {
                let (set, shard) = (element_set(e), e.shard());
                rest.iter()
                    .take_while(|c| {
                        element_of(c).is_some_and(|(a, e)| {
                            a == add && element_set(e) == set && e.shard() == shard
                        })
                    })
                    .count()
            }
            None => 1,
        };
        if element_of(first).is_some() {
            b.elements(index, &rest[..run]);
        } else {
            b.command(index, first);
        }
        index += run;
        rest = &rest[run..];
    }
    let last_seq = b.seq;
    mark_last_acked(&mut b.w, first_seq, last_seq);
    b.seq = b.seq.wrapping_add(1);
    let end = b.w.begin_message(
        NFNL_MSG_BATCH_END,
        NLM_F_REQUEST,
        b.seq,
        0,
        NFNL_SUBSYS_NFTABLES,
    );
    b.w.end_message(end);
    Batch {
        bytes: b.w.into_bytes(),
        first_seq,
        last_seq,
        commands: b.commands,
        messages: b.messages,
    }
}

/// Sets `NLM_F_ACK` on the message with sequence number `last` (the last of the batch).
fn mark_last_acked(w: &mut Writer, first: u32, last: u32) {
    if first == last {
        return;
    }
    // Walk the messages: the last is found from the start, as lengths only point forward.
    let bytes = w.bytes();
    let mut at = 0;
    let mut target = None;
    while at + NLMSG_HDRLEN <= bytes.len() {
        let len =
            u32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize;
        let seq =
            u32::from_ne_bytes([bytes[at + 8], bytes[at + 9], bytes[at + 10], bytes[at + 11]]);
        if seq == last {
            target = Some(at);
        }
        if len < NLMSG_HDRLEN {
            break;
        }
        at += len;
    }
    if let Some(at) = target {
        w.or_flags(at, NLM_F_ACK);
    }
}

/// What the kernel answered one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub seq: u32,
    /// 0 for an acknowledgement, a negative errno for a refusal.
    pub error: i32,
    /// The kernel's own words (extended ack), when it gave any.
    pub message: Option<String>,
}

/// The replies in a buffer of netlink messages (only errors and acknowledgements matter).
pub fn parse_replies(bytes: &[u8]) -> Vec<Reply> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + NLMSG_HDRLEN <= bytes.len() {
        let u32_at =
            |i: usize| u32::from_ne_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let len = u32_at(at) as usize;
        let kind = u16::from_ne_bytes([bytes[at + 4], bytes[at + 5]]);
        if len < NLMSG_HDRLEN || at + len > bytes.len() {
            break;
        }
        // nlmsgerr: error (i32), then the header of the message it answers.
        if kind == NLMSG_ERROR && len >= NLMSG_HDRLEN + 4 + NLMSG_HDRLEN {
            let error = u32_at(at + NLMSG_HDRLEN) as i32;
            let orig = at + NLMSG_HDRLEN + 4;
            let seq = u32_at(orig + 8);
            let orig_len = u32_at(orig) as usize;
            let flags = u16::from_ne_bytes([bytes[at + 6], bytes[at + 7]]);
            // NLM_F_CAPPED (0x100): only the header was echoed; NLM_F_ACK_TLVS (0x200): the
            // extended ack's attributes follow.
            let echoed = if flags & 0x100 != 0 {
                NLMSG_HDRLEN
            } else {
                orig_len.max(NLMSG_HDRLEN)
            };
            let tlvs = orig + ((echoed + 3) & !3);
            let message = if flags & 0x200 != 0 && tlvs < at + len {
                crate::nft::wire::Attrs(&bytes[tlvs..at + len])
                    .get(1)
                    .and_then(|a| a.str().map(str::to_string))
            } else {
                None
            };
            out.push(Reply {
                seq,
                error,
                message,
            });
        }
        at += (len + 3) & !3;
    }
    out
}
/// The object of the message with sequence number `seq`, in `nft` words.
pub(super) fn describe(tx: &Transaction, batch: &Batch, seq: u32) -> String {
    if seq == batch.first_seq {
        return "the batch".to_string();
    }
    match batch.command_of(seq).and_then(|i| tx.commands.get(i)) {
        Some(command) => command_text(tx.family, command).trim_end().to_string(),
        None => format!("message {seq}"),
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    use crate::nft::netlink::{probe_transaction, PROBE_TABLE};
    use crate::nft::render::TABLE;

    #[test]
    fn the_batch_is_framed_and_only_the_last_message_asks_for_an_ack() {
        let tx = probe_transaction();
        let batch = build_batch(&tx, PROBE_TABLE, 100);
        let mut at = 0;
        let mut seen = Vec::new();
        while at < batch.bytes.len() {
            let b = &batch.bytes[at..];
            let len = u32::from_ne_bytes(b[0..4].try_into().unwrap()) as usize;
            let kind = u16::from_ne_bytes(b[4..6].try_into().unwrap());
            let flags = u16::from_ne_bytes(b[6..8].try_into().unwrap());
            let seq = u32::from_ne_bytes(b[8..12].try_into().unwrap());
            seen.push((kind, flags & NLM_F_ACK != 0, seq));
            at += len;
        }
        assert_eq!(at, batch.bytes.len());
        assert_eq!(seen.first().unwrap().0, NFNL_MSG_BATCH_BEGIN);
        assert_eq!(seen.last().unwrap().0, NFNL_MSG_BATCH_END);
        let acked: Vec<u32> = seen.iter().filter(|s| s.1).map(|s| s.2).collect();
        assert_eq!(acked, vec![batch.last_seq]);
        assert_eq!(batch.first_seq, 101);
        // begin, table, four sets, four chains, one set, seven rules, three elements, delete,
        // end
        assert_eq!(seen.len(), 2 + batch.messages);
        assert_eq!(batch.messages, 21);
        let seqs: Vec<u32> = seen.iter().map(|s| s.2).collect();
        assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1));
    }

    #[test]
    fn errors_name_the_command_of_their_message() {
        let tx = probe_transaction();
        let batch = build_batch(&tx, PROBE_TABLE, 0);
        // Message 1 is the table, 2..=5 the maps and sets (one command), 6 the first chain.
        assert_eq!(batch.command_of(batch.first_seq + 1), Some(0));
        assert_eq!(batch.command_of(batch.first_seq + 5), Some(1));
        assert_eq!(batch.command_of(batch.first_seq + 6), Some(2));
        assert!(describe(&tx, &batch, batch.first_seq + 6)
            .starts_with("add chain ip berth nat-PREROUTING"));
    }

    #[test]
    fn many_elements_split_into_messages_the_kernel_can_parse() {
        let mut tx = Transaction::new(IpFamily::V6);
        for i in 0..5000u32 {
            let addr = IpAddr::from(std::net::Ipv6Addr::from(0xfd00_u128 << 112 | u128::from(i)));
            tx.push(Command::AddElement(Element::Hairpin(addr)));
        }
        let batch = build_batch(&tx, TABLE, 0);
        assert!(batch.messages > 1, "{}", batch.messages);
        let mut at = 0;
        while at < batch.bytes.len() {
            let len = u32::from_ne_bytes(batch.bytes[at..at + 4].try_into().unwrap()) as usize;
            assert!(len < 65_536 + 64);
            at += len;
        }
    }

    #[test]
    fn replies_are_read_with_their_sequence_and_the_kernels_words() {
        // An error (EEXIST) capped to the header, with an extended-ack message.
        let mut w = Writer::default();
        let m = w.begin_message(NLMSG_ERROR, 0x100 | 0x200, 7, 0, 0);
        w.truncate_to_header(m);
        w.extend(&(-17i32).to_ne_bytes());
        let mut orig = Writer::default();
        let o = orig.begin_message(msg_type(NFT_MSG_NEWRULE), NLM_F_REQUEST, 42, 2, 0);
        orig.end_message(o);
        w.extend(&orig.bytes()[..NLMSG_HDRLEN]);
        w.put_str(1, "Could not process rule");
        w.end_message(m);
        let replies = parse_replies(w.bytes());
        assert_eq!(
            replies,
            vec![Reply {
                seq: 42,
                error: -17,
                message: Some("Could not process rule".to_string())
            }]
        );
    }
}

//! A rule of berth's table as nftables expressions on the wire: what `nft` (1.0.6 and later)
//! generates from the rule's text (see [`crate::nft::render::rule_text`]), expression for
//! expression, so a rule written here reads back exactly like one `nft -f` loaded.
//!
//! Layouts follow the kernel's `linux/netfilter/nf_tables.h`. Registers: a value loaded for a
//! comparison goes to register 1; the fields of a concatenated key (a map or set lookup) go to
//! consecutive 32-bit registers, each field rounded up to 4 bytes, numbered as `nft` numbers
//! them (a field that starts on a 16-byte boundary by its 128-bit register, `NFT_REG_1 + n`,
//! others as `NFT_REG32_00 + n`). Numbers in packet headers are big-endian; meta, ct and fib
//! results, marks and `numgen` values are host-order `u32`s.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::nft::inline::HAIRPIN_SET;
use crate::nft::render::{
    comment_text, Element, NftChain, NftRule, CLUSTER_IP_COMMENT, CLUSTER_IP_SET, NODE_PORT_MAP,
    SERVICE_MAP,
};
use crate::nft::wire::Writer;
use crate::plan::model::{
    AddrSide, CtState, MarkOp, Match, PortMatch, RecentAction, Rule, Table, Target,
};
use berth_core::{IpFamily, Protocol};

// Attribute numbers from nf_tables.h.
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
pub(crate) const NFTA_DATA_VALUE: u16 = 1;
pub(crate) const NFTA_DATA_VERDICT: u16 = 2;
pub(crate) const NFTA_VERDICT_CODE: u16 = 1;
pub(crate) const NFTA_VERDICT_CHAIN: u16 = 2;

/// Verdict codes (`NF_DROP`, `NF_ACCEPT`, `NFT_JUMP`, `NFT_RETURN`).
pub(crate) const NF_DROP: u32 = 0;
pub(crate) const NF_ACCEPT: u32 = 1;
pub(crate) const NFT_JUMP: u32 = -3i32 as u32;
pub(crate) const NFT_RETURN: u32 = -5i32 as u32;

pub(crate) const NFT_REG_VERDICT: u32 = 0;
pub(crate) const NFT_REG_1: u32 = 1;
const NFT_REG32_00: u32 = 8;

pub(crate) const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
pub(crate) const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;

pub(crate) const NFT_META_MARK: u32 = 3;
pub(crate) const NFT_META_L4PROTO: u32 = 16;
pub(crate) const NFT_CT_STATE: u32 = 0;
pub(crate) const NFT_CT_STATUS: u32 = 2;
/// `IPS_DST_NAT`: the connection's destination was translated.
pub(crate) const IPS_DST_NAT: u32 = 1 << 5;

pub(crate) const NFT_CMP_EQ: u32 = 0;
pub(crate) const NFT_CMP_NEQ: u32 = 1;
pub(crate) const NFT_CMP_LTE: u32 = 3;
pub(crate) const NFT_CMP_GTE: u32 = 5;

pub(crate) const NFT_NG_RANDOM: u32 = 1;
pub(crate) const NFT_DYNSET_OP_UPDATE: u32 = 1;
pub(crate) const NFT_NAT_DNAT: u32 = 1;
pub(crate) const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 1 << 1;
pub(crate) const NF_NAT_RANGE_PROTO_RANDOM_FULLY: u32 = 1 << 4;
pub(crate) const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;
pub(crate) const NFTA_FIB_F_SADDR: u32 = 1;
pub(crate) const NFTA_FIB_F_DADDR: u32 = 2;
pub(crate) const RTN_LOCAL: u32 = 2;
pub(crate) const NFT_REJECT_ICMP_UNREACH: u32 = 0;
pub(crate) const ICMP_PORT_UNREACH: u8 = 3;
pub(crate) const ICMPV6_PORT_UNREACH: u8 = 4;

/// `NFPROTO_IPV4` / `NFPROTO_IPV6`: the family of a table and of a NAT expression.
pub fn nfproto(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => 2,
        IpFamily::V6 => 10,
    }
}

/// The kernel's number of a register `slot` 32-bit words into the register file, as `nft`
/// writes it.
pub(crate) fn register(slot: u32) -> u32 {
    if slot.is_multiple_of(4) {
        NFT_REG_1 + slot / 4
    } else {
        NFT_REG32_00 + slot
    }
}

/// The number `nft` gives a protocol (`meta l4proto`).
pub fn protocol_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

pub fn addr_bytes(addr: IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// A key as the kernel holds it: each field of a concatenation padded to 4 bytes.
pub fn element_key(element: &Element) -> Vec<u8> {
    let proto_port = |proto, port: u16| {
        let mut out = vec![protocol_number(proto), 0, 0, 0];
        out.extend_from_slice(&port.to_be_bytes());
        out.extend_from_slice(&[0, 0]);
        out
    };
    match element {
        Element::Service((addr, proto, port), _) => {
            let mut out = addr_bytes(*addr);
            out.extend(proto_port(*proto, *port));
            out
        }
        Element::NodePort((proto, port), _) => proto_port(*proto, *port),
        Element::Hairpin(addr) => {
            let mut out = addr_bytes(*addr);
            out.extend(addr_bytes(*addr));
            out
        }
        Element::ClusterIp(addr) => addr_bytes(*addr),
    }
}

/// Where the source or destination address sits in the network header, and its length.
pub(crate) fn addr_field(family: IpFamily, side: AddrSide) -> (u32, u32) {
    match (family, side) {
        (IpFamily::V4, AddrSide::Src) => (12, 4),
        (IpFamily::V4, AddrSide::Dst) => (16, 4),
        (IpFamily::V6, AddrSide::Src) => (8, 16),
        (IpFamily::V6, AddrSide::Dst) => (24, 16),
    }
}

fn family_of(net: &IpNet) -> IpFamily {
    match net {
        IpNet::V4(_) => IpFamily::V4,
        IpNet::V6(_) => IpFamily::V6,
    }
}

/// Writes the expressions of one rule (the value of `NFTA_RULE_EXPRESSIONS`).
struct Exprs<'w> {
    w: &'w mut Writer,
}

impl Exprs<'_> {
    fn expr(&mut self, name: &str, data: impl FnOnce(&mut Writer)) {
        let elem = self.w.begin_nest(NFTA_LIST_ELEM);
        self.w.put_str(NFTA_EXPR_NAME, name);
        let nest = self.w.begin_nest(NFTA_EXPR_DATA);
        data(self.w);
        self.w.end_nest(nest);
        self.w.end_nest(elem);
    }

    fn payload(&mut self, dreg: u32, base: u32, offset: u32, len: u32) {
        self.expr("payload", |w| {
            w.put_u32(1, dreg);
            w.put_u32(2, base);
            w.put_u32(3, offset);
            w.put_u32(4, len);
        });
    }

    fn meta_load(&mut self, key: u32, dreg: u32) {
        self.expr("meta", |w| {
            w.put_u32(2, key);
            w.put_u32(1, dreg);
        });
    }

    fn cmp(&mut self, op: u32, value: &[u8]) {
        self.expr("cmp", |w| {
            w.put_u32(1, NFT_REG_1);
            w.put_u32(2, op);
            let data = w.begin_nest(3);
            w.put(NFTA_DATA_VALUE, value);
            w.end_nest(data);
        });
    }

    /// `reg 1 = (reg 1 & mask) ^ xor`; `with_op` adds `NFTA_BITWISE_OP` (boolean), as `nft`
    /// does for statements.
    fn bitwise(&mut self, mask: &[u8], xor: &[u8], with_op: bool) {
        self.expr("bitwise", |w| {
            w.put_u32(1, NFT_REG_1);
            w.put_u32(2, NFT_REG_1);
            if with_op {
                w.put_u32(6, 0);
            }
            w.put_u32(3, mask.len() as u32);
            let m = w.begin_nest(4);
            w.put(NFTA_DATA_VALUE, mask);
            w.end_nest(m);
            let x = w.begin_nest(5);
            w.put(NFTA_DATA_VALUE, xor);
            w.end_nest(x);
        });
    }

    fn immediate_value(&mut self, dreg: u32, value: &[u8]) {
        self.expr("immediate", |w| {
            w.put_u32(1, dreg);
            let data = w.begin_nest(2);
            w.put(NFTA_DATA_VALUE, value);
            w.end_nest(data);
        });
    }

    fn verdict(&mut self, code: u32, chain: Option<&str>) {
        self.expr("immediate", |w| {
            w.put_u32(1, NFT_REG_VERDICT);
            let data = w.begin_nest(2);
            put_verdict(w, code, chain);
            w.end_nest(data);
        });
    }

    fn lookup(&mut self, set: &str, map: bool) {
        self.expr("lookup", |w| {
            w.put_u32(2, NFT_REG_1);
            if map {
                w.put_u32(3, NFT_REG_VERDICT);
            }
            w.put_str(1, set);
        });
    }

    fn addr_load(&mut self, family: IpFamily, side: AddrSide, slot: u32) {
        let (offset, len) = addr_field(family, side);
        self.payload(register(slot), NFT_PAYLOAD_NETWORK_HEADER, offset, len);
    }

    fn addr_match(&mut self, side: AddrSide, net: &IpNet, negated: bool) {
        let family = family_of(net);
        let (offset, len) = addr_field(family, side);
        let addr = addr_bytes(net.trunc().addr());
        let prefix = u32::from(net.prefix_len());
        let op = if negated { NFT_CMP_NEQ } else { NFT_CMP_EQ };
        if prefix == len * 8 {
            self.payload(NFT_REG_1, NFT_PAYLOAD_NETWORK_HEADER, offset, len);
            self.cmp(op, &addr);
        } else if prefix % 8 == 0 && prefix > 0 {
            let bytes = prefix / 8;
            self.payload(NFT_REG_1, NFT_PAYLOAD_NETWORK_HEADER, offset, bytes);
            self.cmp(op, &addr[..bytes as usize]);
        } else {
            self.payload(NFT_REG_1, NFT_PAYLOAD_NETWORK_HEADER, offset, len);
            let mask = addr_bytes(net.netmask());
            self.bitwise(&mask, &vec![0; mask.len()], false);
            self.cmp(op, &addr);
        }
    }

    fn port_load(&mut self, dreg: u32) {
        self.payload(dreg, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2);
    }

    fn protocol_load(&mut self, dreg: u32) {
        self.meta_load(NFT_META_L4PROTO, dreg);
    }

    fn match_one(&mut self, family: IpFamily, m: &Match) {
        match m {
            Match::Comment(_) | Match::PhysDevIsIn { .. } => {}
            Match::Source { net, negated } => self.addr_match(AddrSide::Src, net, *negated),
            Match::Destination { net, negated } => self.addr_match(AddrSide::Dst, net, *negated),
            Match::Protocol(p) => {
                self.protocol_load(NFT_REG_1);
                self.cmp(NFT_CMP_EQ, &[protocol_number(*p)]);
            }
            Match::DestPort(PortMatch::Single(port)) => {
                self.port_load(NFT_REG_1);
                self.cmp(NFT_CMP_EQ, &port.to_be_bytes());
            }
            Match::DestPort(PortMatch::Range(lo, hi)) => {
                self.port_load(NFT_REG_1);
                self.cmp(NFT_CMP_GTE, &lo.to_be_bytes());
                self.cmp(NFT_CMP_LTE, &hi.to_be_bytes());
            }
            Match::Mark {
                value,
                mask,
                negated,
            } => {
                self.meta_load(NFT_META_MARK, NFT_REG_1);
                self.bitwise(&mask.to_ne_bytes(), &[0; 4], *mask == u32::MAX);
                let op = if *negated { NFT_CMP_NEQ } else { NFT_CMP_EQ };
                self.cmp(op, &value.to_ne_bytes());
            }
            Match::Random { one_in } => {
                self.expr("numgen", |w| {
                    w.put_u32(1, NFT_REG_1);
                    w.put_u32(2, (*one_in).max(1));
                    w.put_u32(3, NFT_NG_RANDOM);
                    w.put_u32(4, 0);
                });
                self.cmp(NFT_CMP_EQ, &0u32.to_ne_bytes());
            }
            Match::Recent { name, action } => {
                self.addr_load(family, AddrSide::Src, 0);
                match action {
                    RecentAction::Set => self.expr("dynset", |w| {
                        w.put_u32(4, NFT_REG_1);
                        w.put_u32(3, NFT_DYNSET_OP_UPDATE);
                        w.put_str(1, name.as_str());
                    }),
                    RecentAction::Rcheck { .. } => self.lookup(name.as_str(), false),
                }
            }
            Match::AddrTypeLocal { side, negated } => {
                let flag = match side {
                    AddrSide::Src => NFTA_FIB_F_SADDR,
                    AddrSide::Dst => NFTA_FIB_F_DADDR,
                };
                self.expr("fib", |w| {
                    w.put_u32(3, flag);
                    w.put_u32(2, NFT_FIB_RESULT_ADDRTYPE);
                    w.put_u32(1, NFT_REG_1);
                });
                let op = if *negated { NFT_CMP_NEQ } else { NFT_CMP_EQ };
                self.cmp(op, &RTN_LOCAL.to_ne_bytes());
            }
            Match::Conntrack { states } => {
                let bits = states.iter().fold(0u32, |bits, s| bits | ct_state_bit(*s));
                self.ct_load(NFT_CT_STATE);
                self.bitwise(&bits.to_ne_bytes(), &[0; 4], false);
                self.cmp(NFT_CMP_NEQ, &[0; 4]);
            }
        }
    }

    fn ct_load(&mut self, key: u32) {
        self.expr("ct", |w| {
            w.put_u32(2, key);
            w.put_u32(1, NFT_REG_1);
        });
    }

    fn target(&mut self, family: IpFamily, table: Table, target: Option<&Target>) {
        let Some(target) = target else {
            self.expr("counter", |_| {});
            return;
        };
        match target {
            Target::Jump(chain) => {
                let name = NftChain::new(table, chain).to_string();
                self.verdict(NFT_JUMP, Some(&name));
            }
            Target::Dnat(to) => self.dnat(to),
            Target::Masquerade { random_fully } => self.expr("masq", |w| {
                if *random_fully {
                    w.put_u32(1, NF_NAT_RANGE_PROTO_RANDOM_FULLY);
                }
            }),
            Target::Mark { op, value } => {
                let (mask, xor) = match op {
                    MarkOp::Or => (!value, *value),
                    MarkOp::Xor => (u32::MAX, *value),
                };
                self.meta_load(NFT_META_MARK, NFT_REG_1);
                self.bitwise(&mask.to_ne_bytes(), &xor.to_ne_bytes(), true);
                self.expr("meta", |w| {
                    w.put_u32(2, NFT_META_MARK);
                    w.put_u32(3, NFT_REG_1);
                });
            }
            Target::Reject => {
                let code = match family {
                    IpFamily::V4 => ICMP_PORT_UNREACH,
                    IpFamily::V6 => ICMPV6_PORT_UNREACH,
                };
                self.expr("reject", |w| {
                    w.put_u32(1, NFT_REJECT_ICMP_UNREACH);
                    w.put(2, &[code]);
                });
            }
            Target::Drop => self.verdict(NF_DROP, None),
            Target::Return => self.verdict(NFT_RETURN, None),
            Target::Accept => self.verdict(NF_ACCEPT, None),
        }
    }

    fn dnat(&mut self, to: &SocketAddr) {
        let family = match to {
            SocketAddr::V4(_) => IpFamily::V4,
            SocketAddr::V6(_) => IpFamily::V6,
        };
        self.immediate_value(NFT_REG_1, &addr_bytes(to.ip()));
        self.immediate_value(NFT_REG_1 + 1, &to.port().to_be_bytes());
        self.expr("nat", |w| {
            w.put_u32(1, NFT_NAT_DNAT);
            w.put_u32(2, u32::from(nfproto(family)));
            w.put_u32(3, NFT_REG_1);
            w.put_u32(5, NFT_REG_1 + 1);
            w.put_u32(7, NF_NAT_RANGE_PROTO_SPECIFIED);
        });
    }
}

/// `NFTA_DATA_VERDICT { code, chain }`.
pub(crate) fn put_verdict(w: &mut Writer, code: u32, chain: Option<&str>) {
    let verdict = w.begin_nest(NFTA_DATA_VERDICT);
    w.put_u32(NFTA_VERDICT_CODE, code);
    if let Some(chain) = chain {
        w.put_str(NFTA_VERDICT_CHAIN, chain);
    }
    w.end_nest(verdict);
}

/// The conntrack state bit `ct state` tests (`NF_CT_STATE_BIT`).
pub(crate) fn ct_state_bit(state: CtState) -> u32 {
    match state {
        CtState::Invalid => 1,
        CtState::Established => 1 << 1,
        CtState::Related => 1 << 2,
        CtState::New => 1 << 3,
    }
}

/// The 32-bit register slots a concatenation's fields take: each rounded up to 4 bytes.
pub(crate) fn slots(len: u32) -> u32 {
    len.div_ceil(4)
}

/// Writes the expressions of `rule` (in `chain`, planned in `table`) into `w`, as the value
/// of `NFTA_RULE_EXPRESSIONS`.
pub fn write_rule_exprs(w: &mut Writer, family: IpFamily, table: Table, rule: &NftRule) {
    let mut e = Exprs { w };
    let addr_len = match family {
        IpFamily::V4 => 4,
        IpFamily::V6 => 16,
    };
    match rule {
        NftRule::ServiceMap => {
            e.addr_load(family, AddrSide::Dst, 0);
            e.protocol_load(register(slots(addr_len)));
            e.port_load(register(slots(addr_len) + 1));
            e.lookup(SERVICE_MAP, true);
        }
        NftRule::NodePortMap => {
            e.protocol_load(register(0));
            e.port_load(register(1));
            e.lookup(NODE_PORT_MAP, true);
        }
        NftRule::Hairpin(target) => {
            e.ct_load(NFT_CT_STATUS);
            e.bitwise(&IPS_DST_NAT.to_ne_bytes(), &[0; 4], false);
            e.cmp(NFT_CMP_NEQ, &[0; 4]);
            e.addr_load(family, AddrSide::Src, 0);
            e.addr_load(family, AddrSide::Dst, slots(addr_len));
            e.lookup(HAIRPIN_SET, false);
            let name = NftChain::new(table, target).to_string();
            e.verdict(NFT_JUMP, Some(&name));
        }
        NftRule::ClusterIpSet => {
            e.addr_load(family, AddrSide::Dst, 0);
            e.lookup(CLUSTER_IP_SET, false);
            e.target(family, table, Some(&Target::Reject));
        }
        NftRule::Rule(rule) => write_plain(&mut e, family, table, rule),
    }
}

fn write_plain(e: &mut Exprs<'_>, family: IpFamily, table: Table, rule: &Rule) {
    for m in rule.matches.iter() {
        e.match_one(family, m);
    }
    e.target(family, table, rule.target.as_ref());
}

/// `NFTA_RULE_USERDATA` of a rule: its comment as `nft` stores it (type 0, length, the text
/// and its NUL), or nothing.
pub fn rule_userdata(rule: &NftRule) -> Option<Vec<u8>> {
    let text = match rule {
        NftRule::Rule(rule) => comment_text(rule)?,
        NftRule::ClusterIpSet => CLUSTER_IP_COMMENT.to_string(),
        _ => return None,
    };
    let mut out = Vec::with_capacity(text.len() + 3);
    out.push(0);
    out.push((text.len() + 1) as u8);
    out.extend_from_slice(text.as_bytes());
    out.push(0);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_are_numbered_as_nft_numbers_them() {
        // (32-bit slot, kernel register)
        let rows = [(0, 1), (1, 9), (2, 10), (4, 2), (5, 13), (8, 3)];
        for (slot, reg) in rows {
            assert_eq!(register(slot), reg, "slot {slot}");
        }
    }

    #[test]
    fn comments_fit_one_userdata_length_byte() {
        let rule = Rule::new(vec![Match::comment("x".repeat(255))], Target::Accept);
        let data = rule_userdata(&NftRule::Rule(rule)).unwrap();
        assert_eq!(data[1] as usize, data.len() - 2);
    }
}

//! A dumped rule back into the rule berth wrote ([`decode_rule`]): the inverse of
//! [`crate::nft::expr::write_rule_exprs`], pattern by pattern. Every match and statement berth
//! writes is a fixed run of expressions; a run that is none of them is an error naming the
//! expression where it starts.
//! What the kernel cannot hold of a planned rule is not recovered: see [`super::kernel_rule`].

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;

use super::expr::Expr;
use crate::nft::expr::{
    addr_field, ct_state_bit, nfproto, register, slots, ICMPV6_PORT_UNREACH, ICMP_PORT_UNREACH,
    IPS_DST_NAT, NFTA_FIB_F_DADDR, NFTA_FIB_F_SADDR, NFT_CMP_EQ, NFT_CMP_GTE, NFT_CMP_LTE,
    NFT_CMP_NEQ, NFT_CT_STATE, NFT_CT_STATUS, NFT_DYNSET_OP_UPDATE, NFT_FIB_RESULT_ADDRTYPE,
    NFT_JUMP, NFT_META_L4PROTO, NFT_META_MARK, NFT_NAT_DNAT, NFT_NG_RANDOM,
    NFT_PAYLOAD_NETWORK_HEADER, NFT_PAYLOAD_TRANSPORT_HEADER, NFT_REG_1, NFT_REG_VERDICT,
    NFT_REJECT_ICMP_UNREACH, NFT_RETURN, NF_ACCEPT, NF_DROP, NF_NAT_RANGE_PROTO_RANDOM_FULLY,
    NF_NAT_RANGE_PROTO_SPECIFIED, RTN_LOCAL,
};
use crate::nft::inline::HAIRPIN_SET;
use crate::nft::render::{NftRule, CLUSTER_IP_COMMENT, CLUSTER_IP_SET, NODE_PORT_MAP, SERVICE_MAP};
use crate::plan::model::{
    AddrSide, ChainName, CtState, MarkOp, Match, PortMatch, RecentAction, Rule, Table, Target,
};
use berth_core::{IpFamily, Protocol};

/// `NF_NAT_RANGE_MAP_IPS`: the kernel sets it on every NAT with an address.
const NF_NAT_RANGE_MAP_IPS: u32 = 1;
/// The data register after `NFT_REG_1`, where berth's DNAT loads the port.
const NFT_REG_2: u32 = NFT_REG_1 + 1;

/// What a rule is decoded against: its family, the planned table of its chain, and the
/// affinity sets of the table with their timeouts.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub family: IpFamily,
    pub table: Table,
    pub affinity: &'a BTreeMap<ChainName, u32>,
}

enum Item {
    Match(Match),
    Target(Option<Target>),
}

fn addr_len(family: IpFamily) -> u32 {
    match family {
        IpFamily::V4 => 4,
        IpFamily::V6 => 16,
    }
}

fn ip_of(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

fn u32_ne(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.try_into().ok()?))
}

fn port_of(bytes: &[u8]) -> Result<u16, String> {
    <[u8; 2]>::try_from(bytes)
        .map(u16::from_be_bytes)
        .map_err(|_| format!("a port of {} bytes", bytes.len()))
}

pub fn protocol_of(number: u8) -> Result<Protocol, String> {
    match number {
        6 => Ok(Protocol::Tcp),
        17 => Ok(Protocol::Udp),
        132 => Ok(Protocol::Sctp),
        other => Err(format!("protocol {other}, which berth never matches")),
    }
}

fn negated(op: u32) -> Result<bool, String> {
    match op {
        NFT_CMP_EQ => Ok(false),
        NFT_CMP_NEQ => Ok(true),
        other => Err(format!("a comparison with operator {other}")),
    }
}

/// The prefix length of a contiguous network mask.
fn prefix_of(mask: &[u8]) -> Option<u8> {
    let ones: u32 = mask.iter().map(|b| b.count_ones()).sum();
    let leading = mask
        .iter()
        .position(|b| *b != 0xff)
        .map_or(mask.len() as u32 * 8, |i| {
            i as u32 * 8 + mask[i].leading_ones()
        });
    (ones == leading).then_some(ones as u8)
}

fn zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| *b == 0)
}

/// A mark loaded and masked: compared (a mark match) or stored back (a mark statement).
fn mark(mask: &[u8], xor: &[u8], next: &Expr<'_>) -> Result<Item, String> {
    let (mask, xor) = (
        u32_ne(mask).ok_or("a mark mask of another length")?,
        u32_ne(xor).ok_or("a mark xor of another length")?,
    );
    match next {
        Expr::Cmp {
            sreg: NFT_REG_1,
            op,
            data,
        } if xor == 0 => {
            let value = u32_ne(data).ok_or("a mark of another length")?;
            let negated = negated(*op)?;
            Ok(Item::Match(Match::Mark {
                value,
                mask,
                negated,
            }))
        }
        Expr::MetaSet {
            key: NFT_META_MARK,
            sreg: NFT_REG_1,
        } => {
            let op = if mask == u32::MAX {
                MarkOp::Xor
            } else if mask == !xor {
                MarkOp::Or
            } else {
                return Err(format!("a mark set to (mark & {mask:#x}) ^ {xor:#x}"));
            };
            Ok(Item::Target(Some(Target::Mark { op, value: xor })))
        }
        other => Err(format!("a mark load followed by {other:?}")),
    }
}

/// A fib address-type lookup compared with `RTN_LOCAL`.
fn addr_type_local(flags: u32, op: u32) -> Result<Match, String> {
    let side = match flags {
        NFTA_FIB_F_SADDR => AddrSide::Src,
        NFTA_FIB_F_DADDR => AddrSide::Dst,
        other => return Err(format!("fib with flags {other:#x}")),
    };
    let negated = negated(op)?;
    Ok(Match::AddrTypeLocal { side, negated })
}

/// The conntrack states a ct state mask names; a bit berth never writes is an error.
fn ct_states(mask: &[u8]) -> Result<Match, String> {
    let bits = u32_ne(mask).ok_or("a ct state mask of another length")?;
    let all = [
        CtState::New,
        CtState::Established,
        CtState::Related,
        CtState::Invalid,
    ];
    let known = all.iter().fold(0, |b, s| b | ct_state_bit(*s));
    if bits & !known != 0 {
        return Err(format!("ct state bits {bits:#x}"));
    }
    let states = all
        .into_iter()
        .filter(|s| bits & ct_state_bit(*s) != 0)
        .collect();
    Ok(Match::Conntrack { states })
}

fn masquerade(flags: u32) -> Result<Target, String> {
    let random_fully = match flags {
        0 => false,
        NF_NAT_RANGE_PROTO_RANDOM_FULLY => true,
        other => return Err(format!("masquerade with flags {other:#x}")),
    };
    Ok(Target::Masquerade { random_fully })
}

impl Context<'_> {
    fn set_timeout(&self, set: &str) -> Result<u32, String> {
        self.affinity
            .get(&ChainName::new(set))
            .copied()
            .ok_or_else(|| format!("a lookup in set {set:?}, which is no affinity set"))
    }

    /// A network-header load into register 1 and what follows it: an address match (whole,
    /// by whole bytes, or masked), or an affinity update or check on the source address.
    fn address(&self, offset: u32, len: u32, rest: &[Expr<'_>]) -> Result<(usize, Item), String> {
        let full = addr_len(self.family);
        let side = if (offset, full) == addr_field(self.family, AddrSide::Src) {
            AddrSide::Src
        } else if (offset, full) == addr_field(self.family, AddrSide::Dst) {
            AddrSide::Dst
        } else {
            return Err(format!("a load of network header bytes {offset}+{len}"));
        };
        if len == 0 || len > full {
            return Err(format!("a load of network header bytes {offset}+{len}"));
        }
        let net = |bytes: &[u8], prefix: u32| -> Result<IpNet, String> {
            let mut padded = bytes.to_vec();
            padded.resize(full as usize, 0);
            let addr = ip_of(&padded).ok_or("an address of another length")?;
            let net = IpNet::new(addr, prefix as u8).map_err(|e| e.to_string())?;
            if net.trunc() != net {
                return Err(format!("{net} with host bits under its prefix"));
            }
            Ok(net)
        };
        let item = |net: IpNet, negated: bool| {
            Item::Match(match side {
                AddrSide::Src => Match::Source { net, negated },
                AddrSide::Dst => Match::Destination { net, negated },
            })
        };
        match rest {
            [Expr::Cmp {
                sreg: NFT_REG_1,
                op,
                data,
            }, ..]
                if data.len() == len as usize =>
            {
                Ok((2, item(net(data, len * 8)?, negated(*op)?)))
            }
            [Expr::Bitwise {
                sreg: NFT_REG_1,
                dreg: NFT_REG_1,
                mask,
                xor,
            }, Expr::Cmp {
                sreg: NFT_REG_1,
                op,
                data,
            }, ..]
                if len == full && mask.len() == len as usize && zero(xor) =>
            {
                let prefix = prefix_of(mask).ok_or("a mask that is no prefix")?;
                Ok((3, item(net(data, u32::from(prefix))?, negated(*op)?)))
            }
            [Expr::Dynset {
                set,
                sreg: NFT_REG_1,
                op: NFT_DYNSET_OP_UPDATE,
            }, ..]
                if side == AddrSide::Src && len == full =>
            {
                self.set_timeout(set)?;
                let name = ChainName::new(set);
                let action = RecentAction::Set;
                Ok((2, Item::Match(Match::Recent { name, action })))
            }
            [Expr::Lookup {
                set,
                sreg: NFT_REG_1,
                dreg: None,
            }, ..]
                if side == AddrSide::Src && len == full =>
            {
                let action = RecentAction::Rcheck {
                    seconds: self.set_timeout(set)?,
                    reap: true,
                };
                let name = ChainName::new(set);
                Ok((2, Item::Match(Match::Recent { name, action })))
            }
            _ => Err("an address load not followed by a comparison or set".to_string()),
        }
    }

    fn verdict(&self, code: u32, chain: Option<&str>) -> Result<Target, String> {
        Ok(match (code, chain) {
            (NF_DROP, None) => Target::Drop,
            (NF_ACCEPT, None) => Target::Accept,
            (NFT_RETURN, None) => Target::Return,
            (NFT_JUMP, Some(chain)) => Target::Jump(self.jump_target(chain)?),
            (code, chain) => {
                return Err(format!(
                    "verdict {} {}",
                    code as i32,
                    chain.unwrap_or_default()
                ))
            }
        })
    }

    /// A jump's chain in the planned table of the rule (`nat-BERTH-SVC-…` from a nat chain).
    fn jump_target(&self, chain: &str) -> Result<ChainName, String> {
        chain
            .strip_prefix(self.table.as_str())
            .and_then(|rest| rest.strip_prefix('-'))
            .filter(|name| !name.is_empty())
            .map(ChainName::new)
            .ok_or_else(|| {
                format!(
                    "a jump to {chain}, outside the rule's {} chains",
                    self.table
                )
            })
    }

    fn dnat(&self, addr: &[u8], port: &[u8], family: u32, flags: u32) -> Result<Target, String> {
        if family != u32::from(nfproto(self.family)) || addr.len() != addr_len(self.family) as usize
        {
            return Err("dnat to an address of another family".to_string());
        }
        let known = NF_NAT_RANGE_MAP_IPS | NF_NAT_RANGE_PROTO_SPECIFIED;
        if flags & NF_NAT_RANGE_PROTO_SPECIFIED == 0 || flags & !known != 0 {
            return Err(format!("dnat with flags {flags:#x}"));
        }
        let ip = ip_of(addr).ok_or("dnat to an address of another length")?;
        Ok(Target::Dnat(SocketAddr::new(ip, port_of(port)?)))
    }

    /// The match or statement the expressions at the start of `e` write, and how many they are.
    fn one(&self, e: &[Expr<'_>]) -> Result<(usize, Item), String> {
        match self.one_match(e)? {
            Some(found) => Ok(found),
            None => self.one_statement(e),
        }
    }

    /// A match (or the mark statement, which starts as a mark match does) at the start of `e`;
    /// `None` when `e` starts with something else.
    fn one_match(&self, e: &[Expr<'_>]) -> Result<Option<(usize, Item)>, String> {
        use Expr::*;
        let matched = |n: usize, m: Match| Some((n, Item::Match(m)));
        Ok(match e {
            [Payload {
                dreg: NFT_REG_1,
                base: NFT_PAYLOAD_NETWORK_HEADER,
                offset,
                len,
            }, rest @ ..] => Some(self.address(*offset, *len, rest)?),
            [MetaLoad {
                key: NFT_META_L4PROTO,
                dreg: NFT_REG_1,
            }, Cmp {
                sreg: NFT_REG_1,
                op: NFT_CMP_EQ,
                data: [p],
            }, ..] => matched(2, Match::Protocol(protocol_of(*p)?)),
            [Payload {
                dreg: NFT_REG_1,
                base: NFT_PAYLOAD_TRANSPORT_HEADER,
                offset: 2,
                len: 2,
            }, Cmp {
                sreg: NFT_REG_1,
                op: NFT_CMP_GTE,
                data: lo,
            }, Cmp {
                sreg: NFT_REG_1,
                op: NFT_CMP_LTE,
                data: hi,
            }, ..] => {
                let range = PortMatch::Range(port_of(lo)?, port_of(hi)?);
                matched(3, Match::DestPort(range))
            }
            [Payload {
                dreg: NFT_REG_1,
                base: NFT_PAYLOAD_TRANSPORT_HEADER,
                offset: 2,
                len: 2,
            }, Cmp {
                sreg: NFT_REG_1,
                op: NFT_CMP_EQ,
                data,
            }, ..] => matched(2, Match::DestPort(PortMatch::Single(port_of(data)?))),
            [MetaLoad {
                key: NFT_META_MARK,
                dreg: NFT_REG_1,
            }, Bitwise {
                sreg: NFT_REG_1,
                dreg: NFT_REG_1,
                mask,
                xor,
            }, next, ..] => Some((3, mark(mask, xor, next)?)),
            [Numgen {
                dreg: NFT_REG_1,
                modulus,
                kind: NFT_NG_RANDOM,
                offset: 0,
            }, Cmp {
                sreg: NFT_REG_1,
                op: NFT_CMP_EQ,
                data,
            }, ..]
                if u32_ne(data) == Some(0) && *modulus > 0 =>
            {
                matched(2, Match::Random { one_in: *modulus })
            }
            [Fib {
                dreg: NFT_REG_1,
                result: NFT_FIB_RESULT_ADDRTYPE,
                flags,
            }, Cmp {
                sreg: NFT_REG_1,
                op,
                data,
            }, ..]
                if u32_ne(data) == Some(RTN_LOCAL) =>
            {
                matched(2, addr_type_local(*flags, *op)?)
            }
            [Ct {
                key: NFT_CT_STATE,
                dreg: NFT_REG_1,
            }, Bitwise {
                sreg: NFT_REG_1,
                dreg: NFT_REG_1,
                mask,
                xor,
            }, Cmp {
                sreg: NFT_REG_1,
                op: NFT_CMP_NEQ,
                data,
            }, ..]
                if zero(xor) && zero(data) =>
            {
                matched(3, ct_states(mask)?)
            }
            _ => None,
        })
    }

    /// The statement at the start of `e`: a verdict, DNAT, masquerade, reject or counter.
    fn one_statement(&self, e: &[Expr<'_>]) -> Result<(usize, Item), String> {
        use Expr::*;
        let target = |n: usize, t: Target| (n, Item::Target(Some(t)));
        Ok(match e {
            [Verdict { code, chain }, ..] => target(1, self.verdict(*code, *chain)?),
            [Value {
                dreg: NFT_REG_1,
                data: addr,
            }, Value {
                dreg: NFT_REG_2,
                data: port,
            }, Nat {
                kind: NFT_NAT_DNAT,
                family,
                addr: NFT_REG_1,
                proto: NFT_REG_2,
                flags,
            }, ..] => target(3, self.dnat(addr, port, *family, *flags)?),
            [Masq { flags }, ..] => target(1, masquerade(*flags)?),
            [Reject {
                kind: NFT_REJECT_ICMP_UNREACH,
                code,
            }, ..]
                if *code == port_unreachable(self.family) =>
            {
                target(1, Target::Reject)
            }
            [Counter, ..] => (1, Item::Target(None)),
            [other, ..] => return Err(format!("{other:?} where berth writes nothing like it")),
            [] => return Err("no expression".to_string()),
        })
    }

    /// Whether `e` is the `cluster-ips` reject rule's expressions.
    fn cluster_ip_set(&self, e: &[Expr<'_>]) -> bool {
        let (offset, len) = addr_field(self.family, AddrSide::Dst);
        let rule = [
            Expr::Payload {
                dreg: NFT_REG_1,
                base: NFT_PAYLOAD_NETWORK_HEADER,
                offset,
                len,
            },
            Expr::Lookup {
                set: CLUSTER_IP_SET,
                sreg: NFT_REG_1,
                dreg: None,
            },
            Expr::Reject {
                kind: NFT_REJECT_ICMP_UNREACH,
                code: port_unreachable(self.family),
            },
        ];
        e == rule
    }

    /// The three rules that are not planned rules and carry no comment: the two map lookups and
    /// the hairpin mark.
    fn special(&self, e: &[Expr<'_>]) -> Result<Option<NftRule>, String> {
        let len = addr_len(self.family);
        let (src, _) = addr_field(self.family, AddrSide::Src);
        let (dst, _) = addr_field(self.family, AddrSide::Dst);
        let load = |dreg, base, offset, len| Expr::Payload {
            dreg,
            base,
            offset,
            len,
        };
        let net = NFT_PAYLOAD_NETWORK_HEADER;
        let transport = NFT_PAYLOAD_TRANSPORT_HEADER;
        let proto = |dreg| Expr::MetaLoad {
            key: NFT_META_L4PROTO,
            dreg,
        };
        let vmap = |set| Expr::Lookup {
            set,
            sreg: NFT_REG_1,
            dreg: Some(NFT_REG_VERDICT),
        };
        let service_map = [
            load(NFT_REG_1, net, dst, len),
            proto(register(slots(len))),
            load(register(slots(len) + 1), transport, 2, 2),
            vmap(SERVICE_MAP),
        ];
        if e == service_map {
            return Ok(Some(NftRule::ServiceMap));
        }
        let node_port_map = [
            proto(register(0)),
            load(register(1), transport, 2, 2),
            vmap(NODE_PORT_MAP),
        ];
        if e == node_port_map {
            return Ok(Some(NftRule::NodePortMap));
        }
        let ips_dst_nat = IPS_DST_NAT.to_ne_bytes();
        let hairpin = [
            Expr::Ct {
                key: NFT_CT_STATUS,
                dreg: NFT_REG_1,
            },
            Expr::Bitwise {
                sreg: NFT_REG_1,
                dreg: NFT_REG_1,
                mask: &ips_dst_nat,
                xor: &[0; 4],
            },
            Expr::Cmp {
                sreg: NFT_REG_1,
                op: NFT_CMP_NEQ,
                data: &[0; 4],
            },
            load(register(0), net, src, len),
            load(register(slots(len)), net, dst, len),
            Expr::Lookup {
                set: HAIRPIN_SET,
                sreg: NFT_REG_1,
                dreg: None,
            },
        ];
        if let Some((Expr::Verdict { code, chain }, head)) = e.split_last() {
            if head == hairpin {
                return match self.verdict(*code, *chain)? {
                    Target::Jump(target) => Ok(Some(NftRule::Hairpin(target))),
                    other => Err(format!("the hairpin lookup ends in {other:?}")),
                };
            }
        }
        Ok(None)
    }
}

fn port_unreachable(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => ICMP_PORT_UNREACH,
        IpFamily::V6 => ICMPV6_PORT_UNREACH,
    }
}

/// The comment of a rule's userdata (`NFTNL_UDATA_RULE_COMMENT`, its text and NUL).
fn comment_of(userdata: &[u8]) -> Result<Option<String>, String> {
    let mut rest = userdata;
    let mut comment = None;
    while let [kind, len, tail @ ..] = rest {
        let value = tail
            .get(..usize::from(*len))
            .ok_or("rule userdata cut short")?;
        match (kind, value.split_last()) {
            (0, Some((0, text))) if comment.is_none() => {
                let text = std::str::from_utf8(text).map_err(|_| "a comment that is not UTF-8")?;
                comment = Some(text.to_string());
            }
            _ => return Err(format!("rule userdata of type {kind}")),
        }
        rest = &tail[usize::from(*len)..];
    }
    if !rest.is_empty() {
        return Err("rule userdata cut short".to_string());
    }
    Ok(comment)
}

/// The rule whose expressions (parsed) and userdata a dump returned.
pub fn decode_rule(
    cx: &Context<'_>,
    exprs: &[Expr<'_>],
    userdata: Option<&[u8]>,
) -> Result<NftRule, String> {
    let comment = comment_of(userdata.unwrap_or_default())?;
    if comment.is_none() {
        if let Some(rule) = cx.special(exprs)? {
            return Ok(rule);
        }
    }
    if comment.as_deref() == Some(CLUSTER_IP_COMMENT) && cx.cluster_ip_set(exprs) {
        return Ok(NftRule::ClusterIpSet);
    }
    let mut matches: Vec<Match> = comment
        .map(|c| Match::Comment(Arc::from(c)))
        .into_iter()
        .collect();
    let mut target = None;
    let mut rest = exprs;
    while !rest.is_empty() {
        if target.is_some() {
            return Err(format!("{:?} after the rule's verdict", rest[0]));
        }
        let (taken, item) = cx.one(rest)?;
        match item {
            Item::Match(m) => matches.push(m),
            Item::Target(t) => target = Some(t),
        }
        rest = &rest[taken..];
    }
    let target = target.ok_or("a rule without a verdict or counter")?;
    Ok(NftRule::Rule(Rule {
        matches: Arc::from(matches),
        target,
    }))
}

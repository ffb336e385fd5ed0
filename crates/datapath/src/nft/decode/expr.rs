//! One expression of a dumped rule, typed ([`Expr`]), from its netlink attributes. Strict: an
//! expression berth never writes, an attribute the kernel would not dump for what berth wrote,
//! or a value outside what berth uses is an error naming it. What the kernel adds on its own
//! when it dumps (a lookup's flags 0, a dynset's timeout 0 and flags, a NAT range's maxima and
//! flags, counter values) is read and checked, not refused.

use crate::nft::wire::{Attr, Attrs};

// Attribute numbers of `NFTA_EXPR_*` and the data nest, from nf_tables.h.
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

/// A register berth's rules use: the verdict register or a data register.
pub type Reg = u32;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr<'a> {
    Payload {
        dreg: Reg,
        base: u32,
        offset: u32,
        len: u32,
    },
    MetaLoad {
        key: u32,
        dreg: Reg,
    },
    MetaSet {
        key: u32,
        sreg: Reg,
    },
    Cmp {
        sreg: Reg,
        op: u32,
        data: &'a [u8],
    },
    /// `dreg = (sreg & mask) ^ xor`, the boolean form.
    Bitwise {
        sreg: Reg,
        dreg: Reg,
        mask: &'a [u8],
        xor: &'a [u8],
    },
    Value {
        dreg: Reg,
        data: &'a [u8],
    },
    Verdict {
        code: u32,
        chain: Option<&'a str>,
    },
    Lookup {
        set: &'a str,
        sreg: Reg,
        dreg: Option<Reg>,
    },
    /// `update @set { key }`.
    Dynset {
        set: &'a str,
        sreg: Reg,
        op: u32,
    },
    Numgen {
        dreg: Reg,
        modulus: u32,
        kind: u32,
        offset: u32,
    },
    Fib {
        dreg: Reg,
        result: u32,
        flags: u32,
    },
    Ct {
        key: u32,
        dreg: Reg,
    },
    Nat {
        kind: u32,
        family: u32,
        addr: Reg,
        proto: Reg,
        flags: u32,
    },
    Masq {
        flags: u32,
    },
    Reject {
        kind: u32,
        code: u8,
    },
    Counter,
}

/// The attributes of one expression's data, by type; refuses a type outside `known` and a
/// type given twice.
struct Fields<'a> {
    name: &'a str,
    attrs: Vec<Attr<'a>>,
}

impl<'a> Fields<'a> {
    fn new(name: &'a str, data: Attrs<'a>, known: &[u16]) -> Result<Self, String> {
        let mut attrs: Vec<Attr<'a>> = Vec::new();
        for attr in data {
            if !known.contains(&attr.kind) {
                return Err(format!("{name} with attribute {}", attr.kind));
            }
            if attrs.iter().any(|a| a.kind == attr.kind) {
                return Err(format!("{name} with attribute {} twice", attr.kind));
            }
            attrs.push(attr);
        }
        Ok(Fields { name, attrs })
    }

    fn get(&self, kind: u16) -> Option<Attr<'a>> {
        self.attrs.iter().copied().find(|a| a.kind == kind)
    }

    fn u32_opt(&self, kind: u16) -> Result<Option<u32>, String> {
        match self.get(kind) {
            None => Ok(None),
            Some(a) if a.value.len() == 4 => Ok(a.u32()),
            Some(a) => Err(format!(
                "{} attribute {kind} of {} bytes",
                self.name,
                a.value.len()
            )),
        }
    }

    fn u32(&self, kind: u16) -> Result<u32, String> {
        self.u32_opt(kind)?
            .ok_or_else(|| format!("{} without attribute {kind}", self.name))
    }

    fn u64_opt(&self, kind: u16) -> Result<Option<u64>, String> {
        match self.get(kind) {
            None => Ok(None),
            Some(a) if a.value.len() == 8 => Ok(a.u64()),
            Some(a) => Err(format!(
                "{} attribute {kind} of {} bytes",
                self.name,
                a.value.len()
            )),
        }
    }

    fn str(&self, kind: u16) -> Result<&'a str, String> {
        self.get(kind)
            .and_then(|a| a.str())
            .ok_or_else(|| format!("{} without a name in attribute {kind}", self.name))
    }

    /// `NFTA_DATA_VALUE` inside the data nest `kind`.
    fn value(&self, kind: u16) -> Result<&'a [u8], String> {
        let nest = self
            .get(kind)
            .ok_or_else(|| format!("{} without attribute {kind}", self.name))?;
        match nest.nested().collect::<Vec<_>>().as_slice() {
            [v] if v.kind == NFTA_DATA_VALUE => Ok(v.value),
            _ => Err(format!("{} attribute {kind} is not a value", self.name)),
        }
    }
}

/// An immediate's data: a value, or a verdict with its chain.
fn immediate<'a>(f: &Fields<'a>) -> Result<Expr<'a>, String> {
    let dreg = f.u32(1)?;
    let nest = f
        .get(2)
        .ok_or_else(|| "immediate without data".to_string())?;
    let inner: Vec<Attr<'a>> = nest.nested().collect();
    match inner.as_slice() {
        [v] if v.kind == NFTA_DATA_VALUE && dreg != 0 => Ok(Expr::Value {
            dreg,
            data: v.value,
        }),
        [v] if v.kind == NFTA_DATA_VERDICT && dreg == 0 => {
            let verdict = Fields::new(
                "verdict",
                v.nested(),
                &[NFTA_VERDICT_CODE, NFTA_VERDICT_CHAIN],
            )?;
            let chain = match verdict.get(NFTA_VERDICT_CHAIN) {
                Some(_) => Some(verdict.str(NFTA_VERDICT_CHAIN)?),
                None => None,
            };
            Ok(Expr::Verdict {
                code: verdict.u32(NFTA_VERDICT_CODE)?,
                chain,
            })
        }
        _ => Err("immediate of another shape".to_string()),
    }
}

/// One `NFTA_LIST_ELEM` of a rule's expressions.
pub fn parse_expr(elem: Attr<'_>) -> Result<Expr<'_>, String> {
    let attrs = Fields::new(
        "expression",
        checked(elem.value)?,
        &[NFTA_EXPR_NAME, NFTA_EXPR_DATA],
    )?;
    let name = attrs.str(NFTA_EXPR_NAME)?;
    let data = checked(attrs.get(NFTA_EXPR_DATA).map_or(&[][..], |a| a.value))?;
    Ok(match name {
        "payload" => {
            let f = Fields::new(name, data, &[1, 2, 3, 4])?;
            Expr::Payload {
                dreg: f.u32(1)?,
                base: f.u32(2)?,
                offset: f.u32(3)?,
                len: f.u32(4)?,
            }
        }
        "meta" => {
            let f = Fields::new(name, data, &[1, 2, 3])?;
            let key = f.u32(2)?;
            match (f.u32_opt(1)?, f.u32_opt(3)?) {
                (Some(dreg), None) => Expr::MetaLoad { key, dreg },
                (None, Some(sreg)) => Expr::MetaSet { key, sreg },
                _ => return Err("meta neither a load nor a set".to_string()),
            }
        }
        "cmp" => {
            let f = Fields::new(name, data, &[1, 2, 3])?;
            Expr::Cmp {
                sreg: f.u32(1)?,
                op: f.u32(2)?,
                data: f.value(3)?,
            }
        }
        "bitwise" => {
            let f = Fields::new(name, data, &[1, 2, 3, 4, 5, 6])?;
            if f.u32_opt(6)?.unwrap_or(0) != 0 {
                return Err("bitwise other than mask-and-xor".to_string());
            }
            let (mask, xor) = (f.value(4)?, f.value(5)?);
            let len = f.u32(3)? as usize;
            if mask.len() != len || xor.len() != len {
                return Err("bitwise of uneven lengths".to_string());
            }
            Expr::Bitwise {
                sreg: f.u32(1)?,
                dreg: f.u32(2)?,
                mask,
                xor,
            }
        }
        "immediate" => immediate(&Fields::new(name, data, &[1, 2])?)?,
        "lookup" => {
            // set, sreg, dreg, set id, flags
            let f = Fields::new(name, data, &[1, 2, 3, 4, 5])?;
            if f.u32_opt(5)?.unwrap_or(0) != 0 {
                return Err("lookup with flags (an inverted lookup)".to_string());
            }
            Expr::Lookup {
                set: f.str(1)?,
                sreg: f.u32(2)?,
                dreg: f.u32_opt(3)?,
            }
        }
        "dynset" => {
            // set, set id, op, sreg key, timeout, pad, flags
            let f = Fields::new(name, data, &[1, 2, 3, 4, 6, 8, 9])?;
            if f.u64_opt(6)?.unwrap_or(0) != 0 {
                return Err("dynset with its own timeout".to_string());
            }
            if f.u32_opt(9)?.unwrap_or(0) != 0 {
                return Err("dynset with flags".to_string());
            }
            Expr::Dynset {
                set: f.str(1)?,
                sreg: f.u32(4)?,
                op: f.u32(3)?,
            }
        }
        "numgen" => {
            let f = Fields::new(name, data, &[1, 2, 3, 4])?;
            Expr::Numgen {
                dreg: f.u32(1)?,
                modulus: f.u32(2)?,
                kind: f.u32(3)?,
                offset: f.u32_opt(4)?.unwrap_or(0),
            }
        }
        "fib" => {
            let f = Fields::new(name, data, &[1, 2, 3])?;
            Expr::Fib {
                dreg: f.u32(1)?,
                result: f.u32(2)?,
                flags: f.u32(3)?,
            }
        }
        "ct" => {
            let f = Fields::new(name, data, &[1, 2])?;
            Expr::Ct {
                key: f.u32(2)?,
                dreg: f.u32(1)?,
            }
        }
        "nat" => {
            // type, family, addr min/max, proto min/max, flags
            let f = Fields::new(name, data, &[1, 2, 3, 4, 5, 6, 7])?;
            let addr = f.u32(3)?;
            let proto = f.u32(5)?;
            if f.u32_opt(4)?.is_some_and(|max| max != addr)
                || f.u32_opt(6)?.is_some_and(|max| max != proto)
            {
                return Err("nat to a range".to_string());
            }
            Expr::Nat {
                kind: f.u32(1)?,
                family: f.u32(2)?,
                addr,
                proto,
                flags: f.u32_opt(7)?.unwrap_or(0),
            }
        }
        "masq" => {
            let f = Fields::new(name, data, &[1])?;
            Expr::Masq {
                flags: f.u32_opt(1)?.unwrap_or(0),
            }
        }
        "reject" => {
            let f = Fields::new(name, data, &[1, 2])?;
            let code = match f.get(2).map(|a| a.value) {
                Some([code]) => *code,
                _ => return Err("reject without an icmp code".to_string()),
            };
            Expr::Reject {
                kind: f.u32(1)?,
                code,
            }
        }
        "counter" => {
            // bytes, packets, pad
            Fields::new(name, data, &[1, 2, 3])?;
            Expr::Counter
        }
        other => return Err(format!("expression {other:?}, which berth never writes")),
    })
}

/// `bytes` as attributes, refusing a buffer whose attributes do not fill it exactly (a cut or
/// damaged message), which [`Attrs`] alone would end quietly.
pub fn checked(bytes: &[u8]) -> Result<Attrs<'_>, String> {
    let mut at = 0;
    while at < bytes.len() {
        let len = bytes
            .get(at..at + 2)
            .map_or(0, |b| usize::from(u16::from_ne_bytes([b[0], b[1]])));
        if len < 4 || at + len > bytes.len() {
            return Err(format!("a damaged attribute at byte {at}"));
        }
        at += (len + 3) & !3;
    }
    Ok(Attrs(bytes))
}

/// Every expression of a rule, in order.
pub fn parse_exprs(exprs: &[u8]) -> Result<Vec<Expr<'_>>, String> {
    checked(exprs)?.map(parse_expr).collect()
}

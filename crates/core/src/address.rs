//! Pool addresses: a CIDR (`198.18.0.0/24`, `fd00::/120`) or an inclusive range of two addresses
//! of one family (`198.18.0.200-198.18.0.250`), parsed into one closed interval type.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::family::IpFamily;

/// Longest accepted address string: two full IPv6 addresses, a dash and some spaces.
pub const MAX_ADDRESS_LEN: usize = 100;

/// Why a pool address was rejected; the `Display` text is what users see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddressProblem {
    Empty,
    TooLong,
    /// Neither a CIDR nor `a-b`.
    Malformed,
    /// A side of a range (or the CIDR's address) is not an IP address.
    NotAnIp(String),
    /// `::ffff:a.b.c.d` is ambiguous between families; Kubernetes rejects it too.
    Ipv4MappedIpv6(String),
    /// The prefix length is not a number or too large for the family.
    BadPrefixLength(String),
    /// `198.18.0.1/24`: the address has bits set beyond the prefix.
    HostBitsSet {
        network: String,
    },
    MixedFamilies,
    Inverted,
}

impl fmt::Display for AddressProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddressProblem::Empty => f.write_str("must not be empty"),
            AddressProblem::TooLong => {
                write!(f, "must be at most {MAX_ADDRESS_LEN} characters")
            }
            AddressProblem::Malformed => f.write_str(
                "must be a CIDR (198.18.0.0/24, fd00::/120) or a range of two addresses \
                 (198.18.0.200-198.18.0.250)",
            ),
            AddressProblem::NotAnIp(s) => write!(f, "{s:?} is not an IP address"),
            AddressProblem::Ipv4MappedIpv6(s) => {
                write!(
                    f,
                    "{s:?} is an IPv4-mapped IPv6 address; write the IPv4 address"
                )
            }
            AddressProblem::BadPrefixLength(s) => write!(f, "{s:?} is not a valid prefix length"),
            AddressProblem::HostBitsSet { network } => {
                write!(
                    f,
                    "a CIDR must not have host bits set (did you mean {network}?)"
                )
            }
            AddressProblem::MixedFamilies => {
                f.write_str("both ends of a range must be of the same IP family")
            }
            AddressProblem::Inverted => {
                f.write_str("the first address of a range must not be greater than the last")
            }
        }
    }
}

/// A closed interval `[start, end]` of addresses of one family, with `start <= end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AddressRange {
    start: IpAddr,
    end: IpAddr,
}

impl AddressRange {
    /// A range from two addresses; `None` when the families differ or `start > end`.
    pub fn new(start: IpAddr, end: IpAddr) -> Option<Self> {
        (IpFamily::of(start) == IpFamily::of(end) && start <= end).then_some(Self { start, end })
    }

    pub fn start(&self) -> IpAddr {
        self.start
    }

    pub fn end(&self) -> IpAddr {
        self.end
    }

    pub fn family(&self) -> IpFamily {
        IpFamily::of(self.start)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        IpFamily::of(ip) == self.family() && self.start <= ip && ip <= self.end
    }

    pub fn overlaps(&self, other: &AddressRange) -> bool {
        self.family() == other.family() && self.start <= other.end && other.start <= self.end
    }

    /// Number of addresses; saturates at `u128::MAX` only for `::/0`, one short of 2^128.
    pub fn len(&self) -> u128 {
        (to_u128(self.end) - to_u128(self.start)).saturating_add(1)
    }

    /// Never true: a range holds at least its start. Present because `len` is.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The address `offset` places after `start`, if it is still inside the range.
    pub fn nth(&self, offset: u128) -> Option<IpAddr> {
        let value = to_u128(self.start).checked_add(offset)?;
        let ip = from_u128(self.family(), value)?;
        (ip <= self.end).then_some(ip)
    }

    /// The prefix length when the range is exactly one CIDR block.
    pub fn prefix_len(&self) -> Option<u8> {
        let bits = self.family().bits();
        let span = to_u128(self.end) - to_u128(self.start);
        let host_bits = 128 - span.leading_zeros();
        let aligned = span.count_ones() == host_bits && to_u128(self.start) & span == 0;
        // host_bits <= bits because both ends are of one family.
        aligned.then(|| (bits - host_bits) as u8)
    }
}

impl fmt::Display for AddressRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.prefix_len() {
            Some(len) => write!(f, "{}/{}", self.start, len),
            None => write!(f, "{}-{}", self.start, self.end),
        }
    }
}

/// A pool address that did not parse: the input and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid address {input:?}: {problem}")]
pub struct AddressError {
    pub input: String,
    pub problem: AddressProblem,
}

/// Parses one pool address (`IPPool.spec.addresses`). Spaces around a range's dash are allowed,
/// as in MetalLB. The rules match the CRD's CEL rules, and go further where CEL cannot (IPv6
/// order). This is berth's only pool address parser: the API validation and the allocator
/// both read addresses through it.
pub fn parse_address(input: &str) -> Result<AddressRange, AddressError> {
    parse_inner(input).map_err(|problem| AddressError {
        input: input.to_string(),
        problem,
    })
}

fn parse_inner(input: &str) -> Result<AddressRange, AddressProblem> {
    if input.trim().is_empty() {
        return Err(AddressProblem::Empty);
    }
    if input.len() > MAX_ADDRESS_LEN {
        return Err(AddressProblem::TooLong);
    }
    if let Some((ip, len)) = input.split_once('/') {
        return parse_cidr(ip, len);
    }
    let mut sides = input.split('-');
    let (Some(a), Some(b), None) = (sides.next(), sides.next(), sides.next()) else {
        return Err(AddressProblem::Malformed);
    };
    let start = parse_ip(a.trim())?;
    let end = parse_ip(b.trim())?;
    if IpFamily::of(start) != IpFamily::of(end) {
        return Err(AddressProblem::MixedFamilies);
    }
    AddressRange::new(start, end).ok_or(AddressProblem::Inverted)
}

fn parse_cidr(ip: &str, len: &str) -> Result<AddressRange, AddressProblem> {
    let ip = parse_ip(ip)?;
    let bits = IpFamily::of(ip).bits();
    // Reject `+24` and `024`: Kubernetes' CIDR parser does, so must we.
    let canonical_number = !len.is_empty()
        && len.bytes().all(|b| b.is_ascii_digit())
        && (len == "0" || !len.starts_with('0'));
    let prefix = match len.parse::<u32>() {
        Ok(prefix) if canonical_number && prefix <= bits => prefix,
        _ => return Err(AddressProblem::BadPrefixLength(len.to_string())),
    };
    let host_mask = u128::MAX.checked_shr(prefix + (128 - bits)).unwrap_or(0);
    let value = to_u128(ip);
    let family = IpFamily::of(ip);
    let network = value & !host_mask;
    if network != value {
        let network = from_u128(family, network).map_or_else(String::new, |n| n.to_string());
        return Err(AddressProblem::HostBitsSet {
            network: format!("{network}/{prefix}"),
        });
    }
    match (
        from_u128(family, network),
        from_u128(family, network | host_mask),
    ) {
        (Some(start), Some(end)) => AddressRange::new(start, end).ok_or(AddressProblem::Malformed),
        _ => Err(AddressProblem::Malformed),
    }
}

fn parse_ip(s: &str) -> Result<IpAddr, AddressProblem> {
    let ip: IpAddr = s
        .parse()
        .map_err(|_| AddressProblem::NotAnIp(s.to_string()))?;
    if let IpAddr::V6(v6) = ip {
        if v6.to_ipv4_mapped().is_some() {
            return Err(AddressProblem::Ipv4MappedIpv6(s.to_string()));
        }
    }
    Ok(ip)
}

/// The address as an integer, so that ranges can be measured and walked.
pub fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The address of `family` with integer value `value`, if it fits the family.
pub fn from_u128(family: IpFamily, value: u128) -> Option<IpAddr> {
    match family {
        IpFamily::V4 => u32::try_from(value)
            .ok()
            .map(|v| IpAddr::V4(Ipv4Addr::from(v))),
        IpFamily::V6 => Some(IpAddr::V6(Ipv6Addr::from(value))),
    }
}

/// An IPv4 address ending in `.0` or `.255`: some old clients and routers treat these as network
/// or broadcast addresses even inside a larger block, so `avoidBuggyIPs` pools skip them.
pub fn is_buggy_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => matches!(v4.octets()[3], 0 | 255),
        IpAddr::V6(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn range(s: &str) -> AddressRange {
        parse_address(s).unwrap()
    }

    fn problem(s: &str) -> AddressProblem {
        match parse_address(s) {
            Err(AddressError { input, problem }) => {
                assert_eq!(input, s);
                problem
            }
            other => panic!("{s:?} should be invalid, got {other:?}"),
        }
    }

    #[test]
    fn ipv4_cidrs() {
        let r = range("198.18.0.0/24");
        assert_eq!((r.start(), r.end()), (ip("198.18.0.0"), ip("198.18.0.255")));
        assert_eq!(r.len(), 256);
        assert_eq!(r.family(), IpFamily::V4);
        let host = range("198.18.0.7/32");
        assert_eq!(
            (host.start(), host.end(), host.len()),
            (ip("198.18.0.7"), ip("198.18.0.7"), 1)
        );
        let all = range("0.0.0.0/0");
        assert_eq!(
            (all.start(), all.end()),
            (ip("0.0.0.0"), ip("255.255.255.255"))
        );
        assert_eq!(all.len(), 1 << 32);
    }

    #[test]
    fn ipv6_cidrs() {
        let r = range("fd00::/120");
        assert_eq!((r.start(), r.end()), (ip("fd00::"), ip("fd00::ff")));
        assert_eq!(r.family(), IpFamily::V6);
        assert_eq!(range("2001:db8::/64").len(), 1 << 64);
        assert_eq!(range("fd00::1/128").len(), 1);
        assert_eq!(range("::/0").len(), u128::MAX);
    }

    #[test]
    fn ranges() {
        let r = range("198.18.0.200-198.18.0.250");
        assert_eq!(
            (r.start(), r.end(), r.len()),
            (ip("198.18.0.200"), ip("198.18.0.250"), 51)
        );
        let spaced = range("198.18.0.200 - 198.18.0.250");
        assert_eq!(spaced, r);
        let single = range("10.0.0.1-10.0.0.1");
        assert_eq!(single.len(), 1);
        let v6 = range("fd00::10-fd00::1:0");
        assert_eq!(v6.len(), 0x1_0000 - 0x10 + 1);
        assert_eq!(v6.family(), IpFamily::V6);
    }

    #[test]
    fn inverted_ranges_are_rejected_in_both_families() {
        assert_eq!(
            problem("198.18.0.250-198.18.0.200"),
            AddressProblem::Inverted
        );
        assert_eq!(problem("10.0.1.0-10.0.0.255"), AddressProblem::Inverted);
        assert_eq!(problem("fd00::2-fd00::1"), AddressProblem::Inverted);
        assert_eq!(problem("fd00:1::-fd00::ffff"), AddressProblem::Inverted);
    }

    #[test]
    fn mixed_families_are_rejected() {
        assert_eq!(problem("10.0.0.1-fd00::1"), AddressProblem::MixedFamilies);
        assert_eq!(problem("fd00::1-10.0.0.1"), AddressProblem::MixedFamilies);
    }

    #[test]
    fn malformed_inputs() {
        assert_eq!(problem(""), AddressProblem::Empty);
        assert_eq!(problem("   "), AddressProblem::Empty);
        assert_eq!(
            problem("10.0.0.1-10.0.0.2-10.0.0.3"),
            AddressProblem::Malformed
        );
        assert_eq!(problem("10.0.0.1"), AddressProblem::Malformed);
        assert_eq!(
            problem(&"1".repeat(MAX_ADDRESS_LEN + 1)),
            AddressProblem::TooLong
        );
        assert_eq!(
            problem("10.0.0.256/32"),
            AddressProblem::NotAnIp("10.0.0.256".into())
        );
        assert_eq!(
            problem("10.0.0-10.0.0.5"),
            AddressProblem::NotAnIp("10.0.0".into())
        );
        assert_eq!(problem("-10.0.0.5"), AddressProblem::NotAnIp("".into()));
        assert_eq!(problem("10.0.0.5-"), AddressProblem::NotAnIp("".into()));
        assert_eq!(problem("pool/24"), AddressProblem::NotAnIp("pool".into()));
        assert_eq!(
            problem(" 10.0.0.0/24"),
            AddressProblem::NotAnIp(" 10.0.0.0".into())
        );
        assert_eq!(
            problem("fe80::1%eth0-fe80::2"),
            AddressProblem::NotAnIp("fe80::1%eth0".into())
        );
    }

    #[test]
    fn leading_zero_octets_are_not_addresses() {
        // Ambiguous between octal and decimal; Go's netip and Kubernetes reject them too.
        assert_eq!(
            problem("010.0.0.0/8"),
            AddressProblem::NotAnIp("010.0.0.0".into())
        );
    }

    #[test]
    fn bad_prefix_lengths() {
        for len in ["33", "-1", "", "+8", "08", "8.0", "x"] {
            assert_eq!(
                problem(&format!("10.0.0.0/{len}")),
                AddressProblem::BadPrefixLength(len.into()),
                "/{len}"
            );
        }
        assert_eq!(
            problem("fd00::/129"),
            AddressProblem::BadPrefixLength("129".into())
        );
        assert!(parse_address("10.0.0.0/0").is_err());
        assert!(parse_address("0.0.0.0/0").is_ok());
    }

    #[test]
    fn host_bits_must_be_clear() {
        assert_eq!(
            problem("198.18.0.1/24"),
            AddressProblem::HostBitsSet {
                network: "198.18.0.0/24".into()
            }
        );
        assert_eq!(
            problem("fd00::1/64"),
            AddressProblem::HostBitsSet {
                network: "fd00::/64".into()
            }
        );
    }

    #[test]
    fn ipv4_mapped_ipv6_is_rejected() {
        assert_eq!(
            problem("::ffff:10.0.0.1-::ffff:10.0.0.9"),
            AddressProblem::Ipv4MappedIpv6("::ffff:10.0.0.1".into())
        );
        assert_eq!(
            problem("::ffff:10.0.0.0/120"),
            AddressProblem::Ipv4MappedIpv6("::ffff:10.0.0.0".into())
        );
    }

    #[test]
    fn problems_read_well() {
        let err = parse_address("198.18.0.9-198.18.0.1").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid address \"198.18.0.9-198.18.0.1\": the first address of a range must not be greater than the last"
        );
    }

    #[test]
    fn contains_and_overlaps() {
        let pool = range("198.18.0.200-198.18.0.250");
        assert!(pool.contains(ip("198.18.0.200")));
        assert!(pool.contains(ip("198.18.0.250")));
        assert!(!pool.contains(ip("198.18.0.251")));
        assert!(!pool.contains(ip("::198.18.0.210")));
        assert!(pool.overlaps(&range("198.18.0.250/32")));
        assert!(pool.overlaps(&range("198.18.0.0/24")));
        assert!(!pool.overlaps(&range("198.18.0.251-198.18.0.255")));
        assert!(!pool.overlaps(&range("::/0")));
        assert!(range("fd00::/64").overlaps(&range("fd00::5-fd00::9")));
    }

    #[test]
    fn nth_walks_inside_the_range_only() {
        let pool = range("198.18.0.254-198.18.1.1");
        assert_eq!(pool.nth(0), Some(ip("198.18.0.254")));
        assert_eq!(pool.nth(2), Some(ip("198.18.1.0")));
        assert_eq!(pool.nth(3), Some(ip("198.18.1.1")));
        assert_eq!(pool.nth(4), None);
        assert_eq!(range("255.255.255.255/32").nth(1), None);
        assert_eq!(
            range("::/0").nth(u128::MAX),
            Some(ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"))
        );
    }

    #[test]
    fn display_prefers_cidr_notation() {
        assert_eq!(
            range("198.18.0.0-198.18.0.255").to_string(),
            "198.18.0.0/24"
        );
        assert_eq!(
            range("198.18.0.200-198.18.0.250").to_string(),
            "198.18.0.200-198.18.0.250"
        );
        assert_eq!(
            range("198.18.0.1-198.18.0.2").to_string(),
            "198.18.0.1-198.18.0.2"
        );
        assert_eq!(range("198.18.0.2-198.18.0.3").to_string(), "198.18.0.2/31");
        assert_eq!(range("fd00::/120").to_string(), "fd00::/120");
        assert_eq!(range("::/0").to_string(), "::/0");
        assert_eq!(range("0.0.0.0/0").to_string(), "0.0.0.0/0");
        for s in ["198.18.0.0/24", "fd00::5-fd00::9", "10.0.0.7/32"] {
            assert_eq!(range(&range(s).to_string()), range(s));
        }
    }

    #[test]
    fn new_enforces_order_and_family() {
        assert!(AddressRange::new(ip("10.0.0.2"), ip("10.0.0.1")).is_none());
        assert!(AddressRange::new(ip("10.0.0.1"), ip("fd00::1")).is_none());
        assert!(AddressRange::new(ip("10.0.0.1"), ip("10.0.0.1")).is_some());
    }

    #[test]
    fn buggy_ips() {
        assert!(is_buggy_ip(ip("198.18.1.0")));
        assert!(is_buggy_ip(ip("198.18.0.255")));
        assert!(!is_buggy_ip(ip("198.18.0.1")));
        assert!(!is_buggy_ip(ip("fd00::")));
        assert!(!is_buggy_ip(ip("fd00::ff")));
    }

    #[test]
    fn families() {
        assert_eq!(IpFamily::of(ip("10.0.0.1")).to_string(), "IPv4");
        assert_eq!(IpFamily::of(ip("::1")).to_string(), "IPv6");
        assert_eq!(from_u128(IpFamily::V4, 1 << 32), None);
        assert_eq!(from_u128(IpFamily::V4, 1), Some(ip("0.0.0.1")));
    }
}

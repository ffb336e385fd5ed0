//! Properties of pool address parsing over random inputs.

// Helpers outside #[test] functions unwrap too; a panic is a test failure here.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use berth_core::{from_u128, parse_address, to_u128, AddressError, AddressProblem, IpFamily};
use proptest::prelude::*;

fn any_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<u32>().prop_map(|v| IpAddr::V4(Ipv4Addr::from(v))),
        // Skip IPv4-mapped addresses, which are rejected on purpose.
        any::<u128>()
            .prop_filter("not IPv4-mapped", |v| (v >> 32) != 0xffff)
            .prop_map(|v| IpAddr::V6(Ipv6Addr::from(v))),
    ]
}

fn same_family_pair() -> impl Strategy<Value = (IpAddr, IpAddr)> {
    prop_oneof![
        (any::<u32>(), any::<u32>())
            .prop_map(|(a, b)| (IpAddr::V4(Ipv4Addr::from(a)), IpAddr::V4(Ipv4Addr::from(b)))),
        (any::<u128>(), any::<u128>())
            .prop_filter("not IPv4-mapped", |(a, b)| (a >> 32) != 0xffff
                && (b >> 32) != 0xffff)
            .prop_map(|(a, b)| (IpAddr::V6(Ipv6Addr::from(a)), IpAddr::V6(Ipv6Addr::from(b)))),
    ]
}

proptest! {
    #[test]
    fn ranges_parse_exactly_when_ordered((a, b) in same_family_pair()) {
        match parse_address(&format!("{a}-{b}")) {
            Ok(range) => {
                prop_assert!(a <= b);
                prop_assert_eq!((range.start(), range.end()), (a, b));
                prop_assert_eq!(range.len(), (to_u128(b) - to_u128(a)).saturating_add(1));
            }
            Err(AddressError { problem, .. }) => {
                prop_assert!(a > b);
                prop_assert_eq!(problem, AddressProblem::Inverted);
            }
        }
    }

    #[test]
    fn cidrs_cover_their_block(ip in any_ip(), prefix in 0u32..=128) {
        let bits = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = prefix % (bits + 1);
        let host = if prefix == bits { 0 } else { u128::MAX >> (128 - bits + prefix) };
        let network = to_u128(ip) & !host;
        let text = format!("{}/{prefix}", from_u128(IpFamily::of(ip), network).unwrap());
        let range = parse_address(&text).unwrap();
        prop_assert_eq!(to_u128(range.start()), network);
        prop_assert_eq!(to_u128(range.end()), network | host);
        prop_assert!(range.contains(ip));
        prop_assert_eq!(range.prefix_len(), Some(prefix as u8));
        prop_assert_eq!(range.to_string(), text);
        if network != to_u128(ip) {
            let with_host_bits = parse_address(&format!("{ip}/{prefix}"));
            prop_assert!(matches!(
                with_host_bits,
                Err(AddressError { problem: AddressProblem::HostBitsSet { .. }, .. })
            ), "{:?}", with_host_bits);
        }
    }

    #[test]
    fn display_round_trips((a, b) in same_family_pair()) {
        let (a, b) = if a <= b { (a, b) } else { (b, a) };
        let range = parse_address(&format!("{a}-{b}")).unwrap();
        prop_assert_eq!(parse_address(&range.to_string()).unwrap(), range);
    }

    #[test]
    fn contains_and_overlaps_agree((a, b) in same_family_pair(), (c, d) in same_family_pair(), probe in any_ip()) {
        let r1 = parse_address(&format!("{}-{}", a.min(b), a.max(b))).unwrap();
        let r2 = parse_address(&format!("{}-{}", c.min(d), c.max(d))).unwrap();
        prop_assert_eq!(r1.overlaps(&r2), r2.overlaps(&r1));
        if r1.contains(probe) && r2.contains(probe) {
            prop_assert!(r1.overlaps(&r2));
        }
        prop_assert!(r1.contains(r1.start()) && r1.contains(r1.end()));
        prop_assert_eq!(r1.nth(r1.len() - 1), Some(r1.end()));
    }
}

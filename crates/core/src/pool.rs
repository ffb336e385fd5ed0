//! Which pools' addresses collide, for the IPPool `Overlapping` condition.

use std::collections::BTreeMap;

use crate::address::{parse_address, AddressRange};

/// For each pool name, the other pools whose addresses overlap its own. Addresses that do not
/// parse take no part; validation reports them.
pub fn overlapping_pools<'a, A: AsRef<str> + 'a>(
    pools: impl IntoIterator<Item = (&'a str, &'a [A])>,
) -> BTreeMap<&'a str, Vec<&'a str>> {
    let parsed: Vec<(&str, Vec<AddressRange>)> = pools
        .into_iter()
        .map(|(name, addresses)| {
            let ranges = addresses
                .iter()
                .filter_map(|a| parse_address(a.as_ref()).ok())
                .collect();
            (name, ranges)
        })
        .collect();
    let mut overlaps: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (i, (name, ranges)) in parsed.iter().enumerate() {
        for (other, other_ranges) in parsed.iter().skip(i + 1) {
            let hit = ranges
                .iter()
                .any(|r| other_ranges.iter().any(|o| r.overlaps(o)));
            if hit {
                overlaps.entry(name).or_default().push(other);
                overlaps.entry(other).or_default().push(name);
            }
        }
    }
    for others in overlaps.values_mut() {
        others.sort_unstable();
        others.dedup();
    }
    overlaps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlaps_between_pools() {
        let a = ["198.18.0.200-198.18.0.250"];
        let b = ["198.18.0.0/24"];
        let c = ["fd00::/120", "198.18.1.0/24"];
        let d = ["fd00::ff-fd00::1ff", "bad"];
        let overlaps =
            overlapping_pools([("a", &a[..]), ("b", &b[..]), ("c", &c[..]), ("d", &d[..])]);
        assert_eq!(overlaps.get("a"), Some(&vec!["b"]));
        assert_eq!(overlaps.get("b"), Some(&vec!["a"]));
        assert_eq!(overlaps.get("c"), Some(&vec!["d"]));
        assert_eq!(overlaps.get("d"), Some(&vec!["c"]));
        let separate = overlapping_pools([("a", &a[..]), ("c", &c[..])]);
        assert!(separate.is_empty());
    }

    #[test]
    fn a_cidr_with_host_bits_takes_no_part() {
        let a = ["198.18.0.1/24"];
        let b = ["198.18.0.0/24"];
        assert!(overlapping_pools([("a", &a[..]), ("b", &b[..])]).is_empty());
    }
}

//! IPPools as plain data, validated once into address intervals.

use std::cmp::Ordering;
use std::net::IpAddr;

use berth_core::{
    is_buggy_ip, parse_address, to_u128, AddressRange, FieldErrors, IpFamily, LabelSelector, Labels,
};

use crate::error::Error;
use crate::types::u128_to_ip;

/// An IPPool's spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    pub name: String,
    /// CIDRs (`198.18.0.0/24`, `fd00::/64`) and ranges (`198.18.0.200-198.18.0.250`), both
    /// families allowed, read by [`berth_core::parse_address`]: a CIDR with host bits set is
    /// refused. A CIDR contributes every address in it, network and broadcast too.
    pub addresses: Vec<String>,
    /// Whether Services that name neither an address nor a pool may get addresses here.
    pub auto_assign: bool,
    /// Never hand out IPv4 addresses ending in `.0` or `.255` (old firmware drops them).
    pub avoid_buggy_ips: bool,
    /// `serviceAllocation.priority`: lower is tried first; pools without one come after
    /// every pool with one. Ties go by name.
    pub priority: Option<i32>,
    /// `serviceAllocation.namespaces`.
    pub namespaces: Vec<String>,
    /// `serviceAllocation.namespaceSelector(s)`: any one matching admits the namespace.
    pub namespace_selectors: Vec<LabelSelector>,
    /// `serviceAllocation.serviceSelector(s)`: any one matching admits the Service.
    pub service_selectors: Vec<LabelSelector>,
    /// Addresses the pool never hands out although `addresses` contain them: the cluster's
    /// own (Node addresses, the service CIDR, pod CIDRs, administrator-reserved ones). They
    /// count in neither capacity nor assigned, and an address held there is outside the pool.
    pub excluded: Vec<AddressRange>,
}

impl PoolSpec {
    /// A pool with auto-assignment on and no restriction.
    pub fn new(name: impl Into<String>, addresses: &[&str]) -> Self {
        Self {
            name: name.into(),
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            auto_assign: true,
            avoid_buggy_ips: false,
            priority: None,
            namespaces: Vec::new(),
            namespace_selectors: Vec::new(),
            service_selectors: Vec::new(),
            excluded: Vec::new(),
        }
    }

    /// Checks the spec without installing it, so a controller can report a bad pool on
    /// its own status and still install the others.
    pub fn validate(&self) -> Result<(), Error> {
        Pool::compile(self.clone()).map(|_| ())
    }

    /// Whether the pool's serviceAllocation admits a Service in `namespace` (with
    /// `namespace_labels`) carrying `service_labels`.
    pub fn admits(
        &self,
        namespace: &str,
        namespace_labels: &Labels,
        service_labels: &Labels,
    ) -> bool {
        let ns_restricted = !self.namespaces.is_empty() || !self.namespace_selectors.is_empty();
        let ns_ok = !ns_restricted
            || self.namespaces.iter().any(|n| n == namespace)
            || self
                .namespace_selectors
                .iter()
                .any(|s| s.matches(namespace_labels));
        let svc_ok = self.service_selectors.is_empty()
            || self
                .service_selectors
                .iter()
                .any(|s| s.matches(service_labels));
        ns_ok && svc_ok
    }
}

/// Assigned and available addresses of a pool, per family, for its status. Available is
/// capacity less assigned; both saturate at `u128::MAX` (an IPv6 /0 pool).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStatus {
    pub assigned_ipv4: u128,
    pub available_ipv4: u128,
    pub assigned_ipv6: u128,
    pub available_ipv6: u128,
}

/// A validated pool: merged, sorted, inclusive intervals per family.
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    pub(crate) spec: PoolSpec,
    pub(crate) ranges: [Vec<(u128, u128)>; 2],
    pub(crate) capacity: [u128; 2],
}

impl Pool {
    pub(crate) fn compile(spec: PoolSpec) -> Result<Self, Error> {
        let invalid = |reason: String| Error::InvalidPool {
            pool: spec.name.clone(),
            reason,
        };
        if spec.name.is_empty() {
            return Err(invalid("the pool has no name".into()));
        }
        if spec.addresses.is_empty() {
            return Err(invalid("the pool has no addresses".into()));
        }
        let mut problems = FieldErrors::default();
        for sel in spec
            .namespace_selectors
            .iter()
            .chain(&spec.service_selectors)
        {
            sel.validate("", &mut problems);
        }
        if !problems.is_empty() {
            return Err(invalid(problems.to_string()));
        }
        let mut ranges: [Vec<(u128, u128)>; 2] = [Vec::new(), Vec::new()];
        for text in &spec.addresses {
            let range = parse_address(text).map_err(|e| invalid(e.to_string()))?;
            ranges[range.family().index()].push((to_u128(range.start()), to_u128(range.end())));
        }
        let mut excluded: [Vec<(u128, u128)>; 2] = [Vec::new(), Vec::new()];
        for range in &spec.excluded {
            excluded[range.family().index()].push((to_u128(range.start()), to_u128(range.end())));
        }
        for (r, x) in ranges.iter_mut().zip(excluded) {
            *r = subtract(merge(std::mem::take(r)), &merge(x));
        }
        let capacity = [IpFamily::V4, IpFamily::V6].map(|f| {
            ranges[f.index()].iter().fold(0u128, |acc, &(lo, hi)| {
                let mut n = (hi - lo).saturating_add(1);
                if spec.avoid_buggy_ips && f == IpFamily::V4 {
                    n -= buggy_in(lo, hi);
                }
                acc.saturating_add(n)
            })
        });
        Ok(Self {
            spec,
            ranges,
            capacity,
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.spec.name
    }

    /// Whether the pool may hand out `value` of `family`: inside its intervals, and not a
    /// skipped `.0`/`.255`.
    pub(crate) fn contains_value(&self, family: IpFamily, value: u128) -> bool {
        if self.skips(family, value) {
            return false;
        }
        let ranges = &self.ranges[family.index()];
        let i = ranges.partition_point(|&(lo, _)| lo <= value);
        i > 0 && ranges[i - 1].1 >= value
    }

    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        self.contains_value(IpFamily::of(ip), to_u128(ip))
    }

    pub(crate) fn skips(&self, family: IpFamily, value: u128) -> bool {
        self.spec.avoid_buggy_ips && family == IpFamily::V4 && is_buggy(value)
    }

    /// The reference model's overlap test, over merged intervals; the allocator itself asks
    /// [`berth_core::overlapping_pools`], so the two are checked against each other.
    #[cfg(test)]
    pub(crate) fn overlaps(&self, other: &Pool) -> bool {
        (0..2).any(|f| {
            self.ranges[f]
                .iter()
                .any(|&(a, b)| other.ranges[f].iter().any(|&(c, d)| a <= d && c <= b))
        })
    }

    /// Choice order among pools: priority set before unset, lower first, then name.
    pub(crate) fn choice_order(a: &Pool, b: &Pool) -> Ordering {
        let key = |p: &Pool| {
            (
                p.spec.priority.is_none(),
                p.spec.priority,
                p.spec.name.clone(),
            )
        };
        key(a).cmp(&key(b))
    }
}

/// An IPv4 address (as a number) ending in `.0` or `.255`.
pub(crate) fn is_buggy(value: u128) -> bool {
    is_buggy_ip(u128_to_ip(IpFamily::V4, value))
}

/// How many values in `lo..=hi` end in `.0` or `.255`.
fn buggy_in(lo: u128, hi: u128) -> u128 {
    // Values <= n congruent to r modulo 256.
    let upto = |n: u128, r: u128| if n < r { 0 } else { (n - r) / 256 + 1 };
    let count = |r: u128| upto(hi, r) - lo.checked_sub(1).map_or(0, |l| upto(l, r));
    count(0) + count(255)
}

/// Sorts and merges overlapping or adjacent intervals.
fn merge(mut ranges: Vec<(u128, u128)>) -> Vec<(u128, u128)> {
    ranges.sort_unstable();
    let mut out: Vec<(u128, u128)> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        match out.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// The parts of sorted, merged `ranges` outside sorted, merged `holes`.
fn subtract(ranges: Vec<(u128, u128)>, holes: &[(u128, u128)]) -> Vec<(u128, u128)> {
    let mut out = Vec::with_capacity(ranges.len());
    for (mut lo, hi) in ranges {
        let mut whole = true;
        for &(h_lo, h_hi) in holes {
            if h_hi < lo {
                continue;
            }
            if h_lo > hi {
                break;
            }
            if h_lo > lo {
                out.push((lo, h_lo - 1));
            }
            if h_hi >= hi {
                whole = false;
                break;
            }
            lo = h_hi + 1;
        }
        if whole {
            out.push((lo, hi));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::{LabelSelectorRequirement, SelectorOperator};

    fn compile(addrs: &[&str], avoid: bool) -> Pool {
        let mut spec = PoolSpec::new("p", addrs);
        spec.avoid_buggy_ips = avoid;
        Pool::compile(spec).unwrap()
    }

    fn v(s: &str) -> u128 {
        to_u128(s.parse().unwrap())
    }

    fn excluded(addrs: &[&str], holes: &[&str], avoid: bool) -> Pool {
        let mut spec = PoolSpec::new("p", addrs);
        spec.avoid_buggy_ips = avoid;
        spec.excluded = holes.iter().map(|h| parse_address(h).unwrap()).collect();
        Pool::compile(spec).unwrap()
    }

    #[test]
    fn excluded_addresses_are_cut_out_of_the_pool() {
        // (pool, excluded, intervals left, capacity v4)
        type Row<'a> = (&'a [&'a str], &'a [&'a str], &'a [(&'a str, &'a str)], u128);
        let rows: &[Row] = &[
            // A node address in the middle splits the range.
            (
                &["198.18.0.0/24"],
                &["198.18.0.11/32"],
                &[
                    ("198.18.0.0", "198.18.0.10"),
                    ("198.18.0.12", "198.18.0.255"),
                ],
                255,
            ),
            // At either edge.
            (
                &["198.18.0.10-198.18.0.20"],
                &["198.18.0.10/32", "198.18.0.20/32"],
                &[("198.18.0.11", "198.18.0.19")],
                9,
            ),
            // A covering CIDR removes everything.
            (&["10.96.0.5-10.96.0.9"], &["10.96.0.0/16"], &[], 0),
            // Overlapping and adjacent holes, unsorted, one outside the pool.
            (
                &["198.18.0.0/28"],
                &[
                    "198.18.0.6-198.18.0.8",
                    "198.18.0.2-198.18.0.5",
                    "198.18.1.1/32",
                ],
                &[("198.18.0.0", "198.18.0.1"), ("198.18.0.9", "198.18.0.15")],
                9,
            ),
            // Two pool ranges, one hole spanning the gap between them.
            (
                &["198.18.0.1-198.18.0.5", "198.18.0.10-198.18.0.15"],
                &["198.18.0.4-198.18.0.11"],
                &[("198.18.0.1", "198.18.0.3"), ("198.18.0.12", "198.18.0.15")],
                7,
            ),
            // Another family's hole changes nothing.
            (
                &["198.18.0.1-198.18.0.3"],
                &["fd00::/64"],
                &[("198.18.0.1", "198.18.0.3")],
                3,
            ),
            // The top of the address space.
            (
                &["255.255.255.250-255.255.255.255"],
                &["255.255.255.255/32"],
                &[("255.255.255.250", "255.255.255.254")],
                5,
            ),
        ];
        for (pool, holes, left, cap) in rows {
            let p = excluded(pool, holes, false);
            let want: Vec<(u128, u128)> = left.iter().map(|(a, b)| (v(a), v(b))).collect();
            assert_eq!(p.ranges[0], want, "{pool:?} less {holes:?}");
            assert_eq!(p.capacity[0], *cap, "{pool:?} less {holes:?}");
            for h in holes.iter().map(|h| parse_address(h).unwrap()) {
                if let (Some(first), Some(last)) = (h.nth(0), h.nth(h.len() - 1)) {
                    assert!(
                        !p.contains(first) && !p.contains(last),
                        "{h} still in {pool:?}"
                    );
                }
            }
        }
        let v6 = excluded(&["fd00::/120"], &["fd00::1/128"], false);
        assert_eq!(v6.capacity[1], 255);
        assert!(!v6.contains("fd00::1".parse().unwrap()));
        // avoidBuggyIPs counts only what is left.
        let buggy = excluded(&["198.18.0.0/24"], &["198.18.0.255/32"], true);
        assert_eq!(buggy.capacity[0], 255 - 1);
    }

    #[test]
    fn parses_cidrs_and_ranges_of_both_families() {
        let p = compile(
            &[
                "198.18.0.0/24",
                "198.18.1.10 - 198.18.1.12",
                "fd00::/64",
                "fd01::1-fd01::2",
            ],
            false,
        );
        assert_eq!(p.capacity, [256 + 3, (1u128 << 64) + 2]);
        assert!(p.contains("198.18.0.0".parse().unwrap()));
        assert!(p.contains("198.18.1.12".parse().unwrap()));
        assert!(!p.contains("198.18.1.13".parse().unwrap()));
        assert!(p.contains("fd00::ffff".parse().unwrap()));
        assert!(!p.contains("fd01::3".parse().unwrap()));
    }

    #[test]
    fn merges_overlapping_and_adjacent_ranges() {
        let p = compile(
            &["10.0.0.0/25", "10.0.0.128/25", "10.0.0.10-10.0.0.20"],
            false,
        );
        assert_eq!(p.ranges[0], vec![(v("10.0.0.0"), v("10.0.0.255"))]);
        assert_eq!(p.capacity[0], 256);
    }

    #[test]
    fn avoid_buggy_ips_skips_every_dot_zero_and_dot_255() {
        let p = compile(&["10.0.0.250-10.0.2.5"], true);
        // .255 and .0 of 10.0.0, 10.0.1: 10.0.0.255, 10.0.1.0, 10.0.1.255, 10.0.2.0.
        assert_eq!(p.capacity[0], (v("10.0.2.5") - v("10.0.0.250") + 1) - 4);
        for s in ["10.0.0.255", "10.0.1.0", "10.0.1.255", "10.0.2.0"] {
            assert!(!p.contains(s.parse().unwrap()), "{s}");
        }
        assert!(p.contains("10.0.1.1".parse().unwrap()));
        // IPv6 is never skipped.
        let p6 = compile(&["fd00::/120"], true);
        assert_eq!(p6.capacity[1], 256);
        let p = compile(&["10.0.0.0/16"], true);
        assert_eq!(p.capacity[0], 65536 - 512);
    }

    #[test]
    fn buggy_count_matches_brute_force() {
        for (lo, hi) in [
            (0u128, 0u128),
            (0, 255),
            (1, 254),
            (255, 256),
            (250, 1000),
            (256, 511),
        ] {
            let brute = (lo..=hi).filter(|x| is_buggy(*x)).count() as u128;
            assert_eq!(buggy_in(lo, hi), brute, "{lo}..={hi}");
        }
    }

    #[test]
    fn rejects_bad_specs() {
        for addrs in [
            &["10.0.0.5-10.0.0.1"][..],
            &["10.0.0.1-fd00::1"],
            &["nonsense"],
            &["10.0.0.1"],
            &[],
        ] {
            assert!(PoolSpec::new("p", addrs).validate().is_err(), "{addrs:?}");
        }
        assert!(PoolSpec::new("", &["10.0.0.0/24"]).validate().is_err());
        let mut spec = PoolSpec::new("p", &["10.0.0.0/24"]);
        spec.service_selectors.push(LabelSelector {
            match_expressions: vec![LabelSelectorRequirement::new(
                "k",
                SelectorOperator::In,
                &[],
            )],
            ..Default::default()
        });
        let err = spec.validate().unwrap_err().to_string();
        assert!(
            err.starts_with("invalid IPPool \"p\": matchExpressions[0].values: Required value"),
            "{err}"
        );
    }

    #[test]
    fn cidrs_with_host_bits_set_are_refused() {
        for (addrs, network) in [
            (&["198.18.0.1/24"][..], "198.18.0.0/24"),
            (&["10.0.0.0/24", "10.0.1.7/31"], "10.0.1.6/31"),
            (&["fd00::1/64"], "fd00::/64"),
        ] {
            let err = PoolSpec::new("p", addrs)
                .validate()
                .unwrap_err()
                .to_string();
            assert!(err.contains(&format!("did you mean {network}?")), "{err}");
        }
        let exact = compile(&["198.18.0.0/24", "10.0.0.7/32"], false);
        assert_eq!(exact.capacity[0], 257);
    }

    #[test]
    fn admission_rules() {
        let labels = |pairs: &[(&str, &str)]| -> Labels {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let none = Labels::new();
        let mut spec = PoolSpec::new("p", &["10.0.0.0/24"]);
        assert!(spec.admits("any", &none, &none));
        spec.namespaces = vec!["team-a".into()];
        spec.namespace_selectors = vec![LabelSelector::from_labels([("tier", "gold")])];
        assert!(spec.admits("team-a", &none, &none));
        assert!(spec.admits("team-b", &labels(&[("tier", "gold")]), &none));
        assert!(!spec.admits("team-b", &none, &none));
        spec.service_selectors = vec![LabelSelector::from_labels([("expose", "public")])];
        assert!(!spec.admits("team-a", &none, &none));
        assert!(spec.admits("team-a", &none, &labels(&[("expose", "public")])));
    }

    #[test]
    fn choice_order_is_priority_then_unset_then_name() {
        let mk = |name: &str, prio: Option<i32>| {
            let mut s = PoolSpec::new(name, &["10.0.0.0/24"]);
            s.priority = prio;
            Pool::compile(s).unwrap()
        };
        let mut pools = [
            mk("z", None),
            mk("b", Some(10)),
            mk("a", None),
            mk("c", Some(-1)),
            mk("a2", Some(10)),
        ];
        pools.sort_by(Pool::choice_order);
        let names: Vec<&str> = pools.iter().map(Pool::name).collect();
        assert_eq!(names, vec!["c", "a2", "b", "a", "z"]);
    }

    #[test]
    fn overlap_detection() {
        let a = compile(&["10.0.0.0/24"], false);
        let b = compile(&["10.0.0.255-10.0.1.5"], false);
        let c = compile(&["10.0.1.0/24", "fd00::/64"], false);
        assert!(a.overlaps(&b));
        assert!(!a.overlaps(&c));
        assert!(b.overlaps(&c));
    }
}

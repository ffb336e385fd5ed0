//! Per pool and family: which of the pool's addresses are in use, by anyone.
//!
//! A pool's intervals are laid end to end as offsets `0..size`, so a pool of up to 4 Mi
//! addresses is a bitmap (the lowest free address is a few word scans away) and a larger
//! one a run-length set that costs only what is in use. Every address in use that the
//! pool may hand out is marked, whichever pool or request it came from, so the pool's
//! lowest free address is found without looking at any other pool.

use berth_core::IpFamily;

use crate::offsets::OffsetSet;
use crate::pool::Pool;

#[derive(Debug, Clone)]
pub(super) struct FreeIndex {
    /// Offset of the first address of each of the pool's intervals (same order).
    bases: Vec<u128>,
    /// Number of offsets (saturated for an IPv6 /0, whose offsets still fit).
    size: u128,
    used: OffsetSet,
}

impl FreeIndex {
    pub(super) fn new(pool: &Pool, family: IpFamily) -> Self {
        let mut bases = Vec::with_capacity(pool.ranges[family.index()].len());
        let mut size = 0u128;
        for &(lo, hi) in &pool.ranges[family.index()] {
            bases.push(size);
            size = size.saturating_add((hi - lo).saturating_add(1));
        }
        Self {
            bases,
            size,
            used: OffsetSet::for_size(size),
        }
    }

    /// The offset of `value` when the pool may hand it out. Intervals are disjoint and
    /// sorted, so an offset never exceeds `value - first address` and cannot overflow.
    pub(super) fn offset_of(&self, pool: &Pool, family: IpFamily, value: u128) -> Option<u128> {
        if !pool.contains_value(family, value) {
            return None;
        }
        let ranges = &pool.ranges[family.index()];
        let k = ranges
            .partition_point(|&(lo, _)| lo <= value)
            .checked_sub(1)?;
        Some(self.bases[k] + (value - ranges[k].0))
    }

    fn value_at(&self, pool: &Pool, family: IpFamily, offset: u128) -> Option<u128> {
        let k = self
            .bases
            .partition_point(|&b| b <= offset)
            .checked_sub(1)?;
        Some(pool.ranges[family.index()][k].0 + (offset - self.bases[k]))
    }

    /// Marks an address in use; `offset` comes from [`Self::offset_of`].
    pub(super) fn mark(&mut self, offset: u128, in_use: bool) {
        if in_use {
            self.used.insert(offset);
        } else {
            self.used.remove(offset);
        }
    }

    /// The lowest address of the pool that is free and not skipped (`avoidBuggyIPs`).
    pub(super) fn lowest_free(&self, pool: &Pool, family: IpFamily) -> Option<u128> {
        let last = self.size.checked_sub(1)?;
        let mut from = 0;
        loop {
            let offset = self.used.first_free_in(from, last)?;
            let value = self.value_at(pool, family, offset)?;
            if !pool.skips(family, value) {
                return Some(value);
            }
            from = offset.checked_add(1)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolSpec;
    use berth_core::to_u128;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn pool(addrs: &[&str], avoid: bool) -> Pool {
        let mut spec = PoolSpec::new("p", addrs);
        spec.avoid_buggy_ips = avoid;
        Pool::compile(spec).unwrap()
    }

    fn v(s: &str) -> u128 {
        to_u128(s.parse().unwrap())
    }

    #[test]
    fn lays_intervals_end_to_end() {
        let p = pool(&["10.0.0.10-10.0.0.12", "10.0.1.0/30"], false);
        let idx = FreeIndex::new(&p, IpFamily::V4);
        assert_eq!(idx.offset_of(&p, IpFamily::V4, v("10.0.0.10")), Some(0));
        assert_eq!(idx.offset_of(&p, IpFamily::V4, v("10.0.1.0")), Some(3));
        assert_eq!(idx.offset_of(&p, IpFamily::V4, v("10.0.1.3")), Some(6));
        assert_eq!(idx.offset_of(&p, IpFamily::V4, v("10.0.0.13")), None);
        assert_eq!(idx.value_at(&p, IpFamily::V4, 4), Some(v("10.0.1.1")));
    }

    #[test]
    fn huge_pools_are_sparse_and_do_not_overflow() {
        let p = pool(&["::/0"], false);
        let mut idx = FreeIndex::new(&p, IpFamily::V6);
        assert_eq!(idx.lowest_free(&p, IpFamily::V6), Some(0));
        let top = idx.offset_of(&p, IpFamily::V6, u128::MAX).unwrap();
        assert_eq!(top, u128::MAX);
        idx.mark(0, true);
        assert_eq!(idx.lowest_free(&p, IpFamily::V6), Some(1));
        let none = FreeIndex::new(&p, IpFamily::V4);
        assert_eq!(none.lowest_free(&p, IpFamily::V4), None);
    }

    proptest! {
        /// The lowest free address equals a brute-force scan of the pool's members, with
        /// and without `avoidBuggyIPs`, across intervals and /24 boundaries.
        #[test]
        fn lowest_free_matches_a_scan(
            avoid in any::<bool>(),
            ops in proptest::collection::vec((0u128..600, any::<bool>()), 0..300),
        ) {
            let p = pool(&["10.0.0.250-10.0.1.10", "10.0.2.254-10.0.3.1", "10.0.5.0/24"], avoid);
            let mut idx = FreeIndex::new(&p, IpFamily::V4);
            let base = v("10.0.0.240");
            let mut used = BTreeSet::new();
            for (n, on) in ops {
                let value = base + n;
                if let Some(off) = idx.offset_of(&p, IpFamily::V4, value) {
                    prop_assert_eq!(idx.value_at(&p, IpFamily::V4, off), Some(value));
                    idx.mark(off, on);
                    if on { used.insert(value); } else { used.remove(&value); }
                } else {
                    prop_assert!(!p.contains_value(IpFamily::V4, value));
                }
                let want = (base..base + 1500)
                    .find(|&x| p.contains_value(IpFamily::V4, x) && !used.contains(&x));
                prop_assert_eq!(idx.lowest_free(&p, IpFamily::V4), want);
            }
        }
    }
}

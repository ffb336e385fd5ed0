//! A set of `u128` values stored as maximal runs of consecutive members.
//!
//! Every allocator keeps its used addresses or ports here. Memory grows with the number of
//! runs, never with the size of the range, so an IPv6 /64 costs what its allocations cost,
//! and "first free value at or after x" is one ordered lookup instead of a scan.

use std::collections::BTreeMap;
use std::ops::Bound::{Included, Unbounded};

/// Members are kept as `start -> end` (inclusive) runs; two runs never touch, so the value
/// right after a run is always free.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RunSet {
    runs: BTreeMap<u128, u128>,
    len: u128,
}

impl RunSet {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Number of members.
    pub(crate) fn len(&self) -> u128 {
        self.len
    }

    /// The run containing `x`, as `(start, end)`.
    fn run_containing(&self, x: u128) -> Option<(u128, u128)> {
        self.runs
            .range((Unbounded, Included(x)))
            .next_back()
            .filter(|(_, &end)| end >= x)
            .map(|(&s, &e)| (s, e))
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, x: u128) -> bool {
        self.run_containing(x).is_some()
    }

    /// Adds `x`; returns false when it was already a member.
    pub(crate) fn insert(&mut self, x: u128) -> bool {
        let before = self.runs.range((Unbounded, Included(x))).next_back();
        let mut start = x;
        if let Some((&s, &e)) = before {
            if e >= x {
                return false;
            }
            if e.checked_add(1) == Some(x) {
                start = s;
            }
        }
        let mut end = x;
        if let Some(next) = x.checked_add(1) {
            if let Some(next_end) = self.runs.remove(&next) {
                end = next_end;
            }
        }
        self.runs.insert(start, end);
        self.len += 1;
        true
    }

    /// Removes `x`; returns false when it was not a member.
    pub(crate) fn remove(&mut self, x: u128) -> bool {
        let Some((start, end)) = self.run_containing(x) else {
            return false;
        };
        if start == x {
            self.runs.remove(&start);
        } else {
            // x > start, so x - 1 cannot underflow.
            self.runs.insert(start, x - 1);
        }
        if end > x {
            self.runs.insert(x + 1, end);
        }
        self.len -= 1;
        true
    }

    /// The smallest non-member in `lo..=hi`, if any.
    pub(crate) fn first_free_in(&self, lo: u128, hi: u128) -> Option<u128> {
        if lo > hi {
            return None;
        }
        let candidate = match self.run_containing(lo) {
            None => lo,
            Some((_, end)) => end.checked_add(1)?,
        };
        (candidate <= hi).then_some(candidate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn merges_and_splits_runs() {
        let mut s = RunSet::new();
        assert!(s.insert(5));
        assert!(s.insert(7));
        assert!(s.insert(6));
        assert!(!s.insert(6));
        assert_eq!(s.runs.len(), 1);
        assert_eq!(s.first_free_in(5, 100), Some(8));
        assert!(s.remove(6));
        assert!(!s.remove(6));
        assert_eq!(s.runs.len(), 2);
        assert_eq!(s.first_free_in(5, 100), Some(6));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn handles_the_ends_of_u128() {
        let mut s = RunSet::new();
        assert!(s.insert(u128::MAX));
        assert!(s.insert(u128::MAX - 1));
        assert_eq!(s.first_free_in(u128::MAX - 1, u128::MAX), None);
        assert!(s.insert(0));
        assert_eq!(s.first_free_in(0, 10), Some(1));
        assert_eq!(s.len(), 3);
        assert!(s.remove(u128::MAX));
        assert_eq!(s.first_free_in(u128::MAX - 1, u128::MAX), Some(u128::MAX));
    }

    #[test]
    fn empty_interval_has_nothing() {
        let s = RunSet::new();
        assert_eq!(s.first_free_in(3, 2), None);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8),
        Remove(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            any::<u8>().prop_map(Op::Insert),
            any::<u8>().prop_map(Op::Remove)
        ]
    }

    proptest! {
        #[test]
        fn behaves_like_a_set(ops in proptest::collection::vec(op(), 0..200), lo in 0u8..=255, hi in 0u8..=255) {
            let mut model = BTreeSet::new();
            let mut s = RunSet::new();
            for op in ops {
                match op {
                    Op::Insert(x) => prop_assert_eq!(s.insert(u128::from(x)), model.insert(u128::from(x))),
                    Op::Remove(x) => prop_assert_eq!(s.remove(u128::from(x)), model.remove(&u128::from(x))),
                }
                // Runs never touch and never overlap.
                let mut prev: Option<u128> = None;
                for (&a, &b) in &s.runs {
                    prop_assert!(a <= b);
                    if let Some(p) = prev { prop_assert!(a > p + 1); }
                    prev = Some(b);
                }
            }
            let (lo, hi) = (u128::from(lo), u128::from(hi));
            prop_assert_eq!(s.len(), model.len() as u128);
            let want_free = (lo..=hi).find(|x| !model.contains(x));
            prop_assert_eq!(s.first_free_in(lo, hi), want_free);
            for x in 0u128..=256 { prop_assert_eq!(s.contains(x), model.contains(&x)); }
        }
    }
}

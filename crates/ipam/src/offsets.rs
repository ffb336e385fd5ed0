//! The used-offset set of one range: a two-level bitmap for ranges up to
//! [`DENSE_MAX`] values (every NodePort range, ClusterIP CIDRs up to a /10 or an IPv6
//! /106), run-length [`RunSet`] beyond, so a huge IPv6 range costs only what is allocated.

use crate::hash::FxHashMap;
use crate::runset::RunSet;

/// Largest range kept as a bitmap: 512 KiB of bits.
pub(crate) const DENSE_MAX: u128 = 1 << 22;

#[derive(Debug, Clone)]
pub(crate) enum OffsetSet {
    Dense(Bitmap),
    Sparse(RunSet),
}

impl OffsetSet {
    /// A set for offsets `0..size`.
    pub(crate) fn for_size(size: u128) -> Self {
        if size <= DENSE_MAX {
            Self::Dense(Bitmap::new(size as usize))
        } else {
            Self::Sparse(RunSet::new())
        }
    }

    pub(crate) fn len(&self) -> u128 {
        match self {
            Self::Dense(b) => b.len as u128,
            Self::Sparse(r) => r.len(),
        }
    }

    /// Adds `x` (which must be below the size); false when already present.
    pub(crate) fn insert(&mut self, x: u128) -> bool {
        match self {
            Self::Dense(b) => b.insert(x as usize),
            Self::Sparse(r) => r.insert(x),
        }
    }

    pub(crate) fn remove(&mut self, x: u128) -> bool {
        match self {
            Self::Dense(b) => b.remove(x as usize),
            Self::Sparse(r) => r.remove(x),
        }
    }

    /// The smallest absent offset in `lo..=hi`.
    pub(crate) fn first_free_in(&self, lo: u128, hi: u128) -> Option<u128> {
        match self {
            Self::Dense(b) => {
                let size = b.size as u128;
                if lo >= size || lo > hi {
                    return None;
                }
                b.first_free_in(lo as usize, hi.min(size - 1) as usize)
                    .map(|x| x as u128)
            }
            Self::Sparse(r) => r.first_free_in(lo, hi),
        }
    }
}

/// A bitmap with a summary bit per word that is set when the word is full, so the next
/// free bit is found in O(size / 4096) even when everything before it is taken.
#[derive(Debug, Clone)]
pub(crate) struct Bitmap {
    words: Vec<u64>,
    full: Vec<u64>,
    size: usize,
    len: usize,
}

impl Bitmap {
    fn new(size: usize) -> Self {
        let nwords = size.div_ceil(64);
        Self {
            words: vec![0; nwords],
            full: vec![0; nwords.div_ceil(64)],
            size,
            len: 0,
        }
    }

    fn insert(&mut self, x: usize) -> bool {
        let (w, bit) = (x / 64, 1u64 << (x % 64));
        let Some(word) = self.words.get_mut(w) else {
            return false;
        };
        if *word & bit != 0 || x >= self.size {
            return false;
        }
        *word |= bit;
        if *word == u64::MAX {
            self.full[w / 64] |= 1 << (w % 64);
        }
        self.len += 1;
        true
    }

    fn remove(&mut self, x: usize) -> bool {
        let (w, bit) = (x / 64, 1u64 << (x % 64));
        let Some(word) = self.words.get_mut(w) else {
            return false;
        };
        if *word & bit == 0 {
            return false;
        }
        *word &= !bit;
        self.full[w / 64] &= !(1 << (w % 64));
        self.len -= 1;
        true
    }

    /// Bits at or past `size` never count.
    fn first_free_in(&self, lo: usize, hi: usize) -> Option<usize> {
        let hi = hi.min(self.size.checked_sub(1)?);
        if lo > hi {
            return None;
        }
        let w = lo / 64;
        let bits = !self.words[w] & (u64::MAX << (lo % 64));
        let found = if bits != 0 {
            w * 64 + bits.trailing_zeros() as usize
        } else {
            let idx = self.next_non_full_word(w + 1)?;
            idx * 64 + (!self.words[idx]).trailing_zeros() as usize
        };
        (found <= hi).then_some(found)
    }

    fn next_non_full_word(&self, from: usize) -> Option<usize> {
        let mut s = from / 64;
        let mut mask = u64::MAX.checked_shl((from % 64) as u32).unwrap_or(0);
        while s < self.full.len() {
            let free = !self.full[s] & mask;
            if free != 0 {
                let idx = s * 64 + free.trailing_zeros() as usize;
                return (idx < self.words.len()).then_some(idx);
            }
            s += 1;
            mask = u64::MAX;
        }
        None
    }
}

/// Ranges up to this size keep their owners' ids in a vector indexed by offset (4 bytes
/// per address: 4 MiB for a /12); larger ones in a map of the offsets in use.
pub(crate) const DENSE_OWNERS_MAX: u128 = 1 << 20;

/// No owner at this offset (ids are dense from 0, so the largest is never handed out).
const VACANT: u32 = u32::MAX;

/// Who (by owner id) holds each used offset of one range.
#[derive(Debug, Clone)]
pub(crate) enum OwnerIndex {
    Dense(Vec<u32>),
    Sparse(FxHashMap<u128, u32>),
}

impl OwnerIndex {
    pub(crate) fn for_size(size: u128) -> Self {
        if size <= DENSE_OWNERS_MAX {
            Self::Dense(vec![VACANT; size as usize])
        } else {
            Self::Sparse(FxHashMap::default())
        }
    }

    pub(crate) fn get(&self, offset: u128) -> Option<u32> {
        match self {
            Self::Dense(v) => v
                .get(usize::try_from(offset).ok()?)
                .copied()
                .filter(|&id| id != VACANT),
            Self::Sparse(m) => m.get(&offset).copied(),
        }
    }

    pub(crate) fn set(&mut self, offset: u128, owner: u32) {
        match self {
            Self::Dense(v) => {
                if let Some(slot) = usize::try_from(offset).ok().and_then(|o| v.get_mut(o)) {
                    *slot = owner;
                }
            }
            Self::Sparse(m) => {
                m.insert(offset, owner);
            }
        }
    }

    pub(crate) fn take(&mut self, offset: u128) -> Option<u32> {
        match self {
            Self::Dense(v) => {
                let slot = v.get_mut(usize::try_from(offset).ok()?)?;
                Some(std::mem::replace(slot, VACANT)).filter(|&id| id != VACANT)
            }
            Self::Sparse(m) => m.remove(&offset),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn owner_index_dense_and_sparse() {
        for mut idx in [OwnerIndex::for_size(100), OwnerIndex::for_size(1 << 40)] {
            assert!(idx.get(7).is_none());
            idx.set(7, 3);
            assert_eq!(idx.get(7), Some(3));
            assert_eq!(idx.take(7), Some(3));
            assert!(idx.take(7).is_none());
            assert!(idx.get(1 << 41).is_none());
        }
    }

    #[test]
    fn chooses_representation_by_size() {
        assert!(matches!(OffsetSet::for_size(65534), OffsetSet::Dense(_)));
        assert!(matches!(OffsetSet::for_size(1 << 64), OffsetSet::Sparse(_)));
    }

    #[test]
    fn full_words_are_skipped_through_the_summary() {
        let mut s = OffsetSet::for_size(10_000);
        for x in 0..9_000 {
            assert!(s.insert(x));
        }
        assert_eq!(s.first_free_in(0, 9_999), Some(9_000));
        assert!(s.remove(4_321));
        assert_eq!(s.first_free_in(0, 9_999), Some(4_321));
        assert_eq!(s.first_free_in(4_322, 9_999), Some(9_000));
        assert_eq!(s.first_free_in(4_322, 8_999), None);
        assert_eq!(s.len(), 8_999);
    }

    #[test]
    fn never_reports_past_the_size() {
        let mut s = OffsetSet::for_size(70);
        for x in 0..70 {
            s.insert(x);
        }
        assert!(!s.insert(70));
        assert_eq!(s.first_free_in(0, 1_000), None);
        assert_eq!(s.first_free_in(80, 90), None);
        let empty = OffsetSet::for_size(0);
        assert_eq!(empty.first_free_in(0, 0), None);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16),
        Remove(u16),
    }

    proptest! {
        #[test]
        fn dense_and_sparse_agree_with_a_model(
            size in 1u16..5000,
            ops in proptest::collection::vec(prop_oneof![any::<u16>().prop_map(Op::Insert), any::<u16>().prop_map(Op::Remove)], 0..400),
            fill in 0u16..5000,
            lo in 0u16..5100,
            hi in 0u16..5100,
        ) {
            let mut dense = OffsetSet::for_size(u128::from(size));
            let mut sparse = OffsetSet::Sparse(RunSet::new());
            let mut model = BTreeSet::new();
            for x in 0..fill.min(size) {
                dense.insert(u128::from(x));
                sparse.insert(u128::from(x));
                model.insert(x);
            }
            for op in ops {
                match op {
                    Op::Insert(x) if x < size => {
                        let want = model.insert(x);
                        prop_assert_eq!(dense.insert(u128::from(x)), want);
                        prop_assert_eq!(sparse.insert(u128::from(x)), want);
                    }
                    Op::Insert(_) => {}
                    Op::Remove(x) => {
                        let want = model.remove(&x);
                        prop_assert_eq!(dense.remove(u128::from(x)), want);
                        prop_assert_eq!(sparse.remove(u128::from(x)), want);
                    }
                }
            }
            prop_assert_eq!(dense.len(), model.len() as u128);
            let want = (lo..=hi.min(size - 1)).find(|x| !model.contains(x)).map(u128::from);
            prop_assert_eq!(dense.first_free_in(u128::from(lo), u128::from(hi)), want);
            let sparse_hi = u128::from(hi.min(size - 1));
            if u128::from(lo) <= sparse_hi {
                prop_assert_eq!(sparse.first_free_in(u128::from(lo), sparse_hi), want);
            }
        }
    }
}

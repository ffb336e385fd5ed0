//! Who holds each address in use, for one family.
//!
//! Addresses are handed out lowest first, so the ones in use cluster. They are kept in
//! pages of 16 consecutive addresses, one owner id per address inline (a page is one
//! cache line), so a pool's holders take a few hundred KiB and stay in cache where a map
//! entry per address would not. An address with several holders (sharing) points to a
//! side map; that is rare.

use crate::hash::FxHashMap;

const PAGE_BITS: u32 = 4;
const PAGE_MASK: u128 = (1 << PAGE_BITS) - 1;
const VACANT: u32 = u32::MAX;
/// The holders are in `HolderMap::many`. Owner ids never reach these two values: each id
/// is a live slot, and that many slots cannot fit in memory.
const SHARED: u32 = u32::MAX - 1;

type Page = [u32; 1 << PAGE_BITS];

#[derive(Debug, Clone, Default)]
pub(super) struct HolderMap {
    pages: FxHashMap<u128, Page>,
    /// Holders of shared addresses, sorted by owner key; two or more.
    many: FxHashMap<u128, Box<[u32]>>,
    len: u128,
}

fn split(value: u128) -> (u128, usize) {
    (value >> PAGE_BITS, (value & PAGE_MASK) as usize)
}

impl HolderMap {
    /// Addresses with at least one holder.
    pub(super) fn len(&self) -> u128 {
        self.len
    }

    /// The holders of `value`, sorted by owner key (empty when free).
    pub(super) fn get(&self, value: u128) -> &[u32] {
        let (page, slot) = split(value);
        let Some(cell) = self.pages.get(&page).map(|p| &p[slot]) else {
            return &[];
        };
        match *cell {
            VACANT => &[],
            SHARED => self.many.get(&value).map_or(&[], |ids| &ids[..]),
            _ => std::slice::from_ref(cell),
        }
    }

    /// Adds `id` to the holders of `value`, keeping them sorted by `less`; returns whether
    /// the address was free before.
    pub(super) fn insert(&mut self, value: u128, id: u32, less: impl Fn(u32, u32) -> bool) -> bool {
        let (page, slot) = split(value);
        let cell = &mut self.pages.entry(page).or_insert([VACANT; 1 << PAGE_BITS])[slot];
        match *cell {
            VACANT => {
                *cell = id;
                self.len += 1;
                true
            }
            SHARED => {
                if let Some(ids) = self.many.get_mut(&value) {
                    let mut all = ids.to_vec();
                    all.insert(all.partition_point(|&x| less(x, id)), id);
                    *ids = all.into_boxed_slice();
                }
                false
            }
            first => {
                let both = if less(id, first) {
                    [id, first]
                } else {
                    [first, id]
                };
                *cell = SHARED;
                self.many.insert(value, Box::new(both));
                false
            }
        }
    }

    /// Removes `id` from the holders of `value`: `None` when it was not one, else whether
    /// the address is free now.
    pub(super) fn remove(&mut self, value: u128, id: u32) -> Option<bool> {
        let (page_no, slot) = split(value);
        let page = self.pages.get_mut(&page_no)?;
        match page[slot] {
            SHARED => {
                let ids = self.many.get_mut(&value)?;
                if !ids.contains(&id) {
                    return None;
                }
                let rest: Vec<u32> = ids.iter().copied().filter(|&x| x != id).collect();
                match rest[..] {
                    [only] => {
                        page[slot] = only;
                        self.many.remove(&value);
                    }
                    _ => *ids = rest.into_boxed_slice(),
                }
                Some(false)
            }
            x if x == id => {
                page[slot] = VACANT;
                if page.iter().all(|&c| c == VACANT) {
                    self.pages.remove(&page_no);
                }
                self.len -= 1;
                Some(true)
            }
            _ => None,
        }
    }

    /// Every address in use with its holders, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u128, &[u32])> + '_ {
        self.pages.iter().flat_map(move |(&page, cells)| {
            (0..cells.len()).filter_map(move |slot| {
                let value = (page << PAGE_BITS) | slot as u128;
                let ids = self.get(value);
                (!ids.is_empty()).then_some((value, ids))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// Agrees with a map of sorted holder lists, across page boundaries and the ends
        /// of the value space.
        #[test]
        fn behaves_like_a_map_of_sorted_lists(
            ops in proptest::collection::vec((any::<bool>(), 0u8..40, 0u32..5), 0..300),
        ) {
            let values = |n: u8| if n < 36 { u128::from(n) + 10 } else { u128::MAX - u128::from(n - 36) };
            let mut m = HolderMap::default();
            let mut model: BTreeMap<u128, Vec<u32>> = BTreeMap::new();
            for (add, n, id) in ops {
                let v = values(n);
                let list = model.entry(v).or_default();
                if add {
                    if list.contains(&id) { continue; }
                    let was_free = list.is_empty();
                    // Owner keys order like ids here, reversed, to check `less` is used.
                    list.push(id);
                    list.sort_unstable_by(|a, b| b.cmp(a));
                    prop_assert_eq!(m.insert(v, id, |a, b| a > b), was_free);
                } else {
                    let want = list.contains(&id).then(|| { list.retain(|&x| x != id); list.is_empty() });
                    prop_assert_eq!(m.remove(v, id), want);
                }
                model.retain(|_, l| !l.is_empty());
                prop_assert_eq!(m.len(), model.len() as u128);
                for n in 0u8..40 {
                    let v = values(n);
                    prop_assert_eq!(m.get(v), model.get(&v).map_or(&[][..], |l| &l[..]));
                }
                let mut all: Vec<(u128, Vec<u32>)> = m.iter().map(|(v, ids)| (v, ids.to_vec())).collect();
                all.sort();
                prop_assert_eq!(all, model.iter().map(|(v, l)| (*v, l.clone())).collect::<Vec<_>>());
            }
            prop_assert!(model.is_empty() || !m.pages.is_empty());
            if model.is_empty() { prop_assert!(m.pages.is_empty() && m.many.is_empty()); }
        }
    }
}

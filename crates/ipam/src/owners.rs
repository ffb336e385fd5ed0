//! Owners interned to dense `u32` ids.
//!
//! Owner keys (namespace and name strings) are hashed and compared once per call, at the
//! API boundary; everything behind it (who holds an address, an owner's addresses) is
//! indexed by id, so releasing by address or following a holder never touches the key's
//! strings again. The table stores only ids (4 bytes a bucket) and compares keys in the
//! slot vector, so each key is stored once.
//!
//! A removed owner's slot is reused by the next new owner (most recently freed first),
//! keeping its buffers: re-interning into it clones the key with `clone_from`, which
//! reuses the old key's allocations where the key type supports it.

use std::hash::BuildHasher;

use hashbrown::HashTable;

use crate::hash::FxBuild;

/// Per-owner data that can be cleared in place for a slot's next occupant.
pub(crate) trait Reset {
    fn reset(&mut self);
}

impl<T> Reset for [Option<T>; 2] {
    fn reset(&mut self) {
        *self = [None, None];
    }
}

#[derive(Debug, Clone)]
struct Slot<K, V> {
    hash: u64,
    live: bool,
    key: K,
    data: V,
}

/// Proof of a failed [`Owners::lookup`], carrying the key's hash.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Absent {
    hash: u64,
}

/// Live owners by id, with their data `V`.
#[derive(Debug, Clone)]
pub(crate) struct Owners<K, V> {
    table: HashTable<u32>,
    slots: Vec<Slot<K, V>>,
    /// Ids of dead slots, most recently freed last.
    free: Vec<u32>,
}

impl<K, V> Default for Owners<K, V> {
    fn default() -> Self {
        Self {
            table: HashTable::new(),
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<K: Clone + Eq + std::hash::Hash, V: Default + Reset> Owners<K, V> {
    fn hash(key: &K) -> u64 {
        FxBuild::default().hash_one(key)
    }

    /// The id of a live owner.
    pub(crate) fn find(&self, key: &K) -> Option<u32> {
        self.lookup(key).ok()
    }

    /// The id of a live owner, or what [`Self::insert`] needs to add it.
    pub(crate) fn lookup(&self, key: &K) -> Result<u32, Absent> {
        let hash = Self::hash(key);
        let slots = &self.slots;
        self.table
            .find(hash, |&id| slots[id as usize].key == *key)
            .copied()
            .ok_or(Absent { hash })
    }

    /// The id of `key`, adding it (with reset data) when it is not live.
    pub(crate) fn intern(&mut self, key: &K) -> u32 {
        match self.lookup(key) {
            Ok(id) => id,
            Err(absent) => self.insert(key, absent),
        }
    }

    /// Adds `key`, which [`Self::lookup`] just reported absent (no owner was added in
    /// between), with reset data; saves hashing and probing for it again.
    pub(crate) fn insert(&mut self, key: &K, absent: Absent) -> u32 {
        let hash = absent.hash;
        let id = match self.free.pop() {
            Some(id) => {
                let slot = &mut self.slots[id as usize];
                slot.hash = hash;
                slot.live = true;
                slot.key.clone_from(key);
                slot.data.reset();
                id
            }
            None => {
                // More than u32::MAX live owners cannot fit in memory anyway.
                let id = self.slots.len() as u32;
                self.slots.push(Slot {
                    hash,
                    live: true,
                    key: key.clone(),
                    data: V::default(),
                });
                id
            }
        };
        let slots = &self.slots;
        self.table
            .insert_unique(hash, id, |&x| slots[x as usize].hash);
        id
    }

    /// Forgets a live owner; its id may be handed to the next new owner.
    pub(crate) fn remove(&mut self, id: u32) {
        let Some(slot) = self.slots.get_mut(id as usize).filter(|s| s.live) else {
            return;
        };
        slot.live = false;
        if let Ok(entry) = self.table.find_entry(slot.hash, |&x| x == id) {
            entry.remove();
        }
        self.free.push(id);
    }

    pub(crate) fn key(&self, id: u32) -> &K {
        &self.slots[id as usize].key
    }

    pub(crate) fn get(&self, id: u32) -> &V {
        &self.slots[id as usize].data
    }

    pub(crate) fn get_mut(&mut self, id: u32) -> &mut V {
        &mut self.slots[id as usize].data
    }

    /// Live owners' ids.
    pub(crate) fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.table.iter().copied()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use std::hash::{Hash, Hasher};

    /// A key whose hash keeps only two bits, so most keys collide.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Colliding(u16);

    impl Hash for Colliding {
        fn hash<H: Hasher>(&self, state: &mut H) {
            state.write_u8((self.0 & 3) as u8);
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Intern(u16),
        Remove(u16),
        Set(u16, u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u16..40).prop_map(Op::Intern),
            (0u16..40).prop_map(Op::Remove),
            (0u16..40, any::<u8>()).prop_map(|(k, v)| Op::Set(k, v)),
        ]
    }

    proptest! {
        #[test]
        fn behaves_like_a_map_of_live_keys(ops in proptest::collection::vec(op(), 0..300)) {
            let mut owners: Owners<Colliding, [Option<u8>; 2]> = Owners::default();
            let mut model: BTreeMap<u16, Option<u8>> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Intern(k) => {
                        let id = owners.intern(&Colliding(k));
                        prop_assert_eq!(owners.key(id), &Colliding(k));
                        model.entry(k).or_insert(None);
                    }
                    Op::Remove(k) => {
                        if let Some(id) = owners.find(&Colliding(k)) {
                            owners.remove(id);
                            owners.remove(id);
                        }
                        model.remove(&k);
                    }
                    Op::Set(k, v) => {
                        if let Some(id) = owners.find(&Colliding(k)) {
                            owners.get_mut(id)[0] = Some(v);
                            model.insert(k, Some(v));
                        }
                    }
                }
                prop_assert_eq!(owners.len(), model.len());
                for k in 0u16..40 {
                    let id = owners.find(&Colliding(k));
                    prop_assert_eq!(id.is_some(), model.contains_key(&k));
                    if let Some(id) = id {
                        // A reused slot never shows its last occupant's data.
                        prop_assert_eq!(owners.get(id)[0], model[&k]);
                        prop_assert_eq!(owners.key(id), &Colliding(k));
                    }
                }
                let mut ids: Vec<u32> = owners.ids().collect();
                ids.sort_unstable();
                ids.dedup();
                prop_assert_eq!(ids.len(), model.len());
            }
        }
    }

    #[test]
    fn freed_ids_are_reused_most_recent_first() {
        let mut owners: Owners<String, [Option<u8>; 2]> = Owners::default();
        let a = owners.intern(&"a".to_string());
        let b = owners.intern(&"b".to_string());
        assert_eq!(owners.intern(&"a".to_string()), a);
        owners.remove(a);
        owners.remove(b);
        assert_eq!(owners.find(&"a".to_string()), None);
        assert_eq!(owners.intern(&"c".to_string()), b);
        assert_eq!(owners.intern(&"d".to_string()), a);
        assert_eq!(owners.key(a), "d");
    }
}

//! The cached pods: facts in a slab, so that the label index holds 4-byte ids, and a name index
//! over the slab that holds ids too. The names live in the facts; a map keyed by owned names
//! would cost two more allocations per pod (a tenth of the controller's memory at 100,000 pods).

use std::hash::{BuildHasher, RandomState};

use hashbrown::HashTable;

use super::pod_facts::PodFacts;

#[derive(Debug, Default)]
pub(crate) struct PodSlab {
    slots: Vec<Option<PodFacts>>,
    free: Vec<u32>,
    /// Slab ids, hashed by the namespace and name of the pod in the slot.
    ids: HashTable<u32>,
    hasher: RandomState,
}

/// The pod in slot `id`, if any.
fn slot(slots: &[Option<PodFacts>], id: u32) -> Option<&PodFacts> {
    slots.get(id as usize).and_then(Option::as_ref)
}

fn is(slots: &[Option<PodFacts>], id: u32, namespace: &str, name: &str) -> bool {
    slot(slots, id).is_some_and(|p| &*p.namespace == namespace && &*p.name == name)
}

fn hash(hasher: &RandomState, namespace: &str, name: &str) -> u64 {
    hasher.hash_one((namespace, name))
}

impl PodSlab {
    /// Empties the slab and makes room for exactly `pods` pods: doubling as they come would
    /// leave up to half of it unused.
    pub(crate) fn reset(&mut self, pods: usize) {
        self.slots = Vec::with_capacity(pods);
        self.free = Vec::new();
        self.ids = HashTable::with_capacity(pods);
    }

    pub(crate) fn get(&self, id: u32) -> Option<&PodFacts> {
        slot(&self.slots, id)
    }

    /// The pod of that namespace and name.
    pub(crate) fn find(&self, namespace: &str, name: &str) -> Option<&PodFacts> {
        let hash = hash(&self.hasher, namespace, name);
        let id = self
            .ids
            .find(hash, |&id| is(&self.slots, id, namespace, name))?;
        self.get(*id)
    }

    /// Adds a pod whose name is not in the slab (remove the old one first); returns its id.
    pub(crate) fn insert(&mut self, facts: PodFacts) -> u32 {
        let hash = hash(&self.hasher, &facts.namespace, &facts.name);
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.slots.push(None);
                // More than 4 billion pods would not fit in memory first.
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        if let Some(slot) = self.slots.get_mut(id as usize) {
            *slot = Some(facts);
        }
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.ids.insert_unique(hash, id, |&other| {
            slot(slots, other).map_or(0, |p| self::hash(hasher, &p.namespace, &p.name))
        });
        id
    }

    /// Takes the pod of that namespace and name out, with the id it had.
    pub(crate) fn remove(&mut self, namespace: &str, name: &str) -> Option<(u32, PodFacts)> {
        let hash = hash(&self.hasher, namespace, name);
        let slots = &self.slots;
        let entry = self
            .ids
            .find_entry(hash, |&id| is(slots, id, namespace, name))
            .ok()?;
        let (id, _) = entry.remove();
        let facts = self.slots.get_mut(id as usize).and_then(Option::take)?;
        self.free.push(id);
        Some((id, facts))
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoints::intern::Interner;
    use crate::endpoints::slim_pod::SlimPod;
    use serde_json::json;

    fn mk_pod(ns: &str, name: &str, ip: &str) -> PodFacts {
        let pod: SlimPod = serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name},
            "status": {"podIP": ip}
        }))
        .unwrap();
        PodFacts::from_pod(&pod, &mut Interner::default())
    }

    #[test]
    fn finds_by_namespace_and_name_and_reuses_freed_ids() {
        let mut slab = PodSlab::default();
        slab.reset(2);
        let a = slab.insert(mk_pod("shop", "a", "10.244.0.1"));
        let b = slab.insert(mk_pod("shop", "b", "10.244.0.2"));
        let c = slab.insert(mk_pod("other", "a", "10.244.0.3"));
        assert_eq!((a, b, c), (0, 1, 2));
        assert_eq!(slab.len(), 3);
        assert_eq!(
            slab.find("shop", "a"),
            Some(&mk_pod("shop", "a", "10.244.0.1"))
        );
        assert_eq!(
            slab.find("other", "a"),
            Some(&mk_pod("other", "a", "10.244.0.3"))
        );
        assert_eq!(slab.find("shop", "c"), None);
        // A namespace and name that concatenate alike are still different pods.
        assert_eq!(slab.find("sho", "pa"), None);

        let (id, facts) = slab.remove("shop", "a").unwrap();
        assert_eq!((id, facts), (0, mk_pod("shop", "a", "10.244.0.1")));
        assert_eq!(slab.remove("shop", "a"), None);
        assert_eq!(slab.find("shop", "a"), None);
        assert_eq!(slab.get(0), None);
        assert_eq!(slab.len(), 2);
        // The freed slot is taken again.
        assert_eq!(slab.insert(mk_pod("shop", "d", "10.244.0.4")), 0);
        assert_eq!(slab.get(0), Some(&mk_pod("shop", "d", "10.244.0.4")));
        assert_eq!(
            slab.find("shop", "b"),
            Some(&mk_pod("shop", "b", "10.244.0.2"))
        );

        slab.reset(0);
        assert_eq!(slab.len(), 0);
        assert_eq!(slab.find("shop", "b"), None);
    }

    #[test]
    fn many_pods_stay_findable_as_the_index_grows() {
        let mut slab = PodSlab::default();
        for i in 0..2_000 {
            slab.insert(mk_pod("ns", &format!("p{i}"), "10.244.0.1"));
        }
        for i in (0..2_000).step_by(2) {
            assert!(slab.remove("ns", &format!("p{i}")).is_some());
        }
        for i in 0..2_000 {
            assert_eq!(
                slab.find("ns", &format!("p{i}")).is_some(),
                i % 2 == 1,
                "p{i}"
            );
        }
    }
}

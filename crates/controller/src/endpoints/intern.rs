//! Shared copies of what repeats across a cluster's pods: strings (namespaces, node names, label
//! keys and values, phases; 100,000 pods name a few hundred distinct ones) and whole label and
//! port sets (every replica of a workload carries the same).

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;

/// A pod's labels, sorted by key.
pub(crate) type Labels = Arc<[(Arc<str>, Arc<str>)]>;

/// A pod's named container ports, in container order.
pub(crate) type Ports = Arc<[NamedPort]>;

/// A named container port; unnamed ports cannot be a Service's `targetPort` and are dropped.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct NamedPort {
    pub(super) name: Arc<str>,
    pub(super) number: i32,
    pub(super) protocol: Option<Arc<str>>,
}

/// Two names that travel together: an endpoint's node and zone, its pod's kind and namespace.
pub(crate) type Pair = (Option<Arc<str>>, Option<Arc<str>>);

/// One set of shared values, purged of those no one else holds as it grows.
#[derive(Debug)]
struct Shared<T: ?Sized> {
    values: HashSet<Arc<T>>,
    /// Size after the last purge: the next purge waits until the set has doubled.
    after_purge: usize,
}

impl<T: ?Sized> Default for Shared<T> {
    fn default() -> Self {
        Shared {
            values: HashSet::new(),
            after_purge: 0,
        }
    }
}

impl<T: ?Sized + Eq + Hash> Shared<T> {
    fn get<Q>(&mut self, value: &Q, make: impl FnOnce(&Q) -> Arc<T>) -> Arc<T>
    where
        Arc<T>: Borrow<Q>,
        Q: ?Sized + Eq + Hash,
    {
        if let Some(shared) = self.values.get(value) {
            return shared.clone();
        }
        if self.values.len() >= 2 * self.after_purge.max(1024) {
            self.purge();
        }
        let shared = make(value);
        self.values.insert(shared.clone());
        shared
    }

    /// Forgets values no one else holds any more (old pod-template hashes, deleted namespaces),
    /// so that churn does not grow the set forever.
    fn purge(&mut self) {
        self.values.retain(|s| Arc::strong_count(s) > 1);
        self.after_purge = self.values.len();
    }
}

#[derive(Debug, Default)]
pub(crate) struct Interner {
    strings: Shared<str>,
    label_sets: Shared<[(Arc<str>, Arc<str>)]>,
    port_sets: Shared<[NamedPort]>,
    pairs: Shared<Pair>,
}

impl Interner {
    pub(crate) fn intern(&mut self, s: &str) -> Arc<str> {
        self.strings.get(s, |s| Arc::from(s))
    }

    /// The shared copy of a label set (sorted by key), its keys and values shared too.
    pub(crate) fn intern_labels<'a>(
        &mut self,
        sorted: impl Iterator<Item = (&'a String, &'a String)>,
    ) -> Labels {
        let pairs: Vec<(Arc<str>, Arc<str>)> = sorted
            .map(|(k, v)| (self.intern(k), self.intern(v)))
            .collect();
        self.label_sets.get(pairs.as_slice(), |p| Arc::from(p))
    }

    /// The shared copy of a pod's named ports (every replica of a workload has the same).
    pub(crate) fn intern_ports(&mut self, ports: Vec<NamedPort>) -> Ports {
        self.port_sets.get(ports.as_slice(), |p| Arc::from(p))
    }

    /// The shared copy of a pair of names.
    pub(crate) fn intern_pair(&mut self, a: Option<&str>, b: Option<&str>) -> Arc<Pair> {
        let pair = (a.map(|a| self.intern(a)), b.map(|b| self.intern(b)));
        self.pairs.get(&pair, |p| Arc::new(p.clone()))
    }

    #[cfg(test)]
    fn purge(&mut self) {
        self.strings.purge();
        self.label_sets.purge();
        self.port_sets.purge();
        self.pairs.purge();
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.strings.values.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_strings_share_one_copy_until_no_one_holds_it() {
        let mut interner = Interner::default();
        let a = interner.intern("shop");
        let b = interner.intern("shop");
        assert!(Arc::ptr_eq(&a, &b));
        let c = interner.intern("web");
        assert_eq!(interner.len(), 2);
        drop((a, b));
        interner.purge();
        assert_eq!(interner.len(), 1);
        assert!(Arc::ptr_eq(&c, &interner.intern("web")));
    }

    #[test]
    fn churn_is_purged_as_it_grows() {
        let mut interner = Interner::default();
        let kept = interner.intern("kept");
        for i in 0..10_000 {
            let _ = interner.intern(&format!("hash-{i}"));
        }
        assert!(interner.len() <= 2048, "{}", interner.len());
        assert!(Arc::ptr_eq(&kept, &interner.intern("kept")));
    }

    #[test]
    fn equal_label_sets_share_one_copy() {
        let mut interner = Interner::default();
        let labels = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let web = labels(&[("app", "web"), ("hash", "5d8f7")]);
        let a = interner.intern_labels(web.iter().map(|(k, v)| (k, v)));
        let b = interner.intern_labels(web.iter().map(|(k, v)| (k, v)));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(&*a[0].0, "app");
        assert_eq!(&*a[1].1, "5d8f7");
        let db = labels(&[("app", "db"), ("hash", "5d8f7")]);
        let c = interner.intern_labels(db.iter().map(|(k, v)| (k, v)));
        assert!(!Arc::ptr_eq(&a, &c));
        // Values are shared across sets.
        assert!(Arc::ptr_eq(&a[1].1, &c[1].1));
        let none = interner.intern_labels(std::iter::empty());
        assert!(none.is_empty());
        drop((a, b));
        interner.purge();
        assert_eq!(interner.label_sets.values.len(), 2);
    }
}

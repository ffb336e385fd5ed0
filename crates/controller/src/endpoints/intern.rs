//! Shared copies of the strings that repeat across a cluster's pods: namespaces, node names,
//! label keys and values, phases. 100,000 pods name a few hundred distinct ones.

use std::collections::HashSet;
use std::sync::Arc;

#[derive(Debug, Default)]
pub(crate) struct Interner {
    strings: HashSet<Arc<str>>,
    /// Size after the last purge: the next purge waits until the set has doubled.
    after_purge: usize,
}

impl Interner {
    pub(crate) fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(shared) = self.strings.get(s) {
            return shared.clone();
        }
        if self.strings.len() >= 2 * self.after_purge.max(1024) {
            self.purge();
        }
        let shared: Arc<str> = Arc::from(s);
        self.strings.insert(shared.clone());
        shared
    }

    /// Forgets strings no one else holds any more (old pod-template hashes, deleted namespaces),
    /// so that churn does not grow the set forever.
    pub(crate) fn purge(&mut self) {
        self.strings.retain(|s| Arc::strong_count(s) > 1);
        self.after_purge = self.strings.len();
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.strings.len()
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
}

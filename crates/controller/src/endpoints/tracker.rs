//! Own writes the caches have not shown yet. A sync that reads a cache older than the controller's
//! last write would plan against the past: create a slice twice, or rewrite a slice with a stale
//! resourceVersion. So each write leaves an expectation, the watch events settle it, and a Service
//! with an open expectation waits (upstream's endpoint-slice tracker does the same job).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::key::ObjectKey;

/// What the cache must show about one object before its Service is synced again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// Written: the cached copy must be at least this resourceVersion.
    Version(u64),
    /// Deleted: the cache must no longer hold it.
    Gone,
}

/// Which object of a Service an expectation is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Target {
    Endpoints,
    Slice(String),
}

#[derive(Debug)]
struct Pending {
    wants: HashMap<Target, Want>,
    since: Instant,
}

/// Open expectations per Service.
#[derive(Debug)]
pub(crate) struct Expectations {
    pending: HashMap<ObjectKey, Pending>,
    /// After this long an expectation is dropped: a lost event must not block a Service forever.
    timeout: Duration,
}

/// resourceVersions are opaque to clients, but every API server in practice (etcd, the lab) uses
/// increasing integers; one that is not is taken as new enough.
fn parse_version(rv: Option<&str>) -> Option<u64> {
    rv.and_then(|v| v.parse().ok())
}

/// How a watch event relates to the expectations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Exactly the version the controller wrote: its Service needs no sync for it.
    OwnWrite,
    /// Anything else: someone (or something) else changed the object.
    Other,
}

impl Expectations {
    pub(crate) fn new(timeout: Duration) -> Self {
        Expectations {
            pending: HashMap::new(),
            timeout,
        }
    }

    /// Records a write. A write whose resourceVersion is unknown leaves nothing to wait for, and
    /// neither does one the cache already shows: its event can beat the write's response.
    /// `cached` is the cache's copy of the object: `None` when it holds none, else its version.
    pub(crate) fn expect(
        &mut self,
        service: &ObjectKey,
        target: Target,
        resource_version: Option<&str>,
        deleted: bool,
        cached: Option<Option<&str>>,
        now: Instant,
    ) {
        let shown = match (deleted, cached) {
            (true, None) => true,
            (true, Some(_)) | (false, None) => false,
            (false, Some(have)) => match (parse_version(have), parse_version(resource_version)) {
                (Some(have), Some(want)) => have >= want,
                _ => false,
            },
        };
        if shown {
            return;
        }
        let want = if deleted {
            Want::Gone
        } else {
            match parse_version(resource_version) {
                Some(v) => Want::Version(v),
                None => return,
            }
        };
        let pending = self
            .pending
            .entry(service.clone())
            .or_insert_with(|| Pending {
                wants: HashMap::new(),
                since: now,
            });
        pending.since = now;
        pending.wants.insert(target, want);
    }

    /// A watch event showed `target` at `resource_version` (`None`: deleted).
    pub(crate) fn observe(
        &mut self,
        service: &ObjectKey,
        target: &Target,
        resource_version: Option<&str>,
    ) -> Seen {
        let Some(pending) = self.pending.get_mut(service) else {
            return Seen::Other;
        };
        let Some(want) = pending.wants.get(target).copied() else {
            return Seen::Other;
        };
        let seen = match (want, resource_version) {
            (Want::Gone, None) => {
                pending.wants.remove(target);
                Seen::OwnWrite
            }
            // Deleted by someone else after our write: nothing more will come for this version.
            (Want::Version(_), None) => {
                pending.wants.remove(target);
                Seen::Other
            }
            (Want::Version(v), Some(rv)) => match parse_version(Some(rv)) {
                Some(have) if have < v => Seen::Other,
                Some(have) => {
                    pending.wants.remove(target);
                    if have == v {
                        Seen::OwnWrite
                    } else {
                        Seen::Other
                    }
                }
                None => {
                    pending.wants.remove(target);
                    Seen::Other
                }
            },
            // Still there (an update on its way out, or recreated): keep waiting for the delete.
            (Want::Gone, Some(_)) => Seen::Other,
        };
        if pending.wants.is_empty() {
            self.pending.remove(service);
        }
        seen
    }

    /// Whether the caches show every write made for `service`; expired expectations are dropped.
    pub(crate) fn is_settled(&mut self, service: &ObjectKey, now: Instant) -> bool {
        match self.pending.get(service) {
            None => true,
            Some(p) if now.duration_since(p.since) >= self.timeout => {
                self.pending.remove(service);
                true
            }
            Some(_) => false,
        }
    }

    /// A re-list replaced a cache wholesale: what it shows is current, so nothing is awaited.
    pub(crate) fn clear(&mut self) {
        self.pending.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ObjectKey {
        ObjectKey::new("ns", "web")
    }

    fn slice(name: &str) -> Target {
        Target::Slice(name.to_owned())
    }

    #[test]
    fn a_write_blocks_until_its_version_is_seen() {
        let now = Instant::now();
        let mut e = Expectations::new(Duration::from_secs(10));
        assert!(e.is_settled(&key(), now));
        e.expect(&key(), slice("web-1"), Some("10"), false, Some(None), now);
        e.expect(
            &key(),
            Target::Endpoints,
            Some("11"),
            false,
            Some(None),
            now,
        );
        assert!(!e.is_settled(&key(), now));
        assert_eq!(e.observe(&key(), &slice("web-1"), Some("9")), Seen::Other);
        assert_eq!(
            e.observe(&key(), &slice("web-1"), Some("10")),
            Seen::OwnWrite
        );
        assert!(!e.is_settled(&key(), now));
        // A newer version than ours also settles it, but is someone else's change.
        assert_eq!(
            e.observe(&key(), &Target::Endpoints, Some("12")),
            Seen::Other
        );
        assert!(e.is_settled(&key(), now));
    }

    #[test]
    fn a_delete_blocks_until_the_object_is_gone() {
        let now = Instant::now();
        let mut e = Expectations::new(Duration::from_secs(10));
        e.expect(&key(), slice("web-1"), None, true, Some(Some("4")), now);
        assert_eq!(e.observe(&key(), &slice("web-1"), Some("5")), Seen::Other);
        assert!(!e.is_settled(&key(), now));
        assert_eq!(e.observe(&key(), &slice("web-1"), None), Seen::OwnWrite);
        assert!(e.is_settled(&key(), now));
    }

    #[test]
    fn an_object_deleted_by_someone_else_settles_a_write() {
        let now = Instant::now();
        let mut e = Expectations::new(Duration::from_secs(10));
        e.expect(&key(), slice("web-1"), Some("10"), false, Some(None), now);
        assert_eq!(e.observe(&key(), &slice("web-1"), None), Seen::Other);
        assert!(e.is_settled(&key(), now));
    }

    #[test]
    fn expectations_expire_and_unknown_versions_are_not_awaited() {
        let now = Instant::now();
        let mut e = Expectations::new(Duration::from_secs(10));
        e.expect(
            &key(),
            slice("web-1"),
            Some("opaque"),
            false,
            Some(None),
            now,
        );
        assert!(e.is_settled(&key(), now));
        e.expect(&key(), slice("web-1"), Some("10"), false, Some(None), now);
        assert!(!e.is_settled(&key(), now + Duration::from_secs(9)));
        assert!(e.is_settled(&key(), now + Duration::from_secs(10)));
        assert_eq!(e.observe(&key(), &slice("web-1"), Some("10")), Seen::Other);
    }

    #[test]
    fn a_write_the_cache_already_shows_is_not_awaited() {
        let now = Instant::now();
        let mut e = Expectations::new(Duration::from_secs(10));
        e.expect(
            &key(),
            slice("web-1"),
            Some("10"),
            false,
            Some(Some("10")),
            now,
        );
        e.expect(
            &key(),
            slice("web-2"),
            Some("10"),
            false,
            Some(Some("12")),
            now,
        );
        e.expect(&key(), slice("web-3"), None, true, None, now);
        assert!(e.is_settled(&key(), now));
        e.expect(
            &key(),
            slice("web-1"),
            Some("10"),
            false,
            Some(Some("9")),
            now,
        );
        assert!(!e.is_settled(&key(), now));
    }

    #[test]
    fn other_services_and_objects_are_unaffected() {
        let now = Instant::now();
        let mut e = Expectations::new(Duration::from_secs(10));
        e.expect(&key(), slice("web-1"), Some("10"), false, Some(None), now);
        let other = ObjectKey::new("ns", "api");
        assert!(e.is_settled(&other, now));
        assert_eq!(e.observe(&other, &slice("web-1"), Some("10")), Seen::Other);
        assert_eq!(e.observe(&key(), &slice("web-2"), Some("10")), Seen::Other);
        e.clear();
        assert!(e.is_settled(&key(), now));
    }
}

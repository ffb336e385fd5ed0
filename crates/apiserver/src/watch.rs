//! Watch history: a bounded ring of changes, and how one change looks to a filtered watcher.

use super::error::ApiError;
use std::collections::VecDeque;
use std::sync::Arc;

use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One stored change. `old` is kept so a selector-filtered watch can tell an object entering its
/// selection (ADDED) from one leaving it (DELETED), as the apiserver's watch cache does.
#[derive(Debug, Clone)]
pub struct Change {
    pub rv: u64,
    pub storage_key: String,
    pub namespace: String,
    pub kind: EventType,
    pub object: Arc<Value>,
    /// `object` as JSON text, encoded once and shared by every watcher.
    pub json: Arc<str>,
    pub old: Option<Arc<Value>>,
}

impl Change {
    /// The object's JSON text as `api_version` shows it (custom resources are stored once for all
    /// their versions).
    pub fn json_as(&self, api_version: &str) -> std::borrow::Cow<'_, str> {
        super::resource::text_as(&self.object, &self.json, api_version)
    }

    /// The object's JSON text as a watcher that sees this change as `seen` gets it. An update that
    /// takes an object out of a watcher's selection reaches it as DELETED carrying the object as it
    /// last matched, at this change's resourceVersion, as the apiserver's watch cache sends it.
    pub fn text_seen_as(&self, seen: EventType, api_version: &str) -> std::borrow::Cow<'_, str> {
        match (self.kind, seen, self.old.as_deref()) {
            (EventType::Modified, EventType::Deleted, Some(old)) => {
                let mut last = super::resource::view(old, api_version).into_owned();
                if let Some(meta) = last.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.insert(
                        "resourceVersion".to_owned(),
                        Value::String(self.rv.to_string()),
                    );
                }
                std::borrow::Cow::Owned(last.to_string())
            }
            _ => self.json_as(api_version),
        }
    }
}

/// What one watcher should see of a change, given whether the old and new object match its filter.
pub fn project(change: &Change, matches: impl Fn(&Value) -> bool) -> Option<EventType> {
    let new_matches = matches(&change.object);
    let old_matches = change.old.as_deref().is_some_and(&matches);
    match change.kind {
        EventType::Added => new_matches.then_some(EventType::Added),
        EventType::Deleted => (new_matches || old_matches).then_some(EventType::Deleted),
        EventType::Modified => match (old_matches, new_matches) {
            (true, true) => Some(EventType::Modified),
            (false, true) => Some(EventType::Added),
            (true, false) => Some(EventType::Deleted),
            (false, false) => None,
        },
    }
}

/// The retained changes, ordered by resourceVersion. Once a change is evicted, any watch that would
/// need it gets 410 Gone, like a watch past etcd's compaction.
#[derive(Debug)]
pub struct History {
    changes: VecDeque<Arc<Change>>,
    capacity: usize,
    /// Every change with rv <= this has been evicted.
    compacted: u64,
}

impl History {
    pub fn new(capacity: usize) -> Self {
        Self {
            changes: VecDeque::with_capacity(capacity.min(65_536)),
            capacity: capacity.max(1),
            compacted: 0,
        }
    }

    pub fn push(&mut self, change: Change) {
        if self.changes.len() >= self.capacity {
            if let Some(evicted) = self.changes.pop_front() {
                self.compacted = evicted.rv;
            }
        }
        self.changes.push_back(Arc::new(change));
    }

    /// Forget everything up to `rv`, as a compaction would.
    pub fn compact(&mut self, rv: u64) {
        while self.changes.front().is_some_and(|c| c.rv <= rv) {
            self.changes.pop_front();
        }
        self.compacted = self.compacted.max(rv);
    }

    /// The changes after `rv`, or 410 Gone if some of them are no longer retained.
    pub fn since(&self, rv: u64) -> Result<Vec<Arc<Change>>, ApiError> {
        if rv < self.compacted {
            return Err(ApiError::too_old(rv, self.compacted + 1));
        }
        let start = self.changes.partition_point(|c| c.rv <= rv);
        Ok(self.changes.range(start..).cloned().collect())
    }

    pub fn oldest_resumable(&self) -> u64 {
        self.compacted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mk_change(rv: u64, kind: EventType, app: &str, old_app: Option<&str>) -> Change {
        Change {
            rv,
            storage_key: "/pods".into(),
            namespace: "default".into(),
            kind,
            object: Arc::new(json!({"app": app})),
            json: Arc::from(json!({"app": app}).to_string()),
            old: old_app.map(|a| Arc::new(json!({"app": a}))),
        }
    }

    #[test]
    fn since_returns_later_changes_in_order() {
        let mut h = History::new(10);
        for rv in 1..=5 {
            h.push(mk_change(rv, EventType::Added, "a", None));
        }
        let rvs: Vec<u64> = h.since(2).unwrap().iter().map(|c| c.rv).collect();
        assert_eq!(rvs, vec![3, 4, 5]);
        assert!(h.since(5).unwrap().is_empty());
        assert_eq!(h.since(0).unwrap().len(), 5);
    }

    #[test]
    fn eviction_makes_old_versions_gone() {
        let mut h = History::new(3);
        for rv in 1..=5 {
            h.push(mk_change(rv, EventType::Added, "a", None));
        }
        assert_eq!(h.oldest_resumable(), 2);
        assert_eq!(h.since(2).unwrap().len(), 3);
        let err = h.since(1).unwrap_err();
        assert_eq!(err.code, 410);
        assert_eq!(err.message, "too old resource version: 1 (3)");
    }

    #[test]
    fn compaction_expires_everything_up_to_it() {
        let mut h = History::new(10);
        for rv in 1..=4 {
            h.push(mk_change(rv, EventType::Added, "a", None));
        }
        h.compact(4);
        assert!(h.since(3).is_err());
        assert!(h.since(4).unwrap().is_empty());
    }

    #[test]
    fn leaving_the_selection_shows_the_last_matching_object_at_the_new_version() {
        let object = json!({"apiVersion": "v1", "metadata": {"resourceVersion": "7", "labels": {"app": "db"}}});
        let old = json!({"apiVersion": "v1", "metadata": {"resourceVersion": "6", "labels": {"app": "web"}}});
        let change = Change {
            rv: 7,
            storage_key: "/pods".into(),
            namespace: "default".into(),
            kind: EventType::Modified,
            json: Arc::from(object.to_string()),
            object: Arc::new(object.clone()),
            old: Some(Arc::new(old)),
        };
        let left: Value =
            serde_json::from_str(&change.text_seen_as(EventType::Deleted, "v1")).unwrap();
        assert_eq!(left["metadata"]["labels"]["app"], "web");
        assert_eq!(left["metadata"]["resourceVersion"], "7");
        let seen: Value =
            serde_json::from_str(&change.text_seen_as(EventType::Modified, "v1")).unwrap();
        assert_eq!(seen, object);
    }

    #[test]
    fn projection_through_a_selector() {
        let is_web = |v: &Value| v["app"] == "web";
        let cases = [
            (
                mk_change(1, EventType::Added, "web", None),
                Some(EventType::Added),
            ),
            (mk_change(1, EventType::Added, "db", None), None),
            (
                mk_change(1, EventType::Modified, "web", Some("web")),
                Some(EventType::Modified),
            ),
            (
                mk_change(1, EventType::Modified, "web", Some("db")),
                Some(EventType::Added),
            ),
            (
                mk_change(1, EventType::Modified, "db", Some("web")),
                Some(EventType::Deleted),
            ),
            (mk_change(1, EventType::Modified, "db", Some("db")), None),
            (
                mk_change(1, EventType::Deleted, "web", Some("web")),
                Some(EventType::Deleted),
            ),
            (mk_change(1, EventType::Deleted, "db", Some("db")), None),
        ];
        for (change, want) in cases {
            assert_eq!(project(&change, is_web), want, "{change:?}");
        }
    }
}

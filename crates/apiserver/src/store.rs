//! The object store: every object as JSON, keyed by (resource, namespace, name), one global
//! resourceVersion counter, and the watch history. Pure and synchronous: the HTTP layer holds it
//! behind one lock, so every write is atomic and versions are strictly ordered.

use super::error::ApiError;
use super::resource::{text_as, Catalogue, ResourceInfo};
use super::selector::{FieldSelector, LabelSelector};
use super::watch::{Change, EventType, History};
use base64::Engine;
use serde_json::{json, Value};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub type Obj = Arc<Value>;
type Table = BTreeMap<(String, String), Stored>;

/// A stored object with its JSON text, encoded once when it is written: lists and watch events
/// are built by copying this text, so reading 100k objects costs no serialization.
#[derive(Debug, Clone)]
pub struct Stored {
    pub obj: Obj,
    pub json: Arc<str>,
}

impl Stored {
    pub fn new(obj: Obj) -> Self {
        let json = Arc::from(obj.to_string());
        Self { obj, json }
    }

    pub fn json_as(&self, api_version: &str) -> Cow<'_, str> {
        text_as(&self.obj, &self.json, api_version)
    }
}

/// Namespaces that exist before anyone creates anything, as on a fresh cluster.
pub const INITIAL_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

pub struct Store {
    pub(super) rv: u64,
    pub(super) tables: HashMap<String, Table>,
    pub(super) history: History,
    pub(super) catalogue: Catalogue,
    /// Pods bound to a node wait out their grace period on delete, for a kubelet to finish them.
    pub(super) graceful_pods: bool,
}

/// One page of a list.
#[derive(Debug, Clone)]
pub struct ListPage {
    pub items: Vec<Stored>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
}

#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}

impl ListQuery {
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(&obj["metadata"]["labels"]) && self.fields.matches(obj)
    }

    /// Whether the query selects every object (no label or field selector).
    pub fn is_everything(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }
}

pub fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj["metadata"][field].as_str().unwrap_or_default()
}

impl Store {
    pub fn new(history_capacity: usize, now: &str) -> Self {
        let mut store = Self {
            rv: 0,
            tables: HashMap::new(),
            history: History::new(history_capacity),
            catalogue: Catalogue::build([]),
            graceful_pods: false,
        };
        for ns in INITIAL_NAMESPACES {
            store.rv += 1;
            let obj = json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "uid": uuid::Uuid::new_v4().to_string(), "resourceVersion": store.rv.to_string(),
                    "creationTimestamp": now, "labels": {"kubernetes.io/metadata.name": ns}},
                "spec": {}, "status": {"phase": "Active"}
            });
            store.table_mut("/namespaces").insert(
                (String::new(), (*ns).to_owned()),
                Stored::new(Arc::new(obj)),
            );
        }
        store
    }

    /// Delete pods bound to a node gracefully (deletionTimestamp in the future; a second delete with
    /// grace period 0 removes them), as a cluster with kubelets does.
    pub fn set_graceful_pod_deletion(&mut self, on: bool) {
        self.graceful_pods = on;
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    pub fn catalogue(&self) -> &Catalogue {
        &self.catalogue
    }

    pub(super) fn table_mut(&mut self, key: &str) -> &mut Table {
        self.tables.entry(key.to_owned()).or_default()
    }

    pub(super) fn table(&self, key: &str) -> Option<&Table> {
        self.tables.get(key)
    }

    fn scope(info: &ResourceInfo, ns: &str) -> String {
        if info.namespaced {
            ns.to_owned()
        } else {
            String::new()
        }
    }

    pub fn get(&self, info: &ResourceInfo, ns: &str, name: &str) -> Result<Obj, ApiError> {
        self.table(&info.storage_key())
            .and_then(|t| t.get(&(Self::scope(info, ns), name.to_owned())))
            .map(|s| s.obj.clone())
            .ok_or_else(|| ApiError::not_found(&info.plural, &info.group, name))
    }

    pub fn namespace_exists(&self, ns: &str) -> bool {
        self.table("/namespaces")
            .is_some_and(|t| t.contains_key(&(String::new(), ns.to_owned())))
    }

    /// A list of one resource, in one namespace or all (`ns = None`), filtered and paged.
    pub fn list(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        q: &ListQuery,
    ) -> Result<ListPage, ApiError> {
        let after = q
            .continue_token
            .as_deref()
            .map(decode_continue)
            .transpose()?;
        // Every page of one list speaks for the version of its first page, as the apiserver's
        // do: a watch from it then replays whatever changed while the pages were read (the
        // pages themselves show the current objects, so a replay may repeat a change, never
        // miss one). A token whose version is no longer in the history has expired.
        let list_rv = match &after {
            Some(t) if t.rv < self.history.oldest_resumable() => {
                return Err(ApiError::gone(CONTINUE_EXPIRED));
            }
            Some(t) => t.rv,
            None => self.rv,
        };
        let returned_before = after.as_ref().and_then(|t| t.returned);
        let after = after.map(|t| t.key);
        let mut items = Vec::new();
        let mut continue_token = None;
        let mut remaining = None;
        let Some(table) = self.table(&info.storage_key()) else {
            return Ok(ListPage {
                items,
                resource_version: list_rv,
                continue_token,
                remaining,
            });
        };
        let scope = ns.filter(|_| info.namespaced);
        let start = match (&after, scope) {
            (Some(key), _) => std::ops::Bound::Excluded(key.clone()),
            (None, Some(ns)) => std::ops::Bound::Included((ns.to_owned(), String::new())),
            (None, None) => std::ops::Bound::Unbounded,
        };
        let selected = q.is_everything();
        let mut iter = table
            .range((start, std::ops::Bound::Unbounded))
            .take_while(|((k_ns, _), _)| scope.is_none_or(|ns| k_ns == ns))
            .filter(|(_, stored)| selected || q.matches(&stored.obj));
        let limit = q.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        for (key, stored) in iter.by_ref() {
            items.push(stored.clone());
            if items.len() == limit {
                // As the apiserver does, the remaining count is told only for a list without
                // selectors; with one it would take matching every later object on every page.
                let mut rest = iter.by_ref().peekable();
                if rest.peek().is_some() {
                    let returned = returned_before.unwrap_or(0) + items.len() as u64;
                    continue_token = Some(encode_continue(list_rv, key, returned));
                    // Across a whole table the count follows from what the earlier pages
                    // returned (counting the rest on every page made a paged list quadratic);
                    // like the apiserver's, it is an estimate when objects change meanwhile.
                    remaining = selected.then(|| match scope {
                        None if after.is_none() || returned_before.is_some() => {
                            (table.len() as u64).saturating_sub(returned).max(1)
                        }
                        _ => rest.count() as u64,
                    });
                }
                break;
            }
        }
        Ok(ListPage {
            items,
            resource_version: list_rv,
            continue_token,
            remaining,
        })
    }

    /// Changes after `rv`, or 410 Gone when they are no longer retained.
    pub fn changes_since(&self, rv: u64) -> Result<Vec<Arc<Change>>, ApiError> {
        self.history.since(rv)
    }

    /// Forget the history up to now: every watch resumed from an older version gets 410 Gone.
    pub fn compact(&mut self) {
        self.history.compact(self.rv);
    }

    pub(super) fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    pub(super) fn record(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        kind: EventType,
        object: Obj,
        old: Option<Obj>,
    ) {
        let ns = Self::scope(info, ns);
        let key = info.storage_key();
        // A created or updated object was just put: its text is already encoded.
        let stored = self
            .table(&key)
            .and_then(|t| t.get(&(ns.clone(), meta_str(&object, "name").to_owned())))
            .filter(|s| Arc::ptr_eq(&s.obj, &object))
            .cloned()
            .unwrap_or_else(|| Stored::new(object));
        self.record_stored(&key, &ns, kind, stored, old);
    }

    pub(super) fn record_raw(
        &mut self,
        storage_key: &str,
        ns: &str,
        kind: EventType,
        object: Obj,
        old: Option<Obj>,
    ) {
        self.record_stored(storage_key, ns, kind, Stored::new(object), old);
    }

    fn record_stored(
        &mut self,
        storage_key: &str,
        ns: &str,
        kind: EventType,
        stored: Stored,
        old: Option<Obj>,
    ) {
        self.history.push(Change {
            rv: self.rv,
            storage_key: storage_key.to_owned(),
            namespace: ns.to_owned(),
            kind,
            object: stored.obj,
            json: stored.json,
            old,
        });
    }

    pub(super) fn put(&mut self, info: &ResourceInfo, ns: &str, name: &str, obj: Obj) {
        let key = (Self::scope(info, ns), name.to_owned());
        self.table_mut(&info.storage_key())
            .insert(key, Stored::new(obj));
    }

    pub(super) fn take(&mut self, info: &ResourceInfo, ns: &str, name: &str) -> Option<Obj> {
        let key = (Self::scope(info, ns), name.to_owned());
        self.tables
            .get_mut(&info.storage_key())
            .and_then(|t| t.remove(&key))
            .map(|s| s.obj)
    }

    pub(super) fn rebuild_catalogue(&mut self) {
        let crds: Vec<Value> = self
            .table("apiextensions.k8s.io/customresourcedefinitions")
            .map(|t| t.values().map(|v| (*v.obj).clone()).collect())
            .unwrap_or_default();
        self.catalogue = Catalogue::build(crds.iter());
    }
}

fn encode_continue(rv: u64, key: &(String, String), returned: u64) -> String {
    let token = json!({"rv": rv, "ns": key.0, "name": key.1, "n": returned});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.to_string())
}

/// The apiserver's words for a continue token older than the retained history.
const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// What a continue token carries.
struct ContinueToken {
    /// The version every page of the list speaks for.
    rv: u64,
    /// The last key returned.
    key: (String, String),
    /// How many items the earlier pages returned (absent from tokens that do not say).
    returned: Option<u64>,
}

fn decode_continue(token: &str) -> Result<ContinueToken, ApiError> {
    let bad = || {
        ApiError::bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    match (v["rv"].as_u64(), v["ns"].as_str(), v["name"].as_str()) {
        (Some(rv), Some(ns), Some(name)) => Ok(ContinueToken {
            rv,
            key: (ns.to_owned(), name.to_owned()),
            returned: v["n"].as_u64(),
        }),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_text_is_the_object() {
        let obj = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
        let stored = Stored::new(Arc::new(obj.clone()));
        assert_eq!(serde_json::from_str::<Value>(&stored.json).unwrap(), obj);
        assert!(matches!(stored.json_as("v1"), Cow::Borrowed(_)));
    }

    #[test]
    fn stored_text_through_another_version() {
        let obj = json!({"apiVersion": "example.com/v1", "kind": "Widget", "spec": {"size": 3}});
        let stored = Stored::new(Arc::new(obj));
        let shown: Value = serde_json::from_str(&stored.json_as("example.com/v2")).unwrap();
        assert_eq!(
            shown,
            json!({"apiVersion": "example.com/v2", "kind": "Widget", "spec": {"size": 3}})
        );
        assert_eq!(stored.obj["apiVersion"], "example.com/v1");
    }
}

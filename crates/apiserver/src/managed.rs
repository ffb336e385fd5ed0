//! `metadata.managedFields`: who owns which fields, updated on every write, and server-side apply's
//! conflict detection, forced take-over and removal of fields a manager stopped applying.

use super::fields::{display_path, get_at, merge_applied, remove_at, FieldSet, Part};
use super::resource::Schema;
use serde_json::{json, Value};

#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub time: String,
    pub subresource: Option<String>,
    pub fields: FieldSet,
}

impl Entry {
    fn same_owner(&self, manager: &str, operation: &str, subresource: Option<&str>) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == subresource
    }

    fn to_json(&self) -> Value {
        let mut v = json!({
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": self.fields.to_fields_v1(),
        });
        if let (Some(sub), Some(map)) = (&self.subresource, v.as_object_mut()) {
            map.insert("subresource".to_owned(), Value::String(sub.clone()));
        }
        v
    }
}

pub fn read_entries(obj: &Value) -> Vec<Entry> {
    obj["metadata"]["managedFields"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|e| {
                    Some(Entry {
                        manager: e["manager"].as_str()?.to_owned(),
                        operation: e["operation"].as_str().unwrap_or("Update").to_owned(),
                        api_version: e["apiVersion"].as_str().unwrap_or_default().to_owned(),
                        time: e["time"].as_str().unwrap_or_default().to_owned(),
                        subresource: e["subresource"].as_str().map(str::to_owned),
                        fields: FieldSet::from_fields_v1(&e["fieldsV1"]),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

pub fn write_entries(obj: &mut Value, entries: &[Entry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(Entry::to_json)
        .collect();
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".to_owned(), Value::Array(list));
        }
    }
}

/// Who is writing, and through which door.
#[derive(Debug, Clone)]
pub struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    pub now: &'a str,
    pub subresource: Option<&'a str>,
    pub part: Part,
    pub schema: Schema,
}

/// Record a non-apply write: the writer takes every field it changed, from whoever held it.
pub fn track_update(old: Option<&Value>, new: &mut Value, w: &Writer<'_>) {
    let mut entries = old.map(read_entries).unwrap_or_default();
    let new_set = FieldSet::of(new, w.schema, w.part);
    let old_set = old
        .map(|o| FieldSet::of(o, w.schema, w.part))
        .unwrap_or_default();
    let changed: Vec<_> = new_set
        .0
        .iter()
        .filter(|p| old.and_then(|o| get_at(o, p)) != get_at(new, p))
        .cloned()
        .collect();
    let removed: Vec<_> = old_set.0.difference(&new_set.0).cloned().collect();
    for e in entries.iter_mut() {
        for p in changed.iter().chain(&removed) {
            e.fields.0.remove(p);
        }
        e.fields.0.retain(|p| !removed.contains(p));
    }
    if !changed.is_empty() {
        match entries
            .iter_mut()
            .find(|e| e.same_owner(w.manager, "Update", w.subresource))
        {
            Some(e) => {
                e.fields.0.extend(changed);
                e.time = w.now.to_owned();
                e.api_version = w.api_version.to_owned();
            }
            None => entries.push(Entry {
                manager: w.manager.to_owned(),
                operation: "Update".to_owned(),
                api_version: w.api_version.to_owned(),
                time: w.now.to_owned(),
                subresource: w.subresource.map(str::to_owned),
                fields: FieldSet(changed.into_iter().collect()),
            }),
        }
    }
    entries.retain(|e| !e.fields.is_empty());
    write_entries(new, &entries);
}

/// A server-side apply refused because other managers own fields with different values.
#[derive(Debug, Clone, PartialEq)]
pub struct Conflicts(pub Vec<(String, String)>);

/// Server-side apply of `applied` by `w.manager` onto `live`. Returns the new object with its
/// managedFields, or the conflicts (manager, field) when not forced.
pub fn apply(
    live: &Value,
    applied: &Value,
    w: &Writer<'_>,
    force: bool,
) -> Result<Value, Conflicts> {
    let mut entries = read_entries(live);
    let applied_set = FieldSet::of(applied, w.schema, w.part);
    let mut conflicts = Vec::new();
    let mut taken = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if e.manager == w.manager {
            continue;
        }
        for p in e.fields.0.intersection(&applied_set.0) {
            let is_item_marker = p.last().is_some_and(|t| t.starts_with("k:"));
            if !is_item_marker && get_at(live, p) != get_at(applied, p) {
                conflicts.push((e.manager.clone(), display_path(p)));
                taken.push((i, p.clone()));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        conflicts.sort();
        conflicts.dedup();
        return Err(Conflicts(conflicts));
    }
    for (i, p) in taken {
        if let Some(e) = entries.get_mut(i) {
            e.fields.0.remove(&p);
        }
    }
    let mine = entries
        .iter()
        .position(|e| e.same_owner(w.manager, "Apply", w.subresource));
    let previously_mine = mine.map(|i| entries[i].fields.clone()).unwrap_or_default();
    let mut result = live.clone();
    merge_applied(
        &mut result,
        &strip_identity(applied, w.part),
        w.schema,
        &mut Vec::new(),
    );
    let mut dropped: Vec<_> = previously_mine
        .0
        .difference(&applied_set.0)
        .filter(|p| {
            !entries
                .iter()
                .enumerate()
                .any(|(i, e)| Some(i) != mine && e.fields.0.contains(*p))
        })
        .cloned()
        .collect();
    // Items are found by key, not position, but a field inside an item that goes too must not be
    // looked up after its item is gone: remove only the outermost dropped paths.
    let outermost: Vec<_> = dropped
        .iter()
        .filter(|p| {
            !dropped
                .iter()
                .any(|q| q.len() < p.len() && p.starts_with(q))
        })
        .cloned()
        .collect();
    dropped = outermost;
    for p in &dropped {
        remove_at(&mut result, p);
    }
    let entry = Entry {
        manager: w.manager.to_owned(),
        operation: "Apply".to_owned(),
        api_version: w.api_version.to_owned(),
        time: w.now.to_owned(),
        subresource: w.subresource.map(str::to_owned),
        fields: applied_set,
    };
    match mine {
        Some(i) => entries[i] = entry,
        None => entries.push(entry),
    }
    entries.retain(|e| !e.fields.is_empty());
    write_entries(&mut result, &entries);
    Ok(result)
}

/// The part of an applied configuration that is merged: identity metadata is the server's, and the
/// status subresource door only carries status.
fn strip_identity(applied: &Value, part: Part) -> Value {
    let mut out = serde_json::Map::new();
    if let Some(map) = applied.as_object() {
        for (k, v) in map {
            match (k.as_str(), part) {
                ("apiVersion" | "kind", _) => {}
                ("status", Part::AllButStatus) => {}
                ("status", _) => {
                    out.insert(k.clone(), v.clone());
                }
                (_, Part::StatusOnly) => {}
                ("metadata", _) => {
                    let mut meta = serde_json::Map::new();
                    for mk in ["labels", "annotations", "finalizers", "ownerReferences"] {
                        if let Some(mv) = v.get(mk) {
                            meta.insert(mk.to_owned(), mv.clone());
                        }
                    }
                    out.insert(k.clone(), Value::Object(meta));
                }
                _ => {
                    out.insert(k.clone(), v.clone());
                }
            }
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w<'a>(manager: &'a str) -> Writer<'a> {
        Writer {
            manager,
            api_version: "v1",
            now: "2026-01-01T00:00:00Z",
            subresource: None,
            part: Part::AllButStatus,
            schema: Schema::BuiltIn,
        }
    }

    fn mk_svc(spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"}, "spec": spec})
    }

    fn owners(obj: &Value) -> Vec<(String, String)> {
        read_entries(obj)
            .into_iter()
            .map(|e| (e.manager, e.operation))
            .collect()
    }

    #[test]
    fn create_then_update_moves_ownership() {
        let mut created = mk_svc(json!({"type": "ClusterIP", "selector": {"app": "web"}}));
        track_update(None, &mut created, &w("creator"));
        assert_eq!(owners(&created), vec![("creator".into(), "Update".into())]);
        let mut updated = created.clone();
        updated["spec"]["type"] = json!("NodePort");
        track_update(Some(&created), &mut updated, &w("editor"));
        let entries = read_entries(&updated);
        let type_path = vec!["f:spec".to_owned(), "f:type".to_owned()];
        assert!(entries
            .iter()
            .any(|e| e.manager == "editor" && e.fields.0.contains(&type_path)));
        assert!(entries
            .iter()
            .all(|e| e.manager == "editor" || !e.fields.0.contains(&type_path)));
    }

    #[test]
    fn apply_conflicts_then_force_takes_over() {
        let live = apply(
            &mk_svc(json!({})),
            &mk_svc(json!({"type": "ClusterIP"})),
            &w("alice"),
            false,
        )
        .unwrap();
        let err = apply(
            &live,
            &mk_svc(json!({"type": "NodePort"})),
            &w("bob"),
            false,
        )
        .unwrap_err();
        assert_eq!(err.0, vec![("alice".to_owned(), ".spec.type".to_owned())]);
        let forced = apply(&live, &mk_svc(json!({"type": "NodePort"})), &w("bob"), true).unwrap();
        assert_eq!(forced["spec"]["type"], "NodePort");
        assert_eq!(
            owners(&forced),
            vec![("bob".into(), "Apply".into())],
            "alice lost her only field"
        );
    }

    #[test]
    fn same_value_is_shared_not_conflicting() {
        let live = apply(
            &mk_svc(json!({})),
            &mk_svc(json!({"type": "ClusterIP"})),
            &w("alice"),
            false,
        )
        .unwrap();
        let shared = apply(
            &live,
            &mk_svc(json!({"type": "ClusterIP"})),
            &w("bob"),
            false,
        )
        .unwrap();
        assert_eq!(read_entries(&shared).len(), 2);
        // alice stops applying the field: bob still owns it, so it stays.
        let after = apply(&shared, &mk_svc(json!({})), &w("alice"), false).unwrap();
        assert_eq!(after["spec"]["type"], "ClusterIP");
    }

    #[test]
    fn fields_no_longer_applied_are_removed() {
        let cfg = mk_svc(json!({"type": "ClusterIP", "ports": [{"port": 80}, {"port": 81}]}));
        let live = apply(&mk_svc(json!({})), &cfg, &w("alice"), false).unwrap();
        let next = apply(
            &live,
            &mk_svc(json!({"ports": [{"port": 80}]})),
            &w("alice"),
            false,
        )
        .unwrap();
        assert!(next["spec"].get("type").is_none());
        assert_eq!(next["spec"]["ports"], json!([{"port": 80}]));
    }

    #[test]
    fn updater_keeps_fields_applier_drops() {
        let live = apply(
            &mk_svc(json!({})),
            &mk_svc(json!({"type": "ClusterIP"})),
            &w("alice"),
            false,
        )
        .unwrap();
        let mut edited = live.clone();
        edited["spec"]["clusterIP"] = json!("10.96.0.10");
        track_update(Some(&live), &mut edited, &w("controller"));
        let next = apply(
            &edited,
            &mk_svc(json!({"type": "ClusterIP"})),
            &w("alice"),
            false,
        )
        .unwrap();
        assert_eq!(next["spec"]["clusterIP"], "10.96.0.10");
        let err = apply(
            &next,
            &mk_svc(json!({"clusterIP": "10.96.0.11"})),
            &w("alice"),
            false,
        )
        .unwrap_err();
        assert_eq!(err.0[0].0, "controller");
    }

    #[test]
    fn status_door_only_touches_status() {
        let live = mk_svc(json!({"type": "ClusterIP"}));
        let writer = Writer {
            subresource: Some("status"),
            part: Part::StatusOnly,
            ..w("ctl")
        };
        let cfg = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "labels": {"x": "y"}},
            "spec": {"type": "NodePort"}, "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.200"}]}}});
        let out = apply(&live, &cfg, &writer, false).unwrap();
        assert_eq!(out["spec"]["type"], "ClusterIP");
        assert!(out["metadata"].get("labels").is_none());
        assert_eq!(
            out["status"]["loadBalancer"]["ingress"][0]["ip"],
            "198.18.0.200"
        );
        assert_eq!(read_entries(&out)[0].subresource.as_deref(), Some("status"));
    }
}

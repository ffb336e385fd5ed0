//! Field sets for `managedFields`: which leaf fields of an object a manager owns, in the `FieldsV1`
//! encoding (`f:` fields, `k:` list-map items, `v:` set values), and the path operations server-side
//! apply needs (read, remove, merge).

use super::resource::Schema;
use super::schema::{item_key, list_type, ListType};
use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// A path of FieldsV1 tokens, e.g. `["f:spec", "f:ports", "k:{\"port\":80,\"protocol\":\"TCP\"}", "f:name"]`.
pub type FieldPath = Vec<String>;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSet(pub BTreeSet<FieldPath>);

/// Which part of an object a write may own: the main resource (never status, when the resource has a
/// status subresource) or the status subresource (status only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    All,
    AllButStatus,
    StatusOnly,
}

impl FieldSet {
    /// The fields set in `obj`. Identity and server-managed metadata are never owned.
    pub fn of(obj: &Value, schema: Schema, part: Part) -> Self {
        let mut out = BTreeSet::new();
        let Some(map) = obj.as_object() else {
            return Self(out);
        };
        for (k, v) in map {
            let wanted = match (k.as_str(), part) {
                ("apiVersion" | "kind", _) => false,
                ("status", Part::AllButStatus) => false,
                ("status", _) => true,
                ("metadata", Part::StatusOnly) => false,
                (_, Part::StatusOnly) => false,
                _ => true,
            };
            if !wanted {
                continue;
            }
            if k == "metadata" {
                for mk in ["labels", "annotations", "finalizers", "ownerReferences"] {
                    if let Some(mv) = v.get(mk) {
                        let mut tokens = vec!["f:metadata".to_owned(), format!("f:{mk}")];
                        let mut names = vec!["metadata", mk];
                        collect(mv, schema, &mut names, &mut tokens, &mut out);
                    }
                }
                continue;
            }
            let mut tokens = vec![format!("f:{k}")];
            let mut names = vec![k.as_str()];
            collect(v, schema, &mut names, &mut tokens, &mut out);
        }
        Self(out)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The `fieldsV1` tree.
    pub fn to_fields_v1(&self) -> Value {
        let mut root = Map::new();
        for path in &self.0 {
            let mut node = &mut root;
            for token in path {
                let entry = node
                    .entry(token.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                node = match entry {
                    Value::Object(m) => m,
                    _ => return Value::Object(root),
                };
            }
            if !node.is_empty() {
                node.insert(".".to_owned(), Value::Object(Map::new()));
            }
        }
        // A member that is also a prefix of another member is marked with ".".
        mark_members(&mut root, &self.0, &mut Vec::new());
        Value::Object(root)
    }

    pub fn from_fields_v1(tree: &Value) -> Self {
        let mut out = BTreeSet::new();
        walk_v1(tree, &mut Vec::new(), &mut out);
        Self(out)
    }
}

fn mark_members(
    node: &mut Map<String, Value>,
    members: &BTreeSet<FieldPath>,
    prefix: &mut Vec<String>,
) {
    let keys: Vec<String> = node.keys().filter(|k| *k != ".").cloned().collect();
    for k in keys {
        prefix.push(k.clone());
        if let Some(Value::Object(child)) = node.get_mut(&k) {
            if !child.is_empty() && members.contains(prefix) {
                child.insert(".".to_owned(), Value::Object(Map::new()));
            }
            mark_members(child, members, prefix);
        }
        prefix.pop();
    }
}

fn walk_v1(tree: &Value, prefix: &mut Vec<String>, out: &mut BTreeSet<FieldPath>) {
    let Some(map) = tree.as_object() else {
        return;
    };
    if map.is_empty() && !prefix.is_empty() {
        out.insert(prefix.clone());
        return;
    }
    for (k, v) in map {
        if k == "." {
            if !prefix.is_empty() {
                out.insert(prefix.clone());
            }
            continue;
        }
        prefix.push(k.clone());
        walk_v1(v, prefix, out);
        prefix.pop();
    }
}

fn key_token(key: &Map<String, Value>) -> String {
    // serde_json maps are ordered by key, which is the canonical form upstream uses too.
    format!("k:{}", Value::Object(key.clone()))
}

fn collect<'a>(
    value: &'a Value,
    schema: Schema,
    names: &mut Vec<&'a str>,
    tokens: &mut Vec<String>,
    out: &mut BTreeSet<FieldPath>,
) {
    match value {
        Value::Object(map) if !map.is_empty() => collect_fields(map, schema, names, tokens, out),
        Value::Array(items) if !items.is_empty() => match list_type(schema, names) {
            ListType::Map(keys) => {
                let item_keys: Option<Vec<_>> = items.iter().map(|i| item_key(i, keys)).collect();
                let Some(item_keys) = item_keys else {
                    out.insert(tokens.clone());
                    return;
                };
                for (item, key) in items.iter().zip(item_keys) {
                    tokens.push(key_token(&key));
                    out.insert(tokens.clone());
                    if let Value::Object(fields) = item {
                        collect_fields(fields, schema, names, tokens, out);
                    }
                    tokens.pop();
                }
            }
            ListType::Set => {
                for item in items {
                    tokens.push(format!("v:{item}"));
                    out.insert(tokens.clone());
                    tokens.pop();
                }
            }
            ListType::Atomic => {
                out.insert(tokens.clone());
            }
        },
        _ => {
            out.insert(tokens.clone());
        }
    }
}

/// Each field of an object, as `f:<name>` below the current path: an object's own fields and a
/// keyed list item's fields are owned the same way.
fn collect_fields<'a>(
    fields: &'a Map<String, Value>,
    schema: Schema,
    names: &mut Vec<&'a str>,
    tokens: &mut Vec<String>,
    out: &mut BTreeSet<FieldPath>,
) {
    for (k, v) in fields {
        names.push(k);
        tokens.push(format!("f:{k}"));
        collect(v, schema, names, tokens, out);
        tokens.pop();
        names.pop();
    }
}

/// The value at a path, if the object has it.
pub fn get_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = obj;
    for token in path {
        cur = step(cur, token)?;
    }
    Some(cur)
}

fn step<'a>(cur: &'a Value, token: &str) -> Option<&'a Value> {
    if let Some(field) = token.strip_prefix("f:") {
        return cur.get(field);
    }
    let items = cur.as_array()?;
    if let Some(key) = token.strip_prefix("k:") {
        let key: Map<String, Value> = serde_json::from_str(key).ok()?;
        let names: Vec<&str> = key.keys().map(String::as_str).collect();
        return items
            .iter()
            .find(|i| item_key(i, &names).as_ref() == Some(&key));
    }
    if let Some(v) = token.strip_prefix("v:") {
        let v: Value = serde_json::from_str(v).ok()?;
        return items.iter().find(|i| **i == v);
    }
    None
}

/// Remove the member at `path` (a field, a list-map item or a set value). Missing paths are ignored.
pub fn remove_at(obj: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for token in parents {
        let next = if let Some(field) = token.strip_prefix("f:") {
            cur.get_mut(field)
        } else {
            let idx = position(cur, token);
            match (idx, cur.as_array_mut()) {
                (Some(i), Some(items)) => items.get_mut(i),
                _ => None,
            }
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(field) = last.strip_prefix("f:") {
        if let Some(map) = cur.as_object_mut() {
            map.remove(field);
        }
    } else if let Some(i) = position(cur, last) {
        if let Some(items) = cur.as_array_mut() {
            items.remove(i);
        }
    }
}

fn position(list: &Value, token: &str) -> Option<usize> {
    let items = list.as_array()?;
    let target = step(list, token)?;
    items.iter().position(|i| std::ptr::eq(i, target))
}

/// Human form of a path as the apiserver prints it in conflicts: `.spec.ports[port=80,protocol="TCP"].name`.
pub fn display_path(path: &[String]) -> String {
    let mut out = String::new();
    for token in path {
        if let Some(f) = token.strip_prefix("f:") {
            out.push('.');
            out.push_str(f);
        } else if let Some(k) = token.strip_prefix("k:") {
            let key: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
            let parts: Vec<String> = key.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(v) = token.strip_prefix("v:") {
            out.push_str(&format!("[={v}]"));
        }
    }
    out
}

/// Merge an applied configuration into `live`: maps recursively, list-maps by key, sets by union,
/// everything else replaced. Nulls in the configuration remove the field.
pub fn merge_applied(live: &mut Value, applied: &Value, schema: Schema, names: &mut Vec<String>) {
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) => {
            for (k, av) in a {
                if av.is_null() {
                    l.remove(k);
                    continue;
                }
                names.push(k.clone());
                match l.get_mut(k) {
                    Some(lv) => merge_applied(lv, av, schema, names),
                    None => {
                        l.insert(k.clone(), av.clone());
                    }
                }
                names.pop();
            }
        }
        (Value::Array(l), Value::Array(a)) => {
            let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
            match list_type(schema, &name_refs) {
                ListType::Map(keys) => {
                    for item in a {
                        let key = item_key(item, keys);
                        let existing = key.as_ref().and_then(|k| {
                            l.iter_mut()
                                .find(|li| item_key(li, keys).as_ref() == Some(k))
                        });
                        match existing {
                            Some(li) => merge_applied(li, item, schema, names),
                            None => l.push(item.clone()),
                        }
                    }
                }
                ListType::Set => {
                    for item in a {
                        if !l.contains(item) {
                            l.push(item.clone());
                        }
                    }
                }
                ListType::Atomic => *l = a.clone(),
            }
        }
        (live, applied) => *live = applied.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "resourceVersion": "5", "labels": {"app": "web"}, "finalizers": ["a"]},
            "spec": {"type": "ClusterIP", "ports": [{"port": 80, "name": "http"}], "selector": {"app": "web"}},
            "status": {"loadBalancer": {}}
        })
    }

    fn p(tokens: &[&str]) -> FieldPath {
        tokens.iter().map(|t| (*t).to_owned()).collect()
    }

    #[test]
    fn field_set_of_service() {
        let set = FieldSet::of(&svc(), Schema::BuiltIn, Part::AllButStatus);
        let port = "k:{\"port\":80,\"protocol\":\"TCP\"}";
        let want: BTreeSet<FieldPath> = [
            p(&["f:metadata", "f:labels", "f:app"]),
            p(&["f:metadata", "f:finalizers", "v:\"a\""]),
            p(&["f:spec", "f:type"]),
            p(&["f:spec", "f:ports", port]),
            p(&["f:spec", "f:ports", port, "f:port"]),
            p(&["f:spec", "f:ports", port, "f:name"]),
            p(&["f:spec", "f:selector", "f:app"]),
        ]
        .into_iter()
        .collect();
        assert_eq!(set.0, want);
        let status = FieldSet::of(&svc(), Schema::BuiltIn, Part::StatusOnly);
        assert_eq!(
            status.0,
            [p(&["f:status", "f:loadBalancer"])].into_iter().collect()
        );
    }

    #[test]
    fn fields_v1_round_trip() {
        let set = FieldSet::of(&svc(), Schema::BuiltIn, Part::All);
        let tree = set.to_fields_v1();
        assert_eq!(
            tree["f:spec"]["f:ports"]["k:{\"port\":80,\"protocol\":\"TCP\"}"]["."],
            json!({})
        );
        assert_eq!(FieldSet::from_fields_v1(&tree), set);
    }

    #[test]
    fn get_and_remove_at_paths() {
        let mut obj = svc();
        let port_name = p(&[
            "f:spec",
            "f:ports",
            "k:{\"port\":80,\"protocol\":\"TCP\"}",
            "f:name",
        ]);
        assert_eq!(get_at(&obj, &port_name), Some(&json!("http")));
        remove_at(&mut obj, &port_name);
        assert_eq!(get_at(&obj, &port_name), None);
        remove_at(
            &mut obj,
            &p(&["f:spec", "f:ports", "k:{\"port\":80,\"protocol\":\"TCP\"}"]),
        );
        assert_eq!(obj["spec"]["ports"], json!([]));
        remove_at(&mut obj, &p(&["f:metadata", "f:finalizers", "v:\"a\""]));
        assert_eq!(obj["metadata"]["finalizers"], json!([]));
        remove_at(&mut obj, &p(&["f:nothing", "f:here"]));
    }

    #[test]
    fn display_paths_like_apiserver() {
        let path = p(&[
            "f:spec",
            "f:ports",
            "k:{\"port\":80,\"protocol\":\"TCP\"}",
            "f:name",
        ]);
        assert_eq!(
            display_path(&path),
            ".spec.ports[port=80,protocol=\"TCP\"].name"
        );
    }

    #[test]
    fn merge_by_list_keys() {
        let mut live = svc();
        let applied = json!({"spec": {"ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}, {"port": 443}],
            "selector": null}, "metadata": {"finalizers": ["a", "b"]}});
        merge_applied(&mut live, &applied, Schema::BuiltIn, &mut Vec::new());
        assert_eq!(
            live["spec"]["ports"],
            json!([{"port": 80, "name": "http", "protocol": "TCP", "targetPort": 8080}, {"port": 443}])
        );
        assert!(live["spec"].get("selector").is_none());
        assert_eq!(live["metadata"]["finalizers"], json!(["a", "b"]));
    }
}

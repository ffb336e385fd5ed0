//! Patch bodies: JSON merge (RFC 7386), JSON patch (RFC 6902) and strategic merge. Server-side apply
//! lives in [`super::managed`], because it is about ownership more than about merging.

use super::error::ApiError;
use super::resource::Schema;
use super::schema::{list_type, ListType};
use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(content_type: &str) -> Result<Self, ApiError> {
        let base = content_type.split(';').next().unwrap_or_default().trim();
        match base {
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/json-patch+json" => Ok(Self::Json),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            "application/apply-patch+yaml" => Ok(Self::Apply),
            _ => Err(ApiError::unsupported_media_type(content_type)),
        }
    }
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
}

/// `current` with a merge, JSON or strategic patch applied, as a new value.
pub fn build_patched(
    current: &Value,
    kind: PatchType,
    body: &[u8],
    schema: Schema,
) -> Result<Value, ApiError> {
    let mut out = current.clone();
    match kind {
        PatchType::Merge => json_patch::merge(&mut out, &parse_json(body)?),
        PatchType::Json => {
            let patch: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding JSON patch: {e}")))?;
            // One operation at a time, so that a `test` of `null` at a path that does not exist
            // succeeds, as on the apiserver (its JSON-patch library reads a missing value as
            // null; kube-rs's finalizer helper relies on it to add the first finalizer). `out`
            // is a copy: a failure part-way changes nothing.
            for op in patch.0 {
                if let json_patch::PatchOperation::Test(t) = &op {
                    if t.value.is_null() && out.pointer(t.path.as_str()).is_none() {
                        continue;
                    }
                }
                json_patch::patch(&mut out, &[op]).map_err(|e| {
                    ApiError::unprocessable(format!(
                        "the server rejected our request due to an error in our request: {e}"
                    ))
                })?;
            }
        }
        PatchType::Strategic => {
            if schema == Schema::Custom {
                return Err(ApiError::unsupported_media_type(
                    "application/strategic-merge-patch+json is not supported for custom resources",
                ));
            }
            let patch = parse_json(body)?;
            strategic_merge(&mut out, &patch, &mut Vec::new());
        }
        PatchType::Apply => {
            return Err(ApiError::internal("server-side apply is not a merge patch"))
        }
    }
    Ok(out)
}

fn is_directive(key: &str) -> bool {
    key.starts_with('$')
}

/// Strip `$patch`, `$setElementOrder/...` and other directives from a value being inserted whole.
fn clean(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !is_directive(k))
                .map(|(k, v)| (k.clone(), clean(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .filter(|i| i.get("$patch").is_none())
                .map(clean)
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Strategic merge patch over the built-in types: maps merge, `null` deletes, lists with a merge key
/// merge by it (`$patch: delete` removes an item, `$patch: replace` replaces the list), set-like lists
/// merge by union (`$deleteFromPrimitiveList/<field>` removes values), other lists are replaced.
pub fn strategic_merge(target: &mut Value, patch: &Value, names: &mut Vec<String>) {
    let Value::Object(pm) = patch else {
        *target = clean(patch);
        return;
    };
    if pm.get("$patch").and_then(Value::as_str) == Some("replace") {
        *target = clean(patch);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    for (k, pv) in pm {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(list), Some(remove)) = (
                target.get_mut(field).and_then(Value::as_array_mut),
                pv.as_array(),
            ) {
                list.retain(|v| !remove.contains(v));
            }
            continue;
        }
        if is_directive(k) {
            continue;
        }
        let Some(tm) = target.as_object_mut() else {
            return;
        };
        if pv.is_null() || pv.get("$patch").and_then(Value::as_str) == Some("delete") {
            tm.remove(k);
            continue;
        }
        names.push(k.clone());
        match pv {
            Value::Object(_) => {
                let slot = tm.entry(k.clone()).or_insert(Value::Null);
                strategic_merge(slot, pv, names);
            }
            Value::Array(items) => {
                let slot = tm.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                merge_list(slot, items, names);
            }
            _ => {
                tm.insert(k.clone(), pv.clone());
            }
        }
        names.pop();
    }
}

fn merge_list(target: &mut Value, items: &[Value], names: &mut Vec<String>) {
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let lt = list_type(Schema::BuiltIn, &name_refs);
    if items
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *target = clean(&Value::Array(items.to_vec()));
        return;
    }
    if !target.is_array() {
        *target = Value::Array(Vec::new());
    }
    let Some(list) = target.as_array_mut() else {
        return;
    };
    match lt {
        ListType::Map(keys) => {
            let key = keys[0];
            for item in items {
                let Some(k) = item.get(key) else {
                    list.push(clean(item));
                    continue;
                };
                let pos = list.iter().position(|l| l.get(key) == Some(k));
                if item.get("$patch").and_then(Value::as_str) == Some("delete") {
                    list.retain(|l| l.get(key) != Some(k));
                    continue;
                }
                match pos {
                    Some(i) => strategic_merge(&mut list[i], item, names),
                    None => list.push(clean(item)),
                }
            }
        }
        ListType::Set => {
            for item in items {
                if !list.contains(item) {
                    list.push(item.clone());
                }
            }
        }
        ListType::Atomic => *list = items.iter().map(clean).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smp(target: Value, patch: Value) -> Value {
        build_patched(
            &target,
            PatchType::Strategic,
            patch.to_string().as_bytes(),
            Schema::BuiltIn,
        )
        .unwrap()
    }

    #[test]
    fn content_types() {
        assert_eq!(
            PatchType::from_content_type("application/merge-patch+json; charset=utf-8").unwrap(),
            PatchType::Merge
        );
        assert_eq!(
            PatchType::from_content_type("application/apply-patch+yaml").unwrap(),
            PatchType::Apply
        );
        assert_eq!(
            PatchType::from_content_type("text/plain").unwrap_err().code,
            415
        );
    }

    #[test]
    fn merge_patch_replaces_lists_and_deletes_nulls() {
        let cur = json!({"spec": {"ports": [{"port": 80}, {"port": 81}], "a": 1}});
        let out = build_patched(
            &cur,
            PatchType::Merge,
            br#"{"spec": {"ports": [{"port": 90}], "a": null}}"#,
            Schema::BuiltIn,
        )
        .unwrap();
        assert_eq!(out, json!({"spec": {"ports": [{"port": 90}]}}));
    }

    #[test]
    fn a_json_patch_test_of_null_passes_where_nothing_is() {
        let cur = json!({"metadata": {"name": "a"}});
        let out = build_patched(
            &cur,
            PatchType::Json,
            br#"[{"op": "test", "path": "/metadata/finalizers", "value": null},
                 {"op": "add", "path": "/metadata/finalizers", "value": ["x"]}]"#,
            Schema::BuiltIn,
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["x"]));
        let err = build_patched(
            &cur,
            PatchType::Json,
            br#"[{"op": "test", "path": "/metadata/name", "value": null}]"#,
            Schema::BuiltIn,
        )
        .unwrap_err();
        assert_eq!(err.code, 422);
    }

    #[test]
    fn json_patch_ops_and_failed_test() {
        let cur = json!({"metadata": {"labels": {"a": "1"}}});
        let out = build_patched(
            &cur,
            PatchType::Json,
            br#"[{"op": "add", "path": "/metadata/labels/b", "value": "2"}]"#,
            Schema::BuiltIn,
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"a": "1", "b": "2"}));
        let err = build_patched(
            &cur,
            PatchType::Json,
            br#"[{"op": "test", "path": "/metadata/labels/a", "value": "9"}]"#,
            Schema::BuiltIn,
        )
        .unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(
            build_patched(&cur, PatchType::Json, b"{}", Schema::BuiltIn)
                .unwrap_err()
                .code,
            400
        );
    }

    #[test]
    fn strategic_merges_service_ports_by_port() {
        let cur = json!({"spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443, "name": "https"}]}});
        let out = smp(
            cur,
            json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 53, "protocol": "UDP"}]}}),
        );
        assert_eq!(
            out["spec"]["ports"],
            json!([
                {"port": 80, "name": "http", "targetPort": 8080}, {"port": 443, "name": "https"}, {"port": 53, "protocol": "UDP"}
            ])
        );
    }

    #[test]
    fn strategic_delete_and_replace_directives() {
        let cur = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}], "selector": {"k": "v"}}});
        let out = smp(
            cur.clone(),
            json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}]}}),
        );
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "b", "image": "y"}])
        );
        let out = smp(
            cur.clone(),
            json!({"spec": {"containers": [{"name": "c"}, {"$patch": "replace"}]}}),
        );
        assert_eq!(out["spec"]["containers"], json!([{"name": "c"}]));
        let out = smp(
            cur,
            json!({"spec": {"selector": {"$patch": "replace", "new": "1"}}}),
        );
        assert_eq!(out["spec"]["selector"], json!({"new": "1"}));
    }

    #[test]
    fn strategic_conditions_by_type_and_finalizer_union() {
        let cur = json!({"metadata": {"finalizers": ["a"]}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        let out = smp(
            cur,
            json!({"metadata": {"finalizers": ["b"]}, "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Other", "status": "True"}]}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "Other", "status": "True"}])
        );
        let out = smp(
            out,
            json!({"$deleteFromPrimitiveList/finalizers": ["a"], "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn strategic_ignores_set_element_order_and_replaces_atomic_lists() {
        let cur = json!({"spec": {"ports": [{"port": 80}], "externalIPs": ["1.1.1.1"]}});
        let out = smp(
            cur,
            json!({"spec": {"$setElementOrder/ports": [{"port": 80}], "externalIPs": ["2.2.2.2"]}}),
        );
        assert_eq!(out["spec"]["ports"], json!([{"port": 80}]));
        assert_eq!(out["spec"]["externalIPs"], json!(["2.2.2.2"]));
    }

    #[test]
    fn strategic_refused_for_custom_resources() {
        let err =
            build_patched(&json!({}), PatchType::Strategic, b"{}", Schema::Custom).unwrap_err();
        assert_eq!(err.code, 415);
    }
}

//! How lists inside objects merge: the `patchMergeKey` / `listType` tags of the upstream Go types,
//! for the fields berth and its users touch. Used by strategic merge patch and server-side apply.

use super::resource::Schema;
use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListType {
    /// Items are identified by these keys (the first is the strategic-merge `patchMergeKey`).
    Map(&'static [&'static str]),
    /// A set of scalars (merged by union).
    Set,
    /// Replaced as a whole.
    Atomic,
}

/// The list type at `path` (field names from the object root, list positions omitted).
pub fn list_type(schema: Schema, path: &[&str]) -> ListType {
    match path {
        ["metadata", "finalizers"] => return ListType::Set,
        ["metadata", "ownerReferences"] => return ListType::Map(&["uid"]),
        ["metadata", ..] => return ListType::Atomic,
        _ => {}
    }
    if schema == Schema::Custom {
        return ListType::Atomic;
    }
    let Some((last, parents)) = path.split_last() else {
        return ListType::Atomic;
    };
    let in_container = parents
        .iter()
        .any(|p| matches!(*p, "containers" | "initContainers" | "ephemeralContainers"));
    match *last {
        "conditions" => ListType::Map(&["type"]),
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets" => ListType::Map(&["name"]),
        "volumeMounts" => ListType::Map(&["mountPath"]),
        "ports" if in_container => ListType::Map(&["containerPort", "protocol"]),
        "ports" if parents == ["spec"] => ListType::Map(&["port", "protocol"]),
        "addresses" if parents == ["status"] => ListType::Map(&["type"]),
        "taints" if parents == ["spec"] => ListType::Map(&["key", "effect"]),
        "hostAliases" => ListType::Map(&["ip"]),
        _ => ListType::Atomic,
    }
}

/// The identity of a list item under `keys`, with the apiserver's default protocol filled in so that
/// `{port: 80}` and `{port: 80, protocol: TCP}` are the same item.
pub fn item_key(item: &Value, keys: &[&str]) -> Option<Map<String, Value>> {
    let mut out = Map::new();
    for key in keys {
        match item.get(*key) {
            Some(v) if !v.is_null() => {
                out.insert((*key).to_owned(), v.clone());
            }
            _ if *key == "protocol" => {
                out.insert((*key).to_owned(), Value::String("TCP".to_owned()));
            }
            _ if *key == "effect" => {}
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn builtin_list_types() {
        let b = Schema::BuiltIn;
        assert_eq!(
            list_type(b, &["spec", "ports"]),
            ListType::Map(&["port", "protocol"])
        );
        assert_eq!(
            list_type(b, &["spec", "containers"]),
            ListType::Map(&["name"])
        );
        assert_eq!(
            list_type(b, &["spec", "containers", "ports"]),
            ListType::Map(&["containerPort", "protocol"])
        );
        assert_eq!(
            list_type(b, &["status", "conditions"]),
            ListType::Map(&["type"])
        );
        assert_eq!(list_type(b, &["metadata", "finalizers"]), ListType::Set);
        assert_eq!(list_type(b, &["subsets", "ports"]), ListType::Atomic);
        assert_eq!(
            list_type(b, &["status", "loadBalancer", "ingress"]),
            ListType::Atomic
        );
    }

    #[test]
    fn custom_resources_keep_metadata_rules_only() {
        assert_eq!(
            list_type(Schema::Custom, &["status", "conditions"]),
            ListType::Atomic
        );
        assert_eq!(
            list_type(Schema::Custom, &["metadata", "finalizers"]),
            ListType::Set
        );
    }

    #[test]
    fn protocol_defaults_in_keys() {
        let a = item_key(&json!({"port": 80}), &["port", "protocol"]);
        let b = item_key(
            &json!({"port": 80, "protocol": "TCP", "name": "x"}),
            &["port", "protocol"],
        );
        assert_eq!(a, b);
        assert!(item_key(&json!({"name": "x"}), &["port", "protocol"]).is_none());
    }
}

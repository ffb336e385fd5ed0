//! The `scale` subresource of Deployments and ReplicaSets: an `autoscaling/v1` Scale seen over
//! `spec.replicas`, as `kubectl scale` and autoscalers read and write it. Pure: the HTTP verbs
//! turn a Scale into a write of the object itself, so the object's own checks and generation
//! apply.

use super::error::ApiError;
use serde_json::{json, Value};

pub const SCALE_API_VERSION: &str = "autoscaling/v1";

/// The Scale an object shows: its identity, `spec.replicas` (1 when unset, the apiserver's
/// default) and `status.replicas` with the selector in its string form.
pub fn to_scale(obj: &Value) -> Value {
    let meta = &obj["metadata"];
    let mut metadata = json!({});
    for key in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = meta.get(key).filter(|v| !v.is_null()) {
            metadata[key] = v.clone();
        }
    }
    json!({
        "kind": "Scale",
        "apiVersion": SCALE_API_VERSION,
        "metadata": metadata,
        "spec": {"replicas": obj["spec"]["replicas"].as_i64().unwrap_or(1)},
        "status": {
            "replicas": obj["status"]["replicas"].as_i64().unwrap_or(0),
            "selector": selector_string(&obj["spec"]["selector"]),
        },
    })
}

/// The replica count a Scale asks for, or the apiserver's validation error.
pub fn wanted_replicas(scale: &Value, kind: &str, name: &str) -> Result<i64, ApiError> {
    match &scale["spec"]["replicas"] {
        Value::Null => Ok(0),
        v => match v.as_i64() {
            Some(n) if (0..=i64::from(i32::MAX)).contains(&n) => Ok(n),
            _ => Err(ApiError::invalid(
                "Scale",
                "autoscaling",
                name,
                "spec.replicas",
                &format!("Invalid value: {v}: must be greater than or equal to 0 ({kind})"),
            )),
        },
    }
}

/// The object with `spec.replicas` set.
pub fn with_replicas(obj: &Value, replicas: i64) -> Value {
    let mut out = obj.clone();
    if !out["spec"].is_object() {
        out["spec"] = json!({});
    }
    out["spec"]["replicas"] = json!(replicas);
    out
}

/// `metav1.FormatLabelSelector`: `k=v`, `k in (a,b)`, `k notin (a)`, `k`, `!k`, joined by commas;
/// an empty selector is the empty string.
pub fn selector_string(selector: &Value) -> String {
    let mut parts: Vec<String> = selector["matchLabels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    for expr in selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let key = expr["key"].as_str().unwrap_or_default();
        let values: Vec<&str> = expr["values"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        parts.push(match expr["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_owned(),
            "DoesNotExist" => format!("!{key}"),
            other => format!("{key} {other} ({})", values.join(",")),
        });
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_deployment() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "uid": "u1", "resourceVersion": "7",
                "labels": {"app": "web"}},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]},
                                     {"key": "canary", "operator": "DoesNotExist"}]}},
            "status": {"replicas": 2}
        })
    }

    #[test]
    fn scale_shows_replicas_and_the_selector_string() {
        let scale = to_scale(&mk_deployment());
        assert_eq!(
            scale,
            json!({"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": "web", "namespace": "default", "uid": "u1", "resourceVersion": "7"},
                "spec": {"replicas": 3},
                "status": {"replicas": 2, "selector": "app=web,tier in (a,b),!canary"}})
        );
    }

    #[test]
    fn unset_replicas_show_the_default_of_one() {
        let scale = to_scale(&json!({"metadata": {"name": "x"}, "spec": {}}));
        assert_eq!(scale["spec"]["replicas"], 1);
        assert_eq!(scale["status"], json!({"replicas": 0, "selector": ""}));
    }

    #[test]
    fn wanted_replicas_are_validated() {
        let ok = |v: Value| wanted_replicas(&json!({"spec": {"replicas": v}}), "Deployment", "web");
        assert_eq!(ok(json!(5)).unwrap(), 5);
        assert_eq!(ok(json!(0)).unwrap(), 0);
        assert_eq!(ok(Value::Null).unwrap(), 0);
        for bad in [json!(-1), json!("3"), json!(1.5), json!(i64::MAX)] {
            let err = ok(bad.clone()).unwrap_err();
            assert_eq!(err.code, 422, "{bad}");
            assert!(err.message.contains("spec.replicas"), "{}", err.message);
        }
    }

    #[test]
    fn with_replicas_changes_only_the_count() {
        let d = with_replicas(&mk_deployment(), 5);
        assert_eq!(d["spec"]["replicas"], 5);
        assert_eq!(d["spec"]["selector"], mk_deployment()["spec"]["selector"]);
        assert_eq!(with_replicas(&json!({}), 2)["spec"], json!({"replicas": 2}));
    }
}

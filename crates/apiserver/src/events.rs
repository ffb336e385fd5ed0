//! core/v1 and events.k8s.io/v1 Events are one store seen through two groups, as on a real
//! apiserver: objects are kept in the core shape and shown through events.k8s.io with the field
//! mapping of upstream's conversion (pkg/apis/events/v1, `Convert_core_Event_To_v1_Event`).

use serde_json::{Map, Value};

/// The group-version that shows the core Events under new names.
pub const EVENTS_API_VERSION: &str = "events.k8s.io/v1";

/// Fields that are named differently: (core/v1, events.k8s.io/v1). Every other field
/// (metadata, eventTime, series, reportingInstance, action, reason, related, type) keeps its name.
const RENAMED: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

/// Struct-typed fields that Go always encodes (`{}` when empty): clients such as the Python one
/// require `involvedObject` on a core Event.
const CORE_ALWAYS: &[&str] = &["involvedObject", "source"];
const EVENTS_ALWAYS: &[&str] = &["regarding", "deprecatedSource"];

/// Whether objects of this group and resource are stored as core/v1 Events.
pub fn is_events_group(group: &str, plural: &str) -> bool {
    group == "events.k8s.io" && plural == "events"
}

fn rename(obj: &Value, api_version: &str, from_core: bool, always: &[&str]) -> Value {
    let mut out = Map::new();
    out.insert(
        "apiVersion".to_owned(),
        Value::String(api_version.to_owned()),
    );
    out.insert("kind".to_owned(), Value::String("Event".to_owned()));
    if let Some(map) = obj.as_object() {
        for (key, value) in map {
            if matches!(key.as_str(), "apiVersion" | "kind") {
                continue;
            }
            let renamed = RENAMED.iter().find_map(|(core, events)| {
                let (from, to) = if from_core {
                    (core, events)
                } else {
                    (events, core)
                };
                (key == from).then_some(*to)
            });
            // A field the other shape names differently is dropped, as a conversion does: a core
            // object has no `note`, an events.k8s.io one no `message`.
            let clashes = RENAMED.iter().any(|(core, events)| {
                let own_renamed_away = if from_core { events } else { core };
                key == own_renamed_away
            });
            match renamed {
                Some(to) => {
                    out.insert(to.to_owned(), value.clone());
                }
                None if clashes => {}
                None => {
                    out.insert(key.clone(), value.clone());
                }
            }
        }
    }
    for field in always {
        let slot = out
            .entry((*field).to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        if slot.is_null() {
            *slot = Value::Object(Map::new());
        }
    }
    Value::Object(out)
}

/// A stored core/v1 Event as events.k8s.io/v1 shows it.
pub fn to_events(core: &Value) -> Value {
    rename(core, EVENTS_API_VERSION, true, EVENTS_ALWAYS)
}

/// An events.k8s.io/v1 Event in the core/v1 shape it is stored in.
pub fn to_core(events: &Value) -> Value {
    rename(events, "v1", false, CORE_ALWAYS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What berth's controller writes through events.k8s.io (kube-rs's Recorder).
    fn mk_new_style() -> Value {
        json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "web.1", "namespace": "default"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"},
            "reportingController": "berth.dev/controller",
            "reportingInstance": "controller-0",
            "action": "Allocate",
            "reason": "EnsuredLoadBalancer",
            "regarding": {"kind": "Service", "name": "web", "namespace": "default", "uid": "u1"},
            "related": {"kind": "Node", "name": "n1"},
            "note": "assigned 198.18.0.200",
            "type": "Normal",
            "deprecatedSource": {"component": "berth", "host": "n1"},
            "deprecatedFirstTimestamp": "2026-01-01T00:00:00Z",
            "deprecatedLastTimestamp": "2026-01-01T00:01:00Z",
            "deprecatedCount": 2
        })
    }

    #[test]
    fn every_events_field_has_its_core_name() {
        let core = to_core(&mk_new_style());
        assert_eq!(
            core,
            json!({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": "web.1", "namespace": "default"},
                "eventTime": "2026-01-01T00:00:00.000000Z",
                "series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"},
                "reportingComponent": "berth.dev/controller",
                "reportingInstance": "controller-0",
                "action": "Allocate",
                "reason": "EnsuredLoadBalancer",
                "involvedObject": {"kind": "Service", "name": "web", "namespace": "default", "uid": "u1"},
                "related": {"kind": "Node", "name": "n1"},
                "message": "assigned 198.18.0.200",
                "type": "Normal",
                "source": {"component": "berth", "host": "n1"},
                "firstTimestamp": "2026-01-01T00:00:00Z",
                "lastTimestamp": "2026-01-01T00:01:00Z",
                "count": 2
            })
        );
    }

    #[test]
    fn round_trips_both_ways() {
        let new_style = mk_new_style();
        assert_eq!(to_events(&to_core(&new_style)), new_style);
        let old_style = json!({
            "apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"},
            "involvedObject": {"kind": "Pod", "name": "p"}, "reason": "Started",
            "message": "started", "source": {"component": "kubelet"}, "count": 3,
            "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:02:00Z",
            "reportingComponent": ""
        });
        assert_eq!(to_core(&to_events(&old_style)), old_style);
    }

    #[test]
    fn old_style_event_through_the_new_group() {
        let shown = to_events(&json!({
            "apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"},
            "involvedObject": {"kind": "Pod", "name": "p"}, "message": "m", "count": 1
        }));
        assert_eq!(shown["apiVersion"], "events.k8s.io/v1");
        assert_eq!(shown["regarding"]["name"], "p");
        assert_eq!(shown["note"], "m");
        assert_eq!(shown["deprecatedCount"], 1);
        assert_eq!(
            shown["deprecatedSource"],
            json!({}),
            "Go encodes the empty struct"
        );
        for core_only in ["involvedObject", "message", "count", "source"] {
            assert!(shown.get(core_only).is_none(), "{core_only} left behind");
        }
    }

    #[test]
    fn minimal_new_style_event_gets_the_structs_core_clients_require() {
        let core = to_core(&json!({"metadata": {"name": "e"}, "note": "n"}));
        assert_eq!(core["involvedObject"], json!({}));
        assert_eq!(core["source"], json!({}));
        assert_eq!(core["message"], "n");
        assert_eq!(core["kind"], "Event");
    }

    #[test]
    fn a_field_of_the_other_shape_does_not_survive_conversion() {
        // `message` is not an events.k8s.io field: written there it must not shadow `note`.
        let core = to_core(&json!({"note": "right", "message": "wrong"}));
        assert_eq!(core["message"], "right");
        let events = to_events(&json!({"message": "right", "note": "wrong"}));
        assert_eq!(events["note"], "right");
    }

    #[test]
    fn only_events_k8s_io_events_share_the_store() {
        assert!(is_events_group("events.k8s.io", "events"));
        assert!(!is_events_group("", "events"));
        assert!(!is_events_group("events.k8s.io", "other"));
    }
}

//! Events of both groups from protobuf.

use super::{micro_time, object_meta, object_reference, time, Fields};
use k8s_pb::api::core::v1 as core;
use k8s_pb::api::events::v1 as events;
use serde_json::Value;

fn event_source(s: Option<core::EventSource>) -> Value {
    let core::EventSource { component, host } = s.unwrap_or_default();
    Fields::default()
        .text("component", component)
        .text("host", host)
        .done()
}

pub(super) fn core_event(e: core::Event) -> Value {
    let core::Event {
        metadata,
        involved_object,
        reason,
        message,
        source,
        first_timestamp,
        last_timestamp,
        count,
        r#type,
        event_time,
        series,
        action,
        related,
        reporting_component,
        reporting_instance,
    } = e;
    let series = series.map_or(Value::Null, |s| {
        let core::EventSeries {
            count,
            last_observed_time,
        } = s;
        Fields::default()
            .int("count", count.map(i64::from))
            .some("lastObservedTime", micro_time(last_observed_time))
            .done()
    });
    let mut out = Fields::default()
        .nested("metadata", object_meta(metadata))
        .text("reason", reason)
        .text("message", message)
        .some("firstTimestamp", time(first_timestamp))
        .some("lastTimestamp", time(last_timestamp))
        .int("count", count.map(i64::from))
        .text("type", r#type)
        .some("eventTime", micro_time(event_time))
        .nested("series", series)
        .text("action", action)
        .nested("related", related.map_or(Value::Null, object_reference))
        .some("reportingComponent", reporting_component)
        .some("reportingInstance", reporting_instance);
    // Struct fields Go always encodes.
    out.0.insert(
        "involvedObject".to_owned(),
        object_reference(involved_object.unwrap_or_default()),
    );
    out.0.insert("source".to_owned(), event_source(source));
    out.done()
}

pub(super) fn new_event(e: events::Event) -> Value {
    let events::Event {
        metadata,
        event_time,
        series,
        reporting_controller,
        reporting_instance,
        action,
        reason,
        regarding,
        related,
        note,
        r#type,
        deprecated_source,
        deprecated_first_timestamp,
        deprecated_last_timestamp,
        deprecated_count,
    } = e;
    let series = series.map_or(Value::Null, |s| {
        let events::EventSeries {
            count,
            last_observed_time,
        } = s;
        Fields::default()
            .some("count", count)
            .some("lastObservedTime", micro_time(last_observed_time))
            .done()
    });
    let mut out = Fields::default()
        .nested("metadata", object_meta(metadata))
        .some("eventTime", micro_time(event_time))
        .nested("series", series)
        .text("reportingController", reporting_controller)
        .text("reportingInstance", reporting_instance)
        .text("action", action)
        .text("reason", reason)
        .nested("related", related.map_or(Value::Null, object_reference))
        .text("note", note)
        .text("type", r#type)
        .some("deprecatedFirstTimestamp", time(deprecated_first_timestamp))
        .some("deprecatedLastTimestamp", time(deprecated_last_timestamp))
        .int("deprecatedCount", deprecated_count.map(i64::from));
    out.0.insert(
        "regarding".to_owned(),
        object_reference(regarding.unwrap_or_default()),
    );
    out.0.insert(
        "deprecatedSource".to_owned(),
        event_source(deprecated_source),
    );
    out.done()
}

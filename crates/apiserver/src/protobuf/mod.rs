//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`), which kubectl's generators
//! (`kubectl create service|configmap|namespace|deployment`, `kubectl expose`) and Go's typed clients send.
//! A body is the `k8s\0` magic and a `runtime.Unknown` envelope naming the kind, around the
//! object's own message; it is decoded with the `k8s-pb` types and turned into the JSON the store
//! keeps, with Go's JSON rules (a value field's zero is left out, a pointer field is kept when set).
//! Every struct is destructured without `..`, so a field added to the types cannot be forgotten.

mod apps;
mod event;
mod kinds;
mod node;

use super::error::ApiError;
use chrono::{DateTime, SecondsFormat};
use event::{core_event, new_event};
use k8s_pb::api::coordination::v1 as coordination;
use k8s_pb::api::core::v1 as core;
use k8s_pb::api::discovery::v1 as discovery;
use k8s_pb::api::events::v1 as events;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use kinds::{config_map, endpoint_slice, endpoints, lease, namespace, service};
use prost::Message;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// The media type of Kubernetes protobuf.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// The kinds whose protobuf bodies the lab decodes.
pub const DECODED_KINDS: &[(&str, &str)] = &[
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("v1", "Namespace"),
    ("v1", "Endpoints"),
    ("v1", "Node"),
    ("v1", "Event"),
    ("apps/v1", "Deployment"),
    ("discovery.k8s.io/v1", "EndpointSlice"),
    ("coordination.k8s.io/v1", "Lease"),
    ("events.k8s.io/v1", "Event"),
];

const MAGIC: &[u8] = b"k8s\x00";

fn undecodable(why: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!(
        "the body of the request could not be decoded as protobuf: {why}"
    ))
}

/// A protobuf body as the JSON object it stands for.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| undecodable("it does not start with the k8s envelope"))?;
    let Unknown {
        type_meta,
        raw,
        content_encoding,
        content_type: _,
    } = Unknown::decode(envelope).map_err(undecodable)?;
    if content_encoding.as_deref().is_some_and(|e| !e.is_empty()) {
        return Err(undecodable(format!(
            "content encoding {content_encoding:?} is not supported"
        )));
    }
    let TypeMeta { api_version, kind } = type_meta.unwrap_or_default();
    let (api_version, kind) = (api_version.unwrap_or_default(), kind.unwrap_or_default());
    let raw = raw.unwrap_or_default();
    let mut obj = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Service") => service(core::Service::decode(raw.as_slice()).map_err(undecodable)?),
        ("v1", "ConfigMap") => {
            config_map(core::ConfigMap::decode(raw.as_slice()).map_err(undecodable)?)
        }
        ("v1", "Namespace") => {
            namespace(core::Namespace::decode(raw.as_slice()).map_err(undecodable)?)
        }
        ("v1", "Node") => node::node(core::Node::decode(raw.as_slice()).map_err(undecodable)?),
        ("v1", "Endpoints") => {
            endpoints(core::Endpoints::decode(raw.as_slice()).map_err(undecodable)?)
        }
        ("v1", "Event") => core_event(core::Event::decode(raw.as_slice()).map_err(undecodable)?),
        ("apps/v1", "Deployment") => apps::deployment(
            k8s_pb::api::apps::v1::Deployment::decode(raw.as_slice()).map_err(undecodable)?,
        )?,
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            endpoint_slice(discovery::EndpointSlice::decode(raw.as_slice()).map_err(undecodable)?)
        }
        ("coordination.k8s.io/v1", "Lease") => {
            lease(coordination::Lease::decode(raw.as_slice()).map_err(undecodable)?)
        }
        ("events.k8s.io/v1", "Event") => {
            new_event(events::Event::decode(raw.as_slice()).map_err(undecodable)?)
        }
        // Go's typed clients send their delete options in the client's group-version.
        (_, "DeleteOptions") => {
            delete_options(meta::DeleteOptions::decode(raw.as_slice()).map_err(undecodable)?)
        }
        _ => {
            let kinds: Vec<String> = DECODED_KINDS
                .iter()
                .map(|(v, k)| format!("{k} ({v})"))
                .collect();
            return Err(ApiError::unsupported_protobuf(&format!(
                "the lab decodes protobuf bodies of {} and DeleteOptions only, not {kind:?} ({api_version:?}); send it as application/json",
                kinds.join(", ")
            )));
        }
    };
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    Ok(obj)
}

/// A JSON object built field by field with Go's encoding rules.
#[derive(Default)]
pub(super) struct Fields(pub(super) Map<String, Value>);

impl Fields {
    /// A string value field (`omitempty`): the empty string is absent.
    pub(super) fn text(mut self, key: &str, v: Option<String>) -> Self {
        if let Some(v) = v.filter(|s| !s.is_empty()) {
            self.0.insert(key.to_owned(), json!(v));
        }
        self
    }

    /// An integer value field (`omitempty`): zero is absent.
    pub(super) fn int(mut self, key: &str, v: Option<i64>) -> Self {
        if let Some(v) = v.filter(|n| *n != 0) {
            self.0.insert(key.to_owned(), json!(v));
        }
        self
    }

    /// A boolean value field (`omitempty`): false is absent.
    pub(super) fn flag(mut self, key: &str, v: Option<bool>) -> Self {
        if v == Some(true) {
            self.0.insert(key.to_owned(), json!(true));
        }
        self
    }

    /// A pointer field, or one without `omitempty`: present whenever it was sent.
    pub(super) fn some(mut self, key: &str, v: Option<impl Into<Value>>) -> Self {
        if let Some(v) = v {
            self.0.insert(key.to_owned(), v.into());
        }
        self
    }

    /// A nested struct or list already converted; empty ones are absent.
    pub(super) fn nested(mut self, key: &str, v: Value) -> Self {
        let empty = match &v {
            Value::Null => true,
            Value::Object(m) => m.is_empty(),
            Value::Array(a) => a.is_empty(),
            _ => false,
        };
        if !empty {
            self.0.insert(key.to_owned(), v);
        }
        self
    }

    pub(super) fn strings(self, key: &str, v: Vec<String>) -> Self {
        self.nested(key, json!(v))
    }

    pub(super) fn map(self, key: &str, v: BTreeMap<String, String>) -> Self {
        self.nested(key, json!(v))
    }

    pub(super) fn done(self) -> Value {
        Value::Object(self.0)
    }
}

pub(super) fn list<T>(items: Vec<T>, f: fn(T) -> Value) -> Value {
    Value::Array(items.into_iter().map(f).collect())
}

/// `metav1.Time` as RFC 3339 in seconds; Go's zero time (and an unset one) is absent.
pub(super) fn time(t: Option<meta::Time>) -> Option<String> {
    let meta::Time { seconds, nanos } = t?;
    timestamp(seconds, nanos, SecondsFormat::Secs)
}

fn timestamp(seconds: Option<i64>, nanos: Option<i32>, format: SecondsFormat) -> Option<String> {
    let (seconds, nanos) = (seconds.unwrap_or_default(), nanos.unwrap_or_default());
    // Go's zero time.Time is year 1; gogo also sends (0, 0) for it.
    if seconds <= -62_135_596_800 || (seconds == 0 && nanos == 0) {
        return None;
    }
    let t = DateTime::from_timestamp(seconds, u32::try_from(nanos).unwrap_or_default())?;
    Some(t.to_rfc3339_opts(format, true))
}

/// `metav1.MicroTime` as RFC 3339 with microseconds.
pub(super) fn micro_time(t: Option<meta::MicroTime>) -> Option<String> {
    let meta::MicroTime { seconds, nanos } = t?;
    timestamp(seconds, nanos, SecondsFormat::Micros)
}

pub(super) fn int_or_string(v: Option<IntOrString>) -> Value {
    match v {
        Some(IntOrString {
            r#type: Some(1),
            int_val: _,
            str_val,
        }) => json!(str_val.unwrap_or_default()),
        Some(IntOrString {
            r#type: _,
            int_val: Some(n),
            str_val: _,
        }) if n != 0 => json!(n),
        _ => Value::Null,
    }
}

pub(super) fn object_meta(m: Option<meta::ObjectMeta>) -> Value {
    let meta::ObjectMeta {
        name,
        generate_name,
        namespace,
        self_link,
        uid,
        resource_version,
        generation,
        creation_timestamp,
        deletion_timestamp,
        deletion_grace_period_seconds,
        labels,
        annotations,
        owner_references,
        finalizers,
        managed_fields,
    } = m.unwrap_or_default();
    Fields::default()
        .text("name", name)
        .text("generateName", generate_name)
        .text("namespace", namespace)
        .text("selfLink", self_link)
        .text("uid", uid)
        .text("resourceVersion", resource_version)
        .int("generation", generation)
        .some("creationTimestamp", time(creation_timestamp))
        .some("deletionTimestamp", time(deletion_timestamp))
        .some("deletionGracePeriodSeconds", deletion_grace_period_seconds)
        .map("labels", labels)
        .map("annotations", annotations)
        .nested("ownerReferences", list(owner_references, owner_reference))
        .strings("finalizers", finalizers)
        .nested("managedFields", list(managed_fields, managed_fields_entry))
        .done()
}

fn owner_reference(r: meta::OwnerReference) -> Value {
    let meta::OwnerReference {
        api_version,
        kind,
        name,
        uid,
        controller,
        block_owner_deletion,
    } = r;
    Fields::default()
        .some("apiVersion", api_version)
        .some("kind", kind)
        .some("name", name)
        .some("uid", uid)
        .some("controller", controller)
        .some("blockOwnerDeletion", block_owner_deletion)
        .done()
}

fn managed_fields_entry(e: meta::ManagedFieldsEntry) -> Value {
    let meta::ManagedFieldsEntry {
        manager,
        operation,
        api_version,
        time: at,
        fields_type,
        fields_v1,
        subresource,
    } = e;
    let fields = fields_v1
        .and_then(|meta::FieldsV1 { raw }| raw)
        .and_then(|raw| serde_json::from_slice::<Value>(&raw).ok())
        .unwrap_or(Value::Null);
    Fields::default()
        .text("manager", manager)
        .text("operation", operation)
        .text("apiVersion", api_version)
        .some("time", time(at))
        .text("fieldsType", fields_type)
        .nested("fieldsV1", fields)
        .text("subresource", subresource)
        .done()
}

pub(super) fn condition(c: meta::Condition) -> Value {
    let meta::Condition {
        r#type,
        status,
        observed_generation,
        last_transition_time,
        reason,
        message,
    } = c;
    Fields::default()
        .some("type", r#type)
        .some("status", status)
        .int("observedGeneration", observed_generation)
        .some("lastTransitionTime", time(last_transition_time))
        .some("reason", reason)
        .some("message", message)
        .done()
}

fn delete_options(d: meta::DeleteOptions) -> Value {
    let meta::DeleteOptions {
        grace_period_seconds,
        preconditions,
        orphan_dependents,
        propagation_policy,
        dry_run,
        ignore_store_read_error_with_cluster_breaking_potential,
    } = d;
    let preconditions = preconditions.map_or(Value::Null, |p| {
        let meta::Preconditions {
            uid,
            resource_version,
        } = p;
        Fields::default()
            .some("uid", uid)
            .some("resourceVersion", resource_version)
            .done()
    });
    Fields::default()
        .some("gracePeriodSeconds", grace_period_seconds)
        .nested("preconditions", preconditions)
        .some("orphanDependents", orphan_dependents)
        .some("propagationPolicy", propagation_policy)
        .strings("dryRun", dry_run)
        .some(
            "ignoreStoreReadErrorWithClusterBreakingPotential",
            ignore_store_read_error_with_cluster_breaking_potential,
        )
        .done()
}

pub(super) fn object_reference(r: core::ObjectReference) -> Value {
    let core::ObjectReference {
        kind,
        namespace,
        name,
        uid,
        api_version,
        resource_version,
        field_path,
    } = r;
    Fields::default()
        .text("kind", kind)
        .text("namespace", namespace)
        .text("name", name)
        .text("uid", uid)
        .text("apiVersion", api_version)
        .text("resourceVersion", resource_version)
        .text("fieldPath", field_path)
        .done()
}

#[cfg(test)]
mod tests;

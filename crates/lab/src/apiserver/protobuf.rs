//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`), which kubectl's generators
//! (`kubectl create service|configmap|namespace`, `kubectl expose`) and Go's typed clients send.
//! A body is the `k8s\0` magic and a `runtime.Unknown` envelope naming the kind, around the
//! object's own message; it is decoded with the `k8s-pb` types and turned into the JSON the store
//! keeps, with Go's JSON rules (a value field's zero is left out, a pointer field is kept when set).
//! Every struct is destructured without `..`, so a field added to the types cannot be forgotten.

use super::error::ApiError;
use base64::Engine;
use chrono::{DateTime, SecondsFormat};
use k8s_pb::api::coordination::v1 as coordination;
use k8s_pb::api::core::v1 as core;
use k8s_pb::api::discovery::v1 as discovery;
use k8s_pb::api::events::v1 as events;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
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
    ("v1", "Event"),
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
        ("v1", "Endpoints") => {
            endpoints(core::Endpoints::decode(raw.as_slice()).map_err(undecodable)?)
        }
        ("v1", "Event") => core_event(core::Event::decode(raw.as_slice()).map_err(undecodable)?),
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            endpoint_slice(discovery::EndpointSlice::decode(raw.as_slice()).map_err(undecodable)?)
        }
        ("coordination.k8s.io/v1", "Lease") => {
            lease(coordination::Lease::decode(raw.as_slice()).map_err(undecodable)?)
        }
        ("events.k8s.io/v1", "Event") => {
            new_event(events::Event::decode(raw.as_slice()).map_err(undecodable)?)
        }
        _ => {
            let kinds: Vec<String> = DECODED_KINDS
                .iter()
                .map(|(v, k)| format!("{k} ({v})"))
                .collect();
            return Err(ApiError::unsupported_protobuf(&format!(
                "the lab decodes protobuf bodies of {} only, not {kind:?} ({api_version:?}); send it as application/json",
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
struct Fields(Map<String, Value>);

impl Fields {
    /// A string value field (`omitempty`): the empty string is absent.
    fn text(mut self, key: &str, v: Option<String>) -> Self {
        if let Some(v) = v.filter(|s| !s.is_empty()) {
            self.0.insert(key.to_owned(), json!(v));
        }
        self
    }

    /// An integer value field (`omitempty`): zero is absent.
    fn int(mut self, key: &str, v: Option<i64>) -> Self {
        if let Some(v) = v.filter(|n| *n != 0) {
            self.0.insert(key.to_owned(), json!(v));
        }
        self
    }

    /// A boolean value field (`omitempty`): false is absent.
    fn flag(mut self, key: &str, v: Option<bool>) -> Self {
        if v == Some(true) {
            self.0.insert(key.to_owned(), json!(true));
        }
        self
    }

    /// A pointer field, or one without `omitempty`: present whenever it was sent.
    fn some(mut self, key: &str, v: Option<impl Into<Value>>) -> Self {
        if let Some(v) = v {
            self.0.insert(key.to_owned(), v.into());
        }
        self
    }

    /// A nested struct or list already converted; empty ones are absent.
    fn nested(mut self, key: &str, v: Value) -> Self {
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

    fn strings(self, key: &str, v: Vec<String>) -> Self {
        self.nested(key, json!(v))
    }

    fn map(self, key: &str, v: BTreeMap<String, String>) -> Self {
        self.nested(key, json!(v))
    }

    fn done(self) -> Value {
        Value::Object(self.0)
    }
}

fn list<T>(items: Vec<T>, f: fn(T) -> Value) -> Value {
    Value::Array(items.into_iter().map(f).collect())
}

/// `metav1.Time` as RFC 3339 in seconds; Go's zero time (and an unset one) is absent.
fn time(t: Option<meta::Time>) -> Option<String> {
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
fn micro_time(t: Option<meta::MicroTime>) -> Option<String> {
    let meta::MicroTime { seconds, nanos } = t?;
    timestamp(seconds, nanos, SecondsFormat::Micros)
}

fn int_or_string(v: Option<IntOrString>) -> Value {
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

fn object_meta(m: Option<meta::ObjectMeta>) -> Value {
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

fn condition(c: meta::Condition) -> Value {
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

fn service(s: core::Service) -> Value {
    let core::Service {
        metadata,
        spec,
        status,
    } = s;
    Fields::default()
        .nested("metadata", object_meta(metadata))
        .nested("spec", spec.map_or(Value::Null, service_spec))
        .nested("status", status.map_or(Value::Null, service_status))
        .done()
}

fn service_spec(s: core::ServiceSpec) -> Value {
    let core::ServiceSpec {
        ports,
        selector,
        cluster_ip,
        cluster_ips,
        r#type,
        external_ips,
        session_affinity,
        load_balancer_ip,
        load_balancer_source_ranges,
        external_name,
        external_traffic_policy,
        health_check_node_port,
        publish_not_ready_addresses,
        session_affinity_config,
        ip_families,
        ip_family_policy,
        allocate_load_balancer_node_ports,
        load_balancer_class,
        internal_traffic_policy,
        traffic_distribution,
    } = s;
    let affinity = session_affinity_config.map_or(Value::Null, |c| {
        let core::SessionAffinityConfig { client_ip } = c;
        let client_ip = client_ip.map_or(Value::Null, |c| {
            let core::ClientIpConfig { timeout_seconds } = c;
            Fields::default()
                .some("timeoutSeconds", timeout_seconds)
                .done()
        });
        Fields::default().nested("clientIP", client_ip).done()
    });
    Fields::default()
        .nested("ports", list(ports, service_port))
        .map("selector", selector)
        .text("clusterIP", cluster_ip)
        .strings("clusterIPs", cluster_ips)
        .text("type", r#type)
        .strings("externalIPs", external_ips)
        .text("sessionAffinity", session_affinity)
        .text("loadBalancerIP", load_balancer_ip)
        .strings("loadBalancerSourceRanges", load_balancer_source_ranges)
        .text("externalName", external_name)
        .text("externalTrafficPolicy", external_traffic_policy)
        .int("healthCheckNodePort", health_check_node_port.map(i64::from))
        .flag("publishNotReadyAddresses", publish_not_ready_addresses)
        .nested("sessionAffinityConfig", affinity)
        .strings("ipFamilies", ip_families)
        .some("ipFamilyPolicy", ip_family_policy)
        .some(
            "allocateLoadBalancerNodePorts",
            allocate_load_balancer_node_ports,
        )
        .some("loadBalancerClass", load_balancer_class)
        .some("internalTrafficPolicy", internal_traffic_policy)
        .some("trafficDistribution", traffic_distribution)
        .done()
}

fn service_port(p: core::ServicePort) -> Value {
    let core::ServicePort {
        name,
        protocol,
        app_protocol,
        port,
        target_port,
        node_port,
    } = p;
    Fields::default()
        .text("name", name)
        .text("protocol", protocol)
        .some("appProtocol", app_protocol)
        .some("port", port)
        .nested("targetPort", int_or_string(target_port))
        .int("nodePort", node_port.map(i64::from))
        .done()
}

fn service_status(s: core::ServiceStatus) -> Value {
    let core::ServiceStatus {
        load_balancer,
        conditions,
    } = s;
    let load_balancer = load_balancer.map_or(Value::Null, |lb| {
        let core::LoadBalancerStatus { ingress } = lb;
        Fields::default()
            .nested("ingress", list(ingress, lb_ingress))
            .done()
    });
    Fields::default()
        .nested("loadBalancer", load_balancer)
        .nested("conditions", list(conditions, condition))
        .done()
}

fn lb_ingress(i: core::LoadBalancerIngress) -> Value {
    let core::LoadBalancerIngress {
        ip,
        hostname,
        ip_mode,
        ports,
    } = i;
    let port_status = |p: core::PortStatus| {
        let core::PortStatus {
            port,
            protocol,
            error,
        } = p;
        Fields::default()
            .some("port", port)
            .some("protocol", protocol)
            .some("error", error)
            .done()
    };
    Fields::default()
        .text("ip", ip)
        .text("hostname", hostname)
        .some("ipMode", ip_mode)
        .nested(
            "ports",
            Value::Array(ports.into_iter().map(port_status).collect()),
        )
        .done()
}

fn config_map(c: core::ConfigMap) -> Value {
    let core::ConfigMap {
        metadata,
        immutable,
        data,
        binary_data,
    } = c;
    let binary: BTreeMap<String, String> = binary_data
        .into_iter()
        .map(|(k, v)| (k, base64::engine::general_purpose::STANDARD.encode(v)))
        .collect();
    Fields::default()
        .nested("metadata", object_meta(metadata))
        .some("immutable", immutable)
        .map("data", data)
        .map("binaryData", binary)
        .done()
}

fn namespace(n: core::Namespace) -> Value {
    let core::Namespace {
        metadata,
        spec,
        status,
    } = n;
    let spec = spec.map_or(Value::Null, |s| {
        let core::NamespaceSpec { finalizers } = s;
        Fields::default().strings("finalizers", finalizers).done()
    });
    let status = status.map_or(Value::Null, |s| {
        let core::NamespaceStatus { phase, conditions } = s;
        let condition = |c: core::NamespaceCondition| {
            let core::NamespaceCondition {
                r#type,
                status,
                last_transition_time,
                reason,
                message,
            } = c;
            Fields::default()
                .some("type", r#type)
                .some("status", status)
                .some("lastTransitionTime", time(last_transition_time))
                .text("reason", reason)
                .text("message", message)
                .done()
        };
        Fields::default()
            .text("phase", phase)
            .nested(
                "conditions",
                Value::Array(conditions.into_iter().map(condition).collect()),
            )
            .done()
    });
    Fields::default()
        .nested("metadata", object_meta(metadata))
        .nested("spec", spec)
        .nested("status", status)
        .done()
}

fn object_reference(r: core::ObjectReference) -> Value {
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

fn endpoints(e: core::Endpoints) -> Value {
    let core::Endpoints { metadata, subsets } = e;
    let address = |a: core::EndpointAddress| {
        let core::EndpointAddress {
            ip,
            hostname,
            node_name,
            target_ref,
        } = a;
        Fields::default()
            .some("ip", ip)
            .text("hostname", hostname)
            .some("nodeName", node_name)
            .nested(
                "targetRef",
                target_ref.map_or(Value::Null, object_reference),
            )
            .done()
    };
    let port = |p: core::EndpointPort| {
        let core::EndpointPort {
            name,
            port,
            protocol,
            app_protocol,
        } = p;
        Fields::default()
            .text("name", name)
            .some("port", port)
            .text("protocol", protocol)
            .some("appProtocol", app_protocol)
            .done()
    };
    let subset = |s: core::EndpointSubset| {
        let core::EndpointSubset {
            addresses,
            not_ready_addresses,
            ports,
        } = s;
        Fields::default()
            .nested(
                "addresses",
                Value::Array(addresses.into_iter().map(address).collect()),
            )
            .nested(
                "notReadyAddresses",
                Value::Array(not_ready_addresses.into_iter().map(address).collect()),
            )
            .nested("ports", Value::Array(ports.into_iter().map(port).collect()))
            .done()
    };
    Fields::default()
        .nested("metadata", object_meta(metadata))
        .nested(
            "subsets",
            Value::Array(subsets.into_iter().map(subset).collect()),
        )
        .done()
}

fn event_source(s: Option<core::EventSource>) -> Value {
    let core::EventSource { component, host } = s.unwrap_or_default();
    Fields::default()
        .text("component", component)
        .text("host", host)
        .done()
}

fn core_event(e: core::Event) -> Value {
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

fn new_event(e: events::Event) -> Value {
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

fn endpoint_slice(s: discovery::EndpointSlice) -> Value {
    let discovery::EndpointSlice {
        metadata,
        address_type,
        endpoints,
        ports,
    } = s;
    let endpoint = |e: discovery::Endpoint| {
        let discovery::Endpoint {
            addresses,
            conditions,
            hostname,
            target_ref,
            deprecated_topology,
            node_name,
            zone,
            hints,
        } = e;
        // A struct in Go: always encoded, `{}` when empty.
        let conditions = conditions.map_or(json!({}), |c| {
            let discovery::EndpointConditions {
                ready,
                serving,
                terminating,
            } = c;
            Fields::default()
                .some("ready", ready)
                .some("serving", serving)
                .some("terminating", terminating)
                .done()
        });
        let hints = hints.map_or(Value::Null, |h| {
            let discovery::EndpointHints {
                for_zones,
                for_nodes,
            } = h;
            let zones: Vec<Value> = for_zones
                .into_iter()
                .map(|discovery::ForZone { name }| Fields::default().some("name", name).done())
                .collect();
            let nodes: Vec<Value> = for_nodes
                .into_iter()
                .map(|discovery::ForNode { name }| Fields::default().some("name", name).done())
                .collect();
            Fields::default()
                .nested("forZones", Value::Array(zones))
                .nested("forNodes", Value::Array(nodes))
                .done()
        });
        let mut out = Fields::default()
            .some("addresses", Some(json!(addresses)))
            .some("hostname", hostname)
            .nested(
                "targetRef",
                target_ref.map_or(Value::Null, object_reference),
            )
            .map("deprecatedTopology", deprecated_topology)
            .some("nodeName", node_name)
            .some("zone", zone)
            .nested("hints", hints);
        out.0.insert("conditions".to_owned(), conditions);
        out.done()
    };
    let port = |p: discovery::EndpointPort| {
        let discovery::EndpointPort {
            name,
            protocol,
            port,
            app_protocol,
        } = p;
        Fields::default()
            .some("name", name)
            .some("protocol", protocol)
            .some("port", port)
            .some("appProtocol", app_protocol)
            .done()
    };
    Fields::default()
        .nested("metadata", object_meta(metadata))
        .some("addressType", address_type)
        .some(
            "endpoints",
            Some(Value::Array(endpoints.into_iter().map(endpoint).collect())),
        )
        .nested("ports", Value::Array(ports.into_iter().map(port).collect()))
        .done()
}

fn lease(l: coordination::Lease) -> Value {
    let coordination::Lease { metadata, spec } = l;
    let spec = spec.map_or(Value::Null, |s| {
        let coordination::LeaseSpec {
            holder_identity,
            lease_duration_seconds,
            acquire_time,
            renew_time,
            lease_transitions,
            strategy,
            preferred_holder,
        } = s;
        Fields::default()
            .some("holderIdentity", holder_identity)
            .some("leaseDurationSeconds", lease_duration_seconds)
            .some("acquireTime", micro_time(acquire_time))
            .some("renewTime", micro_time(renew_time))
            .some("leaseTransitions", lease_transitions)
            .some("strategy", strategy)
            .some("preferredHolder", preferred_holder)
            .done()
    });
    Fields::default()
        .nested("metadata", object_meta(metadata))
        .nested("spec", spec)
        .done()
}

#[cfg(test)]
mod tests;

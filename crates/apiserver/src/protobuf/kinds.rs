//! Services, ConfigMaps, Namespaces, Endpoints, EndpointSlices and Leases from protobuf.

use super::{
    condition, int_or_string, list, micro_time, object_meta, object_reference, time, Fields,
};
use base64::Engine;
use k8s_pb::api::coordination::v1 as coordination;
use k8s_pb::api::core::v1 as core;
use k8s_pb::api::discovery::v1 as discovery;
use serde_json::{json, Value};
use std::collections::BTreeMap;

pub(super) fn service(s: core::Service) -> Value {
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

pub(super) fn config_map(c: core::ConfigMap) -> Value {
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

pub(super) fn namespace(n: core::Namespace) -> Value {
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

pub(super) fn endpoints(e: core::Endpoints) -> Value {
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

pub(super) fn endpoint_slice(s: discovery::EndpointSlice) -> Value {
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

pub(super) fn lease(l: coordination::Lease) -> Value {
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

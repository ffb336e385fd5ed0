//! Object builders shared by the agent tests.
//!
//! Address plan: Services 10.96.0.0/16, pods 10.244.<node>.0/24, nodes 198.18.0.11 upward,
//! load-balancer addresses 198.18.0.200 upward. Nothing here sends a packet anywhere.

#![allow(clippy::unwrap_used, dead_code)]

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{json, Value};

pub const NODE: &str = "node-1";

pub fn mk_service_json(ns: &str, name: &str, ip: &str, ports: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": ns, "name": name},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "ports": ports}
    })
}

pub fn mk_service(ns: &str, name: &str, ip: &str) -> Service {
    serde_json::from_value(mk_service_json(
        ns,
        name,
        ip,
        json!([{"name": "http", "port": 80, "protocol": "TCP"}]),
    ))
    .unwrap()
}

pub fn mk_udp_service(ns: &str, name: &str, ip: &str) -> Service {
    serde_json::from_value(mk_service_json(
        ns,
        name,
        ip,
        json!([{"name": "dns", "port": 53, "protocol": "UDP"}]),
    ))
    .unwrap()
}

/// A LoadBalancer Service with `externalTrafficPolicy: Local` and a health-check node port.
pub fn mk_local_lb_json(ns: &str, name: &str, ip: &str, hc_port: u16) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": ns, "name": name},
        "spec": {
            "type": "LoadBalancer",
            "clusterIP": ip,
            "clusterIPs": [ip],
            "externalTrafficPolicy": "Local",
            "healthCheckNodePort": hc_port,
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}]
        },
        "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.200", "ipMode": "VIP"}]}}
    })
}

/// `(ip, ready, node)` per endpoint; port name `http`, target 8080 (or `dns`/53 for UDP).
pub fn mk_slice_json(
    ns: &str,
    service: &str,
    name: &str,
    protocol: &str,
    eps: &[(&str, bool, &str)],
) -> Value {
    let (port_name, port) = if protocol == "UDP" {
        ("dns", 5353)
    } else {
        ("http", 8080)
    };
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "namespace": ns,
            "name": name,
            "labels": {"kubernetes.io/service-name": service}
        },
        "addressType": "IPv4",
        "ports": [{"name": port_name, "port": port, "protocol": protocol}],
        "endpoints": eps.iter().map(|(ip, ready, node)| json!({
            "addresses": [ip],
            "conditions": {"ready": ready, "serving": ready, "terminating": false},
            "nodeName": node
        })).collect::<Vec<_>>()
    })
}

pub fn mk_slice(ns: &str, service: &str, name: &str, eps: &[(&str, bool, &str)]) -> EndpointSlice {
    serde_json::from_value(mk_slice_json(ns, service, name, "TCP", eps)).unwrap()
}

pub fn mk_udp_slice(
    ns: &str,
    service: &str,
    name: &str,
    eps: &[(&str, bool, &str)],
) -> EndpointSlice {
    serde_json::from_value(mk_slice_json(ns, service, name, "UDP", eps)).unwrap()
}

pub fn mk_node_json(name: &str, address: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"addresses": [{"type": "InternalIP", "address": address}]}
    })
}

pub fn mk_node(name: &str, address: &str) -> Node {
    serde_json::from_value(mk_node_json(name, address)).unwrap()
}

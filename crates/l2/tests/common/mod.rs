//! Builders shared by the announcer's tests.

#![allow(dead_code, clippy::unwrap_used)]

use berth_api::{IPPool, L2Advertisement};
use berth_testing::{from_json, mk_node};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{json, Value};

pub fn mk_pool(name: &str, labels: Value, addresses: &[&str]) -> IPPool {
    from_json(json!({
        "apiVersion": "berth.dev/v1alpha1", "kind": "IPPool",
        "metadata": {"name": name, "labels": labels},
        "spec": {"addresses": addresses}
    }))
}

pub fn mk_adv(name: &str, spec: Value) -> L2Advertisement {
    from_json(json!({
        "apiVersion": "berth.dev/v1alpha1", "kind": "L2Advertisement",
        "metadata": {"name": name}, "spec": spec
    }))
}

/// A LoadBalancer Service holding `ips`, with `policy` and `class` (`null`: none).
pub fn mk_lb(name: &str, ips: &[&str], policy: &str, class: Value) -> Service {
    let ingress: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    from_json(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": name},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": policy,
                 "loadBalancerClass": class, "ports": [{"port": 80}]},
        "status": {"loadBalancer": {"ingress": ingress}}
    }))
}

/// A slice of Service `service` with endpoints `(node, ready)`.
pub fn mk_endpoints(service: &str, name: &str, endpoints: &[(&str, bool)]) -> EndpointSlice {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .enumerate()
        .map(|(i, (node, ready))| {
            json!({"addresses": [format!("10.244.1.{}", i + 2)],
                   "conditions": {"ready": ready}, "nodeName": node})
        })
        .collect();
    from_json(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "default", "name": name,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4", "ports": [{"port": 8080}], "endpoints": endpoints
    }))
}

pub fn mk_plain_node(name: &str) -> Node {
    mk_node(name, json!({"kubernetes.io/hostname": name}), &[])
}

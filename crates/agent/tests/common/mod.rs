//! Object builders shared by the agent tests.
//!
//! Address plan: Services 10.96.0.0/16, pods 10.244.<node>.0/24, nodes 198.18.0.11 upward,
//! load-balancer addresses 198.18.0.200 upward. Nothing here sends a packet anywhere.

#![allow(clippy::unwrap_used, dead_code)]

use berth_testing::from_json;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{json, Value};

pub const NODE: &str = "node-1";

pub fn mk_service_json(ns: &str, name: &str, ip: &str, ports: Value) -> Value {
    berth_testing::mk_service_json(
        ns,
        name,
        json!({"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "ports": ports}),
    )
}

pub fn mk_service(ns: &str, name: &str, ip: &str) -> Service {
    from_json(mk_service_json(
        ns,
        name,
        ip,
        json!([{"name": "http", "port": 80, "protocol": "TCP"}]),
    ))
}

pub fn mk_udp_service(ns: &str, name: &str, ip: &str) -> Service {
    from_json(mk_service_json(
        ns,
        name,
        ip,
        json!([{"name": "dns", "port": 53, "protocol": "UDP"}]),
    ))
}

/// A LoadBalancer Service with `externalTrafficPolicy: Local` and a health-check node port.
pub fn mk_local_lb_json(ns: &str, name: &str, ip: &str, hc_port: u16) -> Value {
    let mut service = berth_testing::mk_service_json(
        ns,
        name,
        json!({
            "type": "LoadBalancer",
            "clusterIP": ip,
            "clusterIPs": [ip],
            "externalTrafficPolicy": "Local",
            "healthCheckNodePort": hc_port,
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}]
        }),
    );
    service["status"] =
        json!({"loadBalancer": {"ingress": [{"ip": "198.18.0.200", "ipMode": "VIP"}]}});
    service
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
    berth_testing::mk_slice_json(
        ns,
        service,
        name,
        json!([{"name": port_name, "port": port, "protocol": protocol}]),
        eps.iter()
            .map(|(ip, ready, node)| {
                json!({
                    "addresses": [ip],
                    "conditions": {"ready": ready, "serving": ready, "terminating": false},
                    "nodeName": node
                })
            })
            .collect(),
    )
}

pub fn mk_slice(ns: &str, service: &str, name: &str, eps: &[(&str, bool, &str)]) -> EndpointSlice {
    from_json(mk_slice_json(ns, service, name, "TCP", eps))
}

pub fn mk_udp_slice(
    ns: &str,
    service: &str,
    name: &str,
    eps: &[(&str, bool, &str)],
) -> EndpointSlice {
    from_json(mk_slice_json(ns, service, name, "UDP", eps))
}

pub fn mk_node_json(name: &str, address: &str) -> Value {
    berth_testing::mk_node_json(
        name,
        json!({"kubernetes.io/hostname": name}),
        &[("InternalIP", address)],
    )
}

pub fn mk_node(name: &str, address: &str) -> Node {
    from_json(mk_node_json(name, address))
}

//! Builders for the datapath's input model: what the agent hands `plan` for one node.

use std::net::IpAddr;

use berth_core::Protocol;
use berth_datapath::{Endpoint, NodeInfo, ServicePort, ServicePortName};

pub fn port_name(namespace: &str, name: &str, port: &str) -> ServicePortName {
    ServicePortName {
        namespace: namespace.into(),
        name: name.into(),
        port: port.into(),
    }
}

/// A TCP ClusterIP Service port with Cluster traffic policies and nothing else exposed; tests
/// set the fields they are about on the result.
pub fn mk_service_port(
    name: ServicePortName,
    cluster_ip: IpAddr,
    port: u16,
    endpoints: Vec<Endpoint>,
) -> ServicePort {
    ServicePort {
        name,
        protocol: Protocol::Tcp,
        port,
        cluster_ips: vec![cluster_ip],
        node_port: None,
        external_ips: vec![],
        load_balancer_ingress: vec![],
        source_ranges: vec![],
        // No affinity, Cluster policies.
        session_affinity: Default::default(),
        external_traffic_policy: Default::default(),
        internal_traffic_policy: Default::default(),
        health_check_node_port: None,
        endpoints: endpoints.into(),
    }
}

/// A ready, serving endpoint on `node`.
pub fn mk_endpoint(ip: IpAddr, port: u16, node: &str) -> Endpoint {
    Endpoint {
        ip,
        port,
        ready: true,
        serving: true,
        terminating: false,
        node_name: Some(node.into()),
        hints: None,
    }
}

pub fn mk_node_info(name: &str, address: IpAddr) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        addresses: vec![address],
        zone: None,
    }
}

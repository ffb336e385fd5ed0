//! The input of kube-proxy's `TestOverallIPTablesRules` (pkg/proxy/iptables/proxier_test.go) as a
//! berth node view: the kube-proxy golden test compares berth's plan of it with kube-proxy's
//! dump, the nftables equality test loads it through both writers. Address plan: kube-proxy's
//! test's own (Services 172.30.0.0/16, endpoints 10.180.0.0/24, node ports 3001-3003).

use std::net::IpAddr;

use berth_core::TrafficPolicy;
use berth_datapath::*;
use berth_testing::{mk_endpoint, mk_node_info, mk_service_port, port_name};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// kube-proxy's fake node: `testNodeName`.
pub const NODE: &str = "test-node";

fn svc(ns: &str, name: &str, cluster_ip: &str, endpoints: &[(&str, Option<&str>)]) -> ServicePort {
    let endpoints = endpoints
        .iter()
        .map(|(addr, node)| {
            let mut ep = mk_endpoint(ip(addr), 80, node.unwrap_or(""));
            ep.node_name = node.map(Into::into);
            ep
        })
        .collect();
    mk_service_port(port_name(ns, name, "p80"), ip(cluster_ip), 80, endpoints)
}

fn lb(addr: &str) -> LoadBalancerIngress {
    LoadBalancerIngress {
        ip: ip(addr),
        mode: IpMode::Vip,
    }
}

/// The Services and EndpointSlices of `TestOverallIPTablesRules`, as berth's input.
pub fn kube_proxy_overall_view() -> NodeView {
    let svc1 = svc("ns1", "svc1", "172.30.0.41", &[("10.180.0.1", None)]);

    // LoadBalancer, Local policy; its only endpoint has no nodeName, so it is not local.
    let mut svc2 = svc("ns2", "svc2", "172.30.0.42", &[("10.180.0.2", None)]);
    svc2.node_port = Some(3001);
    svc2.load_balancer_ingress = vec![lb("1.2.3.4")];
    svc2.external_ips = vec![ip("192.168.99.22")];
    svc2.external_traffic_policy = TrafficPolicy::Local;
    svc2.health_check_node_port = Some(30000);

    let mut svc3 = svc("ns3", "svc3", "172.30.0.43", &[("10.180.0.3", None)]);
    svc3.node_port = Some(3003);

    // NodePort type without a node port, one external IP; one endpoint local.
    let mut svc4 = svc(
        "ns4",
        "svc4",
        "172.30.0.44",
        &[("10.180.0.4", None), ("10.180.0.5", Some(NODE))],
    );
    svc4.external_ips = vec![ip("192.168.99.33")];

    // LoadBalancer, Cluster policy, source ranges, ClientIP affinity. Its healthCheckNodePort
    // counts only with Local policy, so it is left out as the API server would.
    let mut svc5 = svc("ns5", "svc5", "172.30.0.45", &[("10.180.0.3", None)]);
    svc5.node_port = Some(3002);
    svc5.load_balancer_ingress = vec![lb("5.6.7.8")];
    svc5.source_ranges = vec!["203.0.113.0/25".parse().unwrap()];
    svc5.session_affinity = SessionAffinity::ClientIp {
        timeout_seconds: 10800,
    };

    let svc6 = svc("ns6", "svc6", "172.30.0.46", &[]);

    NodeView {
        node: mk_node_info(NODE, ip("192.168.0.2")),
        services: vec![svc1, svc2, svc3, svc4, svc5, svc6],
    }
}

//! The conntrack cleanup plan: which UDP flows go stale when a Service's endpoints change.

#![allow(clippy::unwrap_used)]

use berth_agent::{plan_conntrack_cleanup, ConntrackFlow};
use berth_core::{IpFamily, Protocol};
use berth_datapath::{Endpoint, IpMode, LoadBalancerIngress, ServicePort};
use berth_testing::{mk_endpoint, mk_service_port, port_name};

fn mk_port(protocol: Protocol, endpoints: &[(&str, bool)]) -> ServicePort {
    let endpoints = endpoints
        .iter()
        .map(|(ip, ready)| Endpoint {
            ready: *ready,
            serving: *ready,
            ..mk_endpoint(ip.parse().unwrap(), 5353, "node-1")
        })
        .collect();
    let mut port = mk_service_port(
        port_name("kube-system", "dns", "dns"),
        "10.96.0.10".parse().unwrap(),
        53,
        endpoints,
    );
    port.protocol = protocol;
    port
}

fn to_endpoint(service_ip: &str, endpoint_ip: &str) -> ConntrackFlow {
    ConntrackFlow::ServiceToEndpoint {
        service_ip: service_ip.parse().unwrap(),
        endpoint_ip: endpoint_ip.parse().unwrap(),
    }
}

fn service_ip(ip: &str) -> ConntrackFlow {
    ConntrackFlow::ServiceIp {
        service_ip: ip.parse().unwrap(),
    }
}

#[test]
fn a_removed_udp_endpoint_clears_its_flows_from_the_service_ip() {
    let old = [mk_port(
        Protocol::Udp,
        &[("10.244.1.5", true), ("10.244.1.6", true)],
    )];
    let new = [mk_port(Protocol::Udp, &[("10.244.1.5", true)])];
    assert_eq!(
        plan_conntrack_cleanup(&old, &new),
        vec![to_endpoint("10.96.0.10", "10.244.1.6")]
    );
}

#[test]
fn an_endpoint_turning_unready_counts_as_gone() {
    let old = [mk_port(
        Protocol::Udp,
        &[("10.244.1.5", true), ("10.244.1.6", true)],
    )];
    let new = [mk_port(
        Protocol::Udp,
        &[("10.244.1.5", true), ("10.244.1.6", false)],
    )];
    assert_eq!(
        plan_conntrack_cleanup(&old, &new),
        vec![to_endpoint("10.96.0.10", "10.244.1.6")]
    );
}

#[test]
fn every_frontend_and_the_node_port_are_cleared() {
    let mut old = mk_port(Protocol::Udp, &[("10.244.1.5", true), ("10.244.1.6", true)]);
    old.node_port = Some(30053);
    old.external_ips = vec!["198.18.0.50".parse().unwrap()];
    old.load_balancer_ingress = vec![
        LoadBalancerIngress {
            ip: "198.18.0.200".parse().unwrap(),
            mode: IpMode::Vip,
        },
        LoadBalancerIngress {
            ip: "198.18.0.201".parse().unwrap(),
            mode: IpMode::Proxy,
        },
    ];
    let mut new = old.clone();
    new.endpoints.edit(|eps| eps.truncate(1));
    let mut want = vec![
        to_endpoint("10.96.0.10", "10.244.1.6"),
        to_endpoint("198.18.0.50", "10.244.1.6"),
        // The Proxy-mode address is not captured on the node, so it has no flows here.
        to_endpoint("198.18.0.200", "10.244.1.6"),
        ConntrackFlow::NodePortToEndpoint {
            node_port: 30053,
            endpoint_ip: "10.244.1.6".parse().unwrap(),
        },
    ];
    want.sort();
    assert_eq!(plan_conntrack_cleanup(&[old], &[new]), want);
}

#[test]
fn losing_all_endpoints_also_clears_the_service_addresses() {
    let mut old = mk_port(Protocol::Udp, &[("10.244.1.5", true)]);
    old.node_port = Some(30053);
    let mut new = old.clone();
    new.endpoints = Default::default();
    let mut want = vec![
        to_endpoint("10.96.0.10", "10.244.1.5"),
        ConntrackFlow::NodePortToEndpoint {
            node_port: 30053,
            endpoint_ip: "10.244.1.5".parse().unwrap(),
        },
        service_ip("10.96.0.10"),
        ConntrackFlow::NodePort {
            node_port: 30053,
            family: IpFamily::V4,
        },
    ];
    want.sort();
    assert_eq!(plan_conntrack_cleanup(&[old.clone()], &[new]), want);
    // A deleted Service is the same as one without endpoints.
    assert_eq!(plan_conntrack_cleanup(&[old], &[]), want);
}

#[test]
fn gaining_the_first_endpoint_clears_flows_cached_while_it_rejected() {
    let old = [mk_port(Protocol::Udp, &[])];
    let new = [mk_port(Protocol::Udp, &[("10.244.1.5", true)])];
    assert_eq!(
        plan_conntrack_cleanup(&old, &new),
        vec![service_ip("10.96.0.10")]
    );
    // A new Service with endpoints: the same.
    assert_eq!(
        plan_conntrack_cleanup(&[], &new),
        vec![service_ip("10.96.0.10")]
    );
}

#[test]
fn unchanged_or_growing_endpoint_sets_need_nothing() {
    let old = [mk_port(Protocol::Udp, &[("10.244.1.5", true)])];
    let new = [mk_port(
        Protocol::Udp,
        &[("10.244.1.5", true), ("10.244.1.6", true)],
    )];
    assert!(plan_conntrack_cleanup(&old, &old).is_empty());
    assert!(plan_conntrack_cleanup(&old, &new).is_empty());
}

#[test]
fn tcp_and_sctp_need_no_cleanup() {
    for protocol in [Protocol::Tcp, Protocol::Sctp] {
        let old = [mk_port(
            protocol,
            &[("10.244.1.5", true), ("10.244.1.6", true)],
        )];
        let new = [mk_port(protocol, &[])];
        assert!(
            plan_conntrack_cleanup(&old, &new).is_empty(),
            "{protocol:?}"
        );
        assert!(
            plan_conntrack_cleanup(&new, &old).is_empty(),
            "{protocol:?}"
        );
        assert!(plan_conntrack_cleanup(&old, &[]).is_empty(), "{protocol:?}");
    }
}

#[test]
fn ipv6_endpoints_pair_with_ipv6_service_addresses_only() {
    let mut old = mk_port(
        Protocol::Udp,
        &[("fd00:10:244::5", true), ("10.244.1.5", true)],
    );
    old.cluster_ips.push("fd00:10:96::10".parse().unwrap());
    let mut new = old.clone();
    new.endpoints.edit(|eps| eps.retain(|ep| ep.ip.is_ipv4()));
    assert_eq!(
        plan_conntrack_cleanup(&[old], &[new]),
        vec![to_endpoint("fd00:10:96::10", "fd00:10:244::5")]
    );
}

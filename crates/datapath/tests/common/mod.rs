//! Address plan for every datapath test (docs/architecture.md, "Address plan"):
//! - this node `node-a` 198.18.0.11, its pods 10.244.1.0/24; other node `node-b` 198.18.0.12, pods 10.244.2.0/24
//! - cluster (pod) CIDR 10.244.0.0/16, Services 10.96.0.0/16, node ports 30000-32767
//! - external IPs 198.18.0.150+, load-balancer IPs 198.18.0.200+, off-cluster client 198.18.0.100
#![allow(dead_code, clippy::unwrap_used)]

pub mod kube_proxy;
pub mod netns;

use berth_core::{Protocol, TrafficPolicy};
use std::net::IpAddr;

use berth_core::IpFamily;
use berth_datapath::fake::MemoryNft;
use berth_datapath::nft::NftSyncer;
use berth_datapath::trace::{trace, Origin, Outcome, Packet, TraceEnv, Verdict};
use berth_datapath::*;
use berth_testing::{mk_endpoint, mk_node_info, mk_service_port, port_name};

pub const NODE_IP: &str = "198.18.0.11";
pub const CLIENT_IP: &str = "198.18.0.100";
pub const LOCAL_POD: &str = "10.244.1.77";

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn mk_node() -> NodeInfo {
    mk_node_info("node-a", ip(NODE_IP))
}

pub fn mk_ep(addr: &str, port: u16, node: &str) -> Endpoint {
    mk_endpoint(ip(addr), port, node)
}

pub fn mk_terminating(mut ep: Endpoint) -> Endpoint {
    ep.ready = false;
    ep.terminating = true;
    ep
}

pub fn mk_svc(name: &str, cluster_ip: &str, port: u16, endpoints: Vec<Endpoint>) -> ServicePort {
    mk_service_port(
        port_name("ns1", name, "p80"),
        ip(cluster_ip),
        port,
        endpoints,
    )
}

pub fn lb(addr: &str) -> LoadBalancerIngress {
    LoadBalancerIngress {
        ip: ip(addr),
        mode: IpMode::Vip,
    }
}

/// The fixed set of the issue: ClusterIP; LB with Local policy, externalIP and health-check port;
/// NodePort; NodePort with externalIP; LB with source ranges and affinity; no endpoints.
pub fn mk_fixed_view() -> NodeView {
    let clusterip = mk_svc(
        "svc-clusterip",
        "10.96.0.10",
        80,
        vec![
            mk_ep("10.244.1.2", 8080, "node-a"),
            mk_ep("10.244.2.2", 8080, "node-b"),
        ],
    );

    let mut lb_local = mk_svc(
        "svc-lb-local",
        "10.96.0.20",
        80,
        vec![
            mk_ep("10.244.1.3", 8080, "node-a"),
            mk_ep("10.244.2.3", 8080, "node-b"),
        ],
    );
    lb_local.node_port = Some(30020);
    lb_local.external_ips = vec![ip("198.18.0.150")];
    lb_local.load_balancer_ingress = vec![lb("198.18.0.200")];
    lb_local.external_traffic_policy = TrafficPolicy::Local;
    lb_local.health_check_node_port = Some(30120);

    let mut nodeport = mk_svc(
        "svc-nodeport",
        "10.96.0.30",
        80,
        vec![mk_ep("10.244.2.4", 8080, "node-b")],
    );
    nodeport.node_port = Some(30030);

    let mut nodeport_ext = mk_svc(
        "svc-nodeport-extip",
        "10.96.0.40",
        80,
        vec![
            mk_ep("10.244.1.5", 8080, "node-a"),
            mk_ep("10.244.2.5", 8080, "node-b"),
            mk_ep("10.244.2.6", 8080, "node-b"),
        ],
    );
    nodeport_ext.node_port = Some(30040);
    nodeport_ext.external_ips = vec![ip("198.18.0.151")];

    let mut lb_fw = mk_svc(
        "svc-lb-fw",
        "10.96.0.50",
        443,
        vec![
            mk_ep("10.244.1.6", 8443, "node-a"),
            mk_ep("10.244.2.7", 8443, "node-b"),
        ],
    );
    lb_fw.node_port = Some(30050);
    lb_fw.load_balancer_ingress = vec![
        lb("198.18.0.201"),
        LoadBalancerIngress {
            ip: ip("198.18.0.202"),
            mode: IpMode::Proxy,
        },
    ];
    lb_fw.source_ranges = vec![
        "203.0.113.0/24".parse().unwrap(),
        "198.18.0.0/28".parse().unwrap(),
    ];
    lb_fw.session_affinity = SessionAffinity::ClientIp {
        timeout_seconds: 300,
    };

    let mut none = mk_svc("svc-no-endpoints", "10.96.0.60", 80, vec![]);
    none.node_port = Some(30060);
    none.external_ips = vec![ip("198.18.0.152")];

    NodeView {
        node: mk_node(),
        services: vec![clusterip, lb_local, nodeport, nodeport_ext, lb_fw, none],
    }
}

pub fn mk_options(dispatch: Dispatch) -> PlanOptions {
    PlanOptions {
        dispatch,
        cluster_cidr: Some("10.244.0.0/16".parse().unwrap()),
        ..PlanOptions::default()
    }
}

pub fn env() -> TraceEnv {
    TraceEnv {
        local_addresses: vec![ip(NODE_IP), ip("127.0.0.1")],
        ..TraceEnv::default()
    }
}

/// Every packet the fixed set can receive that the tracer tests compare: to each Service's
/// cluster, external and load-balancer addresses and node port, from a local pod, an off-cluster
/// client, another LAN host and (locally) the node; and one to an address no Service has.
pub fn fixed_view_packets(view: &NodeView) -> Vec<Packet> {
    let mut packets = Vec::new();
    for svc in &view.services {
        let mut dsts: Vec<(String, u16)> = svc
            .cluster_ips
            .iter()
            .chain(&svc.external_ips)
            .map(|ip| (ip.to_string(), svc.port))
            .collect();
        dsts.extend(
            svc.load_balancer_ingress
                .iter()
                .map(|i| (i.ip.to_string(), svc.port)),
        );
        dsts.extend(svc.node_port.map(|np| (NODE_IP.to_string(), np)));
        for (dst, port) in dsts {
            for src in [LOCAL_POD, CLIENT_IP, "198.18.0.250"] {
                packets.push(packet(src, &dst, port, Origin::Network));
            }
            packets.push(packet(NODE_IP, &dst, port, Origin::LocalProcess));
        }
    }
    packets.push(packet(CLIENT_IP, "10.96.9.9", 80, Origin::Network));
    packets
}

pub fn packet(src: &str, dst: &str, dport: u16, origin: Origin) -> Packet {
    Packet {
        src: ip(src),
        dst: ip(dst),
        protocol: Protocol::Tcp,
        dport,
        origin,
        bridged: false,
    }
}

/// Outcomes without affinity details, probabilities rounded for comparison.
pub fn outcomes(rs: &Ruleset, env: &TraceEnv, p: &Packet) -> Vec<(Verdict, bool, u32)> {
    trace(rs, env, p)
        .unwrap()
        .into_iter()
        .map(
            |(
                Outcome {
                    verdict,
                    masqueraded,
                    ..
                },
                prob,
            )| (verdict, masqueraded, (prob * 1000.0).round() as u32),
        )
        .collect()
}

pub fn dnat(addr: &str) -> Verdict {
    Verdict::Dnat(addr.parse().unwrap())
}

/// Every jump target exists, and every berth chain except the entry chains is jumped to.
pub fn check_consistency(rs: &Ruleset) {
    use std::collections::BTreeSet;
    for jump in &rs.jumps {
        let target = jump.rule.jump_target().unwrap();
        assert!(
            rs.chain(jump.table, target).is_some(),
            "built-in jump to missing {target}"
        );
    }
    for (table, rules) in &rs.tables {
        let mut referenced: BTreeSet<&ChainName> = rs
            .jumps
            .iter()
            .filter(|j| j.table == *table)
            .filter_map(|j| j.rule.jump_target())
            .collect();
        for (chain, chain_rules) in &rules.chains {
            assert!(chain.is_berth(), "{chain}");
            for rule in chain_rules {
                if let Some(target) = rule.jump_target() {
                    assert!(
                        rules.chains.contains_key(target),
                        "{table}/{chain} jumps to missing {target}"
                    );
                    referenced.insert(target);
                }
                for m in rule.matches.iter() {
                    if let Match::Recent { name, .. } = m {
                        assert!(
                            rules.chains.contains_key(name),
                            "recent list {name} names no chain"
                        );
                    }
                }
            }
        }
        for chain in rules.chains.keys() {
            let is_mark_masq = chain.as_str() == "BERTH-MARK-MASQ" && *table == Table::Nat;
            assert!(
                referenced.contains(chain) || is_mark_masq,
                "{table}/{chain} is unreferenced"
            );
        }
    }
}

/// What the nftables backend leaves after a full sync of `rs`, as a ruleset the tracer follows.
pub fn nft_traceable(rs: &Ruleset, family: IpFamily) -> Ruleset {
    let mut syncer = NftSyncer::new(MemoryNft::new(family), family);
    syncer.sync(rs).unwrap();
    syncer.nft().traceable()
}

//! IPv6 through the real `ip6tables-restore`: berth's planned IPv6 rules applied by the real
//! `CommandIptables` inside one network namespace this test creates (`berth-t<pid>-v6`), where
//! an echo server listens on a pod address and clients in the same namespace reach it through a
//! ClusterIP and a node port. Root and ip6tables only (skips with a message elsewhere, fails under
//! `CI=true`).
//!
//! Address plan (IPv6 counterparts of docs/architecture.md's): the node fd00:198:18::11 and the
//! pod fd00:244:1::5 on one end of a veth pair
//! whose both ends stay in the namespace; Services fd00:96::/112 routed to it; node port 30180.

#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use berth_core::IpFamily;
use berth_datapath::backend::SyncKind;
use berth_datapath::iptables::CommandIptables;
use berth_datapath::iptables::Syncer;
use berth_datapath::{plan, rewritten_every_sync, Dispatch, NodeView, PlanOptions};
use berth_lab::echo::{tcp_echo, udp_echo, EchoServer};
use berth_testing::{mk_endpoint, mk_node_info, mk_service_port, port_name, Requirement};

const TIMEOUT: Duration = Duration::from_secs(3);

/// The namespace, deleted when dropped (also when an assertion fails).
struct Netns(String);

impl Netns {
    fn create() -> Netns {
        let name = format!("berth-t{}-v6", std::process::id());
        run(&["ip", "netns", "add", &name]);
        let ns = Netns(name);
        for step in [
            "ip link set lo up",
            "ip link add v0 type veth peer name v1",
            "ip link set v1 up",
            "ip link set v0 up",
            "ip -6 addr add fd00:198:18::11/128 dev v0 nodad",
            "ip -6 addr add fd00:244:1::5/128 dev v0 nodad",
            "ip -6 route add fd00:96::/112 dev v0",
        ] {
            ns.exec(step);
        }
        ns
    }

    fn exec(&self, line: &str) -> String {
        let mut argv = vec!["ip", "netns", "exec", &self.0];
        argv.extend(line.split_whitespace());
        run(&argv)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

fn run(argv: &[&str]) -> String {
    let out = Command::new(argv[0]).args(&argv[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{argv:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

#[test]
fn ipv6_cluster_ip_and_node_port_through_real_ip6tables() {
    berth_testing::require!(
        Requirement::Netns,
        Requirement::Ip6tables,
        Requirement::Iptables
    );
    let ns = Netns::create();
    let pod = ip("fd00:244:1::5");
    let _echo = EchoServer::bind(
        &ns.0,
        "v6pod",
        Some(SocketAddr::new(pod, 8080)),
        Some(SocketAddr::new(pod, 8053)),
    )
    .unwrap()
    .start()
    .unwrap();

    let mut web = mk_service_port(
        port_name("default", "web6", "http"),
        ip("fd00:96::a"),
        80,
        vec![mk_endpoint(pod, 8080, "node1")],
    );
    web.node_port = Some(30180);
    let mut dns = mk_service_port(
        port_name("default", "web6", "dns"),
        ip("fd00:96::a"),
        53,
        vec![mk_endpoint(pod, 8053, "node1")],
    );
    dns.protocol = berth_core::Protocol::Udp;
    let view = NodeView {
        node: mk_node_info("node1", ip("fd00:198:18::11")),
        services: vec![web, dns],
    };
    for dispatch in [Dispatch::Tree, Dispatch::Linear] {
        let options = PlanOptions {
            family: IpFamily::V6,
            dispatch,
            cluster_cidr: Some("fd00:244::/48".parse().unwrap()),
            ..PlanOptions::default()
        };
        let ipt = CommandIptables::in_netns(IpFamily::V6, ns.0.clone());
        let mut syncer = Syncer::new(ipt).rewriting_every_sync(rewritten_every_sync(dispatch));
        let report = syncer.sync(&plan(&view, &options)).unwrap();
        assert_eq!(report.kind, SyncKind::Full, "{dispatch:?}");
        // The rules are in ip6tables, and none in iptables.
        let v6 = ns.exec("ip6tables-save -t nat");
        assert!(v6.contains("-A BERTH-SERVICES"), "{dispatch:?}: {v6}");
        assert!(v6.contains("--to-destination [fd00:244:1::5]:8080"), "{v6}");
        let v4 = ns.exec("iptables-save -t nat");
        assert!(!v4.contains("BERTH-"), "{v4}");

        let reply = tcp_echo(&ns.0, "[fd00:96::a]:80".parse().unwrap(), TIMEOUT)
            .unwrap_or_else(|err| panic!("{dispatch:?}: ClusterIP: {err}"));
        assert_eq!(reply.pod, "v6pod");
        let reply = tcp_echo(&ns.0, "[fd00:198:18::11]:30180".parse().unwrap(), TIMEOUT)
            .unwrap_or_else(|err| panic!("{dispatch:?}: node port: {err}"));
        assert_eq!(reply.pod, "v6pod");
        let reply = udp_echo(&ns.0, "[fd00:96::a]:53".parse().unwrap(), TIMEOUT)
            .unwrap_or_else(|err| panic!("{dispatch:?}: UDP ClusterIP: {err}"));
        assert_eq!(reply.pod, "v6pod");
    }
}

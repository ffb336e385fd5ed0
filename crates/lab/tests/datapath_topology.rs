//! The namespace topology and the echo server, with real namespaces and no iptables rules: the
//! plumbing every datapath test stands on. Needs root and iproute2; skips with a message elsewhere (fails under `CI=true`).
//!
//! Address plan (docs/architecture.md): LAN 198.18.0.0/24 (node1 .11, node2 .12, client .100), pods
//! 10.244.<node>.0/24 with the node at .1. Every namespace is named `berth-tt<pid>-*` and deleted
//! when the topology is dropped. Tests run one at a time (a lock), as they share the host's kernel.

#![allow(clippy::unwrap_used)]

use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use berth_lab::echo::{tcp_echo, tcp_echo_many, udp_echo, EchoConnection, EchoHandle, EchoServer};
use berth_lab::topology::{remove_leftovers, Topology, TopologySpec};
use berth_testing::Requirement;

static SERIAL: Mutex<()> = Mutex::new(());

const TIMEOUT: Duration = Duration::from_secs(3);

fn ready() -> bool {
    berth_testing::require(&[Requirement::Netns, Requirement::Program("sysctl")])
}

fn mk_topology() -> Topology {
    let spec = TopologySpec::new(TopologySpec::unique_prefix("tt"))
        .node("node1", ["a1", "a2"])
        .with_route_localnet()
        .node("node2", ["b1"])
        .client("client");
    Topology::create(&spec).unwrap()
}

fn pod_addr(topo: &Topology, pod: &str, port: u16) -> SocketAddr {
    let (_, p) = topo.layout().pod(pod).unwrap();
    SocketAddr::new(IpAddr::V4(p.ip), port)
}

fn start_echo(topo: &Topology, pod: &str) -> EchoHandle {
    let addr = pod_addr(topo, pod, 8080);
    let udp = pod_addr(topo, pod, 8053);
    EchoServer::bind(topo.netns(pod).unwrap(), pod, Some(addr), Some(udp))
        .unwrap()
        .start()
        .unwrap()
}

fn netns_list() -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn pods_reach_each_other_across_nodes_and_see_real_addresses() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !ready() {
        return;
    }
    let topo = mk_topology();
    let _a1 = start_echo(&topo, "a1");
    let _b1 = start_echo(&topo, "b1");
    let a2 = topo.netns("a2").unwrap();

    // Same node, through the node's routing.
    let reply = tcp_echo(a2, pod_addr(&topo, "a1", 8080), TIMEOUT).unwrap();
    assert_eq!(reply.pod, "a1");
    assert_eq!(reply.client.ip(), pod_addr(&topo, "a2", 0).ip());

    // Across nodes, over the LAN: no address translation anywhere.
    let reply = tcp_echo(a2, pod_addr(&topo, "b1", 8080), TIMEOUT).unwrap();
    assert_eq!(reply.pod, "b1");
    assert_eq!(reply.client.ip(), pod_addr(&topo, "a2", 0).ip());
    let reply = udp_echo(a2, pod_addr(&topo, "b1", 8053), TIMEOUT).unwrap();
    assert_eq!(reply.pod, "b1");
    assert_eq!(reply.client.ip(), pod_addr(&topo, "a2", 0).ip());

    // A node reaches its own and the other node's pods.
    let node2 = topo.netns("node2").unwrap();
    let reply = tcp_echo(node2, pod_addr(&topo, "a1", 8080), TIMEOUT).unwrap();
    assert_eq!(reply.pod, "a1");
    assert_eq!(reply.client.ip().to_string(), "198.18.0.12");
    let reply = tcp_echo(node2, pod_addr(&topo, "b1", 8080), TIMEOUT).unwrap();
    assert_eq!(reply.client.ip().to_string(), "10.244.2.1");

    // Nothing listens on a2: the kernel refuses.
    let err = tcp_echo(
        topo.netns("b1").unwrap(),
        pod_addr(&topo, "a2", 8080),
        TIMEOUT,
    )
    .unwrap_err();
    assert_eq!(err.io_kind(), Some(ErrorKind::ConnectionRefused), "{err}");
}

#[test]
fn many_connections_from_one_thread_and_a_long_lived_one() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !ready() {
        return;
    }
    let topo = mk_topology();
    let a1 = start_echo(&topo, "a1");
    let client = topo.netns("a2").unwrap();
    let target = pod_addr(&topo, "a1", 8080);

    let replies = tcp_echo_many(client, target, 50, TIMEOUT).unwrap();
    assert_eq!(replies.len(), 50);
    assert!(replies.iter().all(|r| r.pod == "a1"));
    // The 50 closes reach the server's workers after the client made them; counted at once,
    // the ones still in flight made this test fail under load.
    assert_eq!(a1.open_connections_settled(0, TIMEOUT), 0);

    let (mut conn, first) = EchoConnection::open(client, target, TIMEOUT).unwrap();
    for _ in 0..3 {
        assert_eq!(conn.ping().unwrap(), first);
    }
    assert_eq!(a1.open_connections_settled(1, TIMEOUT), 1);
}

#[test]
fn the_client_reaches_nodes_on_the_lan_and_steering_picks_the_node() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !ready() {
        return;
    }
    let mut topo = mk_topology();
    let node2_ns = topo.netns("node2").unwrap().to_string();
    // A server in the node namespace itself, as a hostNetwork pod would have.
    let node_echo = EchoServer::bind(
        &node2_ns,
        "node2",
        Some("0.0.0.0:9000".parse().unwrap()),
        None,
    )
    .unwrap()
    .start()
    .unwrap();
    let client = topo.netns("client").unwrap().to_string();
    let reply = tcp_echo(&client, "198.18.0.12:9000".parse().unwrap(), TIMEOUT).unwrap();
    assert_eq!(reply.pod, "node2");
    assert_eq!(reply.client.ip().to_string(), "198.18.0.100");

    // Steering stands in for the node that answers ARP for a load-balancer address.
    topo.steer("client", "198.18.0.200".parse().unwrap(), "node2")
        .unwrap();
    let routes = topo.exec(&client, &["ip", "route", "show"]).unwrap();
    assert!(
        routes.contains("198.18.0.200 via 198.18.0.12 dev eth0"),
        "{routes}"
    );
    drop(node_echo);
}

#[test]
fn dropping_the_topology_leaves_no_namespace_behind() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !ready() {
        return;
    }
    let topo = mk_topology();
    let prefix = topo.layout().prefix.clone();
    assert_eq!(netns_list().matches(&format!("{prefix}-")).count(), 7);
    let settings = [
        ("node1", "net.ipv4.ip_forward", "1"),
        ("node1", "net.ipv4.conf.all.route_localnet", "1"),
        ("node2", "net.ipv4.conf.all.route_localnet", "0"),
    ];
    let mut topo = topo;
    for (node, key, want) in settings {
        let ns = topo.netns(node).unwrap().to_string();
        let got = topo.exec(&ns, &["sysctl", "-n", key]).unwrap();
        assert_eq!(got.trim(), want, "{node} {key}");
    }
    drop(topo);
    assert!(
        !netns_list().contains(&format!("{prefix}-")),
        "{}",
        netns_list()
    );

    // A topology whose process died is swept by prefix.
    let spec = TopologySpec::new(format!("{prefix}x")).node("n1", ["p1"]);
    let leaked = Topology::create(&spec).unwrap();
    std::mem::forget(leaked);
    let removed = remove_leftovers(&format!("{prefix}x")).unwrap();
    assert_eq!(removed.len(), 3, "{removed:?}");
    assert!(!netns_list().contains(&format!("{prefix}x-")));
}

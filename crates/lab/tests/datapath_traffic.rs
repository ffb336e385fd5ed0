//! berth's real datapath with real traffic: the planned rules applied by the real
//! `CommandIptables` inside node namespaces, exercised by TCP and UDP between pod, node and client
//! namespaces. Root only (skips with a message elsewhere); runs serially.
//!
//! Address plan (DESIGN.md §9):
//! - LAN 198.18.0.0/24: node1 .11, node2 .12, client .100, other .101; LB IPs .200-.203, steered
//!   by the clients' routes to the node that would announce them.
//! - node1 pods a1 10.244.1.2, a2 10.244.1.3, c1 10.244.1.4 (a client pod); node2 pods
//!   b1 10.244.2.2, b2 10.244.2.3. Each node is its pods' gateway at 10.244.<n>.1.
//! - Services 10.96.0.0/16, node ports 30080-30087. Echo servers: TCP 8080, UDP 8053.
//!
//! One cluster is built, every scenario runs with tree dispatch, then every scenario again after
//! a restart of the agents with linear dispatch. The namespaces are deleted at the end, also when
//! a scenario fails. `cargo test --test datapath_traffic -- <substring>` runs matching scenarios.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::ExitCode;
use std::time::Duration;

use berth_datapath::exec::CommandIptables;
use berth_datapath::sync::{SyncKind, Syncer};
use berth_datapath::{
    plan, rewritten_every_sync, Dispatch, Endpoint, IpFamily, IpMode, LoadBalancerIngress,
    NodeInfo, NodeView, PlanOptions, Protocol, ServicePort, ServicePortName, SessionAffinity,
    TrafficPolicy,
};
use berth_lab::echo::{tcp_echo, tcp_echo_many, udp_echo, EchoConnection, EchoHandle, EchoServer};
use berth_lab::topology::{preflight, remove_orphans, Topology, TopologyError, TopologySpec};

const OK_TIMEOUT: Duration = Duration::from_secs(3);
/// Long enough for a SYN to be answered on a quiet LAN, short enough to keep DROP tests fast.
const DROP_TIMEOUT: Duration = Duration::from_millis(800);
const TCP_PORT: u16 = 8080;
const UDP_PORT: u16 = 8053;
const NODES: [&str; 2] = ["node1", "node2"];

/// The namespace tag of this test binary: namespaces are `berth-tr<pid>-*`.
const TAG: &str = "tr";

fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

fn svc_ip(last: u8) -> IpAddr {
    v4(10, 96, 0, last)
}

fn sa(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

struct Cluster {
    topo: Topology,
    /// Kept alive for the whole run.
    _echoes: Vec<EchoHandle>,
    services: Vec<ServicePort>,
    syncers: BTreeMap<&'static str, Syncer<CommandIptables>>,
    /// The dispatch mode of the last restart.
    dispatch: Dispatch,
}

impl Cluster {
    fn build() -> Cluster {
        let spec = TopologySpec::new(TopologySpec::unique_prefix(TAG))
            .node("node1", ["a1", "a2", "c1"])
            .with_route_localnet()
            .node("node2", ["b1", "b2"])
            .client("client")
            .client("other");
        let mut topo = Topology::create(&spec).unwrap();
        let echoes = ["a1", "a2", "b1", "b2"]
            .into_iter()
            .map(|pod| {
                let ip = pod_ip(&topo, pod);
                EchoServer::bind(
                    topo.netns(pod).unwrap(),
                    pod,
                    Some(sa(ip, TCP_PORT)),
                    Some(sa(ip, UDP_PORT)),
                )
                .unwrap()
                .start()
                .unwrap()
            })
            .collect();
        for (client, lb, node) in [
            ("client", 200, "node2"),
            ("client", 201, "node1"),
            ("client", 202, "node1"),
            ("other", 202, "node1"),
            ("client", 203, "node2"),
        ] {
            topo.steer(client, Ipv4Addr::new(198, 18, 0, lb), node)
                .unwrap();
        }
        let services = mk_services(&topo);
        Cluster {
            topo,
            _echoes: echoes,
            services,
            syncers: BTreeMap::new(),
            dispatch: Dispatch::Tree,
        }
    }

    fn netns(&self, name: &str) -> String {
        self.topo.netns(name).unwrap().to_string()
    }

    fn view(&self, node: &str) -> NodeView {
        NodeView {
            node: NodeInfo {
                name: node.to_string(),
                addresses: vec![IpAddr::V4(self.topo.layout().node(node).unwrap().lan_ip)],
            },
            services: self.services.clone(),
        }
    }

    fn options(dispatch: Dispatch) -> PlanOptions {
        PlanOptions {
            family: IpFamily::V4,
            dispatch,
            cluster_cidr: Some("10.244.0.0/16".parse().unwrap()),
            ..PlanOptions::default()
        }
    }

    /// Starts a fresh agent datapath (a new Syncer, as after a restart) on every node and syncs.
    fn restart_agents(&mut self, dispatch: Dispatch) {
        for node in NODES {
            let ipt = CommandIptables::in_netns(IpFamily::V4, self.netns(node));
            let mut syncer = Syncer::new(ipt).rewriting_every_sync(rewritten_every_sync(dispatch));
            let report = syncer
                .sync(&plan(&self.view(node), &Self::options(dispatch)))
                .unwrap_or_else(|err| panic!("sync on {node}: {err}"));
            assert_eq!(report.kind, SyncKind::Full);
            self.syncers.insert(node, syncer);
        }
        self.dispatch = dispatch;
    }
}

fn pod_ip(topo: &Topology, pod: &str) -> IpAddr {
    IpAddr::V4(topo.layout().pod(pod).unwrap().1.ip)
}

fn mk_port(name: &str, cluster_ip: IpAddr, endpoints: Vec<Endpoint>) -> ServicePort {
    ServicePort {
        name: ServicePortName {
            namespace: "default".into(),
            name: name.into(),
            port: String::new(),
        },
        protocol: Protocol::Tcp,
        port: 80,
        cluster_ips: vec![cluster_ip],
        node_port: None,
        external_ips: vec![],
        load_balancer_ingress: vec![],
        source_ranges: vec![],
        session_affinity: SessionAffinity::None,
        external_traffic_policy: TrafficPolicy::Cluster,
        internal_traffic_policy: TrafficPolicy::Cluster,
        health_check_node_port: None,
        endpoints,
    }
}

fn lb(ip: IpAddr) -> LoadBalancerIngress {
    LoadBalancerIngress {
        ip,
        mode: IpMode::Vip,
    }
}

fn mk_services(topo: &Topology) -> Vec<ServicePort> {
    let ep = |pod: &str, port: u16| Endpoint {
        ip: pod_ip(topo, pod),
        port,
        ready: true,
        serving: true,
        terminating: false,
        node_name: Some(topo.layout().pod(pod).unwrap().0.name.clone()),
    };
    let tcp = |pod: &str| ep(pod, TCP_PORT);

    let web = mk_port("web", svc_ip(10), vec![tcp("a1"), tcp("b1")]);
    let mut web_dns = mk_port(
        "web",
        svc_ip(10),
        vec![ep("a1", UDP_PORT), ep("b1", UDP_PORT)],
    );
    web_dns.name.port = "dns".into();
    web_dns.protocol = Protocol::Udp;
    web_dns.port = 53;

    let mut public = mk_port("public", svc_ip(11), vec![tcp("a2")]);
    public.node_port = Some(30080);
    public.load_balancer_ingress = vec![lb(v4(198, 18, 0, 203))];

    let mut local = mk_port("lb-local", svc_ip(12), vec![tcp("b2")]);
    local.node_port = Some(30081);
    local.load_balancer_ingress = vec![lb(v4(198, 18, 0, 200)), lb(v4(198, 18, 0, 201))];
    local.external_traffic_policy = TrafficPolicy::Local;
    local.health_check_node_port = Some(30086);

    let mut affinity = mk_port(
        "affinity",
        svc_ip(13),
        vec![tcp("a1"), tcp("a2"), tcp("b1")],
    );
    affinity.session_affinity = SessionAffinity::ClientIp {
        timeout_seconds: 600,
    };

    let spread = mk_port("spread", svc_ip(14), vec![tcp("a1"), tcp("a2"), tcp("b1")]);

    let mut empty = mk_port("empty", svc_ip(15), vec![]);
    empty.node_port = Some(30085);

    let state = |pod: &str, ready: bool, serving: bool, terminating: bool| Endpoint {
        ready,
        serving,
        terminating,
        ..tcp(pod)
    };
    let terminating = mk_port(
        "terminating",
        svc_ip(16),
        vec![
            state("a1", false, true, true),
            state("b1", false, false, true),
            state("a2", false, false, false),
        ],
    );

    let mut ranges = mk_port("ranges", svc_ip(17), vec![tcp("a2")]);
    ranges.node_port = Some(30087);
    ranges.load_balancer_ingress = vec![lb(v4(198, 18, 0, 202))];
    ranges.source_ranges = vec!["198.18.0.100/32".parse().unwrap()];

    let hairpin = mk_port("hairpin", svc_ip(18), vec![tcp("a1")]);

    vec![
        web,
        web_dns,
        public,
        local,
        affinity,
        spread,
        empty,
        terminating,
        ranges,
        hairpin,
    ]
}

fn pods_of(replies: &[berth_lab::echo::EchoReply]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for r in replies {
        *counts.entry(r.pod.clone()).or_insert(0) += 1;
    }
    counts
}

fn ask_many(
    c: &Cluster,
    from: &str,
    addr: SocketAddr,
    n: usize,
) -> Vec<berth_lab::echo::EchoReply> {
    tcp_echo_many(&c.netns(from), addr, n, OK_TIMEOUT)
        .unwrap_or_else(|err| panic!("{from} -> {addr}: {err}"))
}

fn ask(c: &Cluster, from: &str, addr: SocketAddr) -> berth_lab::echo::EchoReply {
    tcp_echo(&c.netns(from), addr, OK_TIMEOUT)
        .unwrap_or_else(|err| panic!("{from} -> {addr}: {err}"))
}

fn assert_dropped(c: &Cluster, from: &str, addr: SocketAddr) {
    let err = tcp_echo(&c.netns(from), addr, DROP_TIMEOUT).unwrap_err();
    assert!(
        matches!(
            err.io_kind(),
            Some(ErrorKind::TimedOut | ErrorKind::WouldBlock)
        ),
        "{from} -> {addr} should be dropped (time out), got {err}"
    );
}

fn assert_refused(c: &Cluster, from: &str, addr: SocketAddr) {
    let err = tcp_echo(&c.netns(from), addr, OK_TIMEOUT).unwrap_err();
    assert_eq!(
        err.io_kind(),
        Some(ErrorKind::ConnectionRefused),
        "{from} -> {addr} should be refused, got {err}"
    );
}

fn node_ip(c: &Cluster, node: &str) -> IpAddr {
    IpAddr::V4(c.topo.layout().node(node).unwrap().lan_ip)
}

// ---- scenarios ----

fn cluster_ip_from_a_pod(c: &mut Cluster) {
    let replies = ask_many(c, "c1", sa(svc_ip(10), 80), 20);
    let pods = pods_of(&replies);
    assert_eq!(pods.keys().collect::<Vec<_>>(), ["a1", "b1"], "{pods:?}");
    let c1 = pod_ip(&c.topo, "c1");
    assert!(
        replies.iter().all(|r| r.client.ip() == c1),
        "pod traffic is not masqueraded"
    );
}

fn cluster_ip_udp_from_a_pod(c: &mut Cluster) {
    let reply = udp_echo(&c.netns("c1"), sa(svc_ip(10), 53), OK_TIMEOUT).unwrap();
    assert!(["a1", "b1"].contains(&reply.pod.as_str()), "{reply:?}");
    assert_eq!(reply.client.ip(), pod_ip(&c.topo, "c1"));
}

fn cluster_ip_from_the_nodes(c: &mut Cluster) {
    for node in NODES {
        let replies = ask_many(c, node, sa(svc_ip(10), 80), 10);
        assert!(
            replies.iter().all(|r| r.pod == "a1" || r.pod == "b1"),
            "{node}: {replies:?}"
        );
    }
}

fn node_port_with_cluster_policy_masquerades(c: &mut Cluster) {
    // Endpoint a2 lives on node1: through node2 the pod sees node2's LAN address.
    let reply = ask(c, "client", sa(node_ip(c, "node2"), 30080));
    assert_eq!(reply.pod, "a2");
    assert_eq!(reply.client.ip(), node_ip(c, "node2"));
    // Through node1 itself the source is node1's address on the pod's link.
    let reply = ask(c, "client", sa(node_ip(c, "node1"), 30080));
    assert_eq!(reply.pod, "a2");
    assert_eq!(reply.client.ip(), v4(10, 244, 1, 1));
}

fn load_balancer_ip_with_cluster_policy(c: &mut Cluster) {
    let reply = ask(c, "client", sa(v4(198, 18, 0, 203), 80));
    assert_eq!(reply.pod, "a2");
    assert_eq!(
        reply.client.ip(),
        node_ip(c, "node2"),
        "masqueraded by node2"
    );
}

fn local_policy_keeps_the_client_address(c: &mut Cluster) {
    let client_ip = v4(198, 18, 0, 100);
    let reply = ask(c, "client", sa(v4(198, 18, 0, 200), 80));
    assert_eq!(reply.pod, "b2");
    assert_eq!(reply.client.ip(), client_ip);
    let reply = ask(c, "client", sa(node_ip(c, "node2"), 30081));
    assert_eq!(reply.pod, "b2");
    assert_eq!(reply.client.ip(), client_ip);
}

fn local_policy_drops_on_a_node_without_endpoints(c: &mut Cluster) {
    assert_dropped(c, "client", sa(v4(198, 18, 0, 201), 80));
    assert_dropped(c, "client", sa(node_ip(c, "node1"), 30081));
    // Inside the cluster the Service still reaches its endpoint from every node.
    let reply = ask(c, "c1", sa(svc_ip(12), 80));
    assert_eq!(reply.pod, "b2");
}

fn client_ip_affinity_sticks(c: &mut Cluster) {
    for from in ["c1", "node2"] {
        let pods = pods_of(&ask_many(c, from, sa(svc_ip(13), 80), 30));
        assert_eq!(
            pods.len(),
            1,
            "{from} should stick to one endpoint: {pods:?}"
        );
    }
}

fn three_endpoints_share_the_load(c: &mut Cluster) {
    const N: usize = 300;
    let pods = pods_of(&ask_many(c, "c1", sa(svc_ip(14), 80), N));
    // Binomial(300, 1/3): mean 100, sigma 8.2; 5 sigma either side.
    let (mean, sigma) = (
        N as f64 / 3.0,
        (N as f64 * (1.0 / 3.0) * (2.0 / 3.0)).sqrt(),
    );
    let (low, high) = (mean - 5.0 * sigma, mean + 5.0 * sigma);
    assert_eq!(pods.len(), 3, "{pods:?}");
    for (pod, count) in &pods {
        let count = *count as f64;
        assert!(
            (low..=high).contains(&count),
            "{pod} got {count} of {N} (expected {low:.0}..={high:.0}): {pods:?}"
        );
    }
}

fn no_endpoints_is_refused(c: &mut Cluster) {
    assert_refused(c, "c1", sa(svc_ip(15), 80));
    assert_refused(c, "node2", sa(svc_ip(15), 80));
    assert_refused(c, "client", sa(node_ip(c, "node1"), 30085));
}

fn terminating_endpoints_serve_when_none_is_ready(c: &mut Cluster) {
    let pods = pods_of(&ask_many(c, "c1", sa(svc_ip(16), 80), 20));
    assert_eq!(
        pods.keys().collect::<Vec<_>>(),
        ["a1"],
        "only the serving one: {pods:?}"
    );
}

fn load_balancer_source_ranges(c: &mut Cluster) {
    let reply = ask(c, "client", sa(v4(198, 18, 0, 202), 80));
    assert_eq!(reply.pod, "a2");
    assert_dropped(c, "other", sa(v4(198, 18, 0, 202), 80));
    // The ranges guard the load-balancer address, not the node port.
    let reply = ask(c, "other", sa(node_ip(c, "node1"), 30087));
    assert_eq!(reply.pod, "a2");
}

fn hairpin_lands_on_the_pod_itself(c: &mut Cluster) {
    let reply = ask(c, "a1", sa(svc_ip(18), 80));
    assert_eq!(reply.pod, "a1");
    // Masqueraded to the gateway, or a1 would answer itself directly and drop the reply.
    assert_eq!(reply.client.ip(), v4(10, 244, 1, 1));
}

fn node_port_on_localhost(c: &mut Cluster) {
    let reply = ask(c, "node1", sa(v4(127, 0, 0, 1), 30080));
    assert_eq!(reply.pod, "a2");
}

/// `iptables-save` without berth's own lines and without packet counters.
fn foreign_rules(c: &mut Cluster, node: &str) -> Vec<String> {
    let ns = c.netns(node);
    let dump = c.topo.exec(&ns, &["iptables-save"]).unwrap();
    dump.lines()
        .filter(|l| !l.starts_with('#') && !l.contains("BERTH-"))
        .map(|l| match l.strip_prefix(':') {
            Some(decl) => decl
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" "),
            None => l.to_string(),
        })
        .collect()
}

fn iptables(c: &mut Cluster, ns: &str, line: &str) -> Result<String, TopologyError> {
    let argv: Vec<&str> = std::iter::once("iptables")
        .chain(line.split_whitespace())
        .collect();
    c.topo.exec(ns, &argv)
}

/// Removes the foreign chains of [`agent_restart_breaks_and_flushes_nothing`], whatever state an
/// earlier failed run left them in.
fn remove_foreign_chains(c: &mut Cluster, ns: &str) {
    for line in [
        "-t filter -D INPUT -j KEEP-FILTER",
        "-t filter -F KEEP-FILTER",
        "-t filter -X KEEP-FILTER",
        "-t nat -F KEEP-NAT",
        "-t nat -X KEEP-NAT",
    ] {
        // Absent chains are what this wants.
        let _ = iptables(c, ns, line);
    }
}

fn agent_restart_breaks_and_flushes_nothing(c: &mut Cluster) {
    let ns = c.netns("node1");
    remove_foreign_chains(c, &ns);
    for line in [
        "-t nat -N KEEP-NAT",
        "-t nat -A KEEP-NAT -s 10.244.9.9 -j RETURN",
        "-t filter -N KEEP-FILTER",
        "-t filter -A KEEP-FILTER -s 10.244.9.9 -j DROP",
        "-t filter -A INPUT -j KEEP-FILTER",
    ] {
        iptables(c, &ns, line).unwrap();
    }
    let before = foreign_rules(c, "node1");
    assert!(before.iter().any(|l| l.contains("KEEP-NAT")), "{before:?}");

    let (mut conn, first) =
        EchoConnection::open(&c.netns("c1"), sa(svc_ip(10), 80), OK_TIMEOUT).unwrap();
    let dispatch = c.dispatch;
    c.restart_agents(dispatch);
    for _ in 0..3 {
        assert_eq!(
            conn.ping().unwrap(),
            first,
            "the open connection keeps its endpoint"
        );
    }
    assert_eq!(
        foreign_rules(c, "node1"),
        before,
        "rules berth does not own are untouched"
    );

    // A steady state after the restart: the next sync writes nothing but what linear
    // dispatch rewrites every time.
    let view = c.view("node1");
    let syncer = c.syncers.get_mut("node1").unwrap();
    let report = syncer
        .sync(&plan(&view, &Cluster::options(dispatch)))
        .unwrap();
    assert_eq!(report.kind, SyncKind::Partial);
    if dispatch == Dispatch::Tree {
        assert_eq!(report.payload_bytes, 0, "{report:?}");
    }

    remove_foreign_chains(c, &ns);
}

type Scenario = fn(&mut Cluster);

const SCENARIOS: &[(&str, Scenario)] = &[
    ("cluster_ip_from_a_pod", cluster_ip_from_a_pod),
    ("cluster_ip_udp_from_a_pod", cluster_ip_udp_from_a_pod),
    ("cluster_ip_from_the_nodes", cluster_ip_from_the_nodes),
    (
        "node_port_with_cluster_policy_masquerades",
        node_port_with_cluster_policy_masquerades,
    ),
    (
        "load_balancer_ip_with_cluster_policy",
        load_balancer_ip_with_cluster_policy,
    ),
    (
        "local_policy_keeps_the_client_address",
        local_policy_keeps_the_client_address,
    ),
    (
        "local_policy_drops_on_a_node_without_endpoints",
        local_policy_drops_on_a_node_without_endpoints,
    ),
    ("client_ip_affinity_sticks", client_ip_affinity_sticks),
    (
        "three_endpoints_share_the_load",
        three_endpoints_share_the_load,
    ),
    ("no_endpoints_is_refused", no_endpoints_is_refused),
    (
        "terminating_endpoints_serve_when_none_is_ready",
        terminating_endpoints_serve_when_none_is_ready,
    ),
    ("load_balancer_source_ranges", load_balancer_source_ranges),
    (
        "hairpin_lands_on_the_pod_itself",
        hairpin_lands_on_the_pod_itself,
    ),
    ("node_port_on_localhost", node_port_on_localhost),
    (
        "agent_restart_breaks_and_flushes_nothing",
        agent_restart_breaks_and_flushes_nothing,
    ),
];

fn main() -> ExitCode {
    if let Err(reason) = preflight(&[
        "ip",
        "sysctl",
        "iptables",
        "iptables-restore",
        "iptables-save",
    ]) {
        eprintln!("skipping datapath traffic tests: {reason}");
        return ExitCode::SUCCESS;
    }
    // Namespaces of an earlier run that was killed before it could clean up.
    if let Ok(removed) = remove_orphans(TAG) {
        if !removed.is_empty() {
            eprintln!("removed leftover namespaces {removed:?}");
        }
    }
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let selected: Vec<&(&str, Scenario)> = SCENARIOS
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    if selected.is_empty() {
        println!("no scenario matches {filters:?}");
        return ExitCode::SUCCESS;
    }

    let mut cluster = Cluster::build();
    let mut failed = Vec::new();
    let mut passed = 0;
    for dispatch in [Dispatch::Tree, Dispatch::Linear] {
        let label = format!("{dispatch:?}").to_lowercase();
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| cluster.restart_agents(dispatch))) {
            println!("sync {label} ... FAILED");
            failed.push(format!("sync {label}: {panic:?}"));
            continue;
        }
        for (name, scenario) in &selected {
            let result = catch_unwind(AssertUnwindSafe(|| scenario(&mut cluster)));
            match result {
                Ok(()) => {
                    passed += 1;
                    println!("test {label}::{name} ... ok");
                }
                Err(_) => {
                    println!("test {label}::{name} ... FAILED");
                    failed.push(format!("{label}::{name}"));
                }
            }
        }
    }
    let Cluster { topo, _echoes, .. } = cluster;
    drop(_echoes);
    let cleanup = topo.destroy();
    println!(
        "\ntest result: {}. {passed} passed; {} failed",
        if failed.is_empty() { "ok" } else { "FAILED" },
        failed.len()
    );
    if let Err(err) = cleanup {
        println!("cleanup: {err}");
        return ExitCode::FAILURE;
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("failures: {failed:?}");
        ExitCode::FAILURE
    }
}

//! The cluster every traffic scenario runs against: the namespaces, the echo servers, the
//! dual-stack Services, and one berth datapath (Syncer) per node and family; plus the helpers
//! scenarios ask with. Scenarios name hosts by their IPv4 address of the plan; the helpers
//! ([`ask`], [`assert_refused`]...) and [`Cluster::ip`] address the same host in the family under
//! test ([`Cluster::family`]), its IPv6 twin when that is IPv6 (`family.rs`).

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use berth_core::{IpFamily, Protocol, TrafficPolicy};
use berth_datapath::backend::{SyncKind, SyncReport};
use berth_datapath::iptables::CommandIptables;
use berth_datapath::iptables::{remove_berth_rules, Syncer};
use berth_datapath::nft::NetlinkNft;
use berth_datapath::nft::{remove_table, Nft, NftSyncer, Shards};
use berth_datapath::{
    plan, rewritten_every_sync, Dispatch, Endpoint, IpMode, LoadBalancerIngress, NodeView,
    PlanOptions, ServicePort, SessionAffinity, TopologyHints,
};
use berth_lab::echo::{tcp_echo, tcp_echo_many, EchoHandle, EchoReply, EchoServer};
use berth_lab::topology::{Topology, TopologySpec};
use berth_testing::{mk_endpoint, mk_service_port, port_name};
use ipnet::IpNet;

use crate::family::{add_ipv6, dual_stack, in_family};

/// The nat shards of the nftables mode: the Services spread over several tables, so every
/// scenario crosses them.
pub const SHARDS: u16 = 4;

pub fn traffic_shards() -> Shards {
    Shards::new(SHARDS).unwrap()
}

pub const OK_TIMEOUT: Duration = Duration::from_secs(3);
/// Long enough for a SYN to be answered on a quiet LAN, short enough to keep DROP tests fast.
pub const DROP_TIMEOUT: Duration = Duration::from_millis(800);
pub const TCP_PORT: u16 = 8080;
pub const UDP_PORT: u16 = 8053;
pub const NODES: [&str; 2] = ["node1", "node2"];
/// Every node programs both families, each in its own table.
pub const FAMILIES: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

/// Each node's `topology.kubernetes.io/zone`: node1 in zone-a, node2 in zone-b.
pub fn zone_of(node: &str) -> &'static str {
    if node == "node1" {
        "zone-a"
    } else {
        "zone-b"
    }
}

/// The namespace tag of this test binary: namespaces are `berth-tr<pid>-*`.
pub const TAG: &str = "tr";

pub fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

pub fn svc_ip(last: u8) -> IpAddr {
    v4(10, 96, 0, last)
}

pub fn sa(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

/// Which backend programs the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Iptables,
    Nftables,
}

/// One node's datapath, on either backend.
pub enum NodeSyncer {
    Iptables(Syncer<CommandIptables>),
    Nftables(NftSyncer<NetlinkNft>),
}

impl NodeSyncer {
    pub fn sync(
        &mut self,
        rs: &berth_datapath::Ruleset,
    ) -> Result<SyncReport, berth_datapath::Error> {
        match self {
            NodeSyncer::Iptables(syncer) => syncer.sync(rs),
            NodeSyncer::Nftables(syncer) => syncer.sync(rs),
        }
    }
}

pub struct Cluster {
    pub topo: Topology,
    /// Kept alive for the whole run.
    pub echoes: Vec<EchoHandle>,
    pub services: Vec<ServicePort>,
    pub syncers: BTreeMap<(&'static str, IpFamily), NodeSyncer>,
    /// The family scenarios address.
    pub family: IpFamily,
    /// The dispatch mode of the last restart (linear on nftables, whose maps it becomes).
    pub dispatch: Dispatch,
    pub backend: Backend,
}

impl Cluster {
    pub fn build() -> Cluster {
        let spec = TopologySpec::new(TopologySpec::unique_prefix(TAG))
            .node("node1", ["a1", "a2", "c1"])
            .with_route_localnet()
            .node("node2", ["b1", "b2"])
            .client("client")
            .client("other");
        let mut topo = Topology::create(&spec).unwrap();
        add_ipv6(&mut topo);
        let echoes = ["a1", "a2", "b1", "b2"]
            .into_iter()
            .flat_map(|pod| FAMILIES.map(|family| (pod, family)))
            .map(|(pod, family)| {
                let ip = in_family(pod_ip(&topo, pod), family);
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
            let vip = Ipv4Addr::new(198, 18, 0, lb);
            topo.steer(client, vip, node).unwrap();
            let netns = topo.netns(client).unwrap().to_string();
            let via = IpAddr::V4(topo.layout().node(node).unwrap().lan_ip);
            let (vip, via) = (
                in_family(IpAddr::V4(vip), IpFamily::V6).to_string(),
                in_family(via, IpFamily::V6).to_string(),
            );
            topo.exec(
                &netns,
                &[
                    "ip", "-6", "route", "replace", &vip, "via", &via, "dev", "eth0",
                ],
            )
            .unwrap();
        }
        let services = mk_services(&topo);
        Cluster {
            topo,
            echoes,
            services,
            syncers: BTreeMap::new(),
            family: IpFamily::V4,
            dispatch: Dispatch::Tree,
            backend: Backend::Iptables,
        }
    }

    pub fn netns(&self, name: &str) -> String {
        self.topo.netns(name).unwrap().to_string()
    }

    /// `ip` (an address of the IPv4 plan) in the family under test.
    pub fn ip(&self, ip: IpAddr) -> IpAddr {
        in_family(ip, self.family)
    }

    pub fn view(&self, node: &str) -> NodeView {
        let lan_ip = IpAddr::V4(self.topo.layout().node(node).unwrap().lan_ip);
        NodeView {
            node: berth_datapath::NodeInfo {
                name: node.into(),
                addresses: FAMILIES.map(|f| in_family(lan_ip, f)).to_vec(),
                zone: Some(zone_of(node).to_owned()),
            },
            services: self.services.clone(),
        }
    }

    pub fn options(dispatch: Dispatch, family: IpFamily) -> PlanOptions {
        // The IPv6 pod CIDRs fd00:244:<n>::/120 lie in fd00:244::/32.
        let cluster_cidr: IpNet = match family {
            IpFamily::V4 => "10.244.0.0/16",
            IpFamily::V6 => "fd00:244::/32",
        }
        .parse()
        .unwrap();
        PlanOptions {
            family,
            dispatch,
            cluster_cidr: Some(cluster_cidr),
            ..PlanOptions::default()
        }
    }

    /// Starts a fresh agent datapath (new Syncers, as after a restart) on every node, one per
    /// family, and syncs.
    pub fn restart_agents(&mut self, dispatch: Dispatch) {
        for node in NODES {
            for family in FAMILIES {
                let mut syncer = match self.backend {
                    Backend::Iptables => {
                        let ipt = CommandIptables::in_netns(family, self.netns(node));
                        NodeSyncer::Iptables(
                            Syncer::new(ipt).rewriting_every_sync(rewritten_every_sync(dispatch)),
                        )
                    }
                    Backend::Nftables => NodeSyncer::Nftables(
                        NftSyncer::new(NetlinkNft::in_netns(self.netns(node)), family)
                            .with_shards(traffic_shards()),
                    ),
                };
                let report = syncer
                    .sync(&plan(&self.view(node), &Self::options(dispatch, family)))
                    .unwrap_or_else(|err| panic!("sync on {node} ({family:?}): {err}"));
                assert_eq!(report.kind, SyncKind::Full);
                self.syncers.insert((node, family), syncer);
            }
        }
        self.dispatch = dispatch;
    }

    /// Syncs every node and family with the cluster's current Services and `options` (of the
    /// current dispatch), whatever kind of sync that takes.
    pub fn sync_with(&mut self, options: impl Fn(IpFamily) -> PlanOptions) {
        for node in NODES {
            for family in FAMILIES {
                let rs = plan(&self.view(node), &options(family));
                self.syncers
                    .get_mut(&(node, family))
                    .unwrap()
                    .sync(&rs)
                    .unwrap_or_else(|err| panic!("sync on {node} ({family:?}): {err}"));
            }
        }
    }

    /// Moves every node to `backend`, removing berth's rules from the other one, as the agent
    /// does when its backend changes; the next [`Cluster::restart_agents`] programs it.
    pub fn switch_backend(&mut self, backend: Backend) {
        for node in NODES {
            let ns = self.netns(node);
            for family in FAMILIES {
                match backend {
                    Backend::Nftables => {
                        remove_berth_rules(&mut CommandIptables::in_netns(family, &ns)).map(|_| ())
                    }
                    Backend::Iptables => NetlinkNft::in_netns(&ns).apply(&remove_table(family)),
                }
                .unwrap_or_else(|err| panic!("switching {node} to {backend:?}: {err}"));
            }
        }
        self.syncers.clear();
        self.backend = backend;
    }

    /// Syncs the current Services on every node with the running agents' Syncers.
    pub fn sync_all(&mut self, expected: SyncKind) {
        for node in NODES {
            for family in FAMILIES {
                let rs = plan(&self.view(node), &Self::options(self.dispatch, family));
                let syncer = self.syncers.get_mut(&(node, family)).unwrap();
                let report = syncer
                    .sync(&rs)
                    .unwrap_or_else(|err| panic!("sync on {node} ({family:?}): {err}"));
                assert_eq!(report.kind, expected, "{node} ({family:?}): {report:?}");
            }
        }
    }

    /// `iptables` or `ip6tables` (and their `-save`), for the family under test.
    pub fn iptables_cmd(&self) -> &'static str {
        match self.family {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        }
    }

    pub fn iptables_save_cmd(&self) -> &'static str {
        match self.family {
            IpFamily::V4 => "iptables-save",
            IpFamily::V6 => "ip6tables-save",
        }
    }

    /// nftables' name of the family under test (`ip`, `ip6`).
    pub fn nft_family(&self) -> &'static str {
        match self.family {
            IpFamily::V4 => "ip",
            IpFamily::V6 => "ip6",
        }
    }

    /// berth's nftables tables on `node` (the main one and its shards), as `nft` lists them.
    pub fn nft_listing(&mut self, node: &str) -> String {
        let family = self.nft_family();
        self.nft_listing_of(node, family)
    }

    /// The same in the nftables family `family` (`ip`, `ip6`).
    pub fn nft_listing_of(&mut self, node: &str, family: &str) -> String {
        let ns = self.netns(node);
        let mut listing = String::new();
        for shard in 0..=SHARDS {
            let table = berth_datapath::nft::shard::table_name("berth", shard);
            listing.push_str(
                &self
                    .topo
                    .exec(&ns, &["nft", "list", "table", family, &table])
                    .unwrap(),
            );
        }
        listing
    }

    /// How many chains of `node`'s nat table start with `prefix` (in berth's nftables tables,
    /// `nat-<prefix>`).
    pub fn nat_chains(&mut self, node: &str, prefix: &str) -> usize {
        let ns = self.netns(node);
        if self.backend == Backend::Nftables {
            let listing = self.nft_listing(node);
            let wanted = format!("chain nat-{prefix}");
            return listing
                .lines()
                .filter(|l| l.trim_start().starts_with(&wanted))
                .count();
        }
        let save = self.iptables_save_cmd();
        let dump = self.topo.exec(&ns, &[save, "-t", "nat"]).unwrap();
        dump.lines()
            .filter(|l| l.strip_prefix(':').is_some_and(|c| c.starts_with(prefix)))
            .count()
    }

    /// How many endpoints of Service ports `node` programs: its endpoint chains on iptables;
    /// on nftables, which has none, the distinct (Service port, endpoint) pairs its DNAT rules
    /// name (a port's chains share the hash that ends their names).
    pub fn programmed_endpoints(&mut self, node: &str) -> usize {
        if self.backend != Backend::Nftables {
            return self.nat_chains(node, "BERTH-SEP-");
        }
        assert_eq!(self.nat_chains(node, "BERTH-SEP-"), 0, "{node}");
        let listing = self.nft_listing(node);
        let mut port = "";
        let mut pairs = std::collections::BTreeSet::new();
        for line in listing.lines() {
            let line = line.trim();
            if let Some(chain) = line.strip_prefix("chain ") {
                port = chain.rsplit('-').next().unwrap_or_default();
            } else if let Some(target) = line.split(" dnat to ").nth(1) {
                let target = target.split_whitespace().next().unwrap_or_default();
                pairs.insert((port.to_string(), target.to_string()));
            }
        }
        pairs.len()
    }
}

/// A pod's address in the IPv4 plan (see [`Cluster::ip`]).
pub fn pod_ip(topo: &Topology, pod: &str) -> IpAddr {
    IpAddr::V4(topo.layout().pod(pod).unwrap().1.ip)
}

pub fn mk_port(name: &str, cluster_ip: IpAddr, endpoints: Vec<Endpoint>) -> ServicePort {
    mk_service_port(port_name("default", name, ""), cluster_ip, 80, endpoints)
}

pub fn lb(ip: IpAddr) -> LoadBalancerIngress {
    LoadBalancerIngress {
        ip,
        mode: IpMode::Vip,
    }
}

pub fn mk_services(topo: &Topology) -> Vec<ServicePort> {
    let ep = |pod: &str, port: u16| {
        mk_endpoint(
            pod_ip(topo, pod),
            port,
            &topo.layout().pod(pod).unwrap().0.name,
        )
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

    // Hinted as the endpoints controller hints them: each endpoint for its node's zone, and for
    // its node under PreferSameNode.
    let zoned = |pod: &str, same_node: bool| {
        let node = topo.layout().pod(pod).unwrap().0.name.clone();
        let zones = vec![zone_of(&node).to_owned()];
        let nodes = if same_node { vec![node] } else { vec![] };
        Endpoint {
            hints: TopologyHints::boxed(zones, nodes),
            ..tcp(pod)
        }
    };
    let same_zone = mk_port(
        "same-zone",
        svc_ip(30),
        vec![zoned("a1", false), zoned("a2", false), zoned("b1", false)],
    );
    let same_node = mk_port(
        "same-node",
        svc_ip(31),
        vec![zoned("a2", true), zoned("b1", true), zoned("b2", true)],
    );
    let other_zone = mk_port(
        "other-zone",
        svc_ip(32),
        vec![zoned("b1", false), zoned("b2", false)],
    );

    [
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
        same_zone,
        same_node,
        other_zone,
    ]
    .into_iter()
    .map(dual_stack)
    .collect()
}

pub fn pods_of(replies: &[EchoReply]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for r in replies {
        *counts.entry(r.pod.clone()).or_insert(0) += 1;
    }
    counts
}

/// `addr` (of the IPv4 plan) in the family under test.
pub fn in_plan(c: &Cluster, addr: SocketAddr) -> SocketAddr {
    sa(c.ip(addr.ip()), addr.port())
}

pub fn ask_many(c: &Cluster, from: &str, addr: SocketAddr, n: usize) -> Vec<EchoReply> {
    let addr = in_plan(c, addr);
    tcp_echo_many(&c.netns(from), addr, n, OK_TIMEOUT)
        .unwrap_or_else(|err| panic!("{from} -> {addr}: {err}"))
}

pub fn ask(c: &Cluster, from: &str, addr: SocketAddr) -> EchoReply {
    let addr = in_plan(c, addr);
    tcp_echo(&c.netns(from), addr, OK_TIMEOUT)
        .unwrap_or_else(|err| panic!("{from} -> {addr}: {err}"))
}

pub fn assert_dropped(c: &Cluster, from: &str, addr: SocketAddr) {
    let addr = in_plan(c, addr);
    let err = tcp_echo(&c.netns(from), addr, DROP_TIMEOUT).unwrap_err();
    assert!(
        matches!(
            err.io_kind(),
            Some(ErrorKind::TimedOut | ErrorKind::WouldBlock)
        ),
        "{from} -> {addr} should be dropped (time out), got {err}"
    );
}

pub fn assert_refused(c: &Cluster, from: &str, addr: SocketAddr) {
    let addr = in_plan(c, addr);
    let err = tcp_echo(&c.netns(from), addr, OK_TIMEOUT).unwrap_err();
    assert_eq!(
        err.io_kind(),
        Some(ErrorKind::ConnectionRefused),
        "{from} -> {addr} should be refused, got {err}"
    );
}

/// A node's LAN address in the family under test.
pub fn node_ip(c: &Cluster, node: &str) -> IpAddr {
    c.ip(IpAddr::V4(c.topo.layout().node(node).unwrap().lan_ip))
}

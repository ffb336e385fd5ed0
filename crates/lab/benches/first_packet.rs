//! First-packet latency through real iptables: a node namespace programmed by berth's datapath
//! with N ClusterIP Services (3 endpoints each by default), tree and linear dispatch. A client pod on the
//! node times TCP connects (the SYN walks the dispatch rules, the SYN-ACK returns through
//! conntrack) to the first and the last Service, whose endpoints are live echo servers; the other
//! Services point at pod addresses nobody uses. Also reports the full sync: payload bytes, the
//! `iptables-restore` wall time alone, and the whole sync.
//!
//! Needs root, iproute2 and iptables; prints a skip message otherwise. Each (N, mode) gets a fresh
//! namespace pair `berth-fp<pid>-*`, deleted afterwards.
//!
//! Options: `--sizes 100,10000,30000` `--endpoints 3` `--connections 500`
//! `--backend legacy|nft|system`. Defaults are chosen so the run takes minutes, not hours:
//! iptables-legacy restores 300k rules in seconds where iptables-nft needs minutes, and 30,000
//! Services x 10 endpoints (~930k rules) exceed what the kernel accepts as one legacy table (the
//! restore fails) — so 3 endpoints per Service. A new connection walks the dispatch rules and the
//! one target Service's chains only, so the other Services' endpoint count does not change what
//! is measured; a size whose restore fails is reported as such and the run goes on.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use berth_datapath::exec::{Backend, CommandIptables};
use berth_datapath::model::{ChainName, JumpRule, Table};
use berth_datapath::sync::{Iptables, SyncReport, Syncer};
use berth_datapath::{
    plan, rewritten_every_sync, Dispatch, Endpoint, IpFamily, NodeInfo, NodeView, PlanOptions,
    Protocol, ServicePort, ServicePortName, SessionAffinity, TrafficPolicy,
};
use berth_lab::echo::{EchoHandle, EchoServer};
use berth_lab::netns::run_in_netns;
use berth_lab::topology::{preflight, remove_orphans, Topology, TopologySpec};

const TAG: &str = "fp";
const FIRST_PORT: u16 = 8080;
const WARMUP: usize = 20;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Times `iptables-restore` on its own; everything else passes through.
struct TimedIptables {
    inner: CommandIptables,
    restore: Duration,
}

impl Iptables for TimedIptables {
    fn restore(&mut self, payload: &str) -> Result<(), berth_datapath::Error> {
        let start = Instant::now();
        let result = self.inner.restore(payload);
        self.restore += start.elapsed();
        result
    }
    fn save(&mut self, table: Table) -> Result<String, berth_datapath::Error> {
        self.inner.save(table)
    }
    fn ensure_chain(
        &mut self,
        table: Table,
        chain: &ChainName,
    ) -> Result<(), berth_datapath::Error> {
        self.inner.ensure_chain(table, chain)
    }
    fn chain_exists(
        &mut self,
        table: Table,
        chain: &ChainName,
    ) -> Result<bool, berth_datapath::Error> {
        self.inner.chain_exists(table, chain)
    }
    fn ensure_jump(&mut self, jump: &JumpRule) -> Result<(), berth_datapath::Error> {
        self.inner.ensure_jump(jump)
    }
}

struct Options {
    sizes: Vec<usize>,
    endpoints: usize,
    connections: usize,
    backend: Backend,
}

fn parse_options() -> Options {
    let mut options = Options {
        sizes: vec![100, 10_000, 30_000],
        endpoints: 3,
        connections: 500,
        backend: Backend::Legacy,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--sizes" => {
                options.sizes = value
                    .split(',')
                    .map(|s| s.trim().parse().unwrap())
                    .collect();
                i += 1;
            }
            "--endpoints" => {
                options.endpoints = value.parse().unwrap();
                i += 1;
            }
            "--connections" => {
                options.connections = value.parse().unwrap();
                i += 1;
            }
            "--backend" => {
                options.backend = match value.as_str() {
                    "legacy" => Backend::Legacy,
                    "nft" => Backend::Nft,
                    "system" => Backend::System,
                    other => panic!("--backend {other}: expected legacy, nft or system"),
                };
                i += 1;
            }
            // cargo bench passes `--bench`; nothing else is expected.
            _ => {}
        }
        i += 1;
    }
    options
}

fn service_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(
        u32::from(Ipv4Addr::new(10, 96, 0, 1)) + i as u32,
    ))
}

/// Endpoint `e` of Service `i`: live echo ports of the server pod for the first and the last
/// Service, unique unused pod addresses (10.244.10-73.x, routed nowhere) for the others.
fn endpoint(i: usize, e: usize, n: usize, server: IpAddr) -> Endpoint {
    let (ip, port) = if i == 0 || i + 1 == n {
        (server, FIRST_PORT + e as u16)
    } else {
        let ip = Ipv4Addr::new(10, 244, 10 + e as u8, (i % 250) as u8 + 2);
        (IpAddr::V4(ip), FIRST_PORT + (i / 250) as u16)
    };
    Endpoint {
        ip,
        port,
        ready: true,
        serving: true,
        terminating: false,
        node_name: Some(if ip == server { "node" } else { "elsewhere" }.into()),
    }
}

fn mk_view(n: usize, endpoints: usize, node_ip: IpAddr, server: IpAddr) -> NodeView {
    let services = (0..n)
        .map(|i| ServicePort {
            name: ServicePortName {
                namespace: format!("ns{}", i % 50),
                name: format!("svc-{i}"),
                port: "http".into(),
            },
            protocol: Protocol::Tcp,
            port: 80,
            cluster_ips: vec![service_ip(i)],
            node_port: None,
            external_ips: vec![],
            load_balancer_ingress: vec![],
            source_ranges: vec![],
            session_affinity: SessionAffinity::None,
            external_traffic_policy: TrafficPolicy::Cluster,
            internal_traffic_policy: TrafficPolicy::Cluster,
            health_check_node_port: None,
            endpoints: (0..endpoints).map(|e| endpoint(i, e, n, server)).collect(),
        })
        .collect();
    NodeView {
        node: NodeInfo {
            name: "node".into(),
            addresses: vec![node_ip],
        },
        services,
    }
}

#[derive(Clone, Copy)]
struct Percentiles {
    p50_us: f64,
    p99_us: f64,
}

fn percentiles(mut samples: Vec<Duration>) -> Percentiles {
    samples.sort();
    let at = |q: f64| {
        let idx = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[idx].as_secs_f64() * 1e6
    };
    Percentiles {
        p50_us: at(0.50),
        p99_us: at(0.99),
    }
}

/// Connect times from inside the client pod: one thread, one connection at a time.
fn connect_times(netns: &str, target: SocketAddr, connections: usize) -> Percentiles {
    let samples = run_in_netns(netns, move || {
        for _ in 0..WARMUP {
            drop(TcpStream::connect_timeout(&target, CONNECT_TIMEOUT).unwrap());
        }
        (0..connections)
            .map(|_| {
                let start = Instant::now();
                let stream = TcpStream::connect_timeout(&target, CONNECT_TIMEOUT)
                    .unwrap_or_else(|err| panic!("connect {target}: {err}"));
                let took = start.elapsed();
                drop(stream);
                took
            })
            .collect::<Vec<_>>()
    })
    .unwrap();
    percentiles(samples)
}

struct Row {
    services: usize,
    dispatch: Dispatch,
    rules: usize,
    payload_bytes: usize,
    restore_ms: f64,
    sync_ms: f64,
    first: Percentiles,
    last: Percentiles,
}

fn run_one(n: usize, dispatch: Dispatch, options: &Options) -> Result<Row, String> {
    let spec = TopologySpec::new(TopologySpec::unique_prefix(TAG)).node("node", ["srv", "cli"]);
    let topo = Topology::create(&spec).unwrap();
    let layout = topo.layout();
    let node = layout.node("node").unwrap();
    let server = IpAddr::V4(layout.pod("srv").unwrap().1.ip);
    let echoes: Vec<EchoHandle> = (0..options.endpoints)
        .map(|e| {
            let addr = SocketAddr::new(server, FIRST_PORT + e as u16);
            EchoServer::bind(topo.netns("srv").unwrap(), "srv", Some(addr), None)
                .unwrap()
                .start()
                .unwrap()
        })
        .collect();

    let view = mk_view(n, options.endpoints, IpAddr::V4(node.lan_ip), server);
    let plan_options = PlanOptions {
        dispatch,
        cluster_cidr: Some("10.244.0.0/16".parse().unwrap()),
        ..PlanOptions::default()
    };
    let rs = plan(&view, &plan_options);
    let iptables = TimedIptables {
        inner: CommandIptables::with_backend(IpFamily::V4, options.backend)
            .netns_named(node.netns.clone()),
        restore: Duration::ZERO,
    };
    let mut syncer = Syncer::new(iptables).rewriting_every_sync(rewritten_every_sync(dispatch));
    let start = Instant::now();
    let report: SyncReport = match syncer.sync(&rs) {
        Ok(report) => report,
        Err(err) => {
            drop(echoes);
            topo.destroy().unwrap();
            return Err(format!("full sync failed: {err}"));
        }
    };
    let sync_ms = start.elapsed().as_secs_f64() * 1e3;
    let restore_ms = syncer.iptables().restore.as_secs_f64() * 1e3;

    let client = topo.netns("cli").unwrap().to_string();
    let first = connect_times(
        &client,
        SocketAddr::new(service_ip(0), 80),
        options.connections,
    );
    let last = connect_times(
        &client,
        SocketAddr::new(service_ip(n - 1), 80),
        options.connections,
    );
    drop(echoes);
    topo.destroy().unwrap();
    Ok(Row {
        services: n,
        dispatch,
        rules: report.rule_count,
        payload_bytes: report.payload_bytes,
        restore_ms,
        sync_ms,
        first,
        last,
    })
}

fn label(n: usize) -> String {
    if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

fn main() {
    if let Err(reason) = preflight(&[
        "ip",
        "sysctl",
        "iptables",
        "iptables-restore",
        "iptables-save",
    ]) {
        println!("first-packet: skipped ({reason})");
        return;
    }
    let _ = remove_orphans(TAG);
    let options = parse_options();
    println!(
        "first-packet latency through real iptables ({:?} backend, {} endpoints per Service, {} connections per target)",
        options.backend, options.endpoints, options.connections
    );
    println!(
        "{:>8} {:>8} {:>9} {:>12} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "services",
        "dispatch",
        "rules",
        "payload_B",
        "restore_ms",
        "sync_ms",
        "first_p50",
        "first_p99",
        "last_p50",
        "last_p99"
    );
    let mut rows = Vec::new();
    for &n in &options.sizes {
        for dispatch in [Dispatch::Tree, Dispatch::Linear] {
            let row = match run_one(n, dispatch, &options) {
                Ok(row) => row,
                Err(err) => {
                    let mode = format!("{dispatch:?}").to_lowercase();
                    println!("{n:>8} {mode:>8} {err}");
                    continue;
                }
            };
            println!(
                "{:>8} {:>8} {:>9} {:>12} {:>11.0} {:>10.0} {:>8.1}us {:>8.1}us {:>8.1}us {:>8.1}us",
                row.services,
                format!("{:?}", row.dispatch).to_lowercase(),
                row.rules,
                row.payload_bytes,
                row.restore_ms,
                row.sync_ms,
                row.first.p50_us,
                row.first.p99_us,
                row.last.p50_us,
                row.last.p99_us,
            );
            rows.push(row);
        }
    }
    let (Some(&small), Some(&large)) = (options.sizes.iter().min(), options.sizes.iter().max())
    else {
        return;
    };
    let ratio = |dispatch: Dispatch| {
        let p50 = |n: usize| {
            rows.iter()
                .find(|r| r.services == n && r.dispatch == dispatch)
                .map(|r| r.last.p50_us)
        };
        match (p50(large), p50(small)) {
            (Some(large), Some(small)) => format!("{:.2}", large / small),
            _ => "failed".to_string(),
        }
    };
    println!(
        "first-packet: tree_{}_vs_{}={} linear_{}_vs_{}={}",
        label(large),
        label(small),
        ratio(Dispatch::Tree),
        label(large),
        label(small),
        ratio(Dispatch::Linear)
    );
}

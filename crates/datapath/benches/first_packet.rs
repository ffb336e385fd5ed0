//! First-packet latency through the real kernel: a node namespace programmed by berth's datapath
//! with N ClusterIP Services (3 endpoints each by default), on iptables with tree and with linear
//! dispatch, and on nftables (verdict maps, endpoints folded into the Service chains). A client pod on the
//! node times TCP connects (the SYN walks the dispatch rules, the SYN-ACK returns through
//! conntrack) to the first and the last Service, whose endpoints are live echo servers; the other
//! Services point at pod addresses nobody uses. Also reports the full sync: payload bytes, the
//! `iptables-restore` (or `nft -f`) wall time alone, and the whole sync.
//!
//! Needs root, iproute2 and iptables, prints a skip message otherwise; the nftables rows need nft. Each (N, mode) gets a fresh
//! namespace pair `berth-fp<pid>-*`, deleted afterwards.
//!
//! Options: `--sizes 100,10000,30000` `--endpoints 3` `--connections 500`
//! `--backend legacy|nft|system` (the iptables rows' binary) `--nft-shards 32` (berth's nat
//! shards on nftables; the agent's default). Defaults are chosen so the run takes minutes, not hours:
//! iptables-legacy restores 300k rules in seconds where iptables-nft needs minutes, and 30,000
//! Services x 10 endpoints (~930k rules) exceed what the kernel accepts as one legacy table (the
//! restore fails) — so 3 endpoints per Service. A new connection walks the dispatch rules and the
//! one target Service's chains only, so the other Services' endpoint count does not change what
//! is measured; a size whose restore fails is reported as such and the run goes on.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use berth_core::IpFamily;
use berth_datapath::backend::SyncReport;
use berth_datapath::iptables::Syncer;
use berth_datapath::iptables::{Backend, CommandIptables};
use berth_datapath::nft::shard::DEFAULT_SHARDS;
use berth_datapath::nft::CommandNft;
use berth_datapath::nft::Transaction;
use berth_datapath::nft::{Nft, NftSyncer, Shards};
use berth_datapath::{plan, rewritten_every_sync, Dispatch, Endpoint, NodeView, PlanOptions};
use berth_lab::echo::{EchoHandle, EchoServer};
use berth_lab::netns::run_in_netns;
use berth_lab::topology::{remove_orphans, Topology, TopologySpec};
use berth_testing::{
    mk_endpoint, mk_node_info, mk_service_port, port_name, Hooked, RestoreTimer, DATAPATH_NEEDS,
};

const TAG: &str = "fp";
const FIRST_PORT: u16 = 8080;
const WARMUP: usize = 3;
/// Measurement rounds over all configurations, each taking its share of `--connections`: many
/// short rounds spread a busy moment of a shared machine over every configuration.
const ROUNDS: usize = 50;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Times `iptables-restore` on its own; everything else passes through.
type TimedIptables = Hooked<CommandIptables, RestoreTimer>;

/// Times `nft -f` on its own.
struct TimedNft {
    nft: CommandNft,
    total: Duration,
}

impl Nft for TimedNft {
    fn apply(&mut self, tx: &Transaction) -> Result<(), berth_datapath::Error> {
        let start = Instant::now();
        let result = self.nft.apply(tx);
        self.total += start.elapsed();
        result
    }
}

/// A row's name: the mode, and for nftables the shard count (`nft/16`).
fn row_name((mode, shards): (Mode, Shards)) -> String {
    match mode {
        Mode::Nftables => format!("nft/{}", shards.count()),
        _ => mode.name().to_string(),
    }
}

/// How the node is programmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Tree,
    Linear,
    Nftables,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Tree, Mode::Linear, Mode::Nftables];

    fn name(self) -> &'static str {
        match self {
            Mode::Tree => "tree",
            Mode::Linear => "linear",
            Mode::Nftables => "nftables",
        }
    }
}

struct Options {
    sizes: Vec<usize>,
    endpoints: usize,
    connections: usize,
    backend: Backend,
    /// berth's nat shards on nftables (`--nft-shards 32,16`: one nftables row per count; the
    /// first is the one the summary's `nftables_…` ratio reports; default the agent's).
    shards: Vec<Shards>,
    /// The rows to run (`--modes tree,linear,nftables`, default all).
    modes: Vec<Mode>,
}

fn parse_options() -> Options {
    let mut options = Options {
        sizes: vec![100, 10_000, 30_000],
        endpoints: 3,
        connections: 500,
        backend: Backend::Legacy,
        shards: vec![Shards::new(DEFAULT_SHARDS).unwrap()],
        modes: Mode::ALL.to_vec(),
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
            "--nft-shards" => {
                options.shards = value
                    .split(',')
                    .map(|k| Shards::new(k.trim().parse().unwrap()).unwrap())
                    .collect();
                i += 1;
            }
            "--modes" => {
                options.modes = value
                    .split(',')
                    .map(|m| {
                        *Mode::ALL
                            .iter()
                            .find(|mode| mode.name() == m.trim())
                            .unwrap_or_else(|| panic!("no mode {m}"))
                    })
                    .collect();
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
    mk_endpoint(ip, port, if ip == server { "node" } else { "elsewhere" })
}

fn mk_view(n: usize, endpoints: usize, node_ip: IpAddr, server: IpAddr) -> NodeView {
    let services = (0..n)
        .map(|i| {
            mk_service_port(
                port_name(&format!("ns{}", i % 50), &format!("svc-{i}"), "http"),
                service_ip(i),
                80,
                (0..endpoints).map(|e| endpoint(i, e, n, server)).collect(),
            )
        })
        .collect();
    NodeView {
        node: mk_node_info("node", node_ip),
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
fn connect_times(netns: &str, target: SocketAddr, connections: usize) -> Vec<Duration> {
    run_in_netns(netns, move || {
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
    .unwrap()
}

/// One programmed node, ready to be measured.
struct Setup {
    services: usize,
    mode: Mode,
    shards: Shards,
    rules: usize,
    payload_bytes: usize,
    restore_ms: f64,
    sync_ms: f64,
    client: String,
    first: Vec<Duration>,
    last: Vec<Duration>,
    // Dropped last: the servers, then the namespaces.
    _echoes: Vec<EchoHandle>,
    _topo: Topology,
}

fn set_up(
    index: usize,
    n: usize,
    (mode, shards): (Mode, Shards),
    options: &Options,
) -> Result<Setup, String> {
    if mode == Mode::Nftables {
        let missing = berth_testing::require::missing(&[berth_testing::Requirement::Nft]);
        if !missing.is_empty() {
            return Err(format!("skipped ({})", missing.join("; ")));
        }
    }
    // One prefix per configuration; all of them end with the pid for the orphan sweep.
    let prefix = format!("{}-c{index}", TopologySpec::unique_prefix(TAG));
    let spec = TopologySpec::new(prefix).node("node", ["srv", "cli"]);
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
    // Linear dispatch is what becomes the nftables verdict maps.
    let dispatch = match mode {
        Mode::Tree => Dispatch::Tree,
        Mode::Linear | Mode::Nftables => Dispatch::Linear,
    };
    let plan_options = PlanOptions {
        dispatch,
        cluster_cidr: Some("10.244.0.0/16".parse().unwrap()),
        ..PlanOptions::default()
    };
    let rs = plan(&view, &plan_options);
    let start = Instant::now();
    let (report, restore_ms): (SyncReport, f64) = if mode == Mode::Nftables {
        let nft = TimedNft {
            nft: CommandNft::in_netns(node.netns.clone()),
            total: Duration::ZERO,
        };
        let mut syncer = NftSyncer::new(nft, IpFamily::V4).with_shards(shards);
        let report = syncer
            .sync(&rs)
            .map_err(|err| format!("full sync failed: {err}"))?;
        (report, syncer.nft().total.as_secs_f64() * 1e3)
    } else {
        let iptables: TimedIptables = Hooked::new(
            CommandIptables::with_backend(IpFamily::V4, options.backend)
                .netns_named(node.netns.clone()),
            RestoreTimer::default(),
        );
        let mut syncer = Syncer::new(iptables).rewriting_every_sync(rewritten_every_sync(dispatch));
        let report = syncer
            .sync(&rs)
            .map_err(|err| format!("full sync failed: {err}"))?;
        (report, syncer.iptables().hook.total.as_secs_f64() * 1e3)
    };
    let sync_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok(Setup {
        services: n,
        shards,
        mode,
        rules: report.rule_count,
        payload_bytes: report.payload_bytes,
        restore_ms,
        sync_ms,
        client: topo.netns("cli").unwrap().to_string(),
        first: Vec::new(),
        last: Vec::new(),
        _echoes: echoes,
        _topo: topo,
    })
}

impl Setup {
    fn measure(&mut self, connections: usize) {
        let first = SocketAddr::new(service_ip(0), 80);
        let last = SocketAddr::new(service_ip(self.services - 1), 80);
        self.first
            .extend(connect_times(&self.client, first, connections));
        self.last
            .extend(connect_times(&self.client, last, connections));
    }
}

fn label(n: usize) -> String {
    if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

fn main() {
    let missing = berth_testing::require::missing(DATAPATH_NEEDS);
    if !missing.is_empty() {
        println!("first-packet: skipped ({})", missing.join("; "));
        return;
    }
    let _ = remove_orphans(TAG);
    let options = parse_options();
    println!(
        "first-packet latency through the real kernel (iptables rows: {:?} binary; nftables rows: {} nat shards; {} endpoints per Service, {} connections per target)",
        options.backend,
        options
            .shards
            .iter()
            .map(|k| k.count().to_string())
            .collect::<Vec<_>>()
            .join(","),
        options.endpoints,
        options.connections
    );
    println!(
        "{:>8} {:>8} {:>9} {:>12} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "services",
        "mode",
        "rules",
        "payload_B",
        "restore_ms",
        "sync_ms",
        "first_p50",
        "first_p99",
        "last_p50",
        "last_p99"
    );
    let mut setups = Vec::new();
    // One row per iptables mode, one per nftables shard count.
    let rows_wanted: Vec<(Mode, Shards)> = options
        .modes
        .iter()
        .flat_map(|mode| match mode {
            Mode::Nftables => options.shards.iter().map(|k| (*mode, *k)).collect(),
            _ => vec![(*mode, Shards::default())],
        })
        .collect();
    for &n in &options.sizes {
        for &row in &rows_wanted {
            match set_up(setups.len(), n, row, &options) {
                Ok(setup) => setups.push(setup),
                Err(err) => println!("{n:>8} {:>8} {err}", row_name(row)),
            }
        }
    }
    // Rounds over every configuration in turn, so that the load of a shared machine drifting
    // during the run weighs on all of them alike.
    let per_round = options.connections.div_ceil(ROUNDS);
    for _ in 0..ROUNDS {
        for setup in &mut setups {
            setup.measure(per_round);
        }
    }
    let mut rows = Vec::new();
    for setup in setups {
        let (first, last) = (percentiles(setup.first), percentiles(setup.last));
        println!(
            "{:>8} {:>8} {:>9} {:>12} {:>11.0} {:>10.0} {:>8.1}us {:>8.1}us {:>8.1}us {:>8.1}us",
            setup.services,
            row_name((setup.mode, setup.shards)),
            setup.rules,
            setup.payload_bytes,
            setup.restore_ms,
            setup.sync_ms,
            first.p50_us,
            first.p99_us,
            last.p50_us,
            last.p99_us,
        );
        rows.push((setup.services, (setup.mode, setup.shards), last));
    }
    let (Some(&small), Some(&large)) = (options.sizes.iter().min(), options.sizes.iter().max())
    else {
        return;
    };
    let ratio = |wanted: (Mode, Shards)| {
        let p50 = |n: usize| {
            rows.iter()
                .find(|(services, mode, _)| *services == n && *mode == wanted)
                .map(|(_, _, last)| last.p50_us)
        };
        match (p50(large), p50(small)) {
            (Some(large), Some(small)) => format!("{:.2}", large / small),
            _ => "failed".to_string(),
        }
    };
    // The summary's keys: one per mode (nftables: the first shard count), then every shard
    // count's own.
    let mut keys: Vec<(String, (Mode, Shards))> = options
        .modes
        .iter()
        .map(|mode| {
            let shards = match mode {
                Mode::Nftables => options.shards.first().copied().unwrap_or_default(),
                _ => Shards::default(),
            };
            (mode.name().to_string(), (*mode, shards))
        })
        .collect();
    if options.modes.contains(&Mode::Nftables) {
        for k in &options.shards {
            keys.push((format!("nftables_k{}", k.count()), (Mode::Nftables, *k)));
        }
    }
    let ratios: Vec<String> = keys
        .into_iter()
        .map(|(key, row)| format!("{key}_{}_vs_{}={}", label(large), label(small), ratio(row)))
        .collect();
    println!("first-packet: {}", ratios.join(" "));
}

//! Agent memory at scale, per backend: `agent_rss_mb_iptables=<n> agent_rss_mb_nftables=<n>` for
//! 10,000 Services x 10 endpoints, and `agent_rss_mb=<n> backend_default=<name>` for the backend
//! the agent's default (`auto`) picks on this machine.
//!
//! The lab API server runs in a child process (this same executable, `--lab-apiserver-child`)
//! so its store is not counted, and each backend's agent in a child of its own
//! (`--agent-child`), as a peak resident set is per process. A child reads `VmHWM` (peak
//! resident set) from /proc/self/status before the agent starts (the baseline: runtime and
//! client set-up only) and again once the agent's first full sync of every Service has
//! succeeded; the difference is the agent's peak: watch lists, the index, the planner's ruleset,
//! the Syncer's state and the rendered payload. iptables and nft are null implementations that
//! accept every call, so no kernel or fake-kernel state is counted; the null nft builds each
//! transaction's nfnetlink batch as the default writer does (`--nft-writer nft`: renders the
//! text instead). Agents run with glibc's malloc set as `berth`'s `main` sets it (two arenas, a fixed mmap
//! threshold).
//!
//! A second child (`--breakdown-child`) then replays the same objects through the agent's parts
//! without any API server, printing the resident set after each stage, so the total can be
//! attributed: `index_mb` (the node view and the slices' endpoints), `planner_mb` (the planned
//! ruleset and its per-Service cache), `full_sync_peak_mb` (rendering and applying the first,
//! full payload) and `syncer_state_mb` (what the Syncer keeps after it) — once per backend
//! (`backend=iptables|nftables`; nftables as the agent runs it: nat shards, a cold load in
//! stages, each netlink batch built).
//!
//! `--big-service-child [--ports N] [--endpoints M] [--unbounded]` runs the same stages for one
//! Service of N ports (default 5,000) and M endpoints (default 20): what one tenant's Service
//! costs.
//!
//! `--big-service [--ports N] [--endpoints M]` measures that Service through the real agent
//! (lab API server child, null backends, as above) twice: with no bound on a Service's size
//! and with the default bounds (`--max-service-*`), which refuse it. It prints
//! `big_service_agent_rss_mb_unbounded=<n> big_service_agent_rss_mb_bounded=<n>` and the same
//! two breakdowns.
//!
//! Run: `cargo bench -p berth-agent --bench agent_rss [-- --services N | --nft-writer nft |
//! --big-service]`.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use berth_agent::index::Index;
use berth_agent::{
    Agent, AgentOptions, Backend, BoxedNft, CommandIptables, Conntrack, ConntrackFlow, IpFamily,
    NodeFacts, DEFAULT_BACKEND,
};
use berth_api::{ServiceBounds, ServicePolicy};
use berth_datapath::apply::{apply_planned, plan_for_sync};
use berth_datapath::iptables::{Iptables, Syncer};
use berth_datapath::nft::netlink::build_batch;
use berth_datapath::nft::render::TABLE;
use berth_datapath::nft::shard::DEFAULT_SHARDS;
use berth_datapath::nft::shard::{Shard, MAIN};
use berth_datapath::nft::NftWriter;
use berth_datapath::nft::Transaction;
use berth_datapath::nft::{Nft, NftSyncer, Shards};
use berth_datapath::plan::convert::ProxyMode;
use berth_datapath::SyncRuleset;
use berth_datapath::{ChainName, Dispatch, JumpRule, Payload, PlanOptions, Planner, Table};
use berth_lab::LabApiServer;
use berth_telemetry::{MetricsRegistry, Readiness};
use berth_testing::{mk_service_json, mk_slice_json};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const ENDPOINTS: usize = 10;
const NODES: usize = 10;

/// Accepts everything; reports every chain as present so partial syncs stay partial.
struct NullIptables;

impl Iptables for NullIptables {
    /// Renders the payload into nothing, as a restore reading it would consume it.
    fn restore(&mut self, payload: &dyn Payload) -> Result<(), berth_datapath::Error> {
        payload
            .write_to(&mut std::io::sink())
            .map_err(|err| berth_datapath::Error::Restore {
                reason: err.to_string(),
            })
    }
    fn save(&mut self, _table: Table) -> Result<String, berth_datapath::Error> {
        Ok(String::new())
    }
    fn ensure_chain(&mut self, _: Table, _: &ChainName) -> Result<(), berth_datapath::Error> {
        Ok(())
    }
    fn chain_exists(&mut self, _: Table, _: &ChainName) -> Result<bool, berth_datapath::Error> {
        Ok(true)
    }
    fn ensure_jump(&mut self, _: &JumpRule) -> Result<(), berth_datapath::Error> {
        Ok(())
    }
}

/// Accepts every transaction. As the default (netlink) writer it builds the transaction's whole
/// nfnetlink batch in memory, as that writer does before its one `send`, and drops it unsent;
/// as the `nft` writer (`--nft-writer nft`) it renders the text into nothing.
struct NullNft {
    netlink: bool,
    /// Whether a transaction was applied: berth's tables exist from then on, so the first load
    /// goes in stages as on a node without them, and later full syncs are one transaction.
    loaded: bool,
}

impl Nft for NullNft {
    fn tables(
        &mut self,
        _family: IpFamily,
    ) -> Result<Option<std::collections::BTreeSet<Shard>>, berth_datapath::Error> {
        Ok(Some(self.loaded.then_some(MAIN).into_iter().collect()))
    }

    fn apply(&mut self, tx: &Transaction) -> Result<(), berth_datapath::Error> {
        self.loaded = true;
        if self.netlink {
            let batch = build_batch(tx, TABLE, 0);
            tx.set_written(batch.bytes.len());
            return Ok(());
        }
        tx.write_to(&mut std::io::sink())
            .map_err(|err| berth_datapath::Error::Restore {
                reason: err.to_string(),
            })
    }
}

struct NullConntrack;

impl Conntrack for NullConntrack {
    fn delete(&mut self, _: &ConntrackFlow) -> Result<(), berth_agent::Error> {
        Ok(())
    }
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn vm_hwm_kib() -> u64 {
    status_kib("VmHWM:")
}

/// Bytes the allocator has handed out and not had back (glibc's `mallinfo2`).
fn live_kib() -> u64 {
    // SAFETY: mallinfo2 only reads the allocator's own counters.
    #[allow(unsafe_code)]
    let info = unsafe { nix::libc::mallinfo2() };
    ((info.uordblks + info.hblkhd) / 1024) as u64
}

fn mb(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The stages of the agent one by one, in this process, objects built and dropped one at a time.
fn run_breakdown_child(services: usize, backend: Backend) {
    breakdown(mk_objects(services), ServiceBounds::default(), backend);
}

/// The same stages for one Service of `ports` ports and `endpoints` endpoints (slices of 100
/// ports, the API server's limit): what one tenant's Service costs every agent.
fn run_big_service_child(ports: usize, endpoints: usize, bounds: ServiceBounds) {
    println!("one Service: ports={ports} endpoints={endpoints} bounds={bounds:?}");
    breakdown(mk_big_service(ports, endpoints), bounds, Backend::Iptables);
}

fn mk_big_service(ports: usize, endpoints: usize) -> impl Iterator<Item = Value> {
    let port = |p: usize| json!({"name": format!("p{p}"), "port": 1000 + p, "protocol": "TCP"});
    let service = mk_service_json(
        "default",
        "big",
        json!({"type": "NodePort", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
               "ports": (0..ports).map(|p| {
                   let mut v = port(p);
                   v["nodePort"] = json!(30000 + p % 2768);
                   v
               }).collect::<Vec<_>>()}),
    );
    let eps: Vec<Value> = (0..endpoints)
        .map(|e| {
            json!({
                "addresses": [format!("10.128.{}.{}", e / 250, e % 250 + 1)],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": format!("node-{}", e % NODES)
            })
        })
        .collect();
    let slices = (0..ports.div_ceil(100)).map(move |s| {
        let ports: Vec<Value> = (s * 100..((s + 1) * 100).min(ports)).map(port).collect();
        mk_slice_json(
            "default",
            "big",
            &format!("big-{s}"),
            Value::Array(ports),
            Value::Array(eps.clone()),
        )
    });
    std::iter::once(service).chain(slices)
}

fn breakdown(objects: impl Iterator<Item = Value>, bounds: ServiceBounds, backend: Backend) {
    let cluster_cidr = "10.128.0.0/9".parse().unwrap();
    let start = status_kib("VmRSS:");
    let live_start = live_kib();
    let clock = Instant::now();
    let mut index =
        Index::new("node-0", ProxyMode::Full, chrono::Utc::now()).with_policy(ServicePolicy {
            bounds,
            ..ServicePolicy::default()
        });
    index.begin_services();
    index.begin_slices();
    index.begin_node();
    for obj in objects {
        if obj["kind"] == "Service" {
            index.apply_service(&serde_json::from_value::<Service>(obj).unwrap());
        } else {
            index.apply_slice(&serde_json::from_value::<EndpointSlice>(obj).unwrap());
        }
    }
    index.finish_services();
    index.finish_slices();
    index.finish_node();
    let after_index = status_kib("VmRSS:");
    let live_index = live_kib();
    let index_time = clock.elapsed();
    let clock = Instant::now();
    // nftables dispatches through verdict maps, which linear dispatch becomes (as the agent).
    let dispatch = match backend {
        Backend::Nftables => Dispatch::Linear,
        _ => PlanOptions::default().dispatch,
    };
    // As the agent plans: lean, and on nftables (shards) without the Service chains, which
    // the cold load plans shard by shard; on iptables keeping the endpoint chains' names,
    // which its Syncer keeps too.
    let planner = Planner::new(PlanOptions {
        cluster_cidr: Some(cluster_cidr),
        dispatch,
        ..PlanOptions::default()
    })
    .lean();
    let mut planner = match backend {
        Backend::Nftables => planner,
        _ => planner.keeping_endpoint_names(),
    };
    let streamed = Some(Shards::new(DEFAULT_SHARDS).unwrap());
    let ports = plan_for_sync(&mut planner, index.view(), true, streamed, |planner| {
        planner.update(index.view())
    });
    let after_plan = status_kib("VmRSS:");
    let live_plan = live_kib();
    let plan_time = clock.elapsed();
    let clock = Instant::now();
    let changes = planner.take_changes();
    let mut iptables = Syncer::new(NullIptables);
    // The agent's nftables syncer: nat shards, a cold load in stages, netlink batches built.
    let mut nft = NftSyncer::new(
        NullNft {
            netlink: true,
            loaded: false,
        },
        IpFamily::V4,
    )
    .with_shards(Shards::new(DEFAULT_SHARDS).unwrap())
    .with_staged_cold_load(true);
    let syncer: &mut dyn SyncRuleset = match backend {
        Backend::Nftables => &mut nft,
        _ => &mut iptables,
    };
    let mut changes = changes;
    let report = apply_planned(
        syncer,
        &mut planner,
        &mut changes,
        ports,
        |_| unreachable!(),
    )
    .unwrap();
    let sync_time = clock.elapsed();
    let peak = vm_hwm_kib();
    // After the sync the planner has let the Service chains go: what the agent holds from
    // then on.
    let after_sync = status_kib("VmRSS:");
    let live_sync = live_kib();
    println!(
        "live heap: index_mb={:.1} planner_mb={:.1} syncer_state_mb={:.1} total_after_sync_mb={:.1}",
        mb(live_index.saturating_sub(live_start)),
        mb(live_plan.saturating_sub(live_index)),
        mb(live_sync.saturating_sub(live_plan)),
        mb(live_sync.saturating_sub(live_start)),
    );
    println!(
        "index_ms={} plan_ms={} full_sync_ms={} (objects decoded from JSON included in index_ms)",
        index_time.as_millis(),
        plan_time.as_millis(),
        sync_time.as_millis()
    );
    println!(
        "backend={} index_mb={:.1} planner_mb={:.1} full_sync_peak_mb={:.1} syncer_state_mb={:.1} rules={} payload_mb={:.1}",
        backend.as_str(),
        mb(after_index.saturating_sub(start)),
        mb(after_plan.saturating_sub(after_index)),
        mb(peak.saturating_sub(after_plan)),
        mb(after_sync.saturating_sub(after_plan)),
        report.rule_count,
        report.payload_bytes as f64 / 1e6,
    );
}

/// Service `i` and its one EndpointSlice, built on demand so no caller holds all of them.
fn mk_objects(services: usize) -> impl Iterator<Item = Value> {
    (0..services).flat_map(|i| {
        let name = format!("svc-{i}");
        let ip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
        let service = mk_service_json(
            "default",
            &name,
            json!({"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                   "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}),
        );
        let endpoints: Vec<Value> = (0..ENDPOINTS)
            .map(|e| {
                let n = i * ENDPOINTS + e;
                json!({
                    "addresses": [format!("10.{}.{}.{}", 128 + n / 62_500, (n / 250) % 250, n % 250 + 1)],
                    "conditions": {"ready": true, "serving": true, "terminating": false},
                    "nodeName": format!("node-{}", n % NODES)
                })
            })
            .collect();
        let slice = mk_slice_json(
            "default",
            &name,
            &format!("{name}-1"),
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
            Value::Array(endpoints),
        );
        [service, slice]
    })
}

/// The child: serve `objects` until the parent closes stdin.
fn run_apiserver_child(objects: impl Iterator<Item = Value>, kubeconfig: PathBuf) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let server = LabApiServer::builder().start().await.unwrap();
        server.seed(objects).unwrap();
        server.write_kubeconfig(&kubeconfig).unwrap();
        println!("ready");
        std::io::stdout().flush().unwrap();
        tokio::task::spawn_blocking(|| {
            let mut sink = String::new();
            while std::io::stdin()
                .read_line(&mut sink)
                .map(|n| n > 0)
                .unwrap_or(false)
            {}
        })
        .await
        .unwrap();
        server.shutdown().await.unwrap();
    });
}

fn arg_value(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let services: usize = arg_value(&args, "--services")
        .map(|v| v.parse().unwrap())
        .unwrap_or(10_000);
    let kubeconfig =
        std::env::temp_dir().join(format!("berth-agent-rss-{}.kubeconfig", std::process::id()));
    let n = |flag, default: usize| arg_value(&args, flag).map_or(default, |v| v.parse().unwrap());
    let (ports, endpoints) = (n("--ports", 5000), n("--endpoints", 20));
    let bounds = if args.iter().any(|a| a == "--unbounded") {
        ServiceBounds::UNBOUNDED
    } else {
        ServiceBounds::default()
    };
    if args.iter().any(|a| a == "--big-service-child") {
        run_big_service_child(ports, endpoints, bounds);
        return;
    }
    if args.iter().any(|a| a == "--big-service") {
        run_big_service(ports, endpoints, &kubeconfig);
        return;
    }
    let backend = match arg_value(&args, "--backend").as_deref() {
        Some("nftables") => Backend::Nftables,
        _ => Backend::Iptables,
    };
    if args.iter().any(|a| a == "--breakdown-child") {
        run_breakdown_child(services, backend);
        return;
    }
    if args.iter().any(|a| a == "--lab-apiserver-child") {
        let path = PathBuf::from(arg_value(&args, "--kubeconfig").unwrap());
        if args.iter().any(|a| a == "--big") {
            run_apiserver_child(mk_big_service(ports, endpoints), path);
        } else {
            run_apiserver_child(mk_objects(services), path);
        }
        return;
    }

    if args.iter().any(|a| a == "--agent-child") {
        let path = PathBuf::from(arg_value(&args, "--kubeconfig").unwrap());
        let big = args.iter().any(|a| a == "--big");
        let netlink = arg_value(&args, "--nft-writer").as_deref() != Some("nft");
        run_agent_child(services, backend, path, big.then_some(bounds), netlink);
        return;
    }

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--lab-apiserver-child",
            "--services",
            &services.to_string(),
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let nft_writer = arg_value(&args, "--nft-writer").unwrap_or_else(|| "netlink".into());
    let nft_writer = nft_writer.as_str();
    let mut rss = Vec::new();
    for backend in [Backend::Iptables, Backend::Nftables] {
        let out = agent_child_command()
            .args([
                "--agent-child",
                "--services",
                &services.to_string(),
                "--backend",
                backend.as_str(),
                "--nft-writer",
                nft_writer,
                "--kubeconfig",
            ])
            .arg(&kubeconfig)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        print!("{text}");
        assert!(out.status.success(), "{backend:?} agent child failed");
        let mb = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix("agent_rss_mb="))
            .unwrap()
            .to_string();
        rss.push((backend, mb));
    }
    drop(child.stdin.take());
    child.wait().unwrap();
    let _ = std::fs::remove_file(&kubeconfig);
    for backend in [Backend::Iptables, Backend::Nftables] {
        let breakdown = Command::new(std::env::current_exe().unwrap())
            .args(["--breakdown-child", "--services", &services.to_string()])
            .args(["--backend", backend.as_str()])
            .output()
            .unwrap();
        print!("{}", String::from_utf8_lossy(&breakdown.stdout));
    }
    // What the agent's default picks here, with the probes `berth agent` runs (they change
    // nothing: a netlink probe on a scratch table and `iptables-save -t filter`).
    let default = DEFAULT_BACKEND.resolve(|| NodeFacts {
        nft_usable: NftWriter::default().usable(),
        iptables_forward_drops: CommandIptables::new(IpFamily::V4).forward_drops(),
    });
    let of = |backend: Backend| {
        rss.iter()
            .find(|(b, _)| *b == backend)
            .map_or("na".to_string(), |(_, mb)| mb.clone())
    };
    println!(
        "agent_rss_mb_iptables={} agent_rss_mb_nftables={}",
        of(Backend::Iptables),
        of(Backend::Nftables)
    );
    println!(
        "agent_rss_mb={} backend_default={}",
        of(default),
        default.as_str()
    );
}

/// This executable as an agent child, with glibc's malloc set as `berth`'s `main` sets it (two
/// arenas, a fixed mmap threshold; the environment's own settings still win, as they do there):
/// the agent's threads would otherwise each get an arena of their own and the peak would be the
/// bench's, not the agent's.
fn agent_child_command() -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    for (variable, value) in [
        ("MALLOC_ARENA_MAX", "2"),
        ("MALLOC_MMAP_THRESHOLD_", "131072"),
    ] {
        if std::env::var_os(variable).is_none() {
            command.env(variable, value);
        }
    }
    command
}

/// The big Service through the real agent, without and with bounds, then the breakdowns.
fn run_big_service(ports: usize, endpoints: usize, kubeconfig: &std::path::Path) {
    let exe = std::env::current_exe().unwrap();
    let sizes = [
        "--ports".to_string(),
        ports.to_string(),
        "--endpoints".into(),
        endpoints.to_string(),
    ];
    let mut child = Command::new(&exe)
        .args(["--lab-apiserver-child", "--big", "--kubeconfig"])
        .arg(kubeconfig)
        .args(&sizes)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let mut results = Vec::new();
    for (label, extra) in [("unbounded", Some("--unbounded")), ("bounded", None)] {
        let out = agent_child_command()
            .args([
                "--agent-child",
                "--big",
                "--backend",
                "iptables",
                "--kubeconfig",
            ])
            .arg(kubeconfig)
            .args(&sizes)
            .args(extra)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        print!("{text}");
        assert!(out.status.success(), "{label} agent child failed");
        let mb = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix("agent_rss_mb="))
            .unwrap()
            .to_string();
        results.push(format!("big_service_agent_rss_mb_{label}={mb}"));
    }
    drop(child.stdin.take());
    child.wait().unwrap();
    let _ = std::fs::remove_file(kubeconfig);
    for extra in [Some("--unbounded"), None] {
        let out = Command::new(&exe)
            .arg("--big-service-child")
            .args(&sizes)
            .args(extra)
            .output()
            .unwrap();
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }
    println!("{}", results.join(" "));
}

/// One backend's agent against the API server child: its peak resident set over the first sync.
/// `big`: the API server holds the one big Service, programmed under these bounds.
fn run_agent_child(
    services: usize,
    backend: Backend,
    kubeconfig: PathBuf,
    big: Option<ServiceBounds>,
    netlink: bool,
) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (baseline, peak, first_sync) = runtime.block_on(async {
        let file = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
            .await
            .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let options = AgentOptions {
            node_name: "node-0".into(),
            dispatch: Dispatch::Tree,
            cluster_cidrs: vec!["10.128.0.0/9".parse().unwrap()],
            min_sync_interval: Duration::from_millis(100),
            sync_period: Duration::from_secs(300),
            healthz_bind_address: "127.0.0.1".parse().unwrap(),
            admin_listen: "127.0.0.1:0".parse().unwrap(),
            backend,
            service_bounds: big.unwrap_or_default(),
            ..AgentOptions::default()
        };
        let mut registry = MetricsRegistry::new();
        let agent = Agent::with_nft(
            options.validate().unwrap(),
            client,
            |_| NullIptables,
            |_| -> BoxedNft {
                Box::new(NullNft {
                    netlink,
                    loaded: false,
                })
            },
            NullConntrack,
            &mut registry,
            &Readiness::new(),
        )
        .unwrap();
        let mut status = agent.status();
        let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stop = CancellationToken::new();
        let baseline = vm_hwm_kib();
        let started = Instant::now();
        let task = tokio::spawn(agent.run(
            admin,
            registry.into_shared(),
            stop.clone().cancelled_owned(),
        ));
        // The first sync waits for complete lists, so it already holds every Service.
        status.wait_for(|s| s.syncs > 0).await.unwrap();
        let first_sync = started.elapsed();
        let rules = status.borrow().rules;
        if big.is_none() {
            assert!(rules > services * ENDPOINTS, "only {rules} rules");
        }
        let peak = vm_hwm_kib();
        stop.cancel();
        task.await.unwrap().unwrap();
        (baseline, peak, first_sync)
    });
    let objects = match big {
        Some(bounds) => format!("one big Service, bounds={bounds:?}"),
        None => format!("services={services} endpoints_per_service={ENDPOINTS}"),
    };
    println!(
        "rss: backend={} nft_writer={} {objects} first_sync_ms={} baseline_hwm_mb={:.1} agent_rss_mb={:.1}",
        backend.as_str(),
        if netlink { "netlink" } else { "nft" },
        first_sync.as_millis(),
        mb(baseline),
        mb(peak.saturating_sub(baseline))
    );
}

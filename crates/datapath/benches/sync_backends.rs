//! What a user waits for, per backend, on the real kernel: N Services × E endpoints programmed
//! into a fresh network namespace `berth-sb<pid>-<k>` (no traffic), timed end to end — from the
//! index change through the incremental planner, rendering and the kernel holding the rules:
//! - the cold full sync (time and payload bytes);
//! - one endpoint of one Service replaced (a pod restart), median of `--changes` runs;
//! - one Service added, median of `--changes` runs.
//!
//! Backends: berth on iptables-legacy, iptables-nft and nftables (its netlink writer, the
//! default, and `nft -f` reading the same transactions as text). Anchors measured in the same run:
//! kube-proxy-shaped layouts on each — iptables with linear dispatch, the entry chains rewritten
//! on every sync and a plain `--noflush` restore (kube-proxy's iptables mode), and for nftables
//! kube-proxy's layout with one anonymous `numgen … vmap` per Service, loaded with `nft -f`
//! (its text is generated before the clock starts, so the anchor pays only `nft` and the kernel).
//!
//! Needs root, iproute2, iptables-legacy, iptables-nft and nft; prints a skip message otherwise.
//! Options: `--sizes 1000,10000,30000` `--endpoints 10` `--changes 3` `--only <substring>,...`
//! `--budget-s 150` `--anchor-max 10000` `--nft-shards 32` (berth's nat shards on nftables; the
//! agent's default) `--nft-cold-load staged|one` (berth's cold load on nftables in stages, as the
//! agent's, or as one transaction). Bounds, so a run ends in minutes: each (size, case)
//! gets `--budget-s` seconds in all (`BERTH_SYNC_BUDGET_S`); past it the processes in its
//! namespace (this run's own `iptables-restore` or `nft`) are killed, the row says `stopped`, and
//! the case is not tried at larger sizes. The kube-proxy-shaped anchors run up to `--anchor-max`
//! Services (`BERTH_SYNC_ANCHOR_MAX`); above it their rows say `skipped`.
//! Prints one `sync:` line per (size, case) and, per size, the summary keys `full_sync_<n>_s`,
//! `change_<n>_real_ms`, `add_<n>_real_ms` (berth on nftables through netlink), the same through
//! `nft -f` (`nft_text_…`) and their ratios to the anchors. berth's nftables row (netlink) also
//! measures an agent restart over the tables it left: a fresh lean planner and Syncer adopt them
//! (read, compare, write nothing as they match); the row prints the cold load's and the
//! restart's peak resident growth (`VmHWM` reset through `/proc/self/clear_refs` before each)
//! and the restart's time, the summary `cold_peak_<n>_mb` and `restart_peak_<n>_mb`.
#![allow(clippy::unwrap_used)]

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_core::IpFamily;
use berth_datapath::apply::{apply_planned, plan_for_sync};
use berth_datapath::backend::SyncRuleset;
use berth_datapath::iptables::Syncer;
use berth_datapath::iptables::{Backend, CommandIptables};
use berth_datapath::nft::shard::{Shard, DEFAULT_SHARDS};
use berth_datapath::nft::Transaction;
use berth_datapath::nft::{CommandNft, NetlinkNft, Nft, NftSyncer, NftWriter, Shards};
use berth_datapath::{
    rewritten_every_sync, Dispatch, Endpoint, NodeView, PlanOptions, Planner, ServicePort,
    ServicePortName,
};
use berth_lab::topology::{preflight, remove_orphans, TopologySpec};
use berth_testing::{mk_endpoint, mk_node_info, mk_service_port, port_name};

const TAG: &str = "sb";

struct Options {
    sizes: Vec<usize>,
    endpoints: usize,
    changes: usize,
    only: Vec<String>,
    budget: Duration,
    anchor_max: usize,
    /// berth's nat shards on nftables (`--nft-shards`, the agent's default).
    shards: Shards,
    /// Whether berth's cold load on nftables goes in stages, as the agent's does (`false`:
    /// `--nft-cold-load one`, one transaction).
    staged: bool,
    /// The cluster's Service CIDRs berth's plans know (`--service-cidrs`; none by default): with
    /// them every ClusterIP gets its reject in `BERTH-CLUSTER-IPS`.
    service_cidrs: Vec<ipnet::IpNet>,
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn parse_options() -> Options {
    let mut options = Options {
        sizes: vec![1000, 10_000, 30_000],
        endpoints: 10,
        changes: 3,
        only: Vec::new(),
        budget: Duration::from_secs(env_number("BERTH_SYNC_BUDGET_S", 150)),
        anchor_max: env_number("BERTH_SYNC_ANCHOR_MAX", 10_000) as usize,
        shards: Shards::new(DEFAULT_SHARDS).unwrap(),
        staged: true,
        service_cidrs: Vec::new(),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let list = |v: &str| -> Vec<String> { v.split(',').map(str::to_string).collect() };
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--sizes" => options.sizes = list(&value).iter().map(|s| s.parse().unwrap()).collect(),
            "--endpoints" => options.endpoints = value.parse().unwrap(),
            "--changes" => options.changes = value.parse().unwrap(),
            "--only" => options.only = list(&value),
            "--budget-s" => options.budget = Duration::from_secs(value.parse().unwrap()),
            "--anchor-max" => options.anchor_max = value.parse().unwrap(),
            "--nft-shards" => options.shards = Shards::new(value.parse().unwrap()).unwrap(),
            "--nft-cold-load" => options.staged = value != "one",
            "--service-cidrs" => {
                options.service_cidrs = list(&value).iter().map(|c| c.parse().unwrap()).collect()
            }
            // cargo bench passes --bench; anything else is ignored.
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    options
}

fn service_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(
        u32::from(Ipv4Addr::new(10, 96, 0, 1)) + i as u32,
    ))
}

/// Unique unused pod addresses: 250 per /24 of 10.244.1-255, the port telling the rest apart.
fn endpoint(i: usize, e: usize, endpoints: usize, generation: usize) -> Endpoint {
    let k = i * endpoints + e;
    let ip = Ipv4Addr::new(10, 244, 1 + (k % 250) as u8, 2 + ((k / 250) % 250) as u8);
    let port = 1024 + (k / 62_500) as u16 + 100 * generation as u16;
    mk_endpoint(IpAddr::V4(ip), port, "elsewhere")
}

fn service(i: usize, endpoints: usize) -> ServicePort {
    mk_service_port(
        name(i),
        service_ip(i),
        80,
        (0..endpoints)
            .map(|e| endpoint(i, e, endpoints, 0))
            .collect(),
    )
}

fn name(i: usize) -> ServicePortName {
    port_name(&format!("ns{}", i % 50), &format!("svc-{i}"), "http")
}

fn mk_view(n: usize, endpoints: usize) -> NodeView {
    NodeView {
        node: mk_node_info("node", IpAddr::V4(Ipv4Addr::new(198, 18, 0, 11))),
        services: (0..n).map(|i| service(i, endpoints)).collect(),
    }
}

/// A namespace of this run, deleted when dropped.
struct Netns(String);

impl Netns {
    fn new(k: usize) -> Netns {
        let name = format!("{}-{k}", TopologySpec::unique_prefix(TAG));
        let status = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap();
        assert!(status.success(), "ip netns add {name}");
        Netns(name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Ends a case that runs past its budget: kills, by pid, the processes running in its namespace
/// (only this run's own `iptables-restore` or `nft` run there), so the step fails and the case
/// ends. Stops watching when dropped.
struct Watchdog {
    done: Arc<AtomicBool>,
    fired: Arc<AtomicBool>,
}

impl Watchdog {
    fn start(ns: &str, budget: Duration) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let fired = Arc::new(AtomicBool::new(false));
        let (ns, stop, flag) = (ns.to_string(), done.clone(), fired.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                if start.elapsed() < budget {
                    continue;
                }
                flag.store(true, Ordering::Relaxed);
                let pids = Command::new("ip")
                    .args(["netns", "pids", &ns])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                for pid in pids.split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            }
        });
        Watchdog { done, fired }
    }

    fn fired(&self) -> bool {
        self.fired.load(Ordering::Relaxed)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Berth(Backend),
    KubeProxyIptables(Backend),
    BerthNft(NftWriter),
    KubeProxyNft,
}

impl Case {
    fn is_anchor(self) -> bool {
        matches!(self, Case::KubeProxyIptables(_) | Case::KubeProxyNft)
    }

    fn label(self) -> &'static str {
        match self {
            Case::Berth(Backend::Legacy) => "berth-iptables-legacy",
            Case::Berth(_) => "berth-iptables-nft",
            Case::KubeProxyIptables(Backend::Legacy) => "kube-proxy-shaped-iptables-legacy",
            Case::KubeProxyIptables(_) => "kube-proxy-shaped-iptables-nft",
            Case::BerthNft(NftWriter::Netlink) => "berth-nftables",
            Case::BerthNft(NftWriter::Nft) => "berth-nftables-nft-text",
            Case::KubeProxyNft => "kube-proxy-shaped-nftables",
        }
    }
}

/// berth's nftables first (its netlink writer, the default, then `nft -f`): the rows the
/// summary needs.
const CASES: [Case; 7] = [
    Case::BerthNft(NftWriter::Netlink),
    Case::BerthNft(NftWriter::Nft),
    Case::KubeProxyNft,
    Case::Berth(Backend::Legacy),
    Case::KubeProxyIptables(Backend::Legacy),
    Case::Berth(Backend::Nft),
    Case::KubeProxyIptables(Backend::Nft),
];

#[derive(Debug, Clone, Copy)]
struct Result {
    cold: Duration,
    cold_bytes: usize,
    change: Duration,
    add: Duration,
    /// The writer alone (`nft -f`, or building and sending the netlink batch) in the cold sync,
    /// the median change and the median add (berth on nftables only).
    nft_split: Option<(Duration, Duration, Duration)>,
    /// The incremental planner's part of the median add.
    add_plan: Duration,
    /// The Syncer's own part of an add (diffing and building the transaction; the add less
    /// the planner and the writer), median.
    add_sync: Duration,
    /// berth on nftables: the cold load's and an agent restart's (a fresh planner and Syncer
    /// adopting the tables the cold load left) peak resident growth in MB, and the restart's
    /// time.
    memory: Option<Memory>,
}

#[derive(Debug, Clone, Copy)]
struct Memory {
    cold_peak_mb: f64,
    restart_peak_mb: f64,
    restart: Duration,
}

/// A field of /proc/self/status, in KiB.
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .unwrap_or(0)
}

/// Starts a new peak: the kernel resets `VmHWM` to the current resident set.
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// MB the peak grew above `from` (KiB) since the last [`reset_peak`].
fn peak_growth_mb(from: u64) -> f64 {
    status_kib("VmHWM:").saturating_sub(from) as f64 / 1024.0
}

/// Keeps the wall time of the last write.
struct TimedNft {
    nft: Box<dyn Nft>,
    last: Arc<Mutex<Duration>>,
}

impl Nft for TimedNft {
    fn apply(&mut self, tx: &Transaction) -> std::result::Result<(), berth_datapath::Error> {
        let start = Instant::now();
        let result = self.nft.apply(tx);
        *self.last.lock().unwrap() = start.elapsed();
        result
    }

    fn tables(
        &mut self,
        family: IpFamily,
    ) -> std::result::Result<Option<std::collections::BTreeSet<Shard>>, berth_datapath::Error> {
        self.nft.tables(family)
    }

    fn apply_staged(
        &mut self,
        stages: &mut dyn Iterator<Item = Transaction>,
    ) -> std::result::Result<usize, berth_datapath::Error> {
        let start = Instant::now();
        let result = self.nft.apply_staged(stages);
        *self.last.lock().unwrap() = start.elapsed();
        result
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// berth's agent path: the incremental planner, told which Service changed, and the Syncer.
fn measure_berth(
    case: Case,
    ns: &str,
    n: usize,
    options: &Options,
) -> std::result::Result<Result, String> {
    let dispatch = match case {
        Case::Berth(_) => Dispatch::Tree,
        _ => Dispatch::Linear,
    };
    let plan_options = PlanOptions {
        family: IpFamily::V4,
        dispatch,
        cluster_cidr: Some("10.244.0.0/16".parse().unwrap()),
        service_cidrs: options.service_cidrs.clone(),
        ..PlanOptions::default()
    };
    let nft_time = Arc::new(Mutex::new(Duration::ZERO));
    let nft_last = || *nft_time.lock().unwrap();
    let mut syncer: Box<dyn SyncRuleset> = match case {
        Case::Berth(backend) => Box::new(Syncer::new(
            CommandIptables::with_backend(IpFamily::V4, backend).netns_named(ns),
        )),
        Case::KubeProxyIptables(backend) => Box::new(
            Syncer::new(
                CommandIptables::with_backend(IpFamily::V4, backend)
                    .netns_named(ns)
                    .listing_first(false),
            )
            .rewriting_every_sync(rewritten_every_sync(Dispatch::Linear)),
        ),
        Case::BerthNft(writer) => Box::new(
            NftSyncer::new(
                TimedNft {
                    nft: match writer {
                        NftWriter::Netlink => Box::new(NetlinkNft::in_netns(ns)),
                        NftWriter::Nft => Box::new(CommandNft::in_netns(ns)),
                    },
                    last: nft_time.clone(),
                },
                IpFamily::V4,
            )
            .with_shards(options.shards)
            .with_staged_cold_load(options.staged),
        ),
        Case::KubeProxyNft => return Err("not a berth case".into()),
    };
    let mut view = mk_view(n, options.endpoints);
    // As the agent: a lean planner whose full syncs plan the Service chains a group of ports
    // at a time (iptables as it writes them, nftables as the load reaches each shard); the
    // kube-proxy-shaped anchor keeps its whole plan, as kube-proxy does.
    let (mut planner, groups) = match case {
        Case::KubeProxyIptables(_) => (Planner::new(plan_options.clone()), None),
        Case::BerthNft(_) => (
            Planner::new(plan_options.clone()).lean(),
            options.shards.is_sharded().then_some(options.shards),
        ),
        _ => (
            Planner::new(plan_options.clone())
                .lean()
                .keeping_endpoint_names(),
            Shards::new(DEFAULT_SHARDS).ok(),
        ),
    };
    reset_peak();
    let rss_before_cold = status_kib("VmRSS:");
    let start = Instant::now();
    let ports = plan_for_sync(&mut planner, &view, true, groups, |planner| {
        planner.update(&view)
    });
    let mut changes = planner.take_changes();
    let report = apply_planned(syncer.as_mut(), &mut planner, &mut changes, ports, |p| {
        p.fill(&view)
    })
    .map_err(|e| e.to_string())?;
    let cold = start.elapsed();
    let cold_peak_mb = peak_growth_mb(rss_before_cold);
    let cold_bytes = report.payload_bytes;
    let cold_nft = nft_last();

    let planning = Arc::new(Mutex::new(Duration::ZERO));
    let plan_last = || *planning.lock().unwrap();
    let mut step =
        |view: &NodeView, changed: &ServicePortName| -> std::result::Result<Duration, String> {
            let start = Instant::now();
            planner.update_changed(view, &|p| p == changed);
            let mut changes = planner.take_changes();
            *planning.lock().unwrap() = start.elapsed();
            apply_planned(syncer.as_mut(), &mut planner, &mut changes, None, |p| {
                p.fill(view)
            })
            .map_err(|e| e.to_string())?;
            Ok(start.elapsed())
        };
    let mut change = Vec::new();
    let mut change_nft = Vec::new();
    for k in 0..options.changes {
        let target = n / 2 + k;
        let changed = endpoint(target, 0, options.endpoints, 1 + k);
        view.services[target].endpoints.edit(|eps| eps[0] = changed);
        change.push(step(&view, &name(target))?);
        change_nft.push(nft_last());
    }
    let mut add = Vec::new();
    let mut add_nft = Vec::new();
    let mut add_plan = Vec::new();
    let mut add_sync = Vec::new();
    for k in 0..options.changes {
        let i = n + k;
        view.services.push(service(i, options.endpoints));
        let total = step(&view, &name(i))?;
        add.push(total);
        add_nft.push(nft_last());
        add_plan.push(plan_last());
        add_sync.push(total.saturating_sub(plan_last() + nft_last()));
    }
    let memory = match case {
        Case::BerthNft(NftWriter::Netlink) => {
            // An agent restart: its planner and Syncer start empty and find the tables the
            // load left, which they adopt (read, compare, write only what differs).
            drop(syncer);
            drop(planner);
            let mut syncer = NftSyncer::new(NetlinkNft::in_netns(ns), IpFamily::V4)
                .with_shards(options.shards)
                .with_staged_cold_load(options.staged);
            let mut planner = Planner::new(plan_options).lean();
            reset_peak();
            let rss_before = status_kib("VmRSS:");
            let start = Instant::now();
            let ports = plan_for_sync(&mut planner, &view, true, groups, |planner| {
                planner.update(&view)
            });
            let mut changes = planner.take_changes();
            let report = apply_planned(&mut syncer, &mut planner, &mut changes, ports, |p| {
                p.fill(&view)
            })
            .map_err(|e| e.to_string())?;
            let restart = start.elapsed();
            if report.rewritten_chains != 0 || report.deleted_chains != 0 {
                return Err(format!(
                    "the restart rewrote {} and deleted {} chains of a matching table",
                    report.rewritten_chains, report.deleted_chains
                ));
            }
            Some(Memory {
                cold_peak_mb,
                restart_peak_mb: peak_growth_mb(rss_before),
                restart,
            })
        }
        _ => None,
    };
    Ok(Result {
        cold,
        cold_bytes,
        change: median(change),
        add: median(add),
        nft_split: matches!(case, Case::BerthNft(_))
            .then(|| (cold_nft, median(change_nft), median(add_nft))),
        add_plan: median(add_plan),
        add_sync: median(add_sync),
        memory,
    })
}

/// One `nft -f -` of `text` in `ns`; its wall time.
fn nft_apply(ns: &str, text: &str) -> std::result::Result<Duration, String> {
    let start = Instant::now();
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(start.elapsed())
}

const KP: &str = "add rule ip kube-proxy";

/// kube-proxy's nftables chains and rules for one Service (endpoint generation `g`).
fn kp_service(i: usize, eps: &[Endpoint], g: usize, out: &mut Vec<String>) {
    let svc = format!("service-{i}-ns{}/svc-{i}/tcp/http", i % 50);
    out.push(format!("add chain ip kube-proxy {svc}"));
    let mut seps = Vec::new();
    for (e, ep) in eps.iter().enumerate() {
        let sep = format!("endpoint-{i}-{e}-{g}__{}/{}", ep.ip, ep.port);
        out.push(format!("add chain ip kube-proxy {sep}"));
        out.push(format!(
            "{KP} {sep} ip saddr {} jump mark-for-masquerade",
            ep.ip
        ));
        out.push(format!(
            "{KP} {sep} meta l4proto tcp dnat to {}:{}",
            ep.ip, ep.port
        ));
        seps.push(sep);
    }
    out.push(format!(
        "{KP} {svc} ip daddr {} tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade",
        service_ip(i)
    ));
    let vmap: Vec<String> = seps
        .iter()
        .enumerate()
        .map(|(k, sep)| format!("{k} : goto {sep}"))
        .collect();
    out.push(format!(
        "{KP} {svc} numgen random mod {} vmap {{ {} }}",
        seps.len(),
        vmap.join(", ")
    ));
    out.push(format!(
        "add element ip kube-proxy service-ips {{ {} . tcp . 80 : goto {svc} }}",
        service_ip(i)
    ));
}

fn measure_kube_proxy_nft(
    ns: &str,
    n: usize,
    options: &Options,
) -> std::result::Result<Result, String> {
    let view = mk_view(n, options.endpoints);
    let mut cold = vec![
        "add table ip kube-proxy".to_string(),
        "add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority dstnat ; }"
            .into(),
        "add chain ip kube-proxy services".into(),
        "add chain ip kube-proxy mark-for-masquerade".into(),
        format!("{KP} mark-for-masquerade mark set mark or 0x4000"),
        "add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }".into(),
        format!("{KP} nat-prerouting jump services"),
        format!("{KP} services ip daddr . meta l4proto . th dport vmap @service-ips"),
    ];
    for (i, svc) in view.services.iter().enumerate() {
        kp_service(i, &svc.endpoints, 0, &mut cold);
    }
    let text = cold.join("\n") + "\n";
    let cold_bytes = text.len();
    let cold = nft_apply(ns, &text)?;
    let mut change = Vec::new();
    for k in 0..options.changes {
        let i = n / 2 + k;
        let mut eps = view.services[i].endpoints.to_vec();
        eps[0] = endpoint(i, 0, options.endpoints, 1 + k);
        let svc = format!("service-{i}-ns{}/svc-{i}/tcp/http", i % 50);
        // The Service chain is rewritten with a new anonymous vmap, the new endpoint chain added.
        let mut tx = vec![format!("flush chain ip kube-proxy {svc}")];
        let mut body = Vec::new();
        kp_service(i, &eps, 1 + k, &mut body);
        tx.extend(body.into_iter().filter(|l| {
            !l.starts_with("add element") && !l.contains("add chain ip kube-proxy service-")
        }));
        change.push(nft_apply(ns, &(tx.join("\n") + "\n"))?);
    }
    let mut add = Vec::new();
    for k in 0..options.changes {
        let i = n + k;
        let mut tx = Vec::new();
        kp_service(i, &service(i, options.endpoints).endpoints, 0, &mut tx);
        add.push(nft_apply(ns, &(tx.join("\n") + "\n"))?);
    }
    Ok(Result {
        cold,
        cold_bytes,
        change: median(change),
        add: median(add),
        nft_split: None,
        add_plan: Duration::ZERO,
        add_sync: Duration::ZERO,
        memory: None,
    })
}

fn main() {
    let options = parse_options();
    if !Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
    {
        println!("sync backends: skipped (needs root to create network namespaces)");
        return;
    }
    let tools = [
        "ip",
        "iptables-legacy-restore",
        "iptables-nft-restore",
        "nft",
    ];
    if let Err(reason) = preflight(&tools) {
        println!("sync backends: skipped ({reason})");
        return;
    }
    let _ = remove_orphans(TAG);
    println!(
        "sync backends: berth on nftables in {} nat shards",
        options.shards.count()
    );
    let mut k = 0;
    // Cases stopped by the budget at a smaller size.
    let mut stopped: Vec<Case> = Vec::new();
    for &n in &options.sizes {
        let mut results: Vec<(Case, Result)> = Vec::new();
        for case in CASES {
            if !options.only.is_empty()
                && !options
                    .only
                    .iter()
                    .any(|o| case.label().contains(o.as_str()))
            {
                continue;
            }
            if case.is_anchor() && n > options.anchor_max {
                println!(
                    "sync: backend={} services={n} skipped (above the anchor bound {}, BERTH_SYNC_ANCHOR_MAX)",
                    case.label(),
                    options.anchor_max
                );
                continue;
            }
            if stopped.contains(&case) {
                println!(
                    "sync: backend={} services={n} skipped (stopped by the budget at a smaller size)",
                    case.label()
                );
                continue;
            }
            k += 1;
            let ns = Netns::new(k);
            let watchdog = Watchdog::start(&ns.0, options.budget);
            let result = match case {
                Case::KubeProxyNft => measure_kube_proxy_nft(&ns.0, n, &options),
                _ => measure_berth(case, &ns.0, n, &options),
            };
            let fired = watchdog.fired();
            drop(watchdog);
            drop(ns);
            if fired {
                println!(
                    "sync: backend={} services={n} stopped (over the budget of {} s, BERTH_SYNC_BUDGET_S)",
                    case.label(),
                    options.budget.as_secs()
                );
                stopped.push(case);
                continue;
            }
            match result {
                Ok(r) => {
                    let split = r.nft_split.map_or(String::new(), |(cold, change, add)| {
                        format!(
                            " (writer alone: cold_s={:.2} change_ms={:.1} add_ms={:.1}; \
                             planner alone: add_ms={:.1}; syncer alone: add_ms={:.1})",
                            cold.as_secs_f64(),
                            ms(change),
                            ms(add),
                            ms(r.add_plan),
                            ms(r.add_sync)
                        )
                    });
                    let memory = r.memory.map_or(String::new(), |m| {
                        format!(
                            " (peak growth: cold_peak_mb={:.1} restart_peak_mb={:.1}; restart_s={:.2})",
                            m.cold_peak_mb,
                            m.restart_peak_mb,
                            m.restart.as_secs_f64()
                        )
                    });
                    println!(
                        "sync: backend={} services={n} endpoints={} cold_s={:.2} cold_mb={:.1} change_ms={:.1} add_service_ms={:.1}{split}{memory}",
                        case.label(),
                        options.endpoints,
                        r.cold.as_secs_f64(),
                        r.cold_bytes as f64 / 1e6,
                        ms(r.change),
                        ms(r.add),
                    );
                    results.push((case, r));
                }
                Err(err) => println!(
                    "sync: backend={} services={n} failed: {}",
                    case.label(),
                    err.lines().next().unwrap_or_default()
                ),
            }
        }
        let get = |case: Case| results.iter().find(|(c, _)| *c == case).map(|(_, r)| *r);
        let ratio = |a: Option<Result>, b: Option<Result>, f: fn(&Result) -> f64| match (a, b) {
            (Some(a), Some(b)) => format!("{:.1}", f(&b) / f(&a)),
            _ => "na".into(),
        };
        let cold = |r: &Result| r.cold.as_secs_f64();
        let change = |r: &Result| ms(r.change);
        let nft = get(Case::BerthNft(NftWriter::Netlink));
        let text = get(Case::BerthNft(NftWriter::Nft));
        let add = |r: &Result| ms(r.add);
        let memory = nft.and_then(|r| r.memory);
        let label = if n % 1000 == 0 {
            format!("{}k", n / 1000)
        } else {
            n.to_string()
        };
        println!(
            "sync summary {label}: full_sync_{label}_s={} change_{label}_real_ms={} \
             add_{label}_real_ms={} nft_text_full_sync_{label}_s={} \
             nft_text_change_{label}_real_ms={} nft_text_add_{label}_real_ms={} \
             kube_proxy_nft_cold_vs_berth={} kube_proxy_nft_change_vs_berth={} \
             ipt_nft_kube_proxy_cold_vs_berth={} ipt_legacy_kube_proxy_change_vs_berth={} \
             cold_peak_{label}_mb={} restart_peak_{label}_mb={}",
            nft.map_or("na".into(), |r| format!("{:.2}", cold(&r))),
            nft.map_or("na".into(), |r| format!("{:.1}", change(&r))),
            nft.map_or("na".into(), |r| format!("{:.1}", add(&r))),
            text.map_or("na".into(), |r| format!("{:.2}", cold(&r))),
            text.map_or("na".into(), |r| format!("{:.1}", change(&r))),
            text.map_or("na".into(), |r| format!("{:.1}", add(&r))),
            ratio(nft, get(Case::KubeProxyNft), cold),
            ratio(nft, get(Case::KubeProxyNft), change),
            ratio(
                get(Case::Berth(Backend::Nft)),
                get(Case::KubeProxyIptables(Backend::Nft)),
                cold
            ),
            ratio(
                get(Case::Berth(Backend::Legacy)),
                get(Case::KubeProxyIptables(Backend::Legacy)),
                change
            ),
            memory.map_or("na".into(), |m| format!("{:.1}", m.cold_peak_mb)),
            memory.map_or("na".into(), |m| format!("{:.1}", m.restart_peak_mb)),
        );
    }
}

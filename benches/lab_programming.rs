//! Network-programming latency on a lab: from the endpoints controller seeing a pod's readiness
//! change to the rules being in place on every node.
//!
//! `berth lab up` (3 nodes, the binary from `BERTH_BIN`, else this build's) runs the real API
//! server, controller (`--endpoints on`) and agents. The bench creates 1,000 ClusterIP Services
//! with 10 pods each; the pods are bound to three Nodes the bench adds (`virtual-0..2`, which no
//! kubelet manages), so the lab kubelet leaves them alone and the bench writes their status (IP,
//! Ready) itself. Once every Service has its 10
//! ready endpoints and the agents' rule counts are steady, it flips the readiness of random pods
//! (20 a second) and reads the agents' `berth_agent_network_programming_duration_seconds`
//! histograms before and after: the controller stamps each EndpointSlice change with the
//! `endpoints.kubernetes.io/last-change-trigger-time` annotation, and each agent observes now
//! minus that time once the change is in its rules. p50 and p99 are interpolated within the
//! histogram's buckets (1 ms to 65 s, four per doubling), as Prometheus' `histogram_quantile` does.
//!
//! `BERTH_BENCH_SERVICES=<n>` runs a smaller lab; `BERTH_BENCH_KEEP_LOGS=<dir>` keeps the
//! components' logs there (run with `RUST_LOG=debug` to see every sync).
//!
//! Needs root (namespaces); skips with a message otherwise. Ends with
//! `programming-latency: p50_ms=<n> p99_ms=<n>`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::{stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

const PODS_PER_SERVICE: usize = 10;
const NODES: usize = 3;
const FLIPS: usize = 400;
const FLIP_EVERY: Duration = Duration::from_millis(50);
const METRIC: &str = "berth_agent_network_programming_duration_seconds";

struct LabProcess {
    child: Child,
    name: String,
    dir: PathBuf,
    bin: PathBuf,
}

impl Drop for LabProcess {
    fn drop(&mut self) {
        if let Some(keep) = std::env::var_os("BERTH_BENCH_KEEP_LOGS") {
            let _ = Command::new("cp")
                .arg("-a")
                .arg(self.dir.join("logs"))
                .arg(&keep)
                .status();
        }
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let _ = Command::new(&self.bin)
            .args(["lab", "down", "--name", &self.name, "--state-dir"])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .status();
    }
}

/// Cumulative bucket counts by upper bound (seconds), summed over the agents.
type Buckets = BTreeMap<u64, f64>;

fn parse_buckets(metrics: &str, into: &mut Buckets) {
    let prefix = format!("{METRIC}_bucket{{le=\"");
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        let Some((le, count)) = rest.split_once("\"} ") else {
            continue;
        };
        let bound = if le == "+Inf" {
            u64::MAX
        } else {
            (le.parse::<f64>().unwrap_or(f64::MAX) * 1e6) as u64
        };
        *into.entry(bound).or_default() += count.trim().parse::<f64>().unwrap_or(0.0);
    }
}

fn agent_buckets(layout: &berth_lab::topology::Layout) -> Buckets {
    let mut all = Buckets::new();
    for node in &layout.nodes {
        let addr = SocketAddr::from((node.lan_ip, 10356));
        let (_, body) =
            berth_lab::netns::http_get(&node.netns, addr, "/metrics", Duration::from_secs(5))
                .unwrap();
        parse_buckets(&body, &mut all);
    }
    all
}

fn agent_rules(layout: &berth_lab::topology::Layout) -> Vec<String> {
    layout
        .nodes
        .iter()
        .map(|node| {
            let addr = SocketAddr::from((node.lan_ip, 10356));
            berth_lab::netns::http_get(&node.netns, addr, "/metrics", Duration::from_secs(5))
                .map(|(_, body)| {
                    body.lines()
                        .find(|l| l.starts_with("berth_agent_rules "))
                        .unwrap_or("")
                        .to_string()
                })
                .unwrap_or_default()
        })
        .collect()
}

/// The q-quantile (0-1) of the observations between two cumulative snapshots, in ms.
fn quantile_ms(before: &Buckets, after: &Buckets, q: f64) -> (f64, f64) {
    let delta: Vec<(u64, f64)> = after
        .iter()
        .map(|(b, c)| (*b, c - before.get(b).copied().unwrap_or(0.0)))
        .collect();
    let total = delta.last().map(|(_, c)| *c).unwrap_or(0.0);
    let rank = q * total;
    let mut lower = (0u64, 0.0f64);
    for (bound, count) in &delta {
        if *count >= rank {
            if *bound == u64::MAX {
                return (lower.0 as f64 / 1000.0, total);
            }
            let within = if count - lower.1 > 0.0 {
                (rank - lower.1) / (count - lower.1)
            } else {
                0.0
            };
            let ms = (lower.0 as f64 + (*bound - lower.0) as f64 * within) / 1000.0;
            return (ms, total);
        }
        lower = (*bound, *count);
    }
    (f64::NAN, total)
}

fn pod_status(ip: &str, ready: bool) -> serde_json::Value {
    let status = if ready { "True" } else { "False" };
    let now = chrono_now();
    json!({"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": status, "lastTransitionTime": now}]
    }})
}

fn chrono_now() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    k8s_openapi::jiff::Timestamp::from_second(d.as_secs() as i64)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn pod_ip(s: usize, k: usize) -> String {
    let n = s * PODS_PER_SERVICE + k;
    format!("10.244.{}.{}", 100 + n / 250, n % 250 + 1)
}

/// Services in the run: 1,000 unless `BERTH_BENCH_SERVICES` says otherwise (for a quick look).
fn services_count() -> usize {
    std::env::var("BERTH_BENCH_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

#[tokio::main]
async fn main() {
    let services_n = services_count();
    if !Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
    {
        println!("lab-programming: skipped: needs root for network namespaces");
        return;
    }
    let bin = std::env::var_os("BERTH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_berth")));
    let name = format!("b{}", std::process::id());
    let dir = std::env::temp_dir().join(format!("berth-bench-{name}"));
    let out = std::env::temp_dir().join(format!("berth-bench-{name}.out"));
    let child = Command::new(&bin)
        .args([
            "lab",
            "up",
            "--name",
            &name,
            "--nodes",
            &NODES.to_string(),
            "--state-dir",
        ])
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lab = LabProcess {
        child,
        name: name.clone(),
        dir: dir.clone(),
        bin: bin.clone(),
    };
    let started = Instant::now();
    while !std::fs::read_to_string(&out)
        .unwrap_or_default()
        .contains("is up")
    {
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "the lab did not come up"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "lab up in {:.1} s ({})",
        started.elapsed().as_secs_f64(),
        bin.display()
    );
    let prefix = berth_lab::cluster::plan::lab_prefix(&name).unwrap();
    let layout = berth_lab::topology::layout(
        &berth_lab::cluster::plan::lab_topology(&prefix, NODES).unwrap(),
    )
    .unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(dir.join("kubeconfig")).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = Client::try_from(config).unwrap();

    let load = Instant::now();
    let nodes: Api<Node> = Api::all(client.clone());
    for k in 0..NODES {
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": format!("virtual-{k}")}})).unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    stream::iter(0..services_n)
        .for_each_concurrent(16, |s| {
            let services = services.clone();
            async move {
                let svc: Service = serde_json::from_value(json!({
                    "metadata": {"name": format!("s{s}")},
                    "spec": {"selector": {"app": format!("s{s}")},
                        "ports": [{"port": 80, "targetPort": 8080}]}
                }))
                .unwrap();
                services.create(&PostParams::default(), &svc).await.unwrap();
            }
        })
        .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    stream::iter((0..services_n).flat_map(|s| (0..PODS_PER_SERVICE).map(move |k| (s, k))))
        .for_each_concurrent(16, |(s, k)| {
            let pods = pods.clone();
            async move {
                let name = format!("s{s}-{k}");
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {"app": format!("s{s}")}},
                    "spec": {"nodeName": format!("virtual-{}", k % NODES), "containers": [{"name": "c",
                        "ports": [{"containerPort": 8080}]}]}
                }))
                .unwrap();
                pods.create(&PostParams::default(), &pod).await.unwrap();
                pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(pod_status(&pod_ip(s, k), true)))
                    .await
                    .unwrap();
            }
        })
        .await;
    println!(
        "created {services_n} Services and {} pods in {:.1} s",
        services_n * PODS_PER_SERVICE,
        load.elapsed().as_secs_f64()
    );
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let ready: usize = slices
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .flat_map(|s| s.endpoints.iter())
                    .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
                    .count()
            })
            .unwrap_or(0);
        if ready >= services_n * PODS_PER_SERVICE {
            break;
        }
        assert!(Instant::now() < deadline, "only {ready} ready endpoints");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Settled: the same rule counts and no new programming observations for three readings
    // five seconds apart.
    let mut last = (Vec::new(), Buckets::new());
    let mut same = 0;
    while same < 3 {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = (agent_rules(&layout), agent_buckets(&layout));
        same = if now == last { same + 1 } else { 0 };
        last = now;
        assert!(
            Instant::now() < deadline,
            "the agents never settled: {:?}",
            last.0
        );
    }
    let last = last.0;
    println!(
        "all endpoints ready and programmed after {:.1} s: {last:?}",
        load.elapsed().as_secs_f64()
    );

    let before = agent_buckets(&layout);
    let mut rng = SmallRng::seed_from_u64(7);
    let mut ready: BTreeMap<(usize, usize), bool> = BTreeMap::new();
    let flipping = Instant::now();
    for _ in 0..FLIPS {
        let (s, k) = (
            rng.random_range(0..services_n),
            rng.random_range(0..PODS_PER_SERVICE),
        );
        let now_ready = !ready.get(&(s, k)).copied().unwrap_or(true);
        ready.insert((s, k), now_ready);
        pods.patch_status(
            &format!("s{s}-{k}"),
            &PatchParams::default(),
            &Patch::Merge(pod_status(&pod_ip(s, k), now_ready)),
        )
        .await
        .unwrap();
        tokio::time::sleep(FLIP_EVERY).await;
    }
    // Every flip changes one slice, which each agent observes once: wait for them all (or two
    // minutes, then report what arrived).
    let expected = (FLIPS * NODES) as f64;
    let total = |b: &Buckets| b.get(&u64::MAX).copied().unwrap_or(0.0);
    let waiting = Instant::now();
    let mut after = agent_buckets(&layout);
    while total(&after) - total(&before) < expected && waiting.elapsed() < Duration::from_secs(120)
    {
        tokio::time::sleep(Duration::from_secs(1)).await;
        after = agent_buckets(&layout);
    }
    let (p50, n) = quantile_ms(&before, &after, 0.50);
    let (p99, _) = quantile_ms(&before, &after, 0.99);
    println!(
        "{FLIPS} readiness flips in {:.1} s over {services_n} Services x {PODS_PER_SERVICE} endpoints, {NODES} nodes: {n} of {expected} observations",
        flipping.elapsed().as_secs_f64()
    );
    println!("| Services | endpoints each | nodes | observations | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|---|");
    println!("| {services_n} | {PODS_PER_SERVICE} | {NODES} | {n} | {p50:.0} | {p99:.0} |");
    drop(lab);
    let _ = std::fs::remove_file(&out);
    println!("programming-latency: p50_ms={p50:.0} p99_ms={p99:.0}");
}

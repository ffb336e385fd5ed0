//! Cold start of berth's controller against the lab API server: the API server runs in this
//! process, already holding the objects; `berth controller` (found through `BERTH_BIN`, else
//! `target/release/berth`) runs as a child process, so its peak RSS (VmHWM) is its own. Timing
//! starts when the child is spawned and ends when watches in this process have seen every Service
//! done. Request counts come from the lab's counter, taken after this process's own watches have
//! listed, so they are the controller's.
//!
//! Rows:
//! - allocation: 10,000 LoadBalancer Services and one IPPool; done = ClusterIP and LoadBalancer
//!   ingress set. Its Events trail the status, so its requests are counted once the controller
//!   has stopped writing.
//! - endpoints on: `--endpoints on`, the same Services and 100,000 ready pods (10 per Service);
//!   done = every Service allocated with ingress, every Endpoints object lists its 10 pods, and
//!   every Service has a berth EndpointSlice listing them.
//!
//! The table gives two times per row: until every Service is allocated and has its status (the
//! goal's measure), and until everything the row waits for is done (with endpoints on, also
//! every Endpoints object and slice). Ends with `controller: services_per_sec=<n> rss_mb=<n>`:
//! the first row's rate (allocation), and the highest peak RSS of the rows (so the memory figure
//! covers endpoints on). Each row gives the controller's CPU seconds and this process's ("API
//! server + watches"), both from the controller's start until done: on a small machine they
//! compete for the same cores.
//! `BERTH_BENCH_SERVICES` shrinks the run for a quick check; `BERTH_BENCH_ROWS=endpoints` (or
//! `allocation`) runs one row. While the endpoints row runs, progress and the CPU seconds of both
//! processes go to stderr every 2 s. Everything stays on 127.0.0.1; the
//! addresses are data in the API server, never configured.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth_lab::{LabApiServer, LabApiServerHandle, RequestCounts};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::Resource;
use serde_json::{json, Value};

const NAMESPACES: usize = 10;
const NODES: usize = 10;
const PODS_PER_SERVICE: usize = 10;
const TIMEOUT: Duration = Duration::from_secs(600);

fn services() -> usize {
    std::env::var("BERTH_BENCH_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

/// Kills the controller process if the bench fails half way, so that none is left running.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Row {
    name: &'static str,
    services: usize,
    /// Until every Service is done (for the endpoints row: with its Endpoints and slice).
    seconds: f64,
    /// Until every Service is allocated and has its status.
    allocated_seconds: f64,
    rss_mb: f64,
    /// CPU seconds the controller process used (user + system) until done.
    cpu_seconds: f64,
    /// CPU seconds this process (the lab API server and the bench's own watches) used from the
    /// controller's start until done: on a small machine the two share the cores, so the sum
    /// per Service says more than either time when the machine is busy.
    server_cpu_seconds: f64,
    requests: RequestCounts,
}

impl Row {
    fn services_per_sec(&self) -> f64 {
        self.services as f64 / self.seconds
    }

    fn allocated_per_sec(&self) -> f64 {
        self.services as f64 / self.allocated_seconds
    }
}

fn ns(i: usize) -> String {
    format!("load-{}", i % NAMESPACES)
}

/// The requests the server answered since `before`.
fn counts_since(server: &LabApiServerHandle, before: &RequestCounts) -> RequestCounts {
    let after = server.request_counts();
    RequestCounts {
        reads: after.reads - before.reads,
        writes: after.writes - before.writes,
    }
}

/// The lab API server with the namespaces, nodes, berth's CRDs and one IPPool every row uses.
async fn start_lab() -> LabApiServerHandle {
    let server = LabApiServer::builder()
        .history_capacity(1_000_000)
        .start()
        .await
        .unwrap();
    let namespaces = (0..NAMESPACES).map(|n| {
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("load-{n}")}})
    });
    server.seed(namespaces).unwrap();
    let nodes = (0..NODES).map(|n| {
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": format!("n{n}"),
                            "labels": {"topology.kubernetes.io/zone": format!("z{}", n % 3)}}})
    });
    server.seed(nodes).unwrap();
    let crds = berth_api::crds()
        .into_iter()
        .map(|c| serde_json::to_value(c).unwrap());
    server.seed(crds).unwrap();
    server
        .seed(
            [json!({"apiVersion": "berth.dev/v1alpha1", "kind": "IPPool",
                      "metadata": {"name": "bench"},
                      "spec": {"addresses": ["198.19.0.0/16"]}})],
        )
        .unwrap();
    server
}

/// Peak resident set of a process, from /proc (kB there).
fn peak_rss_mb(pid: u32) -> f64 {
    rss_mb(pid, "VmHWM:")
}

/// A memory figure of a process from /proc/<pid>/status (`VmHWM:` peak, `VmRSS:` now), in MB.
fn rss_mb(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// User plus system CPU seconds of a process so far, from /proc (clock ticks there; 100 per
/// second on Linux).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    match (ticks(11), ticks(12)) {
        (Some(user), Some(system)) => (user + system) / 100.0,
        _ => f64::NAN,
    }
}

fn berth_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("BERTH_BIN") {
        return Some(PathBuf::from(path));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let path = target.join("release/berth");
    path.exists().then_some(path)
}

/// `berth controller` against the lab API server in this process: the bench's address plan, no
/// leader election, warnings only, `extra` flags last.
fn spawn_berth_controller(binary: &Path, kubeconfig: &Path, extra: &[&str]) -> Child {
    Command::new(binary)
        .args(["controller", "--kubeconfig"])
        .arg(kubeconfig)
        .args([
            "--service-cidr",
            "10.96.0.0/16",
            "--node-port-range",
            "30000-49999",
            "--default-class",
            "l2",
            "--leader-election",
            "false",
            "--log-level",
            "warn",
            "--admin-listen",
            &format!("127.0.0.1:{}", free_port()),
        ])
        .args(extra)
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Watches `api` until `done` holds for `expected` objects, after calling `start` once this
/// watch has listed. Returns the seconds from `start` to the end, and the child it started.
async fn measure<K>(
    server: &LabApiServerHandle,
    api: Api<K>,
    expected: usize,
    done: impl Fn(&K) -> bool,
    start: impl FnOnce() -> Child,
) -> (f64, f64, ChildGuard, RequestCounts)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let stream = watcher::watcher(api, watcher::Config::default());
    futures::pin_mut!(stream);
    let mut finished: HashSet<String> = HashSet::new();
    let key = |o: &K| {
        format!(
            "{}/{}",
            o.meta().namespace.clone().unwrap_or_default(),
            o.meta().name.clone().unwrap_or_default()
        )
    };
    let mut start = Some(start);
    let mut child = None;
    let mut started = Instant::now();
    let mut before = RequestCounts::default();
    let mut cpu_before = 0.0;
    let deadline = Instant::now() + TIMEOUT;
    while let Some(event) = tokio::time::timeout_at(deadline.into(), stream.next())
        .await
        .expect("the controller did not finish in time")
    {
        match event.unwrap() {
            Event::Apply(o) | Event::InitApply(o) => {
                if done(&o) {
                    finished.insert(key(&o));
                } else {
                    finished.remove(&key(&o));
                }
            }
            Event::Delete(o) => {
                finished.remove(&key(&o));
            }
            Event::Init => {}
            Event::InitDone => {
                if let Some(start) = start.take() {
                    eprintln!("starting the controller");
                    before = server.request_counts();
                    cpu_before = cpu_seconds(std::process::id());
                    started = Instant::now();
                    child = Some(ChildGuard(start()));
                }
            }
        }
        if child.is_some() && finished.len() >= expected {
            break;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let server_cpu = cpu_seconds(std::process::id()) - cpu_before;
    (
        seconds,
        server_cpu,
        child.unwrap(),
        counts_since(server, &before),
    )
}

async fn allocation_row(binary: &Path, n: usize) -> Row {
    let server = start_lab().await;
    let svcs = (0..n).map(|i| {
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": format!("svc-{i}"), "namespace": ns(i)},
               "spec": {"type": "LoadBalancer", "selector": {"app": format!("app-{i}")},
                        "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    });
    server.seed(svcs).unwrap();
    eprintln!("allocation: {n} Services seeded");
    let dir = std::env::temp_dir().join(format!("berth-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();

    let client = server.client().unwrap();
    let (seconds, server_cpu, child, requests) = measure(
        &server,
        Api::<Service>::all(client),
        n,
        |s: &Service| {
            let ip = s.spec.as_ref().and_then(|s| s.cluster_ip.as_deref());
            let ingress = s
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|l| l.ingress.as_ref())
                .is_some_and(|i| !i.is_empty());
            ip.is_some_and(|ip| !ip.is_empty()) && ingress
        },
        || spawn_berth_controller(binary, &kubeconfig, &[]),
    )
    .await;
    // Events are sent after the status, off the allocation path: the controller's writes are
    // counted once they have stopped, not when the last status arrived.
    let (requests, settled) = settle_writes(&server, requests, seconds).await;
    let rss_mb = peak_rss_mb(child.0.id());
    let cpu = cpu_seconds(child.0.id());
    drop(child);
    server.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "allocation: {n} Services done in {seconds:.2} s ({:.0}/s); all writes settled after {settled:.2} s: {:.2} writes/Service, {:.3} reads/Service, peak RSS {rss_mb:.1} MB",
        n as f64 / seconds,
        requests.writes as f64 / n as f64,
        requests.reads as f64 / n as f64,
    );
    Row {
        name: "allocation (berth controller)",
        services: n,
        seconds,
        allocated_seconds: seconds,
        rss_mb,
        cpu_seconds: cpu,
        server_cpu_seconds: server_cpu,
        requests,
    }
}

/// Waits until the API server has seen no request for a second, and adds what came after
/// `done` to it. Returns the counts and the seconds from the start until the last request.
async fn settle_writes(
    server: &LabApiServerHandle,
    done: RequestCounts,
    seconds: f64,
) -> (RequestCounts, f64) {
    const QUIET: Duration = Duration::from_secs(1);
    let at_done = server.request_counts();
    let waited = Instant::now();
    let mut last = at_done;
    let mut last_change = Instant::now();
    while last_change.elapsed() < QUIET && waited.elapsed() < TIMEOUT {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = server.request_counts();
        if now != last {
            last = now;
            last_change = Instant::now();
        }
    }
    let settled = seconds + (last_change - waited).as_secs_f64().max(0.0);
    let total = RequestCounts {
        reads: done.reads + (last.reads - at_done.reads),
        writes: done.writes + (last.writes - at_done.writes),
    };
    (total, settled)
}

fn pod_ip(k: usize) -> String {
    let k = k + 1;
    format!("10.{}.{}.{}", 64 + (k >> 16), (k >> 8) & 255, k & 255)
}

/// The allocation row's Services (no addresses yet) and `PODS_PER_SERVICE` pods for each.
fn endpoints_objects(n: usize) -> (Vec<Value>, Vec<Value>) {
    let services = (0..n)
        .map(|i| {
            json!({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": format!("svc-{i}"), "namespace": ns(i)},
                   "spec": {"type": "LoadBalancer", "selector": {"app": format!("app-{i}")},
                            "ports": [{"name": "http", "port": 80, "targetPort": 8080,
                                       "protocol": "TCP"}]}})
        })
        .collect();
    let pods = (0..n * PODS_PER_SERVICE)
        .map(|k| {
            let i = k / PODS_PER_SERVICE;
            json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("svc-{i}-{}", k % PODS_PER_SERVICE),
                         "namespace": ns(i),
                         "labels": {"app": format!("app-{i}"), "pod-template-hash": "5d8f7"}},
            "spec": {"nodeName": format!("n{}", k % NODES),
                     "containers": [{"name": "app", "image": "echo",
                                     "ports": [{"name": "http", "containerPort": 8080}]}]},
            })
        })
        .collect();
    (services, pods)
}

/// What a kubelet reports: the API server takes status only through `/status`.
async fn set_pod_statuses(client: &kube::Client, n: usize) {
    futures::stream::iter(0..n * PODS_PER_SERVICE)
        .map(|k| {
            let i = k / PODS_PER_SERVICE;
            let api: Api<Pod> = Api::namespaced(client.clone(), &ns(i));
            let name = format!("svc-{i}-{}", k % PODS_PER_SERVICE);
            let ip = pod_ip(k);
            async move {
                let status = json!({"status": {
                    "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                    "conditions": [{"type": "Ready", "status": "True"}]}});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
}

fn service_done(s: &Service) -> bool {
    let ip = s.spec.as_ref().and_then(|s| s.cluster_ip.as_deref());
    let ingress = s
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| !i.is_empty());
    ip.is_some_and(|ip| !ip.is_empty()) && ingress
}

fn endpoints_done(e: &Endpoints) -> bool {
    let ready: usize = e
        .subsets
        .iter()
        .flatten()
        .map(|s| s.addresses.as_ref().map_or(0, Vec::len))
        .sum();
    ready == PODS_PER_SERVICE
}

/// The Service a berth slice serves, when it already lists every pod of that Service.
fn slice_done(s: &EndpointSlice) -> Option<String> {
    let labels = s.metadata.labels.as_ref()?;
    let berth = labels.get("endpointslice.kubernetes.io/managed-by")
        == Some(&"endpointslice-controller.berth.dev".to_owned());
    let ready = s
        .endpoints
        .iter()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .count();
    (berth && ready == PODS_PER_SERVICE).then(|| {
        format!(
            "{}/{}",
            s.metadata.namespace.clone().unwrap_or_default(),
            labels
                .get("kubernetes.io/service-name")
                .cloned()
                .unwrap_or_default()
        )
    })
}

/// One watch of the endpoints row, tagged with what it watches.
enum Seen {
    Service(Box<watcher::Event<Service>>),
    Endpoints(Box<watcher::Event<Endpoints>>),
    Slice(Box<watcher::Event<EndpointSlice>>),
}

/// Which objects are done, per kind, keyed by `namespace/name` (slices by their Service).
#[derive(Default)]
struct Progress {
    services: HashSet<String>,
    endpoints: HashSet<String>,
    slices: HashSet<String>,
    /// Watches that have listed; the controller starts once all three have.
    listed: usize,
}

fn object_key(meta: &kube::api::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default()
    )
}

fn track<K: Resource>(
    set: &mut HashSet<String>,
    event: Event<K>,
    done: impl Fn(&K) -> bool,
) -> bool {
    match event {
        Event::Apply(o) | Event::InitApply(o) => {
            if done(&o) {
                set.insert(object_key(o.meta()));
            } else {
                set.remove(&object_key(o.meta()));
            }
            false
        }
        Event::Delete(o) => {
            set.remove(&object_key(o.meta()));
            false
        }
        Event::Init => false,
        Event::InitDone => true,
    }
}

impl Progress {
    fn apply(&mut self, seen: Seen) {
        let listed = match seen {
            Seen::Service(e) => track(&mut self.services, *e, service_done),
            Seen::Endpoints(e) => track(&mut self.endpoints, *e, endpoints_done),
            Seen::Slice(e) => match *e {
                Event::Apply(s) | Event::InitApply(s) => {
                    // One slice per Service here (10 pods, up to 100 per slice).
                    if let Some(service) = slice_done(&s) {
                        self.slices.insert(service);
                    }
                    false
                }
                Event::Delete(_) | Event::Init => false,
                Event::InitDone => true,
            },
        };
        self.listed += usize::from(listed);
    }

    fn all_done(&self, n: usize) -> bool {
        self.services.len() >= n && self.endpoints.len() >= n && self.slices.len() >= n
    }
}

/// Like the allocation row's measurement, but done only when Services, Endpoints and
/// EndpointSlices all are.
async fn measure_endpoints_on(
    server: &LabApiServerHandle,
    n: usize,
    start: impl FnOnce() -> Child,
) -> (f64, f64, f64, ChildGuard, RequestCounts) {
    let client = server.client().unwrap();
    let config = watcher::Config::default;
    let services = watcher::watcher(Api::<Service>::all(client.clone()), config())
        .map(|e| e.map(|e| Seen::Service(Box::new(e))));
    let endpoints = watcher::watcher(Api::<Endpoints>::all(client.clone()), config())
        .map(|e| e.map(|e| Seen::Endpoints(Box::new(e))));
    let slices = watcher::watcher(Api::<EndpointSlice>::all(client), config())
        .map(|e| e.map(|e| Seen::Slice(Box::new(e))));
    let stream = futures::stream::select(services, futures::stream::select(endpoints, slices));
    futures::pin_mut!(stream);
    let mut progress = Progress::default();
    let mut last_report = Instant::now();
    let mut start = Some(start);
    let mut child = None;
    let mut started = Instant::now();
    let mut before = RequestCounts::default();
    let mut allocated_at = None;
    let mut cpu_before = 0.0;
    let deadline = Instant::now() + TIMEOUT;
    while let Some(event) = tokio::time::timeout_at(deadline.into(), stream.next())
        .await
        .expect("the controller did not finish in time")
    {
        progress.apply(event.unwrap());
        if child.is_some() && last_report.elapsed() >= Duration::from_secs(2) {
            last_report = Instant::now();
            eprintln!(
                "{:>5.1} s: {} Services, {} Endpoints, {} slices done; controller CPU {:.1} s, RSS {:.0} MB; this process {:.1} s",
                started.elapsed().as_secs_f64(),
                progress.services.len(),
                progress.endpoints.len(),
                progress.slices.len(),
                child.as_ref().map_or(f64::NAN, |c: &ChildGuard| cpu_seconds(c.0.id())),
                child.as_ref().map_or(f64::NAN, |c: &ChildGuard| rss_mb(c.0.id(), "VmRSS:")),
                cpu_seconds(std::process::id()),
            );
        }
        if progress.listed == 3 {
            if let Some(start) = start.take() {
                eprintln!("starting the controller");
                before = server.request_counts();
                cpu_before = cpu_seconds(std::process::id());
                started = Instant::now();
                child = Some(ChildGuard(start()));
            }
        }
        if child.is_some() && allocated_at.is_none() && progress.services.len() == n {
            allocated_at = Some(started.elapsed().as_secs_f64());
        }
        if child.is_some() && progress.all_done(n) {
            break;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let allocated = allocated_at.unwrap_or(seconds);
    let server_cpu = cpu_seconds(std::process::id()) - cpu_before;
    (
        seconds,
        allocated,
        server_cpu,
        child.unwrap(),
        counts_since(server, &before),
    )
}

/// `berth controller --endpoints on`, the allocation row's Services plus their pods.
async fn endpoints_row(binary: &Path, n: usize) -> Row {
    let server = start_lab().await;
    let (services, pods) = endpoints_objects(n);
    server.seed(services).unwrap();
    server.seed(pods).unwrap();
    let client = server.client().unwrap();
    set_pod_statuses(&client, n).await;
    eprintln!(
        "endpoints: {n} Services and {} ready pods seeded",
        n * PODS_PER_SERVICE
    );
    let dir = std::env::temp_dir().join(format!("berth-bench-ep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let (seconds, allocated_seconds, server_cpu, child, requests) =
        measure_endpoints_on(&server, n, || {
            spawn_berth_controller(binary, &kubeconfig, &["--endpoints", "on"])
        })
        .await;
    let rss_mb = peak_rss_mb(child.0.id());
    let cpu = cpu_seconds(child.0.id());
    drop(child);
    let slices = Api::<EndpointSlice>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap();
    let in_slices: usize = slices.items.iter().map(|s| s.endpoints.len()).sum();
    assert_eq!(slices.items.len(), n, "one slice per Service");
    assert_eq!(in_slices, n * PODS_PER_SERVICE);
    server.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    Row {
        name: "endpoints on (berth controller)",
        services: n,
        seconds,
        allocated_seconds,
        rss_mb,
        cpu_seconds: cpu,
        server_cpu_seconds: server_cpu,
        requests,
    }
}

/// The rows to run: `BERTH_BENCH_ROWS` (comma separated: `allocation`, `endpoints`), else both.
fn wanted(row: &str) -> bool {
    std::env::var("BERTH_BENCH_ROWS").map_or(true, |rows| rows.split(',').any(|r| r.trim() == row))
}

async fn run() {
    let n = services();
    let Some(binary) = berth_binary() else {
        panic!("no berth binary: set BERTH_BIN or run `cargo build --release -p berth`");
    };
    let mut rows = Vec::new();
    if wanted("allocation") {
        rows.push(allocation_row(&binary, n).await);
    }
    if wanted("endpoints") {
        rows.push(endpoints_row(&binary, n).await);
    }

    println!();
    println!(
        "| {:<31} | pods    | allocated s | allocated/s | all done s | all done/s | controller CPU s | API server + watches CPU s | writes/Service | reads/Service | peak RSS (MB) |",
        format!("cold start, {n} Services")
    );
    println!(
        "|---------------------------------|---------|-------------|-------------|------------|------------|------------------|----------------------------|----------------|---------------|---------------|"
    );
    for row in &rows {
        let pods = if row.name.starts_with("endpoints") {
            n * PODS_PER_SERVICE
        } else {
            0
        };
        println!(
            "| {:<31} | {:>7} | {:>11.2} | {:>11.0} | {:>10.2} | {:>10.0} | {:>16.1} | {:>26.1} | {:>14.2} | {:>13.3} | {:>13.1} |",
            row.name,
            pods,
            row.allocated_seconds,
            row.allocated_per_sec(),
            row.seconds,
            row.services_per_sec(),
            row.cpu_seconds,
            row.server_cpu_seconds,
            row.requests.writes as f64 / row.services as f64,
            row.requests.reads as f64 / row.services as f64,
            row.rss_mb
        );
    }
    let rss_mb = rows.iter().map(|r| r.rss_mb).fold(f64::NAN, f64::max);
    println!(
        "controller: services_per_sec={:.0} rss_mb={:.0}",
        rows[0].services_per_sec(),
        rss_mb
    );
}

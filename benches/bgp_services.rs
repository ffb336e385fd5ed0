//! `make bench-bgp`, its second part (root, FRR): 1,000 Services on the real agents' BGP lab
//! (`tests/bgp_lab`: two nodes, each running FRR and `berth agent --bgp-speaker` against the
//! lab API server, and a router running FRR with `maximum-paths`).
//! - Service to route: from the Service's creation (the Service, then its address in
//!   `status.loadBalancer`: this lab runs no controller, so the bench writes the status as the
//!   controller would) to its /32 in the router's kernel FIB with both nodes as next hops.
//!   First for 1,000 Services written one after another as fast as the API server takes them
//!   (`burst`), then for `BERTH_BGP_SERVICE_TRIALS` (20) more, one at a time, with the 1,000
//!   in place, each [`QUIET`] after the previous one's route arrived: a single Service in a
//!   cluster at rest, not constant churn (the burst measures that), where the agents' sync
//!   rate limit, not the path to the router, would decide.
//! - The API requests per second the two agents make at steady state with those Services.
//!
//! Prints the `bgp:` line; when `BERTH_BGP_FAILOVER` holds the line of the failover part
//! (`crates/bgp/benches/bgp_failover.rs`, run first by the Makefile), its fields come first.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/bgp_lab/mod.rs"]
mod bgp_lab;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bgp_lab::*;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;

const SERVICES: u32 = 1000;
/// The pause before each single-Service trial.
const QUIET: Duration = Duration::from_secs(1);
/// The bulk Services' addresses: 198.19.12.1 upward, in their own pool.
const BULK_POOL: &str = "198.19.12.0/22";
const BULK_FIRST: Ipv4Addr = Ipv4Addr::new(198, 19, 12, 1);

fn bulk_ip(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(BULK_FIRST) + i)
}

/// Records when each bulk address first has both nodes as next hops in the router's FIB.
struct Poller {
    seen: Arc<Mutex<HashMap<Ipv4Addr, Instant>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Poller {
    fn start(router_ns: String) -> Poller {
        let seen = Arc::new(Mutex::new(HashMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let out = std::process::Command::new("ip")
                    .args(["-4", "-j", "-n", &router_ns, "route", "show"])
                    .output()
                    .expect("ip route show");
                let at = Instant::now();
                let routes: serde_json::Value =
                    serde_json::from_slice(&out.stdout).unwrap_or_default();
                let mut seen = s.lock().unwrap();
                for r in routes.as_array().into_iter().flatten() {
                    let hops = r["nexthops"].as_array().map_or(0, Vec::len);
                    if hops < 2 {
                        continue;
                    }
                    if let Some(ip) = r["dst"].as_str().and_then(|d| d.parse().ok()) {
                        seen.entry(ip).or_insert(at);
                    }
                }
                drop(seen);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Poller {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    fn seen_at(&self, ip: Ipv4Addr) -> Option<Instant> {
        self.seen.lock().unwrap().get(&ip).copied()
    }

    fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Creates bulk Service `i` and writes its address; returns when it started.
async fn create(client: &Client, i: u32) -> Instant {
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let name = format!("bulk-{i}");
    let cluster_ip = format!("10.96.{}.{}", 20 + i / 200, 10 + i % 200);
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": name},
        "spec": {"type": "LoadBalancer", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080,
                            "nodePort": 30200 + i, "protocol": "TCP"}]}
    }))
    .unwrap();
    let at = Instant::now();
    api.create(&PostParams::default(), &svc).await.unwrap();
    api.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [
            {"ip": bulk_ip(i).to_string(), "ipMode": "VIP"}]}}})),
    )
    .await
    .unwrap();
    at
}

fn quantiles(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let q = |p: f64| {
        let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
        samples
            .get(i)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
    };
    (q(0.5), q(0.99))
}

async fn bench() -> String {
    let trials: u32 = std::env::var("BERTH_BGP_SERVICE_TRIALS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(20);
    let lab = start_lab("bs", "", json!({})).await;
    let client = lab.client.clone();
    until("both nodes' routes for the lab's Service", || {
        next_hops(&lab.router, VIP).len() == 2
    })
    .await;
    apply(
        &client,
        "berth.dev/v1alpha1",
        "IPPool",
        json!({"metadata": {"name": "bulk"},
               "spec": {"addresses": [BULK_POOL], "autoAssign": false}}),
    )
    .await;
    apply(
        &client,
        "berth.dev/v1alpha1",
        "BGPAdvertisement",
        json!({"metadata": {"name": "bgp"},
               "spec": {"ipPools": ["bgp", "bulk"], "communities": ["64512:100"]}}),
    )
    .await;
    let poller = Poller::start(lab.router.clone());

    let began = Instant::now();
    let mut created = Vec::with_capacity(SERVICES as usize);
    for i in 0..SERVICES {
        created.push(create(&client, i).await);
    }
    let written = began.elapsed();
    let deadline = Instant::now() + Duration::from_secs(300);
    while poller.count() < SERVICES as usize {
        assert!(
            Instant::now() < deadline,
            "only {} of {SERVICES} routes at the router after 300 s",
            poller.count()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_routes = began.elapsed();
    let mut burst: Vec<Duration> = (0..SERVICES)
        .map(|i| poller.seen_at(bulk_ip(i)).unwrap() - created[i as usize])
        .collect();
    eprintln!(
        "burst: {SERVICES} Services written in {written:?}, every route at the router after {all_routes:?}"
    );

    let mut one = Vec::with_capacity(trials as usize);
    for t in 0..trials {
        let i = SERVICES + t;
        tokio::time::sleep(QUIET).await;
        let at = create(&client, i).await;
        let wall = std::time::SystemTime::now() - at.elapsed();
        let deadline = Instant::now() + Duration::from_secs(30);
        let seen = loop {
            if let Some(seen) = poller.seen_at(bulk_ip(i)) {
                break seen;
            }
            assert!(
                Instant::now() < deadline,
                "no route for bulk-{i} after 30 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        one.push(seen - at);
        let since_epoch = wall
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        eprintln!(
            "service trial {t}: {:?} (bulk-{i} {}, created at {}.{:03} s since the epoch)",
            seen - at,
            bulk_ip(i),
            since_epoch.as_secs(),
            since_epoch.subsec_millis()
        );
    }
    drop(poller);

    // Steady state: let the agents settle, then count what they ask of the API server.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before = lab.server.request_counts();
    let window = Duration::from_secs(20);
    tokio::time::sleep(window).await;
    let after = lab.server.request_counts();
    let (reads, writes) = (after.reads - before.reads, after.writes - before.writes);
    eprintln!("api at steady state over {window:?}: {reads} reads, {writes} writes");
    let rps = (reads + writes) as f64 / window.as_secs_f64();

    let (b50, b99) = quantiles(&mut burst);
    let (o50, o99) = quantiles(&mut one);
    lab.finish().await;
    format!(
        "services={SERVICES} service_to_route_burst_p50_ms={b50:.0} service_to_route_burst_p99_ms={b99:.0} \
         all_routes_ms={:.0} service_trials={trials} service_to_route_p50_ms={o50:.0} \
         service_to_route_p99_ms={o99:.0} api_requests_per_s={rps:.2}",
        all_routes.as_secs_f64() * 1000.0
    )
}

fn main() {
    if !ready() {
        eprintln!("bench-bgp: needs root, namespaces, iptables and FRR");
        std::process::exit(1);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let fields = runtime.block_on(bench());
    let failover = std::env::var("BERTH_BGP_FAILOVER").unwrap_or_default();
    let failover = failover.trim().trim_start_matches("bgp:").trim();
    if failover.is_empty() {
        println!("bgp: {fields}");
    } else {
        println!("bgp: {failover} {fields}");
    }
}

//! Cold start: N LoadBalancer Services already exist (no ClusterIP, no status;
//! `allocateLoadBalancerNodePorts: false`) when the controller starts. Measures the time until every one is allocated and
//! published, the writes per Service, and the controller's peak RSS.
//!
//! The controller runs as a child process (this binary again, in controller mode) so its
//! RSS is its own, not the in-memory API server's. Everything listens on 127.0.0.1.
//!
//! `cargo bench -p berth-controller --bench cold_start` (BERTH_BENCH_SERVICES=N to resize);
//! ends with `controller: services_per_sec=<n> rss_mb=<n>`.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use berth_controller::{run_controller, CancellationToken, ControllerConfig, RunOptions};
use berth_lab::LabApiServer;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CHILD_KUBECONFIG: &str = "BERTH_BENCH_CHILD_KUBECONFIG";
const CHILD_ADMIN: &str = "BERTH_BENCH_CHILD_ADMIN";

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    match std::env::var(CHILD_KUBECONFIG) {
        Ok(kubeconfig) => runtime.block_on(child(kubeconfig)),
        Err(_) => runtime.block_on(parent()),
    }
}

async fn child(kubeconfig: String) {
    let admin = std::env::var(CHILD_ADMIN).unwrap().parse().unwrap();
    let opts = RunOptions {
        kubeconfig: Some(kubeconfig.into()),
        config: ControllerConfig::new(vec!["10.96.0.0/16".parse().unwrap()]),
        admin_listen: admin,
        version: "bench".into(),
    };
    run_controller(opts, CancellationToken::new())
        .await
        .unwrap();
}

async fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

fn peak_rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn is_published(s: &Service) -> bool {
    s.status
        .as_ref()
        .and_then(|st| st.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
        && s.spec
            .as_ref()
            .and_then(|sp| sp.cluster_ip.as_ref())
            .is_some()
}

async fn parent() {
    let n: usize = std::env::var("BERTH_BENCH_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let server = LabApiServer::builder().start().await.unwrap();
    let client = server.client().unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in berth_api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let pools: Api<berth_api::IPPool> = Api::all(client.clone());
    let pool: berth_api::IPPool = serde_json::from_value(json!({
        "apiVersion": "berth.dev/v1alpha1", "kind": "IPPool", "metadata": {"name": "bench"},
        "spec": {"addresses": ["198.18.0.0/17"]}}))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    server
        .seed((0..n).map(|i| {
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"namespace": "default", "name": format!("lb-{i}")},
                // 10,000 Services cannot all hold node ports (the default range has
                // 2,768); an l2 load balancer does not need them.
                "spec": {"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
                    "selector": {"app": format!("a{i}")},
                    "ports": [{"name": "http", "port": 80}, {"name": "https", "port": 443}]}})
        }))
        .unwrap();
    let dir = std::env::temp_dir().join(format!("berth-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let rv_before = server.resource_version();

    // Published = ClusterIP in the spec and an ingress in the status, as seen by a watch of
    // our own (the pool's count moves when addresses are decided, before they are written).
    let (published_tx, mut published_rx) = tokio::sync::watch::channel(0usize);
    let watch_api: Api<Service> = Api::all(client.clone());
    let counter = tokio::spawn(async move {
        let mut done = std::collections::HashSet::new();
        let mut events =
            std::pin::pin!(watcher(watch_api, watcher::Config::default()).default_backoff());
        while let Some(ev) = events.next().await {
            if let Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) = ev {
                if is_published(&s) {
                    done.insert(s.metadata.name.clone().unwrap_or_default());
                    published_tx.send_replace(done.len());
                }
            }
        }
    });
    published_rx.wait_for(|_| true).await.unwrap();

    let started = Instant::now();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(CHILD_KUBECONFIG, &kubeconfig)
        .env(CHILD_ADMIN, admin.to_string())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut peak = 0.0f64;
    loop {
        peak = peak.max(peak_rss_mb(pid));
        if *published_rx.borrow() == n {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "did not finish"
        );
        let _ = tokio::time::timeout(Duration::from_millis(20), published_rx.changed()).await;
    }
    let elapsed = started.elapsed();
    peak = peak.max(peak_rss_mb(pid));
    let metrics = scrape(admin).await;
    let _ = child.kill();
    let _ = child.wait();

    let services = Api::<Service>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    counter.abort();
    let published = services.iter().filter(|s| is_published(s)).count();
    assert_eq!(published, n, "every Service allocated and published");
    let writes: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("berth_controller_api_writes_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let changes = server.resource_version() - rv_before;
    let per_sec = n as f64 / elapsed.as_secs_f64();
    println!(
        "| services | seconds | services/s | writes/Service | API changes/Service | peak RSS MB |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| {n} | {:.2} | {per_sec:.0} | {:.2} | {:.2} | {peak:.1} |",
        elapsed.as_secs_f64(),
        writes / n as f64,
        changes as f64 / n as f64
    );
    println!("controller: services_per_sec={per_sec:.0} rss_mb={peak:.0}");
    std::fs::remove_dir_all(&dir).unwrap();
    server.shutdown().await.unwrap();
}

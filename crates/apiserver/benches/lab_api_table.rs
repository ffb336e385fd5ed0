//! Load figures for the lab API server: 10,000 Services and 100,000 Pods in memory, ten concurrent
//! watchers. Prints a small table and ends with one summary line:
//! `lab-api: list_100k_pods_ms=<n> watch_delivery_p99_ms=<n>`.

#![allow(clippy::unwrap_used)]

use berth_apiserver::LabApiServer;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, WatchEvent, WatchParams};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const NAMESPACES: usize = 10;
const SERVICES: usize = 10_000;
const PODS: usize = 100_000;
const WATCHERS: usize = 10;
const UPDATES: usize = 500;

fn now_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let server = LabApiServer::builder()
        .history_capacity(200_000)
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();

    let seeding = Instant::now();
    let namespaces = (0..NAMESPACES).map(|n| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("load-{n}")}}));
    server.seed(namespaces).unwrap();
    let services = (0..SERVICES).map(|i| {
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("svc-{i}"), "namespace": format!("load-{}", i % NAMESPACES), "labels": {"app": format!("app-{i}")}},
            "spec": {"type": "ClusterIP", "selector": {"app": format!("app-{i}")}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    });
    server.seed(services).unwrap();
    let pods = (0..PODS).map(|i| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("pod-{i}"), "namespace": format!("load-{}", i % NAMESPACES), "labels": {"app": format!("app-{}", i % SERVICES)}},
            "spec": {"nodeName": format!("node-{}", i % 50), "containers": [{"name": "echo", "image": "berth/echo", "ports": [{"name": "http", "containerPort": 8080}]}]}})
    });
    server.seed(pods).unwrap();
    let seed_s = seeding.elapsed().as_secs_f64();

    // List latency: the full 100k-pod list over HTTP, as bytes (server work plus transfer).
    let mut list_ms = Vec::new();
    for _ in 0..3 {
        let req = http::Request::get("/api/v1/pods").body(Vec::new()).unwrap();
        let started = Instant::now();
        let text = client.request_text(req).await.unwrap();
        list_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        assert!(text.len() > PODS * 100, "the list holds every pod");
    }
    list_ms.sort_by(f64::total_cmp);
    let list_median = list_ms[list_ms.len() / 2];

    // Watch delivery: ten watchers on all pods; each update carries its send time.
    let rv = server.resource_version().to_string();
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..WATCHERS {
        let api = Api::<Pod>::all(client.clone());
        let latencies = latencies.clone();
        let rv = rv.clone();
        tasks.push(tokio::spawn(async move {
            let mut stream = api
                .watch(&WatchParams::default().timeout(120), &rv)
                .await
                .unwrap()
                .boxed();
            let mut seen = 0;
            while let Some(Ok(ev)) = stream.next().await {
                if let WatchEvent::Modified(pod) = ev {
                    let sent: u128 = pod.metadata.annotations.unwrap()["berth.dev/sent-us"]
                        .parse()
                        .unwrap();
                    latencies
                        .lock()
                        .unwrap()
                        .push((now_micros() - sent) as f64 / 1000.0);
                    seen += 1;
                    if seen == UPDATES {
                        return;
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let writer = Api::<Pod>::namespaced(client.clone(), "load-0");
    let updating = Instant::now();
    for i in 0..UPDATES {
        let name = format!("pod-{}", i * NAMESPACES);
        let patch =
            json!({"metadata": {"annotations": {"berth.dev/sent-us": now_micros().to_string()}}});
        writer
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let update_s = updating.elapsed().as_secs_f64();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .unwrap()
            .unwrap();
    }
    let mut lat = latencies.lock().unwrap().clone();
    lat.sort_by(f64::total_cmp);

    println!("| measure                                   | value      |");
    println!("|-------------------------------------------|------------|");
    println!("| seed {SERVICES} services + {PODS} pods (s)      | {seed_s:>10.2} |");
    println!("| list 100k pods, median of 3 (ms)          | {list_median:>10.1} |");
    println!(
        "| list 100k pods, worst of 3 (ms)           | {:>10.1} |",
        list_ms[list_ms.len() - 1]
    );
    println!("| {UPDATES} updates, sequential (s)               | {update_s:>10.2} |");
    println!(
        "| watch deliveries ({WATCHERS} watchers)            | {:>10} |",
        lat.len()
    );
    println!(
        "| watch delivery p50 (ms)                   | {:>10.2} |",
        percentile(&lat, 0.50)
    );
    println!(
        "| watch delivery p99 (ms)                   | {:>10.2} |",
        percentile(&lat, 0.99)
    );
    println!(
        "| watch delivery max (ms)                   | {:>10.2} |",
        percentile(&lat, 1.0)
    );
    println!(
        "lab-api: list_100k_pods_ms={:.0} watch_delivery_p99_ms={:.1}",
        list_median,
        percentile(&lat, 0.99)
    );
    server.shutdown().await.unwrap();
}

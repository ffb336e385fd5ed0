//! Prints how long endpoint computation takes for one large Service:
//! building slices and Endpoints for 10,000 pods, and planning the slice
//! writes after one pod changes. Median of several runs, release build.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use berth_endpoints::{
    build_endpoint_slices, build_endpoints, compute_desired_slices, plan_endpoint_slices,
    NodeZones, SliceConfig,
};
use berth_testing::{mk_selector_service, PodFacts};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

const PODS: usize = 10_000;
const NODES: usize = 100;
const RUNS: usize = 9;

fn mk_service() -> Service {
    mk_selector_service(
        "default",
        "web",
        "svc-uid",
        "web",
        "10.96.0.10",
        &[("http", 80, IntOrString::String("http".into()))],
    )
}

fn mk_pod(i: usize, ready: bool) -> Pod {
    berth_testing::mk_pod(&PodFacts {
        namespace: "default",
        name: format!("web-{i:05}"),
        uid: format!("pod-uid-{i}"),
        app: "web",
        node: format!("node-{}", i % NODES),
        ip: format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256),
        ready,
        deleted_at: None,
        ports: &[("http", 8080)],
    })
}

fn median_ms(mut f: impl FnMut()) -> f64 {
    let mut times: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[RUNS / 2].as_secs_f64() * 1000.0
}

fn main() {
    let service = mk_service();
    let mut pods: Vec<Pod> = (0..PODS).map(|i| mk_pod(i, true)).collect();
    let mut nodes = NodeZones::new();
    for n in 0..NODES {
        nodes.insert(format!("node-{n}"), Some(format!("zone-{}", n % 3)));
    }
    let config = SliceConfig::default();

    let slices_ms = median_ms(|| {
        let slices = build_endpoint_slices(&service, &pods, &nodes, &config);
        assert_eq!(slices.value.unwrap().len(), PODS / 100);
    });
    let endpoints_ms = median_ms(|| {
        let endpoints = build_endpoints(&service, &pods);
        assert!(endpoints.value.is_some());
    });

    let desired = compute_desired_slices(&service, &pods, &nodes)
        .value
        .unwrap();
    let existing: Vec<EndpointSlice> = desired
        .build_slices(&config)
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            s.metadata.name = Some(format!("web-{i:03}"));
            s.metadata.resource_version = Some("1".into());
            s
        })
        .collect();
    pods[PODS / 2] = mk_pod(PODS / 2, false);
    let changed = compute_desired_slices(&service, &pods, &nodes)
        .value
        .unwrap();
    let compute_changed_ms = median_ms(|| {
        compute_desired_slices(&service, &pods, &nodes);
    });
    let plan_ms = median_ms(|| {
        let plan = plan_endpoint_slices(&changed, &existing, &config);
        assert_eq!(plan.update.len(), 1);
        assert!(plan.create.is_empty() && plan.delete.is_empty());
    });

    println!(
        "{:<52} {:>10}",
        "case (10,000 pods, 100 per slice)", "median ms"
    );
    println!(
        "{:<52} {:>10.2}",
        "build_endpoint_slices (100 slices)", slices_ms
    );
    println!(
        "{:<52} {:>10.2}",
        "build_endpoints (truncated to 1000)", endpoints_ms
    );
    println!(
        "{:<52} {:>10.2}",
        "compute_desired_slices after one pod change", compute_changed_ms
    );
    println!(
        "{:<52} {:>10.2}",
        "plan_endpoint_slices for one pod change", plan_ms
    );
    println!("endpoints: slices_10k_pods_ms={slices_ms:.2} plan_one_change_ms={plan_ms:.2}");
}

//! Reliability: the controller is killed at random moments many times while Services churn,
//! then (separately) runs under injected API faults. Afterwards no address or port has two
//! owners, every Service that should hold something does, and the pool counts match the
//! Services that hold pool addresses (nothing leaked to a dead Service).
//!
//! A kill here aborts the controller's task: its watches, decisions and writes in flight
//! are dropped mid-way, as with SIGKILL. A replacement starts a few milliseconds later;
//! in a cluster, leader election adds the lease duration to that gap.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use berth_lab::{Faults, LabApiServerHandle};
use common::*;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::Client;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

const POOL: &str = "198.18.0.0-198.18.1.255";
const POOL_SIZE: usize = 512;

fn mk_service(name: &str, kind: u32) -> Service {
    let spec = match kind {
        0 => json!({"ports": [{"port": 80}]}),
        1 => json!({"type": "NodePort", "ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}]}),
        _ => {
            json!({"type": "LoadBalancer", "externalTrafficPolicy": if kind == 3 {"Local"} else {"Cluster"},
            "ports": [{"port": 80}]})
        }
    };
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

/// One random change: create, change type, or delete. Errors (injected faults, races with
/// itself) are ignored: the churn only needs to happen, not to succeed every time.
async fn churn_step(api: &Api<Service>, rng: &mut SmallRng, names: usize) {
    let name = format!("svc-{}", rng.random_range(0..names));
    let kind = rng.random_range(0..4u32);
    match rng.random_range(0..10) {
        0..=4 => {
            let _ = api
                .create(&PostParams::default(), &mk_service(&name, kind))
                .await;
        }
        5..=7 => {
            let ty = ["ClusterIP", "NodePort", "LoadBalancer"][rng.random_range(0..3)];
            let ports = if ty == "ClusterIP" {
                json!([{"port": 80}])
            } else {
                json!([{"port": 80}, {"port": 81}])
            };
            let patch = json!({"spec": {"type": ty, "ports": ports}});
            let _ = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
        }
        _ => {
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
    }
}

fn holds_cluster_ip(s: &Service) -> bool {
    s.spec.as_ref().and_then(|sp| sp.type_.as_deref()) != Some("ExternalName")
}

fn holds_node_ports(s: &Service) -> bool {
    matches!(
        s.spec.as_ref().and_then(|sp| sp.type_.as_deref()),
        Some("NodePort" | "LoadBalancer")
    )
}

fn is_lb(s: &Service) -> bool {
    s.spec.as_ref().and_then(|sp| sp.type_.as_deref()) == Some("LoadBalancer")
}

/// Every node port and health-check port a spec names, used by its type or not.
fn named_ports(s: &Service) -> Vec<i32> {
    let spec = s.spec.as_ref();
    let ports = spec
        .and_then(|sp| sp.ports.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|p| p.node_port);
    ports
        .chain(spec.and_then(|sp| sp.health_check_node_port))
        .collect()
}

fn describe(s: &Service) -> String {
    let spec = s.spec.as_ref();
    format!(
        "{} (type {:?}, policy {:?}, resourceVersion {:?}, uid {:?}, ports {:?}, healthCheckNodePort {:?}, ClusterIPs {:?}, ingress {:?})",
        s.metadata.name.as_deref().unwrap_or_default(),
        spec.and_then(|sp| sp.type_.as_deref()),
        spec.and_then(|sp| sp.external_traffic_policy.as_deref()),
        s.metadata.resource_version,
        s.metadata.uid,
        node_ports(s),
        spec.and_then(|sp| sp.health_check_node_port),
        spec.and_then(|sp| sp.cluster_ips.clone()),
        ingress_ips(s),
    )
}

/// For a refused Service: it, and every other Service whose spec names one of its ports or
/// ClusterIPs, whatever its type.
fn who_names_the_same(services: &[Service], refused: &Service) -> String {
    let ports = named_ports(refused);
    let ips = refused
        .spec
        .as_ref()
        .and_then(|sp| sp.cluster_ips.clone())
        .unwrap_or_default();
    let others: Vec<String> = services
        .iter()
        .filter(|o| o.metadata.uid != refused.metadata.uid)
        .filter(|o| {
            named_ports(o).iter().any(|p| ports.contains(p))
                || o.spec
                    .as_ref()
                    .and_then(|sp| sp.cluster_ips.as_ref())
                    .is_some_and(|c| c.iter().any(|ip| ips.contains(ip)))
        })
        .map(describe)
        .collect();
    format!("it is {}; also naming them: {others:?}", describe(refused))
}

/// Every Service holds what its type needs, and nothing is held twice.
fn check_invariants(services: &[Service]) -> Result<usize, String> {
    let mut ips: BTreeMap<String, String> = BTreeMap::new();
    let mut ports: BTreeMap<i32, String> = BTreeMap::new();
    let mut lb_ips: BTreeMap<String, String> = BTreeMap::new();
    for s in services {
        let name = s.metadata.name.clone().unwrap();
        if holds_cluster_ip(s) {
            let ip = cluster_ip(s).ok_or(format!("{name} has no ClusterIP"))?;
            if let Some(other) = ips.insert(ip.clone(), name.clone()) {
                return Err(format!("ClusterIP {ip} held by {other} and {name}"));
            }
        }
        if holds_node_ports(s) {
            let mine: HashSet<i32> = node_ports(s)
                .into_iter()
                .map(|p| p.ok_or(format!("{name} lacks a node port")))
                .collect::<Result<_, _>>()?;
            let hc = s.spec.as_ref().unwrap().health_check_node_port;
            let local =
                s.spec.as_ref().unwrap().external_traffic_policy.as_deref() == Some("Local");
            let mut all: Vec<i32> = mine.into_iter().collect();
            if is_lb(s) && local {
                all.push(hc.ok_or(format!("{name} lacks a healthCheckNodePort"))?);
            }
            for p in all {
                if let Some(other) = ports.insert(p, name.clone()) {
                    return Err(format!("node port {p} held by {other} and {name}"));
                }
            }
        }
        if is_lb(s) {
            let got = ingress_ips(s);
            if got.len() != 1 {
                return Err(format!("{name} has ingress {got:?}"));
            }
            if let Some(other) = lb_ips.insert(got[0].clone(), name.clone()) {
                return Err(format!(
                    "LoadBalancer IP {} held by {other} and {name}",
                    got[0]
                ));
            }
        } else if !ingress_ips(s).is_empty() {
            return Err(format!("{name} is not a LoadBalancer but has ingress"));
        }
        match allocated(s) {
            Some((st, _, _)) if st == "True" => {}
            other => {
                return Err(format!(
                    "{name} condition {other:?}; {}",
                    who_names_the_same(services, s)
                ))
            }
        }
    }
    Ok(lb_ips.len())
}

async fn converged(client: &Client) -> Result<(), String> {
    let services = all_services(client).await;
    let lb_count = check_invariants(&services)?;
    let pools: Api<berth_api::IPPool> = Api::all(client.clone());
    let status = pools
        .get("pool")
        .await
        .map_err(|e| e.to_string())?
        .status
        .ok_or("no pool status")?;
    if status.assigned_ipv4 != lb_count as i64 {
        return Err(format!(
            "pool says {} assigned, Services hold {lb_count}",
            status.assigned_ipv4
        ));
    }
    if status.available_ipv4 != (POOL_SIZE - lb_count) as i64 {
        return Err(format!("pool says {} available", status.available_ipv4));
    }
    Ok(())
}

async fn wait_converged(client: &Client) {
    let mut last = String::new();
    for _ in 0..300 {
        match converged(client).await {
            Ok(()) => return,
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never converged: {last}");
}

/// The lab with the pool and `names` Services of every kind (`svc-0` ..).
async fn start_with_services(names: usize) -> (LabApiServerHandle, Client, Api<Service>) {
    let (server, client) = start_lab().await;
    create_pool(&client, "pool", json!({"addresses": [POOL]})).await;
    let api: Api<Service> = Api::default_namespaced(client.clone());
    for i in 0..names {
        api.create(
            &PostParams::default(),
            &mk_service(&format!("svc-{i}"), (i % 4) as u32),
        )
        .await
        .unwrap();
    }
    (server, client, api)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_random_moments_while_services_churn() {
    let names = 300;
    let (server, client, api) = start_with_services(names).await;
    let churn_client = api.clone();
    let churn = tokio::spawn(async move {
        let mut rng = SmallRng::seed_from_u64(11);
        for _ in 0..1500 {
            churn_step(&churn_client, &mut rng, names).await;
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..4))).await;
        }
    });
    let mut rng = SmallRng::seed_from_u64(5);
    let mut kills = 0;
    while !churn.is_finished() || kills < 50 {
        let mut cfg = mk_config();
        cfg.seed = rng.random();
        let ctrl = spawn_controller(client.clone(), cfg);
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..250))).await;
        ctrl.crash().await;
        kills += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
        if kills > 200 {
            break;
        }
    }
    churn.await.unwrap();
    let ctrl = spawn_controller(client.clone(), mk_config());
    wait_converged(&client).await;
    assert!(kills >= 50, "{kills} kills");
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn converges_once_injected_faults_stop() {
    let names = 200;
    let (server, client, api) = start_with_services(names).await;
    server
        .set_faults(Faults {
            error_rate: 0.1,
            // 500s only: kube-rs itself waits out a 429's Retry-After, which would only slow
            // the churn down.
            throttle_share: 0.0,
            watch_drop_rate: 0.05,
            seed: 3,
            ..Faults::default()
        })
        .unwrap();
    let ctrl = spawn_controller(client.clone(), mk_config());
    let mut rng = SmallRng::seed_from_u64(12);
    for _ in 0..600 {
        churn_step(&api, &mut rng, names).await;
    }
    // A kill under faults too: the replacement adopts what the first one managed to write.
    ctrl.crash().await;
    let ctrl = spawn_controller(client.clone(), mk_config());
    for _ in 0..300 {
        churn_step(&api, &mut rng, names).await;
    }
    server.set_faults(Faults::default()).unwrap();
    wait_converged(&client).await;
    assert!(
        ctrl.metric("berth_controller_errors_total{category=\"server\"}") > 0.0,
        "faults were injected"
    );
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

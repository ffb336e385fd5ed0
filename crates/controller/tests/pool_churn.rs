//! An IPPool deleted and re-created under 50 LoadBalancer Services, 20 times, as GitOps
//! tools and `kubectl replace --force` do, against the controller and the lab API server
//! (127.0.0.1): every Service keeps its address through every cycle, and the pool's counts
//! come back to the 50 holders. Every status change a watch sees is captured and printed.
//!
//! Address plan: service CIDR 10.96.0.0/16, node ports 30000-32767, the pool
//! 198.18.0.200-198.18.0.250.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_api::IPPool;
use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams};
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::json;

const SERVICES: usize = 50;
const CYCLES: usize = 20;
const POOL: &str = "198.18.0.200-198.18.0.250";

/// One status change of one Service, as the watch saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    ingress: Vec<String>,
    condition: Option<(String, String)>,
}

fn seen(svc: &Service) -> Seen {
    Seen {
        ingress: ingress_ips(svc),
        condition: allocated(svc).map(|(status, reason, _)| (status, reason)),
    }
}

#[tokio::test]
async fn deleting_and_re_creating_a_pool_moves_no_address() {
    let (server, client) = start_lab().await;
    create_pool(&client, "pool", json!({"addresses": [POOL]})).await;
    let ctrl = spawn_controller(client.clone(), mk_config());
    for i in 0..SERVICES {
        create_svc(
            &client,
            &format!("svc-{i:02}"),
            json!({"type": "LoadBalancer", "ports": [{"port": 80}]}),
        )
        .await;
    }
    let pools: Api<IPPool> = Api::all(client.clone());
    let all_allocated = || async {
        let svcs = all_services(&client).await;
        svcs.len() == SERVICES
            && svcs
                .iter()
                .all(|s| ingress_ips(s).len() == 1 && allocated(s).is_some_and(|c| c.0 == "True"))
    };
    wait_until("every Service has an address", all_allocated).await;
    let first: BTreeMap<String, Vec<String>> = all_services(&client)
        .await
        .iter()
        .map(|s| (s.metadata.name.clone().unwrap(), ingress_ips(s)))
        .collect();

    // Capture every status change from here on.
    let start = Instant::now();
    let capture: Arc<Mutex<Vec<(Duration, String, Seen)>>> = Arc::default();
    let watch = {
        let (client, capture) = (client.clone(), capture.clone());
        tokio::spawn(async move {
            let mut last: BTreeMap<String, Seen> = BTreeMap::new();
            let api: Api<Service> = Api::default_namespaced(client);
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(Ok(event)) = events.next().await {
                let (watcher::Event::Apply(s) | watcher::Event::InitApply(s)) = event else {
                    continue;
                };
                let name = s.metadata.name.clone().unwrap_or_default();
                let now = seen(&s);
                if last.get(&name) != Some(&now) {
                    if last.contains_key(&name) {
                        capture
                            .lock()
                            .unwrap()
                            .push((start.elapsed(), name.clone(), now.clone()));
                    }
                    last.insert(name, now);
                }
            }
        })
    };

    let counted = |n: i64| {
        let pools = pools.clone();
        move || {
            let pools = pools.clone();
            async move {
                pools
                    .get("pool")
                    .await
                    .ok()
                    .is_some_and(|p| p.status.as_ref().is_some_and(|s| s.assigned_ipv4 == n))
            }
        }
    };
    for cycle in 0..CYCLES {
        pools
            .delete("pool", &DeleteParams::default())
            .await
            .unwrap();
        if cycle % 2 == 1 {
            // Odd cycles let the controller see the pool gone and mark every Service first;
            // even ones re-create it at once, as `kubectl replace --force` does.
            wait_until("every Service marked as keeping its address", || async {
                all_services(&client)
                    .await
                    .iter()
                    .all(|s| allocated(s).is_some_and(|c| c.1 == "PoolGone"))
            })
            .await;
        }
        create_pool(&client, "pool", json!({"addresses": [POOL]})).await;
        wait_until("every Service allocated again", all_allocated).await;
        wait_until("the pool counts the 50 holders", counted(SERVICES as i64)).await;
        let now: BTreeMap<String, Vec<String>> = all_services(&client)
            .await
            .iter()
            .map(|s| (s.metadata.name.clone().unwrap(), ingress_ips(s)))
            .collect();
        assert_eq!(now, first, "cycle {cycle}: an address moved");
    }
    // Let the last changes reach the capture.
    tokio::time::sleep(Duration::from_millis(300)).await;
    watch.abort();
    let capture = capture.lock().unwrap().clone();
    println!(
        "{} status changes over {CYCLES} cycles of {SERVICES} Services:",
        capture.len()
    );
    for (at, name, s) in &capture {
        let (status, reason) = s.condition.clone().unwrap_or_default();
        println!(
            "{:>8.3}s {name} ingress={:?} Allocated={status} {reason}",
            at.as_secs_f64(),
            s.ingress
        );
    }
    let moved: Vec<&(Duration, String, Seen)> = capture
        .iter()
        .filter(|(_, name, s)| first.get(name) != Some(&s.ingress))
        .collect();
    assert!(
        moved.is_empty(),
        "a Service's ingress left its address: {moved:?}"
    );
    assert_eq!(ctrl.metric("berth_controller_kept_addresses"), 0.0);
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

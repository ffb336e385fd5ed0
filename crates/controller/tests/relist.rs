//! A Service watch that falls behind the API server's history: its reconnect gets 410 Gone and
//! the controller relists. A Service deleted during the gap never arrives as a delete event;
//! the relist must notice it is gone and free what it held.
//!
//! The gap is made exact: the controller's client holds its Service watch requests at a gate,
//! the lab drops the open watches, and while the reconnect waits at the gate the Service is
//! deleted and the lab's history compacted past the watch's resourceVersion.
//!
//! Address plan: service CIDR 10.96.0.0/16, one pool of one address, 198.18.0.10.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use berth_lab::Faults;
use berth_testing::WatchGate;
use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_deleted_while_the_watch_was_compacted_away_is_freed_by_the_relist() {
    let (server, client) = start_lab().await;
    create_pool(
        &client,
        "one",
        json!({"addresses": ["198.18.0.10-198.18.0.10"]}),
    )
    .await;
    let gate = Arc::new(WatchGate::default());
    let ctrl = spawn_controller(gate.wrap(client.clone(), "/api/v1/services"), mk_config());
    let lb = json!({"type": "LoadBalancer", "ports": [{"port": 80}]});
    create_svc(&client, "a", lb.clone()).await;
    let a = wait_svc(&client, "a", "the pool's address", |s| {
        ingress_ips(s) == ["198.18.0.10"]
    })
    .await;
    let a_ip = cluster_ip(&a).unwrap();

    // Close the gate, drop every open watch, and wait for the Service watch to come back to it.
    gate.close();
    server
        .set_faults(Faults {
            watch_drop_rate: 1.0,
            ..Faults::default()
        })
        .unwrap();
    wait_until("the Service watch to reconnect", || async {
        gate.held() > 0
    })
    .await;
    server.set_faults(Faults::default()).unwrap();

    // The gap: `a` is deleted and the history that would tell the watch so is compacted away.
    delete_svc(&client, "a").await;
    server.compact();
    gate.open();

    // The reconnect gets 410 Gone and relists; `a` is not in the list, so its address and
    // ClusterIP are free: a new Service asking for both gets them.
    create_svc(
        &client,
        "b",
        json!({"type": "LoadBalancer", "clusterIP": a_ip, "ports": [{"port": 80}]}),
    )
    .await;
    let b = wait_svc(&client, "b", "a's address and ClusterIP", |s| {
        allocated(s).is_some_and(|c| c.0 == "True") && !ingress_ips(s).is_empty()
    })
    .await;
    assert_eq!(ingress_ips(&b), ["198.18.0.10"]);
    assert_eq!(cluster_ip(&b), Some(a_ip));
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

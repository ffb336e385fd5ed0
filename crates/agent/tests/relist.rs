//! A Service watch that falls behind the API server's history: its reconnect gets 410 Gone and
//! the agent relists. A Service deleted during the gap never arrives as a delete event; the
//! relist must notice it is gone and its rules must go.
//!
//! The gap is made exact: the agent's client holds its Service watch requests at a gate, the lab
//! drops the open watches, and while the reconnect waits the Service is deleted and the lab's
//! history compacted past the watch's resourceVersion.
//!
//! Address plan: see `common`. In-memory iptables; nothing needs root.

#![allow(clippy::unwrap_used)]

mod common;
mod harness;

use std::sync::Arc;

use berth_agent::SharedIptables;
use berth_datapath::fake::MemoryIptables;
use berth_datapath::plan::convert::ProxyMode;
use berth_datapath::Table;
use berth_lab::Faults;
use berth_testing::{start_lab, WatchGate};
use common::*;
use harness::*;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_deleted_while_the_watch_was_compacted_away_loses_its_rules_on_the_relist() {
    let (server, _) = start_lab().await;
    let gate = Arc::new(WatchGate::default());
    let mut h = start_agent_with(
        server,
        mk_options(ProxyMode::Full),
        SharedIptables::new(MemoryIptables::default()),
        |client| gate.wrap(client, "/api/v1/services"),
    )
    .await;
    h.create(mk_node_json(NODE, "198.18.0.11")).await;
    for (name, ip, pod) in [
        ("web", "10.96.0.10", "10.244.1.5"),
        ("api", "10.96.0.11", "10.244.1.9"),
    ] {
        h.create(mk_service_json(
            "default",
            name,
            ip,
            json!([{"name": "http", "port": 80}]),
        ))
        .await;
        h.create(mk_slice_json(
            "default",
            name,
            &format!("{name}-1"),
            "TCP",
            &[(pod, true, NODE)],
        ))
        .await;
    }
    h.wait_for("both Services' rules", |_, ipt| {
        let nat = nat(ipt);
        nat.contains("10.244.1.5:8080") && nat.contains("10.244.1.9:8080")
    })
    .await;

    // Close the gate, drop every open watch, and wait for the Service watch to come back to it.
    gate.close();
    h.server
        .set_faults(Faults {
            watch_drop_rate: 1.0,
            ..Faults::default()
        })
        .unwrap();
    berth_testing::eventually(
        "the Service watch to reconnect",
        std::time::Duration::from_secs(20),
        std::time::Duration::from_millis(20),
        || async { (gate.held() > 0).then_some(()) },
    )
    .await;
    h.server.set_faults(Faults::default()).unwrap();

    // The gap: web is deleted and the history that would tell the watch so is compacted away.
    Api::<Service>::namespaced(h.client.clone(), "default")
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    h.server.compact();
    gate.open();

    h.wait_for("web's chains to go after the relist", |_, ipt| {
        !ipt.tables[&Table::Nat].contains_key(&web_chain())
    })
    .await;
    let nat_now = nat(&h.iptables.lock());
    assert!(!nat_now.contains("default/web"), "{nat_now}");
    assert!(
        nat_now.contains("10.244.1.9:8080"),
        "api lost its rules: {nat_now}"
    );
    let expected = h.expected_rules().await;
    assert_eq!(h.programmed(), expected);
    let (server, _) = h.stop().await;
    server.shutdown().await.unwrap();
}

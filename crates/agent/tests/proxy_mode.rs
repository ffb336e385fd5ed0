//! Changing `--proxy-mode` on a node that berth already programs, pinned (docs/architecture.md,
//! "Proxy modes"):
//! - `full` to `labeled`: the restarted agent's first sync removes the rules of every Service not
//!   labelled for berth and keeps the others; nothing is left behind.
//! - to `none`: the agent never touches iptables, not even to clean up, so the rules of the
//!   earlier mode stay exactly as they were until an operator removes the `BERTH-` chains.
//!
//! Address plan: see `common`. In-memory iptables; nothing needs root.

#![allow(clippy::unwrap_used)]

mod common;
mod harness;

use berth_datapath::plan::convert::ProxyMode;
use berth_datapath::Table;
use common::*;
use harness::*;
use serde_json::json;

const LABEL: &str = "service.kubernetes.io/service-proxy-name";

#[tokio::test]
async fn full_to_labeled_removes_unlabelled_rules_and_none_leaves_everything() {
    let mut h = start(ProxyMode::Full).await;
    h.create(mk_node_json(NODE, "198.18.0.11")).await;
    let mut mine = mk_service_json(
        "default",
        "mine",
        "10.96.0.20",
        json!([{"name": "http", "port": 80}]),
    );
    mine["metadata"]["labels"] = json!({LABEL: "berth"});
    h.create(mine).await;
    h.create(mk_slice_json(
        "default",
        "mine",
        "mine-1",
        "TCP",
        &[("10.244.1.20", true, NODE)],
    ))
    .await;
    h.create(mk_service_json(
        "default",
        "web",
        "10.96.0.10",
        json!([{"name": "http", "port": 80}]),
    ))
    .await;
    h.create(mk_slice_json(
        "default",
        "web",
        "web-1",
        "TCP",
        &[("10.244.1.5", true, NODE)],
    ))
    .await;
    h.wait_for("both Services under full", |_, ipt| {
        let nat = nat(ipt);
        nat.contains("10.244.1.20:8080") && nat.contains("10.244.1.5:8080")
    })
    .await;

    // full -> labeled.
    let mut options = h.options.clone();
    let (server, iptables) = h.stop().await;
    options.proxy_mode = ProxyMode::Labeled;
    let mut h = start_agent(server, options, iptables.clone()).await;
    h.wait_for("the labeled agent's first sync", |s, _| synced(s))
        .await;
    {
        let ipt = iptables.lock();
        assert!(!ipt.tables[&Table::Nat].contains_key(&web_chain()));
        let nat = nat(&ipt);
        assert!(!nat.contains("default/web"), "{nat}");
        assert!(nat.contains("10.244.1.20:8080"), "{nat}");
    }
    let expected = h.expected_rules().await;
    assert_eq!(h.programmed(), expected);

    // labeled -> none: the rules stay as they are.
    let mut options = h.options.clone();
    let (server, iptables) = h.stop().await;
    let programmed = iptables.lock().berth_ruleset();
    let restores = iptables.lock().restores.len();
    options.proxy_mode = ProxyMode::None;
    let mut h = start_agent(server, options, iptables.clone()).await;
    h.wait_for("the none agent's first pass", |s, _| synced(s))
        .await;
    // Its first pass is done (it listed everything) and wrote nothing.
    assert_eq!(iptables.lock().restores.len(), restores);
    assert_eq!(iptables.lock().berth_ruleset(), programmed);
    let (server, _) = h.stop().await;
    server.shutdown().await.unwrap();
}

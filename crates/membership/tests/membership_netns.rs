//! A node cut off from the LAN but not from the API server, with real namespaces: three node
//! namespaces on a LAN bridge, each with a `Membership` whose SWIM socket is bound inside it
//! (198.18.0.11-13, port 7947), and the lab API server on 127.0.0.1 in the root namespace,
//! which stays reachable when a node's LAN link goes down. Needs root and iproute2: skips with a
//! message elsewhere, and fails instead under `CI=true` or `BERTH_REQUIRE_ROOT=1`. Every
//! namespace is named `berth-tm<pid>-*` and deleted when the topology is dropped.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_lab::netns::bind_udp_in_netns;
use berth_lab::topology::{Topology, TopologySpec};
use berth_membership::{LiveNodes, Membership, MembershipOptions};
use berth_testing::{require, start_lab, Requirement};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const NAMESPACE: &str = "kube-node-lease";
const LIMIT: Duration = Duration::from_secs(20);

/// Every change any member published: when, whose, what.
type Log = Arc<Mutex<Vec<(Instant, String, BTreeSet<String>)>>>;

fn record(log: &Log, node: &str, mut live: watch::Receiver<LiveNodes>) {
    let log = log.clone();
    let node = node.to_string();
    tokio::spawn(async move {
        while live.changed().await.is_ok() {
            let set = (**live.borrow_and_update()).clone();
            log.lock()
                .unwrap()
                .push((Instant::now(), node.clone(), set));
        }
    });
}

async fn wait_until(
    log: &Log,
    what: &str,
    check: impl Fn(&dyn Fn(&str) -> BTreeSet<String>) -> bool,
) {
    let deadline = Instant::now() + LIMIT;
    loop {
        {
            let log = log.lock().unwrap();
            let latest = |node: &str| {
                log.iter()
                    .rev()
                    .find(|(_, n, _)| n == node)
                    .map(|(_, _, s)| s.clone())
                    .unwrap_or_default()
            };
            if check(&latest) {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {:?}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|n| n.to_string()).collect()
}

#[tokio::test]
async fn a_node_cut_off_from_the_lan_withdraws_and_returns_only_after_its_peers_yield() {
    require!(Requirement::Netns);
    let (_server, client) = start_lab().await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for name in ["node1", "node2", "node3"] {
        nodes
            .create(
                &Default::default(),
                &berth_testing::mk_node(name, serde_json::json!({}), &[]),
            )
            .await
            .unwrap();
    }
    let spec = TopologySpec::new(TopologySpec::unique_prefix("tm"))
        .node("node1", Vec::<String>::new())
        .node("node2", Vec::<String>::new())
        .node("node3", Vec::<String>::new());
    let mut topo = Topology::create(&spec).unwrap();
    let log: Log = Arc::default();
    let mut stops = Vec::new();
    let mut tasks = Vec::new();
    for node in topo.layout().nodes.clone() {
        let addr = SocketAddr::new(node.lan_ip.into(), 7947);
        let socket = bind_udp_in_netns(&node.netns, addr).unwrap();
        let config = MembershipOptions {
            node_name: node.name.clone(),
            lease_namespace: NAMESPACE.into(),
            lease_duration: Duration::from_secs(60),
            bind: addr,
            key: Some(b"berth membership netns test key!".to_vec()),
            probe_period: Duration::from_millis(200),
            probe_timeout: Duration::from_millis(100),
            suspicion_timeout: Duration::from_millis(600),
            takeover_hold: Duration::from_millis(300),
            ..MembershipOptions::default()
        }
        .validate()
        .unwrap();
        let (membership, live) = Membership::new(config, client.clone());
        record(&log, &node.name, live);
        let stop = CancellationToken::new();
        tasks.push(tokio::spawn(
            membership.with_socket(socket).run(stop.clone()),
        ));
        stops.push(stop);
    }
    let all = names(&["node1", "node2", "node3"]);
    wait_until(&log, "all three live everywhere", |latest| {
        ["node1", "node2", "node3"].iter().all(|n| latest(n) == all)
    })
    .await;

    let cut = Instant::now();
    // node1 loses the LAN; the API server (on loopback in the root namespace) stays reachable,
    // so every Lease stays fresh.
    let node1_netns = topo.netns("node1").unwrap().to_string();
    topo.exec(&node1_netns, &["ip", "link", "set", "eth0", "down"])
        .unwrap();
    let rest = names(&["node2", "node3"]);
    wait_until(
        &log,
        "node1 withdrawn and dropped by the others",
        |latest| {
            !latest("node1").contains("node1") && latest("node2") == rest && latest("node3") == rest
        },
    )
    .await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    assert!(leases.get_opt("berth-agent-node1").await.unwrap().is_some());

    // The LAN comes back.
    let back = Instant::now();
    topo.exec(&node1_netns, &["ip", "link", "set", "eth0", "up"])
        .unwrap();
    wait_until(&log, "all three live again everywhere", |latest| {
        ["node1", "node2", "node3"].iter().all(|n| latest(n) == all)
    })
    .await;

    // A planned handover: from the moment the link came back, the peers count node1 only
    // once it counts itself (its heartbeat says so), and within the announcer's handover delay
    // (60 ms) after it, so node1 answers what it gains only once they have yielded.
    let log = log.lock().unwrap().clone();
    let first_counted = |by: &str| {
        log.iter()
            .find(|(at, node, set)| *at >= back && node == by && set.contains("node1"))
            .map(|(at, ..)| *at)
            .unwrap_or_else(|| panic!("{by} never counted node1 again: {log:?}"))
    };
    let itself = first_counted("node1");
    for peer in ["node2", "node3"] {
        let by_peer = first_counted(peer);
        assert!(
            by_peer >= itself && by_peer <= itself + Duration::from_millis(60),
            "{peer} counted node1 {:?} after node1 did: {log:?}",
            by_peer.checked_duration_since(itself)
        );
    }

    // The majority never stopped counting itself: node1's view from the cut (everyone else
    // down) did not spread when the LAN healed, so no peer had to rejoin and start over.
    for (at, node, set) in &log {
        if *at > cut && node != "node1" {
            assert!(set.contains(node), "{node} withdrew: {log:?}");
        }
    }

    for stop in stops {
        stop.cancel();
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    topo.destroy().unwrap();
}

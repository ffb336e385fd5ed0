//! BGP announcing by the real agents, in real network namespaces: a LAN bridge, two node
//! namespaces each running FRR and a real `berth agent --bgp-speaker` process, the lab API
//! server in a control-plane namespace, and a router namespace on the LAN running its own FRR
//! with `maximum-paths`, with a client namespace behind it. Needs root, iproute2, iptables and
//! FRR; skips with a message elsewhere, and fails instead under `CI=true` or
//! `BERTH_REQUIRE_ROOT=1`. Every namespace is `berth-tb<pid>-*`, deleted at the end (also on
//! failure), FRR processes killed with it.
//!
//! Address plan: LAN 198.18.0.0/24, nodes n1/n2 at .11/.12, control plane .100 (API :6443),
//! router .101; behind the router 198.19.20.0/24 (router .1, client .100). BGP pool
//! 198.19.10.0/24: `web` 198.19.10.5 (Cluster policy, pods web on n1 and web2 on n2) and `local`
//! 198.19.10.6 (Local policy, its one pod web on n1). Nodes AS 64512, router AS 64513.
//! The lab itself is `tests/bgp_lab`, shared with `make bench-bgp`.

#![allow(clippy::unwrap_used)]

mod bgp_lab;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use berth_lab::echo::tcp_echo;
use berth_testing::bgp::{established, kill_frr, start_frr};
use bgp_lab::*;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use serde_json::{json, Value};

#[test]
fn agents_announce_over_bgp_and_a_killed_agent_withdraws() {
    if !ready() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(scenario());
}

async fn scenario() {
    let began = Instant::now();
    let mut lab = start_lab("tb", "", json!({})).await;
    let (router, router_dir, outside) = (
        lab.router.clone(),
        lab.router_dir.clone(),
        lab.outside.clone(),
    );
    until("both sessions Established", || {
        established(&router, &router_dir) == 2
    })
    .await;
    until(
        "one next hop per node for the Cluster-policy address",
        || next_hops(&router, VIP) == ["198.18.0.11", "198.18.0.12"],
    )
    .await;
    until("only n1 for the Local-policy address", || {
        next_hops(&router, LOCAL_VIP) == ["198.18.0.11"]
    })
    .await;

    // Through the router and a node's datapath to a pod, from the client behind the router.
    let target: SocketAddr = format!("{VIP}:80").parse().unwrap();
    let mut pods = BTreeMap::<String, usize>::new();
    for _ in 0..12 {
        let ns = outside.clone();
        let reply =
            tokio::task::spawn_blocking(move || tcp_echo(&ns, target, Duration::from_secs(2)))
                .await
                .unwrap()
                .unwrap_or_else(|err| panic!("the client cannot reach {VIP}: {err}"));
        *pods.entry(reply.pod).or_default() += 1;
    }
    assert_eq!(pods.values().sum::<usize>(), 12, "{pods:?}");

    // SIGKILL: the agent's device and routes die with it; the router keeps only n2.
    let mut killed = lab.procs.agents.remove("n1").unwrap();
    let _ = Command::new("kill")
        .args(["-9", &killed.id().to_string()])
        .status();
    let _ = killed.wait();
    let at = Instant::now();
    until("n1's next hop withdrawn", || {
        next_hops(&router, VIP) == ["198.18.0.12"]
    })
    .await;
    let withdrawal = at.elapsed();
    until("the Local-policy address withdrawn", || {
        next_hops(&router, LOCAL_VIP).is_empty()
    })
    .await;
    assert_eq!(
        established(&router, &router_dir),
        2,
        "the killed agent's session stays up"
    );
    let ns = outside.clone();
    tokio::task::spawn_blocking(move || tcp_echo(&ns, target, Duration::from_secs(2)))
        .await
        .unwrap()
        .unwrap_or_else(|err| panic!("the client cannot reach {VIP} through n2: {err}"));

    // A graceful stop withdraws first as well.
    let mut stopped = lab.procs.agents.remove("n2").unwrap();
    let _ = Command::new("kill")
        .args(["-TERM", &stopped.id().to_string()])
        .status();
    let _ = stopped.wait();
    until("n2's next hop withdrawn on a graceful stop", || {
        next_hops(&router, VIP).is_empty()
    })
    .await;
    println!(
        "bgp_netns: SIGKILL withdrawal seen at the router after {withdrawal:?}; whole test {:?}",
        began.elapsed()
    );

    lab.finish().await;
}

/// The node's `BGPSessionState` record of the peer `router`: (BGP state, condition reason,
/// message), once the agent has written it.
async fn session(client: &Client, node: &str) -> Option<(String, String, String)> {
    let api: Api<berth_api::BGPSessionState> = Api::namespaced(client.clone(), "kube-system");
    let record = api
        .get_opt(&berth_bgp::session_record_name(node, "router"))
        .await
        .ok()??;
    let condition = record
        .spec
        .conditions
        .iter()
        .find(|c| c.type_ == "Established")?;
    Some((
        record.spec.bgp_state.clone(),
        condition.reason.clone(),
        condition.message.clone(),
    ))
}

/// Waits until both nodes' records give `reason`; returns n1's message.
async fn both_report(client: &Client, reason: &str) -> String {
    let deadline = Instant::now() + LIMIT;
    loop {
        let n1 = session(client, "n1").await;
        let n2 = session(client, "n2").await;
        if let (Some(a), Some(b)) = (&n1, &n2) {
            if a.1 == reason && b.1 == reason {
                return a.2.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for both records to say {reason}: n1 {n1:?}, n2 {n2:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn patch_peer(client: &Client, spec: Value) {
    let api: Api<berth_api::BGPPeer> = Api::all(client.clone());
    api.patch(
        "router",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": spec })),
    )
    .await
    .unwrap();
}

/// Router connections the nodes ever established, from the router's side.
fn connections_established(router_ns: &str, dir: &Path) -> u64 {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            router_ns,
            "vtysh",
            "--vty_socket",
            dir.to_str().unwrap(),
            "-c",
            "show bgp neighbors json",
        ])
        .output()
        .unwrap();
    let neighbors: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    NODES
        .iter()
        .map(|(_, ip)| {
            neighbors[*ip]["connectionsEstablished"]
                .as_u64()
                .unwrap_or(0)
        })
        .sum()
}

/// Passwords from Secrets against a router that requires one, a wrong AS, and routes that
/// follow the endpoints: a missing Secret leaves the peer out (`NotConfigured`); a wrong password
/// never establishes and says `AuthenticationFailure`; the right one establishes; a wrong
/// peerASN says `BadPeerAS`; a Local-policy address moves with its endpoint from n1 to n2; a
/// deleted Service is withdrawn from the router; a restarted FRR is configured again. About 35 s.
#[test]
fn sessions_report_passwords_and_as_and_routes_follow_endpoints() {
    if !ready() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(sessions_scenario());
}

async fn sessions_scenario() {
    let began = Instant::now();
    // The router requires the password and retries its connections every second, so the nodes'
    // kernels see its signed SYNs and a fixed password establishes at once. The nodes retry every
    // second too (`connectTime`): after a reconfiguration the router may refuse a node's first
    // attempt while it still clears the old session, and FRR's default would wait 120 s.
    let lab = start_lab(
        "tp",
        " neighbor nodes password s3cret-Pass\n neighbor nodes timers connect 1\n",
        json!({"passwordSecret": {"name": "bgp-missing"}, "connectTime": "1s"}),
    )
    .await;
    let client = lab.client.clone();
    // `data` as the API server stores it: base64 of "wrong-Pass" and "s3cret-Pass".
    let secret = |name: &str, password: &str| {
        json!({"metadata": {"namespace": "kube-system", "name": name},
               "type": "kubernetes.io/basic-auth", "data": {"password": password}})
    };
    apply(
        &client,
        "v1",
        "Secret",
        secret("bgp-wrong", "d3JvbmctUGFzcw=="),
    )
    .await;
    apply(
        &client,
        "v1",
        "Secret",
        secret("bgp-right", "czNjcmV0LVBhc3M="),
    )
    .await;

    let missing = both_report(&client, "NotConfigured").await;
    assert!(
        missing.contains("kube-system/bgp-missing does not exist"),
        "{missing}"
    );

    patch_peer(&client, json!({"passwordSecret": {"name": "bgp-wrong"}})).await;
    let wrong = both_report(&client, "AuthenticationFailure").await;
    assert!(wrong.contains("MD5"), "{wrong}");
    // Some more connection attempts by the router; none may establish.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        connections_established(&lab.router, &lab.router_dir),
        0,
        "a session came up with the wrong password"
    );
    for node in ["n1", "n2"] {
        let log = std::fs::read_to_string(lab.dir.join(format!("{node}.log"))).unwrap();
        assert!(
            !log.contains("wrong-Pass") && !log.contains("s3cret-Pass"),
            "{node}'s agent logged a password"
        );
    }

    patch_peer(&client, json!({"passwordSecret": {"name": "bgp-right"}})).await;
    both_report(&client, "Established").await;
    until("both sessions Established at the router", || {
        established(&lab.router, &lab.router_dir) == 2
    })
    .await;

    // A wrong peerASN: the nodes refuse the router's OPEN.
    patch_peer(&client, json!({"peerASN": 64514})).await;
    let bad_as = both_report(&client, "BadPeerAS").await;
    assert!(bad_as.contains("Bad Peer AS"), "{bad_as}");
    let warnings: Vec<String> =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), "default")
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("router"))
            .filter_map(|e| e.reason)
            .collect();
    for reason in ["NotConfigured", "AuthenticationFailure", "BadPeerAS"] {
        assert!(
            warnings.iter().any(|r| r == reason),
            "no Warning Event {reason} on the BGPPeer: {warnings:?}"
        );
    }
    assert_eq!(established(&lab.router, &lab.router_dir), 0);
    patch_peer(&client, json!({"peerASN": 64513})).await;
    both_report(&client, "Established").await;

    // The Local-policy address follows its endpoint from n1 to n2.
    until("n1 announces the Local-policy address", || {
        next_hops(&lab.router, LOCAL_VIP) == ["198.18.0.11"]
    })
    .await;
    let web2_ip = lab.topo.layout().pod("web2").unwrap().1.ip.to_string();
    apply(
        &client,
        "discovery.k8s.io/v1",
        "EndpointSlice",
        json!({
            "metadata": {"namespace": "default", "name": "local-1",
                         "labels": {"kubernetes.io/service-name": "local"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [web2_ip], "conditions": {"ready": true}, "nodeName": "n2"}]
        }),
    )
    .await;
    until("the Local-policy address moved to n2", || {
        next_hops(&lab.router, LOCAL_VIP) == ["198.18.0.12"]
    })
    .await;

    // A deleted Service is withdrawn from every node.
    until("ECMP for the Cluster-policy address", || {
        next_hops(&lab.router, VIP) == ["198.18.0.11", "198.18.0.12"]
    })
    .await;
    Api::<Service>::namespaced(client.clone(), "default")
        .delete("web", &Default::default())
        .await
        .unwrap();
    until("the deleted Service's address withdrawn", || {
        next_hops(&lab.router, VIP).is_empty()
    })
    .await;
    assert_eq!(next_hops(&lab.router, LOCAL_VIP), ["198.18.0.12"]);

    // n1's FRR killed and started again empty, as the kubelet restarts the sidecar: the agent
    // sees the new daemons and configures them again.
    let n1_frr = lab.dir.join("frr-n1");
    kill_frr(&n1_frr);
    until("n1's session down at the router", || {
        established(&lab.router, &lab.router_dir) == 1
    })
    .await;
    start_frr(lab.topo.netns("n1").unwrap(), &n1_frr, "");
    until(
        "n1's session back once its agent configured the new FRR",
        || established(&lab.router, &lab.router_dir) == 2,
    )
    .await;
    both_report(&client, "Established").await;
    println!("bgp_netns sessions: whole test {:?}", began.elapsed());
    lab.finish().await;
}

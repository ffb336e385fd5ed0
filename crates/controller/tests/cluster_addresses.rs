//! IPPools that contain the cluster's own addresses (a Node's address, the service CIDR, a pod
//! CIDR, an address reserved with `--reserved-addresses`): those are cut out of the pool and
//! never handed out, the pool says so in its `OverlapsCluster` condition and a Warning Event,
//! and a Service holding one when it becomes a Node's loses it.
//!
//! Address plan: LAN 198.18.0.0/24 (the gateway .1 reserved, node-1 .11, node-2 .12), pod CIDR
//! 10.244.1.0/24, service CIDR 10.96.0.0/16.

#![allow(clippy::unwrap_used)]

mod common;

use berth_api::IPPool;
use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use kube::Client;
use serde_json::json;

async fn create_node(client: &Client, name: &str, ip: &str, pod_cidr: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
        "status": {"addresses": [{"type": "InternalIP", "address": ip},
                                 {"type": "Hostname", "address": name}]},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
}

fn overlaps_cluster(p: &IPPool) -> Option<(String, String)> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "OverlapsCluster")
        .map(|c| (c.status.clone(), c.message.clone()))
}

#[tokio::test]
async fn the_cluster_addresses_are_never_handed_out() {
    let (server, client) = start_lab().await;
    let pools: Api<IPPool> = Api::all(client.clone());
    create_node(&client, "node-1", "198.18.0.11", "10.244.1.0/24").await;
    // .10 is the gateway (reserved), .11 node-1: only .12 is left to hand out.
    create_pool(
        &client,
        "lan",
        json!({"addresses": ["198.18.0.10-198.18.0.12"]}),
    )
    .await;
    create_pool(&client, "services", json!({"addresses": ["10.96.0.0/30"]})).await;
    let mut cfg = mk_config();
    cfg.reserved_addresses = berth_controller::parse_reserved_addresses("198.18.0.10").unwrap();
    let ctrl = spawn_controller(client.clone(), cfg);

    wait_until("the pools name what they collide with", || async {
        let lan = pools.get("lan").await.unwrap();
        let svc = pools.get("services").await.unwrap();
        let lan_ok = overlaps_cluster(&lan).is_some_and(|(s, m)| {
            s == "True"
                && m.contains("198.18.0.10 (reserved by --reserved-addresses)")
                && m.contains("198.18.0.11 (InternalIP of Node node-1)")
        }) && lan.status.as_ref().is_some_and(|s| s.available_ipv4 == 1);
        let svc_ok = overlaps_cluster(&svc)
            .is_some_and(|(s, m)| s == "True" && m.contains("10.96.0.0/16 (the service CIDR)"))
            && svc.status.as_ref().is_some_and(|s| s.available_ipv4 == 0);
        lan_ok && svc_ok
    })
    .await;
    wait_until("a Warning Event on each pool", || async {
        let lan = events_for(&client, "lan").await;
        let svc = events_for(&client, "services").await;
        let named = |evs: &[(String, String)], what: &str| {
            evs.iter()
                .filter(|(r, n)| r == "PoolOverlapsCluster" && n.contains(what))
                .count()
        };
        named(&lan, "node-1") == 1 && named(&svc, "service CIDR") == 1
    })
    .await;

    // Asking for a Node's address by name is refused, with a condition and an Event.
    create_svc(
        &client,
        "thief",
        json!({"type": "LoadBalancer", "loadBalancerIP": "198.18.0.11", "ports": [{"port": 443}]}),
    )
    .await;
    let thief = wait_svc(&client, "thief", "refused", |s| {
        allocated(s).is_some_and(|c| c.0 == "False")
    })
    .await;
    assert!(ingress_ips(&thief).is_empty());
    wait_until("the refusal's Event", || async {
        events_for(&client, "thief")
            .await
            .iter()
            .any(|(r, n)| r == "AllocationFailed" && n.contains("198.18.0.11"))
    })
    .await;

    // The only address left goes to the first Service; the next finds the pool full.
    create_svc(
        &client,
        "web",
        json!({"type": "LoadBalancer", "ports": [{"port": 80}]}),
    )
    .await;
    let web = wait_svc(&client, "web", "ingress", |s| !ingress_ips(s).is_empty()).await;
    assert_eq!(ingress_ips(&web), vec!["198.18.0.12"]);
    create_svc(
        &client,
        "late",
        json!({"type": "LoadBalancer", "ports": [{"port": 81}]}),
    )
    .await;
    let late = wait_svc(&client, "late", "refused", |s| {
        allocated(s).is_some_and(|c| c.0 == "False")
    })
    .await;
    assert!(ingress_ips(&late).is_empty());

    // A Node joins with the address "web" holds: "web" loses it at once (it is not kept as an
    // address whose pool went away would be) and nobody is given it.
    create_node(&client, "node-2", "198.18.0.12", "10.244.2.0/24").await;
    wait_svc(&client, "web", "the address taken back", |s| {
        ingress_ips(s).is_empty()
    })
    .await;
    wait_until("the pool names node-2 too and has nothing left", || async {
        let lan = pools.get("lan").await.unwrap();
        overlaps_cluster(&lan).is_some_and(|(_, m)| m.contains("node-2"))
            && lan
                .status
                .as_ref()
                .is_some_and(|s| s.available_ipv4 == 0 && s.assigned_ipv4 == 0)
    })
    .await;
    settled(&client).await;
    for name in ["web", "late", "thief"] {
        assert!(
            ingress_ips(&get_svc(&client, name).await).is_empty(),
            "{name}"
        );
    }

    ctrl.stop().await;
    drop(server);
}

//! The IPPool side: status counts, the overlap condition, and pool changes that leave a
//! Service's address outside every pool (it keeps it; with a grace of nothing it gets a new
//! one at once).

#![allow(clippy::unwrap_used)]

mod common;

use berth_api::IPPool;
use common::*;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

fn condition(p: &IPPool, type_: &str) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

#[tokio::test]
async fn counts_overlaps_and_pool_changes() {
    let (server, client) = start_lab().await;
    let pools: Api<IPPool> = Api::all(client.clone());
    create_pool(
        &client,
        "a",
        json!({"addresses": ["198.18.0.200-198.18.0.209"]}),
    )
    .await;
    let ctrl = spawn_controller(client.clone(), mk_config());
    create_svc(
        &client,
        "web",
        json!({"type": "LoadBalancer", "ports": [{"port": 80}]}),
    )
    .await;
    let web = wait_svc(&client, "web", "ingress", |s| !ingress_ips(s).is_empty()).await;
    assert_eq!(ingress_ips(&web), vec!["198.18.0.200"]);
    wait_until("counts", || async {
        let p = pools.get("a").await.unwrap();
        p.status
            .as_ref()
            .is_some_and(|s| s.assigned_ipv4 == 1 && s.available_ipv4 == 9)
            && condition(&p, "Valid").as_deref() == Some("True")
            && condition(&p, "Overlapping").as_deref() == Some("False")
    })
    .await;

    create_pool(
        &client,
        "b",
        json!({"addresses": ["198.18.0.205-198.18.0.220", "fd00:18::/120"]}),
    )
    .await;
    wait_until("overlap on both pools", || async {
        let a = pools.get("a").await.unwrap();
        let b = pools.get("b").await.unwrap();
        condition(&a, "Overlapping").as_deref() == Some("True")
            && condition(&b, "Overlapping").as_deref() == Some("True")
            && b.status.as_ref().is_some_and(|s| s.available_ipv6 == "256")
    })
    .await;

    // Pool "a" moves away from the address the Service holds: it keeps it, marked.
    pools
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"addresses": ["198.18.0.100-198.18.0.109"]}})),
        )
        .await
        .unwrap();
    let web = wait_svc(&client, "web", "kept", |s| {
        allocated(s).is_some_and(|c| c.1 == "PoolGone")
    })
    .await;
    assert_eq!(ingress_ips(&web), vec!["198.18.0.200"]);
    assert_eq!(
        allocated(&web).unwrap().2,
        "IPPool \"a\" no longer contains 198.18.0.200; the Service keeps it until the Service changes"
    );
    wait_until("a Warning Event naming the pool", || async {
        events_for(&client, "web")
            .await
            .iter()
            .any(|(reason, note)| reason == "PoolGone" && note.contains("IPPool \"a\""))
    })
    .await;
    wait_until(
        "overlap cleared, the kept address counted nowhere",
        || async {
            let a = pools.get("a").await.unwrap();
            condition(&a, "Overlapping").as_deref() == Some("False")
                && a.status.as_ref().is_some_and(|s| s.assigned_ipv4 == 0)
        },
    )
    .await;
    assert_eq!(ctrl.metric("berth_controller_kept_addresses"), 1.0);

    // Every pool goes: still kept. Re-created with it: counted and unmarked.
    pools.delete("a", &DeleteParams::default()).await.unwrap();
    pools.delete("b", &DeleteParams::default()).await.unwrap();
    create_pool(
        &client,
        "a",
        json!({"addresses": ["198.18.0.200-198.18.0.209"]}),
    )
    .await;
    let web = wait_svc(&client, "web", "back in a pool", |s| {
        allocated(s).is_some_and(|c| c.0 == "True")
    })
    .await;
    assert_eq!(ingress_ips(&web), vec!["198.18.0.200"]);
    wait_until("counted again", || async {
        let a = pools.get("a").await.unwrap();
        a.status.as_ref().is_some_and(|s| s.assigned_ipv4 == 1)
    })
    .await;
    ctrl.stop().await;

    // With a grace, kept until it runs out, then a new address from the pools as they are.
    let mut cfg = mk_config();
    cfg.pool_gone_grace = Some(std::time::Duration::from_secs(1));
    let ctrl = spawn_controller(client.clone(), cfg);
    pools
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"addresses": ["198.18.0.100-198.18.0.109"]}})),
        )
        .await
        .unwrap();
    let web = wait_svc(&client, "web", "kept for the grace", |s| {
        allocated(s).is_some_and(|c| c.1 == "PoolGone")
    })
    .await;
    assert_eq!(ingress_ips(&web), vec!["198.18.0.200"]);
    assert!(allocated(&web).unwrap().2.contains("keeps it until 20"));
    let web = wait_svc(&client, "web", "a new address", |s| {
        ingress_ips(s) == vec!["198.18.0.100"]
    })
    .await;
    assert_eq!(allocated(&web).unwrap().0, "True");
    ctrl.stop().await;

    // With a grace of nothing, the pools describe what is announced: none when no pool is
    // left, at once.
    let mut cfg = mk_config();
    cfg.pool_gone_grace = Some(std::time::Duration::ZERO);
    let ctrl = spawn_controller(client.clone(), cfg);
    pools.delete("a", &DeleteParams::default()).await.unwrap();
    let web = wait_svc(&client, "web", "no pool left", |s| {
        allocated(s).is_some_and(|c| c.0 == "False")
    })
    .await;
    assert_eq!(allocated(&web).unwrap().1, "NoAvailablePool");
    assert!(ingress_ips(&web).is_empty(), "{:?}", ingress_ips(&web));
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

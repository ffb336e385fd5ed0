//! ClusterIP allocation against the lab API server.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::json;

#[tokio::test]
async fn cluster_ip_from_the_range_never_the_network_address() {
    let (server, client) = start_lab().await;
    let ctrl = spawn_controller(client.clone(), mk_config());
    for i in 0..20 {
        create_svc(&client, &format!("s{i}"), json!({"ports": [{"port": 80}]})).await;
    }
    for i in 0..20 {
        let svc = wait_svc(&client, &format!("s{i}"), "a ClusterIP", |s| {
            cluster_ip(s).is_some()
        })
        .await;
        let ip: std::net::Ipv4Addr = cluster_ip(&svc).unwrap().parse().unwrap();
        let net: ipnet::Ipv4Net = "10.96.0.0/16".parse().unwrap();
        assert!(
            net.contains(&ip) && ip != net.network() && ip != net.broadcast(),
            "{ip}"
        );
        let spec = svc.spec.unwrap();
        assert_eq!(spec.cluster_ips.unwrap(), vec![ip.to_string()]);
        assert_eq!(spec.ip_families.unwrap(), vec!["IPv4".to_string()]);
        assert_eq!(spec.ip_family_policy.as_deref(), Some("SingleStack"));
    }
    let s0 = wait_svc(&client, "s0", "condition", |s| allocated(s).is_some()).await;
    assert_eq!(allocated(&s0).unwrap().0, "True");
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn requested_cluster_ip_in_static_band_and_duplicate_is_refused() {
    let (server, client) = start_lab().await;
    let ctrl = spawn_controller(client.clone(), mk_config());
    // 10.96.0.5 lies in the static band (the lowest 256 addresses of a /16).
    create_svc(
        &client,
        "first",
        json!({"clusterIP": "10.96.0.5", "ports": [{"port": 80}]}),
    )
    .await;
    let first = wait_svc(&client, "first", "allocated", |s| allocated(s).is_some()).await;
    assert_eq!(allocated(&first).unwrap().0, "True");
    assert_eq!(cluster_ip(&first).as_deref(), Some("10.96.0.5"));

    create_svc(
        &client,
        "second",
        json!({"clusterIP": "10.96.0.5", "ports": [{"port": 80}]}),
    )
    .await;
    let second = wait_svc(&client, "second", "refused", |s| allocated(s).is_some()).await;
    let (status, reason, message) = allocated(&second).unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "IPAlreadyAllocated")
    );
    assert_eq!(
        message,
        "failed to allocate IP 10.96.0.5: provided IP is already allocated"
    );
    // Nothing else changed: the spec is as created, the first Service is untouched.
    assert_eq!(cluster_ip(&second).as_deref(), Some("10.96.0.5"));
    assert!(
        second.spec.as_ref().unwrap().ip_families.is_none(),
        "a refused Service is not filled in"
    );
    let first_again = get_svc(&client, "first").await;
    assert_eq!(
        first_again.metadata.resource_version,
        first.metadata.resource_version
    );
    wait_until("a Warning event with the apiserver's words", || async {
        events_for(&client, "second").await.iter().any(|(r, n)| {
            r == "AllocationFailed"
                && n == "failed to allocate IP 10.96.0.5: provided IP is already allocated"
        })
    })
    .await;

    // Once the holder is deleted, the address is free at once and the waiting Service gets it.
    delete_svc(&client, "first").await;
    let second = wait_svc(&client, "second", "allocated after release", |s| {
        allocated(s).is_some_and(|c| c.0 == "True")
    })
    .await;
    assert_eq!(cluster_ip(&second).as_deref(), Some("10.96.0.5"));
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn dual_stack_policies() {
    let (server, client) = start_lab().await;
    let mut cfg = mk_config();
    cfg.service_cidrs.push("fd00:96::/112".parse().unwrap());
    let ctrl = spawn_controller(client.clone(), cfg);
    create_svc(&client, "single", json!({"ports": [{"port": 80}]})).await;
    create_svc(
        &client,
        "prefer",
        json!({"ipFamilyPolicy": "PreferDualStack", "ports": [{"port": 80}]}),
    )
    .await;
    create_svc(&client, "require6", json!({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6"], "ports": [{"port": 80}]})).await;
    create_svc(
        &client,
        "only6",
        json!({"ipFamilies": ["IPv6"], "ports": [{"port": 80}]}),
    )
    .await;
    let ips = |s: &k8s_openapi::api::core::v1::Service| {
        s.spec
            .as_ref()
            .unwrap()
            .cluster_ips
            .clone()
            .unwrap_or_default()
    };
    let single = wait_svc(&client, "single", "ip", |s| !ips(s).is_empty()).await;
    assert_eq!(ips(&single).len(), 1);
    assert!(ips(&single)[0].contains('.'));
    let prefer = wait_svc(&client, "prefer", "ips", |s| !ips(s).is_empty()).await;
    assert_eq!(ips(&prefer).len(), 2);
    assert_eq!(
        prefer.spec.as_ref().unwrap().ip_families.clone().unwrap(),
        vec!["IPv4", "IPv6"]
    );
    let require6 = wait_svc(&client, "require6", "ips", |s| !ips(s).is_empty()).await;
    assert!(ips(&require6)[0].contains(':') && ips(&require6)[1].contains('.'));
    let only6 = wait_svc(&client, "only6", "ip", |s| !ips(s).is_empty()).await;
    assert_eq!(ips(&only6).len(), 1);
    assert!(ips(&only6)[0].starts_with("fd00:96::"));
    ctrl.stop().await;

    // A single-stack cluster refuses RequireDualStack in the apiserver's words.
    let ctrl = spawn_controller(client.clone(), mk_config());
    create_svc(
        &client,
        "needs-two",
        json!({"ipFamilyPolicy": "RequireDualStack", "ports": [{"port": 80}]}),
    )
    .await;
    let s = wait_svc(&client, "needs-two", "refused", |s| allocated(s).is_some()).await;
    assert_eq!(
        allocated(&s).unwrap().2,
        "spec.ipFamilyPolicy: Invalid value: \"RequireDualStack\": this cluster is not configured for dual-stack services"
    );
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

//! LoadBalancer IPs from IPPools, the l2 provider's status and Events, against the lab API
//! server.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use kube::api::{Api, DeleteParams};
use serde_json::json;

fn lb(ports: serde_json::Value) -> serde_json::Value {
    json!({"type": "LoadBalancer", "ports": ports})
}

#[tokio::test]
async fn address_from_highest_priority_pool_with_vip_status_and_events() {
    let (server, client) = start_lab().await;
    create_pool(
        &client,
        "low",
        json!({"addresses": ["198.18.0.10-198.18.0.20"], "serviceAllocation": {"priority": 50}}),
    )
    .await;
    create_pool(
        &client,
        "high",
        json!({"addresses": ["198.18.0.200-198.18.0.210"], "serviceAllocation": {"priority": 1}}),
    )
    .await;
    create_pool(
        &client,
        "unset",
        json!({"addresses": ["198.18.0.100-198.18.0.110"]}),
    )
    .await;
    let ctrl = spawn_controller(client.clone(), mk_config());
    create_svc(&client, "web", lb(json!([{"port": 80}]))).await;
    let web = wait_svc(&client, "web", "ingress", |s| !ingress_ips(s).is_empty()).await;
    assert_eq!(ingress_ips(&web), vec!["198.18.0.200"]);
    let ingress = web
        .status
        .as_ref()
        .unwrap()
        .load_balancer
        .as_ref()
        .unwrap()
        .ingress
        .clone()
        .unwrap();
    assert_eq!(ingress[0].ip_mode.as_deref(), Some("VIP"));
    wait_until("load balancer events", || async {
        let reasons: Vec<String> = events_for(&client, "web")
            .await
            .into_iter()
            .map(|e| e.0)
            .collect();
        ["EnsuringLoadBalancer", "EnsuredLoadBalancer", "IPAllocated"]
            .iter()
            .all(|r| reasons.iter().any(|x| x == r))
    })
    .await;
    // Pool status counts follow.
    let pools: Api<berth_api::IPPool> = Api::all(client.clone());
    wait_until("pool status", || async {
        let p = pools.get("high").await.unwrap();
        p.status
            .is_some_and(|s| s.assigned_ipv4 == 1 && s.available_ipv4 == 10)
    })
    .await;
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn named_pool_requested_ip_and_requests_outside_every_pool() {
    let (server, client) = start_lab().await;
    create_pool(
        &client,
        "default",
        json!({"addresses": ["198.18.0.200-198.18.0.210"]}),
    )
    .await;
    create_pool(
        &client,
        "special",
        json!({"addresses": ["198.18.0.50-198.18.0.60"], "autoAssign": false}),
    )
    .await;
    let ctrl = spawn_controller(client.clone(), mk_config());
    create_svc_full(
        &client,
        json!({"metadata": {"name": "named", "annotations": {"berth.dev/ip-pool": "special"}},
        "spec": lb(json!([{"port": 80}]))}),
    )
    .await;
    create_svc_full(&client, json!({"metadata": {"name": "asked", "annotations": {"berth.dev/load-balancer-ips": "198.18.0.205"}},
        "spec": lb(json!([{"port": 80}]))})).await;
    create_svc_full(&client, json!({"metadata": {"name": "legacy"},
        "spec": {"type": "LoadBalancer", "loadBalancerIP": "198.18.0.55", "ports": [{"port": 80}]}})).await;
    create_svc_full(&client, json!({"metadata": {"name": "outside", "annotations": {"metallb.io/loadBalancerIPs": "192.0.2.1"}},
        "spec": lb(json!([{"port": 80}]))})).await;
    let named = wait_svc(&client, "named", "ingress", |s| !ingress_ips(s).is_empty()).await;
    assert_eq!(ingress_ips(&named), vec!["198.18.0.50"]);
    let asked = wait_svc(&client, "asked", "ingress", |s| !ingress_ips(s).is_empty()).await;
    assert_eq!(ingress_ips(&asked), vec!["198.18.0.205"]);
    let legacy = wait_svc(&client, "legacy", "ingress", |s| !ingress_ips(s).is_empty()).await;
    assert_eq!(ingress_ips(&legacy), vec!["198.18.0.55"]);
    let outside = wait_svc(&client, "outside", "refused", |s| allocated(s).is_some()).await;
    let (status, reason, message) = allocated(&outside).unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "NotInAnyPool")
    );
    assert_eq!(message, "\"192.0.2.1\" is not allowed in config");
    assert!(ingress_ips(&outside).is_empty());
    create_svc_full(
        &client,
        json!({"metadata": {"name": "nopool", "annotations": {"berth.dev/ip-pool": "missing"}},
        "spec": lb(json!([{"port": 80}]))}),
    )
    .await;
    let nopool = wait_svc(&client, "nopool", "refused", |s| allocated(s).is_some()).await;
    assert_eq!(allocated(&nopool).unwrap().1, "PoolNotFound");
    // Named wrongly after it had an address: it keeps it (for a while), and says so.
    patch_svc(
        &client,
        "named",
        json!({"metadata": {"annotations": {"berth.dev/ip-pool": "missing"}}}),
    )
    .await;
    let named = wait_svc(&client, "named", "pool not found", |s| {
        allocated(s).is_some_and(|c| c.1 == "PoolNotFound")
    })
    .await;
    assert_eq!(ingress_ips(&named), vec!["198.18.0.50"]);
    let message = allocated(&named).unwrap().2;
    assert!(
        message.starts_with("IPPool \"missing\" not found; the Service keeps 198.18.0.50 until "),
        "{message}"
    );
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn pool_exhausted_then_freed_and_avoid_buggy_ips() {
    let (server, client) = start_lab().await;
    // avoidBuggyIPs: .255 and .0 are skipped, leaving .254 and .1.
    create_pool(
        &client,
        "tiny",
        json!({"addresses": ["198.18.0.254-198.18.1.1"], "avoidBuggyIPs": true}),
    )
    .await;
    let ctrl = spawn_controller(client.clone(), mk_config());
    create_svc(&client, "a", lb(json!([{"port": 80}]))).await;
    let a = wait_svc(&client, "a", "ingress", |s| !ingress_ips(s).is_empty()).await;
    assert_eq!(ingress_ips(&a), vec!["198.18.0.254"]);
    create_svc(&client, "b", lb(json!([{"port": 80}]))).await;
    let b = wait_svc(&client, "b", "ingress", |s| !ingress_ips(s).is_empty()).await;
    assert_eq!(ingress_ips(&b), vec!["198.18.1.1"]);
    create_svc(&client, "c", lb(json!([{"port": 80}]))).await;
    let c = wait_svc(&client, "c", "refused", |s| allocated(s).is_some()).await;
    let (status, reason, message) = allocated(&c).unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str(), message.as_str()),
        (
            "False",
            "NoAvailablePool",
            "no available IPs for IPv4 IPFamily"
        )
    );
    delete_svc(&client, "a").await;
    let c = wait_svc(&client, "c", "the freed address", |s| {
        !ingress_ips(s).is_empty()
    })
    .await;
    assert_eq!(ingress_ips(&c), vec!["198.18.0.254"]);
    assert_eq!(allocated(&c).unwrap().0, "True");
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn sharing_key_allowed_and_refused() {
    let (server, client) = start_lab().await;
    create_pool(
        &client,
        "default",
        json!({"addresses": ["198.18.0.200-198.18.0.210"]}),
    )
    .await;
    let ctrl = spawn_controller(client.clone(), mk_config());
    let shared = |name: &str, port: i32, ip: &str| {
        json!({"metadata": {"name": name, "annotations": {
        "berth.dev/sharing-key": "k", "berth.dev/load-balancer-ips": ip}},
        "spec": {"type": "LoadBalancer", "ports": [{"port": port}]}})
    };
    create_svc_full(&client, shared("http", 80, "198.18.0.203")).await;
    wait_svc(&client, "http", "ingress", |s| !ingress_ips(s).is_empty()).await;
    create_svc_full(&client, shared("https", 443, "198.18.0.203")).await;
    let https = wait_svc(&client, "https", "ingress", |s| !ingress_ips(s).is_empty()).await;
    assert_eq!(ingress_ips(&https), vec!["198.18.0.203"]);
    // Same port on the same address: refused, in MetalLB's words.
    create_svc_full(&client, shared("clash", 80, "198.18.0.203")).await;
    let clash = wait_svc(&client, "clash", "refused", |s| allocated(s).is_some()).await;
    let (status, reason, message) = allocated(&clash).unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "SharingConflict")
    );
    assert!(message.contains("198.18.0.203"), "{message}");
    // Without a sharing key, the address is not shared.
    create_svc_full(&client, json!({"metadata": {"name": "loner", "annotations": {"berth.dev/load-balancer-ips": "198.18.0.203"}},
        "spec": lb(json!([{"port": 8080}]))})).await;
    let loner = wait_svc(&client, "loner", "refused", |s| allocated(s).is_some()).await;
    assert_eq!(allocated(&loner).unwrap().0, "False");
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

/// A sharing key is its namespace's own: another tenant that uses the same key cannot request
/// the address (refused with a condition) until both Services name each other's namespace.
#[tokio::test]
async fn sharing_across_namespaces_needs_both_services_consent() {
    use k8s_openapi::api::core::v1::{Namespace, Service};
    use kube::api::{Patch, PatchParams, PostParams};
    let (server, client) = start_lab().await;
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "tenant-b"}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    create_pool(
        &client,
        "default",
        json!({"addresses": ["198.18.0.200-198.18.0.210"]}),
    )
    .await;
    let ctrl = spawn_controller(client.clone(), mk_config());
    let shared = |ns: &str, name: &str, port: i32| {
        json!({"metadata": {"name": name, "namespace": ns, "annotations": {
        "berth.dev/sharing-key": "k", "berth.dev/load-balancer-ips": "198.18.0.203"}},
        "spec": {"type": "LoadBalancer", "ports": [{"port": port}]}})
    };
    create_svc_full(&client, shared("default", "http", 80)).await;
    wait_svc(&client, "http", "ingress", |s| !ingress_ips(s).is_empty()).await;
    create_svc_full(&client, shared("tenant-b", "intruder", 443)).await;
    let tenant_b: Api<Service> = Api::namespaced(client.clone(), "tenant-b");
    let until = |what: &'static str, check: fn(&Service) -> bool| {
        let tenant_b = tenant_b.clone();
        async move {
            for _ in 0..400 {
                if let Ok(svc) = tenant_b.get("intruder").await {
                    if check(&svc) {
                        return svc;
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            panic!("tenant-b/intruder: {what}");
        }
    };
    let refused = until("refused", |s| allocated(s).is_some()).await;
    let (status, reason, message) = allocated(&refused).unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "SharingConflict")
    );
    assert!(
        message.contains("berth.dev/sharing-cross-namespace"),
        "{message}"
    );
    assert!(ingress_ips(&refused).is_empty());
    // Consent on both sides: the intruder becomes a guest.
    let consent =
        |ns: &str| json!({"metadata": {"annotations": {"berth.dev/sharing-cross-namespace": ns}}});
    patch_svc(&client, "http", consent("tenant-b")).await;
    tenant_b
        .patch(
            "intruder",
            &PatchParams::default(),
            &Patch::Merge(&consent("default")),
        )
        .await
        .unwrap();
    let joined = until("joined", |s| !ingress_ips(s).is_empty()).await;
    assert_eq!(ingress_ips(&joined), vec!["198.18.0.203"]);
    assert_eq!(allocated(&joined).unwrap().0, "True");
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn type_changes_delete_and_foreign_class() {
    let (server, client) = start_lab().await;
    create_pool(
        &client,
        "default",
        json!({"addresses": ["198.18.0.200-198.18.0.201"]}),
    )
    .await;
    let ctrl = spawn_controller(client.clone(), mk_config());
    create_svc(&client, "s", lb(json!([{"port": 80}]))).await;
    let s = wait_svc(&client, "s", "ingress", |s| {
        !ingress_ips(s).is_empty() && node_ports(s)[0].is_some()
    })
    .await;
    let port = node_ports(&s)[0];
    // LoadBalancer -> NodePort: the external address goes, the node port stays.
    patch_svc(&client, "s", json!({"spec": {"type": "NodePort"}})).await;
    let s = wait_svc(&client, "s", "ingress cleared", |s| {
        ingress_ips(s).is_empty()
    })
    .await;
    assert_eq!(node_ports(&s)[0], port);
    wait_until("deleting events", || async {
        let reasons: Vec<String> = events_for(&client, "s")
            .await
            .into_iter()
            .map(|e| e.0)
            .collect();
        reasons.iter().any(|r| r == "DeletingLoadBalancer")
            && reasons.iter().any(|r| r == "DeletedLoadBalancer")
    })
    .await;
    // Its address is free again: two more Services fit in the two-address pool.
    create_svc(&client, "t", lb(json!([{"port": 80}]))).await;
    create_svc(&client, "u", lb(json!([{"port": 80}]))).await;
    wait_svc(&client, "t", "ingress", |s| !ingress_ips(s).is_empty()).await;
    wait_svc(&client, "u", "ingress", |s| !ingress_ips(s).is_empty()).await;
    // NodePort -> ClusterIP: the node port is released (another Service can ask for it).
    patch_svc(
        &client,
        "s",
        json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80}]}}),
    )
    .await;
    create_svc(
        &client,
        "np",
        json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": port.unwrap()}]}),
    )
    .await;
    let np = wait_svc(&client, "np", "allocated", |s| {
        allocated(s).is_some_and(|c| c.0 == "True")
    })
    .await;
    assert_eq!(node_ports(&np)[0], port);
    // Delete releases the LoadBalancer IP at once.
    delete_svc(&client, "t").await;
    create_svc(&client, "v", lb(json!([{"port": 80}]))).await;
    wait_svc(&client, "v", "ingress", |s| !ingress_ips(s).is_empty()).await;
    // -> ExternalName: nothing held; the ClusterIP can be requested by another.
    let ip = cluster_ip(&get_svc(&client, "s").await).unwrap();
    patch_svc(
        &client,
        "s",
        json!({"spec": {"type": "ExternalName", "externalName": "example.com", "ports": null}}),
    )
    .await;
    create_svc(
        &client,
        "w",
        json!({"clusterIP": ip, "ports": [{"port": 80}]}),
    )
    .await;
    wait_svc(&client, "w", "allocated", |s| {
        allocated(s).is_some_and(|c| c.0 == "True")
    })
    .await;

    // A class berth does not serve: node ports as on any cluster, but no address, no status,
    // although the pool has a free address (v's) that a served Service would get.
    Api::<k8s_openapi::api::core::v1::Service>::default_namespaced(client.clone())
        .delete("v", &DeleteParams::default())
        .await
        .unwrap();
    create_svc(&client, "foreign", json!({"type": "LoadBalancer", "loadBalancerClass": "example.com/other", "ports": [{"port": 80}]})).await;
    let f = wait_svc(&client, "foreign", "node port", |s| {
        node_ports(s)[0].is_some()
    })
    .await;
    settled(&client).await;
    let f2 = get_svc(&client, "foreign").await;
    assert!(ingress_ips(&f2).is_empty());
    assert!(f2
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .is_none());
    assert!(events_for(&client, "foreign")
        .await
        .iter()
        .all(|(r, _)| !r.contains("LoadBalancer")));
    // No condition either: berth writes no status for a class it does not serve.
    assert_eq!(allocated(&f2), None);
    drop(f);
    // The free address was there to take: a served Service gets it.
    create_svc(&client, "x", lb(json!([{"port": 80}]))).await;
    wait_svc(&client, "x", "ingress", |s| !ingress_ips(s).is_empty()).await;
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

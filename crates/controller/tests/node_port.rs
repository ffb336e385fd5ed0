//! NodePort and healthCheckNodePort allocation against the lab API server.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::json;

#[tokio::test]
async fn node_ports_assigned_requested_out_of_range_colliding_and_shared() {
    let (server, client) = start_lab().await;
    let ctrl = spawn_controller(client.clone(), mk_config());
    create_svc(
        &client,
        "auto",
        json!({"type": "NodePort", "ports": [{"port": 80}, {"port": 443}]}),
    )
    .await;
    create_svc(
        &client,
        "asked",
        json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}),
    )
    .await;
    create_svc(&client, "dns", json!({"type": "NodePort", "ports": [
        {"name": "tcp", "port": 53, "protocol": "TCP"}, {"name": "udp", "port": 53, "protocol": "UDP"}]})).await;

    let auto = wait_svc(&client, "auto", "node ports", |s| {
        node_ports(&s).iter().all(Option::is_some)
    })
    .await;
    let ports: Vec<i32> = node_ports(&auto).into_iter().flatten().collect();
    assert!(
        ports.iter().all(|p| (30000..=32767).contains(p)),
        "{ports:?}"
    );
    assert_ne!(ports[0], ports[1]);
    let asked = wait_svc(&client, "asked", "allocated", |s| allocated(s).is_some()).await;
    assert_eq!(allocated(&asked).unwrap().0, "True");
    assert_eq!(node_ports(&asked), vec![Some(30080)]);
    let dns = wait_svc(&client, "dns", "node ports", |s| {
        node_ports(&s).iter().all(Option::is_some)
    })
    .await;
    let p = node_ports(&dns);
    assert_eq!(
        p[0], p[1],
        "TCP and UDP of one Service port share the node port"
    );

    create_svc(
        &client,
        "far",
        json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 40000}]}),
    )
    .await;
    let far = wait_svc(&client, "far", "refused", |s| allocated(s).is_some()).await;
    assert_eq!(
        allocated(&far).unwrap().2,
        "spec.ports[0].nodePort: Invalid value: 40000: provided port is not in the valid range. The range of valid ports is 30000-32767"
    );
    create_svc(
        &client,
        "clash",
        json!({"type": "NodePort", "ports": [{"port": 81, "nodePort": 30080}]}),
    )
    .await;
    let clash = wait_svc(&client, "clash", "refused", |s| allocated(s).is_some()).await;
    let (status, reason, message) = allocated(&clash).unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "PortAlreadyAllocated")
    );
    assert_eq!(
        message,
        "spec.ports[0].nodePort: Invalid value: 30080: provided port is already allocated"
    );
    assert!(
        cluster_ip(&clash).is_some(),
        "the ClusterIP stage before it succeeded"
    );
    // The holder is untouched.
    assert_eq!(
        node_ports(&get_svc(&client, "asked").await),
        vec![Some(30080)]
    );
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn health_check_node_port_only_for_load_balancer_local() {
    let (server, client) = start_lab().await;
    create_pool(
        &client,
        "default",
        json!({"addresses": ["198.18.0.200-198.18.0.250"]}),
    )
    .await;
    let ctrl = spawn_controller(client.clone(), mk_config());
    create_svc(
        &client,
        "lb-local",
        json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "ports": [{"port": 80}]}),
    )
    .await;
    create_svc(
        &client,
        "lb-cluster",
        json!({"type": "LoadBalancer", "ports": [{"port": 80}]}),
    )
    .await;
    create_svc(
        &client,
        "np-local",
        json!({"type": "NodePort", "externalTrafficPolicy": "Local", "ports": [{"port": 80}]}),
    )
    .await;
    let hc =
        |s: &k8s_openapi::api::core::v1::Service| s.spec.as_ref().unwrap().health_check_node_port;
    let local = wait_svc(&client, "lb-local", "hc port", |s| hc(s).is_some()).await;
    let port = hc(&local).unwrap();
    assert!((30000..=32767).contains(&port));
    assert!(
        !node_ports(&local).contains(&Some(port)),
        "never equal to a traffic port"
    );
    for name in ["lb-cluster", "np-local"] {
        let s = wait_svc(&client, name, "allocated", |s| allocated(s).is_some()).await;
        assert_eq!(hc(&s), None, "{name}");
    }
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn allocate_load_balancer_node_ports_false_keeps_requested_only() {
    let (server, client) = start_lab().await;
    create_pool(
        &client,
        "default",
        json!({"addresses": ["198.18.0.200-198.18.0.250"]}),
    )
    .await;
    let ctrl = spawn_controller(client.clone(), mk_config());
    create_svc(
        &client,
        "lb",
        json!({"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
        "ports": [{"port": 80}, {"port": 81, "nodePort": 31081}]}),
    )
    .await;
    let lb = wait_svc(&client, "lb", "ingress", |s| !ingress_ips(s).is_empty()).await;
    assert_eq!(node_ports(&lb), vec![None, Some(31081)]);
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

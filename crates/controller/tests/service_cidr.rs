//! ServiceCIDRs against the lab API server: the controller allocates ClusterIPs from every
//! ServiceCIDR the cluster has, so a new one adds room once the first is full.

#![allow(clippy::unwrap_used)]

mod common;

use berth_lab::LabApiServer;
use common::*;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test]
async fn a_new_service_cidr_adds_room_once_the_first_is_full() {
    // The API server's default ServiceCIDR `kubernetes` has two usable addresses.
    let (server, client) = berth_testing::start_lab_with(
        LabApiServer::builder().service_cidrs(vec!["10.96.0.0/30".into()]),
    )
    .await;
    berth_testing::install_crds(&client).await;
    let ctrl = spawn_controller(client.clone(), mk_config());
    for name in ["a", "b"] {
        create_svc(&client, name, json!({"ports": [{"port": 80}]})).await;
        let svc = wait_svc(&client, name, "a ClusterIP", |s| cluster_ip(s).is_some()).await;
        let ip: std::net::IpAddr = cluster_ip(&svc).unwrap().parse().unwrap();
        let net: ipnet::IpNet = "10.96.0.0/30".parse().unwrap();
        assert!(
            net.contains(&ip),
            "{ip} from the ServiceCIDR, not --service-cidr's /16"
        );
    }
    create_svc(&client, "c", json!({"ports": [{"port": 80}]})).await;
    let c = wait_svc(&client, "c", "refused", |s| allocated(s).is_some()).await;
    let (status, _, message) = allocated(&c).unwrap();
    assert_eq!(
        (status.as_str(), message.as_str()),
        ("False", "failed to allocate a serviceIP: range is full")
    );

    let extra: ServiceCIDR = serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "ServiceCIDR",
        "metadata": {"name": "extra"},
        "spec": {"cidrs": ["10.97.0.0/30"]},
    }))
    .unwrap();
    Api::<ServiceCIDR>::all(client.clone())
        .create(&PostParams::default(), &extra)
        .await
        .unwrap();
    let c = wait_svc(&client, "c", "a ClusterIP from the new ServiceCIDR", |s| {
        cluster_ip(s).is_some()
    })
    .await;
    let ip: std::net::IpAddr = cluster_ip(&c).unwrap().parse().unwrap();
    let net: ipnet::IpNet = "10.97.0.0/30".parse().unwrap();
    assert!(net.contains(&ip), "{ip}");
    let c = wait_svc(&client, "c", "allocated", |s| {
        allocated(s).is_some_and(|(status, _, _)| status == "True")
    })
    .await;
    assert_eq!(allocated(&c).unwrap().0, "True");
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

//! `--endpoints on`: the allocation controller runs the endpoints controller beside it in each
//! leadership term, so one replica both allocates a Service and lists its pods.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use berth_controller::endpoints::EndpointsConfig;
use common::*;
use k8s_openapi::api::core::v1::{Endpoints, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_allocates_and_maintains_endpoints() {
    let (_server, client) = start_lab().await;
    let mut config = mk_config();
    let mut lease = berth_controller::LeaseConfig::new("kube-system", "endpoints-wiring");
    lease.lease_duration = Duration::from_secs(3);
    lease.renew_deadline = Duration::from_secs(2);
    lease.retry_period = Duration::from_millis(200);
    config.lease = Some(lease);
    config.endpoints = Some(EndpointsConfig::default());
    let running = spawn_controller(client.clone(), config);

    create_svc(
        &client,
        "web",
        json!({"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}),
    )
    .await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web-1", "labels": {"app": "web"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "echo"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods.patch_status(
        "web-1",
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {
            "phase": "Running", "podIP": "10.244.1.5", "podIPs": [{"ip": "10.244.1.5"}],
            "conditions": [{"type": "Ready", "status": "True"}]
        }})),
    )
    .await
    .unwrap();

    wait_svc(&client, "web", "a ClusterIP", |s| cluster_ip(s).is_some()).await;
    let endpoints: Api<Endpoints> = Api::default_namespaced(client.clone());
    wait_until("Endpoints listing the ready pod", || async {
        endpoints
            .get_opt("web")
            .await
            .ok()
            .flatten()
            .is_some_and(|e| {
                e.subsets.unwrap_or_default().iter().any(|s| {
                    s.addresses
                        .as_deref()
                        .unwrap_or_default()
                        .iter()
                        .any(|a| a.ip == "10.244.1.5")
                })
            })
    })
    .await;
    running.stop().await;
}

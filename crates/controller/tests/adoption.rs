//! Startup: existing values are adopted oldest first before anything is assigned; the
//! younger of two claimants is refused and left as it is; nothing new steals an adopted value.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

async fn set_ingress(client: &kube::Client, name: &str, ip: &str) {
    let api: Api<Service> = Api::default_namespaced(client.clone());
    let patch = json!({"status": {"loadBalancer": {"ingress": [{"ip": ip, "ipMode": "VIP"}]}}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[tokio::test]
async fn older_claims_win_and_adopted_values_are_never_reassigned() {
    let (server, client) = start_lab().await;
    create_pool(
        &client,
        "default",
        json!({"addresses": ["198.18.0.200-198.18.0.203"]}),
    )
    .await;
    let spec = json!({"type": "LoadBalancer", "clusterIP": "10.96.77.7",
        "ports": [{"port": 80, "nodePort": 31777}]});
    create_svc(&client, "z-older", spec.clone()).await;
    set_ingress(&client, "z-older", "198.18.0.202").await;
    // creationTimestamp has one-second resolution.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    create_svc(&client, "a-younger", spec).await;
    set_ingress(&client, "a-younger", "198.18.0.202").await;
    let before = get_svc(&client, "z-older").await;

    let ctrl = spawn_controller(client.clone(), mk_config());
    let younger = wait_svc(&client, "a-younger", "refused", |s| allocated(s).is_some()).await;
    let (status, reason, message) = allocated(&younger).unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "IPAlreadyAllocated")
    );
    assert_eq!(
        message,
        "failed to allocate IP 10.96.77.7: provided IP is already allocated"
    );
    assert_eq!(
        cluster_ip(&younger).as_deref(),
        Some("10.96.77.7"),
        "its spec is left as it is"
    );
    let older = wait_svc(&client, "z-older", "allocated", |s| allocated(s).is_some()).await;
    assert_eq!(allocated(&older).unwrap().0, "True");
    let (was, now) = (before.spec.unwrap(), older.spec.clone().unwrap());
    assert_eq!(
        (was.cluster_ip, was.ports),
        (now.cluster_ip, now.ports),
        "the older keeps its values"
    );
    assert_eq!(
        now.cluster_ips,
        Some(vec!["10.96.77.7".to_string()]),
        "empty fields are filled"
    );
    assert_eq!(ingress_ips(&older), vec!["198.18.0.202"]);
    wait_until("a Warning event on the younger", || async {
        events_for(&client, "a-younger")
            .await
            .iter()
            .any(|(r, _)| r == "AllocationFailed")
    })
    .await;

    // New Services never get an adopted value: the pool's other three addresses go first,
    // then the pool is full.
    for i in 0..4 {
        create_svc(
            &client,
            &format!("new{i}"),
            json!({"type": "LoadBalancer", "ports": [{"port": 80}]}),
        )
        .await;
    }
    let mut got = Vec::new();
    for i in 0..4 {
        let s = wait_svc(&client, &format!("new{i}"), "decided", |s| {
            allocated(s).is_some()
        })
        .await;
        assert_ne!(cluster_ip(&s).as_deref(), Some("10.96.77.7"));
        assert!(!node_ports(&s).contains(&Some(31777)));
        got.extend(ingress_ips(&s));
    }
    got.sort();
    assert_eq!(got, vec!["198.18.0.200", "198.18.0.201", "198.18.0.203"]);
    ctrl.stop().await;
    server.shutdown().await.unwrap();
}

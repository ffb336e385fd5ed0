//! The datapath report against the lab API server: what the agents leave out of a Service (an
//! external IP outside `--external-ip-cidrs`, an unparsable entry, a Service past a size bound)
//! is said on that Service, as the `berth.dev/DatapathAccepted` condition (field and index in
//! the API server's words) and a Warning Event, once; a fixed Service goes back to `Accepted`;
//! a clean Service is never written.
//!
//! Address plan: service CIDR 10.96.0.0/16; external IPs allowed in 192.0.2.0/24 only;
//! endpoints 10.244.1.0/24.

#![allow(clippy::unwrap_used)]

mod common;

use berth_api::names::condition as cond;
use berth_api::{find_condition, ServiceBounds, ServicePolicy};
use common::*;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use serde_json::json;

fn condition(svc: &k8s_openapi::api::core::v1::Service) -> Option<(String, String, String)> {
    let conditions = svc.status.as_ref()?.conditions.as_deref()?;
    find_condition(conditions, cond::DATAPATH_ACCEPTED)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn create_slice(client: &kube::Client, service: &str, endpoints: usize) {
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": format!("{service}-1"), "namespace": "default",
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": (0..endpoints).map(|i| json!({"addresses": [format!("10.244.1.{}", i + 1)]})).collect::<Vec<_>>(),
    }))
    .unwrap();
    Api::<EndpointSlice>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &slice)
        .await
        .unwrap();
}

async fn delete_slice(client: &kube::Client, service: &str) {
    Api::<EndpointSlice>::namespaced(client.clone(), "default")
        .delete(&format!("{service}-1"), &Default::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn dropped_entries_and_oversized_services_are_reported_on_the_service() {
    let (_server, client) = start_lab().await;
    let mut cfg = mk_config();
    cfg.service_policy = ServicePolicy {
        external_ip_cidrs: vec!["192.0.2.0/24".parse().unwrap()],
        bounds: ServiceBounds {
            max_ports: 2,
            max_endpoints_per_port: 3,
            max_endpoints: 10,
        },
    };
    let running = spawn_controller(client.clone(), cfg);
    running.adopted().await;

    let port = json!([{"name": "http", "port": 80, "protocol": "TCP"}]);
    create_svc(
        &client,
        "clean",
        json!({"ports": port, "externalIPs": ["192.0.2.7"]}),
    )
    .await;
    create_svc(
        &client,
        "tenant",
        json!({"type": "LoadBalancer", "ports": port,
               "externalIPs": ["192.0.2.7", "198.18.0.2"],
               "loadBalancerSourceRanges": ["10.0.0.0/8", "010.0.0.0/8"]}),
    )
    .await;
    let svc = wait_svc(&client, "tenant", "the datapath condition", |s| {
        condition(s).is_some()
    })
    .await;
    let (status, reason, message) = condition(&svc).unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "EntriesDropped")
    );
    assert!(
        message.contains("spec.externalIPs[1]: Invalid value: \"198.18.0.2\": not inside the external IP CIDRs this cluster allows (192.0.2.0/24)"),
        "{message}"
    );
    assert!(
        message.contains("spec.loadBalancerSourceRanges[1]: Invalid value: \"010.0.0.0/8\": must be a valid CIDR"),
        "{message}"
    );

    // Too many endpoints on its one port: refused as a whole, False.
    create_svc(&client, "big", json!({"ports": port})).await;
    create_slice(&client, "big", 4).await;
    let svc = wait_svc(&client, "big", "ServiceTooLarge", |s| {
        condition(s).is_some_and(|(_, r, _)| r == "ServiceTooLarge")
    })
    .await;
    let (status, _, message) = condition(&svc).unwrap();
    assert_eq!(status, "False");
    assert!(
        message.starts_with(
            "endpoints of port \"http\" (TCP): Too many: 4: must have at most 3 items"
        ),
        "{message}"
    );
    // Back within bounds: Accepted again.
    delete_slice(&client, "big").await;
    create_slice(&client, "big", 3).await;
    wait_svc(&client, "big", "Accepted again", |s| {
        condition(s).is_some_and(|(st, r, _)| st == "True" && r == "Accepted")
    })
    .await;

    // Too many ports.
    create_svc(
        &client,
        "wide",
        json!({"ports": (0..3).map(|i| json!({"name": format!("p{i}"), "port": 80 + i, "protocol": "TCP"})).collect::<Vec<_>>()}),
    )
    .await;
    wait_svc(&client, "wide", "ServiceTooLarge", |s| {
        condition(s).is_some_and(|(st, r, m)| {
            st == "False" && r == "ServiceTooLarge" && m.starts_with("spec.ports: Too many: 3")
        })
    })
    .await;

    // One Warning per finding, none for the return to Accepted.
    let warnings = |events: Vec<(String, String)>, reason: &str| {
        events.into_iter().filter(|(r, _)| r == reason).count()
    };
    for (name, reason) in [
        ("tenant", "EntriesDropped"),
        ("big", "ServiceTooLarge"),
        ("wide", "ServiceTooLarge"),
    ] {
        wait_until("the Warning Event", || async {
            warnings(events_for(&client, name).await, reason) > 0
        })
        .await;
    }
    settled(&client).await;
    assert_eq!(
        warnings(events_for(&client, "tenant").await, "EntriesDropped"),
        1
    );
    assert_eq!(
        warnings(events_for(&client, "big").await, "ServiceTooLarge"),
        1
    );
    assert_eq!(
        warnings(events_for(&client, "wide").await, "ServiceTooLarge"),
        1
    );
    let note = events_for(&client, "tenant")
        .await
        .into_iter()
        .find(|(r, _)| r == "EntriesDropped")
        .unwrap()
        .1;
    assert!(note.contains("spec.externalIPs[1]"), "{note}");
    // A clean Service is never given the condition.
    assert_eq!(condition(&get_svc(&client, "clean").await), None);
    running.stop().await;
}

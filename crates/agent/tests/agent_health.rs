//! The agent's health-check node ports, `/healthz` under failing syncs, metrics and UDP
//! conntrack cleanup, against the lab API server with in-memory iptables.
//!
//! Address plan: see `common`. Servers listen on 127.0.0.1 only.

#![allow(clippy::unwrap_used)]

mod common;
mod harness;
mod http;

use std::sync::atomic::Ordering;
use std::time::Duration;

use berth_agent::{AgentOptions, ConntrackFlow, SharedIptables};
use berth_datapath::fake::MemoryIptables;
use berth_datapath::plan::convert::ProxyMode;
use berth_lab::LabApiServer;
use common::*;
use harness::*;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

#[tokio::test]
async fn health_check_ports_follow_local_endpoints() {
    let mut h = start(ProxyMode::Full).await;
    let port = http::free_port();
    h.create(mk_local_lb_json("default", "web", "10.96.0.10", port))
        .await;
    h.create(mk_slice_json(
        "default",
        "web",
        "web-1",
        "TCP",
        &[("10.244.1.5", true, NODE), ("10.244.2.5", true, "node-2")],
    ))
    .await;
    h.wait_for("the health-check server", |s, _| {
        s.health_check_ports == vec![port]
    })
    .await;
    let mut answer = (0, String::new());
    for _ in 0..100 {
        answer = http::get(port, "/healthz").await.unwrap();
        if answer.0 == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        answer,
        (
            200,
            r#"{"localEndpoints":1,"service":{"name":"web","namespace":"default"}}"#.to_string()
        )
    );

    // The local pod goes unready: 503, same body shape.
    h.patch_slice(
        "web-1",
        json!({"endpoints": [
            {"addresses": ["10.244.1.5"], "conditions": {"ready": false}, "nodeName": NODE},
            {"addresses": ["10.244.2.5"], "conditions": {"ready": true}, "nodeName": "node-2"}
        ]}),
    )
    .await;
    for _ in 0..100 {
        answer = http::get(port, "/").await.unwrap();
        if answer.0 == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        answer,
        (
            503,
            r#"{"localEndpoints":0,"service":{"name":"web","namespace":"default"}}"#.to_string()
        )
    );

    // The Service goes: so does its server.
    Api::<Service>::namespaced(h.client.clone(), "default")
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_for("the server to stop", |s, _| s.health_check_ports.is_empty())
        .await;
    assert!(http::get(port, "/").await.is_err());
    let (server, _) = h.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn healthz_fails_while_syncs_fail_and_recovers() {
    let server = LabApiServer::builder().start().await.unwrap();
    let options = AgentOptions {
        sync_period: Duration::from_millis(200),
        ..mk_options(ProxyMode::Full)
    };
    let mut h = start_agent(
        server,
        options,
        SharedIptables::new(MemoryIptables::default()),
    )
    .await;
    h.wait_for("the first sync", |s, _| synced(s)).await;
    assert_eq!(http::get(h.admin_port, "/healthz").await.unwrap().0, 200);
    assert_eq!(http::get(h.admin_port, "/readyz").await.unwrap().0, 200);

    h.fail.store(true, Ordering::SeqCst);
    // A periodic sync with nothing to rewrite restores nothing; a change makes the next restore.
    h.create(mk_service_json(
        "default",
        "broken",
        "10.96.0.11",
        json!([{"name": "http", "port": 80}]),
    ))
    .await;
    h.wait_for("a failed sync", |s, _| s.failures > 0).await;
    let error = h.status.borrow().last_error.clone().unwrap();
    assert!(error.contains("injected failure"), "{error}");
    let mut code = 0;
    for _ in 0..100 {
        code = http::get(h.admin_port, "/healthz").await.unwrap().0;
        if code == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(code, 503);
    let (_, metrics) = http::get(h.admin_port, "/metrics").await.unwrap();
    let failures = metric(&metrics, "berth_agent_restore_failures_total");
    assert!(failures >= 1.0, "{metrics}");

    h.fail.store(false, Ordering::SeqCst);
    let failures_seen = h.status.borrow().failures;
    h.wait_for("a sync after the failures", |s, _| {
        s.failures == failures_seen && s.last_error.is_none()
    })
    .await;
    assert_eq!(http::get(h.admin_port, "/healthz").await.unwrap().0, 200);
    let (server, _) = h.stop().await;
    server.shutdown().await.unwrap();
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in\n{text}"))
}

#[tokio::test]
async fn metrics_report_syncs_rules_and_network_programming_latency() {
    let mut h = start(ProxyMode::Full).await;
    h.wait_for("the first sync", |s, _| synced(s)).await;
    h.create(mk_service_json(
        "default",
        "web",
        "10.96.0.10",
        json!([{"name": "http", "port": 80}]),
    ))
    .await;
    let mut slice = mk_slice_json(
        "default",
        "web",
        "web-1",
        "TCP",
        &[("10.244.1.5", true, NODE)],
    );
    // The annotation has second precision: make sure it is not before the agent started.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let trigger = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    slice["metadata"]["annotations"] =
        json!({"endpoints.kubernetes.io/last-change-trigger-time": trigger});
    h.create(slice).await;
    h.wait_for("web", |_, ipt| nat(ipt).contains("10.244.1.5:8080"))
        .await;
    let (status, metrics) = http::get(h.admin_port, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    assert!(
        metric(
            &metrics,
            "berth_agent_sync_duration_seconds_count{kind=\"full\"}"
        ) >= 1.0,
        "{metrics}"
    );
    assert!(
        metric(
            &metrics,
            "berth_agent_sync_duration_seconds_count{kind=\"partial\"}"
        ) >= 1.0,
        "{metrics}"
    );
    let rules = metric(&metrics, "berth_agent_rules");
    assert_eq!(
        rules as usize,
        h.iptables.lock().berth_ruleset().rule_count()
    );
    assert_eq!(
        metric(
            &metrics,
            "berth_agent_network_programming_duration_seconds_count"
        ),
        1.0,
        "{metrics}"
    );
    let latency = metric(
        &metrics,
        "berth_agent_network_programming_duration_seconds_sum",
    );
    assert!((0.0..60.0).contains(&latency), "{latency}");
    let (server, _) = h.stop().await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn udp_endpoint_removal_clears_conntrack_after_the_sync() {
    let mut h = start(ProxyMode::Full).await;
    h.create(mk_service_json(
        "kube-system",
        "dns",
        "10.96.0.10",
        json!([{"name": "dns", "port": 53, "protocol": "UDP"}]),
    ))
    .await;
    h.create(mk_slice_json(
        "kube-system",
        "dns",
        "dns-1",
        "UDP",
        &[("10.244.1.5", true, NODE), ("10.244.1.6", true, NODE)],
    ))
    .await;
    h.wait_for("dns", |_, ipt| nat(ipt).contains("10.244.1.6:5353"))
        .await;
    Api::<EndpointSlice>::namespaced(h.client.clone(), "kube-system")
        .patch(
            "dns-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"endpoints": [{"addresses": ["10.244.1.5"], "conditions": {"ready": true}, "nodeName": NODE}]})),
        )
        .await
        .unwrap();
    h.wait_for("the endpoint to go", |_, ipt| {
        !nat(ipt).contains("10.244.1.6:5353")
    })
    .await;
    let flows = h.conntrack.0.lock().unwrap().clone();
    assert!(
        flows.contains(&ConntrackFlow::ServiceToEndpoint {
            service_ip: "10.96.0.10".parse().unwrap(),
            endpoint_ip: "10.244.1.6".parse().unwrap(),
        }),
        "{flows:?}"
    );
    let (server, _) = h.stop().await;
    server.shutdown().await.unwrap();
}

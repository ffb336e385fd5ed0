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
    // The health-check port is one the OS hands out, above the default node port range: the
    // agent's range is widened to hold it, as a cluster's range would.
    let port = http::free_port();
    let server = LabApiServer::builder().start().await.unwrap();
    let options = AgentOptions {
        node_port_range: berth_core::PortRange {
            first: port.min(30000),
            last: port.max(32767),
        },
        ..mk_options(ProxyMode::Full)
    };
    let mut h = start_agent(
        server,
        options,
        SharedIptables::new(MemoryIptables::default()),
    )
    .await;
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
    // Liveness is the same sync health.
    assert_eq!(http::get(h.admin_port, "/livez").await.unwrap().0, 503);
    let (_, metrics) = http::get(h.admin_port, "/metrics").await.unwrap();
    let failures = metric(&metrics, "berth_agent_restore_failures_total");
    assert!(failures >= 1.0, "{metrics}");
    let failures = metric(
        &metrics,
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv4\"}",
    );
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

/// `/healthz` until it answers `want` (the Node watch is asynchronous), at most 5 s.
async fn healthz_becomes(port: u16, want: u16) -> u16 {
    let mut code = 0;
    for _ in 0..100 {
        code = http::get(port, "/healthz").await.unwrap().0;
        if code == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    code
}

#[tokio::test]
async fn healthz_fails_while_the_node_is_to_be_deleted_and_livez_does_not() {
    let server = LabApiServer::builder().start().await.unwrap();
    let mut h = start_agent(
        server,
        mk_options(ProxyMode::Full),
        SharedIptables::new(MemoryIptables::default()),
    )
    .await;
    h.create(mk_node_json(NODE, "198.18.0.11")).await;
    h.wait_for("the first sync", |s, _| synced(s)).await;
    assert_eq!(healthz_becomes(h.admin_port, 200).await, 200);

    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(h.client.clone());
    let taint = |taints: serde_json::Value| json!({"spec": {"taints": taints}});
    nodes
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(taint(json!([
                {"key": "ToBeDeletedByClusterAutoscaler", "value": "1700000000", "effect": "NoSchedule"}
            ]))),
        )
        .await
        .unwrap();
    assert_eq!(healthz_becomes(h.admin_port, 503).await, 503);
    let (_, body) = http::get(h.admin_port, "/healthz").await.unwrap();
    assert!(body.contains("being deleted"), "{body}");
    assert_eq!(http::get(h.admin_port, "/livez").await.unwrap().0, 200);

    // Another taint is no reason; the autoscaler's removed, the node serves again.
    nodes
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(taint(json!([
                {"key": "example.com/other", "effect": "NoSchedule"}
            ]))),
        )
        .await
        .unwrap();
    assert_eq!(healthz_becomes(h.admin_port, 200).await, 200);
    let (server, _) = h.stop().await;
    server.shutdown().await.unwrap();
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in\n{text}"))
}

/// The same facts under kube-proxy's names, types, labels and buckets (`pkg/proxy/metrics`).
fn assert_kube_proxy_names(metrics: &str, rules: f64) {
    let v4 = "{ip_family=\"IPv4\"}";
    for (name, kind) in [
        ("kubeproxy_sync_proxy_rules_duration_seconds", "histogram"),
        (
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "histogram",
        ),
        (
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "histogram",
        ),
        (
            "kubeproxy_network_programming_duration_seconds",
            "histogram",
        ),
        ("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "gauge"),
        ("kubeproxy_sync_proxy_rules_iptables_total", "gauge"),
        (
            "kubeproxy_sync_proxy_rules_iptables_restore_failures",
            "counter",
        ),
    ] {
        assert!(
            metrics.contains(&format!("# TYPE {name} {kind}\n")),
            "{name} {kind}: {metrics}"
        );
    }
    let count = |name: &str| metric(metrics, &format!("{name}_count{v4}"));
    assert!(count("kubeproxy_sync_proxy_rules_duration_seconds") >= 2.0);
    assert!(count("kubeproxy_sync_full_proxy_rules_duration_seconds") >= 1.0);
    assert!(count("kubeproxy_sync_partial_proxy_rules_duration_seconds") >= 1.0);
    assert_eq!(
        count("kubeproxy_network_programming_duration_seconds"),
        1.0,
        "{metrics}"
    );
    // kube-proxy's buckets: 1 ms doubling, and the programming latency's 0 to 5 min.
    assert!(
        metrics.contains(
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.001\",ip_family=\"IPv4\"}"
        ) || metrics.contains(
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.001\"}"
        ),
        "{metrics}"
    );
    let buckets = metrics
        .lines()
        .filter(|l| l.starts_with("kubeproxy_network_programming_duration_seconds_bucket"))
        .count();
    assert_eq!(buckets, 82, "81 bounds and +Inf: {metrics}");
    let synced_at = metric(
        metrics,
        &format!("kubeproxy_sync_proxy_rules_last_timestamp_seconds{v4}"),
    );
    let now = chrono::Utc::now().timestamp() as f64;
    assert!(
        (now - 120.0..=now + 1.0).contains(&synced_at),
        "{synced_at}"
    );
    let by_table: f64 = ["filter", "nat", "mangle"]
        .iter()
        .map(|table| {
            let name = format!(
                "kubeproxy_sync_proxy_rules_iptables_total{{ip_family=\"IPv4\",table=\"{table}\"}}"
            );
            metrics
                .lines()
                .find_map(|line| line.strip_prefix(name.as_str())?.trim().parse().ok())
                .unwrap_or(0.0)
        })
        .sum();
    assert_eq!(by_table, rules, "{metrics}");
    assert_eq!(
        metric(
            metrics,
            &format!("kubeproxy_sync_proxy_rules_iptables_restore_failures_total{v4}")
        ),
        0.0
    );
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
    assert_kube_proxy_names(&metrics, rules);
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

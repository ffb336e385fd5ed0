//! Health-check targets from the view, the response, and real servers on 127.0.0.1.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use berth_agent::healthcheck::{
    build_health_targets, health_response, HealthCheckServers, HealthTarget,
};
use berth_agent::index::Index;
use berth_agent::schedule::AgentHealth;
use berth_datapath::plan::convert::ProxyMode;
use common::*;

mod http;

fn mk_target(n: usize) -> HealthTarget {
    HealthTarget {
        namespace: "default".into(),
        name: "web".into(),
        local_endpoints: n,
    }
}

#[test]
fn targets_count_ready_endpoints_on_this_node_only() {
    let mut index = Index::new(NODE, ProxyMode::Full, chrono::Utc::now());
    let svc: k8s_openapi::api::core::v1::Service =
        serde_json::from_value(mk_local_lb_json("default", "web", "10.96.0.10", 32000)).unwrap();
    index.apply_service(&svc);
    index.apply_service(&mk_service("default", "plain", "10.96.0.11"));
    index.apply_slice(&mk_slice(
        "default",
        "web",
        "web-a",
        &[
            ("10.244.1.5", true, NODE),
            ("10.244.1.6", false, NODE),
            ("10.244.2.5", true, "node-2"),
        ],
    ));
    let targets = build_health_targets(index.view());
    assert_eq!(targets, BTreeMap::from([(32000, mk_target(1))]));
}

#[test]
fn responses_are_200_only_with_local_endpoints_and_a_healthy_agent() {
    let body = r#"{"localEndpoints":2,"service":{"name":"web","namespace":"default"}}"#;
    assert_eq!(
        health_response(&mk_target(2), true),
        (StatusCode::OK, body.to_string())
    );
    assert_eq!(
        health_response(&mk_target(2), false),
        (StatusCode::SERVICE_UNAVAILABLE, body.to_string())
    );
    let (status, body) = health_response(&mk_target(0), true);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["localEndpoints"], 0);
    assert_eq!(json["service"]["namespace"], "default");
}

#[tokio::test]
async fn servers_start_answer_follow_counts_and_stop() {
    let health = AgentHealth::new(Duration::from_secs(30), Instant::now());
    let mut servers = HealthCheckServers::new("127.0.0.1".parse().unwrap(), health);
    let port = http::free_port();
    servers
        .update(&BTreeMap::from([(port, mk_target(1))]))
        .await;
    assert_eq!(servers.ports(), vec![port]);
    let (status, body) = http::get(port, "/healthz").await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        body,
        r#"{"localEndpoints":1,"service":{"name":"web","namespace":"default"}}"#
    );

    servers
        .update(&BTreeMap::from([(port, mk_target(0))]))
        .await;
    let (status, _) = http::get(port, "/").await.unwrap();
    assert_eq!(status, 503);

    servers.stop_all().await;
    assert!(servers.ports().is_empty());
    assert!(http::get(port, "/").await.is_err(), "still listening");
}

#[tokio::test]
async fn an_unhealthy_agent_answers_503_even_with_endpoints() {
    // Last success long ago: more than two periods.
    let health = AgentHealth::new(Duration::from_millis(1), Instant::now());
    tokio::time::sleep(Duration::from_millis(10)).await;
    let mut servers = HealthCheckServers::new("127.0.0.1".parse().unwrap(), health);
    let port = http::free_port();
    servers
        .update(&BTreeMap::from([(port, mk_target(3))]))
        .await;
    let (status, body) = http::get(port, "/").await.unwrap();
    assert_eq!(status, 503);
    assert!(body.contains(r#""localEndpoints":3"#), "{body}");
    servers.stop_all().await;
}

//! `run_controller` end to end: admin endpoint (`/healthz`, `/readyz`,
//! `/metrics`) on loopback, and a clean stop.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use berth_controller::{run_controller, CancellationToken, RunOptions};
use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn get(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    let code = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((code, body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoint_reports_health_readiness_and_metrics() {
    let (server, client) = start_lab().await;
    create_pool(
        &client,
        "default",
        json!({"addresses": ["198.18.0.200-198.18.0.209"]}),
    )
    .await;
    create_svc(
        &client,
        "web",
        json!({"type": "LoadBalancer", "ports": [{"port": 80}]}),
    )
    .await;
    // A client of its own, as the binary builds one.
    let controller_client = server.client().unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = admin.local_addr().unwrap();
    let mut config = mk_config();
    let mut lease = berth_controller::LeaseConfig::new("kube-system", "admin-test");
    lease.lease_duration = Duration::from_secs(3);
    lease.renew_deadline = Duration::from_secs(2);
    lease.retry_period = Duration::from_millis(200);
    config.lease = Some(lease);
    let token = CancellationToken::new();
    let run = tokio::spawn(run_controller(
        controller_client,
        admin,
        RunOptions {
            aws: None,
            config,
            log_drops: None,
            version: "test".into(),
        },
        token.clone(),
    ));
    wait_until("healthz", || async {
        get(addr, "/healthz").await.is_some_and(|r| r.0 == 200)
    })
    .await;
    wait_svc(&client, "web", "ingress", |s| !ingress_ips(s).is_empty()).await;
    wait_until("ready", || async {
        get(addr, "/readyz").await.is_some_and(|r| r.0 == 200)
    })
    .await;
    wait_until("pool metrics", || async {
        let (_, body) = get(addr, "/metrics").await.unwrap();
        body.contains("berth_controller_pool_addresses{pool=\"default\",family=\"IPv4\",state=\"assigned\"} 1")
    })
    .await;
    let (_, body) = get(addr, "/metrics").await.unwrap();
    for needle in [
        "berth_build_info{version=\"test\"} 1",
        "berth_controller_leader 1",
        "berth_controller_allocations_total{result=\"ok\"}",
        "berth_controller_reconcile_duration_seconds_count{kind=\"service\"}",
        "berth_controller_api_writes_total{kind=\"status\"}",
    ] {
        assert!(body.contains(needle), "{needle} missing from\n{body}");
    }
    token.cancel();
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        get(addr, "/healthz").await.is_none(),
        "the admin endpoint stopped"
    );
    server.shutdown().await.unwrap();
}

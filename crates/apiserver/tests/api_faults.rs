//! Fault injection: errors on mutating calls, latency, and the admin endpoint that changes them.

#![allow(clippy::unwrap_used)]

mod common;

use berth_apiserver::{Faults, LabApiServer};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn mk_cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
}

#[tokio::test]
async fn mutations_fail_at_the_configured_rate_reads_do_not() {
    // 500s only here: kube-rs retries 429s itself (honouring Retry-After), which the raw test below sees.
    let faults = Faults {
        error_rate: 0.5,
        throttle_share: 0.0,
        seed: 9,
        ..Faults::default()
    };
    let server = LabApiServer::builder()
        .faults(faults)
        .start()
        .await
        .unwrap();
    let cms = Api::<ConfigMap>::default_namespaced(server.client().unwrap());
    let (mut ok, mut internal) = (0, 0);
    for i in 0..60 {
        match cms
            .create(&PostParams::default(), &mk_cm(&format!("c{i}")))
            .await
        {
            Ok(_) => ok += 1,
            Err(kube::Error::Api(s)) if s.code == 500 => internal += 1,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(ok > 15 && internal > 15, "ok={ok} 500={internal}");
    for _ in 0..20 {
        cms.list(&Default::default()).await.unwrap();
    }
    server.shutdown().await.unwrap();
}

/// A raw HTTP/1.1 exchange on loopback, to see headers kube-rs does not expose.
fn raw(addr: std::net::SocketAddr, request: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoint_sets_faults_at_run_time() {
    let server = LabApiServer::builder().start().await.unwrap();
    let addr = server.addr();
    let body =
        r#"{"errorRate": 1.0, "throttleShare": 1.0, "retryAfterSeconds": 7, "latencyMs": 200}"#;
    let put = format!("PUT /lab/faults HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    let resp = tokio::task::spawn_blocking(move || raw(addr, &put))
        .await
        .unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert_eq!(server.faults().retry_after_seconds, 7);

    let create = "POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 26\r\nConnection: close\r\n\r\n{\"metadata\":{\"name\":\"x\"}}\n";
    let started = Instant::now();
    let resp = tokio::task::spawn_blocking(move || raw(addr, create))
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "latency was added"
    );
    assert!(resp.starts_with("HTTP/1.1 429"), "{resp}");
    assert!(
        resp.to_ascii_lowercase().contains("retry-after: 7"),
        "{resp}"
    );

    let bad = "PUT /lab/faults HTTP/1.1\r\nHost: x\r\nContent-Length: 17\r\nConnection: close\r\n\r\n{\"errorRate\": 2 }";
    let resp = tokio::task::spawn_blocking(move || raw(addr, bad))
        .await
        .unwrap();
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp}");

    server.set_faults(Faults::default()).unwrap();
    let cms = Api::<ConfigMap>::default_namespaced(server.client().unwrap());
    cms.create(&PostParams::default(), &mk_cm("fine"))
        .await
        .unwrap();
    server.shutdown().await.unwrap();
}

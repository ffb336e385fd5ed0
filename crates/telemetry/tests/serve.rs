//! The admin endpoint over a real socket on 127.0.0.1.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use berth_telemetry::{admin_router, serve_admin, MetricsRegistry, Readiness};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: berth\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

#[tokio::test]
async fn serves_on_loopback_until_shutdown() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let readiness = Readiness::new();
    let check = readiness.register("leader").unwrap();
    let mut metrics = MetricsRegistry::new();
    metrics.register_build_info("0.0.0-test");
    let router = admin_router(metrics.into_shared(), readiness.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_admin(listener, router, async {
        let _ = stopped.await;
    }));

    let response = get(addr, "/readyz").await;
    assert!(response.starts_with("HTTP/1.1 503"), "{response}");
    assert!(response.contains("[-]leader failed"), "{response}");

    check.set_ready(true);
    let response = get(addr, "/readyz").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");

    let response = get(addr, "/metrics").await;
    assert!(
        response.contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{response}"
    );
    assert!(
        response.contains("berth_build_info{version=\"0.0.0-test\"} 1"),
        "{response}"
    );

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("server did not stop after shutdown")
        .unwrap()
        .unwrap();
    assert!(TcpStream::connect(addr).await.is_err());
}

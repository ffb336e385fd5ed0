//! Running the server: several listeners (one pre-bound), kubeconfig, `run_apiserver`, seeding.

#![allow(clippy::unwrap_used)]

mod common;

use berth_apiserver::{run_apiserver, ApiServerOptions, LabApiServer, Listener};
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::Api;
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn serves_on_every_listener_including_a_pre_bound_one() {
    let pre_bound = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let pre_addr = pre_bound.local_addr().unwrap();
    let server = LabApiServer::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .listener(Listener::Bound(pre_bound))
        .start()
        .await
        .unwrap();
    assert_eq!(server.addrs().len(), 2);
    assert_eq!(server.addrs()[1], pre_addr);
    for addr in server.addrs() {
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        Api::<Namespace>::all(client).get("default").await.unwrap();
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn seeded_objects_are_served() {
    let (server, client) = common::start().await;
    let n = server
        .seed((0..3).map(|i| json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": format!("s{i}"), "namespace": "default"}})))
        .unwrap();
    assert_eq!(n, 3);
    assert_eq!(
        Api::<Service>::default_namespaced(client)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len(),
        3
    );
    assert_eq!(
        server
            .seed([json!({"apiVersion": "v9", "kind": "Nope"})])
            .unwrap_err()
            .code,
        400
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn run_apiserver_writes_kubeconfig_and_stops_on_signal() {
    let dir = common::unique_dir("run");
    let kubeconfig = dir.join("kubeconfig");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let opts = ApiServerOptions {
        listeners: vec![Listener::Addr("127.0.0.1:0".parse().unwrap())],
        kubeconfig: Some(kubeconfig.clone()),
        ..Default::default()
    };
    let task = tokio::spawn(run_apiserver(opts, async move {
        let _ = stop_rx.await;
    }));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !kubeconfig.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "kubeconfig not written"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    Api::<Namespace>::all(client)
        .get("kube-system")
        .await
        .unwrap();
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

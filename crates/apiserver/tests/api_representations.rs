//! Representations other than the plain object, through the real kube-rs client: metadata only
//! (`list_metadata`, `get_metadata`, `watch_metadata`), Tables, and 406 for what the lab cannot
//! answer. The kubectl and Python tests cover what those clients print.

#![allow(clippy::unwrap_used)]

mod common;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::{json, Value};

fn mk_svc(name: &str) -> Service {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"app": name}},
        "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}}))
    .unwrap()
}

async fn raw(client: &kube::Client, path: &str, accept: &str) -> Result<Value, kube::Error> {
    let request = http::Request::get(path)
        .header(http::header::ACCEPT, accept)
        .body(Vec::new())
        .unwrap();
    client.request::<Value>(request).await
}

#[tokio::test]
async fn metadata_only_for_list_get_and_watch() {
    let (server, client) = common::start().await;
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &mk_svc("web"))
        .await
        .unwrap();
    let listed = api.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].metadata.name.as_deref(), Some("web"));
    let got = api.get_metadata("web").await.unwrap();
    assert_eq!(got.metadata.labels.unwrap()["app"], "web");
    let rv = listed.metadata.resource_version.unwrap();
    let mut stream = api
        .watch_metadata(&WatchParams::default().timeout(3), &rv)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &mk_svc("late"))
        .await
        .unwrap();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Added(m)) => assert_eq!(m.metadata.name.as_deref(), Some("late")),
        other => panic!("{other:?}"),
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn tables_and_what_is_not_acceptable() {
    let (server, client) = common::start().await;
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &mk_svc("web"))
        .await
        .unwrap();
    let table = raw(
        &client,
        "/api/v1/namespaces/default/services?includeObject=None",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )
    .await
    .unwrap();
    assert_eq!(table["kind"], "Table");
    assert!(table["metadata"]["resourceVersion"].is_string());
    assert_eq!(
        table["rows"][0]["cells"].as_array().unwrap()[..5],
        [
            json!("web"),
            json!("NodePort"),
            json!("<none>"),
            json!("<none>"),
            json!("80:30080/TCP")
        ]
    );
    assert!(table["rows"][0].get("object").is_none());
    let one = raw(
        &client,
        "/api/v1/namespaces/default/services/web",
        "application/json;as=Table;v=v1beta1;g=meta.k8s.io",
    )
    .await
    .unwrap();
    assert_eq!(one["apiVersion"], "meta.k8s.io/v1beta1");
    assert_eq!(one["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    match raw(
        &client,
        "/api/v1/namespaces/default/services",
        "application/vnd.kubernetes.protobuf",
    )
    .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 406),
        other => panic!("{other:?}"),
    }
    server.shutdown().await.unwrap();
}

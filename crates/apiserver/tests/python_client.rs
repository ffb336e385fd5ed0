//! The official Python `kubernetes` client against the lab API server (`kubernetes_client.py`
//! beside this file): Events through both groups, Tables, objects created from protobuf bodies.
//! Skipped, with a message, where Python or its `kubernetes` package is missing; a failure under CI.

#![allow(clippy::unwrap_used)]

mod common;

use berth_apiserver::LabApiServer;
use k8s_pb::api::core::v1 as pb;
use k8s_pb::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions};
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use prost::Message;
use std::path::PathBuf;
use std::process::Command;

/// The project's venv (`make deps`) when there is one, else `python3` from PATH.
fn python() -> Option<PathBuf> {
    let venv = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../.venv/bin/python"
    ));
    let python = if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    };
    let ok = Command::new(&python)
        .args(["-c", "import kubernetes"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(python)
}

/// A missing tool skips the test with a message, except under CI, where it must be there.
fn missing(what: &str) {
    assert!(
        !berth_testing::require::strict(),
        "{what} (required under CI)"
    );
    berth_testing::require::report_skip("python_client", what);
}

/// A Service in the protobuf envelope Go's clients send.
fn protobuf_service(name: &str) -> Vec<u8> {
    let svc = pb::Service {
        metadata: Some(ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        }),
        spec: Some(pb::ServiceSpec {
            r#type: Some("LoadBalancer".to_owned()),
            selector: [("app".to_owned(), name.to_owned())].into(),
            ports: vec![pb::ServicePort {
                port: Some(80),
                target_port: Some(IntOrString {
                    r#type: Some(0),
                    int_val: Some(8080),
                    str_val: None,
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    };
    envelope("v1", "Service", svc.encode_to_vec())
}

/// A message in the `k8s\0` + `runtime.Unknown` envelope.
fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let envelope = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.to_owned()),
            kind: Some(kind.to_owned()),
        }),
        raw: Some(raw),
        content_encoding: None,
        content_type: None,
    };
    let mut body = b"k8s\x00".to_vec();
    body.extend(envelope.encode_to_vec());
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_sees_a_cluster() {
    let Some(python) = python() else {
        missing("Python with the `kubernetes` package is not installed (make deps-python)");
        return;
    };
    let server = LabApiServer::builder().start().await.unwrap();
    let client = server.client().unwrap();
    let request = http::Request::post("/api/v1/namespaces/default/services")
        .header(
            http::header::CONTENT_TYPE,
            "application/vnd.kubernetes.protobuf",
        )
        .header(
            http::header::ACCEPT,
            "application/vnd.kubernetes.protobuf,application/json",
        )
        .body(protobuf_service("proto"))
        .unwrap();
    let created: serde_json::Value = client.request(request).await.unwrap();
    assert_eq!(created["spec"]["ports"][0]["targetPort"], 8080);

    let dir = common::unique_dir("python");
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kubernetes_client.py");
    let out = tokio::process::Command::new(&python)
        .arg(script)
        .arg(&kubeconfig)
        .env("HOME", &dir)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("python-client: ok"),
        "{script} failed:\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Go clients delete with protobuf DeleteOptions: a wrong uid precondition is a conflict.
    for (uid, code) in [
        ("not-its-uid", 409),
        (created["metadata"]["uid"].as_str().unwrap(), 200),
    ] {
        let opts = DeleteOptions {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..Default::default()
        };
        let request = http::Request::delete("/api/v1/namespaces/default/services/proto")
            .header(
                http::header::CONTENT_TYPE,
                "application/vnd.kubernetes.protobuf",
            )
            .body(envelope("v1", "DeleteOptions", opts.encode_to_vec()))
            .unwrap();
        match client.request::<serde_json::Value>(request).await {
            Ok(_) => assert_eq!(code, 200),
            Err(kube::Error::Api(status)) => assert_eq!(status.code, code, "{status:?}"),
            Err(e) => panic!("{e}"),
        }
    }
    server.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

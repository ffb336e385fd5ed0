//! The request log over HTTP: `GET /lab/requests` lists what each client asked, in RBAC's terms,
//! told apart by bearer token or user agent; `DELETE` empties it; off unless asked for.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::SocketAddr;

use berth_apiserver::LabApiServer;
use serde_json::Value;

/// One HTTP/1.1 request on loopback; the response body as JSON (or the status line on failure).
async fn call(addr: SocketAddr, request: String) -> Value {
    let text = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap();
    assert!(text.starts_with("HTTP/1.1 20"), "{text}");
    let body = text.split_once("\r\n\r\n").unwrap().1;
    serde_json::from_str(body).unwrap_or(Value::Null)
}

fn request(method: &str, path: &str, header: &str, body: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{header}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_recorded_per_client() {
    let server = LabApiServer::builder()
        .record_requests(true)
        .start()
        .await
        .unwrap();
    let addr = server.addr();
    let cm = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}"#;
    let as_agent = "Authorization: Bearer agent\r\n";
    call(
        addr,
        request(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            as_agent,
            cm,
        ),
    )
    .await;
    call(
        addr,
        request(
            "GET",
            "/api/v1/namespaces/default/configmaps/a",
            as_agent,
            "",
        ),
    )
    .await;
    call(
        addr,
        request(
            "GET",
            "/api/v1/namespaces/default/configmaps/a",
            as_agent,
            "",
        ),
    )
    .await;
    call(
        addr,
        request("GET", "/api/v1/configmaps", "User-Agent: tool/1\r\n", ""),
    )
    .await;
    // Discovery and the admin paths are not API requests on resources.
    call(addr, request("GET", "/api/v1", as_agent, "")).await;

    let log = call(addr, request("GET", "/lab/requests", "", "")).await;
    assert_eq!(log["enabled"], true);
    let seen: Vec<(String, String, String, String, u64)> = log["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["identity"].as_str().unwrap().to_owned(),
                r["verb"].as_str().unwrap().to_owned(),
                r["resource"].as_str().unwrap().to_owned(),
                r["namespace"].as_str().unwrap().to_owned(),
                r["count"].as_u64().unwrap(),
            )
        })
        .collect();
    let row = |id: &str, verb: &str, ns: &str, n: u64| {
        (
            id.to_owned(),
            verb.to_owned(),
            "configmaps".to_owned(),
            ns.to_owned(),
            n,
        )
    };
    assert_eq!(
        seen,
        [
            row("agent", "create", "default", 1),
            row("agent", "get", "default", 2),
            row("tool/1", "list", "", 1),
        ]
    );
    assert_eq!(server.recorded_requests().len(), 3);

    call(addr, request("DELETE", "/lab/requests", "", "")).await;
    assert!(server.recorded_requests().is_empty());
    server.shutdown().await.unwrap();
}

/// A server-side apply that creates its object is also a `create` to the RBAC authorizer (upstream
/// checks both verbs); one that changes an existing object is a `patch` only, as is a merge patch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_that_creates_is_also_a_create() {
    let server = LabApiServer::builder()
        .record_requests(true)
        .start()
        .await
        .unwrap();
    let addr = server.addr();
    let apply = |data: &str| {
        let body = format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"a"}},"data":{{"k":"{data}"}}}}"#
        );
        format!(
            "PATCH /api/v1/namespaces/default/configmaps/a?fieldManager=t HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer agent\r\nContent-Type: application/apply-patch+yaml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    call(addr, apply("1")).await;
    call(addr, apply("2")).await;
    call(
        addr,
        request(
            "PATCH",
            "/api/v1/namespaces/default/configmaps/a",
            "Authorization: Bearer agent\r\n",
            r#"{"data":{"k":"3"}}"#,
        )
        .replace("application/json", "application/merge-patch+json"),
    )
    .await;
    let seen: Vec<(String, u64)> = server
        .recorded_requests()
        .iter()
        .map(|r| (r.verb.clone(), r.count))
        .collect();
    assert_eq!(seen, [("create".to_owned(), 1), ("patch".to_owned(), 3)]);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_recorded_unless_asked() {
    let server = LabApiServer::builder().start().await.unwrap();
    let addr = server.addr();
    call(addr, request("GET", "/api/v1/configmaps", "", "")).await;
    let log = call(addr, request("GET", "/lab/requests", "", "")).await;
    assert_eq!(log["enabled"], false);
    assert_eq!(log["requests"], Value::Array(Vec::new()));
    server.shutdown().await.unwrap();
}

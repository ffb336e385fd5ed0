//! The API server listening inside a network namespace, as the lab's control-plane namespace
//! needs. Needs root and iproute2: each test makes one namespace named `berth-t<pid>-api<n>`, uses
//! only its loopback, and deletes it afterwards (also when the test fails). Skips with a message
//! elsewhere (fails under `CI=true`).

#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use berth_lab::netns::bind_tcp_in_netns;
use berth_lab::{LabApiServer, Listener};

/// Deletes the namespace when dropped, so a failing assertion cleans up too.
struct TempNetns(String);

impl TempNetns {
    fn create() -> Option<Self> {
        if !berth_testing::require(&[berth_testing::Requirement::Netns]) {
            return None;
        }
        // Tests run in parallel: each takes its own namespace.
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("berth-t{}-api{n}", std::process::id());
        let made = Command::new("ip").args(["netns", "add", &name]).status();
        assert!(
            made.is_ok_and(|s| s.success()),
            "`ip netns add {name}` failed"
        );
        let ns = TempNetns(name);
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        Some(ns)
    }

    fn exec(&self, args: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for TempNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

#[tokio::test]
async fn serves_inside_a_namespace_and_on_the_hosts_loopback() {
    let Some(ns) = TempNetns::create() else {
        return;
    };
    let inside = bind_tcp_in_netns(&ns.0, "127.0.0.1:0".parse().unwrap()).unwrap();
    let inside_addr = inside.local_addr().unwrap();
    let server = LabApiServer::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .listener(Listener::Bound(inside))
        .start()
        .await
        .unwrap();

    // From inside the namespace, the namespaced socket answers.
    let url = format!("http://{inside_addr}/version");
    let out = tokio::task::spawn_blocking({
        let name = ns.0.clone();
        move || {
            Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &name,
                    "curl",
                    "-sS",
                    "--max-time",
                    "5",
                    &url,
                ])
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "curl inside the namespace: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let version: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(version.get("gitVersion").is_some(), "{version}");

    // The host-side listener is a separate socket in the root namespace's loopback.
    let host = server.addrs()[0];
    let body = plain_http_get(host).await;
    assert!(body.contains("gitVersion"), "{body}");

    server.shutdown().await.unwrap();
    drop(ns);
}

/// A bare HTTP/1.1 GET, so the test needs no extra client crate.
async fn plain_http_get(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /version HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    buf
}

#[test]
fn binding_in_a_namespace_never_moves_the_calling_thread() {
    let Some(ns) = TempNetns::create() else {
        return;
    };
    let before = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
    let _listener = bind_tcp_in_netns(&ns.0, "127.0.0.1:0".parse().unwrap()).unwrap();
    assert_eq!(
        std::fs::read_link("/proc/thread-self/ns/net").unwrap(),
        before
    );
    // The socket is listed in the namespace's own socket table.
    let ss = ns.exec(&["ss", "-ltnH"]);
    assert!(
        String::from_utf8_lossy(&ss.stdout).contains("127.0.0.1:"),
        "{}",
        String::from_utf8_lossy(&ss.stdout)
    );
}

//! `berth lab apiserver --listen-netns NAME=ADDRESS` serves inside the named namespace. Needs
//! root and iproute2: it makes one namespace named `berth-t<pid>-cli`, uses only its loopback,
//! and deletes it afterwards (also when the test fails). Skips with a message elsewhere
//! (fails under `CI=true`).

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Deletes the namespace when dropped, so a failing assertion cleans up too.
struct TempNetns(String);

impl TempNetns {
    fn create() -> Option<Self> {
        if !berth_testing::require(&[berth_testing::Requirement::Netns]) {
            return None;
        }
        let name = format!("berth-t{}-cli", std::process::id());
        let made = Command::new("ip").args(["netns", "add", &name]).status();
        assert!(
            made.is_ok_and(|s| s.success()),
            "`ip netns add {name}` failed"
        );
        let ns = TempNetns(name);
        let up = Command::new("ip")
            .args(["-n", &ns.0, "link", "set", "lo", "up"])
            .status()
            .unwrap();
        assert!(up.success(), "bringing up the namespace's loopback");
        Some(ns)
    }
}

impl Drop for TempNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

/// Stops the server when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The status line of `GET /version`, asked from inside the namespace.
fn version_status(netns: &str, addr: SocketAddr) -> Option<String> {
    let mut stream =
        berth_lab::netns::connect_tcp_in_netns(netns, addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let request = "GET /version HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer.lines().next().map(str::to_owned)
}

#[test]
fn the_lab_api_server_listens_inside_the_named_namespace() {
    let Some(ns) = TempNetns::create() else {
        return;
    };
    // The namespace is the test's own, so any port is free there.
    let inside: SocketAddr = "127.0.0.1:6443".parse().unwrap();
    let _server = Server(
        Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["lab", "apiserver", "--listen-netns"])
            .arg(format!("{}={inside}", ns.0))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = version_status(&ns.0, inside) {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "nothing answered on {inside} inside {}",
            ns.0
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.contains(" 200 "), "{status}");
}

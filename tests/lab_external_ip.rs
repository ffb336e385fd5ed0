//! A tenant Service asking for the lab API server's LAN address and port (198.18.0.2:6443) as
//! an external IP: with no external IP CIDR allowed (the default), the Service's ClusterIP
//! reaches the tenant's pod from a node, and the same node still reaches the real API server at
//! 198.18.0.2:6443. Needs root, namespaces and iptables: the lab is named `x<pid>` (namespaces
//! `berth-x<pid>-*`) and removed when the test ends, also on failure. Skips with a message
//! elsewhere, and fails instead under CI=true or BERTH_REQUIRE_ROOT=1.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use berth_testing::Requirement;

const BERTH: &str = env!("CARGO_BIN_EXE_berth");

struct Quiet;

impl berth_lab::cluster::Progress for Quiet {
    fn start(&self, _: &str) {}
    fn done(&self, _: &str) {}
}

/// `curl` from a namespace; the body, or the error.
fn curl_from(netns: &str, url: &str) -> String {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            netns,
            "curl",
            "-s",
            "--http0.9",
            "--max-time",
            "3",
            url,
        ])
        .output()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_external_ip_on_the_api_servers_address_takes_nothing() {
    if !berth_testing::require(&[Requirement::Netns, Requirement::Iptables]) {
        return;
    }
    let name = format!("x{}", std::process::id());
    let dir = std::env::temp_dir().join(format!("berth-lab-test-{name}"));
    let opts = berth_lab::cluster::UpOptions {
        name,
        nodes: 1,
        families: berth_lab::cluster::plan::LabFamilies::Ipv4,
        state_dir: dir,
        exe: BERTH.into(),
        timeout: Duration::from_secs(60),
        bgp: false,
    };
    // Dropped at the end or on a failure: stops every process, deletes every namespace.
    let lab = berth_lab::cluster::Lab::start(&opts, &Quiet).await.unwrap();
    let node = lab.layout().nodes[0].netns.clone();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lab-external-ip");
    lab.apply(&fixture).await.unwrap();

    // The agent programmed the tenant's Service: its ClusterIP answers from its pod.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    while Instant::now() < deadline {
        last = curl_from(&node, "http://10.96.0.77:6443/");
        if last.contains("thief") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(last.contains("thief"), "the tenant's ClusterIP: {last}");

    // The external IP was left out: the node reaches the real API server, not the pod.
    let version = curl_from(&node, "http://198.18.0.2:6443/version");
    assert!(
        version.contains("gitVersion") && !version.contains("thief"),
        "the API server from {node}: {version}"
    );
    tokio::task::spawn_blocking(move || lab.stop(false))
        .await
        .unwrap()
        .unwrap();
}

//! `berth lab up / down` as processes: a lab proves a NodePort Service from its client and
//! leaves nothing behind; the examples are proven through every address of every Service on a
//! dual-stack lab (the default) and an IPv6-only one; `down` removes everything after `up` was SIGKILLed; a second `up`
//! refuses while the first runs. Needs root and iproute2/iptables: each lab is named
//! `t<pid><n>` (namespaces `berth-t<pid><n>-*`) with its own state directory. Skips with a
//! message elsewhere (berth-testing's `require`), and fails instead under CI=true or
//! BERTH_REQUIRE_ROOT=1.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use berth_testing::Requirement;

/// One lab at a time: each takes the machine's two cores for a few seconds.
static SERIAL: Mutex<()> = Mutex::new(());

const BERTH: &str = env!("CARGO_BIN_EXE_berth");

/// What a lab needs: root, namespaces and iptables (the agents program it). A missing one skips
/// the test with its reason, or fails it under CI=true or BERTH_REQUIRE_ROOT=1.
fn lab_ready() -> bool {
    berth_testing::require(&[Requirement::Netns, Requirement::Iptables])
}

/// A lab's name and state directory; dropping it runs `lab down`, so a failing test cleans up.
struct LabName {
    name: String,
    dir: PathBuf,
}

impl LabName {
    fn new(n: u32) -> Self {
        let name = format!("t{}{n}", std::process::id());
        let dir = std::env::temp_dir().join(format!("berth-lab-test-{name}"));
        LabName { name, dir }
    }

    fn args<'a>(&'a self, verb: &'a str) -> Vec<String> {
        vec![
            "lab".into(),
            verb.into(),
            "--name".into(),
            self.name.clone(),
            "--state-dir".into(),
            self.dir.display().to_string(),
        ]
    }

    fn run(&self, verb: &str, extra: &[&str]) -> Output {
        Command::new(BERTH)
            .args(self.args(verb))
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn namespaces(&self) -> Vec<String> {
        let prefix = format!("berth-{}-", self.name);
        std::fs::read_dir("/run/netns")
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| n.starts_with(&prefix))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for LabName {
    fn drop(&mut self) {
        let _ = self.run("down", &[]);
    }
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lab-nodeport")
}

#[test]
fn up_once_proves_a_node_port_from_the_client_and_leaves_nothing() {
    if !lab_ready() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = LabName::new(1);
    let fixture = fixture();
    let out = lab.run(
        "up",
        &[
            "--nodes",
            "2",
            "--once",
            "--timeout",
            "60s",
            "--apply",
            fixture.to_str().unwrap(),
        ],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let node_port = stdout
        .lines()
        .find(|l| l.contains("NodePort 198.18.0.11:") && l.contains("from client"))
        .unwrap_or_else(|| panic!("no node port request in:\n{stdout}"));
    assert!(node_port.contains("pod web-"), "{node_port}");
    let cluster_ip = stdout
        .lines()
        .find(|l| l.contains("ClusterIP 10.96.") && l.contains("from node1"))
        .unwrap_or_else(|| panic!("no ClusterIP request in:\n{stdout}"));
    assert!(cluster_ip.contains("pod web-"), "{cluster_ip}");
    assert!(stdout.contains("default/web"), "{stdout}");
    assert!(lab.namespaces().is_empty(), "{:?}", lab.namespaces());
    assert!(!lab.dir.exists());
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// The request lines of a proof, e.g. `LoadBalancer [fd00:198:18::200]:80 from client: ...`.
fn requests(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .map(str::trim)
        .filter(|l| l.contains(" from ") && l.contains("answered"))
        .collect()
}

/// Whether `lines` hold an answered request of `path` to an address starting with `addr`.
fn answered(lines: &[&str], path: &str, addr: &str) -> bool {
    lines
        .iter()
        .any(|l| l.starts_with(&format!("{path} {addr}")) && l.contains(": pod echo-"))
}

#[test]
fn up_once_proves_the_examples_through_both_families_and_through_ipv6_alone() {
    if !lab_ready() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = LabName::new(3);
    let examples = examples();
    let up = |family: &str| {
        lab.run(
            "up",
            &[
                "--nodes",
                "2",
                "--ip-family",
                family,
                "--once",
                "--timeout",
                "60s",
                "--apply",
                examples.to_str().unwrap(),
            ],
        )
    };

    // Dual stack (the default family, named here): the dual-stack Service answers on its IPv4
    // and IPv6 LoadBalancer addresses (ARP and NDP), on both node-port families and on both
    // ClusterIPs; the single-stack one stays IPv4.
    let out = up("dual");
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}
{}",
        text(&out.stderr)
    );
    let lines = requests(&stdout);
    for (path, addr) in [
        ("LoadBalancer", "198.18.0.2"),
        ("LoadBalancer", "[fd00:198:18::2"),
        ("NodePort", "198.18.0.11:"),
        ("NodePort", "[fd00:198:18::11]:"),
        ("ClusterIP", "10.96."),
        ("ClusterIP", "[fd00:96::"),
    ] {
        assert!(
            answered(&lines, path, addr),
            "no {path} {addr} in:
{stdout}"
        );
    }
    assert_eq!(
        lines.len(),
        3 + 6,
        "echo: 3 ways in, echo-dual: 6
{stdout}"
    );
    let dual_row = stdout
        .lines()
        .find(|l| l.starts_with("default/echo-dual"))
        .unwrap_or_else(|| {
            panic!(
                "no echo-dual row in:
{stdout}"
            )
        });
    assert!(
        dual_row.contains("198.18.0.2") && dual_row.contains("fd00:198:18::2"),
        "{dual_row}"
    );
    assert!(lab.namespaces().is_empty(), "{:?}", lab.namespaces());

    // IPv6 only: every Service, the single-stack one too, answers over IPv6 alone.
    let out = up("ipv6");
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}
{}",
        text(&out.stderr)
    );
    let lines = requests(&stdout);
    assert_eq!(lines.len(), 2 * 3, "{stdout}");
    assert!(
        lines.iter().all(|l| l
            .split_whitespace()
            .nth(1)
            .is_some_and(|a| a.starts_with('['))),
        "an IPv4 way in on an IPv6-only lab:
{stdout}"
    );
    assert!(
        answered(&lines, "LoadBalancer", "[fd00:198:18::2"),
        "{stdout}"
    );
    assert!(lab.namespaces().is_empty(), "{:?}", lab.namespaces());
    assert!(!lab.dir.exists());
}

/// The process recorded in lab.json under `name`, and whether it runs.
fn recorded_pids(dir: &Path) -> Vec<u32> {
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("lab.json")).unwrap()).unwrap();
    let mut pids = vec![state["up"]["pid"].as_u64().unwrap() as u32];
    for c in state["components"].as_array().unwrap() {
        pids.push(c["pid"].as_u64().unwrap() as u32);
    }
    pids
}

#[test]
fn down_after_a_sigkilled_up_leaves_nothing_and_a_second_up_refuses_meanwhile() {
    if !lab_ready() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = LabName::new(2);
    let fixture = fixture();
    let mut up = Command::new(BERTH)
        .args(lab.args("up"))
        .args(["--nodes", "2", "--timeout", "60s", "--apply"])
        .arg(&fixture)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Up once the kubelet has made the pods' namespaces too.
    let deadline = Instant::now() + Duration::from_secs(90);
    while lab.namespaces().iter().filter(|n| n.contains("-p")).count() < 2 {
        assert!(Instant::now() < deadline, "the lab never ran its pods");
        assert!(up.try_wait().unwrap().is_none(), "lab up exited early");
        std::thread::sleep(Duration::from_millis(200));
    }
    let second = lab.run("up", &["--nodes", "1", "--once"]);
    assert!(!second.status.success());
    assert!(
        text(&second.stderr).contains("already up"),
        "{}",
        text(&second.stderr)
    );

    let pids = recorded_pids(&lab.dir);
    assert_eq!(
        pids.len(),
        1 + 6,
        "up, apiserver, kubelet, controller-manager, controller, two agents"
    );
    up.kill().unwrap();
    up.wait().unwrap();
    assert!(
        !lab.namespaces().is_empty(),
        "SIGKILL leaves the lab behind"
    );

    let down = lab.run("down", &[]);
    assert!(down.status.success(), "{}", text(&down.stderr));
    assert!(
        text(&down.stdout).contains("removed"),
        "{}",
        text(&down.stdout)
    );
    assert!(lab.namespaces().is_empty(), "{:?}", lab.namespaces());
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let running = stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'));
        assert!(!running, "pid {pid} still runs: {stat}");
    }
    assert!(!lab.dir.exists());
    let again = lab.run("down", &[]);
    assert!(
        text(&again.stdout).contains("nothing to remove"),
        "{}",
        text(&again.stdout)
    );
}

//! The FRR side of BGP tests, shared by `crates/bgp`'s FRR lab and the agents' namespace test:
//! FRR's daemons started in a namespace with their sockets in a directory of the test's, its
//! configuration applied with `frr-reload.py` as the agent applies it, questions through
//! `vtysh`, and the router's kernel FIB read back. A command that fails is a broken test
//! machine, so these panic with its output.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Where Debian's `frr` package puts the daemons and `frr-reload.py`.
pub const FRR_DIR: &str = "/usr/lib/frr";
/// The daemons berth's speaker uses, in start order.
pub const DAEMONS: [&str; 3] = ["zebra", "bfdd", "bgpd"];

fn run(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|err| panic!("running {args:?}: {err}"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn text(dir: &Path) -> &str {
    dir.to_str()
        .unwrap_or_else(|| panic!("{} is not UTF-8", dir.display()))
}

/// Puts `client` behind `router` on 198.19.20.0/24 (router `eth1` .1, client `eth0` .100, the
/// client's default route through the router) and makes the router forward, hashing on ports
/// too so one client's connections spread over its ECMP next hops. Both namespaces exist.
pub fn connect_behind_router(router: &str, client: &str) {
    run(&[
        "ip", "-n", router, "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns",
        client,
    ]);
    for (ns, dev, address) in [
        (router, "eth1", "198.19.20.1/24"),
        (client, "eth0", "198.19.20.100/24"),
    ] {
        run(&["ip", "-n", ns, "link", "set", dev, "up"]);
        run(&["ip", "-n", ns, "addr", "add", address, "dev", dev]);
    }
    run(&[
        "ip",
        "-n",
        client,
        "route",
        "add",
        "default",
        "via",
        "198.19.20.1",
    ]);
    for sysctl in [
        "net.ipv4.ip_forward=1",
        "net.ipv4.fib_multipath_hash_policy=1",
    ] {
        run(&["ip", "netns", "exec", router, "sysctl", "-qw", sysctl]);
    }
}

/// Starts zebra, bfdd and bgpd in `ns` with their pid files, vty sockets and logs in `dir`
/// (made, and handed to the frr user) and `config` written to `dir/frr.conf` (not loaded: the
/// daemons start empty, as the chart's sidecar does); waits for their vty sockets.
pub fn start_frr(ns: &str, dir: &Path, config: &str) {
    std::fs::create_dir_all(dir).unwrap_or_else(|err| panic!("{}: {err}", dir.display()));
    std::fs::write(dir.join("frr.conf"), config)
        .unwrap_or_else(|err| panic!("{}: {err}", dir.display()));
    let d = text(dir);
    run(&["chown", "-R", "frr:frr", d]);
    for daemon in DAEMONS {
        run(&[
            "ip",
            "netns",
            "exec",
            ns,
            &format!("{FRR_DIR}/{daemon}"),
            "-d",
            "-u",
            "frr",
            "-g",
            "frr",
            "-i",
            &format!("{d}/{daemon}.pid"),
            "--vty_socket",
            d,
            "-z",
            &format!("{d}/zserv.api"),
            "-f",
            "/dev/null",
            "--log",
            &format!("file:{d}/{daemon}.log"),
        ]);
    }
    let start = Instant::now();
    while !DAEMONS
        .iter()
        .all(|daemon| dir.join(format!("{daemon}.vty")).exists())
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "FRR's vty sockets did not appear in {d}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILLs the daemons whose pid files are in `dir`; quiet about those already gone.
pub fn kill_frr(dir: &Path) {
    for daemon in DAEMONS {
        if let Ok(pid) = std::fs::read_to_string(dir.join(format!("{daemon}.pid"))) {
            let _ = Command::new("kill").args(["-9", pid.trim()]).status();
        }
    }
}

/// Applies `dir/frr.conf` with `frr-reload.py`, as the agent does.
pub fn reload_frr(ns: &str, dir: &Path) {
    let d = text(dir);
    run(&[
        "ip",
        "netns",
        "exec",
        ns,
        "python3",
        &format!("{FRR_DIR}/frr-reload.py"),
        "--reload",
        "--stdout",
        "--vty_socket",
        d,
        "--confdir",
        d,
        "--rundir",
        d,
        &format!("{d}/frr.conf"),
    ]);
}

/// FRR's answer to `command`; empty when vtysh fails (FRR not up yet).
pub fn vtysh(ns: &str, dir: &Path, command: &str) -> String {
    Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "vtysh",
            "--vty_socket",
            text(dir),
            "-c",
            command,
        ])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default()
}

/// The number of IPv4 unicast sessions FRR in `ns` has Established.
pub fn established(ns: &str, dir: &Path) -> usize {
    let summary: serde_json::Value =
        serde_json::from_str(&vtysh(ns, dir, "show bgp ipv4 unicast summary json"))
            .unwrap_or_default();
    summary["peers"]
        .as_object()
        .map(|peers| {
            peers
                .values()
                .filter(|p| p["state"] == "Established")
                .count()
        })
        .unwrap_or(0)
}

/// The next hops of `prefix` (either family) in the kernel FIB of `ns`, sorted.
pub fn fib_next_hops(ns: &str, prefix: &str) -> Vec<String> {
    let family = if prefix.contains(':') { "-6" } else { "-4" };
    let json = Command::new("ip")
        .args([family, "-j", "-n", ns, "route", "show", prefix])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default();
    let routes: serde_json::Value = serde_json::from_str(&json).unwrap_or_default();
    let mut hops = Vec::new();
    for route in routes.as_array().into_iter().flatten() {
        hops.extend(route["gateway"].as_str().map(str::to_string));
        for hop in route["nexthops"].as_array().into_iter().flatten() {
            hops.extend(hop["gateway"].as_str().map(str::to_string));
        }
    }
    hops.sort();
    hops
}

//! The FRR lab shared by `frr_netns` (the test) and `bgp_failover` (the bench): a router
//! namespace running FRR with `maximum-paths`, two node namespaces running FRR configured from
//! `render_frr_config` through `frr-reload.py`, and a holder process per node standing in for the
//! agent (it creates `berth-bgp`, writes the route through `KernelRoutes`, serves TCP on 8080).
//!
//! Address plan: LAN 198.18.0.0/24 (a bridge in `<prefix>-lan`): router 198.18.0.1, node1
//! 198.18.0.11, node2 198.18.0.12. Behind the router, 198.19.20.0/24: router .1, client .100.
//! The BGP pool 198.19.10.0/24 lies outside both, so the client's traffic is really routed.
//! IPv6 on the LAN too, fd00:198:18::/64 (router ::1, nodes ::11 and ::12), with a second
//! session per node over it (MP-BGP, IPv6 unicast) announcing fd00:19:10::5 from the pool
//! fd00:19:10::/120. Nodes speak AS 64512, the router AS 64513.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth_api::{BFDProfileSpec, BGPAdvertisementSpec, BGPPeerSpec};
use berth_bgp::{render_frr_config, KernelRoutes, PoolFacts, SpeakerInput, SpeakerNode};
use berth_core::parse_address;

pub const VIP: &str = "198.19.10.5";
pub const VIP6: &str = "fd00:19:10::5";
pub const ROUTER6: &str = "fd00:198:18::1";
pub const HOLDER_ENV: &str = "BERTH_BGP_TEST_HOLDER";
pub use berth_testing::bgp::FRR_DIR;
pub const NODES: [(&str, &str); 2] = [("node1", "198.18.0.11"), ("node2", "198.18.0.12")];

/// The holder: when this process was re-executed as one (`BERTH_BGP_TEST_HOLDER=<netns>`), holds
/// the routes and serves TCP until killed; otherwise returns at once. Each line `+<prefix>` or
/// `-<prefix>` on its stdin adds or removes a route beside the VIP's, as the agent does for a
/// Service; it answers `DONE` once the kernel has it.
pub fn holder_process() {
    let Ok(netns) = std::env::var(HOLDER_ENV) else {
        return;
    };
    let file = std::fs::File::open(format!("/run/netns/{netns}")).unwrap();
    nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let routes = KernelRoutes::open().await.unwrap();
        let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await.unwrap();
        let mut desired: std::collections::BTreeSet<ipnet::IpNet> = [
            format!("{VIP}/32").parse().unwrap(),
            format!("{VIP6}/128").parse().unwrap(),
        ]
        .into();
        routes.apply_routes(&desired).await.unwrap();
        println!("HOLDER-READY");
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                let reply = format!("{netns}\n");
                tokio::spawn(async move {
                    use tokio::io::AsyncWriteExt;
                    let _ = stream.write_all(reply.as_bytes()).await;
                });
            }
        });
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let (add, prefix) = line.split_at(1);
            let Ok(prefix) = prefix.trim().parse::<ipnet::IpNet>() else {
                continue;
            };
            if add == "+" {
                desired.insert(prefix);
            } else {
                desired.remove(&prefix);
            }
            routes.apply_routes(&desired).await.unwrap();
            println!("DONE");
        }
        // Stdin closed: keep holding until killed.
        std::future::pending::<()>().await;
    });
}

/// Everything the test made, removed on drop (also after a failed assertion).
pub struct Lab {
    pub prefix: String,
    pub dir: PathBuf,
    pub holders: BTreeMap<String, Child>,
    /// Each holder's stdin (route commands) and stdout (their answers).
    pub controls: BTreeMap<
        String,
        (
            std::process::ChildStdin,
            std::io::Lines<BufReader<std::process::ChildStdout>>,
        ),
    >,
}

impl Lab {
    /// Builds the namespaces, starts and configures every FRR, and waits for both sessions.
    /// Names are `berth-<tag><pid>-*`.
    pub fn start(tag: &str) -> Lab {
        let prefix = format!("berth-{tag}{}", std::process::id());
        let dir = std::env::temp_dir().join(&prefix);
        let lab = Lab {
            prefix,
            dir,
            holders: BTreeMap::new(),
            controls: BTreeMap::new(),
        };
        build_topology(&lab);
        start_frr(&lab, "router", &router_config());
        reload_frr(&lab, "router");
        for (name, address) in NODES {
            start_frr(&lab, name, "");
            std::fs::write(
                lab.frr_dir(name).join("frr.conf"),
                node_config(name, address),
            )
            .unwrap();
            reload_frr(&lab, name);
        }
        wait_for(Duration::from_secs(20), "both sessions Established", || {
            established(&lab) == 2
        });
        lab
    }

    pub fn ns(&self, name: &str) -> String {
        format!("{}-{name}", self.prefix)
    }

    pub fn frr_dir(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for child in self.holders.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for name in ["router", "node1", "node2"] {
            berth_testing::bgp::kill_frr(&self.frr_dir(name));
        }
        for name in ["client", "router", "node1", "node2", "lan"] {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(name)])
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn run(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn output(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn skip_reason() -> Option<&'static str> {
    if !nix::unistd::Uid::effective().is_root() {
        return Some("needs root for network namespaces");
    }
    if !Path::new(FRR_DIR).join("bgpd").exists()
        || !Path::new(FRR_DIR).join("frr-reload.py").exists()
    {
        return Some("needs FRR and frr-reload.py (make deps)");
    }
    None
}

pub fn build_topology(lab: &Lab) {
    for name in ["lan", "router", "node1", "node2", "client"] {
        run(&["ip", "netns", "add", &lab.ns(name)]);
        run(&["ip", "-n", &lab.ns(name), "link", "set", "lo", "up"]);
    }
    let lan = lab.ns("lan");
    run(&["ip", "-n", &lan, "link", "add", "br0", "type", "bridge"]);
    run(&["ip", "-n", &lan, "link", "set", "br0", "up"]);
    let members = [("router", "198.18.0.1"), NODES[0], NODES[1]];
    for (i, (name, address)) in members.iter().enumerate() {
        let port = format!("p{i}");
        run(&[
            "ip",
            "-n",
            &lan,
            "link",
            "add",
            &port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &lab.ns(name),
        ]);
        run(&[
            "ip", "-n", &lan, "link", "set", &port, "master", "br0", "up",
        ]);
        run(&["ip", "-n", &lab.ns(name), "link", "set", "eth0", "up"]);
        run(&[
            "ip",
            "-n",
            &lab.ns(name),
            "addr",
            "add",
            &format!("{address}/24"),
            "dev",
            "eth0",
        ]);
        run(&[
            "ip",
            "-n",
            &lab.ns(name),
            "addr",
            "add",
            &format!("{}/64", lan6(address)),
            "dev",
            "eth0",
            "nodad",
        ]);
    }
    let router = lab.ns("router");
    let client = lab.ns("client");
    berth_testing::bgp::connect_behind_router(&router, &client);
    for (name, address) in NODES {
        let ns = lab.ns(name);
        run(&[
            "ip",
            "-n",
            &ns,
            "route",
            "add",
            "default",
            "via",
            "198.18.0.1",
        ]);
        // What the datapath does for the Service: its port on the VIP goes to the backend.
        run(&[
            "ip",
            "netns",
            "exec",
            &ns,
            "iptables",
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-d",
            VIP,
            "-p",
            "tcp",
            "--dport",
            "80",
            "-j",
            "DNAT",
            "--to-destination",
            &format!("{address}:8080"),
        ]);
    }
}

/// A LAN member's IPv6 address: its IPv4 host number in fd00:198:18::/64.
pub fn lan6(v4: &str) -> String {
    format!("fd00:198:18::{}", v4.rsplit('.').next().unwrap())
}

pub fn start_frr(lab: &Lab, name: &str, config: &str) {
    berth_testing::bgp::start_frr(&lab.ns(name), &lab.frr_dir(name), config);
}

/// Applies `frr.conf` through frr-reload.py, as the agent does.
pub fn reload_frr(lab: &Lab, name: &str) {
    berth_testing::bgp::reload_frr(&lab.ns(name), &lab.frr_dir(name));
}

pub fn vtysh(lab: &Lab, name: &str, command: &str) -> String {
    berth_testing::bgp::vtysh(&lab.ns(name), &lab.frr_dir(name), command)
}

/// Configuration commands through vtysh, in `conf t`.
pub fn vtysh_config(lab: &Lab, name: &str, commands: &[&str]) {
    let dir = lab.frr_dir(name);
    let mut args = vec![
        "ip".to_string(),
        "netns".into(),
        "exec".into(),
        lab.ns(name),
        "vtysh".into(),
        "--vty_socket".into(),
        dir.to_str().unwrap().into(),
        "-c".into(),
        "conf t".into(),
    ];
    for c in commands {
        args.push("-c".into());
        args.push((*c).to_string());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run(&args);
}

pub fn wait_for(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The router's next hops for the VIP, from its kernel FIB.
pub fn next_hops(lab: &Lab) -> Vec<String> {
    next_hops_of(lab, &format!("{VIP}/32"))
}

pub fn established(lab: &Lab) -> usize {
    berth_testing::bgp::established(&lab.ns("router"), &lab.frr_dir("router"))
}

/// Whether the router's BFD session with `peer` is up (BFD can only detect what it watches).
pub fn bfd_up(lab: &Lab, peer: &str) -> bool {
    let json = vtysh(lab, "router", "show bfd peers json");
    let peers: serde_json::Value = serde_json::from_str(&json).unwrap_or_default();
    peers
        .as_array()
        .into_iter()
        .flatten()
        .any(|p| p["peer"] == peer && p["status"] == "up")
}

pub fn spawn_holder(lab: &mut Lab, name: &str) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "holder_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HOLDER_ENV, lab.ns(name))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    lab.holders.insert(name.to_string(), child);
    let mut lines = BufReader::new(stdout).lines();
    let ready = lines.any(|l| l.is_ok_and(|l| l.contains("HOLDER-READY")));
    assert!(ready, "the {name} holder did not start");
    lab.controls.insert(name.to_string(), (stdin, lines));
}

/// Makes `name`'s holder add (`true`) or remove a route for `prefix`; returns once it is in
/// the node's kernel.
pub fn holder_route(lab: &mut Lab, name: &str, prefix: &str, add: bool) {
    use std::io::Write;
    let (stdin, lines) = lab.controls.get_mut(name).unwrap();
    writeln!(stdin, "{}{prefix}", if add { '+' } else { '-' }).unwrap();
    stdin.flush().unwrap();
    let done = lines.any(|l| l.is_ok_and(|l| l.contains("DONE")));
    assert!(done, "the {name} holder did not apply {prefix}");
}

/// The router's next hops for `prefix` (either family), from its kernel FIB. IPv6 next hops
/// are the nodes' link-local addresses, as FRR installs them for directly connected peers.
pub fn next_hops_of(lab: &Lab, prefix: &str) -> Vec<String> {
    berth_testing::bgp::fib_next_hops(&lab.ns("router"), prefix)
}

/// Connects from the client to the VIP; the answer names the node that served it.
pub fn fetch_from_client(lab: &Lab) -> Option<String> {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &lab.ns("client"),
            "curl",
            "-s",
            "--max-time",
            "2",
            &format!("telnet://{VIP}:80"),
        ])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!text.is_empty()).then_some(text)
}

pub fn router_config() -> String {
    let mut c = String::from(
        "frr defaults traditional\nhostname router\n!\nrouter bgp 64513\n bgp router-id 198.18.0.1\n \
         no bgp ebgp-requires-policy\n neighbor nodes peer-group\n neighbor nodes remote-as 64512\n \
         neighbor nodes timers 3 9\n neighbor nodes timers connect 1\n neighbor nodes bfd\n neighbor nodes bfd profile fast\n",
    );
    // The IPv6 sessions carry IPv6 unicast only.
    c.push_str(" neighbor nodes6 peer-group\n neighbor nodes6 remote-as 64512\n neighbor nodes6 timers 3 9\n neighbor nodes6 timers connect 1\n");
    for (_, address) in NODES {
        c.push_str(&format!(" neighbor {address} peer-group nodes\n"));
        c.push_str(&format!(" neighbor {} peer-group nodes6\n", lan6(address)));
    }
    c.push_str(" address-family ipv4 unicast\n  no neighbor nodes6 activate\n  maximum-paths 8\n exit-address-family\n");
    c.push_str(" address-family ipv6 unicast\n  neighbor nodes6 activate\n  maximum-paths 8\n exit-address-family\n");
    c.push_str("exit\n!\nbfd\n profile fast\n  receive-interval 100\n  transmit-interval 100\n exit\nexit\n!\nend\n");
    c
}

pub fn node_config(name: &str, address: &str) -> String {
    let node = SpeakerNode {
        name: name.into(),
        labels: BTreeMap::new(),
        router_id: Some(address.parse().unwrap()),
    };
    let router = BGPPeerSpec {
        my_asn: 64512,
        peer_asn: 64513,
        peer_address: "198.18.0.1".into(),
        peer_port: None,
        source_address: None,
        hold_time: None,
        keepalive_time: None,
        connect_time: None,
        router_id: None,
        node_selectors: Vec::new(),
        password_secret: None,
        bfd_profile: Some("fast".into()),
        ebgp_multi_hop: None,
        enable_graceful_restart: None,
    };
    let peers = [
        ("router".to_string(), router.clone()),
        (
            "router6".to_string(),
            BGPPeerSpec {
                peer_address: ROUTER6.into(),
                bfd_profile: None,
                ..router
            },
        ),
    ];
    let profiles = [("fast".to_string(), BFDProfileSpec::default())];
    let advertisements = [(
        "bgp".to_string(),
        BGPAdvertisementSpec {
            ip_pools: vec!["bgp".into()],
            communities: vec!["64512:100".into()],
            ..Default::default()
        },
    )];
    let pools = [PoolFacts {
        name: "bgp".into(),
        labels: BTreeMap::new(),
        ranges: vec![
            parse_address("198.19.10.0/24").unwrap(),
            parse_address("fd00:19:10::/120").unwrap(),
        ],
    }];
    let rendered = render_frr_config(&SpeakerInput {
        node: &node,
        peers: &peers,
        profiles: &profiles,
        advertisements: &advertisements,
        pools: &pools,
        passwords: &BTreeMap::new(),
    });
    assert!(rendered.skipped.is_empty(), "{:?}", rendered.skipped);
    rendered.text
}

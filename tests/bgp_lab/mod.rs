//! The agents' BGP lab, shared by `tests/bgp_netns.rs` and `make bench-bgp`
//! (`benches/bgp_services.rs`): a LAN bridge, two node namespaces each running FRR and a real
//! `berth agent --bgp-speaker` process, the lab API server in a control-plane namespace, and a
//! router namespace on the LAN running its own FRR with `maximum-paths`, with a client namespace
//! behind it. Every namespace is `berth-<tag><pid>-*`, deleted at the end (also on failure), FRR
//! processes killed with it.
//!
//! Address plan: LAN 198.18.0.0/24, nodes n1/n2 at .11/.12, control plane .100 (API :6443),
//! router .101; behind the router 198.19.20.0/24 (router .1, client .100). BGP pool
//! 198.19.10.0/24: `web` 198.19.10.5 (Cluster policy, pods web on n1 and web2 on n2) and `local`
//! 198.19.10.6 (Local policy, its one pod web on n1). Nodes AS 64512, router AS 64513.

#![allow(dead_code, clippy::unwrap_used)]

#[path = "../support/lab_netns.rs"]
mod lab_netns;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth_lab::echo::EchoHandle;
use berth_lab::topology::{Topology, TopologySpec};
use berth_lab::LabApiServer;
use berth_testing::bgp::{fib_next_hops, kill_frr, reload_frr, start_frr};
use berth_testing::Requirement;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};

use lab_netns::{start_api_in_netns, start_echo};

pub const NODES: [(&str, &str); 2] = [("n1", "198.18.0.11"), ("n2", "198.18.0.12")];
pub const VIP: &str = "198.19.10.5";
pub const LOCAL_VIP: &str = "198.19.10.6";
pub const LIMIT: Duration = Duration::from_secs(20);

/// Root, namespaces, iptables and FRR (`vtysh` comes with the daemons); skips or, strictly, fails.
pub fn ready() -> bool {
    berth_testing::require(&[
        Requirement::Netns,
        Requirement::Program("sysctl"),
        Requirement::Iptables,
        Requirement::Program("vtysh"),
    ])
}

/// FRR daemons and agents, killed on drop; the extra `outside` namespace removed.
pub struct Processes {
    pub frr_dirs: Vec<PathBuf>,
    pub agents: BTreeMap<String, Child>,
    pub outside: String,
}

impl Drop for Processes {
    fn drop(&mut self) {
        for child in self.agents.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for dir in &self.frr_dirs {
            kill_frr(dir);
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.outside])
            .status();
    }
}

pub fn run(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn router_config(router_ip: &str, extra: &str) -> String {
    let mut c = format!(
        "frr defaults traditional\nhostname router\n!\nrouter bgp 64513\n bgp router-id {router_ip}\n \
         no bgp ebgp-requires-policy\n neighbor nodes peer-group\n neighbor nodes remote-as 64512\n \
         neighbor nodes timers 3 9\n neighbor nodes bfd\n{extra}"
    );
    for (_, ip) in NODES {
        c.push_str(&format!(" neighbor {ip} peer-group nodes\n"));
    }
    c.push_str(
        " address-family ipv4 unicast\n  maximum-paths 8\n exit-address-family\nexit\n!\nend\n",
    );
    c
}

pub async fn apply(client: &Client, api_version: &str, kind: &str, object: Value) {
    berth_testing::lab::apply_object(client, api_version, kind, object, "bgp-test").await;
}

pub async fn service(
    client: &Client,
    name: &str,
    cluster_ip: &str,
    node_port: u16,
    policy: &str,
    ip: &str,
    endpoints: &[(&str, &str)],
) {
    apply(client, "v1", "Service", json!({
        "metadata": {"namespace": "default", "name": name},
        "spec": {"type": "LoadBalancer", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                 "externalTrafficPolicy": policy,
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": node_port, "protocol": "TCP"}]}
    })).await;
    Api::<Service>::namespaced(client.clone(), "default")
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"loadBalancer": {"ingress": [{"ip": ip, "ipMode": "VIP"}]}}}),
            ),
        )
        .await
        .unwrap();
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(ip, node)| json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": node}))
        .collect();
    apply(
        client,
        "discovery.k8s.io/v1",
        "EndpointSlice",
        json!({
            "metadata": {"namespace": "default", "name": format!("{name}-1"),
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": endpoints
        }),
    )
    .await;
}

/// The router's next hops for `ip`, from its kernel FIB.
pub fn next_hops(router_ns: &str, ip: &str) -> Vec<String> {
    fib_next_hops(router_ns, &format!("{ip}/32"))
}

pub async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Everything a scenario made; dropped in this order, also on failure: the agents and FRR, the
/// echo servers, the namespaces.
pub struct Lab {
    pub procs: Processes,
    pub _echo: Vec<EchoHandle>,
    pub topo: Topology,
    pub server: berth_lab::LabApiServerHandle,
    pub client: Client,
    pub dir: PathBuf,
    pub router: String,
    pub router_dir: PathBuf,
    pub outside: String,
}

impl Lab {
    pub async fn finish(self) {
        let Lab {
            procs,
            _echo,
            topo,
            server,
            client: _,
            dir,
            router: _,
            router_dir: _,
            outside: _,
        } = self;
        drop(procs);
        drop(_echo);
        server.shutdown().await.unwrap();
        topo.destroy().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The topology, the API server with the objects of the address plan, the router's FRR (its
/// neighbor lines for the nodes' peer group extended by `router_extra`) and, on each node, FRR
/// and a `berth agent --bgp-speaker`. The BGPPeer `router` gets `peer_extra` in its spec.
pub async fn start_lab(tag: &str, router_extra: &str, peer_extra: Value) -> Lab {
    let spec = TopologySpec::new(TopologySpec::unique_prefix(tag))
        .node("n1", ["web"])
        .node("n2", ["web2"])
        .client("cp")
        .client("router");
    let mut topo = Topology::create(&spec).unwrap();
    let dir = berth_testing::unique_dir("berth-bgp-netns");
    let cp = topo.netns("cp").unwrap().to_string();
    let router = topo.netns("router").unwrap().to_string();
    let router_ip = topo.layout().client("router").unwrap().ip.to_string();
    let api_addr = format!("{}:6443", topo.layout().client("cp").unwrap().ip);
    let outside = format!("{}-outside", router.trim_end_matches("-router"));
    let mut procs = Processes {
        frr_dirs: Vec::new(),
        agents: BTreeMap::new(),
        outside: outside.clone(),
    };

    // The client sits behind the router; the nodes route the client's network through it.
    run(&["ip", "netns", "add", &outside]);
    run(&["ip", "-n", &outside, "link", "set", "lo", "up"]);
    berth_testing::bgp::connect_behind_router(&router, &outside);
    for (node, _) in NODES {
        let ns = topo.netns(node).unwrap().to_string();
        topo.exec(
            &ns,
            &[
                "ip",
                "route",
                "replace",
                "198.19.20.0/24",
                "via",
                &router_ip,
            ],
        )
        .unwrap();
    }

    let (server, client) = start_api_in_netns(
        LabApiServer::builder(),
        &cp,
        api_addr.parse().unwrap(),
        &dir.join("kubeconfig"),
    )
    .await;

    let echo = start_echo(&topo, &["web", "web2"], 8080);
    for (node, ip) in NODES {
        let node_obj: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}],
                       "conditions": [{"type": "Ready", "status": "True", "reason": "Test"}]}
        }))
        .unwrap();
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node_obj)
            .await
            .unwrap();
    }
    apply(
        &client,
        "berth.dev/v1alpha1",
        "IPPool",
        json!({"metadata": {"name": "bgp"},
        "spec": {"addresses": ["198.19.10.0/24"], "autoAssign": false}}),
    )
    .await;
    apply(
        &client,
        "berth.dev/v1alpha1",
        "BFDProfile",
        json!({"metadata": {"name": "fast"}, "spec": {}}),
    )
    .await;
    let mut peer =
        json!({"myASN": 64512, "peerASN": 64513, "peerAddress": router_ip, "bfdProfile": "fast"});
    for (k, v) in peer_extra.as_object().into_iter().flatten() {
        peer[k] = v.clone();
    }
    apply(
        &client,
        "berth.dev/v1alpha1",
        "BGPPeer",
        json!({"metadata": {"name": "router"}, "spec": peer}),
    )
    .await;
    apply(
        &client,
        "berth.dev/v1alpha1",
        "BGPAdvertisement",
        json!({"metadata": {"name": "bgp"},
        "spec": {"ipPools": ["bgp"], "communities": ["64512:100"]}}),
    )
    .await;
    let web_ip = topo.layout().pod("web").unwrap().1.ip.to_string();
    let web2_ip = topo.layout().pod("web2").unwrap().1.ip.to_string();
    service(
        &client,
        "web",
        "10.96.0.10",
        30080,
        "Cluster",
        VIP,
        &[(&web_ip, "n1"), (&web2_ip, "n2")],
    )
    .await;
    service(
        &client,
        "local",
        "10.96.0.11",
        30081,
        "Local",
        LOCAL_VIP,
        &[(&web_ip, "n1")],
    )
    .await;

    let router_dir = dir.join("frr-router");
    start_frr(
        &router,
        &router_dir,
        &router_config(&router_ip, router_extra),
    );
    procs.frr_dirs.push(router_dir.clone());
    until("the router's vty", || router_dir.join("bgpd.vty").exists()).await;
    reload_frr(&router, &router_dir);
    let bin = env!("CARGO_BIN_EXE_berth");
    for (node, ip) in NODES {
        let ns = topo.netns(node).unwrap().to_string();
        let frr_dir = dir.join(format!("frr-{node}"));
        start_frr(&ns, &frr_dir, "");
        procs.frr_dirs.push(frr_dir.clone());
        let vty = frr_dir.join("bgpd.vty");
        until("a node's vty", || vty.exists()).await;
        let log = std::fs::File::create(dir.join(format!("{node}.log"))).unwrap();
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns,
                bin,
                "agent",
                "--node-name",
                node,
                "--bgp-speaker",
            ])
            .arg("--frr-dir")
            .arg(&frr_dir)
            .args([
                "--cluster-cidr",
                "10.244.0.0/16",
                "--min-sync-interval",
                "100ms",
            ])
            .args([
                "--admin-listen",
                "127.0.0.1:10356",
                "--healthz-bind-address",
                ip,
            ])
            .arg("--kubeconfig")
            .arg(dir.join("kubeconfig"))
            // `BERTH_BGP_LAB_LOG` (e.g. `berth_agent=debug`) to see each sync and pass.
            .env(
                "RUST_LOG",
                std::env::var("BERTH_BGP_LAB_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        procs.agents.insert(node.to_string(), child);
    }
    Lab {
        procs,
        _echo: echo,
        topo,
        server,
        client,
        dir,
        router,
        router_dir,
        outside,
    }
}

//! BGP announcing by the real agents, in real network namespaces: a LAN bridge, two node
//! namespaces each running FRR and a real `berth agent --bgp-speaker` process, the lab API
//! server in a control-plane namespace, and a router namespace on the LAN running its own FRR
//! with `maximum-paths`, with a client namespace behind it. Needs root, iproute2, iptables and
//! FRR; skips with a message elsewhere, and fails instead under `CI=true` or
//! `BERTH_REQUIRE_ROOT=1`. Every namespace is `berth-tb<pid>-*`, deleted at the end (also on
//! failure), FRR processes killed with it.
//!
//! Address plan: LAN 198.18.0.0/24, nodes n1/n2 at .11/.12, control plane .100 (API :6443),
//! router .101; behind the router 198.19.20.0/24 (router .1, client .100). BGP pool
//! 198.19.10.0/24: `web` 198.19.10.5 (Cluster policy, pods web on n1 and web2 on n2) and `local`
//! 198.19.10.6 (Local policy, its one pod web on n1). Nodes AS 64512, router AS 64513.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth_lab::echo::{tcp_echo, EchoHandle, EchoServer};
use berth_lab::netns::bind_tcp_in_netns;
use berth_lab::topology::{Topology, TopologySpec};
use berth_lab::{LabApiServer, Listener};
use berth_testing::bgp::{established, fib_next_hops, kill_frr, reload_frr, start_frr};
use berth_testing::Requirement;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};

const NODES: [(&str, &str); 2] = [("n1", "198.18.0.11"), ("n2", "198.18.0.12")];
const VIP: &str = "198.19.10.5";
const LOCAL_VIP: &str = "198.19.10.6";
const LIMIT: Duration = Duration::from_secs(20);

/// Root, namespaces, iptables and FRR (`vtysh` comes with the daemons); skips or, strictly, fails.
fn ready() -> bool {
    berth_testing::require(&[
        Requirement::Netns,
        Requirement::Program("sysctl"),
        Requirement::Iptables,
        Requirement::Program("vtysh"),
    ])
}

/// FRR daemons and agents, killed on drop; the extra `outside` namespace removed.
struct Processes {
    frr_dirs: Vec<PathBuf>,
    agents: BTreeMap<String, Child>,
    outside: String,
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

fn run(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn router_config(router_ip: &str, extra: &str) -> String {
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

async fn apply(client: &Client, api_version: &str, kind: &str, mut object: Value) {
    object["apiVersion"] = json!(api_version);
    object["kind"] = json!(kind);
    let name = object["metadata"]["name"].as_str().unwrap().to_string();
    let ns = object["metadata"]["namespace"].as_str().map(str::to_string);
    let gvk = kube::core::GroupVersionKind::try_from(&kube::core::TypeMeta {
        api_version: api_version.into(),
        kind: kind.into(),
    })
    .unwrap();
    let (resource, _) = kube::discovery::pinned_kind(client, &gvk).await.unwrap();
    let api: Api<kube::core::DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), &ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    api.patch(
        &name,
        &PatchParams::apply("bgp-test").force(),
        &Patch::Apply(&object),
    )
    .await
    .unwrap_or_else(|err| panic!("applying {kind} {name}: {err}"));
}

async fn service(
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
fn next_hops(router_ns: &str, ip: &str) -> Vec<String> {
    fib_next_hops(router_ns, &format!("{ip}/32"))
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn agents_announce_over_bgp_and_a_killed_agent_withdraws() {
    if !ready() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(scenario());
}

/// Everything a scenario made; dropped in this order, also on failure: the agents and FRR, the
/// echo servers, the namespaces.
struct Lab {
    procs: Processes,
    _echo: Vec<EchoHandle>,
    topo: Topology,
    server: berth_lab::LabApiServerHandle,
    client: Client,
    dir: PathBuf,
    router: String,
    router_dir: PathBuf,
    outside: String,
}

impl Lab {
    async fn finish(self) {
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
async fn start_lab(tag: &str, router_extra: &str, peer_extra: Value) -> Lab {
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

    let inside = bind_tcp_in_netns(&cp, api_addr.parse().unwrap()).unwrap();
    inside.set_nonblocking(true).unwrap();
    let server = LabApiServer::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .listener(Listener::Bound(inside))
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    berth_lab::apiserver::write_kubeconfig(&dir.join("kubeconfig"), &format!("http://{api_addr}"))
        .unwrap();
    berth_testing::install_crds(&client).await;

    let echo: Vec<EchoHandle> = ["web", "web2"]
        .iter()
        .map(|pod| {
            let (_, p) = topo.layout().pod(pod).unwrap();
            let addr = SocketAddr::new(IpAddr::V4(p.ip), 8080);
            EchoServer::bind(topo.netns(pod).unwrap(), pod, Some(addr), None)
                .unwrap()
                .start()
                .unwrap()
        })
        .collect();
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
            .env("RUST_LOG", "info")
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

async fn scenario() {
    let began = Instant::now();
    let mut lab = start_lab("tb", "", json!({})).await;
    let (router, router_dir, outside) = (
        lab.router.clone(),
        lab.router_dir.clone(),
        lab.outside.clone(),
    );
    until("both sessions Established", || {
        established(&router, &router_dir) == 2
    })
    .await;
    until(
        "one next hop per node for the Cluster-policy address",
        || next_hops(&router, VIP) == ["198.18.0.11", "198.18.0.12"],
    )
    .await;
    until("only n1 for the Local-policy address", || {
        next_hops(&router, LOCAL_VIP) == ["198.18.0.11"]
    })
    .await;

    // Through the router and a node's datapath to a pod, from the client behind the router.
    let target: SocketAddr = format!("{VIP}:80").parse().unwrap();
    let mut pods = BTreeMap::<String, usize>::new();
    for _ in 0..12 {
        let ns = outside.clone();
        let reply =
            tokio::task::spawn_blocking(move || tcp_echo(&ns, target, Duration::from_secs(2)))
                .await
                .unwrap()
                .unwrap_or_else(|err| panic!("the client cannot reach {VIP}: {err}"));
        *pods.entry(reply.pod).or_default() += 1;
    }
    assert_eq!(pods.values().sum::<usize>(), 12, "{pods:?}");

    // SIGKILL: the agent's device and routes die with it; the router keeps only n2.
    let mut killed = lab.procs.agents.remove("n1").unwrap();
    let _ = Command::new("kill")
        .args(["-9", &killed.id().to_string()])
        .status();
    let _ = killed.wait();
    let at = Instant::now();
    until("n1's next hop withdrawn", || {
        next_hops(&router, VIP) == ["198.18.0.12"]
    })
    .await;
    let withdrawal = at.elapsed();
    until("the Local-policy address withdrawn", || {
        next_hops(&router, LOCAL_VIP).is_empty()
    })
    .await;
    assert_eq!(
        established(&router, &router_dir),
        2,
        "the killed agent's session stays up"
    );
    let ns = outside.clone();
    tokio::task::spawn_blocking(move || tcp_echo(&ns, target, Duration::from_secs(2)))
        .await
        .unwrap()
        .unwrap_or_else(|err| panic!("the client cannot reach {VIP} through n2: {err}"));

    // A graceful stop withdraws first as well.
    let mut stopped = lab.procs.agents.remove("n2").unwrap();
    let _ = Command::new("kill")
        .args(["-TERM", &stopped.id().to_string()])
        .status();
    let _ = stopped.wait();
    until("n2's next hop withdrawn on a graceful stop", || {
        next_hops(&router, VIP).is_empty()
    })
    .await;
    println!(
        "bgp_netns: SIGKILL withdrawal seen at the router after {withdrawal:?}; whole test {:?}",
        began.elapsed()
    );

    lab.finish().await;
}

/// The node's `BGPSessionState` record of the peer `router`: (BGP state, condition reason,
/// message), once the agent has written it.
async fn session(client: &Client, node: &str) -> Option<(String, String, String)> {
    let api: Api<berth_api::BGPSessionState> = Api::namespaced(client.clone(), "kube-system");
    let record = api
        .get_opt(&berth_bgp::session_record_name(node, "router"))
        .await
        .ok()??;
    let condition = record
        .spec
        .conditions
        .iter()
        .find(|c| c.type_ == "Established")?;
    Some((
        record.spec.bgp_state.clone(),
        condition.reason.clone(),
        condition.message.clone(),
    ))
}

/// Waits until both nodes' records give `reason`; returns n1's message.
async fn both_report(client: &Client, reason: &str) -> String {
    let deadline = Instant::now() + LIMIT;
    loop {
        let n1 = session(client, "n1").await;
        let n2 = session(client, "n2").await;
        if let (Some(a), Some(b)) = (&n1, &n2) {
            if a.1 == reason && b.1 == reason {
                return a.2.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for both records to say {reason}: n1 {n1:?}, n2 {n2:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn patch_peer(client: &Client, spec: Value) {
    let api: Api<berth_api::BGPPeer> = Api::all(client.clone());
    api.patch(
        "router",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": spec })),
    )
    .await
    .unwrap();
}

/// Router connections the nodes ever established, from the router's side.
fn connections_established(router_ns: &str, dir: &Path) -> u64 {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            router_ns,
            "vtysh",
            "--vty_socket",
            dir.to_str().unwrap(),
            "-c",
            "show bgp neighbors json",
        ])
        .output()
        .unwrap();
    let neighbors: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    NODES
        .iter()
        .map(|(_, ip)| {
            neighbors[*ip]["connectionsEstablished"]
                .as_u64()
                .unwrap_or(0)
        })
        .sum()
}

/// Passwords from Secrets against a router that requires one, a wrong AS, and routes that
/// follow the endpoints: a missing Secret leaves the peer out (`NotConfigured`); a wrong password
/// never establishes and says `AuthenticationFailure`; the right one establishes; a wrong
/// peerASN says `BadPeerAS`; a Local-policy address moves with its endpoint from n1 to n2; a
/// deleted Service is withdrawn from the router; a restarted FRR is configured again. About 35 s.
#[test]
fn sessions_report_passwords_and_as_and_routes_follow_endpoints() {
    if !ready() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(sessions_scenario());
}

async fn sessions_scenario() {
    let began = Instant::now();
    // The router requires the password and retries its connections every second, so the nodes'
    // kernels see its signed SYNs and a fixed password establishes at once.
    let lab = start_lab(
        "tp",
        " neighbor nodes password s3cret-Pass\n neighbor nodes timers connect 1\n",
        json!({"passwordSecret": {"name": "bgp-missing"}}),
    )
    .await;
    let client = lab.client.clone();
    // `data` as the API server stores it: base64 of "wrong-Pass" and "s3cret-Pass".
    let secret = |name: &str, password: &str| {
        json!({"metadata": {"namespace": "kube-system", "name": name},
               "type": "kubernetes.io/basic-auth", "data": {"password": password}})
    };
    apply(
        &client,
        "v1",
        "Secret",
        secret("bgp-wrong", "d3JvbmctUGFzcw=="),
    )
    .await;
    apply(
        &client,
        "v1",
        "Secret",
        secret("bgp-right", "czNjcmV0LVBhc3M="),
    )
    .await;

    let missing = both_report(&client, "NotConfigured").await;
    assert!(
        missing.contains("kube-system/bgp-missing does not exist"),
        "{missing}"
    );

    patch_peer(&client, json!({"passwordSecret": {"name": "bgp-wrong"}})).await;
    let wrong = both_report(&client, "AuthenticationFailure").await;
    assert!(wrong.contains("MD5"), "{wrong}");
    // Some more connection attempts by the router; none may establish.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        connections_established(&lab.router, &lab.router_dir),
        0,
        "a session came up with the wrong password"
    );
    for node in ["n1", "n2"] {
        let log = std::fs::read_to_string(lab.dir.join(format!("{node}.log"))).unwrap();
        assert!(
            !log.contains("wrong-Pass") && !log.contains("s3cret-Pass"),
            "{node}'s agent logged a password"
        );
    }

    patch_peer(&client, json!({"passwordSecret": {"name": "bgp-right"}})).await;
    both_report(&client, "Established").await;
    until("both sessions Established at the router", || {
        established(&lab.router, &lab.router_dir) == 2
    })
    .await;

    // A wrong peerASN: the nodes refuse the router's OPEN.
    patch_peer(&client, json!({"peerASN": 64514})).await;
    let bad_as = both_report(&client, "BadPeerAS").await;
    assert!(bad_as.contains("Bad Peer AS"), "{bad_as}");
    let warnings: Vec<String> =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), "default")
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("router"))
            .filter_map(|e| e.reason)
            .collect();
    for reason in ["NotConfigured", "AuthenticationFailure", "BadPeerAS"] {
        assert!(
            warnings.iter().any(|r| r == reason),
            "no Warning Event {reason} on the BGPPeer: {warnings:?}"
        );
    }
    assert_eq!(established(&lab.router, &lab.router_dir), 0);
    patch_peer(&client, json!({"peerASN": 64513})).await;
    both_report(&client, "Established").await;

    // The Local-policy address follows its endpoint from n1 to n2.
    until("n1 announces the Local-policy address", || {
        next_hops(&lab.router, LOCAL_VIP) == ["198.18.0.11"]
    })
    .await;
    let web2_ip = lab.topo.layout().pod("web2").unwrap().1.ip.to_string();
    apply(
        &client,
        "discovery.k8s.io/v1",
        "EndpointSlice",
        json!({
            "metadata": {"namespace": "default", "name": "local-1",
                         "labels": {"kubernetes.io/service-name": "local"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [web2_ip], "conditions": {"ready": true}, "nodeName": "n2"}]
        }),
    )
    .await;
    until("the Local-policy address moved to n2", || {
        next_hops(&lab.router, LOCAL_VIP) == ["198.18.0.12"]
    })
    .await;

    // A deleted Service is withdrawn from every node.
    until("ECMP for the Cluster-policy address", || {
        next_hops(&lab.router, VIP) == ["198.18.0.11", "198.18.0.12"]
    })
    .await;
    Api::<Service>::namespaced(client.clone(), "default")
        .delete("web", &Default::default())
        .await
        .unwrap();
    until("the deleted Service's address withdrawn", || {
        next_hops(&lab.router, VIP).is_empty()
    })
    .await;
    assert_eq!(next_hops(&lab.router, LOCAL_VIP), ["198.18.0.12"]);

    // n1's FRR killed and started again empty, as the kubelet restarts the sidecar: the agent
    // sees the new daemons and configures them again.
    let n1_frr = lab.dir.join("frr-n1");
    kill_frr(&n1_frr);
    until("n1's session down at the router", || {
        established(&lab.router, &lab.router_dir) == 1
    })
    .await;
    start_frr(lab.topo.netns("n1").unwrap(), &n1_frr, "");
    until(
        "n1's session back once its agent configured the new FRR",
        || established(&lab.router, &lab.router_dir) == 2,
    )
    .await;
    both_report(&client, "Established").await;
    println!("bgp_netns sessions: whole test {:?}", began.elapsed());
    lab.finish().await;
}

//! The L2 announcer end to end, in real network namespaces: a LAN bridge, three node namespaces
//! each running a real `berth agent --l2-announcer --membership on` process, a control-plane
//! namespace where the lab API server listens for them, and a client. A capture socket in the
//! client namespace sees every ARP answer on the LAN for the whole test and sends the ARP probes.
//! Needs root, iproute2 and iptables; skips with a message elsewhere, and fails instead under
//! `CI=true` or `BERTH_REQUIRE_ROOT=1`. Every namespace is `berth-tl<pid>-*`, deleted at the end
//! (also on failure).
//!
//! Address plan: LAN 198.18.0.0/24, nodes n1-n3 at .11-.13, client .100, control plane .101
//! (API server on :6443); pods web (n1) 10.244.1.2 and web2 (n2) 10.244.2.2, echo on :8080.
//! Pool `default` 198.18.0.200-198.18.0.239 (advertised), pool `quiet` 198.18.0.240-.250 (not
//! advertised). Services: web .200 (Cluster), local .201 (Local: web and web2), quiet .245,
//! stray .199 (outside every pool).

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_l2::frame::client::{build_arp_request, read_answer};
use berth_l2::frame::Mac;
use berth_l2::{election_key, Link, Listen, PacketLink};
use berth_lab::echo::{tcp_echo, EchoHandle, EchoServer};
use berth_lab::netns::bind_tcp_in_netns;
use berth_lab::topology::{Topology, TopologySpec};
use berth_lab::LabApiServer;
use berth_lab::Listener;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};

const NODES: [&str; 3] = ["n1", "n2", "n3"];
const VIP: &str = "198.18.0.200";
const LOCAL_VIP: &str = "198.18.0.201";
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
const CLIENT_MAC: Mac = [2, 0, 0, 0, 0, 0x64];
const API: &str = "198.18.0.101:6443";
const LIMIT: Duration = Duration::from_secs(20);

fn ready() -> bool {
    let required = std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var("BERTH_REQUIRE_ROOT").is_ok_and(|v| v == "1");
    if berth_testing::netns_ready(&["ip", "iptables-restore", "iptables-save"]) {
        return true;
    }
    assert!(
        !required,
        "network namespaces are required (CI=true or BERTH_REQUIRE_ROOT=1)"
    );
    false
}

fn owner_among(candidates: &[&str], ip: &str) -> String {
    let ip: IpAddr = ip.parse().unwrap();
    candidates
        .iter()
        .min_by_key(|n| election_key(n, ip))
        .unwrap()
        .to_string()
}

fn without<'a>(all: &[&'a str], gone: &[&str]) -> Vec<&'a str> {
    all.iter().copied().filter(|n| !gone.contains(n)).collect()
}

/// Answers seen on the LAN: when, for which address, from which MAC, gratuitous or not.
type Seen = Arc<Mutex<Vec<(Instant, IpAddr, Mac, bool)>>>;

/// Every ARP answer the client namespace sees, and a way to send probes from it.
struct Capture {
    seen: Seen,
    probes: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Capture {
    fn start(netns: &str) -> Capture {
        let seen: Seen = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (probes, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        let (opened_tx, opened_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn({
            let (seen, stop, netns) = (seen.clone(), stop.clone(), netns.to_string());
            move || {
                berth_lab::netns::run_in_netns(&netns, move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    runtime.block_on(async move {
                        let mut link = PacketLink::open_with("eth0", Listen::Neighbour).unwrap();
                        opened_tx.send(()).unwrap();
                        while !stop.load(Ordering::Relaxed) {
                            tokio::select! {
                                frame = link.recv() => {
                                    let Ok(frame) = frame else { continue };
                                    if let Some(a) = read_answer(&frame) {
                                        seen.lock().unwrap().push((Instant::now(), a.ip, a.mac, a.gratuitous));
                                    }
                                }
                                Some(probe) = rx.recv() => { let _ = link.send(&probe); }
                                () = tokio::time::sleep(Duration::from_millis(50)) => {}
                            }
                        }
                    });
                })
                .unwrap();
            }
        });
        opened_rx.recv_timeout(LIMIT).unwrap();
        Capture {
            seen,
            probes,
            stop,
            thread: Some(thread),
        }
    }

    /// The MACs that answered an ARP request for `ip` within 300 ms (replies only).
    async fn probe(&self, ip: &str) -> BTreeSet<Mac> {
        let target: IpAddr = ip.parse().unwrap();
        let sent = Instant::now();
        let IpAddr::V4(v4) = target else {
            panic!("IPv4 only")
        };
        self.probes
            .send(build_arp_request(CLIENT_MAC, CLIENT_IP, v4))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let answered: BTreeSet<Mac> = self
            .seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, a, _, gratuitous)| *at >= sent && *a == target && !gratuitous)
            .map(|(_, _, mac, _)| *mac)
            .collect();
        assert!(
            answered.len() <= 1,
            "two nodes answered for {ip}: {answered:?}"
        );
        answered
    }

    /// Probes until exactly `mac` answers (or, with `None`, until nobody does).
    async fn until(&self, ip: &str, mac: Option<Mac>, what: &str) {
        let deadline = Instant::now() + LIMIT;
        loop {
            let got = self.probe(ip).await;
            if got.iter().next().copied() == mac {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {ip} answered by {got:?}"
            );
        }
    }

    /// The MACs that answered for `ip` since `from`, in order, each run of one MAC once.
    fn answerers_since(&self, ip: &str, from: Instant) -> Vec<Mac> {
        let target: IpAddr = ip.parse().unwrap();
        let mut runs: Vec<Mac> = Vec::new();
        for (at, a, mac, _) in self.seen.lock().unwrap().iter() {
            if *at >= from && *a == target && runs.last() != Some(mac) {
                runs.push(*mac);
            }
        }
        runs
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The agents, killed on drop.
struct Agents {
    bin: String,
    dir: std::path::PathBuf,
    netns: BTreeMap<String, String>,
    children: BTreeMap<String, Child>,
}

impl Agents {
    fn start(&mut self, node: &str) {
        let i = NODES.iter().position(|n| *n == node).unwrap() + 11;
        let address = format!("198.18.0.{i}");
        let log = std::fs::File::create(self.dir.join(format!("{node}.log"))).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.netns[node], &self.bin, "agent"])
            .args([
                "--node-name",
                node,
                "--l2-announcer",
                "--l2-interfaces",
                "eth0",
            ])
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
                &address,
            ])
            .arg("--kubeconfig")
            .arg(self.dir.join("kubeconfig"))
            .args(["--membership", "on", "--membership-key-file"])
            .arg(self.dir.join("key"))
            .args(["--membership-bind-address", &address])
            .args([
                "--lease-namespace",
                "kube-node-lease",
                "--lease-duration",
                "3s",
            ])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children.insert(node.to_string(), child);
    }

    /// Sends `signal` and waits for the process to end.
    fn stop(&mut self, node: &str, signal: &str) {
        let mut child = self.children.remove(node).unwrap();
        let _ = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status();
        let _ = child.wait();
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        for child in self.children.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn mk_lb(name: &str, cluster_ip: &str, node_port: u16, policy: &str, selector_port: u16) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": name},
        "spec": {"type": "LoadBalancer", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                 "externalTrafficPolicy": policy,
                 "ports": [{"name": "http", "port": 80, "targetPort": selector_port,
                            "nodePort": node_port, "protocol": "TCP"}]}
    })
}

fn mk_slice(service: &str, endpoints: &[(&str, &str, bool)]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(ip, node, ready)| {
            json!({"addresses": [ip], "conditions": {"ready": ready}, "nodeName": node})
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "default", "name": format!("{service}-1"),
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints
    })
}

async fn apply(client: &Client, api_version: &str, kind: &str, object: Value) {
    let mut object = object;
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
        &PatchParams::apply("l2-test").force(),
        &Patch::Apply(&object),
    )
    .await
    .unwrap_or_else(|err| panic!("applying {kind} {name}: {err}"));
}

async fn set_ingress(client: &Client, name: &str, ip: &str) {
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
}

async fn set_node(client: &Client, node: &str, labels: Value, network_unavailable: bool) {
    let api = Api::<Node>::all(client.clone());
    let mut labels = labels;
    labels["kubernetes.io/hostname"] = json!(node);
    api.patch(
        node,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": labels}})),
    )
    .await
    .unwrap();
    let status = if network_unavailable { "True" } else { "False" };
    api.patch_status(
        node,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": [
            {"type": "NetworkUnavailable", "status": status, "reason": "Test"}]}})),
    )
    .await
    .unwrap();
}

fn mac_of(topo: &mut Topology, netns: &str) -> Mac {
    let out = topo
        .exec(netns, &["ip", "-o", "link", "show", "eth0"])
        .unwrap();
    let text = out.split("link/ether ").nth(1).unwrap();
    let mut mac = [0u8; 6];
    for (i, part) in text
        .split_whitespace()
        .next()
        .unwrap()
        .split(':')
        .enumerate()
    {
        mac[i] = u8::from_str_radix(part, 16).unwrap();
    }
    mac
}

async fn eventually_tcp(client_ns: &str, pod: &str, what: &str) {
    let target: SocketAddr = format!("{VIP}:80").parse().unwrap();
    let deadline = Instant::now() + LIMIT;
    loop {
        let ns = client_ns.to_string();
        let reply =
            tokio::task::spawn_blocking(move || tcp_echo(&ns, target, Duration::from_millis(500)))
                .await
                .unwrap();
        match reply {
            Ok(reply) if reply.pod == pod => return,
            other => assert!(Instant::now() < deadline, "{what}: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn one_node_answers_for_each_lb_ip_and_another_takes_over() {
    if !ready() {
        return;
    }
    let spec = TopologySpec::new(TopologySpec::unique_prefix("tl"))
        .node("n1", ["web"])
        .node("n2", ["web2"])
        .node("n3", Vec::<String>::new())
        .client("client")
        .client("cp");
    let mut topo = Topology::create(&spec).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(scenario(&mut topo));
    drop(runtime);
    topo.destroy().unwrap();
}

async fn scenario(topo: &mut Topology) {
    let dir = berth_testing::unique_dir("berth-l2-netns");
    let cp = topo.netns("cp").unwrap().to_string();
    let client_ns = topo.netns("client").unwrap().to_string();
    let inside = bind_tcp_in_netns(&cp, API.parse().unwrap()).unwrap();
    inside.set_nonblocking(true).unwrap();
    let server = LabApiServer::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .listener(Listener::Bound(inside))
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    berth_lab::apiserver::write_kubeconfig(&dir.join("kubeconfig"), &format!("http://{API}"))
        .unwrap();
    std::fs::write(dir.join("key"), "0123456789abcdef0123456789abcdef\n").unwrap();
    berth_testing::install_crds(&client).await;

    let macs: BTreeMap<&str, Mac> = NODES
        .iter()
        .map(|n| {
            let ns = topo.netns(n).unwrap().to_string();
            (*n, mac_of(topo, &ns))
        })
        .collect();
    let _echo: Vec<EchoHandle> = ["web", "web2"]
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

    for (i, node) in NODES.iter().enumerate() {
        let node_obj: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
            "status": {"addresses": [{"type": "InternalIP", "address": format!("198.18.0.{}", 11 + i)}]}
        }))
        .unwrap();
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node_obj)
            .await
            .unwrap();
    }
    let pool = |name: &str, addresses: &[&str]| json!({"metadata": {"name": name}, "spec": {"addresses": addresses}});
    apply(
        &client,
        "berth.dev/v1alpha1",
        "IPPool",
        pool("default", &["198.18.0.200-198.18.0.239"]),
    )
    .await;
    apply(
        &client,
        "berth.dev/v1alpha1",
        "IPPool",
        pool("quiet", &["198.18.0.240-198.18.0.250"]),
    )
    .await;
    let advertise = |spec: Value| json!({"metadata": {"name": "lan"}, "spec": spec});
    apply(
        &client,
        "berth.dev/v1alpha1",
        "L2Advertisement",
        advertise(json!({"ipPools": ["default"]})),
    )
    .await;
    for (name, cip, port, policy, ip) in [
        ("web", "10.96.0.10", 30080, "Cluster", VIP),
        ("local", "10.96.0.13", 30083, "Local", LOCAL_VIP),
        ("quiet", "10.96.0.11", 30081, "Cluster", "198.18.0.245"),
        ("stray", "10.96.0.12", 30082, "Cluster", "198.18.0.199"),
    ] {
        apply(
            &client,
            "v1",
            "Service",
            mk_lb(name, cip, port, policy, 8080),
        )
        .await;
        set_ingress(&client, name, ip).await;
    }
    let web = topo.layout().pod("web").unwrap().1.ip.to_string();
    let web2 = topo.layout().pod("web2").unwrap().1.ip.to_string();
    for slice in [
        mk_slice("web", &[(&web, "n1", true)]),
        mk_slice("local", &[(&web, "n1", true), (&web2, "n2", true)]),
    ] {
        apply(&client, "discovery.k8s.io/v1", "EndpointSlice", slice).await;
    }

    let capture = Capture::start(&client_ns);
    let began = Instant::now();
    let mut agents = Agents {
        bin: env!("CARGO_BIN_EXE_berth").to_string(),
        dir: dir.clone(),
        netns: NODES
            .iter()
            .map(|n| (n.to_string(), topo.netns(n).unwrap().to_string()))
            .collect(),
        children: BTreeMap::new(),
    };
    for node in NODES {
        agents.start(node);
    }

    // The elected node answers, the client's kernel maps the VIP to its MAC, TCP gets through.
    let owner = owner_among(&NODES, VIP);
    capture
        .until(VIP, Some(macs[owner.as_str()]), "first election")
        .await;
    eventually_tcp(&client_ns, "web", "TCP through the owner").await;
    let neigh = topo
        .exec(&client_ns, &["ip", "neigh", "show", VIP])
        .unwrap();
    let owner_mac: String = macs[owner.as_str()]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    assert!(neigh.contains(&owner_mac), "{neigh}");
    berth_testing::eventually(
        "the announcing-node annotation",
        LIMIT,
        Duration::from_millis(100),
        || {
            let client = client.clone();
            let owner = owner.clone();
            async move {
                let svc = Api::<Service>::namespaced(client, "default")
                    .get("web")
                    .await
                    .ok()?;
                let node = svc
                    .metadata
                    .annotations?
                    .get(berth_api::names::annotation::ANNOUNCING_NODE)?
                    .clone();
                (node == owner).then_some(())
            }
        },
    )
    .await;
    berth_testing::eventually(
        "the Announcing Event",
        LIMIT,
        Duration::from_millis(100),
        || {
            let client = client.clone();
            let owner = owner.clone();
            async move {
                let events =
                    Api::<k8s_openapi::api::events::v1::Event>::namespaced(client, "default")
                        .list(&Default::default())
                        .await
                        .ok()?;
                events
                    .items
                    .iter()
                    .any(|e| {
                        e.note.as_deref().is_some_and(|n| {
                            n.starts_with(&format!("announcing from node {owner}"))
                        })
                    })
                    .then_some(())
            }
        },
    )
    .await;

    // Nothing answers outside the pools, nor for a pool no advertisement selects.
    assert!(capture.probe("198.18.0.199").await.is_empty());
    assert!(capture.probe("198.18.0.245").await.is_empty());

    // Local policy: only nodes with a Ready endpoint; the IP moves when the owner's goes.
    let local_owner = owner_among(&["n1", "n2"], LOCAL_VIP);
    capture
        .until(LOCAL_VIP, Some(macs[local_owner.as_str()]), "local policy")
        .await;
    let other = if local_owner == "n1" { "n2" } else { "n1" };
    let (mine, theirs) = if local_owner == "n1" {
        (&web, &web2)
    } else {
        (&web2, &web)
    };
    apply(
        &client,
        "discovery.k8s.io/v1",
        "EndpointSlice",
        mk_slice(
            "local",
            &[(mine, &local_owner, false), (theirs, other, true)],
        ),
    )
    .await;
    capture
        .until(LOCAL_VIP, Some(macs[other]), "the last local endpoint went")
        .await;

    // NetworkUnavailable, the exclusion label, node selectors and interfaces each move the IP.
    let next = owner_among(&without(&NODES, &[&owner]), VIP);
    set_node(&client, &owner, json!({}), true).await;
    capture
        .until(VIP, Some(macs[next.as_str()]), "NetworkUnavailable")
        .await;
    set_node(&client, &owner, json!({}), false).await;
    capture
        .until(VIP, Some(macs[owner.as_str()]), "network available again")
        .await;
    set_node(
        &client,
        &owner,
        json!({"node.kubernetes.io/exclude-from-external-load-balancers": ""}),
        false,
    )
    .await;
    capture
        .until(VIP, Some(macs[next.as_str()]), "excluded")
        .await;
    set_node(
        &client,
        &owner,
        json!({"node.kubernetes.io/exclude-from-external-load-balancers": null}),
        false,
    )
    .await;
    capture
        .until(VIP, Some(macs[owner.as_str()]), "no longer excluded")
        .await;
    let chosen = without(&NODES, &[&owner, &next])[0];
    apply(
        &client,
        "berth.dev/v1alpha1",
        "L2Advertisement",
        advertise(json!({"ipPools": ["default"],
        "nodeSelectors": [{"matchLabels": {"kubernetes.io/hostname": chosen}}]})),
    )
    .await;
    capture
        .until(VIP, Some(macs[chosen]), "node selector")
        .await;
    apply(
        &client,
        "berth.dev/v1alpha1",
        "L2Advertisement",
        advertise(json!({"ipPools": ["default"], "interfaces": ["eth1"]})),
    )
    .await;
    capture.until(VIP, None, "no node has eth1").await;
    apply(
        &client,
        "berth.dev/v1alpha1",
        "L2Advertisement",
        advertise(json!({"ipPools": ["default"], "interfaces": ["eth0"]})),
    )
    .await;
    capture
        .until(VIP, Some(macs[owner.as_str()]), "eth0 selected")
        .await;
    eventually_tcp(&client_ns, "web", "TCP after the moves").await;

    // Failover: SIGKILL, link down, graceful stop. A new owner answers and TCP resumes; when the
    // old owner is back, it owns the IP again, without flapping.
    for (how, signal) in [
        ("SIGKILL", "-KILL"),
        ("link down", ""),
        ("graceful stop", "-TERM"),
    ] {
        let from = Instant::now();
        let owner_ns = topo.netns(&owner).unwrap().to_string();
        if signal.is_empty() {
            topo.exec(&owner_ns, &["ip", "link", "set", "eth0", "down"])
                .unwrap();
        } else {
            agents.stop(&owner, signal);
        }
        capture.until(VIP, Some(macs[next.as_str()]), how).await;
        eventually_tcp(&client_ns, "web", how).await;
        if signal.is_empty() {
            topo.exec(&owner_ns, &["ip", "link", "set", "eth0", "up"])
                .unwrap();
            // Link down took the node's routes over the LAN with it; put them back as the
            // topology made them.
            let routes: Vec<(String, String)> = topo
                .layout()
                .nodes
                .iter()
                .filter(|n| n.name != owner)
                .map(|n| (n.pod_cidr.to_string(), n.lan_ip.to_string()))
                .collect();
            for (cidr, via) in routes {
                topo.exec(
                    &owner_ns,
                    &["ip", "route", "replace", &cidr, "via", &via, "dev", "eth0"],
                )
                .unwrap();
            }
            topo.exec(
                &owner_ns,
                &[
                    "ip",
                    "route",
                    "replace",
                    "10.96.0.0/16",
                    "dev",
                    "eth0",
                    "scope",
                    "link",
                ],
            )
            .unwrap();
        } else {
            agents.start(&owner);
        }
        capture
            .until(VIP, Some(macs[owner.as_str()]), &format!("{how}: back"))
            .await;
        eventually_tcp(&client_ns, "web", &format!("{how}: back")).await;
        // Let a late gratuitous round of the interim owner pass before judging the sequence.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let runs = capture.answerers_since(VIP, from);
        let expected_runs = [
            macs[owner.as_str()],
            macs[next.as_str()],
            macs[owner.as_str()],
        ];
        assert!(
            runs.ends_with(&expected_runs[1..]) && runs.len() <= 3,
            "{how}: answers for {VIP} went {runs:?}, expected {expected_runs:?}"
        );
    }
    eprintln!("l2 announcer scenario took {:?}", began.elapsed());
    drop(agents);
    drop(capture);
    server.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

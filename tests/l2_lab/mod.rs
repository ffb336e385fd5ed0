//! The L2 announcer's lab, shared by its end-to-end test and `make bench-failover`: a LAN bridge,
//! three node namespaces running real `berth agent --l2-announcer` processes, the lab API server
//! listening in a control-plane namespace on the LAN, and a client namespace whose capture socket
//! sees every ARP answer and sends the probes.
//!
//! Address plan: LAN 198.18.0.0/24, nodes n1-n3 at .11-.13, client .100, control plane .101
//! (API server on :6443), ARP probes from .102; pods web (n1) 10.244.1.2 and web2 (n2) 10.244.2.2, echo on :8080.
//! Pool `default` 198.18.0.200-198.18.0.239 (advertised), pool `quiet` 198.18.0.240-.250 (not
//! advertised). Services: web .200 (Cluster), local .201 (Local: web and web2), quiet .245,
//! stray .199 (outside every pool).

#![allow(dead_code, clippy::unwrap_used)]

#[path = "../support/lab_netns.rs"]
mod lab_netns;
pub mod ndp;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_l2::frame::client::{build_arp_request, read_answer};
use berth_l2::frame::Mac;
use berth_l2::{election_key, Link, Listen, PacketLink};
use berth_lab::echo::{tcp_echo, EchoHandle};
use berth_lab::topology::{Topology, TopologySpec};
use berth_lab::{LabApiServer, LabApiServerHandle, RecordedRequest};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use lab_netns::{start_api_in_netns, start_echo};
use serde_json::{json, Value};

pub const NODES: [&str; 3] = ["n1", "n2", "n3"];
pub const VIP: &str = "198.18.0.200";
pub const LOCAL_VIP: &str = "198.18.0.201";
/// The probes' sender: an address and MAC no host has, so that no kernel on the LAN learns
/// anything from them (a probe sent as the client would rewrite the nodes' entry for the client
/// and break its TCP); the answers are flooded to the capture socket and ignored by every kernel.
pub const PROBE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 102);
pub const PROBE_MAC: Mac = [2, 0, 0, 0, 0, 0x66];
pub const API: &str = "198.18.0.101:6443";
pub const LIMIT: Duration = Duration::from_secs(20);

/// Whether the lab can be built here: root, namespaces and iptables. A strict run (`CI=true`,
/// `BERTH_REQUIRE_ROOT=1`) fails instead of skipping.
pub fn ready() -> bool {
    berth_testing::require(berth_testing::DATAPATH_NEEDS)
}

/// What every L2 lab test does around its scenario: skip without root, start the lab
/// (namespaces `berth-<tag><pid>-*`, membership on, 3 s leases) on a two-thread runtime, run
/// `scenario`, and take the lab down.
pub fn run_lab<F>(tag: &str, scenario: impl FnOnce(L2Lab) -> F)
where
    F: std::future::Future<Output = L2Lab>,
{
    if !ready() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let lab = L2Lab::start(tag, "on", "3s").await;
        let lab = scenario(lab).await;
        lab.finish().await;
    });
}

pub fn owner_among(candidates: &[&str], ip: &str) -> String {
    let ip: IpAddr = ip.parse().unwrap();
    candidates
        .iter()
        .min_by_key(|n| election_key(n, ip))
        .unwrap()
        .to_string()
}

pub fn without<'a>(all: &[&'a str], gone: &[&str]) -> Vec<&'a str> {
    all.iter().copied().filter(|n| !gone.contains(n)).collect()
}

/// Answers seen on the LAN: when, for which address, from which MAC, gratuitous or not.
pub type Seen = Arc<Mutex<Vec<(Instant, IpAddr, Mac, bool)>>>;

/// A thread in `netns` with a packet socket on its `eth0`: every frame `read` turns into a
/// `T` is recorded in `seen`; every frame sent into `send` goes out. Stopped when dropped.
pub struct Tap<T> {
    pub seen: Arc<Mutex<Vec<T>>>,
    pub send: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<T: Send + 'static> Tap<T> {
    /// Returns once the socket is open.
    pub fn start(netns: &str, read: impl Fn(&[u8]) -> Option<T> + Send + 'static) -> Tap<T> {
        let seen: Arc<Mutex<Vec<T>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (send, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
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
                                    if let Some(item) = read(&frame) {
                                        seen.lock().unwrap().push(item);
                                    }
                                }
                                Some(out) = rx.recv() => { let _ = link.send(&out); }
                                () = tokio::time::sleep(Duration::from_millis(50)) => {}
                            }
                        }
                    });
                })
                .unwrap();
            }
        });
        opened_rx.recv_timeout(LIMIT).unwrap();
        Tap {
            seen,
            send,
            stop,
            thread: Some(thread),
        }
    }
}

impl<T> Drop for Tap<T> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Every ARP answer the client namespace sees, and a way to send probes from it.
pub struct Capture {
    pub seen: Seen,
    pub probes: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    _tap: Tap<(Instant, IpAddr, Mac, bool)>,
}

impl Capture {
    pub fn start(netns: &str) -> Capture {
        let tap = Tap::start(netns, |frame| {
            read_answer(frame).map(|a| (Instant::now(), a.ip, a.mac, a.gratuitous))
        });
        Capture {
            seen: tap.seen.clone(),
            probes: tap.send.clone(),
            _tap: tap,
        }
    }

    /// The MACs that answered an ARP request for `ip` within 300 ms (replies only).
    pub async fn probe(&self, ip: &str) -> BTreeSet<Mac> {
        let target: IpAddr = ip.parse().unwrap();
        let sent = Instant::now();
        let IpAddr::V4(v4) = target else {
            panic!("IPv4 only")
        };
        self.probes
            .send(build_arp_request(PROBE_MAC, PROBE_IP, v4))
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
    pub async fn until(&self, ip: &str, mac: Option<Mac>, what: &str) {
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
    pub fn answerers_since(&self, ip: &str, from: Instant) -> Vec<Mac> {
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

/// The agents, killed on drop.
pub struct Agents {
    pub bin: String,
    pub dir: PathBuf,
    pub netns: BTreeMap<String, String>,
    pub children: BTreeMap<String, Child>,
    /// `on` (Lease and SWIM) or `off` (Lease only).
    pub membership: String,
    /// `--lease-duration`.
    pub lease: String,
    /// `--l2-interfaces` of the nodes that announce elsewhere than on `eth0`.
    pub interfaces: BTreeMap<String, String>,
    /// Per node, a program that runs the agent, e.g. `faketime -f +1h`.
    pub wrappers: BTreeMap<String, Wrapper>,
}

/// A program (and its arguments) that runs an agent, with the environment it needs.
#[derive(Debug, Clone, Default)]
pub struct Wrapper {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl Agents {
    pub fn start(&mut self, node: &str) {
        let i = NODES.iter().position(|n| *n == node).unwrap() + 11;
        let address = format!("198.18.0.{i}");
        let log = std::fs::File::create(self.dir.join(format!("{node}.log"))).unwrap();
        let interfaces = self.interfaces.get(node).map_or("eth0", String::as_str);
        let wrapper = self.wrappers.get(node).cloned().unwrap_or_default();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.netns[node]])
            .args(&wrapper.argv)
            .envs(wrapper.env)
            .args([&self.bin, "agent"])
            .args([
                "--node-name",
                node,
                "--l2-announcer",
                "--l2-interfaces",
                interfaces,
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
            .args(["--membership", &self.membership, "--membership-key-file"])
            .arg(self.dir.join("key"))
            .args(["--membership-bind-address", &address])
            .args([
                "--lease-namespace",
                "kube-node-lease",
                "--lease-duration",
                &self.lease,
            ])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            // A group of its own: a wrapper such as `faketime` forks the agent rather than
            // exec it, and signals must reach the agent.
            .process_group(0)
            .spawn()
            .unwrap();
        self.children.insert(node.to_string(), child);
    }

    /// Sends `signal` and waits for the process to end.
    pub fn stop(&mut self, node: &str, signal: &str) {
        let _ = self.signal(node, signal).join();
    }

    /// Sends `signal` and returns at once: what the others do while the process stops can be
    /// watched. Joining the returned thread waits for the process to end.
    pub fn signal(&mut self, node: &str, signal: &str) -> std::thread::JoinHandle<()> {
        let mut child = self.children.remove(node).unwrap();
        let _ = Command::new("kill")
            .args([signal, "--", &format!("-{}", child.id())])
            .status();
        std::thread::spawn(move || {
            let _ = child.wait();
        })
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        for child in self.children.values_mut() {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
        }
    }
}

pub fn mk_lb(
    name: &str,
    cluster_ip: &str,
    node_port: u16,
    policy: &str,
    selector_port: u16,
) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": name},
        "spec": {"type": "LoadBalancer", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                 "externalTrafficPolicy": policy,
                 "ports": [{"name": "http", "port": 80, "targetPort": selector_port,
                            "nodePort": node_port, "protocol": "TCP"}]}
    })
}

pub fn mk_slice(service: &str, endpoints: &[(&str, &str, bool)]) -> Value {
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

pub async fn apply(client: &Client, api_version: &str, kind: &str, object: Value) {
    berth_testing::lab::apply_object(client, api_version, kind, object, "l2-test").await;
}

pub async fn set_ingress(client: &Client, name: &str, ip: &str) {
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

pub async fn set_node(client: &Client, node: &str, labels: Value, network_unavailable: bool) {
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

pub fn mac_of(topo: &mut Topology, netns: &str) -> Mac {
    mac_of_link(topo, netns, "eth0")
}

pub fn mac_of_link(topo: &mut Topology, netns: &str, link: &str) -> Mac {
    let out = topo
        .exec(netns, &["ip", "-o", "link", "show", link])
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

pub async fn eventually_tcp(client_ns: &str, pod: &str, what: &str) {
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

/// The whole lab, set up with the objects of the address plan and the agents running.
pub struct L2Lab {
    pub topo: Topology,
    pub server: LabApiServerHandle,
    pub client: Client,
    pub capture: Capture,
    pub agents: Agents,
    pub macs: BTreeMap<&'static str, Mac>,
    pub client_ns: String,
    pub web_ip: String,
    pub web2_ip: String,
    pub dir: PathBuf,
    _echo: Vec<EchoHandle>,
}

pub fn advertise(spec: Value) -> Value {
    json!({"metadata": {"name": "lan"}, "spec": spec})
}

impl L2Lab {
    /// Builds the topology and the objects and starts the three agents with `--membership
    /// <membership>` and `--lease-duration <lease>`.
    pub async fn start(tag: &str, membership: &str, lease: &str) -> L2Lab {
        let spec = TopologySpec::new(TopologySpec::unique_prefix(tag))
            .node("n1", ["web"])
            .node("n2", ["web2"])
            .node("n3", Vec::<String>::new())
            .client("client")
            .client("cp");
        let mut topo = Topology::create(&spec).unwrap();
        let dir = berth_testing::unique_dir("berth-l2-netns");
        let cp = topo.netns("cp").unwrap().to_string();
        let client_ns = topo.netns("client").unwrap().to_string();
        let (server, client) = start_api_in_netns(
            LabApiServer::builder().record_requests(true),
            &cp,
            API.parse().unwrap(),
            &dir.join("kubeconfig"),
        )
        .await;
        std::fs::write(dir.join("key"), "0123456789abcdef0123456789abcdef\n").unwrap();

        let macs: BTreeMap<&'static str, Mac> = NODES
            .iter()
            .map(|n| {
                let ns = topo.netns(n).unwrap().to_string();
                (*n, mac_of(&mut topo, &ns))
            })
            .collect();
        let echo = start_echo(&topo, &["web", "web2"], 8080);
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
        let web_ip = topo.layout().pod("web").unwrap().1.ip.to_string();
        let web2_ip = topo.layout().pod("web2").unwrap().1.ip.to_string();
        for slice in [
            mk_slice("web", &[(&web_ip, "n1", true)]),
            mk_slice("local", &[(&web_ip, "n1", true), (&web2_ip, "n2", true)]),
        ] {
            apply(&client, "discovery.k8s.io/v1", "EndpointSlice", slice).await;
        }
        let capture = Capture::start(&client_ns);
        let mut agents = Agents {
            bin: env!("CARGO_BIN_EXE_berth").to_string(),
            dir: dir.clone(),
            netns: NODES
                .iter()
                .map(|n| (n.to_string(), topo.netns(n).unwrap().to_string()))
                .collect(),
            children: BTreeMap::new(),
            membership: membership.to_string(),
            lease: lease.to_string(),
            interfaces: BTreeMap::new(),
            wrappers: BTreeMap::new(),
        };
        for node in NODES {
            agents.start(node);
        }
        L2Lab {
            topo,
            server,
            client,
            capture,
            agents,
            macs,
            client_ns,
            web_ip,
            web2_ip,
            dir,
            _echo: echo,
        }
    }

    /// Link down took the node's routes over the LAN with it; puts them back as the topology
    /// made them.
    pub fn restore_routes(&mut self, node: &str) {
        let ns = self.topo.netns(node).unwrap().to_string();
        let routes: Vec<(String, String)> = self
            .topo
            .layout()
            .nodes
            .iter()
            .filter(|n| n.name != node)
            .map(|n| (n.pod_cidr.to_string(), n.lan_ip.to_string()))
            .collect();
        for (cidr, via) in routes {
            self.topo
                .exec(
                    &ns,
                    &["ip", "route", "replace", &cidr, "via", &via, "dev", "eth0"],
                )
                .unwrap();
        }
        self.topo
            .exec(
                &ns,
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
    }

    pub fn set_link(&mut self, node: &str, up: bool) {
        let ns = self.topo.netns(node).unwrap().to_string();
        let state = if up { "up" } else { "down" };
        self.topo
            .exec(&ns, &["ip", "link", "set", "eth0", state])
            .unwrap();
        if up {
            self.restore_routes(node);
        }
    }

    /// Stops everything and removes every namespace.
    pub async fn finish(self) {
        let L2Lab {
            topo,
            server,
            client: _,
            capture,
            agents,
            macs: _,
            client_ns: _,
            web_ip: _,
            web2_ip: _,
            dir,
            _echo,
        } = self;
        drop(agents);
        drop(capture);
        drop(_echo);
        server.shutdown().await.unwrap();
        topo.destroy().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The requests made between two snapshots of the request log, each with how many times.
pub fn requests_between(
    before: &[RecordedRequest],
    after: &[RecordedRequest],
) -> Vec<RecordedRequest> {
    let key = |r: &RecordedRequest| {
        let mut r = r.clone();
        r.count = 0;
        r
    };
    let earlier: BTreeMap<RecordedRequest, u64> =
        before.iter().map(|r| (key(r), r.count)).collect();
    after
        .iter()
        .filter_map(|r| {
            let count = r.count - earlier.get(&key(r)).copied().unwrap_or(0);
            (count > 0).then(|| RecordedRequest { count, ..r.clone() })
        })
        .collect()
}

/// Whether a request writes (RBAC's writing verbs).
pub fn is_write(r: &RecordedRequest) -> bool {
    matches!(
        r.verb.as_str(),
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

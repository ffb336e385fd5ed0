//! `berth agent` as a real process inside a node namespace, watching the lab API server: a
//! Service and its EndpointSlice created through the API become rules that real packets follow,
//! an endpoint change moves them, and deleting the Service stops them. With the datapath and the
//! L2 announcer both reading Services, EndpointSlices and Nodes, the agent watches each kind
//! once (the lab API server's request log). Its log output is a pipe that is full from the start
//! and never read, as a log file on a disk the kernel throttles or a pipe nobody drains: a
//! process writing its lines in place would stop at its first line, but berth queues them for a
//! writer thread of their own and drops what does not fit, so the agent works on. Root, iproute2 and
//! iptables only (skips with a message elsewhere, fails under `CI=true`).
//!
//! Address plan (docs/architecture.md): LAN 198.18.0.0/24 (node1 .11, client .100); pods a1 and
//! a2 on node1, 10.244.1.0/24; the Service 10.96.0.10, node port 30080. Namespaces are
//! `berth-ap<pid>-*`, deleted when the topology is dropped; the agent is killed before that.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth_lab::apiserver::write_kubeconfig;
use berth_lab::echo::{tcp_echo, EchoServer};
use berth_lab::netns::bind_tcp_in_netns;
use berth_lab::topology::{remove_orphans, Topology, TopologySpec};
use berth_lab::{LabApiServer, Listener};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(2);
/// How long the agent may take to turn one API change into rules (it syncs every 100 ms).
const CONVERGE: Duration = Duration::from_secs(30);

/// The agent process, killed when dropped (also when an assertion fails).
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Asks `addr` from `netns` until `check` holds for the answering pod (`None`: no answer).
fn until(netns: &str, addr: SocketAddr, what: &str, check: impl Fn(Option<&str>) -> bool) {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let pod = tcp_echo(netns, addr, TIMEOUT).ok().map(|reply| reply.pod);
        if check(pod.as_deref()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {addr} from {netns}, last answer {pod:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A pipe whose buffer is already full: the first line written to it waits for a reader, and
/// the reader (kept until the end) never reads.
fn full_pipe() -> (std::io::PipeReader, std::io::PipeWriter) {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let (reader, mut writer) = std::io::pipe().unwrap();
    fcntl(&writer, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
    // Whole pages while they fit, then single bytes, until nothing more goes in.
    for chunk in [4096, 1] {
        loop {
            match writer.write(&vec![b'#'; chunk]) {
                Ok(_) => {}
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(err) => panic!("filling the pipe: {err}"),
            }
        }
    }
    // Blocking again, as a log output is: the agent's writes wait.
    fcntl(&writer, FcntlArg::F_SETFL(OFlag::empty())).unwrap();
    (reader, writer)
}

fn slice(pod_ip: IpAddr) -> EndpointSlice {
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": "default",
            "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [pod_ip.to_string()], "conditions": {"ready": true},
            "nodeName": "node1"}]
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_process_turns_api_objects_into_rules_packets_follow() {
    if !berth_testing::require(berth_testing::DATAPATH_NEEDS) {
        return;
    }
    let _ = remove_orphans("ap");
    let spec = TopologySpec::new(TopologySpec::unique_prefix("ap"))
        .node("node1", ["a1", "a2"])
        .client("client");
    let topo = Topology::create(&spec).unwrap();
    let pod_ip = |pod: &str| IpAddr::V4(topo.layout().pod(pod).unwrap().1.ip);
    let _echoes: Vec<_> = ["a1", "a2"]
        .into_iter()
        .map(|pod| {
            EchoServer::bind(
                topo.netns(pod).unwrap(),
                pod,
                Some(SocketAddr::new(pod_ip(pod), 8080)),
                None,
            )
            .unwrap()
            .start()
            .unwrap()
        })
        .collect();
    let node_ns = topo.netns("node1").unwrap().to_string();
    let client_ns = topo.netns("client").unwrap().to_string();
    let node_ip = IpAddr::V4(topo.layout().node("node1").unwrap().lan_ip);

    // The API server answers on the node's loopback (for the agent) and the host's (for us).
    let inside = bind_tcp_in_netns(&node_ns, "127.0.0.1:0".parse().unwrap()).unwrap();
    let inside_addr = inside.local_addr().unwrap();
    let server = LabApiServer::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .listener(Listener::Bound(inside))
        .record_requests(true)
        .start()
        .await
        .unwrap();
    let outside = *server.addrs().iter().find(|a| **a != inside_addr).unwrap();
    let mut config = kube::Config::new(format!("http://{outside}").parse().unwrap());
    config.default_namespace = "default".into();
    let client = kube::Client::try_from(config).unwrap();
    let dir = berth_testing::unique_dir("agent-process");
    let kubeconfig = dir.join("kubeconfig");
    write_kubeconfig(&kubeconfig, &format!("http://{inside_addr}")).unwrap();

    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "node1"},
                "status": {"addresses": [{"type": "InternalIP", "address": node_ip.to_string()}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let (log_reader, log_writer) = full_pipe();
    let agent = Agent(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &node_ns,
                env!("CARGO_BIN_EXE_berth"),
                "agent",
            ])
            .args(["--node-name", "node1", "--cluster-cidr", "10.244.0.0/16"])
            .args([
                "--min-sync-interval",
                "100ms",
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .args(["--healthz-bind-address", "127.0.0.1"])
            // The announcer reads Services, EndpointSlices and Nodes too; no pool or
            // advertisement exists, so it owns and sends nothing.
            .arg("--l2-announcer")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .stdout(Stdio::null())
            .stderr(log_writer)
            .spawn()
            .unwrap(),
    );

    let services: Api<Service> = Api::default_namespaced(client.clone());
    let slices: Api<EndpointSlice> = Api::default_namespaced(client.clone());
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"type": "NodePort", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080,
                        "protocol": "TCP"}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    slices
        .create(&PostParams::default(), &slice(pod_ip("a1")))
        .await
        .unwrap();

    let node_port = SocketAddr::new(node_ip, 30080);
    let cluster_ip: SocketAddr = "10.96.0.10:80".parse().unwrap();
    let (c, n) = (client_ns.clone(), node_ns.clone());
    tokio::task::spawn_blocking(move || {
        until(&c, node_port, "the node port to reach a1", |p| {
            p == Some("a1")
        });
        until(&n, cluster_ip, "the ClusterIP to reach a1", |p| {
            p == Some("a1")
        });
    })
    .await
    .unwrap();

    // The endpoint moves to a2 through the API; packets follow.
    slices
        .patch(
            "web-1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"endpoints": [{"addresses": [pod_ip("a2").to_string()],
                "conditions": {"ready": true}, "nodeName": "node1"}]}),
            ),
        )
        .await
        .unwrap();
    let c = client_ns.clone();
    tokio::task::spawn_blocking(move || {
        until(&c, node_port, "the node port to move to a2", |p| {
            p == Some("a2")
        });
    })
    .await
    .unwrap();

    // Deleted: nothing answers on the node port any more.
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let c = client_ns.clone();
    tokio::task::spawn_blocking(move || {
        until(&c, node_port, "the node port to stop answering", |p| {
            p.is_none()
        });
    })
    .await
    .unwrap();

    let mut agent = agent;
    assert!(
        agent.0.try_wait().unwrap().is_none(),
        "the agent exited during the test"
    );
    drop(agent);
    drop(log_reader);

    // One watch per kind, however many parts of the agent read it. The test's own client
    // watches nothing, so every watch in the log is the agent's.
    let mut watches = std::collections::BTreeMap::<String, u64>::new();
    for r in server.recorded_requests() {
        if r.verb == "watch" {
            *watches.entry(r.resource.clone()).or_default() += r.count;
        }
    }
    for kind in ["services", "endpointslices", "nodes"] {
        assert_eq!(
            watches.get(kind),
            Some(&1),
            "watches of {kind}: {watches:?}"
        );
    }
    server.shutdown().await.unwrap();
    topo.destroy().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

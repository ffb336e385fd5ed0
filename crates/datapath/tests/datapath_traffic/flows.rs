//! UDP through a node port and a LoadBalancer address, an endpoint replaced under a live UDP flow
//! with the real `conntrack` removing the stale entry, and session affinity that expires.
//! Each scenario adds its Service, and puts the cluster's Services back when it ends.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::process::Command;
use std::time::Duration;

use berth_agent::plan_conntrack_cleanup;
use berth_core::{IpFamily, Protocol};
use berth_datapath::{ServicePort, SessionAffinity};
use berth_lab::echo::EchoReply;
use berth_lab::netns::bind_udp_in_netns;

use crate::cluster::*;
use crate::family::dual_stack;

/// Syncs every node with the cluster's current Services, whatever kind of sync that takes.
fn sync(c: &mut Cluster) {
    let dispatch = c.dispatch;
    c.sync_with(|family| Cluster::options(dispatch, family));
}

/// Runs `scenario` with `extra` added to the Services, and puts the Services back afterwards,
/// also when it fails.
fn with_services(c: &mut Cluster, extra: Vec<ServicePort>, scenario: impl FnOnce(&mut Cluster)) {
    let base = c.services.clone();
    c.services.extend(extra);
    sync(c);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(c)));
    c.services = base;
    sync(c);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

const UDP_NODE_PORT: u16 = 30090;

fn mk_udp_public(c: &Cluster, pod: &str) -> ServicePort {
    let ep = berth_testing::mk_endpoint(
        pod_ip(&c.topo, pod),
        UDP_PORT,
        &c.topo.layout().pod(pod).unwrap().0.name,
    );
    let mut port = mk_port("udp-public", svc_ip(20), vec![ep]);
    port.name.port = "dns".into();
    port.protocol = Protocol::Udp;
    port.port = 53;
    port.node_port = Some(UDP_NODE_PORT);
    // Steered by the client to node2, which has no endpoint: the packet crosses to node1.
    port.load_balancer_ingress = vec![lb(v4(198, 18, 0, 203))];
    dual_stack(port)
}

/// One question on `socket`, a flow that keeps its source port across questions.
fn ask_udp(socket: &UdpSocket, addr: SocketAddr) -> EchoReply {
    socket
        .send_to(b"ping\n", addr)
        .unwrap_or_else(|err| panic!("sending to {addr}: {err}"));
    let mut buf = [0u8; 1500];
    let (len, _) = socket
        .recv_from(&mut buf)
        .unwrap_or_else(|err| panic!("receiving from {addr}: {err}"));
    EchoReply::parse(&String::from_utf8_lossy(&buf[..len])).unwrap()
}

/// Runs the real `conntrack` in `netns`; exit 1 with nothing deleted is the harmless no-match.
fn conntrack(netns: &str, args: &[String]) {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, "conntrack"])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || stderr.contains("0 flow entries have been deleted"),
        "conntrack {args:?} in {netns}: {stderr}"
    );
}

pub fn udp_node_port_load_balancer_and_a_replaced_endpoint(c: &mut Cluster) {
    let udp = mk_udp_public(c, "a1");
    with_services(c, vec![udp], |c| {
        let node_port = |c: &Cluster, node| sa(node_ip(c, node), UDP_NODE_PORT);
        for addr in [
            node_port(c, "node1"),
            node_port(c, "node2"),
            in_plan(c, sa(v4(198, 18, 0, 203), 53)),
        ] {
            let reply = berth_lab::echo::udp_echo(&c.netns("client"), addr, OK_TIMEOUT)
                .unwrap_or_else(|err| panic!("client -> {addr}: {err}"));
            assert_eq!(reply.pod, "a1", "{addr}");
        }

        // A live flow (one source port) through node1's node port, then the endpoint is
        // replaced by b1. The flow's conntrack entry still sends it to a1, which still answers:
        // the stale entry is real, and only its removal moves the flow.
        let any: SocketAddr = match c.family {
            IpFamily::V4 => "0.0.0.0:0",
            IpFamily::V6 => "[::]:0",
        }
        .parse()
        .unwrap();
        let socket = bind_udp_in_netns(&c.netns("client"), any).unwrap();
        socket.set_read_timeout(Some(OK_TIMEOUT)).unwrap();
        let target = node_port(c, "node1");
        assert_eq!(ask_udp(&socket, target).pod, "a1");
        let old = c.services.clone();
        let last = c.services.len() - 1;
        c.services[last] = mk_udp_public(c, "b1");
        sync(c);
        assert_eq!(
            ask_udp(&socket, target).pod,
            "a1",
            "the flow left a1 before its conntrack entry was removed"
        );
        // What the agent deletes after this sync, run with the real tool on every node.
        let flows = plan_conntrack_cleanup(&old, &c.services);
        assert!(
            !flows.is_empty(),
            "no cleanup planned for a replaced UDP endpoint"
        );
        for node in NODES {
            let ns = c.netns(node);
            for flow in &flows {
                conntrack(&ns, &flow.args());
            }
        }
        assert_eq!(
            ask_udp(&socket, target).pod,
            "b1",
            "the stale entry survived"
        );
    });
}

/// Short enough to wait out a few times, as kube-proxy's smallest timeout allows.
const AFFINITY_SECONDS: u32 = 1;

pub fn client_ip_affinity_expires(c: &mut Cluster) {
    let ep = |pod: &str| {
        berth_testing::mk_endpoint(
            pod_ip(&c.topo, pod),
            TCP_PORT,
            &c.topo.layout().pod(pod).unwrap().0.name,
        )
    };
    let mut short = mk_port(
        "short-affinity",
        svc_ip(21),
        vec![ep("a1"), ep("a2"), ep("b1")],
    );
    short.session_affinity = SessionAffinity::ClientIp {
        timeout_seconds: AFFINITY_SECONDS,
    };
    with_services(c, vec![dual_stack(short)], |c| {
        let addr = sa(svc_ip(21), 80);
        let first = ask(c, "c1", addr).pod;
        // Sticky while the entry is fresh: each question renews it.
        for _ in 0..5 {
            assert_eq!(ask(c, "c1", addr).pod, first);
        }
        // Once the timeout has passed with no traffic, the next connection is balanced afresh
        // among three endpoints: it lands elsewhere with probability 2/3 each time, so eight
        // expiries all back on `first` (1 in 6,561) means the entry never expires.
        let wait = Duration::from_millis(1000 * u64::from(AFFINITY_SECONDS) + 600);
        let mut seen = vec![first.clone()];
        for _ in 0..8 {
            std::thread::sleep(wait);
            let pod = ask(c, "c1", addr).pod;
            seen.push(pod.clone());
            if pod != first {
                return;
            }
        }
        panic!("affinity never expired: {seen:?}");
    });
}

/// A node port that is also a Service address on the node (an external IP): the Service
/// address wins, in iptables (`BERTH-SERVICES` before the node-port jump) and across nftables
/// shards (every shard's Service-address lookup runs before any shard's node-port lookup), here
/// with the node port's Service in an earlier shard than the external IP's.
pub fn service_address_wins_over_a_node_port_in_another_shard(c: &mut Cluster) {
    use berth_datapath::nft::shard::service_port_hash;
    use berth_datapath::plan::names::{service_chain, ServiceChain};
    const PORT: u16 = 30095;
    let shards = traffic_shards();
    let shard_of = |port: &ServicePort| {
        let chain = service_chain(ServiceChain::Cluster, &port.name, port.protocol);
        shards.of_service_port(service_port_hash(chain.as_str()).unwrap())
    };
    let endpoint = |pod: &str| {
        berth_testing::mk_endpoint(
            pod_ip(&c.topo, pod),
            TCP_PORT,
            &c.topo.layout().pod(pod).unwrap().0.name,
        )
    };
    let mut node_port = mk_port("np-shadowed", svc_ip(21), vec![endpoint("b1")]);
    node_port.node_port = Some(PORT);
    // The external IP's Service in a later shard than the node port's.
    let external = (0..64)
        .map(|i| {
            let mut port = mk_port(&format!("ext-{i}"), svc_ip(22), vec![endpoint("a1")]);
            port.port = PORT;
            port.external_ips = vec![IpAddr::V4(c.topo.layout().node("node1").unwrap().lan_ip)];
            port
        })
        .find(|port| shard_of(port) > shard_of(&node_port))
        .unwrap();
    let extra = vec![dual_stack(node_port), dual_stack(external)];
    with_services(c, extra, |c| {
        for _ in 0..3 {
            let reply = ask(c, "client", sa(node_ip(c, "node1"), PORT));
            assert_eq!(reply.pod, "a1", "{reply:?}");
        }
        // The node port alone answers on the other node.
        let reply = ask(c, "client", sa(node_ip(c, "node2"), PORT));
        assert_eq!(reply.pod, "b1", "{reply:?}");
    });
}

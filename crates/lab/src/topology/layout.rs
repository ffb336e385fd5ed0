//! Spec -> layout: namespace names and every address, from the lab's address plan.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

use super::{
    TopologyError, TopologySpec, CONTROL_PLANE_HOST, FIRST_CLIENT_HOST, FIRST_NODE_HOST,
    LAN6_NETWORK, LAN6_PREFIX_LEN, LAN_NETWORK, LAN_PREFIX_LEN, LB_POOL_FIRST_HOST, NETNS_PREFIX,
    POD6_NETWORK, POD_NETWORK,
};

/// The name reserved for the LAN namespace (`<prefix>-lan`).
const LAN_NAME: &str = "lan";

/// Longest user-given name; namespace names are files, but short ones read well in `ip netns`.
const MAX_NAME_LEN: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLayout {
    pub name: String,
    pub netns: String,
    pub ip: Ipv4Addr,
    /// With IPv6: fd00:244:<node>::(slot+1).
    pub ip6: Option<Ipv6Addr>,
    /// The node's end of the pod's veth, in the node namespace.
    pub node_veth: String,
}

impl PodLayout {
    /// Its addresses, IPv4 first.
    pub fn ips(&self) -> Vec<IpAddr> {
        addresses(self.ip, self.ip6)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLayout {
    pub name: String,
    pub netns: String,
    pub lan_ip: Ipv4Addr,
    /// The node's port on the LAN bridge, in the LAN namespace.
    pub lan_port: String,
    pub pod_cidr: Ipv4Net,
    /// The pods' gateway: the node's address on every pod veth.
    pub gateway: Ipv4Addr,
    /// With IPv6: the node's LAN address, its pods' /64 and their gateway.
    pub lan_ip6: Option<Ipv6Addr>,
    pub pod_cidr6: Option<Ipv6Net>,
    pub gateway6: Option<Ipv6Addr>,
    pub pods: Vec<PodLayout>,
    pub route_localnet: bool,
}

impl NodeLayout {
    /// Its LAN addresses, IPv4 first.
    pub fn lan_ips(&self) -> Vec<IpAddr> {
        addresses(self.lan_ip, self.lan_ip6)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientLayout {
    pub name: String,
    pub netns: String,
    pub ip: Ipv4Addr,
    /// With IPv6: its LAN address, fd00:198:18::<the IPv4 host number as hex digits>.
    pub ip6: Option<Ipv6Addr>,
    pub lan_port: String,
}

impl ClientLayout {
    /// Its LAN addresses, IPv4 first.
    pub fn ips(&self) -> Vec<IpAddr> {
        addresses(self.ip, self.ip6)
    }
}

fn addresses(v4: Ipv4Addr, v6: Option<Ipv6Addr>) -> Vec<IpAddr> {
    std::iter::once(IpAddr::V4(v4))
        .chain(v6.map(IpAddr::V6))
        .collect()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub prefix: String,
    pub lan_netns: String,
    pub lan_bridge: String,
    pub lan: Ipv4Net,
    /// With IPv6: fd00:198:18::/64.
    pub lan6: Option<Ipv6Net>,
    pub nodes: Vec<NodeLayout>,
    pub clients: Vec<ClientLayout>,
    /// Joins the LAN like a client, at 198.18.0.2.
    pub control_plane: Option<ClientLayout>,
}

impl Layout {
    /// Every namespace, in creation order.
    pub fn namespaces(&self) -> Vec<&str> {
        let mut out = vec![self.lan_netns.as_str()];
        out.extend(self.control_plane.iter().map(|c| c.netns.as_str()));
        for node in &self.nodes {
            out.push(&node.netns);
            out.extend(node.pods.iter().map(|p| p.netns.as_str()));
        }
        out.extend(self.clients.iter().map(|c| c.netns.as_str()));
        out
    }

    pub fn node(&self, name: &str) -> Option<&NodeLayout> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// A pod and the node that hosts it.
    pub fn pod(&self, name: &str) -> Option<(&NodeLayout, &PodLayout)> {
        self.nodes
            .iter()
            .find_map(|n| n.pods.iter().find(|p| p.name == name).map(|p| (n, p)))
    }

    pub fn client(&self, name: &str) -> Option<&ClientLayout> {
        self.clients.iter().find(|c| c.name == name)
    }
}

/// Pod `slot` (1-253) of `node`: address 10.244.<n>.(slot+1), veth `vp<slot>` on the node, and
/// the namespace `<prefix>-<node>-p<slot>`. For pods made while the topology runs (the lab
/// kubelet); the slot is what keeps the address and the names unique on the node.
pub fn pod_layout(
    prefix: &str,
    node: &NodeLayout,
    slot: u8,
    name: &str,
) -> Result<PodLayout, TopologyError> {
    if !(1..=253).contains(&slot) {
        return Err(invalid(format!(
            "pod slot {slot} on node {}: a /24 pod CIDR holds slots 1-253",
            node.name
        )));
    }
    let net = node.pod_cidr.network().octets();
    Ok(PodLayout {
        name: name.to_string(),
        netns: format!("{prefix}-{}-p{slot}", node.name),
        ip: host([net[0], net[1], net[2]], slot + 1),
        ip6: node
            .pod_cidr6
            .map(|cidr| host6(cidr.network(), u16::from(slot) + 1)),
        node_veth: format!("vp{slot}"),
    })
}

/// The lowest pod slot on `node` whose node-side veth and namespace names are both absent from
/// `taken` (running pods' names, and the links and namespaces that still exist). A stopped pod's
/// veth lingers until the kernel has finished destroying its namespace; making it again would
/// fail with "File exists".
pub fn free_pod_slot(prefix: &str, node: &NodeLayout, taken: &BTreeSet<String>) -> Option<u8> {
    (1u8..=253).find(|&slot| {
        pod_layout(prefix, node, slot, "")
            .is_ok_and(|pod| !taken.contains(&pod.node_veth) && !taken.contains(&pod.netns))
    })
}

/// Interface names in `ip -o link show` output (`3: vp1@if2: <...> ...` -> `vp1`).
pub fn parse_link_names(output: &str) -> Vec<String> {
    output
        .lines()
        .filter_map(|line| line.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_string())
        .filter(|name| !name.is_empty())
        .collect()
}

fn host(net: [u8; 3], last: u8) -> Ipv4Addr {
    Ipv4Addr::new(net[0], net[1], net[2], last)
}

/// `n` written in decimal, read as hexadecimal: 11 -> 0x11, so that fd00:198:18::11 reads as
/// 198.18.0.11 does. Numbers of the plan stay below 10,000, where this is exact.
fn hex_digits(n: u16) -> u16 {
    let mut out = 0u16;
    let mut shift = 0u32;
    let mut rest = n;
    loop {
        out |= (rest % 10) << shift;
        rest /= 10;
        shift += 4;
        if rest == 0 || shift >= 16 {
            return out;
        }
    }
}

/// The address `last` (as hex digits, see [`hex_digits`]) inside the /64 (or wider) `net`.
fn host6(net: Ipv6Addr, last: u16) -> Ipv6Addr {
    let mut segments = net.segments();
    segments[7] = hex_digits(last);
    Ipv6Addr::from(segments)
}

/// The /64 of node `i`'s pods: fd00:244:<i as hex digits>::/64.
fn node_pod_cidr6(i: u8) -> Result<Ipv6Net, TopologyError> {
    let net = Ipv6Addr::new(
        POD6_NETWORK[0],
        POD6_NETWORK[1],
        hex_digits(u16::from(i)),
        0,
        0,
        0,
        0,
        0,
    );
    Ipv6Net::new(net, 64).map_err(|e| invalid(format!("IPv6 pod CIDR of node {i}: {e}")))
}

fn invalid(msg: String) -> TopologyError {
    TopologyError::Invalid(msg)
}

fn check_name(kind: &str, name: &str, seen: &mut BTreeSet<String>) -> Result<(), TopologyError> {
    let plain = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !plain {
        return Err(invalid(format!(
            "{kind} name {name:?}: use 1-{MAX_NAME_LEN} of a-z, 0-9 and '-'"
        )));
    }
    if name == LAN_NAME {
        return Err(invalid(format!(
            "{kind} name {name:?} is reserved for the LAN"
        )));
    }
    if !seen.insert(name.to_string()) {
        return Err(invalid(format!(
            "{kind} name {name:?} is used twice (names are unique across nodes, pods and clients)"
        )));
    }
    Ok(())
}

/// Assigns names and addresses. Fails on anything the address plan cannot hold.
pub fn layout(spec: &TopologySpec) -> Result<Layout, TopologyError> {
    let prefix = &spec.prefix;
    if !prefix.starts_with(NETNS_PREFIX) || prefix.len() <= NETNS_PREFIX.len() {
        return Err(invalid(format!(
            "prefix {prefix:?} must start with {NETNS_PREFIX:?} and name its owner"
        )));
    }
    if prefix.contains('/') || prefix.contains('\0') {
        return Err(invalid(format!("prefix {prefix:?} is not a plain name")));
    }
    let max_nodes = usize::from(FIRST_CLIENT_HOST - FIRST_NODE_HOST);
    if spec.nodes.len() > max_nodes {
        return Err(invalid(format!(
            "{} nodes: the LAN holds {max_nodes} (198.18.0.{FIRST_NODE_HOST}-{})",
            spec.nodes.len(),
            FIRST_CLIENT_HOST - 1
        )));
    }
    let max_clients = usize::from(LB_POOL_FIRST_HOST - FIRST_CLIENT_HOST);
    if spec.clients.len() > max_clients {
        return Err(invalid(format!(
            "{} clients: the LAN holds {max_clients} below the load-balancer pool",
            spec.clients.len()
        )));
    }
    let lan_octets = LAN_NETWORK.octets();
    let lan_net = [lan_octets[0], lan_octets[1], lan_octets[2]];
    let lan6 = |last: u8| spec.ipv6.then(|| host6(LAN6_NETWORK, u16::from(last)));
    let mut seen = BTreeSet::new();
    let mut nodes = Vec::with_capacity(spec.nodes.len());
    for (i, node) in (1u8..).zip(&spec.nodes) {
        check_name("node", &node.name, &mut seen)?;
        // .0 is the network, .1 the gateway, .255 the broadcast of a /24.
        if node.pods.len() > 253 {
            return Err(invalid(format!(
                "node {}: {} pods, a /24 pod CIDR holds 253",
                node.name,
                node.pods.len()
            )));
        }
        let pod_net = [POD_NETWORK[0], POD_NETWORK[1], i];
        let pod_cidr6 = if spec.ipv6 {
            Some(node_pod_cidr6(i)?)
        } else {
            None
        };
        let mut pods = Vec::with_capacity(node.pods.len());
        for (k, pod) in (1u8..).zip(&node.pods) {
            check_name("pod", pod, &mut seen)?;
            pods.push(PodLayout {
                name: pod.clone(),
                netns: format!("{prefix}-{pod}"),
                ip: host(pod_net, k + 1),
                ip6: pod_cidr6.map(|c| host6(c.network(), u16::from(k) + 1)),
                node_veth: format!("vp{k}"),
            });
        }
        let lan_host = FIRST_NODE_HOST + i - 1;
        nodes.push(NodeLayout {
            name: node.name.clone(),
            netns: format!("{prefix}-{}", node.name),
            lan_ip: host(lan_net, lan_host),
            lan_port: format!("n{i}"),
            pod_cidr: Ipv4Net::new(host(pod_net, 0), 24)
                .map_err(|e| invalid(format!("pod CIDR of node {}: {e}", node.name)))?,
            gateway: host(pod_net, 1),
            lan_ip6: lan6(lan_host),
            pod_cidr6,
            gateway6: pod_cidr6.map(|c| host6(c.network(), 1)),
            pods,
            route_localnet: node.route_localnet,
        });
    }
    let mut clients = Vec::with_capacity(spec.clients.len());
    for (j, client) in (0u8..).zip(&spec.clients) {
        check_name("client", client, &mut seen)?;
        clients.push(ClientLayout {
            name: client.clone(),
            netns: format!("{prefix}-{client}"),
            ip: host(lan_net, FIRST_CLIENT_HOST + j),
            ip6: lan6(FIRST_CLIENT_HOST + j),
            lan_port: format!("c{j}"),
        });
    }
    let control_plane = match &spec.control_plane {
        Some(name) => {
            check_name("control-plane", name, &mut seen)?;
            Some(ClientLayout {
                name: name.clone(),
                netns: format!("{prefix}-{name}"),
                ip: host(lan_net, CONTROL_PLANE_HOST),
                ip6: lan6(CONTROL_PLANE_HOST),
                lan_port: "cp".to_string(),
            })
        }
        None => None,
    };
    Ok(Layout {
        prefix: prefix.clone(),
        lan_netns: format!("{prefix}-{LAN_NAME}"),
        lan_bridge: "br0".to_string(),
        lan: Ipv4Net::new(LAN_NETWORK, LAN_PREFIX_LEN).map_err(|e| invalid(format!("LAN: {e}")))?,
        lan6: if spec.ipv6 {
            Some(
                Ipv6Net::new(LAN6_NETWORK, LAN6_PREFIX_LEN)
                    .map_err(|e| invalid(format!("IPv6 LAN: {e}")))?,
            )
        } else {
            None
        },
        nodes,
        clients,
        control_plane,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_spec() -> TopologySpec {
        TopologySpec::new("berth-t1")
            .node("node1", ["a1", "a2"])
            .node("node2", ["b1"])
            .client("client")
            .client("other")
    }

    #[test]
    fn addresses_follow_the_lab_plan() {
        let l = layout(&mk_spec()).unwrap();
        assert_eq!(l.lan_netns, "berth-t1-lan");
        assert_eq!(l.lan.to_string(), "198.18.0.0/24");
        let n1 = l.node("node1").unwrap();
        assert_eq!(n1.netns, "berth-t1-node1");
        assert_eq!(n1.lan_ip, Ipv4Addr::new(198, 18, 0, 11));
        assert_eq!(n1.pod_cidr.to_string(), "10.244.1.0/24");
        assert_eq!(n1.gateway, Ipv4Addr::new(10, 244, 1, 1));
        assert_eq!(n1.pods[0].ip, Ipv4Addr::new(10, 244, 1, 2));
        assert_eq!(n1.pods[1].ip, Ipv4Addr::new(10, 244, 1, 3));
        let (host_node, b1) = l.pod("b1").unwrap();
        assert_eq!(host_node.name, "node2");
        assert_eq!(host_node.lan_ip, Ipv4Addr::new(198, 18, 0, 12));
        assert_eq!(b1.ip, Ipv4Addr::new(10, 244, 2, 2));
        assert_eq!(b1.netns, "berth-t1-b1");
        assert_eq!(
            l.client("client").unwrap().ip,
            Ipv4Addr::new(198, 18, 0, 100)
        );
        assert_eq!(
            l.client("other").unwrap().ip,
            Ipv4Addr::new(198, 18, 0, 101)
        );
        assert_eq!(
            l.namespaces(),
            [
                "berth-t1-lan",
                "berth-t1-node1",
                "berth-t1-a1",
                "berth-t1-a2",
                "berth-t1-node2",
                "berth-t1-b1",
                "berth-t1-client",
                "berth-t1-other"
            ]
        );
    }

    #[test]
    fn a_slot_is_free_only_when_its_veth_and_namespace_are_gone() {
        let l = layout(&mk_spec()).unwrap();
        let n1 = l.node("node1").unwrap();
        let taken = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
        assert_eq!(free_pod_slot("berth-t1", n1, &taken(&[])), Some(1));
        // A running pod's veth, then a lingering one whose pod is gone.
        assert_eq!(free_pod_slot("berth-t1", n1, &taken(&["vp1"])), Some(2));
        assert_eq!(
            free_pod_slot("berth-t1", n1, &taken(&["vp1", "vp2", "eth0", "lo"])),
            Some(3)
        );
        // A namespace that has not gone yet.
        assert_eq!(
            free_pod_slot("berth-t1", n1, &taken(&["berth-t1-node1-p1"])),
            Some(2)
        );
        // Another node's namespace of that slot does not matter.
        assert_eq!(
            free_pod_slot("berth-t1", n1, &taken(&["berth-t1-node2-p1"])),
            Some(1)
        );
        let all: BTreeSet<String> = (1..=253).map(|k| format!("vp{k}")).collect();
        assert_eq!(free_pod_slot("berth-t1", n1, &all), None);
    }

    #[test]
    fn link_names_are_read_from_ip_link_show() {
        let out = "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue\\    link/loopback 00:00:00:00:00:00\n\
                   2: eth0@if9: <BROADCAST,MULTICAST,UP> mtu 1500\\    link/ether 02:00:00:00:00:01\n\
                   7: vp3@if2: <BROADCAST,MULTICAST> mtu 1500\n";
        assert_eq!(parse_link_names(out), ["lo", "eth0", "vp3"]);
    }

    #[test]
    fn interface_names_fit_the_kernel_limit() {
        let pods: Vec<String> = (0..253).map(|k| format!("p{k}")).collect();
        let mut spec = TopologySpec::new("berth-t1");
        for i in 0..89 {
            spec = spec.node(&format!("n{i}"), pods.iter().map(|p| format!("{p}x{i}")));
        }
        for j in 0..100 {
            spec = spec.client(&format!("c{j}"));
        }
        let l = layout(&spec).unwrap();
        let mut names = vec![l.lan_bridge.clone()];
        for node in &l.nodes {
            names.push(node.lan_port.clone());
            names.extend(node.pods.iter().map(|p| p.node_veth.clone()));
        }
        names.extend(l.clients.iter().map(|c| c.lan_port.clone()));
        assert!(names.iter().all(|n| n.len() <= 15), "{names:?}");
        let last = l.nodes.last().unwrap();
        assert_eq!(last.lan_ip, Ipv4Addr::new(198, 18, 0, 99));
        assert_eq!(
            last.pods.last().unwrap().ip,
            Ipv4Addr::new(10, 244, 89, 254)
        );
        assert_eq!(l.clients.last().unwrap().ip, Ipv4Addr::new(198, 18, 0, 199));
    }

    #[test]
    fn refuses_what_the_plan_cannot_hold() {
        let cases = [
            TopologySpec::new("lab-t1").node("n", ["p"]),
            TopologySpec::new("berth-").node("n", ["p"]),
            TopologySpec::new("berth-a/b").node("n", ["p"]),
            TopologySpec::new("berth-t1").node("n", ["n"]),
            TopologySpec::new("berth-t1").node("lan", Vec::<String>::new()),
            TopologySpec::new("berth-t1").node("Node1", Vec::<String>::new()),
            TopologySpec::new("berth-t1").node("", Vec::<String>::new()),
            TopologySpec::new("berth-t1")
                .node("n1", ["p"])
                .node("n2", ["p"]),
            TopologySpec::new("berth-t1").client("c").client("c"),
            TopologySpec::new("berth-t1").node("n", (0..254).map(|k| format!("p{k}"))),
            (0..90).fold(TopologySpec::new("berth-t1"), |s, i| {
                s.node(&format!("n{i}"), Vec::<String>::new())
            }),
            (0..101).fold(TopologySpec::new("berth-t1"), |s, j| {
                s.client(&format!("c{j}"))
            }),
        ];
        for spec in cases {
            assert!(
                matches!(layout(&spec), Err(TopologyError::Invalid(_))),
                "{spec:?}"
            );
        }
    }

    #[test]
    fn the_control_plane_sits_at_dot_two_after_the_lan() {
        let l = layout(&mk_spec().control_plane("cp")).unwrap();
        let cp = l.control_plane.as_ref().unwrap();
        assert_eq!(
            (cp.netns.as_str(), cp.ip, cp.lan_port.as_str()),
            ("berth-t1-cp", Ipv4Addr::new(198, 18, 0, 2), "cp")
        );
        assert_eq!(&l.namespaces()[..2], ["berth-t1-lan", "berth-t1-cp"]);
        assert!(layout(&mk_spec().control_plane("node1")).is_err());
        assert!(layout(&mk_spec().control_plane("lan")).is_err());
    }

    #[test]
    fn pods_made_later_take_their_slot() {
        let l = layout(&mk_spec()).unwrap();
        let node2 = l.node("node2").unwrap();
        let pod = pod_layout("berth-t1", node2, 7, "web-0").unwrap();
        assert_eq!(pod.ip, Ipv4Addr::new(10, 244, 2, 8));
        assert_eq!(pod.netns, "berth-t1-node2-p7");
        assert_eq!(pod.node_veth, "vp7");
        assert_eq!(
            pod_layout("berth-t1", node2, 253, "x").unwrap().ip,
            Ipv4Addr::new(10, 244, 2, 254)
        );
        for slot in [0, 254, 255] {
            assert!(pod_layout("berth-t1", node2, slot, "x").is_err(), "{slot}");
        }
    }

    #[test]
    fn ipv6_addresses_mirror_the_ipv4_plan() {
        let l = layout(&mk_spec().control_plane("cp").with_ipv6()).unwrap();
        assert_eq!(l.lan6.unwrap().to_string(), "fd00:198:18::/64");
        let n1 = l.node("node1").unwrap();
        assert_eq!(n1.lan_ip6.unwrap().to_string(), "fd00:198:18::11");
        assert_eq!(n1.pod_cidr6.unwrap().to_string(), "fd00:244:1::/64");
        assert_eq!(n1.gateway6.unwrap().to_string(), "fd00:244:1::1");
        assert_eq!(
            n1.pods[1].ips(),
            [
                "10.244.1.3".parse::<IpAddr>().unwrap(),
                "fd00:244:1::3".parse().unwrap()
            ]
        );
        let n2 = l.node("node2").unwrap();
        assert_eq!(
            n2.lan_ips(),
            [
                "198.18.0.12".parse::<IpAddr>().unwrap(),
                "fd00:198:18::12".parse().unwrap()
            ]
        );
        assert_eq!(
            l.client("other").unwrap().ip6.unwrap().to_string(),
            "fd00:198:18::101"
        );
        let cp = l.control_plane.as_ref().unwrap();
        assert_eq!(cp.ip6.unwrap().to_string(), "fd00:198:18::2");
        let later = pod_layout("berth-t1", n2, 253, "x").unwrap();
        assert_eq!(later.ip6.unwrap().to_string(), "fd00:244:2::254");
        // Without IPv6, nothing of it.
        let v4 = layout(&mk_spec()).unwrap();
        assert_eq!(v4.lan6, None);
        assert!(v4
            .nodes
            .iter()
            .all(|n| n.lan_ip6.is_none() && n.pod_cidr6.is_none()));
        assert_eq!(v4.nodes[0].pods[0].ips().len(), 1);
        assert_eq!(
            pod_layout("berth-t1", &v4.nodes[0], 3, "y").unwrap().ip6,
            None
        );
    }

    #[test]
    fn hex_digits_spell_the_decimal_number() {
        for (n, hex) in [
            (0, 0x0),
            (2, 0x2),
            (11, 0x11),
            (100, 0x100),
            (254, 0x254),
            (9999, 0x9999),
        ] {
            assert_eq!(hex_digits(n), hex, "{n}");
        }
    }

    #[test]
    fn every_ipv6_host_of_the_plan_is_distinct() {
        let mut spec = TopologySpec::new("berth-t1")
            .control_plane("cp")
            .with_ipv6();
        for i in 0..89 {
            spec = spec.node(&format!("n{i}"), (0..3).map(move |k| format!("p{k}x{i}")));
        }
        for j in 0..100 {
            spec = spec.client(&format!("c{j}"));
        }
        let l = layout(&spec).unwrap();
        let mut seen = BTreeSet::new();
        let lan6 = l.lan6.unwrap();
        for ip in l
            .nodes
            .iter()
            .filter_map(|n| n.lan_ip6)
            .chain(l.clients.iter().filter_map(|c| c.ip6))
            .chain(l.control_plane.iter().filter_map(|c| c.ip6))
        {
            assert!(lan6.contains(&ip), "{ip}");
            assert!(seen.insert(ip), "{ip} twice");
        }
        assert_eq!(seen.len(), 89 + 100 + 1);
        for node in &l.nodes {
            let cidr = node.pod_cidr6.unwrap();
            assert!(cidr.contains(&node.gateway6.unwrap()));
            for pod in &node.pods {
                assert!(cidr.contains(&pod.ip6.unwrap()));
                assert!(seen.insert(pod.ip6.unwrap()));
            }
        }
    }

    #[test]
    fn route_localnet_applies_to_the_node_added_last() {
        let spec = TopologySpec::new("berth-t1")
            .node("n1", Vec::<String>::new())
            .with_route_localnet()
            .node("n2", Vec::<String>::new());
        let l = layout(&spec).unwrap();
        assert!(l.nodes[0].route_localnet);
        assert!(!l.nodes[1].route_localnet);
    }
}

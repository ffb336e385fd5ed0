//! Layout -> the `ip` commands that build it, and those that take it down.
//!
//! Every step names the namespace it acts in (`ip netns add`, `ip -n <ns>`, `ip netns exec <ns>`),
//! so none can act on the namespace of the process that runs it: that is what keeps the root
//! namespace untouched, and the tests below check it for every step.

use super::layout::{Layout, NodeLayout, PodLayout};
use super::{ETH0, SERVICE6_CIDR, SERVICE_CIDR};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `ip netns add <netns>`.
    AddNetns(String),
    /// `ip -n <netns> <args>`.
    Ip { netns: String, args: Vec<String> },
    /// `ip netns exec <netns> sysctl -qw <key>=<value>`: sysctls under net.* are per namespace.
    Sysctl {
        netns: String,
        key: String,
        value: String,
    },
    /// `ip netns delete <netns>`: takes the namespace's interfaces (and their veth peers) with it.
    DeleteNetns(String),
}

impl Step {
    /// The namespace the step acts in.
    pub fn netns(&self) -> &str {
        match self {
            Step::AddNetns(ns) | Step::DeleteNetns(ns) => ns,
            Step::Ip { netns, .. } | Step::Sysctl { netns, .. } => netns,
        }
    }

    /// The full command line; the program is always `ip`.
    pub fn argv(&self) -> Vec<String> {
        let mut argv = vec!["ip".to_string()];
        match self {
            Step::AddNetns(ns) => argv.extend(["netns".into(), "add".into(), ns.clone()]),
            Step::DeleteNetns(ns) => argv.extend(["netns".into(), "delete".into(), ns.clone()]),
            Step::Ip { netns, args } => {
                argv.extend(["-n".into(), netns.clone()]);
                argv.extend(args.iter().cloned());
            }
            Step::Sysctl { netns, key, value } => argv.extend([
                "netns".into(),
                "exec".into(),
                netns.clone(),
                "sysctl".into(),
                "-qw".into(),
                format!("{key}={value}"),
            ]),
        }
        argv
    }
}

fn ip(netns: &str, args: &[&str]) -> Step {
    Step::Ip {
        netns: netns.to_string(),
        args: args.iter().map(|a| a.to_string()).collect(),
    }
}

fn sysctl(netns: &str, key: &str, value: &str) -> Step {
    Step::Sysctl {
        netns: netns.to_string(),
        key: key.to_string(),
        value: value.to_string(),
    }
}

/// A veth pair made inside `netns` whose peer is moved straight into `peer_netns`, so neither end
/// ever exists in the namespace running the command.
fn veth(netns: &str, name: &str, peer_netns: &str, peer: &str) -> Step {
    ip(
        netns,
        &[
            "link", "add", name, "type", "veth", "peer", "name", peer, "netns", peer_netns,
        ],
    )
}

/// `ip addr add <addr> dev <dev>` for an IPv6 address: without duplicate address detection,
/// which would keep it unusable for a second while nothing else on the lab LAN can hold it.
fn addr6(netns: &str, addr: &str, dev: &str) -> Step {
    ip(netns, &["addr", "add", addr, "dev", dev, "nodad"])
}

/// Plugs `netns` into the LAN: a veth from `port` on the bridge `br` in `lan` to its eth0,
/// which gets `addr` (with the LAN's prefix length), and `addr6` too when given. Nodes and
/// clients join the LAN alike.
fn join_lan(
    lan: &str,
    br: &str,
    port: &str,
    netns: &str,
    addr: &str,
    addr6: Option<&str>,
) -> Vec<Step> {
    let mut steps = vec![
        veth(lan, port, netns, ETH0),
        ip(lan, &["link", "set", port, "master", br, "up"]),
        ip(netns, &["addr", "add", addr, "dev", ETH0]),
    ];
    steps.extend(addr6.map(|a| self::addr6(netns, a, ETH0)));
    steps.push(ip(netns, &["link", "set", ETH0, "up"]));
    steps
}

fn node_sysctls(node: &NodeLayout) -> Vec<Step> {
    let ns = &node.netns;
    let mut steps = vec![
        sysctl(ns, "net.ipv4.ip_forward", "1"),
        // Strict reverse-path filtering inherited from the host would drop asymmetric lab paths.
        sysctl(ns, "net.ipv4.conf.all.rp_filter", "0"),
        sysctl(ns, "net.ipv4.conf.default.rp_filter", "0"),
    ];
    if node.route_localnet {
        steps.push(sysctl(ns, "net.ipv4.conf.all.route_localnet", "1"));
    }
    if node.lan_ip6.is_some() {
        steps.push(sysctl(ns, "net.ipv6.conf.all.forwarding", "1"));
    }
    steps
}

/// Links a pod's namespace to its node: a veth, the gateway on the node's end, a /32 route each
/// way and the pod's default route.
fn pod_link_steps(node: &NodeLayout, pod: &PodLayout) -> Vec<Step> {
    let ns = &node.netns;
    let gateway = node.gateway.to_string();
    let gateway_host = format!("{gateway}/32");
    let (pns, veth_name) = (&pod.netns, &pod.node_veth);
    let pod_ip = pod.ip.to_string();
    let mut steps = vec![
        veth(ns, veth_name, pns, ETH0),
        // The same gateway address on every pod veth: each pod finds its gateway on its own
        // link, and the node routes each pod address to that pod's veth.
        ip(ns, &["addr", "add", &gateway_host, "dev", veth_name]),
        ip(ns, &["link", "set", veth_name, "up"]),
        ip(
            ns,
            &[
                "route",
                "add",
                &format!("{pod_ip}/32"),
                "dev",
                veth_name,
                "src",
                &gateway,
            ],
        ),
        ip(pns, &["addr", "add", &format!("{pod_ip}/32"), "dev", ETH0]),
        ip(pns, &["link", "set", ETH0, "up"]),
        ip(
            pns,
            &["route", "add", &gateway_host, "dev", ETH0, "scope", "link"],
        ),
        ip(
            pns,
            &["route", "add", "default", "via", &gateway, "dev", ETH0],
        ),
    ];
    if let (Some(gateway6), Some(pod_ip6)) = (node.gateway6, pod.ip6) {
        let gateway6 = gateway6.to_string();
        let gateway6_host = format!("{gateway6}/128");
        let pod_host6 = format!("{pod_ip6}/128");
        steps.extend([
            addr6(ns, &gateway6_host, veth_name),
            ip(
                ns,
                &[
                    "route", "add", &pod_host6, "dev", veth_name, "src", &gateway6,
                ],
            ),
            addr6(pns, &pod_host6, ETH0),
            ip(pns, &["route", "add", &gateway6_host, "dev", ETH0]),
            ip(
                pns,
                &["route", "add", "::/0", "via", &gateway6, "dev", ETH0],
            ),
        ]);
    }
    steps
}

/// The steps that add one pod to a running topology: its namespace, then its link to the node.
/// Deleting the namespace ([`plan_destroy`]) removes the veth, and with it the node's route.
pub fn plan_add_pod(node: &NodeLayout, pod: &PodLayout) -> Vec<Step> {
    let mut steps = vec![
        Step::AddNetns(pod.netns.clone()),
        ip(&pod.netns, &["link", "set", "lo", "up"]),
    ];
    steps.extend(pod_link_steps(node, pod));
    steps
}

/// Every step that builds `layout`, in order. Namespaces are all created first, so a veth's peer
/// namespace always exists when the veth is made.
pub fn plan_create(layout: &Layout) -> Vec<Step> {
    let mut steps: Vec<Step> = layout
        .namespaces()
        .into_iter()
        .map(|ns| Step::AddNetns(ns.to_string()))
        .collect();
    for ns in layout.namespaces() {
        steps.push(ip(ns, &["link", "set", "lo", "up"]));
    }
    let lan = &layout.lan_netns;
    let br = &layout.lan_bridge;
    if layout.lan6.is_some() {
        // Without snooping the bridge floods every Neighbor Solicitation, as a plain switch
        // does: the announcer listens on a solicited-node group it never reports with MLD.
        steps.push(ip(
            lan,
            &["link", "add", br, "type", "bridge", "mcast_snooping", "0"],
        ));
    } else {
        steps.push(ip(lan, &["link", "add", br, "type", "bridge"]));
    }
    steps.push(ip(lan, &["link", "set", br, "up"]));
    let lan_len = layout.lan.prefix_len();
    let lan6_len = layout.lan6.map(|n| n.prefix_len());
    let with_len6 = |ip6: Option<std::net::Ipv6Addr>| match (ip6, lan6_len) {
        (Some(ip6), Some(len)) => Some(format!("{ip6}/{len}")),
        _ => None,
    };

    for node in &layout.nodes {
        let ns = &node.netns;
        steps.extend(node_sysctls(node));
        let lan_addr = format!("{}/{lan_len}", node.lan_ip);
        let lan_addr6 = with_len6(node.lan_ip6);
        steps.extend(join_lan(
            lan,
            br,
            &node.lan_port,
            ns,
            &lan_addr,
            lan_addr6.as_deref(),
        ));
        steps.push(ip(
            ns,
            &["route", "add", SERVICE_CIDR, "dev", ETH0, "scope", "link"],
        ));
        if node.lan_ip6.is_some() {
            steps.push(ip(ns, &["route", "add", SERVICE6_CIDR, "dev", ETH0]));
        }
        for other in layout.nodes.iter().filter(|o| o.name != node.name) {
            steps.push(ip(
                ns,
                &[
                    "route",
                    "add",
                    &other.pod_cidr.to_string(),
                    "via",
                    &other.lan_ip.to_string(),
                    "dev",
                    ETH0,
                ],
            ));
            if let (Some(cidr6), Some(via6)) = (other.pod_cidr6, other.lan_ip6) {
                steps.push(ip(
                    ns,
                    &[
                        "route",
                        "add",
                        &cidr6.to_string(),
                        "via",
                        &via6.to_string(),
                        "dev",
                        ETH0,
                    ],
                ));
            }
        }
        for pod in &node.pods {
            steps.extend(pod_link_steps(node, pod));
        }
    }
    if let Some(cp) = &layout.control_plane {
        let addr = format!("{}/{lan_len}", cp.ip);
        let addr6 = with_len6(cp.ip6);
        steps.extend(join_lan(
            lan,
            br,
            &cp.lan_port,
            &cp.netns,
            &addr,
            addr6.as_deref(),
        ));
    }
    for client in &layout.clients {
        let ns = &client.netns;
        let addr = format!("{}/{lan_len}", client.ip);
        let addr6 = with_len6(client.ip6);
        steps.extend(join_lan(
            lan,
            br,
            &client.lan_port,
            ns,
            &addr,
            addr6.as_deref(),
        ));
    }
    steps
}

/// Deletes `namespaces` in reverse creation order.
pub fn plan_destroy<'a>(namespaces: impl DoubleEndedIterator<Item = &'a str>) -> Vec<Step> {
    namespaces
        .rev()
        .map(|ns| Step::DeleteNetns(ns.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::layout::layout;
    use super::super::TopologySpec;
    use super::*;

    fn mk_layout() -> Layout {
        layout(
            &TopologySpec::new("berth-t7")
                .node("node1", ["a1", "a2"])
                .with_route_localnet()
                .node("node2", ["b1"])
                .client("client"),
        )
        .unwrap()
    }

    fn render(steps: &[Step]) -> Vec<String> {
        steps.iter().map(|s| s.argv().join(" ")).collect()
    }

    #[test]
    fn every_step_acts_in_a_namespace_made_before_it() {
        let l = mk_layout();
        let steps = plan_create(&l);
        let mut made = BTreeSet::new();
        for step in &steps {
            let argv = step.argv();
            assert_eq!(argv[0], "ip");
            match step {
                Step::AddNetns(ns) => {
                    assert!(ns.starts_with("berth-t7-"), "{ns}");
                    assert!(made.insert(ns.clone()), "added twice: {ns}");
                }
                Step::DeleteNetns(_) => panic!("a create plan deletes nothing"),
                Step::Ip { netns, args } => {
                    assert!(made.contains(netns), "{argv:?} before its namespace");
                    assert_eq!(&argv[1..3], ["-n", netns.as_str()]);
                    if let Some(i) = args.iter().position(|a| a == "netns") {
                        assert!(made.contains(&args[i + 1]), "{argv:?}: peer namespace");
                    }
                }
                Step::Sysctl { netns, key, .. } => {
                    assert!(made.contains(netns), "{argv:?} before its namespace");
                    assert_eq!(&argv[1..4], ["netns", "exec", netns.as_str()]);
                    assert!(key.starts_with("net."), "{key}");
                }
            }
        }
        let expected: BTreeSet<String> = l.namespaces().iter().map(|s| s.to_string()).collect();
        assert_eq!(made, expected);
    }

    #[test]
    fn builds_the_documented_picture() {
        let steps = render(&plan_create(&mk_layout()));
        for expected in [
            "ip -n berth-t7-lan link add br0 type bridge",
            "ip -n berth-t7-lan link add n1 type veth peer name eth0 netns berth-t7-node1",
            "ip -n berth-t7-lan link set n1 master br0 up",
            "ip -n berth-t7-node1 addr add 198.18.0.11/24 dev eth0",
            "ip -n berth-t7-node2 addr add 198.18.0.12/24 dev eth0",
            "ip -n berth-t7-node1 route add 10.244.2.0/24 via 198.18.0.12 dev eth0",
            "ip -n berth-t7-node2 route add 10.244.1.0/24 via 198.18.0.11 dev eth0",
            "ip -n berth-t7-node1 route add 10.96.0.0/16 dev eth0 scope link",
            "ip netns exec berth-t7-node1 sysctl -qw net.ipv4.ip_forward=1",
            "ip netns exec berth-t7-node1 sysctl -qw net.ipv4.conf.all.route_localnet=1",
            "ip -n berth-t7-node1 link add vp2 type veth peer name eth0 netns berth-t7-a2",
            "ip -n berth-t7-node1 addr add 10.244.1.1/32 dev vp2",
            "ip -n berth-t7-node1 route add 10.244.1.3/32 dev vp2 src 10.244.1.1",
            "ip -n berth-t7-a2 addr add 10.244.1.3/32 dev eth0",
            "ip -n berth-t7-a2 route add default via 10.244.1.1 dev eth0",
            "ip -n berth-t7-b1 route add default via 10.244.2.1 dev eth0",
            "ip -n berth-t7-lan link add c0 type veth peer name eth0 netns berth-t7-client",
            "ip -n berth-t7-client addr add 198.18.0.100/24 dev eth0",
        ] {
            assert!(steps.iter().any(|s| s == expected), "missing {expected:?}");
        }
        // route_localnet only where asked for; no node routes to its own pod CIDR via the LAN.
        assert!(!steps
            .iter()
            .any(|s| s.contains("node2 sysctl -qw net.ipv4.conf.all.route_localnet")));
        assert!(!steps
            .iter()
            .any(|s| s == "ip -n berth-t7-node1 route add 10.244.1.0/24 via 198.18.0.11 dev eth0"));
    }

    #[test]
    fn a_pod_added_later_gets_the_same_links_as_a_planned_one() {
        let l = mk_layout();
        let node1 = l.node("node1").unwrap();
        let planned = &node1.pods[1];
        let later = plan_add_pod(node1, planned);
        assert_eq!(later[0], Step::AddNetns("berth-t7-a2".into()));
        assert_eq!(
            later[1].argv().join(" "),
            "ip -n berth-t7-a2 link set lo up"
        );
        let created = render(&plan_create(&l));
        for step in render(&later[2..]) {
            assert!(created.contains(&step), "{step}");
        }
        assert_eq!(later.len(), 10);
    }

    #[test]
    fn with_ipv6_every_namespace_gets_its_second_address_and_routes() {
        let l = layout(
            &TopologySpec::new("berth-t7")
                .control_plane("cp")
                .node("node1", ["a1"])
                .node("node2", ["b1"])
                .client("client")
                .with_ipv6(),
        )
        .unwrap();
        let steps = render(&plan_create(&l));
        for expected in [
            "ip -n berth-t7-lan link add br0 type bridge mcast_snooping 0",
            "ip netns exec berth-t7-node1 sysctl -qw net.ipv6.conf.all.forwarding=1",
            "ip -n berth-t7-node1 addr add 198.18.0.11/24 dev eth0",
            "ip -n berth-t7-node1 addr add fd00:198:18::11/64 dev eth0 nodad",
            "ip -n berth-t7-node1 route add fd00:96::/112 dev eth0",
            "ip -n berth-t7-node1 route add fd00:244:2::/64 via fd00:198:18::12 dev eth0",
            "ip -n berth-t7-node2 route add fd00:244:1::/64 via fd00:198:18::11 dev eth0",
            "ip -n berth-t7-node1 addr add fd00:244:1::1/128 dev vp1 nodad",
            "ip -n berth-t7-node1 route add fd00:244:1::2/128 dev vp1 src fd00:244:1::1",
            "ip -n berth-t7-a1 addr add fd00:244:1::2/128 dev eth0 nodad",
            "ip -n berth-t7-a1 route add fd00:244:1::1/128 dev eth0",
            "ip -n berth-t7-a1 route add ::/0 via fd00:244:1::1 dev eth0",
            "ip -n berth-t7-b1 route add ::/0 via fd00:244:2::1 dev eth0",
            "ip -n berth-t7-cp addr add fd00:198:18::2/64 dev eth0 nodad",
            "ip -n berth-t7-client addr add fd00:198:18::100/64 dev eth0 nodad",
        ] {
            assert!(steps.iter().any(|s| s == expected), "missing {expected:?}");
        }
        // An address goes on before its link comes up.
        let pos = |line: &str| steps.iter().position(|s| s == line).unwrap();
        assert!(
            pos("ip -n berth-t7-client addr add fd00:198:18::100/64 dev eth0 nodad")
                < pos("ip -n berth-t7-client link set eth0 up")
        );
        // Pods added later get the same IPv6 steps as planned ones.
        let node1 = l.node("node1").unwrap();
        let later = render(&plan_add_pod(node1, &node1.pods[0]));
        for step in &later[2..] {
            assert!(steps.contains(step), "{step}");
        }
        assert_eq!(later.len(), 15);
        // Without IPv6, no IPv6 step at all.
        let v4 = render(&plan_create(&mk_layout()));
        assert!(
            v4.iter()
                .all(|s| !s.contains("fd00") && !s.contains("ipv6") && !s.contains("::")),
            "{v4:?}"
        );
    }

    #[test]
    fn the_control_plane_joins_the_lan() {
        let l = layout(
            &TopologySpec::new("berth-t7")
                .control_plane("cp")
                .node("node1", Vec::<String>::new()),
        )
        .unwrap();
        let steps = render(&plan_create(&l));
        for expected in [
            "ip netns add berth-t7-cp",
            "ip -n berth-t7-lan link add cp type veth peer name eth0 netns berth-t7-cp",
            "ip -n berth-t7-cp addr add 198.18.0.2/24 dev eth0",
        ] {
            assert!(steps.iter().any(|s| s == expected), "missing {expected:?}");
        }
    }

    #[test]
    fn destroy_deletes_in_reverse_order() {
        let l = mk_layout();
        let steps = plan_destroy(l.namespaces().into_iter());
        assert_eq!(steps.len(), l.namespaces().len());
        assert_eq!(steps[0], Step::DeleteNetns("berth-t7-client".into()));
        assert_eq!(
            steps.last().unwrap().argv(),
            ["ip", "netns", "delete", "berth-t7-lan"]
        );
    }
}

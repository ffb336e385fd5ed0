//! The cluster in both families: the IPv6 twin of every IPv4 address of the plan, the IPv6
//! addresses and routes added to the lab topology (which builds IPv4 only), and the Services made
//! dual-stack.
//!
//! IPv6 plan: every IPv4 address of the plan has one twin, the same host in ULA space:
//! - LAN 198.18.0.d -> fd00:198:18::d (node1 fd00:198:18::b, client fd00:198:18::64, LB .200 ->
//!   fd00:198:18::c8), on a /64;
//! - pods 10.244.n.d -> fd00:244:n::d (pod CIDR fd00:244:n::/120, gateway fd00:244:n::1,
//!   cluster CIDR fd00:244::/32);
//! - Services 10.96.c.d -> fd00:96::c:d (fd00:96::a for 10.96.0.10);
//! - 127.0.0.1 -> ::1.
//!
//! Scenarios write addresses in the IPv4 plan; [`in_family`] gives the same host in the family
//! under test, so one scenario body serves both.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use berth_core::IpFamily;
use berth_datapath::ServicePort;
use berth_lab::topology::Topology;
use ipnet::{IpNet, Ipv6Net};

/// The IPv6 twin of an IPv4 address of the plan. Addresses outside the plan have none.
pub fn v6_twin(ip: Ipv4Addr) -> Option<Ipv6Addr> {
    let [a, b, c, d] = ip.octets();
    let (c, d) = (u16::from(c), u16::from(d));
    match (a, b) {
        (198, 18) if c == 0 => Some(Ipv6Addr::new(0xfd00, 0x198, 0x18, 0, 0, 0, 0, d)),
        (10, 244) => Some(Ipv6Addr::new(0xfd00, 0x244, c, 0, 0, 0, 0, d)),
        (10, 96) => Some(Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, c, d)),
        (127, 0) if ip == Ipv4Addr::LOCALHOST => Some(Ipv6Addr::LOCALHOST),
        _ => None,
    }
}

/// `ip` (an address of the IPv4 plan) in `family`.
pub fn in_family(ip: IpAddr, family: IpFamily) -> IpAddr {
    match (ip, family) {
        (IpAddr::V4(v4), IpFamily::V6) => {
            IpAddr::V6(v6_twin(v4).unwrap_or_else(|| panic!("{v4} has no IPv6 twin in the plan")))
        }
        (ip, _) => ip,
    }
}

/// The IPv6 twin of a network of the plan: the twin of its address, with the prefix grown by
/// the 96 bits IPv6 adds. Right for a host, a LAN range or a node's pod CIDR (/24 and longer);
/// the cluster CIDR 10.244.0.0/16 has no such twin (fd00:244::/32 holds the pod CIDRs).
pub fn net_twin(net: IpNet) -> IpNet {
    let IpNet::V4(v4) = net else { return net };
    let addr = v6_twin(v4.network()).unwrap_or_else(|| panic!("{v4} has no IPv6 twin"));
    IpNet::V6(Ipv6Net::new(addr, v4.prefix_len() + 96).unwrap())
}

/// `port` made dual-stack: every address it holds (cluster, external, load-balancer IPs, source
/// ranges, endpoints) gets its IPv6 twin beside it, as a dual-stack Service has.
pub fn dual_stack(mut port: ServicePort) -> ServicePort {
    let twin = |ip: &IpAddr| in_family(*ip, IpFamily::V6);
    let v6: Vec<IpAddr> = port.cluster_ips.iter().map(twin).collect();
    port.cluster_ips.extend(v6);
    let v6: Vec<IpAddr> = port.external_ips.iter().map(twin).collect();
    port.external_ips.extend(v6);
    let mut v6 = port.load_balancer_ingress.clone();
    v6.iter_mut().for_each(|i| i.ip = twin(&i.ip));
    port.load_balancer_ingress.extend(v6);
    let v6: Vec<IpNet> = port.source_ranges.iter().copied().map(net_twin).collect();
    port.source_ranges.extend(v6);
    let mut v6 = port.endpoints.to_vec();
    v6.iter_mut().for_each(|ep| ep.ip = twin(&ep.ip));
    port.endpoints.edit(|eps| eps.extend(v6));
    port
}

fn v6(ip: Ipv4Addr) -> String {
    v6_twin(ip).unwrap().to_string()
}

/// Adds the IPv6 twin of every address and route the topology made in IPv4, inside its own
/// namespaces; addresses skip duplicate address detection, so they answer at once.
pub fn add_ipv6(topo: &mut Topology) {
    let layout = topo.layout().clone();
    let mut steps: Vec<(String, String)> = Vec::new();
    let mut step = |ns: &str, line: String| steps.push((ns.to_string(), line));
    for node in &layout.nodes {
        let ns = &node.netns;
        step(ns, "sysctl -qw net.ipv6.conf.all.forwarding=1".into());
        step(
            ns,
            format!("ip -6 addr add {}/64 dev eth0 nodad", v6(node.lan_ip)),
        );
        step(ns, "ip -6 route add fd00:96::/112 dev eth0".into());
        for other in layout.nodes.iter().filter(|o| o.name != node.name) {
            step(
                ns,
                format!(
                    "ip -6 route add {} via {} dev eth0",
                    net_twin(IpNet::V4(other.pod_cidr)).trunc(),
                    v6(other.lan_ip)
                ),
            );
        }
        let gateway = v6(node.gateway);
        for pod in &node.pods {
            let veth = &pod.node_veth;
            step(ns, format!("ip -6 addr add {gateway}/128 dev {veth} nodad"));
            step(
                ns,
                format!(
                    "ip -6 route add {}/128 dev {veth} src {gateway}",
                    v6(pod.ip)
                ),
            );
            let pns = &pod.netns;
            step(
                pns,
                format!("ip -6 addr add {}/128 dev eth0 nodad", v6(pod.ip)),
            );
            step(pns, format!("ip -6 route add {gateway}/128 dev eth0"));
            step(
                pns,
                format!("ip -6 route add default via {gateway} dev eth0"),
            );
        }
    }
    for client in &layout.clients {
        step(
            &client.netns,
            format!("ip -6 addr add {}/64 dev eth0 nodad", v6(client.ip)),
        );
    }
    for (ns, line) in steps {
        let argv: Vec<&str> = line.split_whitespace().collect();
        topo.exec(&ns, &argv)
            .unwrap_or_else(|err| panic!("{ns}: {line}: {err}"));
    }
}

//! `berth lab up --bgp`: a router on the LAN running its own FRR (zebra, bfdd, bgpd) with
//! `maximum-paths`, peering with every node's FRR, and a client behind the router; each node
//! runs FRR beside its agent (`berth agent --bgp-speaker`), as the chart's sidecar does.
//!
//! Address plan (docs/bgp.md): the router is the LAN's second client, 198.18.0.101 and
//! fd00:198:18::101; behind it `<prefix>-outside` on 198.19.20.0/24 and fd00:19:20::/64 (router
//! .1 and ::1, client .100 and ::100). The BGP pool of the examples, 198.19.10.0/24 and
//! fd00:19:10::/120, lies outside the LAN, so the outside client's traffic is really routed. Nodes
//! speak AS 64512, the router AS 64513.
//!
//! Everything here is pure (the plan, the router's configuration, reading the router's FIB);
//! [`super::Lab`] runs it.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use crate::topology::{ClientLayout, Layout, ETH0};

use super::component::Component;
use super::families::LabFamilies;
use super::ClusterError;

/// The router's name in the topology (a client on the LAN).
pub const ROUTER: &str = "router";
/// The namespace behind the router: `<prefix>-outside`.
pub const OUTSIDE: &str = "outside";
/// The nodes' AS.
pub const NODE_ASN: u32 = 64512;
/// The router's AS.
pub const ROUTER_ASN: u32 = 64513;
/// The network behind the router, and the router's and the client's hosts in it.
pub const OUTSIDE_NET: Ipv4Addr = Ipv4Addr::new(198, 19, 20, 0);
pub const OUTSIDE6_NET: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x19, 0x20, 0, 0, 0, 0, 0);
const OUTSIDE_ROUTER_HOST: u8 = 1;
const OUTSIDE_CLIENT_HOST: u8 = 100;
/// Where Debian's `frr` puts its daemons and `frr-reload.py`.
pub const FRR_LIB: &str = "/usr/lib/frr";
/// The daemons berth's speaker uses, in start order.
pub const DAEMONS: [&str; 3] = ["zebra", "bfdd", "bgpd"];

/// The client behind the router, as the proof and the journeys use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outside {
    pub name: String,
    pub netns: String,
    pub ip: Ipv4Addr,
    pub ip6: Option<Ipv6Addr>,
}

fn v4(net: Ipv4Addr, host: u8) -> Ipv4Addr {
    let [a, b, c, _] = net.octets();
    Ipv4Addr::new(a, b, c, host)
}

/// The IPv4 host number written as hex digits, as the lab's IPv6 plan does (100 is ::100).
fn v6(net: Ipv6Addr, host: u8) -> Ipv6Addr {
    let mut s = net.segments();
    s[7] = u16::from_str_radix(&host.to_string(), 16).unwrap_or(0);
    Ipv6Addr::from(s)
}

/// The router in `layout`.
pub fn router(layout: &Layout) -> Result<&ClientLayout, ClusterError> {
    layout
        .client(ROUTER)
        .ok_or_else(|| ClusterError::Invalid("the lab has no BGP router".into()))
}

/// The client behind the router (IPv6 too when the LAN has it).
pub fn outside(layout: &Layout) -> Outside {
    Outside {
        name: OUTSIDE.into(),
        netns: format!("{}-{OUTSIDE}", layout.prefix),
        ip: v4(OUTSIDE_NET, OUTSIDE_CLIENT_HOST),
        ip6: layout.lan6.map(|_| v6(OUTSIDE6_NET, OUTSIDE_CLIENT_HOST)),
    }
}

/// Where a namespace's FRR keeps its sockets, pid files and `frr.conf`.
pub fn frr_dir(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join("frr").join(name)
}

/// FRR's three daemons for one namespace, in the foreground (so the lab owns their pids), with
/// an empty configuration: the agent (or, on the router, the lab) applies `frr.conf` with
/// `frr-reload.py`, as on a cluster.
pub fn frr_components(owner: &str, netns: &str, dir: &Path, logs: &Path) -> Vec<Component> {
    let d = dir.display().to_string();
    DAEMONS
        .iter()
        .map(|daemon| Component {
            name: format!("frr-{owner}-{daemon}"),
            netns: Some(netns.to_string()),
            program: Some(format!("{FRR_LIB}/{daemon}")),
            args: [
                "-u",
                "frr",
                "-g",
                "frr",
                "-i",
                &format!("{d}/{daemon}.pid"),
                "--vty_socket",
                &d,
                "-z",
                &format!("{d}/zserv.api"),
                "-f",
                "/dev/null",
                "--log",
                "stdout",
            ]
            .iter()
            .map(|a| a.to_string())
            .collect(),
            log: logs.join(format!("frr-{owner}-{daemon}.log")),
        })
        .collect()
}

/// `frr-reload.py` applying `dir/frr.conf` inside `netns`.
pub fn reload_argv(netns: &str, dir: &Path) -> Vec<String> {
    let d = dir.display().to_string();
    [
        "ip",
        "netns",
        "exec",
        netns,
        "python3",
        &format!("{FRR_LIB}/frr-reload.py"),
        "--reload",
        "--stdout",
        "--vty_socket",
        &d,
        "--confdir",
        &d,
        "--rundir",
        &d,
        &format!("{d}/frr.conf"),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect()
}

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

/// The commands that put the outside client behind the router (a veth, addresses, its default
/// routes), make the router forward (hashing on ports too, so one client's connections spread
/// over the ECMP next hops) and give every node a route to the outside network through the
/// router. The router and the nodes exist (the topology made them).
pub fn plan_network(layout: &Layout) -> Result<Vec<Vec<String>>, ClusterError> {
    let r = router(layout)?;
    let out = outside(layout);
    let (rns, ons) = (r.netns.as_str(), out.netns.as_str());
    let router_out = v4(OUTSIDE_NET, OUTSIDE_ROUTER_HOST);
    let mut steps = vec![
        argv(&["ip", "netns", "add", ons]),
        argv(&["ip", "-n", ons, "link", "set", "lo", "up"]),
        argv(&[
            "ip", "-n", rns, "link", "add", "eth1", "type", "veth", "peer", "name", ETH0, "netns",
            ons,
        ]),
        argv(&["ip", "-n", rns, "link", "set", "eth1", "up"]),
        argv(&["ip", "-n", ons, "link", "set", ETH0, "up"]),
        argv(&[
            "ip",
            "-n",
            rns,
            "addr",
            "add",
            &format!("{router_out}/24"),
            "dev",
            "eth1",
        ]),
        argv(&[
            "ip",
            "-n",
            ons,
            "addr",
            "add",
            &format!("{}/24", out.ip),
            "dev",
            ETH0,
        ]),
        argv(&[
            "ip",
            "-n",
            ons,
            "route",
            "add",
            "default",
            "via",
            &router_out.to_string(),
        ]),
    ];
    let mut sysctls = vec![
        "net.ipv4.ip_forward=1",
        "net.ipv4.fib_multipath_hash_policy=1",
    ];
    if let Some(ip6) = out.ip6 {
        let router_out6 = v6(OUTSIDE6_NET, OUTSIDE_ROUTER_HOST);
        steps.extend([
            argv(&[
                "ip",
                "-n",
                rns,
                "addr",
                "add",
                &format!("{router_out6}/64"),
                "dev",
                "eth1",
                "nodad",
            ]),
            argv(&[
                "ip",
                "-n",
                ons,
                "addr",
                "add",
                &format!("{ip6}/64"),
                "dev",
                ETH0,
                "nodad",
            ]),
            argv(&[
                "ip",
                "-n",
                ons,
                "-6",
                "route",
                "add",
                "default",
                "via",
                &router_out6.to_string(),
            ]),
        ]);
        sysctls.extend([
            "net.ipv6.conf.all.forwarding=1",
            "net.ipv6.fib_multipath_hash_policy=1",
        ]);
    }
    for sysctl in sysctls {
        steps.push(argv(&["ip", "netns", "exec", rns, "sysctl", "-qw", sysctl]));
    }
    for node in &layout.nodes {
        steps.push(argv(&[
            "ip",
            "-n",
            &node.netns,
            "route",
            "add",
            &format!("{OUTSIDE_NET}/24"),
            "via",
            &r.ip.to_string(),
        ]));
        if let (Some(_), Some(router6)) = (out.ip6, r.ip6) {
            steps.push(argv(&[
                "ip",
                "-n",
                &node.netns,
                "-6",
                "route",
                "add",
                &format!("{OUTSIDE6_NET}/64"),
                "via",
                &router6.to_string(),
            ]));
        }
    }
    Ok(steps)
}

/// The router's `frr.conf`: every node a neighbour in AS [`NODE_ASN`] with BFD and the nodes'
/// timers (hold 9 s, keepalive 3 s, a connection retried every second so sessions come up
/// quickly), over IPv4 and, on an IPv6 LAN, over IPv6 for IPv6 unicast; `maximum-paths` so
/// an address announced by several nodes becomes an ECMP route in the router's kernel.
pub fn render_router_config(layout: &Layout) -> Result<String, ClusterError> {
    let r = router(layout)?;
    let groups: Vec<(&str, bool)> = if r.ip6.is_some() {
        vec![("nodes", false), ("nodes6", true)]
    } else {
        vec![("nodes", false)]
    };
    let mut c = format!(
        "frr defaults traditional\nhostname {ROUTER}\n!\nrouter bgp {ROUTER_ASN}\n bgp router-id {}\n no bgp ebgp-requires-policy\n",
        r.ip
    );
    for (group, _) in &groups {
        for line in [
            "peer-group".to_string(),
            format!("remote-as {NODE_ASN}"),
            "timers 3 9".to_string(),
            "timers connect 1".to_string(),
            "bfd".to_string(),
        ] {
            c.push_str(&format!(" neighbor {group} {line}\n"));
        }
    }
    for node in &layout.nodes {
        c.push_str(&format!(" neighbor {} peer-group nodes\n", node.lan_ip));
        if let (Some(ip6), true) = (node.lan_ip6, groups.len() == 2) {
            c.push_str(&format!(" neighbor {ip6} peer-group nodes6\n"));
        }
    }
    c.push_str(" address-family ipv4 unicast\n");
    if groups.len() == 2 {
        c.push_str("  no neighbor nodes6 activate\n");
    }
    c.push_str("  maximum-paths 8\n exit-address-family\n");
    if groups.len() == 2 {
        c.push_str(
            " address-family ipv6 unicast\n  neighbor nodes6 activate\n  maximum-paths 8\n exit-address-family\n",
        );
    }
    c.push_str("exit\n!\nend\n");
    Ok(c)
}

/// Whether `ip` is reached through the router rather than on the LAN: an address outside the
/// LAN's subnets.
pub fn is_routed(layout: &Layout, ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => !layout.lan.contains(&a),
        IpAddr::V6(a) => !layout.lan6.is_some_and(|n| n.contains(&a)),
    }
}

/// The next hops of every route in `ip -j route show` output (either family), by destination;
/// `default` and routes without a gateway are left out.
pub fn parse_fib(json: &str) -> BTreeMap<IpAddr, Vec<IpAddr>> {
    let routes: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let mut out: BTreeMap<IpAddr, Vec<IpAddr>> = BTreeMap::new();
    for route in routes.as_array().into_iter().flatten() {
        let Some(dst) = route["dst"]
            .as_str()
            .and_then(|d| d.split('/').next())
            .and_then(|d| d.parse::<IpAddr>().ok())
        else {
            continue;
        };
        let mut hops: Vec<IpAddr> = route["gateway"]
            .as_str()
            .and_then(|g| g.parse().ok())
            .into_iter()
            .collect();
        for hop in route["nexthops"].as_array().into_iter().flatten() {
            hops.extend(
                hop["gateway"]
                    .as_str()
                    .and_then(|g| g.parse::<IpAddr>().ok()),
            );
        }
        if !hops.is_empty() {
            hops.sort();
            out.entry(dst).or_default().extend(hops);
        }
    }
    out
}

/// Node names for next hops: each node's LAN addresses and the link-local addresses of its LAN
/// interface (`link_locals`, by node name: IPv6 routes learnt over BGP use those).
pub fn hop_names(
    layout: &Layout,
    link_locals: &BTreeMap<String, Vec<IpAddr>>,
) -> BTreeMap<IpAddr, String> {
    let mut out = BTreeMap::new();
    for node in &layout.nodes {
        for ip in node.lan_ips() {
            out.insert(ip, node.name.clone());
        }
        for ip in link_locals.get(&node.name).into_iter().flatten() {
            out.insert(*ip, node.name.clone());
        }
    }
    out
}

/// The link-local addresses in `ip -j addr show` output.
pub fn parse_link_locals(json: &str) -> Vec<IpAddr> {
    let links: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    links
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|l| l["addr_info"].as_array().into_iter().flatten())
        .filter(|a| a["scope"] == "link")
        .filter_map(|a| a["local"].as_str()?.parse().ok())
        .collect()
}

/// What the flag adds to the summary line of `up`.
pub fn describe(layout: &Layout, families: LabFamilies) -> Result<String, ClusterError> {
    let r = router(layout)?;
    let out = outside(layout);
    let mut text = format!(
        "router {} (AS {ROUTER_ASN}) peering with {} nodes (AS {NODE_ASN}); client {} behind it",
        r.ip,
        layout.nodes.len(),
        out.ip
    );
    if let (Some(r6), Some(o6), true) = (r.ip6, out.ip6, families.has(berth_core::IpFamily::V6)) {
        text.push_str(&format!(" (IPv6: router {r6}, client {o6})"));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::plan::lab_topology_for;
    use crate::topology::layout;

    fn mk_layout(families: LabFamilies) -> Layout {
        let spec = lab_topology_for("berth-lab", 2, families)
            .unwrap()
            .client(ROUTER);
        layout(&spec).unwrap()
    }

    #[test]
    fn the_router_is_the_second_client_and_the_outside_lies_behind_it() {
        let l = mk_layout(LabFamilies::Dual);
        let r = router(&l).unwrap();
        assert_eq!(r.ip.to_string(), "198.18.0.101");
        assert_eq!(r.ip6.unwrap().to_string(), "fd00:198:18::101");
        assert_eq!(
            l.clients[0].name, "client",
            "the proof's LAN client stays first"
        );
        let out = outside(&l);
        assert_eq!(out.netns, "berth-lab-outside");
        assert_eq!(out.ip.to_string(), "198.19.20.100");
        assert_eq!(out.ip6.unwrap().to_string(), "fd00:19:20::100");
        let v4only = mk_layout(LabFamilies::Ipv4);
        assert_eq!(outside(&v4only).ip6, None);
        let no_router =
            layout(&lab_topology_for("berth-lab", 1, LabFamilies::Ipv4).unwrap()).unwrap();
        assert!(router(&no_router).is_err());
        assert!(plan_network(&no_router).is_err());
    }

    #[test]
    fn the_network_plan_routes_both_families_through_the_router() {
        let lines: Vec<String> = plan_network(&mk_layout(LabFamilies::Dual))
            .unwrap()
            .iter()
            .map(|a| a.join(" "))
            .collect();
        for expected in [
            "ip netns add berth-lab-outside",
            "ip -n berth-lab-router link add eth1 type veth peer name eth0 netns berth-lab-outside",
            "ip -n berth-lab-router addr add 198.19.20.1/24 dev eth1",
            "ip -n berth-lab-outside route add default via 198.19.20.1",
            "ip -n berth-lab-outside -6 route add default via fd00:19:20::1",
            "ip netns exec berth-lab-router sysctl -qw net.ipv4.fib_multipath_hash_policy=1",
            "ip netns exec berth-lab-router sysctl -qw net.ipv6.conf.all.forwarding=1",
            "ip -n berth-lab-node1 route add 198.19.20.0/24 via 198.18.0.101",
            "ip -n berth-lab-node2 -6 route add fd00:19:20::/64 via fd00:198:18::101",
        ] {
            assert!(
                lines.iter().any(|l| l == expected),
                "{expected} in {lines:#?}"
            );
        }
        // The namespace first, then everything in it.
        assert_eq!(lines[0], "ip netns add berth-lab-outside");
        let v4: Vec<String> = plan_network(&mk_layout(LabFamilies::Ipv4))
            .unwrap()
            .iter()
            .map(|a| a.join(" "))
            .collect();
        assert!(
            v4.iter().all(|l| !l.contains("fd00") && !l.contains("-6")),
            "{v4:#?}"
        );
    }

    #[test]
    fn the_router_peers_with_every_node_in_each_family_with_ecmp() {
        let c = render_router_config(&mk_layout(LabFamilies::Dual)).unwrap();
        for line in [
            "router bgp 64513",
            " bgp router-id 198.18.0.101",
            " neighbor nodes remote-as 64512",
            " neighbor nodes bfd",
            " neighbor nodes6 timers 3 9",
            " neighbor 198.18.0.11 peer-group nodes",
            " neighbor 198.18.0.12 peer-group nodes",
            " neighbor fd00:198:18::12 peer-group nodes6",
            "  no neighbor nodes6 activate",
            "  neighbor nodes6 activate",
        ] {
            assert!(c.lines().any(|l| l == line), "{line:?} in\n{c}");
        }
        assert_eq!(c.matches("maximum-paths 8").count(), 2, "{c}");
        let v4 = render_router_config(&mk_layout(LabFamilies::Ipv4)).unwrap();
        assert!(!v4.contains("nodes6") && !v4.contains("ipv6"), "{v4}");
        assert_eq!(v4.matches("maximum-paths 8").count(), 1);
    }

    #[test]
    fn frr_runs_in_the_foreground_with_its_sockets_in_the_lab_state() {
        let c = frr_components(
            "node1",
            "berth-lab-node1",
            Path::new("/s/frr/node1"),
            Path::new("/s/logs"),
        );
        let lines: Vec<String> = c
            .iter()
            .map(|c| c.argv(Path::new("/bin/berth")).join(" "))
            .collect();
        assert_eq!(
            lines[0],
            "ip netns exec berth-lab-node1 /usr/lib/frr/zebra -u frr -g frr -i /s/frr/node1/zebra.pid \
             --vty_socket /s/frr/node1 -z /s/frr/node1/zserv.api -f /dev/null --log stdout"
        );
        assert!(lines[2].contains("/usr/lib/frr/bgpd "));
        assert_eq!(c[1].name, "frr-node1-bfdd");
        assert_eq!(c[1].log, Path::new("/s/logs/frr-node1-bfdd.log"));
        assert_eq!(
            reload_argv("berth-lab-router", Path::new("/s/frr/router")).join(" "),
            "ip netns exec berth-lab-router python3 /usr/lib/frr/frr-reload.py --reload --stdout \
             --vty_socket /s/frr/router --confdir /s/frr/router --rundir /s/frr/router /s/frr/router/frr.conf"
        );
    }

    #[test]
    fn routed_addresses_are_those_outside_the_lan() {
        let l = mk_layout(LabFamilies::Dual);
        for (ip, routed) in [
            ("198.18.0.200", false),
            ("198.19.10.1", true),
            ("fd00:198:18::200", false),
            ("fd00:19:10::1", true),
        ] {
            assert_eq!(is_routed(&l, ip.parse().unwrap()), routed, "{ip}");
        }
        // Without IPv6 on the LAN every IPv6 address would be routed.
        let v4 = mk_layout(LabFamilies::Ipv4);
        assert!(is_routed(&v4, "fd00:198:18::200".parse().unwrap()));
    }

    #[test]
    fn fib_routes_give_their_next_hops_and_nodes_their_names() {
        let json = r#"[
          {"dst":"default","gateway":"198.19.20.254","dev":"eth1"},
          {"dst":"198.18.0.0/24","dev":"eth0","protocol":"kernel","scope":"link"},
          {"dst":"198.19.10.1","protocol":"bgp","nexthops":[
             {"gateway":"198.18.0.12","dev":"eth0"},{"gateway":"198.18.0.11","dev":"eth0"}]},
          {"dst":"198.19.10.2","gateway":"198.18.0.11","dev":"eth0","protocol":"bgp"},
          {"dst":"fd00:19:10::1","protocol":"bgp","nexthops":[{"gateway":"fe80::1","dev":"eth0"}]}
        ]"#;
        let fib = parse_fib(json);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(fib.len(), 3, "{fib:?}");
        assert_eq!(
            fib[&ip("198.19.10.1")],
            [ip("198.18.0.11"), ip("198.18.0.12")]
        );
        assert_eq!(fib[&ip("198.19.10.2")], [ip("198.18.0.11")]);
        assert!(parse_fib("not json").is_empty());
        let l = mk_layout(LabFamilies::Dual);
        let link_locals = BTreeMap::from([("node2".to_string(), vec![ip("fe80::1")])]);
        let names = hop_names(&l, &link_locals);
        assert_eq!(names[&ip("198.18.0.11")], "node1");
        assert_eq!(names[&ip("fd00:198:18::12")], "node2");
        assert_eq!(names[&ip("fe80::1")], "node2");
        let addr = r#"[{"ifname":"eth0","addr_info":[
            {"family":"inet6","local":"fd00:198:18::11","scope":"global"},
            {"family":"inet6","local":"fe80::a:b","scope":"link"}]}]"#;
        assert_eq!(parse_link_locals(addr), [ip("fe80::a:b")]);
    }
}

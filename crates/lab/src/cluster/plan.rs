//! What a lab is made of (pure): its topology and the processes that run in it.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use berth_core::IpFamily;

use crate::topology::{ClientLayout, Layout, NodeLayout, TopologySpec, ETH0, NETNS_PREFIX};

pub use super::component::Component;
pub use super::families::{LabFamilies, CLUSTER6_CIDR, CLUSTER_CIDR};
use super::ClusterError;

/// Where the API server listens in the control-plane namespace, for agents and the controller.
pub const LAN_API_PORT: u16 = 6443;
/// The agents' admin port (`/healthz`, `/metrics`) on each node's LAN address.
pub const AGENT_ADMIN_PORT: u16 = 10356;
/// The controller's admin port on the control plane's LAN address.
pub const CONTROLLER_ADMIN_PORT: u16 = 9090;

impl std::fmt::Display for LabFamilies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A node's LAN address of `family`, if it has one.
pub fn node_ip(node: &NodeLayout, family: IpFamily) -> Option<IpAddr> {
    match family {
        IpFamily::V4 => Some(IpAddr::V4(node.lan_ip)),
        IpFamily::V6 => node.lan_ip6.map(IpAddr::V6),
    }
}

/// A client's (or the control plane's) LAN address of `family`, if it has one.
pub fn client_ip(client: &ClientLayout, family: IpFamily) -> Option<IpAddr> {
    match family {
        IpFamily::V4 => Some(IpAddr::V4(client.ip)),
        IpFamily::V6 => client.ip6.map(IpAddr::V6),
    }
}
/// Most nodes a lab holds (the address plan holds more, but this is a one-host demo).
pub const MAX_NODES: usize = 16;

/// The lab's namespaces: `berth-<name>-*`.
pub fn lab_prefix(name: &str) -> Result<String, ClusterError> {
    let plain = !name.is_empty()
        && name.len() <= 16
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !plain {
        return Err(ClusterError::Invalid(format!(
            "lab name {name:?}: use 1-16 of a-z and 0-9"
        )));
    }
    Ok(format!("{NETNS_PREFIX}{name}"))
}

/// A control plane, `nodes` nodes (`node1`...) without pods (the kubelet makes them) and one
/// client, IPv4 only.
pub fn lab_topology(prefix: &str, nodes: usize) -> Result<TopologySpec, ClusterError> {
    lab_topology_for(prefix, nodes, LabFamilies::Ipv4)
}

/// [`lab_topology`] for a cluster of `families`: with IPv6 addresses as soon as it uses IPv6.
pub fn lab_topology_for(
    prefix: &str,
    nodes: usize,
    families: LabFamilies,
) -> Result<TopologySpec, ClusterError> {
    if !(1..=MAX_NODES).contains(&nodes) {
        return Err(ClusterError::Invalid(format!(
            "--nodes {nodes}: a lab has 1 to {MAX_NODES} nodes"
        )));
    }
    let mut spec = TopologySpec::new(prefix).control_plane("cp");
    for i in 1..=nodes {
        spec = spec.node(&format!("node{i}"), Vec::<String>::new());
    }
    let spec = spec.client("client");
    Ok(if families.has(IpFamily::V6) {
        spec.with_ipv6()
    } else {
        spec
    })
}

/// The state directory's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Files {
    pub dir: PathBuf,
    /// For tools in the root namespace: the API server on 127.0.0.1.
    pub kubeconfig: PathBuf,
    /// For components on the LAN: the API server at the control plane's address.
    pub lan_kubeconfig: PathBuf,
    pub state: PathBuf,
    pub logs: PathBuf,
    /// The agents' shared membership (SWIM) key.
    pub membership_key: PathBuf,
}

impl Files {
    pub fn new(dir: &Path) -> Self {
        Files {
            dir: dir.to_path_buf(),
            kubeconfig: dir.join("kubeconfig"),
            lan_kubeconfig: dir.join("kubeconfig.lan"),
            state: dir.join("lab.json"),
            logs: dir.join("logs"),
            membership_key: dir.join("membership.key"),
        }
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

fn no_address(what: &str, family: IpFamily) -> ClusterError {
    ClusterError::Invalid(format!("the lab layout gives {what} no {family} address"))
}

/// The control plane's API server address on the LAN, in the cluster's primary family.
pub fn lan_api(layout: &Layout, families: LabFamilies) -> Result<SocketAddr, ClusterError> {
    let cp = layout
        .control_plane
        .as_ref()
        .ok_or_else(|| ClusterError::Invalid("the lab layout has no control plane".into()))?;
    let ip = client_ip(cp, families.primary())
        .ok_or_else(|| no_address("the control plane", families.primary()))?;
    Ok(SocketAddr::new(ip, LAN_API_PORT))
}

/// A node's LAN address in the cluster's primary family: where its agent serves and meets the
/// other agents.
pub fn node_primary_ip(node: &NodeLayout, families: LabFamilies) -> Result<IpAddr, ClusterError> {
    node_ip(node, families.primary())
        .ok_or_else(|| no_address(&format!("node {}", node.name), families.primary()))
}

/// The processes, in start order: the API server (loopback and the LAN), the kubelet, the
/// lab's controller-manager (Deployments and ReplicaSets), the controller in the control-plane namespace, and one agent (datapath and L2 announcer) in each
/// node namespace. With `bgp`, FRR's daemons in the router's and every node's namespace before
/// the agents, and each agent a BGP speaker driving its node's FRR.
pub fn plan_components(
    name: &str,
    nodes: usize,
    families: LabFamilies,
    layout: &Layout,
    files: &Files,
    bgp: bool,
) -> Result<Vec<Component>, ClusterError> {
    let cp = layout
        .control_plane
        .as_ref()
        .ok_or_else(|| ClusterError::Invalid("the lab layout has no control plane".into()))?;
    let lan_api = lan_api(layout, families)?;
    let cp_ip = lan_api.ip();
    let log = |component: &str| files.logs.join(format!("{component}.log"));
    let kubeconfig = files.kubeconfig.display().to_string();
    let lan_kubeconfig = files.lan_kubeconfig.display().to_string();
    let mut out = vec![
        Component {
            name: "apiserver".into(),
            netns: None,
            program: None,
            args: strings(&[
                "lab",
                "apiserver",
                "--listen",
                "127.0.0.1:0",
                "--listen-netns",
                &format!("{}={lan_api}", cp.netns),
                "--kubeconfig",
                &kubeconfig,
                "--graceful-pod-deletion",
                "--service-cluster-ip-range",
                &families.service_cidrs(),
            ]),
            log: log("apiserver"),
        },
        Component {
            name: "kubelet".into(),
            netns: None,
            program: None,
            args: strings(&[
                "lab",
                "kubelet",
                "--name",
                name,
                "--nodes",
                &nodes.to_string(),
                "--ip-family",
                families.as_str(),
                "--kubeconfig",
                &kubeconfig,
            ]),
            log: log("kubelet"),
        },
        Component {
            name: "controller-manager".into(),
            netns: None,
            program: None,
            args: strings(&["lab", "controller-manager", "--kubeconfig", &kubeconfig]),
            log: log("controller-manager"),
        },
        Component {
            name: "controller".into(),
            netns: Some(cp.netns.clone()),
            program: None,
            args: strings(&[
                "controller",
                "--kubeconfig",
                &lan_kubeconfig,
                "--service-cidr",
                &families.service_cidrs(),
                "--endpoints",
                "on",
                "--admin-listen",
                &SocketAddr::new(cp_ip, CONTROLLER_ADMIN_PORT).to_string(),
            ]),
            log: log("controller"),
        },
    ];
    if bgp {
        let router = super::bgp::router(layout)?;
        out.extend(super::bgp::frr_components(
            &router.name,
            &router.netns,
            &super::bgp::frr_dir(&files.dir, &router.name),
            &files.logs,
        ));
        for node in &layout.nodes {
            out.extend(super::bgp::frr_components(
                &node.name,
                &node.netns,
                &super::bgp::frr_dir(&files.dir, &node.name),
                &files.logs,
            ));
        }
    }
    for node in &layout.nodes {
        let node_ip = node_primary_ip(node, families)?;
        let mut speaker = Vec::new();
        if bgp {
            speaker = vec![
                "--bgp-speaker".to_string(),
                "--frr-dir".to_string(),
                super::bgp::frr_dir(&files.dir, &node.name)
                    .display()
                    .to_string(),
            ];
        }
        out.push(Component {
            name: format!("agent-{}", node.name),
            netns: Some(node.netns.clone()),
            program: None,
            args: strings(&[
                "agent",
                "--node-name",
                &node.name,
                "--kubeconfig",
                &lan_kubeconfig,
                "--cluster-cidr",
                &families.cluster_cidrs(),
                "--admin-listen",
                &SocketAddr::new(node_ip, AGENT_ADMIN_PORT).to_string(),
                // ARP for the LoadBalancer IPs this node is elected for, on its LAN interface.
                "--l2-announcer",
                "--l2-interfaces",
                ETH0,
                // Liveness between the agents, over the LAN, so a killed agent's IPs move.
                "--membership",
                "on",
                "--membership-key-file",
                &files.membership_key.display().to_string(),
                "--membership-bind-address",
                &node_ip.to_string(),
            ])
            .into_iter()
            .chain(speaker)
            .collect(),
            log: log(&format!("agent-{}", node.name)),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::layout;

    #[test]
    fn names_and_node_counts_are_checked() {
        assert_eq!(lab_prefix("lab").unwrap(), "berth-lab");
        for bad in ["", "Lab", "a-b", "a/b", "seventeen-letters"] {
            assert!(lab_prefix(bad).is_err(), "{bad}");
        }
        assert!(lab_topology("berth-lab", 0).is_err());
        assert!(lab_topology("berth-lab", MAX_NODES + 1).is_err());
        let spec = lab_topology("berth-lab", 3).unwrap();
        let l = layout(&spec).unwrap();
        assert_eq!(
            l.namespaces(),
            [
                "berth-lab-lan",
                "berth-lab-cp",
                "berth-lab-node1",
                "berth-lab-node2",
                "berth-lab-node3",
                "berth-lab-client"
            ]
        );
    }

    #[test]
    fn components_run_where_a_cluster_runs_them() {
        let l = layout(&lab_topology("berth-lab", 2).unwrap()).unwrap();
        let files = Files::new(Path::new("/state"));
        let components = plan_components("lab", 2, LabFamilies::Ipv4, &l, &files, false).unwrap();
        let exe = Path::new("/bin/berth");
        let lines: Vec<(String, String)> = components
            .iter()
            .map(|c| (c.name.clone(), c.argv(exe).join(" ")))
            .collect();
        assert_eq!(
            lines,
            [
                ("apiserver".to_string(), "/bin/berth lab apiserver --listen 127.0.0.1:0 --listen-netns berth-lab-cp=198.18.0.2:6443 --kubeconfig /state/kubeconfig --graceful-pod-deletion --service-cluster-ip-range 10.96.0.0/16".to_string()),
                ("kubelet".to_string(), "/bin/berth lab kubelet --name lab --nodes 2 --ip-family ipv4 --kubeconfig /state/kubeconfig".to_string()),
                ("controller-manager".to_string(), "/bin/berth lab controller-manager --kubeconfig /state/kubeconfig".to_string()),
                ("controller".to_string(), "ip netns exec berth-lab-cp /bin/berth controller --kubeconfig /state/kubeconfig.lan --service-cidr 10.96.0.0/16 --endpoints on --admin-listen 198.18.0.2:9090".to_string()),
                ("agent-node1".to_string(), "ip netns exec berth-lab-node1 /bin/berth agent --node-name node1 --kubeconfig /state/kubeconfig.lan --cluster-cidr 10.244.0.0/16 --admin-listen 198.18.0.11:10356 --l2-announcer --l2-interfaces eth0 --membership on --membership-key-file /state/membership.key --membership-bind-address 198.18.0.11".to_string()),
                ("agent-node2".to_string(), "ip netns exec berth-lab-node2 /bin/berth agent --node-name node2 --kubeconfig /state/kubeconfig.lan --cluster-cidr 10.244.0.0/16 --admin-listen 198.18.0.12:10356 --l2-announcer --l2-interfaces eth0 --membership on --membership-key-file /state/membership.key --membership-bind-address 198.18.0.12".to_string()),
            ]
        );
        assert_eq!(components[4].log, Path::new("/state/logs/agent-node1.log"));
    }

    fn argv_of(components: &[Component], name: &str) -> String {
        components
            .iter()
            .find(|c| c.name == name)
            .unwrap()
            .argv(Path::new("/bin/berth"))
            .join(" ")
    }

    #[test]
    fn a_dual_stack_lab_gives_every_component_both_families() {
        let families: LabFamilies = "dual".parse().unwrap();
        let l = layout(&lab_topology_for("berth-lab", 2, families).unwrap()).unwrap();
        assert!(l.lan6.is_some());
        let files = Files::new(Path::new("/state"));
        let c = plan_components("lab", 2, families, &l, &files, false).unwrap();
        assert!(argv_of(&c, "apiserver").contains("--listen-netns berth-lab-cp=198.18.0.2:6443"));
        assert!(argv_of(&c, "kubelet").contains("--ip-family dual"));
        assert!(argv_of(&c, "apiserver")
            .ends_with("--service-cluster-ip-range 10.96.0.0/16,fd00:96::/112"));
        assert!(argv_of(&c, "controller")
            .contains("--service-cidr 10.96.0.0/16,fd00:96::/112 --endpoints on"));
        let agent = argv_of(&c, "agent-node2");
        assert!(
            agent.contains(
                "--cluster-cidr 10.244.0.0/16,fd00:244::/48 --admin-listen 198.18.0.12:10356"
            ),
            "{agent}"
        );
        assert!(
            agent.ends_with("--membership-bind-address 198.18.0.12"),
            "{agent}"
        );
    }

    #[test]
    fn an_ipv6_lab_reaches_its_control_plane_over_ipv6() {
        let families = LabFamilies::Ipv6;
        let l = layout(&lab_topology_for("berth-lab", 1, families).unwrap()).unwrap();
        let files = Files::new(Path::new("/state"));
        let c = plan_components("lab", 1, families, &l, &files, false).unwrap();
        assert!(
            argv_of(&c, "apiserver").contains("--listen-netns berth-lab-cp=[fd00:198:18::2]:6443")
        );
        assert!(argv_of(&c, "controller").contains(
            "--service-cidr fd00:96::/112 --endpoints on --admin-listen [fd00:198:18::2]:9090"
        ));
        let agent = argv_of(&c, "agent-node1");
        assert!(
            agent.contains("--cluster-cidr fd00:244::/48 --admin-listen [fd00:198:18::11]:10356"),
            "{agent}"
        );
        assert!(agent.ends_with("--membership-bind-address fd00:198:18::11"));
        // An IPv4 layout has no IPv6 control plane to offer.
        let v4 = layout(&lab_topology("berth-lab", 1).unwrap()).unwrap();
        assert!(plan_components("lab", 1, families, &v4, &files, false).is_err());
    }

    #[test]
    fn a_bgp_lab_starts_frr_before_the_agents_and_makes_them_speakers() {
        let spec = lab_topology_for("berth-lab", 2, LabFamilies::Dual)
            .unwrap()
            .client(super::super::bgp::ROUTER);
        let l = layout(&spec).unwrap();
        let files = Files::new(Path::new("/state"));
        let c = plan_components("lab", 2, LabFamilies::Dual, &l, &files, true).unwrap();
        let names: Vec<&str> = c.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names[4..],
            [
                "frr-router-zebra",
                "frr-router-bfdd",
                "frr-router-bgpd",
                "frr-node1-zebra",
                "frr-node1-bfdd",
                "frr-node1-bgpd",
                "frr-node2-zebra",
                "frr-node2-bfdd",
                "frr-node2-bgpd",
                "agent-node1",
                "agent-node2",
            ]
        );
        assert!(argv_of(&c, "frr-router-bgpd")
            .starts_with("ip netns exec berth-lab-router /usr/lib/frr/bgpd "));
        assert!(argv_of(&c, "agent-node2").ends_with("--bgp-speaker --frr-dir /state/frr/node2"));
        // Without the flag: no FRR, no speaker; and a BGP lab needs its router.
        let plain = plan_components("lab", 2, LabFamilies::Dual, &l, &files, false).unwrap();
        assert!(plain.iter().all(|c| c.program.is_none()));
        assert!(!argv_of(&plain, "agent-node1").contains("bgp"));
        let no_router = layout(&lab_topology("berth-lab", 2).unwrap()).unwrap();
        assert!(plan_components("lab", 2, LabFamilies::Ipv4, &no_router, &files, true).is_err());
    }

    #[test]
    fn families_parse_and_spell_their_cidrs() {
        for (text, cidrs) in [
            ("ipv4", "10.96.0.0/16"),
            ("ipv6", "fd00:96::/112"),
            ("dual", "10.96.0.0/16,fd00:96::/112"),
        ] {
            let f: LabFamilies = text.parse().unwrap();
            assert_eq!((f.as_str(), f.service_cidrs().as_str()), (text, cidrs));
        }
        assert_eq!(LabFamilies::Ipv6.cluster_cidrs(), "fd00:244::/48");
        assert_eq!(LabFamilies::Dual.primary(), IpFamily::V4);
        assert!("IPv6".parse::<LabFamilies>().is_err());
    }
}

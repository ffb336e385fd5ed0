//! What a lab is made of (pure): its topology and the processes that run in it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::topology::{Layout, TopologySpec, ETH0, NETNS_PREFIX};

use super::ClusterError;

/// Where the API server listens in the control-plane namespace, for agents and the controller.
pub const LAN_API_PORT: u16 = 6443;
/// The agents' admin port (`/healthz`, `/metrics`) on each node's LAN address.
pub const AGENT_ADMIN_PORT: u16 = 10356;
/// The controller's admin port on the control plane's LAN address.
pub const CONTROLLER_ADMIN_PORT: u16 = 9090;
/// The pod CIDR of the whole lab: every node's 10.244.<n>.0/24 lies inside.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
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
/// client.
pub fn lab_topology(prefix: &str, nodes: usize) -> Result<TopologySpec, ClusterError> {
    if !(1..=MAX_NODES).contains(&nodes) {
        return Err(ClusterError::Invalid(format!(
            "--nodes {nodes}: a lab has 1 to {MAX_NODES} nodes"
        )));
    }
    let mut spec = TopologySpec::new(prefix).control_plane("cp");
    for i in 1..=nodes {
        spec = spec.node(&format!("node{i}"), Vec::<String>::new());
    }
    Ok(spec.client("client"))
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

/// One process of the lab.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Component {
    pub name: String,
    /// Runs inside this namespace (`ip netns exec`), else in the caller's.
    pub netns: Option<String>,
    /// The `berth` arguments.
    pub args: Vec<String>,
    pub log: PathBuf,
}

impl Component {
    /// The full command line, `exe` being the `berth` binary.
    pub fn argv(&self, exe: &Path) -> Vec<String> {
        let mut argv = Vec::new();
        if let Some(ns) = &self.netns {
            argv.extend(["ip".into(), "netns".into(), "exec".into(), ns.clone()]);
        }
        argv.push(exe.display().to_string());
        argv.extend(self.args.iter().cloned());
        argv
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// The control plane's API server address on the LAN.
pub fn lan_api(layout: &Layout) -> Result<SocketAddr, ClusterError> {
    let cp = layout
        .control_plane
        .as_ref()
        .ok_or_else(|| ClusterError::Invalid("the lab layout has no control plane".into()))?;
    Ok(SocketAddr::from((cp.ip, LAN_API_PORT)))
}

/// The processes, in start order: the API server (loopback and the LAN), the kubelet, the
/// lab's controller-manager (Deployments and ReplicaSets), the controller in the control-plane namespace, and one agent (datapath and L2 announcer) in each
/// node namespace.
pub fn plan_components(
    name: &str,
    nodes: usize,
    layout: &Layout,
    files: &Files,
) -> Result<Vec<Component>, ClusterError> {
    let cp = layout
        .control_plane
        .as_ref()
        .ok_or_else(|| ClusterError::Invalid("the lab layout has no control plane".into()))?;
    let lan_api = lan_api(layout)?;
    let log = |component: &str| files.logs.join(format!("{component}.log"));
    let kubeconfig = files.kubeconfig.display().to_string();
    let lan_kubeconfig = files.lan_kubeconfig.display().to_string();
    let mut out = vec![
        Component {
            name: "apiserver".into(),
            netns: None,
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
            ]),
            log: log("apiserver"),
        },
        Component {
            name: "kubelet".into(),
            netns: None,
            args: strings(&[
                "lab",
                "kubelet",
                "--name",
                name,
                "--nodes",
                &nodes.to_string(),
                "--kubeconfig",
                &kubeconfig,
            ]),
            log: log("kubelet"),
        },
        Component {
            name: "controller-manager".into(),
            netns: None,
            args: strings(&["lab", "controller-manager", "--kubeconfig", &kubeconfig]),
            log: log("controller-manager"),
        },
        Component {
            name: "controller".into(),
            netns: Some(cp.netns.clone()),
            args: strings(&[
                "controller",
                "--kubeconfig",
                &lan_kubeconfig,
                "--endpoints",
                "on",
                "--admin-listen",
                &SocketAddr::from((cp.ip, CONTROLLER_ADMIN_PORT)).to_string(),
            ]),
            log: log("controller"),
        },
    ];
    for node in &layout.nodes {
        out.push(Component {
            name: format!("agent-{}", node.name),
            netns: Some(node.netns.clone()),
            args: strings(&[
                "agent",
                "--node-name",
                &node.name,
                "--kubeconfig",
                &lan_kubeconfig,
                "--cluster-cidr",
                CLUSTER_CIDR,
                "--admin-listen",
                &SocketAddr::from((node.lan_ip, AGENT_ADMIN_PORT)).to_string(),
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
                &node.lan_ip.to_string(),
            ]),
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
        let components = plan_components("lab", 2, &l, &files).unwrap();
        let exe = Path::new("/bin/berth");
        let lines: Vec<(String, String)> = components
            .iter()
            .map(|c| (c.name.clone(), c.argv(exe).join(" ")))
            .collect();
        assert_eq!(
            lines,
            [
                ("apiserver".to_string(), "/bin/berth lab apiserver --listen 127.0.0.1:0 --listen-netns berth-lab-cp=198.18.0.2:6443 --kubeconfig /state/kubeconfig --graceful-pod-deletion".to_string()),
                ("kubelet".to_string(), "/bin/berth lab kubelet --name lab --nodes 2 --kubeconfig /state/kubeconfig".to_string()),
                ("controller-manager".to_string(), "/bin/berth lab controller-manager --kubeconfig /state/kubeconfig".to_string()),
                ("controller".to_string(), "ip netns exec berth-lab-cp /bin/berth controller --kubeconfig /state/kubeconfig.lan --endpoints on --admin-listen 198.18.0.2:9090".to_string()),
                ("agent-node1".to_string(), "ip netns exec berth-lab-node1 /bin/berth agent --node-name node1 --kubeconfig /state/kubeconfig.lan --cluster-cidr 10.244.0.0/16 --admin-listen 198.18.0.11:10356 --l2-announcer --l2-interfaces eth0 --membership on --membership-key-file /state/membership.key --membership-bind-address 198.18.0.11".to_string()),
                ("agent-node2".to_string(), "ip netns exec berth-lab-node2 /bin/berth agent --node-name node2 --kubeconfig /state/kubeconfig.lan --cluster-cidr 10.244.0.0/16 --admin-listen 198.18.0.12:10356 --l2-announcer --l2-interfaces eth0 --membership on --membership-key-file /state/membership.key --membership-bind-address 198.18.0.12".to_string()),
            ]
        );
        assert_eq!(components[4].log, Path::new("/state/logs/agent-node1.log"));
    }
}

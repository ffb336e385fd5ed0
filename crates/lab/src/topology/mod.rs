//! A lab network made of network namespaces: a LAN, nodes, pods and clients.
//!
//! [`TopologySpec`] names what is wanted; [`Layout`] assigns every address from the lab's address
//! plan (pure, [`layout`]); [`plan_create`] turns a layout into `ip` commands (pure, [`steps`]);
//! [`Topology`] runs them and deletes every namespace it made when dropped ([`run`]).
//!
//! The picture, for node i (1-based) and its pod k (1-based):
//!
//! ```text
//!  client ns            LAN ns                     node ns                       pod ns
//!  eth0 198.18.0.100 -- cl ─┐                 ┌──  eth0 198.18.0.(10+i)/24
//!                           br0 ── n<i> ──────┘      vp<k> 10.244.i.1/32  ─────  eth0 10.244.i.(1+k)/32
//!                                                    10.244.i.(1+k)/32 dev vp<k>  default via 10.244.i.1
//!                                                    10.244.j.0/24 via node j
//! ```
//!
//! With [`TopologySpec::with_ipv6`] every namespace gets an IPv6 address beside its IPv4 one,
//! from the same plan written in IPv6: the LAN is fd00:198:18::/64 and a host keeps its IPv4
//! number as hexadecimal digits (198.18.0.11 is fd00:198:18::11, the client fd00:198:18::100);
//! node i's pods live in fd00:244:i::/64 (pod k at fd00:244:i::(1+k), gateway fd00:244:i::1);
//! the Service CIDR fd00:96::/112 is routed like 10.96.0.0/16. Addresses are added without
//! duplicate address detection, so they are usable at once.
//!
//! Pods hang off their node on point-to-point veths (no pod bridge), so every pod packet is routed
//! by the node and seen by its iptables in both directions: Service traffic between two pods of one
//! node needs neither `br_netfilter` nor bridge hairpin mode, and a pod reaching itself through a
//! Service is routed back out of the veth it came in by. The LAN bridge lives in its own namespace,
//! so nothing is attached to the root namespace.

mod layout;
mod run;
mod steps;

use std::net::{Ipv4Addr, Ipv6Addr};

pub use layout::{
    free_pod_slot, layout, parse_link_names, pod_layout, ClientLayout, Layout, NodeLayout,
    PodLayout,
};
pub use run::{
    leftovers, orphan_prefixes, preflight, remove_leftovers, remove_orphans, IpCommand, Runner,
    Topology,
};
pub use steps::{plan_add_pod, plan_create, plan_destroy, Step};

/// The interface of a node, pod or client namespace towards the rest of the topology: the LAN for
/// nodes and clients (where an L2 announcer answers ARP), the node for pods.
pub const ETH0: &str = "eth0";

/// Every namespace the lab and its tests make starts with this.
pub const NETNS_PREFIX: &str = "berth-";

/// The lab's LAN (docs/architecture.md, "Address plan"): nodes from .11, clients from .100, load-balancer pool .200-.250.
pub const LAN_PREFIX_LEN: u8 = 24;
pub const LAN_NETWORK: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 0);
pub const FIRST_NODE_HOST: u8 = 11;
/// The control plane (API server, controller) sits on the LAN at .2.
pub const CONTROL_PLANE_HOST: u8 = 2;
pub const FIRST_CLIENT_HOST: u8 = 100;
/// Hosts from here on belong to the load-balancer pool, never to a client.
pub const LB_POOL_FIRST_HOST: u8 = 200;
/// Pod CIDR of node i is 10.244.i.0/24.
pub const POD_NETWORK: [u8; 2] = [10, 244];
/// The Service CIDR nodes route towards their LAN interface, so that their own connections to a
/// ClusterIP find a route before iptables rewrites the destination.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The LAN in IPv6 (a unique local /64): hosts keep their IPv4 number, written as hex digits.
pub const LAN6_NETWORK: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x198, 0x18, 0, 0, 0, 0, 0);
pub const LAN6_PREFIX_LEN: u8 = 64;
/// Pod CIDR of node i in IPv6 is fd00:244:i::/64, inside this /48.
pub const POD6_NETWORK: [u16; 2] = [0xfd00, 0x244];
/// The IPv6 Service CIDR, routed by the nodes like [`SERVICE_CIDR`].
pub const SERVICE6_CIDR: &str = "fd00:96::/112";

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("invalid topology: {0}")]
    Invalid(String),
    #[error("running `{command}` failed")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` exited with {status}: {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("network namespace {0} does not belong to this topology")]
    Foreign(String),
    #[error("no {kind} named {name} in this topology")]
    Unknown { kind: &'static str, name: String },
    #[error("listing {dir}")]
    List {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{} namespace(s) could not be deleted: {}", .0.len(), .0.join("; "))]
    Cleanup(Vec<String>),
}

/// A node and the pods it hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    pub name: String,
    pub pods: Vec<String>,
    /// `net.ipv4.conf.all.route_localnet=1`, so node ports answer on 127.0.0.1 as well.
    pub route_localnet: bool,
}

/// What to build. Names are short lowercase words; each becomes `<prefix>-<name>` as a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologySpec {
    /// Starts with [`NETNS_PREFIX`] and is unique to the caller, e.g. `berth-t<pid>`.
    pub prefix: String,
    pub nodes: Vec<NodeSpec>,
    pub clients: Vec<String>,
    /// A namespace on the LAN at 198.18.0.2 for the API server and the controller.
    pub control_plane: Option<String>,
    /// Every namespace gets an IPv6 address too (fd00:198:18::/64 on the LAN, fd00:244:i::/64
    /// for node i's pods).
    pub ipv6: bool,
}

impl TopologySpec {
    pub fn new(prefix: impl Into<String>) -> Self {
        TopologySpec {
            prefix: prefix.into(),
            nodes: Vec::new(),
            clients: Vec::new(),
            control_plane: None,
            ipv6: false,
        }
    }

    /// IPv6 addresses beside the IPv4 ones, everywhere.
    pub fn with_ipv6(mut self) -> Self {
        self.ipv6 = true;
        self
    }

    /// A prefix no other process uses: `berth-<tag><pid>`.
    pub fn unique_prefix(tag: &str) -> String {
        format!("{NETNS_PREFIX}{tag}{}", std::process::id())
    }

    pub fn node<I, S>(mut self, name: &str, pods: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.nodes.push(NodeSpec {
            name: name.to_string(),
            pods: pods.into_iter().map(Into::into).collect(),
            route_localnet: false,
        });
        self
    }

    /// Enables `route_localnet` on the node added last.
    pub fn with_route_localnet(mut self) -> Self {
        if let Some(node) = self.nodes.last_mut() {
            node.route_localnet = true;
        }
        self
    }

    /// The control-plane namespace, on the LAN at 198.18.0.2.
    pub fn control_plane(mut self, name: &str) -> Self {
        self.control_plane = Some(name.to_string());
        self
    }

    pub fn client(mut self, name: &str) -> Self {
        self.clients.push(name.to_string());
        self
    }
}

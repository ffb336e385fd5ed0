//! `AgentOptions` (what the flags say) -> `AgentConfig` (checked once, then trusted).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use berth_core::{dns1123_subdomain_problem, IpFamily, PortRange};
use berth_datapath::plan::convert::ProxyMode;
use berth_datapath::{Dispatch, NodePortAddresses, PlanOptions};
use ipnet::IpNet;

use crate::Error;

/// Which kernel interface programs the Services.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `iptables-restore` into berth's chains of the iptables tables.
    Iptables,
    /// One nftables transaction per sync (netlink batches, or `nft -f -`: `--nft-writer`) into
    /// berth's own tables `ip berth` / `ip6 berth`.
    Nftables,
    /// nftables when its writer works here, the kernel accepts what the backend programs and
    /// iptables' `filter FORWARD` policy is not DROP; else iptables. Decided once at start
    /// ([`Backend::resolve`]).
    Auto,
}

/// `berth agent --backend`'s default: nftables, the fastest backend on the real kernel (README,
/// "Sync on the real kernel"), where it is usable and safe beside what runs on the node.
pub const DEFAULT_BACKEND: Backend = Backend::Auto;

/// What `auto` looks at on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeFacts {
    /// The kernel accepts, through the nftables writer, a probe of every feature the nftables
    /// backend uses.
    pub nft_usable: bool,
    /// iptables' `filter FORWARD` chain drops by policy (Docker sets this) in some family.
    /// Every base chain of every table sees a packet, and a drop anywhere wins: an accept in
    /// berth's nftables table cannot let through forwarded Service traffic (node ports and
    /// load-balancer IPs to endpoints on other nodes) that this policy drops, while berth's
    /// accept rules in iptables' own `FORWARD` chain can.
    pub iptables_forward_drops: bool,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Iptables => "iptables",
            Backend::Nftables => "nftables",
            Backend::Auto => "auto",
        }
    }

    /// `Auto` made concrete by the node's facts, asked only for `Auto`: nftables, the fastest
    /// backend (see the README's numbers), where it is usable and safe beside what runs there.
    pub fn resolve(self, facts: impl FnOnce() -> NodeFacts) -> Backend {
        match self {
            Backend::Auto => {
                let facts = facts();
                if facts.nft_usable && !facts.iptables_forward_drops {
                    Backend::Nftables
                } else {
                    Backend::Iptables
                }
            }
            chosen => chosen,
        }
    }
}

/// The agent's settings as given; [`AgentOptions::validate`] turns them into an [`AgentConfig`].
#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub node_name: String,
    pub proxy_mode: ProxyMode,
    /// The library default is iptables (an agent is built with a resolved backend);
    /// `berth agent` defaults to [`DEFAULT_BACKEND`].
    pub backend: Backend,
    /// iptables dispatch; the nftables backend always dispatches through verdict maps.
    pub dispatch: Dispatch,
    /// Pod CIDRs, at most one per family; their families are the ones the agent programs.
    pub cluster_cidrs: Vec<IpNet>,
    pub masquerade_all: bool,
    /// The cluster's node port range (the controller's `--node-port-range`): node ports outside
    /// it are not programmed.
    pub node_port_range: PortRange,
    /// Least time between two syncs: changes arriving faster are coalesced.
    pub min_sync_interval: Duration,
    /// A full-consistency sync runs at least this often.
    pub sync_period: Duration,
    /// Address the health-check node-port servers bind (the port is each Service's) when
    /// `node_port_addresses` is unset or names every address; otherwise they listen on the
    /// node-port addresses, as kube-proxy serves them.
    pub healthz_bind_address: IpAddr,
    pub admin_listen: SocketAddr,
    /// Answer ARP and NDP for the LoadBalancer IPs this node is elected for.
    pub l2_announcer: bool,
    /// Interfaces the announcer answers on; empty: every non-loopback Ethernet interface.
    pub l2_interfaces: Vec<String>,
    /// `spec.externalIPs` are programmed only inside these; empty (the default): none.
    pub external_ip_cidrs: Vec<IpNet>,
    /// How large one Service may be before it is not programmed (`--max-service-*`).
    pub service_bounds: berth_api::ServiceBounds,
    /// kube-proxy's `--nodeport-addresses`: the node's addresses node ports answer on; empty
    /// (the default): every local address.
    pub node_port_addresses: NodePortAddresses,
    /// The cluster's Service CIDRs where it does not serve ServiceCIDR objects (before
    /// Kubernetes 1.33): new connections into them that no Service translated are rejected
    /// (a ClusterIP's undefined port) or dropped (an unallocated address). Empty: no such check.
    pub service_cidrs: Vec<IpNet>,
    /// The agent's own namespace (the lease namespace): its `ServiceL2Status` and
    /// `BGPSessionState` records, and the BGP peers' password Secrets unless a peer names another.
    pub l2_status_namespace: String,
    /// Owned addresses are announced again this often after their takeover rounds; zero: only
    /// on takeover.
    pub l2_gratuitous_interval: Duration,
    /// Announce LoadBalancer IPs over BGP through the FRR beside the agent.
    pub bgp_speaker: Option<crate::speaker::SpeakerConfig>,
    /// nat shards of the nftables backend: Service chains spread over this many tables.
    pub nft_shards: u16,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            node_name: String::new(),
            proxy_mode: ProxyMode::Full,
            backend: Backend::Iptables,
            dispatch: Dispatch::Tree,
            cluster_cidrs: Vec::new(),
            masquerade_all: false,
            node_port_range: PortRange::DEFAULT,
            min_sync_interval: Duration::from_millis(100),
            sync_period: Duration::from_secs(30),
            healthz_bind_address: IpAddr::from([0, 0, 0, 0]),
            // Next to kube-proxy's 10256, which may run on the same node (labeled mode).
            admin_listen: SocketAddr::from(([0, 0, 0, 0], 10356)),
            l2_announcer: false,
            l2_interfaces: Vec::new(),
            external_ip_cidrs: Vec::new(),
            service_bounds: berth_api::ServiceBounds::default(),
            node_port_addresses: NodePortAddresses::default(),
            service_cidrs: Vec::new(),
            l2_status_namespace: "kube-system".into(),
            l2_gratuitous_interval: Duration::from_secs(60),
            bgp_speaker: None,
            nft_shards: berth_datapath::nft::shard::DEFAULT_SHARDS,
        }
    }
}

/// Validated agent settings.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    options: AgentOptions,
    families: Vec<IpFamily>,
}

fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidConfig {
        field,
        reason: reason.into(),
    }
}

impl AgentOptions {
    pub fn validate(self) -> Result<AgentConfig, Error> {
        // A Node name is a DNS-1123 subdomain.
        if dns1123_subdomain_problem(&self.node_name).is_some() {
            return Err(invalid(
                "node name",
                format!("{:?} is not a valid Node name", self.node_name),
            ));
        }
        if let Err(err) = berth_datapath::nft::Shards::new(self.nft_shards) {
            return Err(invalid("nft shards", err.to_string()));
        }
        if self.sync_period.is_zero() {
            return Err(invalid("sync period", "must be greater than zero"));
        }
        if self.min_sync_interval > self.sync_period {
            return Err(invalid(
                "min sync interval",
                format!(
                    "{:?} is longer than the sync period {:?}",
                    self.min_sync_interval, self.sync_period
                ),
            ));
        }
        for name in &self.l2_interfaces {
            if let Some(problem) = berth_core::interface_name_problem(name) {
                return Err(invalid("L2 interface", format!("{name:?}: {problem}")));
            }
        }
        if self.l2_announcer {
            if let Some(problem) = berth_core::dns1123_label_problem(&self.l2_status_namespace) {
                return Err(invalid(
                    "L2 status namespace",
                    format!("{:?}: {problem}", self.l2_status_namespace),
                ));
            }
        }
        let mut families = Vec::new();
        for cidr in &self.cluster_cidrs {
            let family = IpFamily::of(cidr.addr());
            if families.contains(&family) {
                return Err(invalid(
                    "cluster CIDR",
                    format!("{cidr}: at most one CIDR per address family"),
                ));
            }
            families.push(family);
        }
        if families.is_empty() {
            families.push(IpFamily::V4);
        }
        families.sort();
        let mut cidr_families = Vec::new();
        for cidr in &self.service_cidrs {
            if cidr.trunc() != *cidr {
                return Err(invalid(
                    "service CIDR",
                    format!("{cidr} has host bits set: write {} instead", cidr.trunc()),
                ));
            }
            let family = IpFamily::of(cidr.addr());
            if cidr_families.contains(&family) {
                return Err(invalid(
                    "service CIDR",
                    format!("{cidr}: at most one CIDR per address family"),
                ));
            }
            cidr_families.push(family);
        }
        Ok(AgentConfig {
            options: self,
            families,
        })
    }
}

impl AgentConfig {
    pub fn node_name(&self) -> &str {
        &self.options.node_name
    }

    pub fn proxy_mode(&self) -> ProxyMode {
        self.options.proxy_mode
    }

    /// What Services may ask of this node.
    pub fn service_policy(&self) -> berth_datapath::plan::convert::ServicePolicy {
        berth_datapath::plan::convert::ServicePolicy {
            external_ip_cidrs: self.options.external_ip_cidrs.clone(),
            bounds: self.options.service_bounds,
        }
    }

    /// The backend as configured (`Auto` until the caller resolves it).
    pub fn backend(&self) -> Backend {
        self.options.backend
    }

    /// The nftables backend's nat shards (validated).
    pub fn nft_shards(&self) -> berth_datapath::nft::Shards {
        berth_datapath::nft::Shards::new(self.options.nft_shards).unwrap_or_default()
    }

    /// The same configuration with `backend` (what [`Backend::resolve`] chose).
    pub fn with_backend(mut self, backend: Backend) -> Self {
        self.options.backend = backend;
        self
    }

    pub fn dispatch(&self) -> Dispatch {
        self.options.dispatch
    }

    /// The address families the agent programs, IPv4 first.
    pub fn families(&self) -> &[IpFamily] {
        &self.families
    }

    pub fn node_port_range(&self) -> PortRange {
        self.options.node_port_range
    }

    pub fn min_sync_interval(&self) -> Duration {
        self.options.min_sync_interval
    }

    pub fn sync_period(&self) -> Duration {
        self.options.sync_period
    }

    /// `--nodeport-addresses`: where node ports, and health-check node ports, answer.
    pub fn node_port_addresses(&self) -> &NodePortAddresses {
        &self.options.node_port_addresses
    }

    /// `--service-cidr`: the Service CIDRs while no ServiceCIDR objects are known.
    pub fn service_cidrs(&self) -> &[IpNet] {
        &self.options.service_cidrs
    }

    pub fn healthz_bind_address(&self) -> IpAddr {
        self.options.healthz_bind_address
    }

    pub fn admin_listen(&self) -> SocketAddr {
        self.options.admin_listen
    }

    /// The announcer's settings, when it is enabled.
    pub fn announcer(&self) -> Option<crate::announce::AnnouncerConfig> {
        self.options
            .l2_announcer
            .then(|| crate::announce::AnnouncerConfig {
                interfaces: self.options.l2_interfaces.clone(),
                status_namespace: self.options.l2_status_namespace.clone(),
                gratuitous_interval: Some(self.options.l2_gratuitous_interval)
                    .filter(|i| !i.is_zero()),
            })
    }

    /// The BGP speaker's settings, when it is enabled.
    pub fn speaker(&self) -> Option<crate::speaker::SpeakerConfig> {
        self.options
            .bgp_speaker
            .clone()
            .map(|config| crate::speaker::SpeakerConfig {
                namespace: self.options.l2_status_namespace.clone(),
                ..config
            })
    }

    /// What the planner of one family is given.
    pub fn plan_options(&self, family: IpFamily) -> PlanOptions {
        PlanOptions {
            family,
            // Linear dispatch is what becomes the verdict maps of the nftables backend.
            dispatch: match self.options.backend {
                Backend::Nftables => Dispatch::Linear,
                Backend::Iptables | Backend::Auto => self.options.dispatch,
            },
            cluster_cidr: self
                .options
                .cluster_cidrs
                .iter()
                .find(|cidr| IpFamily::of(cidr.addr()) == family)
                .copied(),
            masquerade_all: self.options.masquerade_all,
            node_port_addresses: self.options.node_port_addresses.clone(),
            ..PlanOptions::default()
        }
    }
}

/// A duration flag: a number with `ms`, `s`, `m` or `h` (`500ms`, `1s`, `2m`); a bare number is
/// seconds.
pub fn parse_duration(value: &str) -> Result<Duration, Error> {
    let value = value.trim();
    let split = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| invalid("duration", format!("{value:?} is not a number with a unit")))?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => {
            return Err(invalid(
                "duration",
                format!("{value:?}: unit must be ms, s, m or h"),
            ))
        }
    };
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| invalid("duration", format!("{value:?} is out of range")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn mk_options() -> AgentOptions {
        AgentOptions {
            node_name: "node-1".into(),
            ..AgentOptions::default()
        }
    }

    #[test]
    fn nftables_plans_linear_dispatch_and_auto_resolves_once() {
        let config = AgentOptions {
            backend: Backend::Nftables,
            ..mk_options()
        }
        .validate()
        .unwrap();
        assert_eq!(config.dispatch(), Dispatch::Tree);
        assert_eq!(config.plan_options(IpFamily::V4).dispatch, Dispatch::Linear);
        let facts = |nft_usable, iptables_forward_drops| {
            move || NodeFacts {
                nft_usable,
                iptables_forward_drops,
            }
        };
        assert_eq!(Backend::Auto.resolve(facts(true, false)), Backend::Nftables);
        assert_eq!(
            Backend::Auto.resolve(facts(false, false)),
            Backend::Iptables
        );
        // Docker's FORWARD DROP: only berth's rules in iptables' own chain can accept.
        assert_eq!(Backend::Auto.resolve(facts(true, true)), Backend::Iptables);
        assert_eq!(Backend::Auto.resolve(facts(false, true)), Backend::Iptables);
        let asked = std::cell::Cell::new(false);
        let ask = || {
            asked.set(true);
            facts(true, false)()
        };
        assert_eq!(Backend::Iptables.resolve(ask), Backend::Iptables);
        assert!(!asked.get(), "a chosen backend is not probed");
    }

    #[test]
    fn service_cidrs_are_one_network_per_family() {
        let with = |cidrs: &[&str]| {
            AgentOptions {
                service_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
                ..mk_options()
            }
            .validate()
        };
        let config = with(&["10.96.0.0/16", "fd00:96::/112"]).unwrap();
        assert_eq!(config.service_cidrs().len(), 2);
        assert!(with(&[]).unwrap().service_cidrs().is_empty());
        for bad in [&["10.96.0.1/16"][..], &["10.96.0.0/16", "10.97.0.0/16"]] {
            let err = with(bad).unwrap_err().to_string();
            assert!(err.contains("service CIDR"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn defaults_validate_to_ipv4_only() {
        let config = mk_options().validate().unwrap();
        assert_eq!(config.families(), &[IpFamily::V4]);
        assert_eq!(config.plan_options(IpFamily::V4).cluster_cidr, None);
        assert_eq!(config.dispatch(), Dispatch::Tree);
    }

    #[test]
    fn node_names_must_be_kubernetes_names() {
        for bad in ["", "Node1", "-a", "a..b", "a_b", "a-"] {
            let options = AgentOptions {
                node_name: bad.into(),
                ..mk_options()
            };
            assert!(options.validate().is_err(), "{bad:?}");
        }
        for good in ["a", "node-1", "ip-10-0-0-1.ec2.internal"] {
            let options = AgentOptions {
                node_name: good.into(),
                ..mk_options()
            };
            assert!(options.validate().is_ok(), "{good:?}");
        }
    }

    #[test]
    fn cluster_cidrs_choose_families_and_plan_options() {
        let options = AgentOptions {
            cluster_cidrs: vec![
                "fd00::/48".parse().unwrap(),
                "10.244.0.0/16".parse().unwrap(),
            ],
            masquerade_all: true,
            dispatch: Dispatch::Linear,
            ..mk_options()
        };
        let config = options.validate().unwrap();
        assert_eq!(config.families(), &[IpFamily::V4, IpFamily::V6]);
        let v6 = config.plan_options(IpFamily::V6);
        assert_eq!(v6.cluster_cidr, Some("fd00::/48".parse().unwrap()));
        assert!(v6.masquerade_all);
        assert_eq!(v6.dispatch, Dispatch::Linear);
        assert_eq!(
            config.plan_options(IpFamily::V4).cluster_cidr,
            Some("10.244.0.0/16".parse().unwrap())
        );
    }

    #[test]
    fn two_cidrs_of_one_family_are_refused() {
        let options = AgentOptions {
            cluster_cidrs: vec![
                "10.244.0.0/16".parse().unwrap(),
                "10.245.0.0/16".parse().unwrap(),
            ],
            ..mk_options()
        };
        let err = options.validate().unwrap_err().to_string();
        assert!(err.contains("one CIDR per address family"), "{err}");
    }

    #[test]
    fn the_announcer_is_off_unless_asked_and_interface_names_are_checked() {
        assert_eq!(mk_options().validate().unwrap().announcer(), None);
        let options = AgentOptions {
            l2_announcer: true,
            l2_interfaces: vec!["eth0".into(), "bond0.100".into()],
            ..mk_options()
        };
        let announcer = options.validate().unwrap().announcer().unwrap();
        assert_eq!(announcer.interfaces, ["eth0", "bond0.100"]);
        assert_eq!(announcer.status_namespace, "kube-system");
        assert_eq!(announcer.gratuitous_interval, Some(Duration::from_secs(60)));
        let quiet = AgentOptions {
            l2_announcer: true,
            l2_gratuitous_interval: Duration::ZERO,
            ..mk_options()
        };
        assert_eq!(
            quiet
                .validate()
                .unwrap()
                .announcer()
                .unwrap()
                .gratuitous_interval,
            None
        );
        let bad_namespace = AgentOptions {
            l2_announcer: true,
            l2_status_namespace: "Not_A_Namespace".into(),
            ..mk_options()
        };
        let err = bad_namespace.validate().unwrap_err().to_string();
        assert!(err.contains("L2 status namespace"), "{err}");
        let bad = AgentOptions {
            l2_announcer: true,
            l2_interfaces: vec!["a-very-long-interface".into()],
            ..mk_options()
        };
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains("L2 interface"), "{err}");
    }

    #[test]
    fn durations_take_the_usual_units() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("1.5m").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        for bad in ["", "s", "1d", "-1s", "1 s x"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn intervals_must_be_ordered_and_positive() {
        let zero = AgentOptions {
            sync_period: Duration::ZERO,
            min_sync_interval: Duration::ZERO,
            ..mk_options()
        };
        assert!(zero.validate().is_err());
        let inverted = AgentOptions {
            sync_period: Duration::from_secs(1),
            min_sync_interval: Duration::from_secs(2),
            ..mk_options()
        };
        assert!(inverted.validate().is_err());
    }
}

//! `berth agent`: the node agent.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};

use super::parse_duration;

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Name of the Node this agent runs on (the Downward API's `spec.nodeName`).
    #[arg(long, env = "BERTH_NODE_NAME", required_unless_present = "cleanup")]
    node_name: Option<String>,

    /// Remove everything berth programs on this node, as kube-proxy's `--cleanup`: the nftables
    /// tables `ip berth` and `ip6 berth` with their nat shards `berth-<n>`, and every `BERTH-*`
    /// chain and the jumps into it in iptables (both families, legacy and nft), nothing else;
    /// then exit (0 when all of it went).
    #[arg(long, env = "BERTH_CLEANUP")]
    cleanup: bool,

    /// Which Services to program: `full` replaces kube-proxy, `labeled` only takes Services
    /// labelled `service.kubernetes.io/service-proxy-name: berth`, `none` leaves iptables alone.
    #[arg(long, env = "BERTH_PROXY_MODE", value_enum, default_value_t = ProxyModeArg::Full)]
    proxy_mode: ProxyModeArg,

    /// What programs the kernel: `nftables` (berth's own tables `ip berth`/`ip6 berth`, verdict-map
    /// dispatch), `iptables` (berth's chains in the iptables tables), or `auto` (the default):
    /// nftables, the fastest backend, when the kernel accepts what it programs and
    /// iptables' FORWARD policy is not DROP (an nftables accept cannot override it, Docker sets
    /// it), else iptables. The other backend has berth's rules removed at start.
    #[arg(long, env = "BERTH_BACKEND", value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,

    /// How the nftables backend writes the kernel: `netlink` (the default) sends berth's own
    /// nfnetlink batch, one kernel transaction per sync, with no `nft` program; `nft` runs
    /// `nft -f -` on the same transaction as text (the readable form, for comparison).
    #[arg(long, env = "BERTH_NFT_WRITER", value_enum, default_value_t = NftWriterArg::Netlink)]
    nft_writer: NftWriterArg,

    /// nat shards of the nftables backend (1-256): each Service's chains live in one of this
    /// many tables `berth-<n>`, chosen from its name, so a change to one Service makes the
    /// kernel validate 1/N of the Service chains; 1 keeps one table. Each new connection's
    /// first packet looks up its Service in every shard (docs/benchmarks.md, "nat shards").
    /// Another count after a restart moves the Services (their affinity entries start over).
    #[arg(long, env = "BERTH_NFT_SHARDS", default_value_t = berth_agent::DEFAULT_NFT_SHARDS)]
    nft_shards: u16,

    /// How the iptables entry chains find a Service: a tree keyed by address, or kube-proxy's
    /// linear list (the nftables backend always uses verdict maps).
    #[arg(long, env = "BERTH_DISPATCH", value_enum, default_value_t = DispatchArg::Tree)]
    dispatch: DispatchArg,

    /// Pod CIDR(s), at most one per family, comma separated; traffic from outside them to a
    /// ClusterIP is masqueraded. Their families are the ones programmed (IPv4 when unset).
    #[arg(long, env = "BERTH_CLUSTER_CIDR", value_delimiter = ',')]
    cluster_cidr: Vec<berth_agent::IpNet>,

    /// CIDRs inside which Services' `spec.externalIPs` are programmed, comma separated. Empty
    /// (the default): none, as the API server's DenyServiceExternalIPs; an external IP outside
    /// them is left out of the datapath.
    #[arg(long, env = "BERTH_EXTERNAL_IP_CIDRS", value_delimiter = ',')]
    external_ip_cidrs: Vec<berth_agent::IpNet>,

    #[command(flatten)]
    service_bounds: super::ServiceBoundsArgs,

    /// The cluster's node port range, as given to the controller (`--node-port-range`) or the
    /// API server (`--service-node-port-range`): a node port outside it is never programmed.
    #[arg(long, env = "BERTH_NODE_PORT_RANGE", default_value = "30000-32767", value_parser = parse_node_port_range)]
    node_port_range: berth_controller::PortRange,

    /// kube-proxy's --nodeport-addresses: CIDRs and the keyword `primary`, comma separated.
    /// Node ports answer only on this node's addresses inside the CIDRs, and on its primary
    /// address (the Node's first InternalIP of each family) with `primary`. Empty (the default):
    /// on every local address.
    #[arg(long, env = "BERTH_NODEPORT_ADDRESSES", value_parser = parse_node_port_addresses)]
    nodeport_addresses: Option<berth_agent::NodePortAddresses>,

    /// The cluster's Service CIDR(s), one per family, comma separated, for clusters that do not
    /// serve ServiceCIDR objects (before Kubernetes 1.33; where they are served, they hold
    /// instead). New connections into them that no Service takes are rejected (a ClusterIP's
    /// undefined port) or dropped (an address no Service holds). Empty (the default): no check.
    #[arg(long, env = "BERTH_SERVICE_CIDR", value_delimiter = ',')]
    service_cidr: Vec<berth_agent::IpNet>,

    /// Masquerade all traffic to ClusterIPs.
    #[arg(long, env = "BERTH_MASQUERADE_ALL")]
    masquerade_all: bool,

    /// Least time between two syncs (e.g. `1s`, `500ms`); faster changes are coalesced. A sync
    /// also waits four times the previous sync's duration, unless recent syncs used less than a
    /// quarter of the time, so a slow backend spaces itself.
    #[arg(long, env = "BERTH_MIN_SYNC_INTERVAL", default_value = "100ms", value_parser = parse_duration)]
    min_sync_interval: Duration,

    /// Period of the full-consistency sync; `/healthz` fails after two without a success.
    #[arg(long, env = "BERTH_SYNC_PERIOD", default_value = "30s", value_parser = parse_duration)]
    sync_period: Duration,

    /// Address the health-check node-port servers bind while `--nodeport-addresses` is unset
    /// (or names every address); with it set they listen on the node-port addresses instead.
    #[arg(long, env = "BERTH_HEALTHZ_BIND_ADDRESS", default_value = "0.0.0.0")]
    healthz_bind_address: IpAddr,

    /// Address of the admin endpoint (`/healthz`, `/readyz`, `/metrics`). Not kube-proxy's 10256,
    /// so both can run on one node.
    #[arg(long, env = "BERTH_ADMIN_LISTEN", default_value = "0.0.0.0:10356")]
    admin_listen: SocketAddr,

    /// Answer ARP and NDP for the LoadBalancer IPs this node is elected for (with
    /// `--proxy-mode none`: an announcer beside kube-proxy).
    #[arg(long, env = "BERTH_L2_ANNOUNCER")]
    l2_announcer: bool,

    /// Interfaces the announcer answers on, comma separated; unset: every non-loopback
    /// Ethernet interface.
    #[arg(long, env = "BERTH_L2_INTERFACES", value_delimiter = ',')]
    l2_interfaces: Vec<String>,

    /// Owned LoadBalancer IPs are announced again (gratuitous ARP, unsolicited NA) this often
    /// after their takeover rounds, so switches never age them out; 0s: only on takeover.
    #[arg(long, env = "BERTH_L2_GRATUITOUS_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    l2_gratuitous_interval: Duration,
    /// Announce LoadBalancer IPs over BGP through the FRR beside the agent (BGPPeer,
    /// BGPAdvertisement, BFDProfile); see docs/bgp.md.
    #[arg(long, env = "BERTH_BGP_SPEAKER")]
    bgp_speaker: bool,

    /// FRR's vty socket directory, where the rendered frr.conf is written too.
    #[arg(long, env = "BERTH_FRR_DIR", default_value = "/var/run/frr")]
    frr_dir: PathBuf,

    /// frr-reload.py, which applies the rendered configuration.
    #[arg(
        long,
        env = "BERTH_FRR_RELOAD",
        default_value = "/usr/lib/frr/frr-reload.py"
    )]
    frr_reload: PathBuf,

    /// Kubeconfig to use; when unset, KUBECONFIG or ~/.kube/config, then in-cluster configuration.
    #[arg(long, env = "BERTH_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,

    /// Agent liveness for the L2 announcer: `on` keeps this agent's Lease and runs SWIM with
    /// the other agents (sub-second crash detection, needs --membership-key-file); `off` keeps
    /// the Lease only (crashes are seen when the Lease expires). Unset: no liveness.
    #[arg(long, env = "BERTH_MEMBERSHIP", value_enum)]
    membership: Option<OnOff>,

    /// File holding the shared HMAC-SHA256 key that authenticates every membership datagram
    /// (a mounted Secret; at least 16 bytes, surrounding whitespace ignored).
    #[arg(long, env = "BERTH_MEMBERSHIP_KEY_FILE")]
    membership_key_file: Option<PathBuf>,

    /// File holding a second key whose datagrams are accepted too (never used to seal): a key
    /// being rotated in or out. A missing file means none, so a Secret without it is fine.
    #[arg(long, env = "BERTH_MEMBERSHIP_PREVIOUS_KEY_FILE")]
    membership_previous_key_file: Option<PathBuf>,

    /// UDP port of the membership socket (0 picks a free one; it is advertised on the Lease).
    #[arg(long, env = "BERTH_MEMBERSHIP_PORT", default_value_t = berth_membership::DEFAULT_PORT)]
    membership_port: u16,

    /// Address the membership socket binds.
    #[arg(long, env = "BERTH_MEMBERSHIP_BIND_ADDRESS", default_value = "0.0.0.0")]
    membership_bind_address: IpAddr,

    /// Address peers reach this agent's membership socket on; when unset, the bind address if
    /// specific, else the Node's first InternalIP of its family.
    #[arg(long, env = "BERTH_MEMBERSHIP_ADVERTISE_ADDRESS")]
    membership_advertise_address: Option<IpAddr>,

    /// How often a random peer agent is probed.
    #[arg(long, env = "BERTH_MEMBERSHIP_PROBE_PERIOD", default_value = "200ms", value_parser = parse_duration)]
    membership_probe_period: Duration,

    /// How long a probe waits for a direct answer before peers are asked to probe indirectly
    /// (shorter than the probe period).
    #[arg(long, env = "BERTH_MEMBERSHIP_PROBE_TIMEOUT", default_value = "80ms", value_parser = parse_duration)]
    membership_probe_timeout: Duration,

    /// How long a suspected agent has to refute before it is declared down.
    #[arg(long, env = "BERTH_MEMBERSHIP_SUSPICION_TIMEOUT", default_value = "400ms", value_parser = parse_duration)]
    membership_suspicion_timeout: Duration,

    /// How often this agent sends every peer agent a heartbeat (liveness is decided by them).
    #[arg(long, env = "BERTH_MEMBERSHIP_HEARTBEAT_INTERVAL", default_value = "40ms", value_parser = parse_duration)]
    membership_heartbeat_interval: Duration,

    /// How long this agent answers for its addresses without hearing a majority of its peers.
    #[arg(long, env = "BERTH_MEMBERSHIP_WITHDRAW_AFTER", default_value = "130ms", value_parser = parse_duration)]
    membership_withdraw_after: Duration,

    /// How long a peer agent stays live without being heard before its addresses move; at
    /// least the withdrawal time plus two heartbeat intervals.
    #[arg(long, env = "BERTH_MEMBERSHIP_FAILURE_TIMEOUT", default_value = "250ms", value_parser = parse_duration)]
    membership_failure_timeout: Duration,

    /// Namespace of the agents' Leases (`berth-agent-<node>`), of the announcer's
    /// `ServiceL2Status` and the BGP speaker's `BGPSessionState` records, and of BGP password
    /// Secrets that name no namespace: the agent's own.
    #[arg(long, env = "BERTH_LEASE_NAMESPACE", default_value = "kube-system")]
    lease_namespace: String,

    /// How long an agent's Lease stays fresh without renewal (whole seconds); renewed every
    /// third of it.
    #[arg(long, env = "BERTH_LEASE_DURATION", default_value = "10s", value_parser = parse_duration)]
    lease_duration: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ProxyModeArg {
    Full,
    Labeled,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    Iptables,
    Nftables,
    Auto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum NftWriterArg {
    Netlink,
    Nft,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DispatchArg {
    Tree,
    Linear,
}

impl AgentArgs {
    /// The liveness settings, reading the key file; `None` when `--membership` is unset.
    fn membership_config(&self) -> anyhow::Result<Option<berth_membership::MembershipConfig>> {
        let Some(mode) = self.membership else {
            return Ok(None);
        };
        let key = match (&self.membership_key_file, mode) {
            (Some(path), OnOff::On) => Some(
                std::fs::read(path)
                    .with_context(|| format!("reading the membership key {}", path.display()))?,
            ),
            _ => None,
        };
        let previous_key = match (&self.membership_previous_key_file, mode) {
            (Some(path), OnOff::On) => match std::fs::read(path) {
                Ok(bytes) => Some(bytes),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
                Err(err) => {
                    return Err(anyhow::Error::new(err).context(format!(
                        "reading the previous membership key {}",
                        path.display()
                    )))
                }
            },
            _ => None,
        };
        let options = berth_membership::MembershipOptions {
            node_name: self.node_name.clone().unwrap_or_default(),
            enabled: mode == OnOff::On,
            lease_namespace: self.lease_namespace.clone(),
            lease_duration: self.lease_duration,
            bind: SocketAddr::new(self.membership_bind_address, self.membership_port),
            advertise_address: self.membership_advertise_address,
            key,
            previous_key,
            probe_period: self.membership_probe_period,
            probe_timeout: self.membership_probe_timeout,
            suspicion_timeout: self.membership_suspicion_timeout,
            key_file: self.membership_key_file.clone(),
            previous_key_file: self.membership_previous_key_file.clone(),
            heartbeat_interval: self.membership_heartbeat_interval,
            withdraw_after: self.membership_withdraw_after,
            failure_timeout: self.membership_failure_timeout,
            ..berth_membership::MembershipOptions::default()
        };
        Ok(Some(options.validate()?))
    }

    fn to_options(&self) -> berth_agent::AgentOptions {
        berth_agent::AgentOptions {
            node_name: self.node_name.clone().unwrap_or_default(),
            proxy_mode: match self.proxy_mode {
                ProxyModeArg::Full => berth_agent::ProxyMode::Full,
                ProxyModeArg::Labeled => berth_agent::ProxyMode::Labeled,
                ProxyModeArg::None => berth_agent::ProxyMode::None,
            },
            nft_shards: self.nft_shards,
            backend: match self.backend {
                BackendArg::Iptables => berth_agent::Backend::Iptables,
                BackendArg::Nftables => berth_agent::Backend::Nftables,
                BackendArg::Auto => berth_agent::Backend::Auto,
            },
            dispatch: match self.dispatch {
                DispatchArg::Tree => berth_agent::Dispatch::Tree,
                DispatchArg::Linear => berth_agent::Dispatch::Linear,
            },
            cluster_cidrs: self.cluster_cidr.clone(),
            external_ip_cidrs: self.external_ip_cidrs.clone(),
            service_bounds: self.service_bounds.bounds(),
            masquerade_all: self.masquerade_all,
            node_port_range: self.node_port_range,
            node_port_addresses: self.nodeport_addresses.clone().unwrap_or_default(),
            service_cidrs: self.service_cidr.clone(),
            min_sync_interval: self.min_sync_interval,
            sync_period: self.sync_period,
            healthz_bind_address: self.healthz_bind_address,
            admin_listen: self.admin_listen,
            l2_announcer: self.l2_announcer,
            l2_interfaces: self.l2_interfaces.clone(),
            l2_status_namespace: self.lease_namespace.clone(),
            l2_gratuitous_interval: self.l2_gratuitous_interval,
            bgp_speaker: self.bgp_speaker.then(|| berth_agent::SpeakerConfig {
                frr_dir: self.frr_dir.clone(),
                frr_reload: self.frr_reload.clone(),
                ..Default::default()
            }),
        }
    }
}

/// The controller's own parser, so both flags accept and refuse the same ranges.
fn parse_node_port_addresses(text: &str) -> Result<berth_agent::NodePortAddresses, String> {
    text.parse()
}

fn parse_node_port_range(text: &str) -> Result<berth_controller::PortRange, String> {
    berth_controller::parse_node_port_range(text).map_err(super::controller::flag_error)
}

/// Programs the iptables of the network namespace it runs in; stopping leaves the rules in place.
pub fn run(args: AgentArgs, log_drops: berth_telemetry::DroppedLines) -> anyhow::Result<()> {
    if args.cleanup {
        let steps = berth_agent::cleanup::cleanup_node();
        let failed = steps.iter().filter(|s| s.outcome.is_err()).count();
        for step in &steps {
            println!("{step}");
        }
        anyhow::ensure!(failed == 0, "{failed} cleanup step(s) failed");
        return Ok(());
    }
    let config = args.to_options().validate()?;
    let membership = args.membership_config()?;
    let admin_listen = config.admin_listen();
    let opts = berth_agent::RunOptions {
        config,
        version: env!("CARGO_PKG_VERSION").to_string(),
        membership,
        log_drops: Some(log_drops),
        nft_writer: match args.nft_writer {
            NftWriterArg::Netlink => berth_agent::NftWriter::Netlink,
            NftWriterArg::Nft => berth_agent::NftWriter::Nft,
        },
    };
    super::run(|shutdown| async move {
        let client = super::build_client(args.kubeconfig.as_deref()).await?;
        let admin = super::bind_admin(admin_listen).await?;
        berth_agent::run_agent(client, admin, opts, shutdown)
            .await
            .context("running the agent")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse, Command};

    #[test]
    fn agent_flags() {
        let cli = parse(&[
            "agent",
            "--node-name",
            "node-1",
            "--proxy-mode",
            "labeled",
            "--backend",
            "nftables",
            "--dispatch",
            "linear",
            "--cluster-cidr",
            "10.244.0.0/16,fd00:10:244::/48",
            "--masquerade-all",
            "--min-sync-interval",
            "250ms",
            "--sync-period",
            "1m",
            "--healthz-bind-address",
            "127.0.0.1",
            "--admin-listen",
            "127.0.0.1:10256",
            "--l2-announcer",
            "--l2-interfaces",
            "eth0,eth1",
        ])
        .unwrap();
        let Command::Agent(args) = cli.command else {
            panic!("parsed {:?}", cli.command);
        };
        let config = args.to_options().validate().unwrap();
        assert_eq!(config.node_name(), "node-1");
        assert_eq!(config.proxy_mode(), berth_agent::ProxyMode::Labeled);
        assert_eq!(config.backend(), berth_agent::Backend::Nftables);
        assert_eq!(config.dispatch(), berth_agent::Dispatch::Linear);
        assert_eq!(
            config.families(),
            &[berth_agent::IpFamily::V4, berth_agent::IpFamily::V6]
        );
        assert_eq!(config.min_sync_interval(), Duration::from_millis(250));
        assert_eq!(config.sync_period(), Duration::from_secs(60));
        assert!(
            config
                .plan_options(berth_agent::IpFamily::V4)
                .masquerade_all
        );
        assert_eq!(config.admin_listen().port(), 10256);
        assert_eq!(
            config.announcer().map(|a| a.interfaces),
            Some(vec!["eth0".to_string(), "eth1".to_string()])
        );
    }

    #[test]
    fn agent_defaults_and_required_node_name() {
        assert!(parse(&["agent"]).is_err());
        let cli = parse(&["agent", "--node-name", "n"]).unwrap();
        let Command::Agent(args) = cli.command else {
            panic!("parsed {:?}", cli.command);
        };
        let config = args.to_options().validate().unwrap();
        assert_eq!(config.proxy_mode(), berth_agent::ProxyMode::Full);
        // The benches report what this default picks on their machine.
        assert_eq!(config.backend(), berth_agent::DEFAULT_BACKEND);
        assert_eq!(config.backend(), berth_agent::Backend::Auto);
        assert_eq!(config.dispatch(), berth_agent::Dispatch::Tree);
        assert_eq!(config.sync_period(), Duration::from_secs(30));
        assert_eq!(config.min_sync_interval(), Duration::from_millis(100));
        assert_eq!(config.admin_listen(), "0.0.0.0:10356".parse().unwrap());
        assert_eq!(config.announcer(), None);
        assert!(parse(&["agent", "--node-name", "n", "--sync-period", "soon"]).is_err());
        assert!(args.membership_config().unwrap().is_none());
        // --cleanup needs no node name.
        assert!(parse(&["agent", "--cleanup"]).is_ok());
    }

    fn agent_args(extra: &[&str]) -> AgentArgs {
        let mut argv = vec!["agent", "--node-name", "node-1"];
        argv.extend_from_slice(extra);
        match parse(&argv).unwrap().command {
            Command::Agent(args) => args,
            other => panic!("parsed {other:?}"),
        }
    }

    #[test]
    fn membership_flags() {
        let dir = std::env::temp_dir().join(format!("berth-membership-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("key");
        std::fs::write(&key, "0123456789abcdef0123456789abcdef\n").unwrap();
        let args = agent_args(&[
            "--membership",
            "on",
            "--membership-key-file",
            key.to_str().unwrap(),
            "--membership-port",
            "7950",
            "--membership-bind-address",
            "198.18.0.11",
            "--membership-advertise-address",
            "198.18.0.11",
            "--membership-probe-period",
            "300ms",
            "--membership-probe-timeout",
            "100ms",
            "--membership-suspicion-timeout",
            "1s",
            "--lease-namespace",
            "kube-node-lease",
            "--lease-duration",
            "15s",
        ]);
        let config = args.membership_config().unwrap().unwrap();
        assert!(config.enabled());
        assert_eq!(config.bind(), "198.18.0.11:7950".parse().unwrap());
        assert_eq!(
            config.advertise_address(),
            Some("198.18.0.11".parse().unwrap())
        );
        assert_eq!(config.probe_period(), Duration::from_millis(300));
        assert_eq!(config.probe_timeout(), Duration::from_millis(100));
        assert_eq!(config.suspicion_timeout(), Duration::from_secs(1));
        assert_eq!(config.lease_namespace(), "kube-node-lease");
        assert_eq!(config.lease_duration(), Duration::from_secs(15));
        std::fs::remove_dir_all(&dir).unwrap();

        // Membership on needs a key; a missing file is an error that names it.
        assert!(agent_args(&["--membership", "on"])
            .membership_config()
            .is_err());
        let missing = agent_args(&[
            "--membership",
            "on",
            "--membership-key-file",
            "/nonexistent/key",
        ])
        .membership_config()
        .unwrap_err()
        .to_string();
        assert!(missing.contains("/nonexistent/key"), "{missing}");
        // Off: the Lease alone, no key needed; the defaults are the documented ones.
        let lease_only = agent_args(&["--membership", "off"])
            .membership_config()
            .unwrap()
            .unwrap();
        assert!(!lease_only.enabled());
        assert_eq!(lease_only.lease_namespace(), "kube-system");
        assert_eq!(lease_only.lease_duration(), Duration::from_secs(10));
        let defaults = agent_args(&["--membership", "off"]);
        assert_eq!(defaults.membership_port, 7947);
        assert_eq!(defaults.membership_probe_period, Duration::from_millis(200));
        assert_eq!(defaults.membership_probe_timeout, Duration::from_millis(80));
        assert_eq!(
            defaults.membership_suspicion_timeout,
            Duration::from_millis(400)
        );
        // Timings are checked: a probe timeout must be shorter than the period.
        let dir2 =
            std::env::temp_dir().join(format!("berth-membership-key2-{}", std::process::id()));
        std::fs::create_dir_all(&dir2).unwrap();
        let key2 = dir2.join("key");
        std::fs::write(&key2, "0123456789abcdef0123456789abcdef").unwrap();
        let bad = agent_args(&[
            "--membership",
            "on",
            "--membership-key-file",
            key2.to_str().unwrap(),
            "--membership-probe-timeout",
            "1s",
        ]);
        assert!(bad.membership_config().is_err());
        std::fs::remove_dir_all(&dir2).unwrap();
    }
}

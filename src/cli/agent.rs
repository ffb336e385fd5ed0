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
    #[arg(long, env = "BERTH_NODE_NAME")]
    node_name: String,

    /// Which Services to program: `full` replaces kube-proxy, `labeled` only takes Services
    /// labelled `service.kubernetes.io/service-proxy-name: berth`, `none` leaves iptables alone.
    #[arg(long, env = "BERTH_PROXY_MODE", value_enum, default_value_t = ProxyModeArg::Full)]
    proxy_mode: ProxyModeArg,

    /// How the entry chains find a Service: a tree keyed by address, or kube-proxy's linear list.
    #[arg(long, env = "BERTH_DISPATCH", value_enum, default_value_t = DispatchArg::Tree)]
    dispatch: DispatchArg,

    /// Pod CIDR(s), at most one per family, comma separated; traffic from outside them to a
    /// ClusterIP is masqueraded. Their families are the ones programmed (IPv4 when unset).
    #[arg(long, env = "BERTH_CLUSTER_CIDR", value_delimiter = ',')]
    cluster_cidr: Vec<berth_agent::IpNet>,

    /// Masquerade all traffic to ClusterIPs.
    #[arg(long, env = "BERTH_MASQUERADE_ALL")]
    masquerade_all: bool,

    /// Least time between two syncs (e.g. `1s`, `500ms`); faster changes are coalesced.
    #[arg(long, env = "BERTH_MIN_SYNC_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    min_sync_interval: Duration,

    /// Period of the full-consistency sync; `/healthz` fails after two without a success.
    #[arg(long, env = "BERTH_SYNC_PERIOD", default_value = "30s", value_parser = parse_duration)]
    sync_period: Duration,

    /// Address the health-check node-port servers bind.
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

    /// Kubeconfig to use; when unset, KUBECONFIG or ~/.kube/config, then in-cluster configuration.
    #[arg(long, env = "BERTH_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ProxyModeArg {
    Full,
    Labeled,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DispatchArg {
    Tree,
    Linear,
}

impl AgentArgs {
    fn to_options(&self) -> berth_agent::AgentOptions {
        berth_agent::AgentOptions {
            node_name: self.node_name.clone(),
            proxy_mode: match self.proxy_mode {
                ProxyModeArg::Full => berth_agent::ProxyMode::Full,
                ProxyModeArg::Labeled => berth_agent::ProxyMode::Labeled,
                ProxyModeArg::None => berth_agent::ProxyMode::None,
            },
            dispatch: match self.dispatch {
                DispatchArg::Tree => berth_agent::Dispatch::Tree,
                DispatchArg::Linear => berth_agent::Dispatch::Linear,
            },
            cluster_cidrs: self.cluster_cidr.clone(),
            masquerade_all: self.masquerade_all,
            min_sync_interval: self.min_sync_interval,
            sync_period: self.sync_period,
            healthz_bind_address: self.healthz_bind_address,
            admin_listen: self.admin_listen,
            l2_announcer: self.l2_announcer,
            l2_interfaces: self.l2_interfaces.clone(),
        }
    }
}

/// Programs the iptables of the network namespace it runs in; stopping leaves the rules in place.
pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    let config = args.to_options().validate()?;
    let admin_listen = config.admin_listen();
    let opts = berth_agent::RunOptions {
        config,
        version: env!("CARGO_PKG_VERSION").to_string(),
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
        assert_eq!(config.dispatch(), berth_agent::Dispatch::Tree);
        assert_eq!(config.sync_period(), Duration::from_secs(30));
        assert_eq!(config.min_sync_interval(), Duration::from_secs(1));
        assert_eq!(config.admin_listen(), "0.0.0.0:10356".parse().unwrap());
        assert_eq!(config.announcer(), None);
        assert!(parse(&["agent", "--node-name", "n", "--sync-period", "soon"]).is_err());
    }
}

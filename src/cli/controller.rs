//! `berth controller`: allocation, IPPool status, load balancers and (optionally) endpoints.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use berth_controller::{IpNet, PortRange};
use clap::{Args, ValueEnum};

use super::parse_duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
}

#[derive(Debug, Args)]
pub struct ControllerArgs {
    /// Kubeconfig to use; when unset, KUBECONFIG or ~/.kube/config, then in-cluster configuration.
    #[arg(long, env = "BERTH_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,

    /// Service CIDRs: one, or two of different families (the first is the default family).
    // Spelled out so that clap takes the comma-separated list as one value.
    #[arg(long, env = "BERTH_SERVICE_CIDR", default_value = "10.96.0.0/16", value_parser = parse_service_cidrs)]
    service_cidr: ::std::vec::Vec<IpNet>,

    /// Node port range, `first-last`.
    #[arg(long, env = "BERTH_NODE_PORT_RANGE", default_value = "30000-32767", value_parser = parse_node_port_range)]
    node_port_range: PortRange,

    /// Class served for LoadBalancer Services without `loadBalancerClass`: l2, aws-nlb or none.
    // Spelled out so that clap takes `none` as a value, not as a missing flag.
    #[arg(long, env = "BERTH_DEFAULT_CLASS", default_value = "l2", value_parser = parse_default_class)]
    default_class: ::std::option::Option<&'static str>,

    /// Maintain Endpoints and EndpointSlices (off when kube-controller-manager does it).
    #[arg(long, env = "BERTH_ENDPOINTS", value_enum, default_value_t = OnOff::Off)]
    endpoints: OnOff,

    /// Endpoints per EndpointSlice when `--endpoints on` (1-1000, as the API server allows).
    #[arg(long, env = "BERTH_MAX_ENDPOINTS_PER_SLICE", default_value_t = 100)]
    max_endpoints_per_slice: usize,

    /// Services whose Endpoints and EndpointSlices are synced at the same time when
    /// `--endpoints on` (kube-controller-manager's `--concurrent-service-endpoint-syncs`).
    #[arg(long, env = "BERTH_CONCURRENT_ENDPOINT_SYNCS", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=256))]
    concurrent_endpoint_syncs: u16,

    /// Elect one active replica through a Lease.
    #[arg(long, env = "BERTH_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,

    /// Name of the leader-election Lease.
    #[arg(long, env = "BERTH_LEASE_NAME", default_value = berth_api::names::lease::CONTROLLER)]
    lease_name: String,

    /// Namespace of the leader-election Lease.
    #[arg(long, env = "BERTH_LEASE_NAMESPACE", default_value = "kube-system")]
    lease_namespace: String,

    /// This replica's identity in the Lease; unset: the host name and process id.
    #[arg(long, env = "BERTH_IDENTITY")]
    identity: Option<String>,

    /// How long a leader's claim lasts after its last renewal, e.g. `15s`.
    #[arg(long, env = "BERTH_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    lease_duration: Duration,

    /// A leader that cannot renew for this long stops leading, e.g. `10s`.
    #[arg(long, env = "BERTH_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    renew_deadline: Duration,

    /// Time between attempts to acquire or renew the Lease, e.g. `2s`.
    #[arg(long, env = "BERTH_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    retry_period: Duration,

    /// How long a Service keeps a LoadBalancer address that left every IPPool before it is
    /// given one from the pools as they are: `never` (until the Service changes, as MetalLB)
    /// or a duration such as `10m` (`0s`: at once).
    #[arg(long, env = "BERTH_POOL_GONE_GRACE", default_value = "never", value_parser = parse_pool_gone_grace)]
    pool_gone_grace: ::std::option::Option<Duration>,

    /// Addresses no IPPool may hand out, besides the Nodes' addresses, their pod CIDRs and the
    /// service CIDRs, which never are: the LAN's gateway, DNS servers, a pod CIDR the Nodes do
    /// not show. Comma separated addresses, CIDRs and `a-b` ranges.
    #[arg(long, env = "BERTH_RESERVED_ADDRESSES", value_delimiter = ',', value_parser = parse_reserved_address)]
    reserved_addresses: Vec<berth_controller::AddressRange>,

    /// The agents' `--external-ip-cidrs`: external IPs outside them are reported on their
    /// Service (condition and Warning Event), as the agents leave them out.
    #[arg(long, env = "BERTH_EXTERNAL_IP_CIDRS", value_delimiter = ',')]
    external_ip_cidrs: Vec<IpNet>,

    #[command(flatten)]
    service_bounds: super::ServiceBoundsArgs,

    /// Address of the admin endpoint (`/healthz`, `/readyz`, `/metrics`).
    #[arg(long, env = "BERTH_ADMIN_LISTEN", default_value = "127.0.0.1:9090")]
    admin_listen: SocketAddr,

    /// Serve the `berth.dev/aws-nlb` class with AWS Network Load Balancers. Region and
    /// credentials come from the standard AWS chain (environment, web identity, instance role).
    #[arg(long, env = "BERTH_AWS_NLB", value_enum, default_value_t = OnOff::Off)]
    aws_nlb: OnOff,

    /// This cluster's name, tagged on every AWS resource berth makes (required with `--aws-nlb on`).
    #[arg(long, env = "BERTH_CLUSTER_NAME")]
    cluster_name: Option<String>,

    /// Subnet IDs for NLBs of Services without the `aws-load-balancer-subnets` annotation, comma separated.
    #[arg(long, env = "BERTH_AWS_SUBNETS", value_delimiter = ',')]
    aws_subnets: Vec<String>,

    /// ELBv2 endpoint instead of AWS's own (for tests against a local server).
    #[arg(long, env = "BERTH_AWS_ENDPOINT_URL")]
    aws_endpoint_url: Option<String>,

    /// How often everything tagged with this cluster is listed, to remove what belongs to deleted
    /// Services and find what was deleted behind berth's back, e.g. `10m`.
    #[arg(long, env = "BERTH_AWS_SWEEP_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    aws_sweep_interval: Duration,

    /// A Service whose load balancer converged is read from AWS again after this long, e.g. `10m`.
    #[arg(long, env = "BERTH_AWS_RESYNC_PERIOD", default_value = "10m", value_parser = parse_duration)]
    aws_resync_period: Duration,
}

fn parse_service_cidrs(text: &str) -> Result<Vec<IpNet>, String> {
    berth_controller::parse_service_cidrs(text).map_err(flag_error)
}

fn parse_node_port_range(text: &str) -> Result<PortRange, String> {
    berth_controller::parse_node_port_range(text).map_err(flag_error)
}

fn parse_pool_gone_grace(text: &str) -> Result<Option<Duration>, String> {
    berth_controller::parse_grace(text, parse_duration).map_err(flag_error)
}

fn parse_reserved_address(text: &str) -> Result<berth_controller::AddressRange, String> {
    let mut ranges = berth_controller::parse_reserved_addresses(text).map_err(flag_error)?;
    match (ranges.pop(), ranges.is_empty()) {
        (Some(range), true) => Ok(range),
        _ => Err(format!(
            "--reserved-addresses {text:?}: one address, CIDR or range"
        )),
    }
}

fn parse_default_class(text: &str) -> Result<Option<&'static str>, String> {
    berth_controller::parse_default_class(text).map_err(flag_error)
}

/// clap already says that the flag's value is invalid.
pub(super) fn flag_error(error: berth_controller::Error) -> String {
    match error {
        berth_controller::Error::InvalidConfig(reason) => reason,
        other => other.to_string(),
    }
}

impl ControllerArgs {
    fn to_options(&self) -> berth_controller::ControllerOptions {
        berth_controller::ControllerOptions {
            service_cidrs: self.service_cidr.clone(),
            node_port_range: self.node_port_range,
            default_class: self.default_class,
            endpoints: self.endpoints == OnOff::On,
            max_endpoints_per_slice: self.max_endpoints_per_slice,
            concurrent_endpoint_syncs: usize::from(self.concurrent_endpoint_syncs),
            leader_election: self.leader_election,
            lease_name: self.lease_name.clone(),
            lease_namespace: self.lease_namespace.clone(),
            identity: self.identity.clone().unwrap_or_else(default_identity),
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
            pool_gone_grace: self.pool_gone_grace,
            reserved_addresses: self.reserved_addresses.clone(),
            service_policy: berth_api::ServicePolicy {
                external_ip_cidrs: self.external_ip_cidrs.clone(),
                bounds: self.service_bounds.bounds(),
            },
        }
    }
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "berth-controller".to_string());
    format!("{host}-{}", std::process::id())
}

impl ControllerArgs {
    fn aws_settings(
        &self,
    ) -> anyhow::Result<Option<berth_controller::load_balancer::aws::AwsSettings>> {
        if self.aws_nlb == OnOff::Off {
            return Ok(None);
        }
        let cluster_name = self
            .cluster_name
            .clone()
            .filter(|n| !n.is_empty())
            .context(
            "--aws-nlb on needs --cluster-name: it marks which AWS resources are this cluster's",
        )?;
        if let Some(bad) = self.aws_subnets.iter().find(|s| !s.starts_with("subnet-")) {
            anyhow::bail!("--aws-subnets: {bad:?} is not a subnet ID (subnet-...)");
        }
        Ok(Some(berth_controller::load_balancer::aws::AwsSettings {
            cluster_name,
            subnets: self.aws_subnets.clone(),
            endpoint_url: self.aws_endpoint_url.clone(),
            sweep_interval: self.aws_sweep_interval,
            verify_after: self.aws_resync_period,
        }))
    }
}

pub fn run(args: ControllerArgs, log_drops: berth_telemetry::DroppedLines) -> anyhow::Result<()> {
    let config = args.to_options().validate()?;
    let opts = berth_controller::RunOptions {
        config,
        version: env!("CARGO_PKG_VERSION").to_string(),
        aws: args.aws_settings()?,
        log_drops: Some(log_drops),
    };
    super::run(|shutdown| async move {
        let client = super::build_client(args.kubeconfig.as_deref()).await?;
        let admin = super::bind_admin(args.admin_listen).await?;
        berth_controller::run_controller(client, admin, opts, shutdown)
            .await
            .context("running the controller")
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use crate::{parse, Cli, Command};

    fn controller_options(
        args: ControllerArgs,
    ) -> Result<berth_controller::ControllerConfig, berth_controller::Error> {
        args.to_options().validate()
    }

    #[test]
    fn controller_flags_become_options() {
        let cli = parse(&[
            "controller",
            "--service-cidr",
            "10.96.0.0/16,fd00::/108",
            "--node-port-range",
            "31000-31999",
            "--default-class",
            "none",
            "--lease-duration",
            "4s",
            "--renew-deadline",
            "3s",
            "--retry-period",
            "500ms",
            "--identity",
            "r1",
        ])
        .unwrap();
        let Command::Controller(args) = cli.command else {
            panic!("parsed {:?}", cli.command);
        };
        let config = controller_options(args).unwrap();
        assert_eq!(config.service_cidrs.len(), 2);
        assert_eq!(config.node_port_range.to_string(), "31000-31999");
        assert_eq!(config.default_class, None);
        let lease = config.lease.unwrap();
        assert_eq!(lease.identity, "r1");
        assert_eq!(lease.retry_period, Duration::from_millis(500));
        for bad in [
            vec!["controller", "--default-class", "metallb"],
            vec!["controller", "--service-cidr", "nonsense"],
            vec!["controller", "--renew-deadline", "20s"],
            vec![
                "controller",
                "--endpoints",
                "on",
                "--max-endpoints-per-slice",
                "0",
            ],
        ] {
            // Bad single values are refused while parsing, bad combinations by `validate()`.
            let Ok(cli) = parse(&bad) else { continue };
            let Command::Controller(args) = cli.command else {
                panic!("not a controller command");
            };
            assert!(controller_options(args).is_err(), "{bad:?}");
        }
        assert!(parse(&["controller", "--lease-duration", "soon"]).is_err());
        let Command::Controller(args) = parse(&["controller", "--leader-election", "false"])
            .unwrap()
            .command
        else {
            panic!("not a controller command");
        };
        assert!(controller_options(args).unwrap().lease.is_none());
        let Command::Controller(args) =
            parse(&["controller", "--endpoints", "on"]).unwrap().command
        else {
            panic!("not a controller command");
        };
        assert!(controller_options(args).unwrap().endpoints.is_some());
        let Command::Controller(args) = parse(&[
            "controller",
            "--endpoints",
            "on",
            "--concurrent-endpoint-syncs",
            "32",
        ])
        .unwrap()
        .command
        else {
            panic!("not a controller command");
        };
        let endpoints = controller_options(args).unwrap().endpoints.unwrap();
        assert_eq!(endpoints.workers, 32);
        assert!(parse(&["controller", "--concurrent-endpoint-syncs", "0"]).is_err());
    }

    #[test]
    fn bad_single_values_are_refused_with_the_flag_named() {
        for (flag, value) in [
            ("--default-class", "metallb"),
            ("--service-cidr", "nonsense"),
            ("--service-cidr", "10.96.0.0/16,10.97.0.0/16"),
            ("--node-port-range", "32767-30000"),
        ] {
            let err = parse(&["controller", flag, value]).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
            assert!(err.to_string().contains(flag), "{err}");
        }
    }

    #[test]
    fn controller_help_documents_every_flag_the_chart_maps() {
        let mut cmd = Cli::command();
        cmd.build();
        let help = cmd
            .find_subcommand_mut("controller")
            .unwrap()
            .render_long_help()
            .to_string();
        for flag in [
            "--kubeconfig",
            "--service-cidr",
            "--node-port-range",
            "--default-class",
            "--endpoints",
            "--max-endpoints-per-slice",
            "--concurrent-endpoint-syncs",
            "--leader-election",
            "--lease-name",
            "--lease-namespace",
            "--lease-duration",
            "--renew-deadline",
            "--retry-period",
            "--admin-listen",
            "--log-format",
            "--log-level",
        ] {
            assert!(
                help.contains(flag),
                "`berth controller --help` lacks {flag}"
            );
            let env = format!("BERTH_{}", flag[2..].replace('-', "_").to_uppercase());
            assert!(help.contains(&env), "`berth controller --help` lacks {env}");
        }
    }
}

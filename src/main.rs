//! The `berth` binary: parses flags (each also readable from a `BERTH_*` variable), sets up
//! telemetry and hands over to the crates. Wiring only; the logic lives in `crates/`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use berth_telemetry::{resolve_log_filter, LogConfig, LogFormat};
use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "berth",
    version,
    about = "Kubernetes service networking: ClusterIPs, NodePorts, LoadBalancers and the node datapath"
)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Args)]
struct LogArgs {
    /// Log line format.
    #[arg(
        long,
        global = true,
        env = "BERTH_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormatArg::Text
    )]
    log_format: LogFormatArg,

    /// Log filter, e.g. `info` or `warn,berth_controller=debug`. When unset, RUST_LOG is used,
    /// then `info`.
    #[arg(long, global = true, env = "BERTH_LOG_LEVEL")]
    log_level: Option<String>,
}

impl LogArgs {
    fn to_config(&self, rust_log: Option<&str>) -> LogConfig {
        LogConfig {
            format: self.log_format.into(),
            filter: resolve_log_filter(self.log_level.as_deref(), rust_log),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormatArg {
    Text,
    Json,
}

impl From<LogFormatArg> for LogFormat {
    fn from(arg: LogFormatArg) -> Self {
        match arg {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        }
    }
}

// `agent` joins this enum as its crate lands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Allocate ClusterIPs, NodePorts and LoadBalancer IPs, keep IPPool status, and serve
    /// LoadBalancer Services of berth's classes (leader-elected; run several replicas).
    Controller(ControllerArgs),
    /// Print the CustomResourceDefinitions berth installs, as one multi-document YAML stream.
    Crds,
    /// Print the version of this binary.
    Version,
    /// The lab: berth on one Linux host, for tests and demos (never for production).
    #[command(subcommand)]
    Lab(LabCommand),
}

#[derive(Debug, Subcommand)]
enum LabCommand {
    /// Serve the in-memory Kubernetes API server until interrupted.
    Apiserver(ApiserverArgs),
}

#[derive(Debug, Args)]
struct ApiserverArgs {
    /// Address to serve plain HTTP on; repeat for several. Port 0 picks a free port. Only loopback
    /// addresses are accepted here: the lab reaches its namespaces through pre-bound sockets.
    #[arg(
        long,
        env = "BERTH_LAB_LISTEN",
        value_delimiter = ',',
        default_value = "127.0.0.1:0"
    )]
    listen: Vec<SocketAddr>,

    /// `NAME=ADDRESS`: also serve inside the named network namespace (one made by the lab, e.g. its
    /// control-plane namespace on the LAN), so agents in node namespaces reach the same server.
    /// Repeatable.
    #[arg(long, env = "BERTH_LAB_LISTEN_NETNS", value_delimiter = ',', value_parser = parse_netns_listen)]
    listen_netns: Vec<(String, SocketAddr)>,

    /// Write a kubeconfig for the first address to this file.
    #[arg(long, env = "BERTH_LAB_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,

    /// Fault injection as JSON, e.g. `{"errorRate":0.1,"watchDropRate":0.05,"seed":7}`; also
    /// changeable at run time through `PUT /lab/faults`.
    #[arg(long, env = "BERTH_LAB_FAULTS", value_parser = parse_faults)]
    faults: Option<berth_lab::Faults>,

    /// Changes kept for resuming watches; older resourceVersions get 410 Gone.
    #[arg(long, env = "BERTH_LAB_HISTORY")]
    history: Option<usize>,

    /// Keep deleted pods that run on a node until deleted again with grace period 0, as a kubelet
    /// would.
    #[arg(long, env = "BERTH_LAB_GRACEFUL_POD_DELETION")]
    graceful_pod_deletion: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
}

#[derive(Debug, Args)]
struct ControllerArgs {
    /// Kubeconfig file; unset: in-cluster configuration, then the usual kubeconfig lookup.
    #[arg(long, env = "BERTH_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,

    /// Service CIDRs: one, or two of different families (the first is the default family).
    #[arg(long, env = "BERTH_SERVICE_CIDR", default_value = "10.96.0.0/16")]
    service_cidr: String,

    /// Node port range, `first-last`.
    #[arg(long, env = "BERTH_NODE_PORT_RANGE", default_value = "30000-32767")]
    node_port_range: String,

    /// Class served for LoadBalancer Services without `loadBalancerClass`: l2, aws-nlb or none.
    #[arg(long, env = "BERTH_DEFAULT_CLASS", default_value = "l2")]
    default_class: String,

    /// Maintain Endpoints and EndpointSlices (off when kube-controller-manager does it).
    #[arg(long, env = "BERTH_ENDPOINTS", value_enum, default_value_t = OnOff::Off)]
    endpoints: OnOff,

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

    /// Address of the admin endpoint (`/healthz`, `/readyz`, `/metrics`).
    #[arg(long, env = "BERTH_ADMIN_LISTEN", default_value = "127.0.0.1:9090")]
    admin_listen: SocketAddr,
}

/// `500ms`, `2s`, `1m`; a bare number is seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    let value: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{text:?}: expected a duration such as 500ms, 2s or 1m"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("{text:?}: must be a non-negative duration"));
    }
    Ok(Duration::from_secs_f64(value * scale))
}

fn controller_options(args: ControllerArgs) -> anyhow::Result<berth_controller::RunOptions> {
    if args.endpoints == OnOff::On {
        anyhow::bail!("--endpoints on: the endpoints controller is not part of this build");
    }
    let mut config = berth_controller::ControllerConfig::new(
        berth_controller::parse_service_cidrs(&args.service_cidr)?,
    );
    config.node_port_range = args
        .node_port_range
        .parse()
        .map_err(|e| anyhow::anyhow!("--node-port-range: {e}"))?;
    config.default_class = berth_controller::parse_default_class(&args.default_class)?;
    let identity = args.identity.unwrap_or_else(default_identity);
    config.instance = identity.clone();
    if args.leader_election {
        let mut lease = berth_controller::LeaseConfig::new(args.lease_namespace, identity);
        lease.name = args.lease_name;
        lease.lease_duration = args.lease_duration;
        lease.renew_deadline = args.renew_deadline;
        lease.retry_period = args.retry_period;
        lease.validate()?;
        config.lease = Some(lease);
    }
    Ok(berth_controller::RunOptions {
        kubeconfig: args.kubeconfig,
        config,
        admin_listen: args.admin_listen,
        version: env!("CARGO_PKG_VERSION").to_string(),
    })
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

fn run_controller(args: ControllerArgs) -> anyhow::Result<()> {
    let opts = controller_options(args)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        let token = berth_controller::CancellationToken::new();
        let stop = token.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            stop.cancel();
        });
        berth_controller::run_controller(opts, token)
            .await
            .context("running the controller")
    })
}

fn parse_faults(json: &str) -> Result<berth_lab::Faults, String> {
    serde_json::from_str(json).map_err(|e| format!("invalid fault settings: {e}"))
}

fn parse_netns_listen(spec: &str) -> Result<(String, SocketAddr), String> {
    let (name, addr) = spec
        .split_once('=')
        .ok_or_else(|| format!("{spec:?}: expected NAME=ADDRESS"))?;
    let addr = addr
        .parse()
        .map_err(|e| format!("{spec:?}: invalid address: {e}"))?;
    berth_lab::netns::netns_path(name).map_err(|e| e.to_string())?;
    Ok((name.to_string(), addr))
}

fn check_loopback(addrs: &[SocketAddr]) -> anyhow::Result<()> {
    match addrs.iter().find(|a| !a.ip().is_loopback()) {
        Some(a) => {
            anyhow::bail!("--listen {a}: the lab API server listens on loopback addresses only")
        }
        None => Ok(()),
    }
}

fn run_lab_apiserver(args: ApiserverArgs) -> anyhow::Result<()> {
    check_loopback(&args.listen)?;
    let opts = berth_lab::ApiServerOptions {
        listeners: args
            .listen
            .into_iter()
            .map(berth_lab::Listener::Addr)
            .collect(),
        kubeconfig: args.kubeconfig,
        faults: args.faults.unwrap_or_default(),
        history_capacity: args.history,
        graceful_pod_deletion: args.graceful_pod_deletion,
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime
        .block_on(berth_lab::run_apiserver(opts, shutdown_signal()))
        .context("running the lab API server")
}

/// Resolves on SIGINT or SIGTERM, so both Ctrl-C and `kill` stop servers cleanly.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rust_log = std::env::var("RUST_LOG").ok();
    berth_telemetry::init_tracing(&cli.log.to_config(rust_log.as_deref()))
        .context("setting up logging")?;

    match cli.command {
        Command::Crds => {
            let yaml = berth_api::crds_yaml().context("rendering the CRDs")?;
            write_stdout(&yaml)
        }
        Command::Version => write_stdout(&version_line()),
        Command::Lab(LabCommand::Apiserver(args)) => run_lab_apiserver(args),
        Command::Controller(args) => run_controller(args),
    }
}

fn version_line() -> String {
    format!("berth {}\n", env!("CARGO_PKG_VERSION"))
}

/// Writes without `println!`, whose panic on a closed pipe (`berth crds | head`) would be a crash
/// report instead of an error.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing to stdout")
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("berth").chain(args.iter().copied()))
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_flag_can_come_from_a_berth_variable() {
        fn check(cmd: &clap::Command, path: &str) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
                assert!(
                    env.as_deref().is_some_and(|e| e.starts_with("BERTH_")),
                    "{path} --{id} has no BERTH_* variable (has {env:?})"
                );
            }
            for sub in cmd.get_subcommands() {
                check(sub, &format!("{path} {}", sub.get_name()));
            }
        }
        check(&Cli::command(), "berth");
    }

    #[test]
    fn defaults_are_text_and_no_explicit_level() {
        let cli = parse(&["version"]).unwrap();
        assert_eq!(cli.log.log_format, LogFormatArg::Text);
        assert_eq!(cli.log.to_config(None), LogConfig::default());
    }

    #[test]
    fn log_flags_are_global() {
        let cli = parse(&["crds", "--log-format", "json", "--log-level", "debug"]).unwrap();
        assert!(matches!(cli.command, Command::Crds));
        let config = cli.log.to_config(Some("warn"));
        assert_eq!(config.format, LogFormat::Json);
        assert_eq!(config.filter, "debug");
    }

    #[test]
    fn rust_log_applies_without_a_level_flag() {
        let cli = parse(&["version"]).unwrap();
        assert_eq!(
            cli.log.to_config(Some("warn,kube=debug")).filter,
            "warn,kube=debug"
        );
    }

    #[test]
    fn unknown_log_format_is_a_usage_error() {
        let err = parse(&["--log-format", "logfmt", "version"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
    }

    #[test]
    fn a_subcommand_is_required() {
        assert!(parse(&[]).is_err());
        assert!(parse(&["nonsense"]).is_err());
    }

    #[test]
    fn lab_apiserver_flags() {
        let cli = parse(&[
            "lab",
            "apiserver",
            "--listen",
            "127.0.0.1:0,[::1]:6443",
            "--faults",
            r#"{"errorRate":0.1,"seed":3}"#,
        ])
        .unwrap();
        let Command::Lab(LabCommand::Apiserver(args)) = cli.command else {
            panic!("parsed {:?}", cli.command);
        };
        assert_eq!(args.listen.len(), 2);
        check_loopback(&args.listen).unwrap();
        let faults = args.faults.unwrap();
        assert_eq!((faults.error_rate, faults.seed), (0.1, 3));
        assert!(parse(&["lab", "apiserver", "--faults", "{oops"]).is_err());
    }

    #[test]
    fn lab_apiserver_netns_listeners() {
        let cli = parse(&[
            "lab",
            "apiserver",
            "--listen-netns",
            "berth-lab-cp=198.18.0.2:6443",
        ])
        .unwrap();
        let Command::Lab(LabCommand::Apiserver(args)) = cli.command else {
            panic!("parsed {:?}", cli.command);
        };
        assert_eq!(
            args.listen_netns,
            vec![(
                "berth-lab-cp".to_string(),
                "198.18.0.2:6443".parse().unwrap()
            )]
        );
        for bad in ["no-equals", "ns=notanaddress", "../x=127.0.0.1:1"] {
            assert!(
                parse(&["lab", "apiserver", "--listen-netns", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn lab_apiserver_refuses_non_loopback_addresses() {
        let cli = parse(&["lab", "apiserver", "--listen", "198.18.0.1:6443"]).unwrap();
        let Command::Lab(LabCommand::Apiserver(args)) = cli.command else {
            panic!("parsed {:?}", cli.command);
        };
        let err = check_loopback(&args.listen).unwrap_err();
        assert!(err.to_string().contains("loopback"), "{err}");
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
        let opts = controller_options(args).unwrap();
        assert_eq!(opts.config.service_cidrs.len(), 2);
        assert_eq!(opts.config.node_port_range.to_string(), "31000-31999");
        assert_eq!(opts.config.default_class, None);
        let lease = opts.config.lease.unwrap();
        assert_eq!(lease.identity, "r1");
        assert_eq!(lease.retry_period, Duration::from_millis(500));
        for bad in [
            vec!["controller", "--default-class", "metallb"],
            vec!["controller", "--service-cidr", "nonsense"],
            vec!["controller", "--renew-deadline", "20s"],
            vec!["controller", "--endpoints", "on"],
        ] {
            let Command::Controller(args) = parse(&bad).unwrap().command else {
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
        assert!(controller_options(args).unwrap().config.lease.is_none());
    }

    #[test]
    fn version_line_names_the_package_version() {
        assert_eq!(
            version_line(),
            format!("berth {}\n", env!("CARGO_PKG_VERSION"))
        );
    }
}

//! The `berth` binary: parses flags (each also readable from a `BERTH_*` variable), sets up
//! telemetry and hands over to the crates. Wiring only; the logic lives in `crates/`.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
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

#[derive(Debug, Subcommand)]
enum Command {
    /// The node agent: programs this node's datapath (iptables) and serves health-check node ports.
    Agent(AgentArgs),
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

#[derive(Debug, Args)]
struct AgentArgs {
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

/// One duration syntax for every flag: `500ms`, `2s`, `1m`, `1h`; a bare number is seconds.
fn parse_duration(value: &str) -> Result<Duration, String> {
    berth_agent::parse_duration(value).map_err(|e| e.to_string())
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
        }
    }
}

/// Programs the iptables of the network namespace it runs in; stopping leaves the rules in place.
fn run_agent(args: AgentArgs) -> anyhow::Result<()> {
    let config = args.to_options().validate()?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        let client = build_client(args.kubeconfig.as_deref()).await?;
        let mut registry = berth_telemetry::MetricsRegistry::new();
        registry.register_build_info(env!("CARGO_PKG_VERSION"));
        let readiness = berth_telemetry::Readiness::new();
        let admin_listen = config.admin_listen();
        let agent = berth_agent::Agent::new(
            config,
            client,
            berth_agent::CommandIptables::new,
            berth_agent::CommandConntrack::new(),
            &mut registry,
            &readiness,
        )?;
        let admin = tokio::net::TcpListener::bind(admin_listen)
            .await
            .with_context(|| format!("binding the admin endpoint on {admin_listen}"))?;
        agent
            .run(admin, registry.into_shared(), shutdown_signal())
            .await
            .context("running the agent")
    })
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
    /// Kubeconfig to use; when unset, KUBECONFIG or ~/.kube/config, then in-cluster configuration.
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

    /// Address of the admin endpoint (`/healthz`, `/readyz`, `/metrics`).
    #[arg(long, env = "BERTH_ADMIN_LISTEN", default_value = "127.0.0.1:9090")]
    admin_listen: SocketAddr,
}

fn controller_options(args: ControllerArgs) -> anyhow::Result<berth_controller::RunOptions> {
    let mut config = berth_controller::ControllerConfig::new(
        berth_controller::parse_service_cidrs(&args.service_cidr)?,
    );
    config.node_port_range = args
        .node_port_range
        .parse()
        .map_err(|e| anyhow::anyhow!("--node-port-range: {e}"))?;
    config.default_class = berth_controller::parse_default_class(&args.default_class)?;
    if args.endpoints == OnOff::On {
        let slices = berth_endpoints::SliceConfig::new(args.max_endpoints_per_slice)
            .map_err(|e| anyhow::anyhow!("--max-endpoints-per-slice: {e}"))?;
        config.endpoints = Some(berth_controller::endpoints::EndpointsConfig {
            slices,
            workers: usize::from(args.concurrent_endpoint_syncs),
            ..Default::default()
        });
    }
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
    let kubeconfig = args.kubeconfig.clone();
    let opts = controller_options(args)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        let client = build_client(kubeconfig.as_deref()).await?;
        let token = berth_controller::CancellationToken::new();
        let stop = token.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            stop.cancel();
        });
        berth_controller::run_controller(client, opts, token)
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

/// The client for `--kubeconfig`; without one, the usual lookup (`KUBECONFIG`,
/// `~/.kube/config`), then the in-cluster service account. One function for every command
/// that talks to a cluster.
async fn build_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading the kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no Kubernetes client configuration found (in-cluster or kubeconfig)")?,
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
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

/// glibc gives every thread that allocates its own heap arena (up to 8 per core), and memory freed
/// in one arena is not reused by another. berth's long-running commands use a handful of threads
/// for one shared cache, so two arenas keep peak RSS lower at no measurable cost in throughput
/// (`make bench-controller`). `MALLOC_ARENA_MAX` in the environment still wins.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn limit_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    // SAFETY: mallopt takes two integers and touches only the allocator's own settings; it is
    // called before any other thread exists.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_malloc_arenas() {}

fn main() -> anyhow::Result<()> {
    limit_malloc_arenas();
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
        Command::Agent(args) => run_agent(args),
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
        assert!(parse(&["agent", "--node-name", "n", "--sync-period", "soon"]).is_err());
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
            vec![
                "controller",
                "--endpoints",
                "on",
                "--max-endpoints-per-slice",
                "0",
            ],
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
        let Command::Controller(args) =
            parse(&["controller", "--endpoints", "on"]).unwrap().command
        else {
            panic!("not a controller command");
        };
        assert!(controller_options(args).unwrap().config.endpoints.is_some());
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
        let endpoints = controller_options(args).unwrap().config.endpoints.unwrap();
        assert_eq!(endpoints.workers, 32);
        assert!(parse(&["controller", "--concurrent-endpoint-syncs", "0"]).is_err());
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

    #[test]
    fn version_line_names_the_package_version() {
        assert_eq!(
            version_line(),
            format!("berth {}\n", env!("CARGO_PKG_VERSION"))
        );
    }
}

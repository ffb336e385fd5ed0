//! `berth lab`: berth on one Linux host, for tests and demos.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum LabCommand {
    /// Serve the in-memory Kubernetes API server until interrupted.
    Apiserver(ApiserverArgs),
    /// Build a lab (API server, controller, an agent per node, kubelet, client), apply manifests,
    /// prove from the client that the Services answer, and stay up until interrupted.
    Up(UpArgs),
    /// Stop a lab and remove all of it, also after `lab up` was killed.
    Down(LabRef),
    /// Show a lab's processes and namespaces.
    Status(LabRef),
    /// The lab kubelet: Node objects for the lab's nodes, Pods as pod namespaces.
    Kubelet(KubeletArgs),
    /// The lab's controller-manager: Deployments, ReplicaSets and their garbage collection.
    ControllerManager(ControllerManagerArgs),
}

#[derive(Debug, Args)]
pub struct ControllerManagerArgs {
    /// Kubeconfig of the lab's API server.
    #[arg(long, env = "BERTH_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
}

/// Which lab: its name (namespaces `berth-<name>-*`) and state directory.
#[derive(Debug, Args)]
pub struct LabRef {
    /// The lab's name; its namespaces are `berth-<name>-*`.
    #[arg(long, env = "BERTH_LAB_NAME", default_value = "lab")]
    name: String,

    /// Where the lab keeps its kubeconfig, logs and process ids.
    #[arg(long, env = "BERTH_LAB_STATE_DIR", default_value = "/run/berth-lab")]
    state_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct UpArgs {
    #[command(flatten)]
    lab: LabRef,

    /// Number of node namespaces, each running `berth agent`.
    #[arg(long, env = "BERTH_LAB_NODES", default_value_t = 3)]
    nodes: usize,

    /// The cluster's address families: `dual` (Nodes, Pods, Service CIDRs and rules of both
    /// families, IPv4 primary), `ipv4`, or `ipv6` (an IPv6-only cluster whose namespaces keep an
    /// IPv4 LAN address too).
    #[arg(long, env = "BERTH_LAB_IP_FAMILY", value_enum, default_value_t = IpFamilyArg::Dual)]
    ip_family: IpFamilyArg,

    /// Manifests to apply once the lab is up (every .yaml file of the directory; with `--bgp`,
    /// those of its subdirectory `bgp` too).
    #[arg(long, env = "BERTH_LAB_APPLY")]
    apply: Option<PathBuf>,

    /// Add a BGP router on the LAN (FRR, peering with every node) with a client behind it, run
    /// FRR on every node and make the agents BGP speakers; the proof reaches BGP-announced
    /// addresses from the client behind the router. Needs FRR (Debian packages frr and
    /// frr-pythontools).
    #[arg(long, env = "BERTH_LAB_BGP")]
    bgp: bool,

    /// Prove, print the summary and tear the lab down instead of staying up.
    #[arg(long, env = "BERTH_LAB_ONCE")]
    once: bool,

    /// How long each step may wait (components ready, addresses, answers).
    #[arg(long, env = "BERTH_LAB_TIMEOUT", default_value = "90s", value_parser = super::parse_duration)]
    timeout: std::time::Duration,
}

/// `--ip-family`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IpFamilyArg {
    Ipv4,
    Ipv6,
    Dual,
}

impl From<IpFamilyArg> for berth_lab::cluster::plan::LabFamilies {
    fn from(arg: IpFamilyArg) -> Self {
        use berth_lab::cluster::plan::LabFamilies;
        match arg {
            IpFamilyArg::Ipv4 => LabFamilies::Ipv4,
            IpFamilyArg::Ipv6 => LabFamilies::Ipv6,
            IpFamilyArg::Dual => LabFamilies::Dual,
        }
    }
}

#[derive(Debug, Args)]
pub struct KubeletArgs {
    /// The lab's name (its namespaces are `berth-<name>-*`).
    #[arg(long, env = "BERTH_LAB_NAME", default_value = "lab")]
    name: String,

    /// Number of the lab's nodes.
    #[arg(long, env = "BERTH_LAB_NODES", default_value_t = 3)]
    nodes: usize,

    /// The cluster's address families, as given to `lab up`.
    #[arg(long, env = "BERTH_LAB_IP_FAMILY", value_enum, default_value_t = IpFamilyArg::Ipv4)]
    ip_family: IpFamilyArg,

    /// Kubeconfig of the lab's API server.
    #[arg(long, env = "BERTH_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ApiserverArgs {
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

    /// Record what each client asks of the API (verb, group, resource, subresource per bearer
    /// token or user agent), served at `GET /lab/requests`.
    #[arg(long, env = "BERTH_LAB_RECORD_REQUESTS")]
    record_requests: bool,

    /// The cluster's Service CIDRs, one per family, primary first (kube-apiserver's flag): the
    /// server starts with the default ServiceCIDR `kubernetes` holding them. None: no ServiceCIDR.
    #[arg(
        long,
        env = "BERTH_LAB_SERVICE_CLUSTER_IP_RANGE",
        value_delimiter = ','
    )]
    service_cluster_ip_range: Vec<berth_controller::IpNet>,
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

/// The API server's settings, checked: its options, and the listeners still to be bound inside
/// their network namespaces.
#[derive(Debug)]
struct ApiserverConfig {
    options: berth_lab::ApiServerOptions,
    netns_listeners: Vec<(String, SocketAddr)>,
}

impl ApiserverArgs {
    fn validate(self) -> anyhow::Result<ApiserverConfig> {
        check_loopback(&self.listen)?;
        Ok(ApiserverConfig {
            options: berth_lab::ApiServerOptions {
                listeners: self
                    .listen
                    .into_iter()
                    .map(berth_lab::Listener::Addr)
                    .collect(),
                kubeconfig: self.kubeconfig,
                faults: self.faults.unwrap_or_default(),
                history_capacity: self.history,
                graceful_pod_deletion: self.graceful_pod_deletion,
                record_requests: self.record_requests,
                // The first namespace listener is the control plane's LAN address: the one
                // agents and pods reach the server at.
                kubernetes_endpoint: self.listen_netns.first().map(|(_, addr)| *addr),
                service_cidrs: self
                    .service_cluster_ip_range
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
            },
            netns_listeners: self.listen_netns,
        })
    }
}

pub fn run(command: LabCommand) -> anyhow::Result<()> {
    match command {
        LabCommand::Apiserver(args) => run_apiserver(args),
        LabCommand::Up(args) => run_up(args),
        LabCommand::Down(lab) => {
            let removed = berth_lab::cluster::down(&lab.name, &lab.state_dir)?;
            let mut out = String::new();
            if removed.is_empty() {
                out.push_str(&format!("lab {}: nothing to remove\n", lab.name));
            }
            for line in removed {
                out.push_str(&format!("removed {line}\n"));
            }
            crate::write_stdout(&out)
        }
        LabCommand::Status(lab) => {
            let lines = berth_lab::cluster::status(&lab.name, &lab.state_dir)?;
            crate::write_stdout(&(lines.join("\n") + "\n"))
        }
        LabCommand::Kubelet(args) => run_kubelet(args),
        LabCommand::ControllerManager(args) => run_controller_manager(args),
    }
}

/// Steps shown with spinners on a terminal; nothing without one.
struct Steps {
    bar: indicatif::ProgressBar,
}

impl Steps {
    fn new() -> Self {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        Steps { bar }
    }
}

impl berth_lab::cluster::Progress for Steps {
    fn start(&self, step: &str) {
        self.bar.reset_elapsed();
        self.bar.set_message(step.to_string());
        self.bar
            .enable_steady_tick(std::time::Duration::from_millis(100));
    }

    fn done(&self, detail: &str) {
        let step = self.bar.message();
        // Printed above the spinner, and only on a terminal (indicatif hides itself otherwise).
        self.bar.println(format!("✓ {step}: {detail}"));
        self.bar.set_message(String::new());
    }
}

fn run_up(args: UpArgs) -> anyhow::Result<()> {
    let opts = berth_lab::cluster::UpOptions {
        name: args.lab.name.clone(),
        nodes: args.nodes,
        families: args.ip_family.into(),
        state_dir: args.lab.state_dir.clone(),
        exe: std::env::current_exe().context("finding the berth binary")?,
        timeout: args.timeout,
        bgp: args.bgp,
    };
    super::run(|shutdown| async move {
        let steps = Steps::new();
        let lab = tokio::select! {
            lab = berth_lab::cluster::Lab::start(&opts, &steps) => lab?,
            _ = shutdown.cancelled() => anyhow::bail!("interrupted while starting; the lab was removed"),
        };
        let mut proven = true;
        if let Some(dir) = &args.apply {
            use berth_lab::cluster::Progress;
            steps.start(&format!("applying {}", dir.display()));
            let mut applied = lab.apply(dir).await?;
            let bgp_dir = dir.join("bgp");
            if args.bgp && bgp_dir.is_dir() {
                applied.extend(lab.apply(&bgp_dir).await?);
            }
            steps.done(&applied.join(", "));
            let (table, ok) = tokio::select! {
                result = lab.prove(&steps) => result?,
                _ = shutdown.cancelled() => anyhow::bail!("interrupted; the lab was removed"),
            };
            steps.bar.finish_and_clear();
            println!("\n{table}");
            proven = ok;
        }
        steps.bar.finish_and_clear();
        println!(
            "the lab \"{}\" is up: export KUBECONFIG={}  (logs in {})",
            opts.name,
            lab.kubeconfig().display(),
            lab.state_dir().join("logs").display()
        );
        if !args.once {
            println!("press Ctrl-C to stop it and remove everything");
            shutdown.cancelled().await;
        }
        println!("tearing the lab down");
        if !proven {
            println!(
                "keeping the logs in {}",
                lab.state_dir().join("logs").display()
            );
        }
        tokio::task::spawn_blocking(move || lab.stop(!proven))
            .await
            .context("tearing the lab down")??;
        anyhow::ensure!(
            proven,
            "some requests were not answered (see the table above)"
        );
        Ok(())
    })
}

fn run_kubelet(args: KubeletArgs) -> anyhow::Result<()> {
    let prefix = berth_lab::cluster::plan::lab_prefix(&args.name)?;
    let families = args.ip_family.into();
    let layout = berth_lab::topology::layout(&berth_lab::cluster::plan::lab_topology_for(
        &prefix, args.nodes, families,
    )?)?;
    let config = berth_lab::kubelet::KubeletConfig::new(layout).with_families(families);
    super::run(|shutdown| async move {
        let client = super::build_client(args.kubeconfig.as_deref()).await?;
        berth_lab::kubelet::Kubelet::new(client, config)
            .run(shutdown)
            .await
            .context("running the lab kubelet")
    })
}

fn run_controller_manager(args: ControllerManagerArgs) -> anyhow::Result<()> {
    super::run(|shutdown| async move {
        let client = super::build_client(args.kubeconfig.as_deref()).await?;
        berth_lab::workloads::Workloads::new(
            client,
            berth_lab::workloads::WorkloadsConfig::default(),
        )
        .run(shutdown)
        .await
        .context("running the lab controller-manager")
    })
}

fn run_apiserver(args: ApiserverArgs) -> anyhow::Result<()> {
    let ApiserverConfig {
        mut options,
        netns_listeners,
    } = args.validate()?;
    // Bound before the server starts, from a thread that enters the namespace, so the socket
    // lives there while the server's own threads never leave theirs.
    for (netns, addr) in netns_listeners {
        let listener = berth_lab::netns::bind_tcp_in_netns(&netns, addr)
            .with_context(|| format!("--listen-netns {netns}={addr}"))?;
        options.listeners.push(berth_lab::Listener::Bound(listener));
    }
    super::run(|shutdown| async move {
        berth_lab::run_apiserver(options, shutdown.cancelled_owned())
            .await
            .context("running the lab API server")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse, Command};

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
    fn lab_apiserver_service_cluster_ip_range_becomes_the_default_service_cidr() {
        let cli = parse(&[
            "lab",
            "apiserver",
            "--service-cluster-ip-range",
            "10.96.0.0/16,fd00:96::/112",
        ])
        .unwrap();
        let Command::Lab(LabCommand::Apiserver(args)) = cli.command else {
            panic!("parsed {:?}", cli.command);
        };
        let config = args.validate().unwrap();
        assert_eq!(
            config.options.service_cidrs,
            ["10.96.0.0/16", "fd00:96::/112"]
        );
        assert!(parse(&[
            "lab",
            "apiserver",
            "--service-cluster-ip-range",
            "10.96.0.0"
        ])
        .is_err());
    }

    #[test]
    fn lab_up_is_dual_stack_unless_told_otherwise() {
        use berth_lab::cluster::plan::LabFamilies;
        let families = |argv: &[&str]| match parse(argv).unwrap().command {
            Command::Lab(LabCommand::Up(args)) => LabFamilies::from(args.ip_family),
            Command::Lab(LabCommand::Kubelet(args)) => LabFamilies::from(args.ip_family),
            other => panic!("parsed {other:?}"),
        };
        assert_eq!(families(&["lab", "up"]), LabFamilies::Dual);
        assert_eq!(
            families(&["lab", "up", "--ip-family", "ipv6"]),
            LabFamilies::Ipv6
        );
        // The kubelet is told by `up`; alone it keeps the IPv4 default of its callers.
        assert_eq!(families(&["lab", "kubelet"]), LabFamilies::Ipv4);
        assert_eq!(
            families(&["lab", "kubelet", "--ip-family", "dual"]),
            LabFamilies::Dual
        );
        assert!(parse(&["lab", "up", "--ip-family", "IPv6"]).is_err());
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
    fn netns_listeners_are_kept_for_binding() {
        let cli = parse(&[
            "lab",
            "apiserver",
            "--listen-netns",
            "berth-lab-cp=198.18.0.2:6443,berth-lab-n1=198.18.0.11:6443",
        ])
        .unwrap();
        let Command::Lab(LabCommand::Apiserver(args)) = cli.command else {
            panic!("parsed {:?}", cli.command);
        };
        let config = args.validate().unwrap();
        assert_eq!(config.options.listeners.len(), 1, "the loopback default");
        let names: Vec<&str> = config
            .netns_listeners
            .iter()
            .map(|(name, _)| name.as_str())
            .collect();
        assert_eq!(names, ["berth-lab-cp", "berth-lab-n1"]);
    }
}

//! `berth lab`: berth on one Linux host, for tests and demos.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum LabCommand {
    /// Serve the in-memory Kubernetes API server until interrupted.
    Apiserver(ApiserverArgs),
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
            },
            netns_listeners: self.listen_netns,
        })
    }
}

pub fn run(command: LabCommand) -> anyhow::Result<()> {
    match command {
        LabCommand::Apiserver(args) => run_apiserver(args),
    }
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

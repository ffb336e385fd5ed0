//! The `berth` binary: parses flags (each also readable from a `BERTH_*` variable), sets up
//! telemetry and hands over to the crates. Wiring only; the logic lives in `crates/`.

mod cli;

use std::io::Write;

use anyhow::Context;
use berth_telemetry::{resolve_log_filter, LogConfig, LogFormat};
use clap::{Args, Parser, Subcommand, ValueEnum};
use cli::agent::AgentArgs;
use cli::controller::ControllerArgs;
#[cfg(feature = "lab")]
use cli::lab::LabCommand;

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
    #[cfg(feature = "lab")]
    Lab(LabCommand),
    /// Explain what berth does with an object, from the API and the agents.
    #[command(subcommand)]
    Explain(cli::explain::ExplainCommand),
}

/// glibc's malloc, set for long-running processes that hold a large, slowly changing cache:
/// - two arenas: every thread that allocates would otherwise get its own (up to 8 per core),
///   and memory freed in one arena is not reused by another. berth's long-running commands use a
///   handful of threads for one shared cache, so two keep peak RSS lower at no measurable cost
///   in throughput (`make bench-controller`).
/// - a fixed mmap threshold (128 KiB, glibc's starting value): by default each large block freed
///   raises the threshold up to 32 MiB, after which the multi-megabyte buffers of a full sync and
///   of the initial lists come from the heap and their pages stay resident once freed. Fixed,
///   they are mapped and unmapped: the agent's peak at 10,000 Services fell by about 2 MB, its
///   cold load unchanged within noise (`docs/benchmarks.md`, "Agent memory").
///
/// `MALLOC_ARENA_MAX` and `MALLOC_MMAP_THRESHOLD_` in the environment still win.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune_malloc() {
    let settings = [
        ("MALLOC_ARENA_MAX", libc::M_ARENA_MAX, 2),
        ("MALLOC_MMAP_THRESHOLD_", libc::M_MMAP_THRESHOLD, 128 * 1024),
    ];
    for (variable, option, value) in settings {
        if std::env::var_os(variable).is_some() {
            continue;
        }
        // SAFETY: mallopt takes two integers and touches only the allocator's own settings; it
        // is called before any other thread exists.
        #[allow(unsafe_code)]
        unsafe {
            libc::mallopt(option, value);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_malloc() {}

fn main() -> anyhow::Result<()> {
    tune_malloc();
    let cli = Cli::parse();
    let rust_log = std::env::var("RUST_LOG").ok();
    // Held to the end of `main`: dropping it writes out the queued log lines.
    let logs = berth_telemetry::init_tracing(&cli.log.to_config(rust_log.as_deref()))
        .context("setting up logging")?;

    match cli.command {
        Command::Crds => {
            let yaml = berth_api::crds_yaml().context("rendering the CRDs")?;
            write_stdout(&yaml)
        }
        Command::Version => write_stdout(&version_line()),
        Command::Agent(args) => cli::agent::run(args, logs.dropped_lines()),
        #[cfg(feature = "lab")]
        Command::Lab(command) => cli::lab::run(command),
        Command::Explain(command) => cli::explain::run(command),
        Command::Controller(args) => cli::controller::run(args, logs.dropped_lines()),
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

/// The command line as `berth` would parse it.
#[cfg(test)]
fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("berth").chain(args.iter().copied()))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

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
    fn version_line_names_the_package_version() {
        assert_eq!(
            version_line(),
            format!("berth {}\n", env!("CARGO_PKG_VERSION"))
        );
    }
}

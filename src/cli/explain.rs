//! `berth explain service NS/NAME [--from ADDR] [--node NODE]`: what berth does with one
//! Service, from the API and, for a packet's path, from a node's agent.

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum ExplainCommand {
    /// A Service's addresses and ports, which node announces each address and why, its
    /// endpoints per node, and (with --from) a packet's path through a node's current ruleset.
    Service(ServiceArgs),
}

#[derive(Debug, Args)]
pub struct ServiceArgs {
    /// The Service as NAMESPACE/NAME (NAME alone: the default namespace).
    service: String,

    /// Trace a packet from this address to the Service's first LoadBalancer IP (else its
    /// ClusterIP), on every port, through a node's ruleset as its kernel holds it now.
    #[arg(long)]
    from: Option<IpAddr>,

    /// The node whose ruleset to trace through: by default the node announcing the address
    /// (a ClusterIP: the first node).
    #[arg(long)]
    node: Option<String>,

    /// The agents' admin port (`/debug/ruleset`), on each node's InternalIP.
    #[arg(long, env = "BERTH_AGENT_ADMIN_PORT", default_value_t = 10356)]
    agent_admin_port: u16,

    /// Kubeconfig of the cluster (or the lab's).
    #[arg(long, env = "BERTH_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
}

/// `NS/NAME` or `NAME`.
fn split_name(text: &str) -> anyhow::Result<(String, String)> {
    match text.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        None if !text.is_empty() => Ok(("default".to_owned(), text.to_owned())),
        _ => anyhow::bail!("{text:?}: name the Service as NAMESPACE/NAME"),
    }
}

pub fn run(command: ExplainCommand) -> anyhow::Result<()> {
    let ExplainCommand::Service(args) = command;
    let (ns, name) = split_name(&args.service)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let text = runtime.block_on(explain(args, &ns, &name))?;
    crate::write_stdout(&text)
}

async fn explain(args: ServiceArgs, ns: &str, name: &str) -> anyhow::Result<String> {
    let client = super::build_client(args.kubeconfig.as_deref()).await?;
    let ask = berth_explain::service::ExplainService {
        namespace: ns.to_owned(),
        name: name.to_owned(),
        from: args.from,
        node: args.node,
        agent_admin_port: args.agent_admin_port,
    };
    Ok(berth_explain::service::explain_service(&client, &ask).await?)
}

#[cfg(test)]
mod tests {
    use super::split_name;

    #[test]
    fn service_names() {
        assert_eq!(
            split_name("team/web").unwrap(),
            ("team".into(), "web".into())
        );
        assert_eq!(split_name("web").unwrap(), ("default".into(), "web".into()));
        for bad in ["", "/web", "team/", "a/b/c"] {
            assert!(split_name(bad).is_err(), "{bad}");
        }
    }
}

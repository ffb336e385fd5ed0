//! `berth explain service`: the report, then (when asked) the packet's path on one node.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use berth_core::{IpFamily, Protocol};
use berth_datapath::nft::NftTable;
use berth_datapath::trace::Hit;
use berth_datapath::Ruleset;
use kube::Client;

use crate::fetch::{fetch_inputs, fetch_ruleset, node_addresses, FetchError};
use crate::{path, report};

#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error(transparent)]
    Trace(#[from] crate::Error),
    #[error("{0}")]
    Nothing(String),
}

/// A node's ruleset, typed, as its backend holds it.
enum Traced {
    Iptables(Ruleset),
    Nft(NftTable),
}

#[derive(Debug, Clone)]
pub struct ExplainService {
    pub namespace: String,
    pub name: String,
    /// Trace a packet from here.
    pub from: Option<IpAddr>,
    /// On this node (default: the announcing node, else the first).
    pub node: Option<String>,
    pub agent_admin_port: u16,
}

fn protocol_of(name: &str) -> Protocol {
    match name {
        "UDP" => Protocol::Udp,
        "SCTP" => Protocol::Sctp,
        _ => Protocol::Tcp,
    }
}

pub async fn explain_service(
    client: &Client,
    ask: &ExplainService,
) -> Result<String, ExplainError> {
    let inputs = fetch_inputs(client, &ask.namespace, &ask.name).await?;
    let report = report::build_report(&inputs, chrono::Utc::now());
    let mut out = report::render(&report);
    let Some(from) = ask.from else {
        return Ok(out);
    };
    let (dst, announcer) = match report.load_balancer_ips.first() {
        Some(ip) => (
            *ip,
            report
                .announcements
                .first()
                .and_then(|a| a.annotated.clone().or_else(|| a.elected.clone())),
        ),
        None => (
            report
                .cluster_ips
                .first()
                .and_then(|ip| ip.parse().ok())
                .ok_or_else(|| {
                    ExplainError::Nothing(
                        "the Service has neither a LoadBalancer IP nor a ClusterIP to trace to"
                            .into(),
                    )
                })?,
            None,
        ),
    };
    let node_name = ask
        .node
        .clone()
        .or(announcer)
        .or_else(|| inputs.nodes.first().and_then(|n| n.metadata.name.clone()))
        .ok_or_else(|| ExplainError::Nothing("no node to trace on: name one with --node".into()))?;
    let node = inputs
        .nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(node_name.as_str()))
        .ok_or_else(|| ExplainError::Nothing(format!("no Node named {node_name}")))?;
    let local = node_addresses(node);
    let agent_ip = *local
        .first()
        .ok_or_else(|| ExplainError::Nothing(format!("Node {node_name} reports no InternalIP")))?;
    let family = if dst.is_ipv4() { "ipv4" } else { "ipv6" };
    let ruleset = fetch_ruleset(SocketAddr::new(agent_ip, ask.agent_admin_port), family).await?;
    let ip_family = if dst.is_ipv4() {
        IpFamily::V4
    } else {
        IpFamily::V6
    };
    let traced = match (ruleset.backend.as_str(), &ruleset.netlink) {
        ("nftables", Some(dump)) => Traced::Nft(path::table_from_netlink(ip_family, dump)?),
        ("iptables", _) => Traced::Iptables(path::ruleset_from_save(&ruleset.text)?),
        (backend, _) => {
            return Err(ExplainError::Nothing(format!(
                "the agent on {node_name} runs the {backend} backend and sent no ruleset this berth can trace (an agent older than this berth sends nftables as text)"
            )))
        }
    };
    let rs = match &traced {
        Traced::Iptables(rs) => Cow::Borrowed(rs),
        Traced::Nft(table) => Cow::Owned(table.traceable()),
    };
    let hop = |hit: &Hit| match &traced {
        Traced::Iptables(_) => path::iptables_hop(hit),
        Traced::Nft(table) => table.hop_text(ip_family, hit),
    };
    for port in &report.ports {
        let to = SocketAddr::new(dst, u16::try_from(port.port).unwrap_or(0));
        let packet = path::packet(from, to, protocol_of(&port.protocol));
        let paths = path::explain_paths(&rs, &local, &packet)?;
        out.push_str(&path::render_paths(&packet, &node_name, &paths, &hop));
    }
    Ok(out)
}

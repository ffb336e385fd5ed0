//! berth-agent: the node side of berth (docs/architecture.md, "How a Service flows in the agent").
//!
//! Watches feed a synchronous [`index::Index`] that keeps the node's view of Services and
//! endpoints and knows which Services changed; the sync loop ([`agent::Agent`]) hands those to
//! the datapath's incremental `Planner` and `Syncer`, rate limited and retried by the pure
//! [`schedule::SyncSchedule`]. Health-check node ports ([`healthcheck`]) and UDP conntrack
//! cleanup ([`conntrack`]) follow each successful sync.
//!
//! Decisions:
//! - One datapath per address family of the cluster CIDRs (IPv4 when none is given).
//! - The agent is healthy while a sync succeeded within two sync periods of now (counting from
//!   start-up before the first one), as kube-proxy's `/healthz`; health-check node ports answer
//!   503 while it is not.
//! - Network-programming latency is observed only for slices whose trigger-time annotation
//!   changed, so a relist after a dropped watch does not report old changes again.
//! - Stopping leaves every rule in place: a restarted agent adopts them with one full sync.
//! - With `--l2-announcer` the agent also answers ARP and NDP for the LoadBalancer IPs this
//!   node is elected for ([`announce`], berth-l2); `--proxy-mode=none` makes it an announcer
//!   only, beside kube-proxy.
//! - With a [`SpeakerConfig`] the agent also announces LoadBalancer IPs over BGP through the FRR
//!   beside it ([`speaker`], berth-bgp), from the same index the datapath reads.

pub mod agent;
pub mod announce;
pub mod bgpstatus;
pub mod cleanup;
pub mod config;
pub mod conntrack;
pub mod datapath;
pub mod healthcheck;
pub mod index;
mod l2events;
pub mod l2status;
mod memory;
pub mod metrics;
pub mod node_ports;
pub mod ruleset;
mod run;
pub mod schedule;
pub mod service_cidrs;
pub mod speaker;
mod watch;

pub use agent::{admin_router, Agent, AgentStatus};
pub use announce::{Announcer, AnnouncerConfig, LiveSet};
pub use berth_datapath::nft::shard::DEFAULT_SHARDS as DEFAULT_NFT_SHARDS;
pub use berth_datapath::nft::NftWriter;
pub use config::{parse_duration, AgentConfig, AgentOptions, Backend, NodeFacts, DEFAULT_BACKEND};
pub use conntrack::{plan_conntrack_cleanup, CommandConntrack, Conntrack, ConntrackFlow};
pub use datapath::{BoxedNft, SharedIptables};
pub use index::Index;
pub use run::{run_agent, start_membership, RunOptions};
pub use speaker::SpeakerConfig;

pub use berth_core::IpFamily;
pub use berth_datapath::iptables::CommandIptables;
/// What a binary needs to configure and run the agent without depending on the datapath itself.
pub use berth_datapath::plan::convert::ProxyMode;
pub use berth_datapath::Dispatch;
pub use berth_datapath::NodePortAddresses;
pub use ipnet::IpNet;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid agent configuration: {field}: {reason}")]
    InvalidConfig { field: &'static str, reason: String },
    #[error("syncing the {family} datapath failed")]
    Sync {
        family: &'static str,
        #[source]
        source: berth_datapath::Error,
    },
    #[error("running {command} failed")]
    Conntrack {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} exited with {status}: {stderr}")]
    ConntrackCommand {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("binding {what} on {addr} failed")]
    Bind {
        what: &'static str,
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("registering with the process telemetry failed")]
    Telemetry(#[source] berth_telemetry::Error),
    #[error("serving the admin endpoint failed")]
    Admin(#[source] berth_telemetry::Error),
    #[error("a datapath task stopped unexpectedly: {0}")]
    Task(String),
    #[error("the L2 announcer failed")]
    L2(#[source] berth_l2::Error),
    #[error("the L2 announcer could open none of the interfaces {0:?}")]
    NoInterface(String),
    #[error("the BGP speaker failed")]
    Bgp(#[source] berth_bgp::Error),
    #[error("listing the node's addresses failed")]
    LocalAddresses(#[source] nix::errno::Errno),
}

impl Error {
    /// A bounded label for logs and metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Error::InvalidConfig { .. } => "config",
            Error::Sync { source, .. } => source.category(),
            Error::Conntrack { .. } | Error::ConntrackCommand { .. } => "conntrack",
            Error::Bind { .. } | Error::Telemetry(_) | Error::Admin(_) => "admin",
            Error::Task(_) => "task",
            Error::L2(_) | Error::NoInterface(_) => "l2",
            Error::Bgp(_) => "bgp",
            Error::LocalAddresses(_) => "addresses",
        }
    }

    /// Whether trying again can help. The sync loop retries every failed sync regardless, with
    /// backoff and a full resync, because the Services it programs may change meanwhile; this
    /// says whether the failure can heal without such a change.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Sync { source, .. } => source.is_retryable(),
            Error::Conntrack { .. } | Error::ConntrackCommand { .. } | Error::LocalAddresses(_) => {
                true
            }
            Error::InvalidConfig { .. }
            | Error::Bind { .. }
            | Error::Telemetry(_)
            | Error::Admin(_)
            | Error::Task(_)
            | Error::L2(_)
            | Error::NoInterface(_)
            | Error::Bgp(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_sync_carries_the_datapath_category() {
        let refused = Error::Sync {
            family: "IPv4",
            source: berth_datapath::Error::Restore {
                reason: "line 3 failed".into(),
            },
        };
        assert_eq!(
            (refused.category(), refused.is_retryable()),
            ("restore", true)
        );
        let unparsable = Error::Sync {
            family: "IPv4",
            source: berth_datapath::Error::Parse {
                line: "-A".into(),
                reason: "no chain".into(),
            },
        };
        assert_eq!(
            (unparsable.category(), unparsable.is_retryable()),
            ("parse", false)
        );
        let config = Error::InvalidConfig {
            field: "node name",
            reason: "empty".into(),
        };
        assert_eq!(
            (config.category(), config.is_retryable()),
            ("config", false)
        );
    }
}

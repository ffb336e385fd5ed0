//! berth-datapath: a node's view of Services and endpoints -> a typed iptables ruleset (`plan`)
//! -> `iptables-restore` text (`render`) -> applied by a [`sync::Syncer`] through the
//! [`sync::Iptables`] trait.

pub mod categorize;
pub mod convert;
pub mod dispatch;
pub mod exec;
pub mod fixed;
pub mod input;
pub mod memory;
pub mod model;
pub mod names;
pub mod plan;
pub mod render;
pub mod rule_text;
pub mod sync;
pub mod trace;

pub use input::*;
pub use model::*;
pub use plan::{plan, Dispatch, PlanOptions};
pub use render::{render, ChainSelection};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot parse iptables line {line:?}: {reason}")]
    Parse { line: String, reason: String },
    #[error("iptables-restore rejected the payload: {reason}")]
    Restore { reason: String },
    #[error("running {command} failed")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} exited with {status}: {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("packet trace failed: {reason}")]
    Trace { reason: String },
    #[error("invalid {field} in {object}: {value:?}")]
    InvalidInput {
        object: String,
        field: String,
        value: String,
    },
}

//! The plan room: a node's view of Services and endpoints ([`input`], built from Kubernetes
//! objects by [`convert`]) -> a typed ruleset ([`model`]), the same for both backends. [`full`]
//! plans everything at once and is the reference; [`incremental`] re-plans only what changed.
//! For each Service port, [`categorize`] picks the endpoints, [`policy`] decides what the port
//! needs on this node and [`service`] writes its chains; [`dispatch`] lays out the entry chains,
//! [`fixed`] the chains every node has, [`names`] names them all.

pub mod categorize;
pub mod changes;
pub mod convert;
pub mod dispatch;
pub mod fixed;
pub mod full;
pub mod incremental;
pub mod input;
pub mod model;
pub mod names;
pub mod options;
pub mod policy;
pub mod service;

pub use changes::DispatchChanges;
pub use fixed::builtin_jumps;
pub use full::{plan, rewritten_every_sync};
pub use incremental::{Changes, Planner, PortGroups};
pub use options::Dispatch;
pub use options::{NodePortAddresses, PlanOptions};

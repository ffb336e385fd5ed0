//! Pieces of the `berth controller` process tests: the processes, the churn, the invariants.

pub mod check;
pub mod churn;
pub mod replicas;

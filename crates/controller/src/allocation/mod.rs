//! Allocation: ClusterIPs, node ports and LoadBalancer addresses, by one writer.
//!
//! `state` is the single writer's state machine — plain data, no client, no runtime: it
//! follows Services, IPPools, Namespaces and Nodes; adopts every existing value oldest-first
//! once all four are listed; then decides dirty Services one at a time (`queue` says which,
//! `plan` decides, `fresh` and `held` keep exactly what each Service's object names) and
//! returns their writes as data. `worker` is the I/O loop around it: watches in, writes
//! (`apply`) out, at most a bounded number at once and never two for one Service, so a
//! Service's writes stay in order.

pub mod apply;
mod cache;
pub mod cleanup;
pub mod cluster_addresses;
pub mod facts;
pub mod fresh;
mod held;
mod kept;
mod observe;
pub mod plan;
mod pool_status;
pub mod pools;
mod queue;
mod service_cidrs;
mod state;
mod watch;
mod worker;
pub mod write;

pub(crate) use worker::Worker;
#[cfg(test)]
mod history;

//! berth-explain: what `berth explain service NS/NAME` tells a user. [`report`] reads the
//! Service, its EndpointSlices, the Nodes, the agents' Leases and berth's pools and
//! advertisements from the API and says which addresses the Service has, which node announces
//! each and why, and where its endpoints run; [`path`] follows a packet through the ruleset a
//! node's agent read back from the kernel, rule by rule. Both are pure; the binary fetches.

pub mod fetch;
pub mod path;
pub mod report;
pub mod service;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the node's ruleset could not be read as a ruleset")]
    Ruleset {
        #[source]
        source: berth_datapath::Error,
    },
    #[error("tracing the packet failed")]
    Trace {
        #[source]
        source: berth_datapath::Error,
    },
}

//! berth-bgp: BGP announcing of LoadBalancer IPs through FRR (docs/bgp.md).
//!
//! Two channels, so that a Service change is one route and never a reload:
//! - **static** ([`render`]): router id, AS, peers, BFD profiles and per-peer policy, rendered
//!   by a pure function from `BGPPeer`, `BGPAdvertisement`, `BFDProfile` and the IPPools into an
//!   `frr.conf` that `frr-reload.py` applies when it changes;
//! - **dynamic** ([`route`]): one /32 or /128 route per announced address on berth's own
//!   `berth-bgp` device, written by rtnetlink; zebra sees it and bgpd redistributes it.
//!
//! [`announce`] decides, purely, which prefixes this node announces; [`session`] turns what FRR
//! says about each peer into the node's `BGPSessionState` records; [`password`] checks the
//! peers' passwords read from Secrets and keeps them out of logs.
//!
//! Decisions where the design leaves room:
//! - Every eligible node announces (no election): the router's ECMP spreads the traffic, and
//!   `externalTrafficPolicy: Local` Services are announced only where a ready endpoint runs.
//! - The routes are anchored on a TUN device that dies with the process holding it, so a
//!   SIGKILLed agent withdraws its addresses at once without its sessions going down; FRR
//!   restarts are covered by graceful restart (the router keeps the routes while bgpd is
//!   back), and a dead node or cut link by BFD.
//! - The kernel main table, not a table of berth's own imported with `ip import-table`: FRR
//!   8.4 keeps an imported route after its source route vanished with its device
//!   ([`route`] says more).

pub mod announce;
pub mod password;
pub mod render;
pub mod route;
pub mod session;
mod tun;

pub use announce::{compute_announcements, Announcement, NodeState, PoolFacts, ServiceFacts};
pub use password::{check_password, password_from_secret, redact};
pub use render::{render_frr_config, RenderedConfig, Skipped, SpeakerInput, SpeakerNode};
pub use route::{plan_routes, KernelRoutes, RoutePlan, BERTH_INTERFACE, ROUTE_PROTOCOL};
pub use session::{
    build_session_event, build_session_state, compute_sessions, is_own_session_record,
    parse_md5_failures, parse_neighbors, same_observation, session_record_name, NeighborFacts,
    PeerEntry, SessionMemory, SessionReport,
};

/// Everything that can fail in berth-bgp.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("creating the TUN device {name}")]
    Tun {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("opening an rtnetlink socket")]
    Netlink(#[source] std::io::Error),
    #[error("rtnetlink: {what}")]
    Route {
        what: &'static str,
        #[source]
        source: rtnetlink::Error,
    },
    #[error("the berth-bgp device vanished after it was created")]
    NoDevice,
    #[error("{0} cannot be a route destination")]
    Prefix(ipnet::IpNet),
}

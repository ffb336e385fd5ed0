//! berth-l2: the L2 announcer (docs/architecture.md, "L2 announcing").
//!
//! Pure parts first: [`election`] elects one owner per LoadBalancer IP from the announcer's
//! view, [`index::L2Index`] keeps that view (pools, advertisements, nodes, Services, slices, the
//! live set, the local interfaces) and turns it into [`answers::Answers`], the table the
//! [`responder`] consults for every ARP request and Neighbor Solicitation; [`frame`] parses
//! and builds the frames; [`schedule`] times the gratuitous announcements after a takeover.
//! The I/O edge is [`transport::Link`]: a real AF_PACKET socket per interface, or an
//! in-memory LAN for tests.
//!
//! # Decisions
//!
//! - **One election per address**: the Services holding an IP are merged first. Each Service
//!   with `externalTrafficPolicy: Local` restricts the candidates to the nodes running one of
//!   its Ready endpoints, so an address shared by Local Services is answered only where every
//!   one of them has an endpoint (answered elsewhere, one Service's port would time out, its
//!   traffic dropped for want of a local endpoint); when no node has them all, nobody answers
//!   and the address counts as `unowned`. Cluster-policy Services restrict nothing.
//! - **Which Services**: LoadBalancer Services of class `berth.dev/l2`, or of no class; their
//!   `status.loadBalancer.ingress[].ip` are the addresses. Whatever the class, an address
//!   outside every IPPool is never answered.
//! - **Interfaces**: a node answers on the union of the interfaces named by the advertisements
//!   that select it and the IP's pool (every interface when one names none). Only the local
//!   interfaces' state is visible: the local node drops out when none of its interfaces is up,
//!   and peers are assumed up — a peer whose LAN link is down leaves the live set instead.
//! - **Owner key** sha256(node + "#" + ip), the IP in its canonical text form, as MetalLB.
//! - **Gratuitous rounds** at 0, 1.1, 2.2, 3.3 and 4.4 s after a takeover, then one every
//!   `--l2-gratuitous-interval` (60 s; 0 turns it off) while the address is owned, so switches
//!   never age its MAC out; IPv4 sends a request and a reply each round, IPv6 one unsolicited
//!   Neighbor Advertisement.
//! - **NDP**: solicitations must carry hop limit 255 and a valid checksum; unicast ones
//!   (neighbour unreachability detection) are answered as well as multicast ones; duplicate
//!   address detection for an owned address is answered to all nodes.
//! - The VIP is never added to an interface: replies come from the responder alone.
//! - **Liveness** is not decided here: the agent hands the index berth-membership's live set
//!   (Lease plus SWIM). Without one, every known Node counts as live: one owner still answers,
//!   but nothing moves when an agent dies.
//! - **Interface hold**: a local interface that comes back up after being down counts again
//!   only after 1 s up without a break. After a short link flap this node may not yet know that
//!   its peers declared it dead and moved its addresses; answering at once made two nodes answer
//!   until they heard of each other (seen in the failover bench). The hold narrows that window
//!   to the peers' re-admission time; it is a timing margin, not a guarantee.
//! - **Startup settle**: a starting announcer answers nothing until its live set has stayed
//!   unchanged for 1 s. Agents started together each count only themselves at first and would
//!   all answer until membership converges; a restarted owner would answer before its peers
//!   re-admit it. Failovers after that do not wait.
//! - **Break before make**: an address taken from an owner that is still live (a move caused by
//!   a change every agent sees: endpoints, labels, conditions, advertisements) is answered only
//!   300 ms later, so the old owner, which sees the same change, stops first. An address taken
//!   from a dead owner is answered at once: failover does not wait.
//! - **Reports**: the agent keeps one `ServiceL2Status` per Service it announces, in its own
//!   namespace ([`status`]; MetalLB's resource of the same name), and records an Event on each
//!   takeover. It writes on changes only, never periodically, so the API load does not grow
//!   with the Services; it has no right to patch Services (a compromised node must not be
//!   able to rewrite them). A gracefully stopping agent deletes its records; a crashed one's
//!   are deleted by the node that takes its addresses over (and by its own agent on start).

pub mod answers;
pub mod election;
pub mod frame;
pub mod index;
pub mod packet;
pub mod responder;
pub mod schedule;
pub mod speaker;
pub mod speakers;
pub mod status;
pub mod transport;

pub use answers::{
    diff_ownership, Answers, IpAnswer, OwnershipChanges, Refusal, ServiceKey, TakeoverDelay,
};
pub use election::{
    election_key, Election, ElectionOrder, ElectionView, Interfaces, IpDemand, NodeFacts, Pool,
};
pub use frame::Mac;
pub use index::L2Index;
pub use packet::{local_interfaces, InterfaceState, Listen, PacketLink};
pub use responder::{respond, Ignored, Interface};
pub use schedule::{GratuitousSchedule, InterfaceHold, StartupSettle, WriteSettle};
pub use speaker::{
    find_conflict, may_answer, run_link, run_link_refreshing, run_link_with, Conflict, L2Metrics,
    LinkOptions,
};
pub use speakers::{spawn_speakers, Speakers, SpeakersRunning, SPEAKER_THREAD};
pub use status::{
    build_announced, build_status, is_own_record, parse_status, plan_status, status_name,
    superseded_records, Announced, StatusPlan,
};
pub use transport::{Link, LinkSwitch, MemoryLan, MemoryLink};

/// Everything that can fail in berth-l2 (all of it at the I/O edge).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listing the local interfaces failed")]
    Interfaces(#[source] std::io::Error),
    #[error("opening the AF_PACKET sockets on {interface} failed")]
    OpenSocket {
        interface: String,
        #[source]
        source: std::io::Error,
    },
    #[error("interface {0} has no Ethernet address")]
    NoMac(String),
}

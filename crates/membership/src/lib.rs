//! berth-membership: which agents are live, for the L2 announcer's election.
//!
//! ```text
//! Membership::new(config, client) -> (Membership, watch::Receiver<Arc<BTreeSet<String>>>)
//! Membership::run(self, shutdown)
//! ```
//! The receiver holds the names of the nodes whose agents are live now, this node included
//! when it counts itself. Three sources feed it:
//! - **Leases.** Each agent keeps `berth-agent-<node>` (coordination.k8s.io/v1, in the lease
//!   namespace), renewed every third of its duration with server-side apply. A stopping agent
//!   first withdraws itself from its own set, then deletes its Lease (peers drop it on the
//!   delete event, without waiting for expiry), then leaves SWIM. Every agent watches the
//!   namespace's agent Leases.
//! - **Heartbeats**: every agent sends each peer a sealed heartbeat every heartbeat interval
//!   (40 ms), one byte saying whether it counts itself live. A peer is live while it was heard
//!   within the failure timeout (250 ms) and said it is. Crash detection is bounded by the
//!   failure timeout after the last datagram, whatever the cluster's size.
//! - **SWIM** ([`foca`], sans-IO, driven by the same task over the same UDP socket) keeps
//!   running between the agents: it finds them and spreads who is there, and its messages
//!   count as heard; it no longer decides liveness (its crash detection took 0.6–1.0 s).
//! - **The combination rule** ([`live::compute_live`], pure, tested exhaustively, with a
//!   simulated partition over every heartbeat phase) and the takeover hold
//!   ([`live::SelfHold`]).
//!
//! Decisions where the design leaves room:
//! - **Peers are found through their Leases** (of existing Nodes): each agent writes the
//!   `ip:port` its SWIM socket is reached at into its own Lease
//!   (`berth.dev/membership-endpoint`). So only nodes that run an agent are probed, the port
//!   may differ per node, and a Lease event is also the moment to (re)announce to a peer SWIM
//!   does not count alive. The advertised IP is `--membership-advertise-address`, else the
//!   bind address when it is specific, else the Node's first InternalIP of the bind family.
//! - **Authentication.** Every datagram is sealed in an envelope ([`frame`]): sender,
//!   recipient, a stamp (sender's clock in µs, strictly increasing), the payload, and an
//!   HMAC-SHA256 tag over all of it with the shared key (a file the caller reads; the chart
//!   mounts a Secret). A datagram is dropped and counted when its tag does not verify, it
//!   names another recipient, its stamp is more than the clock window (5 s) from *the
//!   sender's* clock as this node reckons it (this node's clock plus the sender's offset,
//!   learnt from its Lease renewals: see Clocks below), or that sender's stamp was already
//!   accepted (stamps are remembered for the window). So a LAN neighbour without the key can
//!   neither forge nor alter a message, nor replay one to another node, later than the
//!   window, or twice. What remains: a receiver that restarted has no memory of stamps, so a
//!   datagram recorded within the window before the restart can be played to it once; such a
//!   datagram repeats old news (foca's incarnations make stale updates inert). The key is
//!   shared: every key holder is trusted, as with memberlist's keyring.
//! - **Floods are cheap.** A datagram passes a gate ([`gate`]) before the HMAC or SWIM
//!   sees it: the right size and envelope version, a source that is the advertised endpoint
//!   (`ip:port`) of a Node's agent Lease and the same node named as sender, and room in that
//!   source's budget (500 a second, burst 500: ten times what SWIM sends a peer). The gate
//!   runs in a task of its own that only receives; what it admits reaches the membership
//!   task over a bounded queue (full: dropped), and that task handles timers before
//!   datagrams (a biased select), so a flood can neither starve the probe and suspicion
//!   timers nor grow memory. Drops are counted by reason in
//!   `berth_membership_refused_messages_total` (`size`, `version`, `unknown_source`,
//!   `rate_limited`, `backlog`, then `malformed`, `bad_tag`, `wrong_recipient`, `stale`,
//!   `replayed`). Measured (tests/l2_flood_netns.rs): 150,000 datagrams in 16 s from a LAN
//!   host to three agents changed nothing — no live-set change, every one of 737 ARP probes
//!   per address answered by the owner, the longest gap between answers 58 ms. The price:
//!   a node's datagrams must come from the address it advertises (with a wildcard bind, the
//!   kernel's source address towards its peers must be that address), and a peer's first
//!   datagrams before its Lease is seen are dropped and sent again.
//! - **Clocks.** A Lease is fresh for its duration from the moment this agent saw its
//!   `renewTime` change, by this agent's own clock (client-go's observed-time rule,
//!   [`lease`]): a peer with a skewed clock cannot keep a dead Lease fresh or make a live one
//!   look expired. The membership datagrams' stamps are judged against the sender's own
//!   clock: every renewal of a peer's Lease carries its clock (`renewTime`) and is seen here a
//!   little later by this agent's clock; the largest of the last four differences (each is
//!   the offset less that delay) is the peer's offset ([`lease::LeaseView::clock_offset_ms`]).
//!   So an agent whose clock is off — minutes or a day — stays a member; only the delay
//!   between a renewal and its sighting (milliseconds; seconds when the API server is slow)
//!   has to fit in the window. Chosen over a per-sender counter with an epoch per restart:
//!   that needs no clock at all, but a receiver that restarted would accept a recording of
//!   any age once, where the window bounds it to seconds. A peer off by more than a second is
//!   logged, and `berth_membership_peer_clock_offset_seconds` shows the largest offset. A
//!   Lease first seen (at start, on a relist) is a sample too, low by its age (at most a
//!   renewal interval, a third of `--lease-duration`), until its next renewal is seen. The
//!   stamps, `renewTime` and these observations read one clock ([`clock`]): the system's wall
//!   clock when the agent started, advanced by the monotonic clock, so NTP stepping a skewed
//!   node's clock back does not leave its stamps pinned ahead of its `renewTime` (a stamp
//!   never goes back) and refused as `stale` until the clock catches up.
//! - **The combination rule.** Lease-only mode (membership off, the baseline the failover
//!   benchmark compares against): live = Lease fresh. With membership on, the heartbeats
//!   decide for peers that advertise an endpoint (live while heard within the failure timeout
//!   and saying they count themselves, unless the Lease is deleted), and the Lease for peers
//!   that take no part (no endpoint on their Lease). This node counts itself only on the
//!   majority side: the nodes it reaches (itself and the peers heard within the withdrawal
//!   time, 130 ms) must be more than half of those that may be live anywhere (those plus every
//!   peer whose Lease is fresh). Peers are counted over the cluster's Nodes, not over whatever
//!   Leases exist: a Lease of a node that is no Node (a ghost written with stolen Lease
//!   rights, or a deleted Node's leftover) counts for nothing, is not sent heartbeats, and is
//!   never live (the chart's admission policy also stops an agent from writing any Lease but
//!   its own). A tie (two nodes, or two equal halves) goes to the side holding the smallest
//!   node name; so in a two-node cluster the crash of the smaller node, or in a three-node
//!   cluster the crash of two at once, is taken over when the Leases expire. A node that
//!   neither renews its own Lease nor reaches any peer is cut off from everything and
//!   withdraws; a lone node keeps answering when the API server is down, and so does a
//!   cluster whose heartbeats flow.
//! - **Withdrawal before takeover.** The failure timeout must be at least the withdrawal time
//!   plus two heartbeat intervals ([`live::Timing::is_safe`], checked at start). A node whose
//!   membership traffic alone is cut stops answering within the withdrawal time (it hears no
//!   majority), while its peers count from its last heartbeat, at most one interval before
//!   the cut: they take its addresses only after it has stopped, and it takes none of theirs
//!   (by the time a peer's failure timeout ends, it has no majority). The instant this node's
//!   right to answer ends if nothing more is heard is published ([`AnswerUntil`]) and checked
//!   by the responders on every request: a busy or stopped-and-continued agent is silent on
//!   time, not when its tasks next run.
//! - **A healed split does not ripple.** In SWIM a down verdict is final for an identity, so
//!   the verdicts a cut-off node reached alone (everyone else down) would, once the LAN heals,
//!   force every healthy peer to rejoin and start its hold over: a gap for every address. So
//!   a node that finds itself on the losing side discards its SWIM state and starts over as a
//!   new identity that knows nobody (it keeps its own record of who was down, so it stays
//!   withdrawn); peers with fresh Leases that SWIM does not count alive are asked to let it
//!   join every second.
//! - **A planned return.** A node that (re)gains liveness — at start, after a rejoin, when a
//!   partition heals — counts itself only after the takeover hold (300 ms) without a break
//!   and once its announcer says it is ready ([`Membership::with_ready`]); its peers count it
//!   only once its heartbeat says so, and stop answering what moves to it on that heartbeat.
//!   The announcer answers what it gains a short handover delay after counting itself, so
//!   the handover's gap is that delay, not a detection time.
//! - **A thread of its own, at real-time priority.** [`Membership::spawn_dedicated`] runs the
//!   loop on the `berth-membership` thread with a current-thread runtime, so the agent's
//!   other tasks cannot delay a heartbeat, and asks for `SCHED_RR` ([`berth_realtime::priority`]), so a loaded
//!   node's other processes cannot either: measured, they delayed it 80–200 ms, past the
//!   withdrawal time, and the three lab agents flapped every few seconds under 1,000 Services
//!   and `stress-ng`; at real-time priority none did. Without `CAP_SYS_NICE` it runs at normal
//!   priority. `berth_membership_wake_delay_seconds` shows how late the loop wakes.
//! - **Metrics**: `berth_membership_changes_total{change}`, `berth_membership_live_nodes`,
//!   `berth_membership_detection_seconds` (from the last datagram heard to the declaration;
//!   graceful leaves, heard right away, are not counted) and
//!   `berth_membership_refused_messages_total{reason}`.

pub mod clock;
pub mod config;
pub mod frame;
pub mod gate;
pub mod identity;
pub mod lease;
pub mod live;
pub mod metrics;
mod run;
pub mod swim;

pub use config::{MembershipConfig, MembershipOptions, DEFAULT_PORT};
pub use metrics::MembershipMetrics;
pub use run::{pick_advertise_address, AnswerUntil, LiveNodes, Membership};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid membership configuration: {field}: {reason}")]
    InvalidConfig { field: &'static str, reason: String },
    #[error("binding the membership socket on {addr} failed")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("no membership address to advertise for node {node}: {reason}")]
    NoAddress { node: String, reason: String },
    #[error("{what} failed")]
    Kube {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("the agent Lease watch ended")]
    WatchEnded,
    #[error("starting the membership thread or its runtime failed")]
    Runtime {
        #[source]
        source: std::io::Error,
    },
    #[error("the membership thread ended without a result")]
    ThreadEnded,
}

impl Error {
    /// A bounded label for logs and metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Error::InvalidConfig { .. } => "config",
            Error::Bind { .. } => "bind",
            Error::NoAddress { .. } => "address",
            Error::Kube { .. } => "kube",
            Error::WatchEnded => "watch",
            Error::Runtime { .. } | Error::ThreadEnded => "runtime",
        }
    }
}

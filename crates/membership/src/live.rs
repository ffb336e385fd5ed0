//! Which nodes are live: the combination of each agent's Lease and the heartbeats between the
//! agents, as pure functions, and the hold a node waits before it counts itself live again.
//!
//! The rule (the crate documentation says why):
//! - **Lease only** (membership off): a node is live while its Lease is fresh.
//! - **Membership on**, for a peer that takes part (its Lease advertises an endpoint): live
//!   while it was heard within the failure timeout, its last heartbeat said it counts itself
//!   live, and its Lease exists (a stopping agent deletes it). A peer that takes no part counts
//!   by its Lease.
//! - **Membership on**, for this node: its Lease must exist, and it must be on the majority
//!   side: the nodes it *reaches* — itself, and the peers heard within the withdrawal time,
//!   ready or not — are more than half of the nodes that may be live anywhere (those plus every
//!   peer with a fresh Lease); a tie goes to the side holding the smallest name. Peers are
//!   counted only when they are Nodes of the cluster ([`cluster_peers`]): a ghost Lease counts
//!   for nothing. A node that can neither renew its own Lease nor reach any peer it knows is
//!   cut off and withdraws.
//! - **Withdrawal before takeover**: the withdrawal time is shorter than the failure timeout by
//!   more than two heartbeat intervals ([`Timing`]). A node cut off from its peers stops
//!   answering when it has heard from too few of them for the withdrawal time; its peers take
//!   its addresses when they have not heard it for the failure timeout, counted from a
//!   heartbeat that left at most one interval before the cut. The verdict carries the instant
//!   this node's right to answer ends if nothing more is heard ([`Verdict::until`]), which the
//!   responders check on every request: the withdrawal does not wait for a busy, or stopped,
//!   process to notice.
//! - In both modes this node counts itself only after being eligible for the takeover hold
//!   without a break; peers count it once its heartbeat says so. So when ownership moves to a
//!   node that (re)joins, the old owner stops before the new one starts.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// A node's Lease as this agent last saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseState {
    /// Renewed within its duration.
    Fresh,
    /// Exists, but not renewed within its duration.
    Expired,
    /// Deleted (a graceful stop) or never created.
    Absent,
}

/// A node as SWIM sees it from here. Liveness is decided by the heartbeats; SWIM finds the
/// peers, and says who takes part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SwimState {
    Alive,
    /// Declared down (crashed, cut off, or left). Kept until the node rejoins.
    Down,
    /// Takes part in SWIM (its Lease advertises an endpoint) but was never heard.
    Unknown,
    /// Takes no part in SWIM (its Lease advertises no endpoint): judged by its Lease.
    NotMember,
}

/// The three times of the heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How often every agent sends each peer a heartbeat.
    pub heartbeat: Duration,
    /// How long without a majority of peers heard before this node stops answering.
    pub withdraw: Duration,
    /// How long a peer stays live without being heard.
    pub failure: Duration,
}

impl Timing {
    /// Whether a cut-off node is sure to have withdrawn before its peers take over: they
    /// count from its last heartbeat, sent at most one interval before the cut, and a second
    /// interval absorbs delivery and scheduling delays.
    pub fn is_safe(&self) -> bool {
        self.failure >= self.withdraw + self.heartbeat * 2
    }
}

/// What this agent knows about one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerFacts {
    pub lease: LeaseState,
    /// Takes part in the heartbeats (its Lease advertises an endpoint).
    pub member: bool,
    /// When it was last heard (any authenticated datagram).
    pub heard: Option<Instant>,
    /// Its last heartbeat said it counts itself live.
    pub ready: bool,
    /// Its last heartbeat said it hears this node: reaching a peer takes both directions.
    pub hears_me: bool,
}

impl PeerFacts {
    /// A peer outside the heartbeats, judged by its Lease.
    pub fn lease_only(lease: LeaseState) -> Self {
        PeerFacts {
            lease,
            member: false,
            heard: None,
            ready: false,
            hears_me: false,
        }
    }

    fn heard_within(&self, now: Instant, d: Duration) -> bool {
        self.heard.is_some_and(|at| now < at + d)
    }
}

/// Where liveness comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    LeaseOnly,
    Membership(Timing),
}

/// The pure verdict before the hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Peers counted live.
    pub peers: BTreeSet<String>,
    /// Whether this node may count itself (the hold still applies).
    pub self_eligible: bool,
    /// When this node stops being eligible if nothing more is heard; `None`: not before
    /// something else changes (Lease only, a lone node, or not eligible now).
    pub until: Option<Instant>,
}

/// Whether a peer counts as live at `now`.
pub fn peer_is_live(mode: Mode, facts: PeerFacts, now: Instant) -> bool {
    match mode {
        Mode::LeaseOnly => facts.lease == LeaseState::Fresh,
        Mode::Membership(_) if !facts.member => facts.lease == LeaseState::Fresh,
        Mode::Membership(timing) => {
            facts.lease != LeaseState::Absent
                && facts.ready
                && facts.heard_within(now, timing.failure)
        }
    }
}

/// Whether this node reaches a peer at `now`: heard within the withdrawal time, and that peer
/// said it hears this node (a cut of this node's sending alone must make it withdraw too; a
/// peer outside the heartbeats: its Lease is fresh).
fn peer_is_reached(timing: Timing, facts: PeerFacts, now: Instant) -> bool {
    if facts.member {
        facts.heard_within(now, timing.withdraw) && facts.hears_me
    } else {
        facts.lease == LeaseState::Fresh
    }
}

/// Whether this node may count itself at `at` (see the module documentation).
fn eligible_at(
    mode: Mode,
    me: &str,
    own_lease: LeaseState,
    peers: &BTreeMap<String, PeerFacts>,
    at: Instant,
) -> bool {
    let timing = match mode {
        Mode::LeaseOnly => return own_lease == LeaseState::Fresh,
        Mode::Membership(timing) => timing,
    };
    let others = || peers.iter().filter(|(name, _)| name.as_str() != me);
    let reached: BTreeSet<&str> = others()
        .filter(|(_, facts)| peer_is_reached(timing, **facts, at))
        .map(|(name, _)| name.as_str())
        .collect();
    let may_be_live: BTreeSet<&str> = others()
        .filter(|(name, facts)| {
            reached.contains(name.as_str())
                || peer_is_live(mode, **facts, at)
                || facts.lease == LeaseState::Fresh
        })
        .map(|(name, _)| name.as_str())
        .chain(std::iter::once(me))
        .collect();
    let reachable = reached.len() + 1;
    let all = may_be_live.len();
    let smallest = may_be_live.first().copied().unwrap_or(me);
    let majority = 2 * reachable > all
        || (2 * reachable == all && (smallest == me || reached.contains(smallest)));
    let knows_peers = others().next().is_some();
    let cut_off = own_lease != LeaseState::Fresh && reached.is_empty() && knows_peers;
    own_lease != LeaseState::Absent && majority && !cut_off
}

/// The combination rule (see the module documentation). `me` is this node, `own_lease` its own
/// Lease as seen through the same watch as the peers'.
pub fn compute_live(
    mode: Mode,
    me: &str,
    own_lease: LeaseState,
    peers: &BTreeMap<String, PeerFacts>,
    now: Instant,
) -> Verdict {
    let live: BTreeSet<String> = peers
        .iter()
        .filter(|(name, facts)| name.as_str() != me && peer_is_live(mode, **facts, now))
        .map(|(name, _)| name.clone())
        .collect();
    let self_eligible = eligible_at(mode, me, own_lease, peers, now);
    let until = match mode {
        Mode::Membership(timing) if self_eligible => {
            // Eligibility only changes when a peer's last datagram ages past one of the two
            // times: look at each such instant, in order.
            let mut instants: Vec<Instant> = peers
                .iter()
                .filter(|(name, facts)| name.as_str() != me && facts.member)
                .filter_map(|(_, facts)| facts.heard)
                .flat_map(|at| [at + timing.withdraw, at + timing.failure])
                .filter(|at| *at > now)
                .collect();
            instants.sort();
            instants
                .into_iter()
                .find(|at| !eligible_at(mode, me, own_lease, peers, *at))
        }
        _ => None,
    };
    Verdict {
        peers: live,
        self_eligible,
        until,
    }
}

/// The next instant a verdict can change with nothing heard: a peer's last datagram ageing
/// past the withdrawal time or the failure timeout.
pub fn next_change(
    mode: Mode,
    peers: &BTreeMap<String, PeerFacts>,
    now: Instant,
) -> Option<Instant> {
    let Mode::Membership(timing) = mode else {
        return None;
    };
    peers
        .values()
        .filter(|facts| facts.member)
        .filter_map(|facts| facts.heard)
        .flat_map(|at| [at + timing.withdraw, at + timing.failure])
        .filter(|at| *at > now)
        .min()
}

/// Only peers that are Nodes of the cluster take part: in the majority, in the live set. A
/// Lease proves nothing about a node (any holder of Lease rights can write one, and a deleted
/// Node's Lease lingers until it expires), so ghost Leases cannot outvote real agents, nor be
/// counted live. This node itself always takes part.
pub fn cluster_peers(
    peers: BTreeMap<String, PeerFacts>,
    me: &str,
    nodes: &BTreeSet<String>,
) -> BTreeMap<String, PeerFacts> {
    peers
        .into_iter()
        .filter(|(name, _)| name == me || nodes.contains(name))
        .collect()
}

/// This node's own liveness over time: eligible without a break for `hold`. Restarts on a
/// rejoin (this node was declared down by the others).
#[derive(Debug, Clone)]
pub struct SelfHold {
    hold: Duration,
    since: Option<Instant>,
}

impl SelfHold {
    pub fn new(hold: Duration) -> Self {
        SelfHold { hold, since: None }
    }

    /// Whether this node counts itself live at `now`, given that it is `eligible`.
    pub fn observe(&mut self, eligible: bool, now: Instant) -> bool {
        if !eligible {
            self.since = None;
            return false;
        }
        let since = *self.since.get_or_insert(now);
        now.saturating_duration_since(since) >= self.hold
    }

    /// The others declared this node down: whatever it saw, it starts over.
    pub fn restart(&mut self, now: Instant) {
        if self.since.is_some() {
            self.since = Some(now);
        }
    }

    /// When the hold ends, if it is running and not over.
    pub fn wake_at(&self, now: Instant) -> Option<Instant> {
        let end = self.since? + self.hold;
        (end > now).then_some(end)
    }
}

/// The published set: the live peers, and this node when it counts itself.
pub fn live_set(verdict: Verdict, me: &str, self_live: bool) -> BTreeSet<String> {
    let mut set = verdict.peers;
    if self_live {
        set.insert(me.to_string());
    }
    set
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use LeaseState::{Absent, Expired, Fresh};

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn timing() -> Timing {
        Timing {
            heartbeat: MS(40),
            withdraw: MS(130),
            failure: MS(250),
        }
    }

    fn membership() -> Mode {
        Mode::Membership(timing())
    }

    /// A member peer heard `ago` before `now` (never when `None`).
    fn heard(lease: LeaseState, now: Instant, ago: Option<u64>, ready: bool) -> PeerFacts {
        PeerFacts {
            lease,
            member: true,
            heard: ago.map(|ms| now - MS(ms)),
            ready,
            hears_me: true,
        }
    }

    fn view(list: &[(&str, PeerFacts)]) -> BTreeMap<String, PeerFacts> {
        list.iter().map(|(n, f)| (n.to_string(), *f)).collect()
    }

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// A clock far enough from its start for every `now - ago`.
    fn t0() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    #[test]
    fn the_default_timing_withdraws_before_any_takeover() {
        assert!(timing().is_safe());
        let tight = Timing {
            failure: MS(209),
            ..timing()
        };
        assert!(!tight.is_safe());
    }

    #[test]
    fn one_peer_every_combination() {
        let now = t0();
        // (lease, heard ms ago, ready, live with membership, live with leases only)
        let table = [
            (Fresh, Some(10), true, true, true),
            (Fresh, Some(249), true, true, true),
            (Fresh, Some(250), true, false, true),
            (Fresh, Some(10), false, false, true),
            (Fresh, None, true, false, true),
            (Expired, Some(10), true, true, false),
            (Expired, Some(300), true, false, false),
            (Absent, Some(10), true, false, false),
            (Absent, None, false, false, false),
        ];
        for (lease, ago, ready, membership_live, lease_live) in table {
            let f = heard(lease, now, ago, ready);
            assert_eq!(peer_is_live(membership(), f, now), membership_live, "{f:?}");
            assert_eq!(peer_is_live(Mode::LeaseOnly, f, now), lease_live, "{f:?}");
        }
        // A peer outside the heartbeats counts by its Lease, in both modes.
        for (lease, live) in [(Fresh, true), (Expired, false), (Absent, false)] {
            let f = PeerFacts::lease_only(lease);
            assert_eq!(peer_is_live(membership(), f, now), live);
            assert_eq!(peer_is_live(Mode::LeaseOnly, f, now), live);
        }
    }

    #[test]
    fn lease_only_ignores_heartbeats_and_needs_the_own_lease_fresh() {
        let now = t0();
        for own in [Fresh, Expired, Absent] {
            let v = compute_live(
                Mode::LeaseOnly,
                "a",
                own,
                &view(&[
                    ("b", heard(Fresh, now, None, false)),
                    ("c", heard(Expired, now, Some(1), true)),
                ]),
                now,
            );
            assert_eq!(v.self_eligible, own == Fresh);
            assert_eq!(v.peers, names(&["b"]));
            assert_eq!(v.until, None);
        }
    }

    #[test]
    fn a_single_node_is_live_with_or_without_its_lease_renewed() {
        let now = t0();
        let none = BTreeMap::new();
        let v = compute_live(membership(), "a", Fresh, &none, now);
        assert!(v.self_eligible);
        assert_eq!(v.until, None, "nothing to hear: no end");
        // The API server is down: a lone node keeps answering.
        assert!(compute_live(membership(), "a", Expired, &none, now).self_eligible);
        // Its Lease is gone (stopping, or deleted): it does not.
        assert!(!compute_live(membership(), "a", Absent, &none, now).self_eligible);
    }

    #[test]
    fn a_crashed_peer_drops_out_after_the_failure_timeout_and_the_rest_keep_answering() {
        let now = t0();
        let b = heard(Fresh, now, Some(20), true);
        // c silent for 200 ms: still live (no takeover yet), no longer reached.
        let v = compute_live(
            membership(),
            "a",
            Fresh,
            &view(&[("b", b), ("c", heard(Fresh, now, Some(200), true))]),
            now,
        );
        assert_eq!(v.peers, names(&["b", "c"]));
        assert!(v.self_eligible, "b is reached: a keeps the majority");
        // Eligible until b, too, has been silent for the withdrawal time.
        assert_eq!(v.until, Some(now - MS(20) + MS(130)));
        // At 250 ms c is not live: its addresses move.
        let v = compute_live(
            membership(),
            "a",
            Fresh,
            &view(&[("b", b), ("c", heard(Fresh, now, Some(250), true))]),
            now,
        );
        assert_eq!(v.peers, names(&["b"]));
        assert!(v.self_eligible);
    }

    #[test]
    fn a_node_that_hears_no_peer_withdraws_before_they_take_over() {
        let now = t0();
        // a hears neither b nor c for the withdrawal time; their Leases are renewed.
        let from_a = view(&[
            ("b", heard(Fresh, now, Some(130), true)),
            ("c", heard(Fresh, now, Some(135), true)),
        ]);
        let v = compute_live(membership(), "a", Fresh, &from_a, now);
        assert!(!v.self_eligible);
        // b and c still count a live: no takeover while a may still answer.
        assert_eq!(v.peers, names(&["b", "c"]));
        // Seen from b at the same instant: a still live, b keeps the majority with c.
        let from_b = view(&[
            ("a", heard(Fresh, now, Some(130), true)),
            ("c", heard(Fresh, now, Some(5), true)),
        ]);
        let v = compute_live(membership(), "b", Fresh, &from_b, now);
        assert!(v.self_eligible);
        assert!(v.peers.contains("a"));
    }

    /// Only this node's sending is cut: it hears its peers, they do not hear it and will take
    /// its addresses. Their heartbeats say they do not hear it, so it withdraws all the same.
    #[test]
    fn a_node_whose_peers_do_not_hear_it_withdraws() {
        let now = t0();
        let deaf = |f: PeerFacts| PeerFacts {
            hears_me: false,
            ..f
        };
        let from_a = view(&[
            ("b", deaf(heard(Fresh, now, Some(5), true))),
            ("c", deaf(heard(Fresh, now, Some(5), true))),
        ]);
        let v = compute_live(membership(), "a", Fresh, &from_a, now);
        assert!(!v.self_eligible);
        assert_eq!(v.peers, names(&["b", "c"]), "still live: a takes nothing");
        // One of the two still hears it: the majority holds.
        let from_a = view(&[
            ("b", heard(Fresh, now, Some(5), true)),
            ("c", deaf(heard(Fresh, now, Some(5), true))),
        ]);
        assert!(compute_live(membership(), "a", Fresh, &from_a, now).self_eligible);
    }

    #[test]
    fn a_node_cut_off_from_the_lan_and_the_api_stays_withdrawn_when_leases_expire() {
        let now = t0();
        let from_a = view(&[
            ("b", heard(Expired, now, Some(5000), true)),
            ("c", heard(Expired, now, Some(5000), true)),
        ]);
        assert!(!compute_live(membership(), "a", Expired, &from_a, now).self_eligible);
        // The API server down for everyone, the LAN fine: the heartbeats carry on.
        let from_a = view(&[
            ("b", heard(Expired, now, Some(10), true)),
            ("c", heard(Expired, now, Some(10), true)),
        ]);
        let v = compute_live(membership(), "a", Expired, &from_a, now);
        assert!(v.self_eligible);
        assert_eq!(v.peers.len(), 2);
    }

    /// Two nodes: the one holding the smaller name keeps answering when they cannot hear each
    /// other (a split or a crash look the same); the other waits for the first's Lease to
    /// expire. So a crash of the smaller node is taken over at Lease speed, the other's at
    /// heartbeat speed: the price of never answering twice when the LAN splits two nodes.
    #[test]
    fn two_nodes_split_evenly_the_smallest_name_keeps_answering() {
        let now = t0();
        let from_a = view(&[("b", heard(Fresh, now, Some(1000), true))]);
        let from_b = view(&[("a", heard(Fresh, now, Some(1000), true))]);
        assert!(compute_live(membership(), "a", Fresh, &from_a, now).self_eligible);
        assert!(!compute_live(membership(), "b", Fresh, &from_b, now).self_eligible);
        // Once a's Lease expires (a crashed), b takes over.
        let from_b = view(&[("a", heard(Expired, now, Some(1000), true))]);
        assert!(compute_live(membership(), "b", Fresh, &from_b, now).self_eligible);
        // a deleted its Lease (a graceful stop): at once.
        let from_b = view(&[("a", heard(Absent, now, Some(1000), false))]);
        assert!(compute_live(membership(), "b", Fresh, &from_b, now).self_eligible);
    }

    #[test]
    fn a_peer_heard_but_not_ready_counts_for_the_majority_not_for_the_election() {
        let now = t0();
        // b restarted (or is in its hold): a reaches it, does not elect it.
        let v = compute_live(
            membership(),
            "a",
            Fresh,
            &view(&[
                ("b", heard(Fresh, now, Some(10), false)),
                ("c", heard(Fresh, now, Some(1000), true)),
            ]),
            now,
        );
        assert!(v.peers.is_empty());
        assert!(v.self_eligible);
        // Agents starting together hear each other before any is ready: all eligible.
        let v = compute_live(
            membership(),
            "a",
            Fresh,
            &view(&[
                ("b", heard(Fresh, now, Some(10), false)),
                ("c", heard(Fresh, now, Some(10), false)),
            ]),
            now,
        );
        assert!(v.self_eligible);
        // One that advertises an endpoint but was never heard may be live: a starting agent
        // that has heard nobody waits instead of claiming everything.
        let v = compute_live(
            membership(),
            "a",
            Fresh,
            &view(&[
                ("b", heard(Fresh, now, None, false)),
                ("c", heard(Fresh, now, None, false)),
            ]),
            now,
        );
        assert!(!v.self_eligible);
        // A peer outside the heartbeats counts by its Lease.
        let v = compute_live(
            membership(),
            "a",
            Fresh,
            &view(&[
                ("b", PeerFacts::lease_only(Fresh)),
                ("c", PeerFacts::lease_only(Expired)),
            ]),
            now,
        );
        assert_eq!(v.peers, names(&["b"]));
        assert!(v.self_eligible);
    }

    #[test]
    fn ghost_leases_outvote_real_agents_unless_peers_are_nodes() {
        let now = t0();
        let mut peers = view(&[
            ("b", heard(Fresh, now, Some(10), true)),
            ("c", heard(Fresh, now, Some(10), true)),
        ]);
        for i in 0..6 {
            let ghost = if i == 2 {
                PeerFacts::lease_only(Fresh)
            } else {
                heard(Fresh, now, None, false)
            };
            peers.insert(format!("ghost-{i}"), ghost);
        }
        let nodes = names(&["a", "b", "c"]);
        let over_leases = compute_live(membership(), "a", Fresh, &peers, now);
        assert!(!over_leases.self_eligible);
        assert!(over_leases.peers.contains("ghost-2"));
        let over_nodes = compute_live(
            membership(),
            "a",
            Fresh,
            &cluster_peers(peers.clone(), "a", &nodes),
            now,
        );
        assert_eq!(over_nodes.peers, names(&["b", "c"]));
        assert!(over_nodes.self_eligible);
        let lease_only = compute_live(
            Mode::LeaseOnly,
            "a",
            Fresh,
            &cluster_peers(peers, "a", &nodes),
            now,
        );
        assert!(!lease_only.peers.iter().any(|p| p.starts_with("ghost")));
        let alone = cluster_peers(
            view(&[("a", heard(Fresh, now, None, false))]),
            "a",
            &BTreeSet::new(),
        );
        assert!(alone.contains_key("a"));
    }

    /// Every split of four nodes into two sides that cannot reach each other, all Leases
    /// fresh: exactly one side counts itself live.
    #[test]
    fn no_partition_leaves_two_sides_live() {
        let now = t0();
        let nodes = ["a", "b", "c", "d"];
        for mask in 0u32..16 {
            let side = |n: usize| mask & (1 << n) != 0;
            let live_sides: BTreeSet<bool> = (0..nodes.len())
                .filter(|i| {
                    let peers: BTreeMap<String, PeerFacts> = (0..nodes.len())
                        .filter(|j| j != i)
                        .map(|j| {
                            let ago = if side(j) == side(*i) { 10 } else { 1000 };
                            (nodes[j].to_string(), heard(Fresh, now, Some(ago), true))
                        })
                        .collect();
                    compute_live(membership(), nodes[*i], Fresh, &peers, now).self_eligible
                })
                .map(side)
                .collect();
            assert_eq!(live_sides.len(), 1, "mask {mask:04b}: {live_sides:?}");
        }
    }

    /// Three nodes; the LAN cuts one of them off at `cut` (both ways). Heartbeats leave each
    /// node every interval from its own phase and arrive `delay` later; every node evaluates
    /// every millisecond. For every address ranking and every phase, no instant has two nodes
    /// answering the same address: a node answers an address when it is eligible (before its
    /// `until`) and first in the ranking among itself and the peers it counts live.
    fn first_double_answer(t: Timing) -> Option<String> {
        let mode = Mode::Membership(t);
        let nodes = ["a", "b", "c"];
        let rankings: [[usize; 3]; 6] = [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ];
        let start = t0();
        let cut_at = start + MS(1000);
        for cut in 0..3 {
            for phases in (0..27u64).map(|p| [p % 3 * 13, p / 3 % 3 * 13, p / 9 * 13]) {
                for delay in [0u64, 2, 15] {
                    // When j's datagrams last reached i, seen at `now`.
                    let last_heard = |i: usize, j: usize, now: Instant| -> Instant {
                        let linked = cut != i && cut != j;
                        let sent_by = if linked || now < cut_at { now } else { cut_at };
                        let arrive_by = sent_by - MS(delay);
                        let since_phase = (arrive_by - start).as_millis() as u64;
                        let phase = phases[j];
                        let every = t.heartbeat.as_millis() as u64;
                        let beats = since_phase.saturating_sub(phase) / every;
                        start + MS(phase + beats * every + delay)
                    };
                    for ms in 900..1700u64 {
                        let now = start + MS(ms);
                        let mut answering = [[false; 3]; 6];
                        for i in 0..3 {
                            let peers: BTreeMap<String, PeerFacts> = (0..3)
                                .filter(|j| *j != i)
                                .map(|j| {
                                    (
                                        nodes[j].to_string(),
                                        PeerFacts {
                                            lease: Fresh,
                                            member: true,
                                            heard: Some(last_heard(i, j, now)),
                                            ready: true,
                                            // The worst case for safety: heard both ways.
                                            hears_me: true,
                                        },
                                    )
                                })
                                .collect();
                            let v = compute_live(mode, nodes[i], Fresh, &peers, now);
                            if !v.self_eligible {
                                continue;
                            }
                            for (r, ranking) in rankings.iter().enumerate() {
                                let owner = ranking
                                    .iter()
                                    .find(|n| **n == i || v.peers.contains(nodes[**n]))
                                    .copied();
                                answering[r][i] = owner == Some(i);
                            }
                        }
                        for (r, row) in answering.iter().enumerate() {
                            if row.iter().filter(|a| **a).count() > 1 {
                                return Some(format!(
                                    "cut {cut}, phases {phases:?}, delay {delay}, ranking {:?}, at {ms} ms: {row:?}",
                                    rankings[r]
                                ));
                            }
                        }
                    }
                }
            }
        }
        None
    }

    #[test]
    fn a_cut_off_node_withdraws_before_anyone_takes_over() {
        assert_eq!(first_double_answer(timing()), None);
        // The rule is what makes it hold: a failure timeout shorter than the withdrawal time
        // plus the heartbeat's slack answers twice.
        let unsafe_timing = Timing {
            failure: MS(150),
            ..timing()
        };
        assert!(!unsafe_timing.is_safe());
        assert!(first_double_answer(unsafe_timing).is_some());
    }

    #[test]
    fn the_hold_delays_gaining_liveness_but_not_losing_it() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut hold = SelfHold::new(ms(300));
        assert!(!hold.observe(true, t0));
        assert_eq!(hold.wake_at(t0), Some(t0 + ms(300)));
        assert!(!hold.observe(true, t0 + ms(299)));
        assert!(hold.observe(true, t0 + ms(300)));
        assert_eq!(hold.wake_at(t0 + ms(300)), None);
        assert!(!hold.observe(false, t0 + ms(301)));
        assert!(!hold.observe(true, t0 + ms(400)));
        assert!(hold.observe(true, t0 + ms(700)));
        hold.restart(t0 + ms(800));
        assert!(!hold.observe(true, t0 + ms(900)));
        assert!(hold.observe(true, t0 + ms(1100)));
        let mut idle = SelfHold::new(ms(300));
        idle.restart(t0);
        assert_eq!(idle.wake_at(t0), None);
    }

    #[test]
    fn the_published_set_has_this_node_only_when_it_counts_itself() {
        let verdict = Verdict {
            peers: names(&["b"]),
            self_eligible: true,
            until: None,
        };
        assert_eq!(live_set(verdict.clone(), "a", false).len(), 1);
        assert!(live_set(verdict, "a", true).contains("a"));
    }
}

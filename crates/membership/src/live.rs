//! Which nodes are live: the combination of each agent's Lease and the SWIM membership, as one
//! pure function, and the hold a node waits before it counts itself live again.
//!
//! The rule (the crate documentation says why):
//! - **Lease only** (membership off): a node is live while its Lease is fresh.
//! - **Membership on**, for a peer: SWIM decides when it knows the peer — alive is live
//!   (unless its Lease is gone: a stopping agent deletes it first), down is not live whatever
//!   its Lease says. A peer that advertises a SWIM endpoint is live only once SWIM has heard
//!   it; a peer that takes no part in SWIM (its Lease advertises no endpoint) counts by its
//!   Lease.
//! - **Membership on**, for this node: its Lease must exist, and it must be on the majority
//!   side: the nodes it can count live (itself included) are more than half of the nodes that
//!   may be live anywhere (those plus every peer with a fresh Lease that SWIM cannot reach); a
//!   tie goes to the side holding the smallest name. Peers are counted only when they are Nodes
//!   of the cluster ([`cluster_peers`]): a ghost Lease counts for nothing. A node that can neither renew its own
//!   Lease nor reach any peer it knows is cut off and withdraws.
//! - In both modes this node counts itself only after being eligible for the takeover hold
//!   without a break; peers count it at once. So when ownership moves to a node that (re)joins,
//!   the old owner stops before the new one starts: a short gap, never two answers.

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

/// A node as SWIM sees it from here.
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

/// What this agent knows about one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerFacts {
    pub lease: LeaseState,
    pub swim: SwimState,
}

/// Where liveness comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    LeaseOnly,
    Membership,
}

/// The pure verdict before the hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Peers counted live.
    pub peers: BTreeSet<String>,
    /// Whether this node may count itself (the hold still applies).
    pub self_eligible: bool,
}

/// Whether a peer counts as live.
pub fn peer_is_live(mode: Mode, facts: PeerFacts) -> bool {
    let PeerFacts { lease, swim } = facts;
    match mode {
        Mode::LeaseOnly => lease == LeaseState::Fresh,
        Mode::Membership => match swim {
            SwimState::Alive => lease != LeaseState::Absent,
            SwimState::Down | SwimState::Unknown => false,
            SwimState::NotMember => lease == LeaseState::Fresh,
        },
    }
}

/// Whether a peer may be live somewhere, reachable from here or not.
fn peer_may_be_live(mode: Mode, facts: PeerFacts) -> bool {
    peer_is_live(mode, facts) || facts.lease == LeaseState::Fresh
}

/// The combination rule (see the module documentation). `me` is this node, `own_lease` its own
/// Lease as seen through the same watch as the peers'.
pub fn compute_live(
    mode: Mode,
    me: &str,
    own_lease: LeaseState,
    peers: &BTreeMap<String, PeerFacts>,
) -> Verdict {
    let live: BTreeSet<String> = peers
        .iter()
        .filter(|(name, facts)| name.as_str() != me && peer_is_live(mode, **facts))
        .map(|(name, _)| name.clone())
        .collect();
    let self_eligible = match mode {
        Mode::LeaseOnly => own_lease == LeaseState::Fresh,
        Mode::Membership => {
            let may_be_live: BTreeSet<&str> = peers
                .iter()
                .filter(|(name, facts)| name.as_str() != me && peer_may_be_live(mode, **facts))
                .map(|(name, _)| name.as_str())
                .chain(std::iter::once(me))
                .collect();
            let reachable = live.len() + 1;
            let all = may_be_live.len();
            let smallest = may_be_live.first().copied().unwrap_or(me);
            let majority = 2 * reachable > all
                || (2 * reachable == all && (smallest == me || live.contains(smallest)));
            let knows_peers = peers.keys().any(|name| name != me);
            let cut_off = own_lease != LeaseState::Fresh && live.is_empty() && knows_peers;
            own_lease != LeaseState::Absent && majority && !cut_off
        }
    };
    Verdict {
        peers: live,
        self_eligible,
    }
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
    use SwimState::{Alive, Down, NotMember, Unknown};

    fn facts(lease: LeaseState, swim: SwimState) -> PeerFacts {
        PeerFacts { lease, swim }
    }

    fn peers(list: &[(&str, LeaseState, SwimState)]) -> BTreeMap<String, PeerFacts> {
        list.iter()
            .map(|(n, l, s)| (n.to_string(), facts(*l, *s)))
            .collect()
    }

    #[test]
    fn one_peer_every_combination() {
        // (lease, swim, live with membership, live with leases only)
        let table = [
            (Fresh, Alive, true, true),
            (Fresh, Down, false, true),
            (Fresh, Unknown, false, true),
            (Fresh, NotMember, true, true),
            (Expired, Alive, true, false),
            (Expired, Down, false, false),
            (Expired, Unknown, false, false),
            (Expired, NotMember, false, false),
            (Absent, Alive, false, false),
            (Absent, Down, false, false),
            (Absent, Unknown, false, false),
            (Absent, NotMember, false, false),
        ];
        for (lease, swim, membership, lease_only) in table {
            let f = facts(lease, swim);
            assert_eq!(peer_is_live(Mode::Membership, f), membership, "{f:?}");
            assert_eq!(peer_is_live(Mode::LeaseOnly, f), lease_only, "{f:?}");
        }
    }

    #[test]
    fn lease_only_ignores_swim_and_needs_the_own_lease_fresh() {
        let states = [Alive, Down, Unknown, NotMember];
        let leases = [Fresh, Expired, Absent];
        for own in leases {
            for (lb, sb) in leases
                .iter()
                .flat_map(|l| states.iter().map(move |s| (*l, *s)))
            {
                let view = peers(&[("b", lb, sb), ("c", Fresh, Down)]);
                let v = compute_live(Mode::LeaseOnly, "a", own, &view);
                assert_eq!(v.self_eligible, own == Fresh);
                let expected: BTreeSet<String> = ["b", "c"]
                    .into_iter()
                    .filter(|n| *n == "c" || lb == Fresh)
                    .map(String::from)
                    .collect();
                assert_eq!(v.peers, expected);
            }
        }
    }

    #[test]
    fn a_single_node_is_live_with_or_without_its_lease_renewed() {
        let none = BTreeMap::new();
        assert!(compute_live(Mode::Membership, "a", Fresh, &none).self_eligible);
        // The API server is down: a lone node keeps answering.
        assert!(compute_live(Mode::Membership, "a", Expired, &none).self_eligible);
        // Its Lease is gone (stopping, or deleted): it does not.
        assert!(!compute_live(Mode::Membership, "a", Absent, &none).self_eligible);
        // Its own entry in the view changes nothing.
        let own = peers(&[("a", Fresh, Alive)]);
        assert!(compute_live(Mode::Membership, "a", Expired, &own).self_eligible);
    }

    #[test]
    fn a_crashed_peer_drops_out_at_once_and_the_rest_keep_the_majority() {
        let view = peers(&[("b", Fresh, Alive), ("c", Fresh, Down)]);
        let v = compute_live(Mode::Membership, "a", Fresh, &view);
        assert_eq!(v.peers, BTreeSet::from(["b".to_string()]));
        assert!(v.self_eligible);
    }

    #[test]
    fn a_node_cut_off_from_the_lan_but_not_the_api_withdraws() {
        // a sees b and c down over SWIM, but their Leases are renewed: a is the one cut off.
        let view = peers(&[("b", Fresh, Down), ("c", Fresh, Down)]);
        let v = compute_live(Mode::Membership, "a", Fresh, &view);
        assert!(!v.self_eligible);
        assert!(v.peers.is_empty());
        // b and c, meanwhile, see a down and keep the majority.
        let from_b = peers(&[("a", Fresh, Down), ("c", Fresh, Alive)]);
        assert!(compute_live(Mode::Membership, "b", Fresh, &from_b).self_eligible);
    }

    #[test]
    fn a_node_cut_off_from_the_lan_and_the_api_stays_withdrawn_when_leases_expire() {
        // Seen from a, every Lease (its own too) expires: it still reaches nobody.
        let view = peers(&[("b", Expired, Down), ("c", Expired, Down)]);
        assert!(!compute_live(Mode::Membership, "a", Expired, &view).self_eligible);
        // The API server down for everyone, the LAN fine: SWIM carries on.
        let view = peers(&[("b", Expired, Alive), ("c", Expired, Alive)]);
        let v = compute_live(Mode::Membership, "a", Expired, &view);
        assert!(v.self_eligible);
        assert_eq!(v.peers.len(), 2);
    }

    #[test]
    fn two_nodes_split_evenly_the_smallest_name_keeps_answering() {
        let from_a = peers(&[("b", Fresh, Down)]);
        let from_b = peers(&[("a", Fresh, Down)]);
        assert!(compute_live(Mode::Membership, "a", Fresh, &from_a).self_eligible);
        assert!(!compute_live(Mode::Membership, "b", Fresh, &from_b).self_eligible);
        // Once a's Lease expires (a crashed), b takes over.
        let from_b = peers(&[("a", Expired, Down)]);
        assert!(compute_live(Mode::Membership, "b", Fresh, &from_b).self_eligible);
    }

    #[test]
    fn a_peer_outside_swim_counts_by_its_lease_one_inside_only_once_heard() {
        // An agent with membership off advertises no endpoint: its Lease decides.
        let view = peers(&[("b", Fresh, NotMember), ("c", Expired, NotMember)]);
        let v = compute_live(Mode::Membership, "a", Fresh, &view);
        assert_eq!(v.peers, BTreeSet::from(["b".to_string()]));
        assert!(v.self_eligible);
        // One that advertises an endpoint but was never heard (starting, or crashed before
        // this agent started) is not live, yet may be: a starting agent that has heard nobody
        // waits for the others instead of claiming everything.
        let view = peers(&[("b", Fresh, Unknown), ("c", Fresh, Unknown)]);
        let v = compute_live(Mode::Membership, "a", Fresh, &view);
        assert!(v.peers.is_empty());
        assert!(!v.self_eligible);
    }

    /// Every split of four nodes into two sides that cannot reach each other, all Leases
    /// fresh: at most one side counts itself live, so no address is answered twice.
    #[test]
    fn ghost_leases_outvote_real_agents_unless_peers_are_nodes() {
        // Three real agents that hear each other, and six fresh agent Leases of nodes that do
        // not exist, advertising endpoints nobody answers on (or none at all).
        let mut view = peers(&[("b", Fresh, Alive), ("c", Fresh, Alive)]);
        let ghosts = [Unknown, Unknown, NotMember, Down, Unknown, Unknown];
        for (i, swim) in ghosts.into_iter().enumerate() {
            view.insert(format!("ghost-{i}"), facts(Fresh, swim));
        }
        let nodes: BTreeSet<String> = ["a", "b", "c"].iter().map(|n| n.to_string()).collect();
        // Counted over the Leases, the ghosts win: a real agent withdraws.
        let over_leases = compute_live(Mode::Membership, "a", Fresh, &view);
        assert!(!over_leases.self_eligible);
        assert!(over_leases.peers.contains("ghost-2"));
        // Counted over the Nodes, they change nothing.
        let over_nodes = compute_live(
            Mode::Membership,
            "a",
            Fresh,
            &cluster_peers(view.clone(), "a", &nodes),
        );
        assert_eq!(
            over_nodes,
            Verdict {
                peers: ["b", "c"].iter().map(|n| n.to_string()).collect(),
                self_eligible: true,
            }
        );
        // Lease-only mode counts no majority, but a ghost would be live.
        let lease_only = compute_live(
            Mode::LeaseOnly,
            "a",
            Fresh,
            &cluster_peers(view, "a", &nodes),
        );
        assert!(!lease_only.peers.iter().any(|p| p.starts_with("ghost")));
        // This node takes part even before its own Node is seen.
        let alone = cluster_peers(peers(&[("a", Fresh, Alive)]), "a", &BTreeSet::new());
        assert!(alone.contains_key("a"));
    }

    #[test]
    fn no_partition_leaves_two_sides_live() {
        let nodes = ["a", "b", "c", "d"];
        for mask in 0u32..16 {
            let side = |n: usize| mask & (1 << n) != 0;
            let live_sides: BTreeSet<bool> = (0..nodes.len())
                .filter(|i| {
                    let view: BTreeMap<String, PeerFacts> = (0..nodes.len())
                        .filter(|j| j != i)
                        .map(|j| {
                            let swim = if side(j) == side(*i) { Alive } else { Down };
                            (nodes[j].to_string(), facts(Fresh, swim))
                        })
                        .collect();
                    compute_live(Mode::Membership, nodes[*i], Fresh, &view).self_eligible
                })
                .map(side)
                .collect();
            assert!(live_sides.len() <= 1, "mask {mask:04b}: {live_sides:?}");
            // And someone always answers.
            assert_eq!(live_sides.len(), 1, "mask {mask:04b}");
        }
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
        // Losing eligibility is immediate, and the hold starts over.
        assert!(!hold.observe(false, t0 + ms(301)));
        assert!(!hold.observe(true, t0 + ms(400)));
        assert!(hold.observe(true, t0 + ms(700)));
        // Declared down by the others: start over from then.
        hold.restart(t0 + ms(800));
        assert!(!hold.observe(true, t0 + ms(900)));
        assert!(hold.observe(true, t0 + ms(1100)));
        // A restart while not eligible changes nothing.
        let mut idle = SelfHold::new(ms(300));
        idle.restart(t0);
        assert_eq!(idle.wake_at(t0), None);
    }

    #[test]
    fn the_published_set_has_this_node_only_when_it_counts_itself() {
        let verdict = Verdict {
            peers: BTreeSet::from(["b".to_string()]),
            self_eligible: true,
        };
        assert_eq!(live_set(verdict.clone(), "a", false).len(), 1);
        assert!(live_set(verdict, "a", true).contains("a"));
    }
}

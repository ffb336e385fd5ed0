//! foca driven without I/O: datagrams in, sealed datagrams and membership changes out, timers
//! kept in order. The run loop feeds it from a UDP socket and a clock; tests feed it directly.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use foca::{AccumulatingRuntime, Foca, NoCustomBroadcast, OwnedNotification, PostcardCodec, Timer};
use rand_foca::rngs::StdRng;

use crate::frame::{open, seal, Key, Refusal, ReplayGuard, Stamper};
use crate::identity::Peer;
use crate::live::SwimState;

/// What happened to the membership, for the run loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwimEvent {
    Up(String),
    /// A peer declared down, with the time since anything was last heard from it.
    Down {
        node: String,
        silent_for: Option<Duration>,
    },
    /// This node was declared down by the others and rejoined as a new identity.
    Rejoined,
}

/// A datagram to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub to: SocketAddr,
    pub datagram: Vec<u8>,
}

type Engine = Foca<Peer, PostcardCodec, StdRng, NoCustomBroadcast>;

/// A heartbeat's payload: these bytes, then one byte of flags: [`READY`] when the sender counts
/// itself live (it answers for its addresses), [`HEARS_YOU`] when it heard the recipient within
/// its withdrawal time. foca's messages cannot begin so: postcard
/// would read the first two bytes as a name longer than any datagram.
pub const HEARTBEAT: &[u8; 4] = b"\xffBHB";
pub const READY: u8 = 1;
pub const HEARS_YOU: u8 = 2;

/// An authenticated datagram, as the heartbeat view needs it: who sent it, and what it said
/// of itself if it was a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heard {
    pub node: String,
    /// `Some(ready)` for a heartbeat, `None` for a SWIM message.
    pub ready: Option<bool>,
    /// For a heartbeat: whether the sender hears this node.
    pub hears_me: Option<bool>,
}

pub struct Swim {
    foca: Engine,
    config: foca::Config,
    runtime: AccumulatingRuntime<Peer>,
    key: Key,
    /// Accepted too, never used to seal (a key being rotated in or out).
    previous_key: Option<Key>,
    stamper: Stamper,
    guard: ReplayGuard,
    /// Each peer's clock minus this node's, in microseconds, from its Lease
    /// ([`crate::lease::LeaseView::clock_offset_ms`]): its stamps are judged by its own clock.
    offsets: HashMap<String, i64>,
    timers: BinaryHeap<Reverse<(Instant, Timer<Peer>)>>,
    /// Each peer's state, kept from foca's notifications (a peer declared down stays down
    /// until it rejoins).
    states: BTreeMap<String, SwimState>,
    heard: BTreeMap<String, Instant>,
    /// Authenticated datagrams since the last [`Swim::take_heard`].
    fresh: Vec<Heard>,
    events: Vec<SwimEvent>,
}

impl Swim {
    pub fn new(me: Peer, config: foca::Config, key: Key, clock_window: Duration) -> Self {
        let rng: StdRng = rand_foca::make_rng();
        Swim {
            foca: Foca::new(me, config.clone(), rng, PostcardCodec),
            config,
            runtime: AccumulatingRuntime::new(),
            key,
            previous_key: None,
            stamper: Stamper::default(),
            guard: ReplayGuard::new(clock_window),
            offsets: HashMap::new(),
            timers: BinaryHeap::new(),
            states: BTreeMap::new(),
            heard: BTreeMap::new(),
            fresh: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Also accepts datagrams sealed with `key`.
    pub fn with_previous_key(mut self, key: Option<Key>) -> Self {
        self.previous_key = key;
        self
    }

    /// Seals with `key` from now on and accepts `key` and `previous`: a rotation read from
    /// the Secret's files while running.
    pub fn set_keys(&mut self, key: Key, previous: Option<Key>) {
        self.key = key;
        self.previous_key = previous;
    }

    pub fn identity(&self) -> &Peer {
        self.foca.identity()
    }

    /// A peer's state; `Unknown` when SWIM never heard of it.
    pub fn state(&self, node: &str) -> SwimState {
        self.states.get(node).copied().unwrap_or(SwimState::Unknown)
    }

    pub fn states(&self) -> &BTreeMap<String, SwimState> {
        &self.states
    }

    /// Asks `peer` to let this node join (used for peers found through their Leases).
    pub fn announce(&mut self, peer: Peer, now: Instant) {
        if let Err(err) = self.foca.announce(peer, &mut self.runtime) {
            tracing::debug!(error = %err, "announce failed");
        }
        self.collect(now);
    }

    /// How far `node`'s clock is ahead of this node's (negative: behind); `None`: unknown,
    /// taken as none.
    pub fn set_clock_offset(&mut self, node: &str, micros: Option<i64>) {
        match micros {
            Some(micros) => {
                self.offsets.insert(node.to_string(), micros);
            }
            None => {
                self.offsets.remove(node);
            }
        }
    }

    /// One received datagram; `now_micros` is this node's clock. Refused ones change nothing.
    pub fn receive(
        &mut self,
        datagram: &[u8],
        now: Instant,
        now_micros: u64,
    ) -> Result<(), Refusal> {
        let me = self.foca.identity().node.clone();
        let opened = match (open(&self.key, datagram), &self.previous_key) {
            (Err(Refusal::BadTag), Some(previous)) => open(previous, datagram)?,
            (opened, _) => opened?,
        };
        if opened.recipient != me {
            return Err(Refusal::WrongRecipient);
        }
        let offset = self.offsets.get(opened.sender).copied().unwrap_or(0);
        let senders_now = now_micros.saturating_add_signed(offset);
        self.guard.admit(opened.sender, opened.stamp, senders_now)?;
        self.heard.insert(opened.sender.to_string(), now);
        if let Some(flags) = opened.payload.strip_prefix(HEARTBEAT.as_slice()) {
            let flags = flags.first().copied().unwrap_or(0);
            self.fresh.push(Heard {
                node: opened.sender.to_string(),
                ready: Some(flags & READY != 0),
                hears_me: Some(flags & HEARS_YOU != 0),
            });
            return Ok(());
        }
        self.fresh.push(Heard {
            node: opened.sender.to_string(),
            ready: None,
            hears_me: None,
        });
        if let Err(err) = self.foca.handle_data(opened.payload, &mut self.runtime) {
            // Authentic but not usable by foca (e.g. from a down member): nothing to do.
            tracing::debug!(error = %err, sender = opened.sender, "membership data ignored");
        }
        self.collect(now);
        Ok(())
    }

    /// The authenticated datagrams received since the last call.
    pub fn take_heard(&mut self) -> Vec<Heard> {
        std::mem::take(&mut self.fresh)
    }

    /// A heartbeat to `node` at `to`, sealed like every datagram; `ready`: this node counts
    /// itself live; `hears_you`: it heard `node` within its withdrawal time.
    pub fn heartbeat(
        &mut self,
        node: &str,
        to: SocketAddr,
        ready: bool,
        hears_you: bool,
        now_micros: u64,
    ) -> Outgoing {
        let me = self.foca.identity().node.clone();
        let stamp = self.stamper.next(now_micros);
        let mut payload = HEARTBEAT.to_vec();
        payload.push(if ready { READY } else { 0 } | if hears_you { HEARS_YOU } else { 0 });
        Outgoing {
            to,
            datagram: seal(&self.key, &me, node, stamp, &payload),
        }
    }

    /// When the next timer is due.
    pub fn next_timer(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((at, _))| *at)
    }

    /// Hands foca every timer due at `now`, in order.
    pub fn fire_due(&mut self, now: Instant) {
        while let Some(Reverse((at, _))) = self.timers.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((_, timer))) = self.timers.pop() else {
                break;
            };
            if let Err(err) = self.foca.handle_timer(timer, &mut self.runtime) {
                tracing::debug!(error = %err, "membership timer");
            }
            self.collect(now);
        }
    }

    /// Starts SWIM over as a new identity that knows nobody, keeping what it last knew of each
    /// peer until SWIM says otherwise. For a node that found itself cut off: its own verdicts
    /// from the cut (everyone else down) must not spread when the network heals, or every
    /// peer would have to rejoin.
    pub fn restart(&mut self) {
        let me = self.foca.identity();
        let renewed = Peer {
            node: me.node.clone(),
            addr: me.addr,
            generation: me.generation.saturating_add(1),
        };
        let rng: StdRng = rand_foca::make_rng();
        self.foca = Foca::new(renewed, self.config.clone(), rng, PostcardCodec);
        self.runtime = AccumulatingRuntime::new();
        self.timers.clear();
    }

    /// Whether this node's SWIM holds any verdict about a peer (alive, suspect or down).
    pub fn has_members(&self) -> bool {
        self.foca.iter_membership_state().len() > 0
    }

    /// Tells a few peers this node is leaving, so they see it down at once.
    pub fn leave(&mut self, now: Instant) {
        if let Err(err) = self.foca.leave_cluster(&mut self.runtime) {
            tracing::debug!(error = %err, "leaving the membership");
        }
        self.collect(now);
    }

    /// The datagrams to send, sealed, and the membership events since the last call.
    pub fn drain(&mut self, now_micros: u64) -> (Vec<Outgoing>, Vec<SwimEvent>) {
        let me = self.foca.identity().node.clone();
        let mut out = Vec::new();
        while let Some((to, data)) = self.runtime.to_send() {
            let stamp = self.stamper.next(now_micros);
            out.push(Outgoing {
                to: to.addr,
                datagram: seal(&self.key, &me, &to.node, stamp, &data),
            });
        }
        (out, std::mem::take(&mut self.events))
    }

    /// Moves foca's timers into the queue and its notifications into events.
    fn collect(&mut self, now: Instant) {
        while let Some((after, timer)) = self.runtime.to_schedule() {
            self.timers.push(Reverse((now + after, timer)));
        }
        while let Some(notification) = self.runtime.to_notify() {
            match notification {
                OwnedNotification::MemberUp(peer) => {
                    self.states.insert(peer.node.clone(), SwimState::Alive);
                    self.events.push(SwimEvent::Up(peer.node));
                }
                OwnedNotification::MemberDown(peer) => {
                    self.states.insert(peer.node.clone(), SwimState::Down);
                    let silent_for = self
                        .heard
                        .get(&peer.node)
                        .map(|t| now.saturating_duration_since(*t));
                    self.events.push(SwimEvent::Down {
                        node: peer.node,
                        silent_for,
                    });
                }
                OwnedNotification::Rejoin(_) | OwnedNotification::Defunct => {
                    self.events.push(SwimEvent::Rejoined);
                }
                OwnedNotification::Rename(_, _)
                | OwnedNotification::Active
                | OwnedNotification::Idle => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::VecDeque;

    use super::*;
    use crate::config::MembershipOptions;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn mk_swim(node: &str, port: u16) -> Swim {
        let config = MembershipOptions {
            node_name: node.into(),
            key: Some(KEY.to_vec()),
            ..MembershipOptions::default()
        }
        .validate()
        .unwrap();
        let me = Peer {
            node: node.into(),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            generation: 1,
        };
        Swim::new(
            me,
            config.foca_config(),
            Key::new(KEY).unwrap(),
            Duration::from_secs(5),
        )
    }

    /// Several instances on a simulated network: datagrams delivered at once, timers by a
    /// simulated clock stepping 10 ms at a time. `dead` nodes receive nothing and send nothing.
    struct Net {
        nodes: Vec<Swim>,
        dead: Vec<bool>,
        /// Running, but cut off: nothing it sends arrives, nothing reaches it.
        cut: Vec<bool>,
        /// Each node's wall clock minus the simulation's, in microseconds.
        skew: Vec<i64>,
        now: Instant,
        epoch_micros: u64,
        start: Instant,
        events: Vec<(usize, SwimEvent)>,
    }

    impl Net {
        fn new(n: usize) -> Net {
            let nodes: Vec<Swim> = (0..n)
                .map(|i| mk_swim(&format!("node-{i}"), 7000 + i as u16))
                .collect();
            let now = Instant::now();
            Net {
                dead: vec![false; n],
                cut: vec![false; n],
                skew: vec![0; n],
                nodes,
                now,
                start: now,
                epoch_micros: 1_800_000_000_000_000,
                events: Vec::new(),
            }
        }

        fn micros(&self) -> u64 {
            self.epoch_micros + self.now.duration_since(self.start).as_micros() as u64
        }

        /// Node `i`'s wall clock.
        fn clock(&self, i: usize) -> u64 {
            self.micros().saturating_add_signed(self.skew[i])
        }

        fn deliver(&mut self) {
            let mut queue: VecDeque<Outgoing> = VecDeque::new();
            loop {
                for i in 0..self.nodes.len() {
                    let clock = self.clock(i);
                    let (out, events) = self.nodes[i].drain(clock);
                    if !self.dead[i] && !self.cut[i] {
                        queue.extend(out);
                    }
                    self.events.extend(events.into_iter().map(|e| (i, e)));
                }
                let Some(packet) = queue.pop_front() else {
                    break;
                };
                let to = (packet.to.port() - 7000) as usize;
                if !self.dead[to] && !self.cut[to] {
                    let clock = self.clock(to);
                    let _ = self.nodes[to].receive(&packet.datagram, self.now, clock);
                }
            }
        }

        fn run_for(&mut self, d: Duration) {
            let end = self.now + d;
            while self.now < end {
                self.now += Duration::from_millis(10);
                for i in 0..self.nodes.len() {
                    if !self.dead[i] {
                        let now = self.now;
                        self.nodes[i].fire_due(now);
                    }
                }
                self.deliver();
            }
        }

        fn join_all(&mut self) {
            for i in 1..self.nodes.len() {
                let seed = Peer::from_lease("node-0", SocketAddr::from(([127, 0, 0, 1], 7000)));
                let now = self.now;
                self.nodes[i].announce(seed, now);
            }
            self.deliver();
            self.run_for(Duration::from_secs(1));
        }
    }

    #[test]
    fn three_members_find_each_other_and_see_a_crash() {
        let mut net = Net::new(3);
        net.join_all();
        for i in 0..3 {
            let others: Vec<SwimState> = (0..3)
                .filter(|j| *j != i)
                .map(|j| net.nodes[i].state(&format!("node-{j}")))
                .collect();
            assert_eq!(others, vec![SwimState::Alive; 2], "node-{i}");
        }
        net.events.clear();
        net.dead[2] = true;
        let crashed_at = net.now;
        net.run_for(Duration::from_secs(3));
        for i in 0..2 {
            assert_eq!(net.nodes[i].state("node-2"), SwimState::Down, "node-{i}");
        }
        // Both saw it go down, with the silence measured from the last datagram heard.
        let downs: Vec<&(usize, SwimEvent)> = net
            .events
            .iter()
            .filter(|(_, e)| matches!(e, SwimEvent::Down { .. }))
            .collect();
        assert_eq!(downs.len(), 2, "{:?}", net.events);
        for (_, event) in downs {
            let SwimEvent::Down { node, silent_for } = event else {
                unreachable!()
            };
            assert_eq!(node, "node-2");
            assert!(
                silent_for.unwrap() >= Duration::from_millis(400),
                "{silent_for:?}"
            );
        }
        assert!(net.now > crashed_at);
    }

    /// A node cut off declares everyone down; if it kept those verdicts, the others would be
    /// told they are down when the network heals and would all have to rejoin.
    fn heal_after_cut(restart: bool) -> Vec<(usize, SwimEvent)> {
        let mut net = Net::new(3);
        net.join_all();
        net.cut[0] = true;
        net.run_for(Duration::from_secs(3));
        assert_eq!(net.nodes[0].state("node-1"), SwimState::Down);
        assert_eq!(net.nodes[1].state("node-0"), SwimState::Down);
        net.events.clear();
        if restart {
            net.nodes[0].restart();
            // Its own record of who was down survives the restart.
            assert_eq!(net.nodes[0].state("node-1"), SwimState::Down);
        }
        net.cut[0] = false;
        let now = net.now;
        net.nodes[0].announce(
            Peer::from_lease("node-1", SocketAddr::from(([127, 0, 0, 1], 7001))),
            now,
        );
        net.deliver();
        net.run_for(Duration::from_secs(3));
        for i in 0..3 {
            for j in 0..3 {
                if i != j {
                    assert_eq!(
                        net.nodes[i].state(&format!("node-{j}")),
                        SwimState::Alive,
                        "node-{i} on node-{j}"
                    );
                }
            }
        }
        net.events
    }

    #[test]
    fn a_cut_off_node_that_starts_over_does_not_make_the_others_rejoin() {
        let events = heal_after_cut(true);
        let rejoined: Vec<usize> = events
            .iter()
            .filter(|(_, e)| *e == SwimEvent::Rejoined)
            .map(|(i, _)| *i)
            .collect();
        assert!(
            !rejoined.contains(&1) && !rejoined.contains(&2),
            "{events:?}"
        );
        // Without starting over, its stale verdicts spread: the healthy nodes had to rejoin.
        let events = heal_after_cut(false);
        assert!(
            events
                .iter()
                .any(|(i, e)| *i != 0 && *e == SwimEvent::Rejoined),
            "{events:?}"
        );
    }

    #[test]
    fn a_leaving_member_is_down_for_the_others_at_once() {
        let mut net = Net::new(3);
        net.join_all();
        net.events.clear();
        let now = net.now;
        net.nodes[1].leave(now);
        net.deliver();
        net.dead[1] = true;
        for i in [0, 2] {
            assert_eq!(net.nodes[i].state("node-1"), SwimState::Down, "node-{i}");
        }
    }

    #[test]
    fn a_previous_key_is_accepted_but_never_used_to_seal() {
        let old = Key::new(KEY).unwrap();
        let new = Key::new(b"the rotated-in key, long enough!").unwrap();
        let other = Key::new(b"somebody else's key, long enough").unwrap();
        // node-1 still seals with the old key; node-0 has rotated and accepts both.
        let mut rotated = mk_swim("node-0", 7000);
        rotated.key = new.clone();
        let mut rotated = rotated.with_previous_key(Some(old.clone()));
        let now = Instant::now();
        let micros = 1_000_000_000;
        let from_old = seal(&old, "node-1", "node-0", micros, b"x");
        assert_eq!(rotated.receive(&from_old, now, micros), Ok(()));
        let from_new = seal(&new, "node-1", "node-0", micros + 1, b"x");
        assert_eq!(rotated.receive(&from_new, now, micros), Ok(()));
        let from_other = seal(&other, "node-1", "node-0", micros + 2, b"x");
        assert_eq!(
            rotated.receive(&from_other, now, micros),
            Err(Refusal::BadTag)
        );
        // A replay under the previous key is still a replay.
        assert_eq!(
            rotated.receive(&from_old, now, micros),
            Err(Refusal::Replayed)
        );
        // What node-0 sends is sealed with the new key only.
        rotated.announce(
            Peer {
                node: "node-1".into(),
                addr: SocketAddr::from(([127, 0, 0, 1], 7001)),
                generation: 1,
            },
            now,
        );
        let (out, _) = rotated.drain(micros + 10);
        assert!(!out.is_empty());
        for datagram in out {
            assert!(open(&new, &datagram.datagram).is_ok());
            assert_eq!(open(&old, &datagram.datagram).err(), Some(Refusal::BadTag));
        }
    }

    #[test]
    fn keys_set_while_running_take_effect_at_once() {
        let old = Key::new(KEY).unwrap();
        let new = Key::new(b"the rotated-in key, long enough!").unwrap();
        let mut node = mk_swim("node-0", 7000);
        let now = Instant::now();
        let micros = 1_000_000_000;
        let from_new = seal(&new, "node-1", "node-0", micros, b"x");
        assert_eq!(node.receive(&from_new, now, micros), Err(Refusal::BadTag));
        node.set_keys(new.clone(), Some(old.clone()));
        assert_eq!(node.receive(&from_new, now, micros), Ok(()));
        let from_old = seal(&old, "node-1", "node-0", micros + 1, b"x");
        assert_eq!(node.receive(&from_old, now, micros), Ok(()));
        let beat = node.heartbeat(
            "node-1",
            SocketAddr::from(([127, 0, 0, 1], 7001)),
            true,
            true,
            micros,
        );
        assert!(open(&new, &beat.datagram).is_ok());
        // The previous key dropped: old datagrams are refused.
        node.set_keys(new, None);
        let from_old = seal(&old, "node-1", "node-0", micros + 2, b"x");
        assert_eq!(node.receive(&from_old, now, micros), Err(Refusal::BadTag));
    }

    #[test]
    fn forged_and_replayed_datagrams_change_nothing() {
        let mut net = Net::new(2);
        net.join_all();
        // node-1 leaves; capture the datagram that says so instead of delivering it.
        let now = net.now;
        let micros = net.micros();
        net.nodes[1].leave(now);
        let (leave, _) = net.nodes[1].drain(micros);
        assert!(!leave.is_empty());
        let datagram = leave[0].datagram.clone();
        // Altered by one bit: refused, node-1 stays alive.
        let mut forged = datagram.clone();
        let last = forged.len() - 40;
        forged[last] ^= 1;
        assert_eq!(
            net.nodes[0].receive(&forged, now, micros),
            Err(Refusal::BadTag)
        );
        assert_eq!(net.nodes[0].state("node-1"), SwimState::Alive);
        // The same payload signed with another key: refused.
        let other = Key::new(b"a different key, also long enough").unwrap();
        let opened = open(&Key::new(KEY).unwrap(), &datagram).unwrap();
        let resealed = seal(
            &other,
            opened.sender,
            opened.recipient,
            opened.stamp + 1,
            opened.payload,
        );
        assert_eq!(
            net.nodes[0].receive(&resealed, now, micros),
            Err(Refusal::BadTag)
        );
        assert_eq!(net.nodes[0].state("node-1"), SwimState::Alive);
        // Addressed to another node: refused.
        let elsewhere = seal(
            &Key::new(KEY).unwrap(),
            opened.sender,
            "node-9",
            opened.stamp + 2,
            opened.payload,
        );
        assert_eq!(
            net.nodes[0].receive(&elsewhere, now, micros),
            Err(Refusal::WrongRecipient)
        );
        // Replayed after the window: stale.
        let late = micros + 6_000_000;
        assert_eq!(
            net.nodes[0].receive(&datagram, now, late),
            Err(Refusal::Stale)
        );
        assert_eq!(net.nodes[0].state("node-1"), SwimState::Alive);
        // The genuine datagram is accepted once, and only once.
        assert_eq!(net.nodes[0].receive(&datagram, now, micros), Ok(()));
        assert_eq!(net.nodes[0].state("node-1"), SwimState::Down);
        assert_eq!(
            net.nodes[0].receive(&datagram, now, micros),
            Err(Refusal::Replayed)
        );
    }

    /// A node whose clock is a minute ahead: judged by this node's clock (no offset known), its
    /// datagrams are stale and it never joins; judged by its own clock (the offset its Lease
    /// tells), it is a member, and its datagrams are still refused when replayed twice or
    /// later than the window of its clock.
    #[test]
    fn a_node_whose_clock_is_off_is_a_member_and_its_replays_are_still_refused() {
        let minute: i64 = 60_000_000;
        let mut net = Net::new(3);
        net.skew[2] = minute;
        net.join_all();
        for i in 0..2 {
            assert_eq!(net.nodes[i].state("node-2"), SwimState::Unknown, "node-{i}");
        }
        for i in 0..2 {
            net.nodes[i].set_clock_offset("node-2", Some(minute));
            net.nodes[2].set_clock_offset(&format!("node-{i}"), Some(-minute));
        }
        net.join_all();
        net.run_for(Duration::from_secs(2));
        for i in 0..3 {
            let others: Vec<SwimState> = (0..3)
                .filter(|j| *j != i)
                .map(|j| net.nodes[i].state(&format!("node-{j}")))
                .collect();
            assert_eq!(others, vec![SwimState::Alive; 2], "node-{i}");
        }
        // A genuine datagram from node-2 to node-0, recorded off the wire.
        let now = net.now;
        net.nodes[2].announce(
            Peer::from_lease("node-0", SocketAddr::from(([127, 0, 0, 1], 7000))),
            now,
        );
        let clock = net.clock(2);
        let (out, _) = net.nodes[2].drain(clock);
        let recorded = out
            .iter()
            .find(|o| o.to.port() == 7000)
            .map(|o| o.datagram.clone())
            .unwrap();
        let at_node_0 = net.clock(0);
        assert_eq!(net.nodes[0].receive(&recorded, now, at_node_0), Ok(()));
        assert_eq!(
            net.nodes[0].receive(&recorded, now, at_node_0),
            Err(Refusal::Replayed)
        );
        assert_eq!(
            net.nodes[0].receive(&recorded, now, at_node_0 + 6_000_000),
            Err(Refusal::Stale)
        );
        // Forgetting the offset brings back today's refusal.
        let fresh = open(&Key::new(KEY).unwrap(), &recorded).unwrap();
        let again = seal(
            &Key::new(KEY).unwrap(),
            fresh.sender,
            fresh.recipient,
            fresh.stamp + 1,
            fresh.payload,
        );
        net.nodes[0].set_clock_offset("node-2", None);
        assert_eq!(
            net.nodes[0].receive(&again, now, at_node_0),
            Err(Refusal::Stale)
        );
    }
}

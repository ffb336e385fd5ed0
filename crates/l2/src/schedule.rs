//! When to send gratuitous announcements after taking an address over: at once, then about
//! every second for five seconds. Linux ignores a second neighbour update within `locktime`
//! (1 s by default), so a burst helps no one; 1.1 s apart keeps each round past the lock even
//! when the previous one was late. After that, optionally, one round every refresh interval
//! for as long as the address is owned: switches age out the MAC tables of quiet ports
//! (300 s is common) and would flood, or drop, the address's traffic (MetalLB issue 2910).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Offsets from the takeover at which a round is sent.
pub const GRATUITOUS_ROUNDS: [Duration; 5] = [
    Duration::ZERO,
    Duration::from_millis(1100),
    Duration::from_millis(2200),
    Duration::from_millis(3300),
    Duration::from_millis(4400),
];

/// Pending rounds per address. Pure: the caller passes the time.
#[derive(Debug, Clone, Default)]
pub struct GratuitousSchedule {
    /// Takeover time and rounds already sent.
    pending: BTreeMap<IpAddr, (Instant, usize)>,
    /// One more round this often after the takeover rounds; `None`: none.
    refresh: Option<Duration>,
}

impl GratuitousSchedule {
    /// A schedule that keeps announcing owned addresses every `refresh` after the takeover
    /// rounds (`None` or zero: never).
    pub fn with_refresh(refresh: Option<Duration>) -> Self {
        GratuitousSchedule {
            pending: BTreeMap::new(),
            refresh: refresh.filter(|r| !r.is_zero()),
        }
    }

    /// The offset from the takeover of round `n`, if there is one.
    fn offset(&self, n: usize) -> Option<Duration> {
        match GRATUITOUS_ROUNDS.get(n) {
            Some(offset) => Some(*offset),
            None => {
                let last = GRATUITOUS_ROUNDS[GRATUITOUS_ROUNDS.len() - 1];
                let extra = u32::try_from(n + 1 - GRATUITOUS_ROUNDS.len()).ok()?;
                Some(last + self.refresh?.checked_mul(extra)?)
            }
        }
    }

    /// `ip` was taken over at `now`: its rounds start again from the first.
    pub fn start(&mut self, ip: IpAddr, now: Instant) {
        self.pending.insert(ip, (now, 0));
    }

    /// `ip` is no longer ours: no more rounds.
    pub fn stop(&mut self, ip: IpAddr) {
        self.pending.remove(&ip);
    }

    /// The addresses with a round due at `now`, each counted as sent. A late caller gets one
    /// round, not the ones it missed.
    pub fn take_due(&mut self, now: Instant) -> Vec<IpAddr> {
        let mut due = Vec::new();
        let mut pending = std::mem::take(&mut self.pending);
        pending.retain(|ip, (start, sent)| {
            let Some(offset) = self.offset(*sent) else {
                return false;
            };
            if now >= *start + offset {
                due.push(*ip);
                // Skip rounds that are already past as well.
                *sent += 1;
                while self.offset(*sent).is_some_and(|next| now >= *start + next) {
                    *sent += 1;
                }
            }
            self.offset(*sent).is_some()
        });
        self.pending = pending;
        due
    }

    /// When the next round is due, if any.
    pub fn next_due(&self) -> Option<Instant> {
        self.pending
            .values()
            .filter_map(|(start, sent)| self.offset(*sent).map(|o| *start + o))
            .min()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    /// Runs the schedule by jumping from one due time to the next: the offsets of every round.
    fn rounds(schedule: &mut GratuitousSchedule, t0: Instant) -> Vec<(Duration, Vec<IpAddr>)> {
        let mut out = Vec::new();
        while let Some(at) = schedule.next_due() {
            out.push((at - t0, schedule.take_due(at)));
        }
        out
    }

    #[test]
    fn at_once_then_about_every_second_for_five_seconds() {
        let t0 = Instant::now();
        let mut s = GratuitousSchedule::default();
        s.start(ip("198.18.0.200"), t0);
        let got = rounds(&mut s, t0);
        let offsets: Vec<u128> = got.iter().map(|(d, _)| d.as_millis()).collect();
        assert_eq!(offsets, [0, 1100, 2200, 3300, 4400]);
        assert!(got.iter().all(|(_, ips)| ips == &[ip("198.18.0.200")]));
        for pair in offsets.windows(2) {
            assert!(pair[1] - pair[0] > 1000, "past Linux's 1 s locktime");
        }
        assert!(s.is_empty());
        assert!(s.take_due(t0 + Duration::from_secs(60)).is_empty());
    }

    #[test]
    fn with_a_refresh_an_owned_address_is_announced_again_until_stopped() {
        let t0 = Instant::now();
        let mut s = GratuitousSchedule::with_refresh(Some(Duration::from_secs(60)));
        s.start(ip("198.18.0.200"), t0);
        let mut offsets = Vec::new();
        while let Some(at) = s.next_due() {
            if at - t0 > Duration::from_secs(200) {
                break;
            }
            offsets.push((at - t0).as_millis());
            assert_eq!(s.take_due(at), [ip("198.18.0.200")]);
        }
        assert_eq!(
            offsets,
            [0, 1100, 2200, 3300, 4400, 64_400, 124_400, 184_400]
        );
        // A late caller (a stopped process, a busy machine) gets one round, not the missed
        // ones; the period keeps its phase.
        let late = t0 + Duration::from_secs(1000);
        assert_eq!(s.take_due(late).len(), 1);
        assert_eq!(
            s.next_due(),
            Some(t0 + Duration::from_millis(4400) + Duration::from_secs(17 * 60))
        );
        s.stop(ip("198.18.0.200"));
        assert!(s.is_empty());
        // Zero is off.
        let mut off = GratuitousSchedule::with_refresh(Some(Duration::ZERO));
        off.start(ip("198.18.0.200"), t0);
        assert_eq!(rounds(&mut off, t0).len(), GRATUITOUS_ROUNDS.len());
    }

    #[test]
    fn nothing_is_due_between_rounds() {
        let t0 = Instant::now();
        let mut s = GratuitousSchedule::default();
        s.start(ip("198.18.0.200"), t0);
        assert_eq!(s.take_due(t0).len(), 1);
        assert!(s.take_due(t0 + Duration::from_millis(1099)).is_empty());
        assert_eq!(s.take_due(t0 + Duration::from_millis(1100)).len(), 1);
    }

    #[test]
    fn a_late_caller_gets_one_round_not_a_burst() {
        let t0 = Instant::now();
        let mut s = GratuitousSchedule::default();
        s.start(ip("198.18.0.200"), t0);
        assert_eq!(s.take_due(t0 + Duration::from_millis(2500)).len(), 1);
        assert_eq!(s.next_due(), Some(t0 + Duration::from_millis(3300)));
    }

    #[test]
    fn stop_ends_rounds_and_restart_begins_again() {
        let t0 = Instant::now();
        let mut s = GratuitousSchedule::default();
        s.start(ip("198.18.0.200"), t0);
        s.start(ip("fd00::5"), t0 + Duration::from_millis(500));
        assert_eq!(s.take_due(t0), vec![ip("198.18.0.200")]);
        s.stop(ip("198.18.0.200"));
        assert_eq!(s.next_due(), Some(t0 + Duration::from_millis(500)));
        let t1 = t0 + Duration::from_secs(3);
        s.start(ip("198.18.0.200"), t1);
        let due = s.take_due(t1);
        assert_eq!(due, vec![ip("198.18.0.200"), ip("fd00::5")]);
    }
}

/// When a local interface counts as up again. An interface that was seen down counts as up
/// only after it has stayed up for the hold: during a short link flap this node may not have
/// noticed that its peers declared it dead and took its addresses over, and answering again at
/// once would make two nodes answer until they hear of each other. Interfaces up from the
/// first observation count at once; one down at the first observation waits like any other. Pure: the caller passes the time.
#[derive(Debug, Clone)]
pub struct InterfaceHold {
    hold: std::time::Duration,
    /// Interfaces seen down at least once, with when they came back up (if they have).
    returning: BTreeMap<String, Option<Instant>>,
}

impl InterfaceHold {
    pub fn new(hold: std::time::Duration) -> Self {
        InterfaceHold {
            hold,
            returning: BTreeMap::new(),
        }
    }

    /// The interfaces of `up` (those up now, out of `known`) that count as up at `now`.
    pub fn observe(
        &mut self,
        now: Instant,
        known: &[String],
        up: &std::collections::BTreeSet<String>,
    ) -> std::collections::BTreeSet<String> {
        let mut counted = std::collections::BTreeSet::new();
        for name in known {
            if !up.contains(name) {
                self.returning.insert(name.clone(), None);
                continue;
            }
            match self.returning.get_mut(name) {
                None => {
                    counted.insert(name.clone());
                }
                Some(since) => {
                    let since = *since.get_or_insert(now);
                    if now.saturating_duration_since(since) >= self.hold {
                        self.returning.remove(name);
                        counted.insert(name.clone());
                    }
                }
            }
        }
        counted
    }
}

#[cfg(test)]
mod hold_tests {
    use super::*;
    use std::collections::BTreeSet;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn up_from_the_start_counts_at_once_and_a_return_waits_for_the_hold() {
        let t0 = Instant::now();
        let ms = std::time::Duration::from_millis;
        let known = vec!["eth0".to_string(), "eth1".to_string()];
        let mut hold = InterfaceHold::new(ms(1000));
        assert_eq!(hold.observe(t0, &known, &set(&["eth0"])), set(&["eth0"]));
        // Down: dropped at once.
        assert_eq!(hold.observe(t0 + ms(200), &known, &set(&[])), set(&[]));
        // Back up: held for a second.
        assert_eq!(
            hold.observe(t0 + ms(400), &known, &set(&["eth0"])),
            set(&[])
        );
        assert_eq!(
            hold.observe(t0 + ms(1300), &known, &set(&["eth0"])),
            set(&[])
        );
        // A flap during the hold starts it again.
        assert_eq!(hold.observe(t0 + ms(1350), &known, &set(&[])), set(&[]));
        assert_eq!(
            hold.observe(t0 + ms(1400), &known, &set(&["eth0"])),
            set(&[])
        );
        assert_eq!(
            hold.observe(t0 + ms(2399), &known, &set(&["eth0"])),
            set(&[])
        );
        assert_eq!(
            hold.observe(t0 + ms(2400), &known, &set(&["eth0"])),
            set(&["eth0"])
        );
        // eth1, down from the first observation, also waits once it comes up.
        assert_eq!(
            hold.observe(t0 + ms(2500), &known, &set(&["eth0", "eth1"])),
            set(&["eth0"])
        );
        assert_eq!(
            hold.observe(t0 + ms(3500), &known, &set(&["eth0", "eth1"])),
            set(&["eth0", "eth1"])
        );
    }
}

/// When a starting announcer begins to answer: once its live set has stayed unchanged for the
/// settle time. Agents started together each see themselves alone at first, and would each
/// answer for everything until their membership converges; waiting for a quiet live set keeps
/// a start (or a restart after a crash) from making two nodes answer. Once open it stays open:
/// later changes are failovers, which must not wait. Pure: the caller passes the time.
#[derive(Debug, Clone)]
pub struct StartupSettle {
    settle: std::time::Duration,
    last_change: Option<Instant>,
    open: bool,
}

impl StartupSettle {
    pub fn new(settle: std::time::Duration) -> Self {
        StartupSettle {
            settle,
            last_change: None,
            open: false,
        }
    }

    /// The live set changed (or arrived) at `now`.
    pub fn changed(&mut self, now: Instant) {
        if !self.open {
            self.last_change = Some(now);
        }
    }

    /// Whether answering may start (or go on) at `now`.
    pub fn is_open(&mut self, now: Instant) -> bool {
        if !self.open {
            self.open = self
                .last_change
                .is_some_and(|at| now.saturating_duration_since(at) >= self.settle);
        }
        self.open
    }

    /// When to look again, while still closed and a live set has arrived.
    pub fn next_check(&self) -> Option<Instant> {
        if self.open {
            return None;
        }
        self.last_change.map(|at| at + self.settle)
    }
}

#[cfg(test)]
mod settle_tests {
    use super::*;

    #[test]
    fn opens_after_a_quiet_live_set_and_stays_open() {
        let t0 = Instant::now();
        let ms = std::time::Duration::from_millis;
        let mut settle = StartupSettle::new(ms(1000));
        assert!(!settle.is_open(t0), "no live set yet");
        assert_eq!(settle.next_check(), None);
        settle.changed(t0);
        assert!(!settle.is_open(t0 + ms(600)));
        settle.changed(t0 + ms(700));
        assert_eq!(settle.next_check(), Some(t0 + ms(1700)));
        assert!(!settle.is_open(t0 + ms(1699)));
        assert!(settle.is_open(t0 + ms(1700)));
        // Failovers later do not close it.
        settle.changed(t0 + ms(1800));
        assert!(settle.is_open(t0 + ms(1801)));
        assert_eq!(settle.next_check(), None);
    }
}

/// When a changed table of what this node announces is written to the API (its
/// `ServiceL2Status` records and the takeover Events): once it has stayed unchanged for
/// `quiet`, and no later than `longest` after the first change not yet written. A liveness flap
/// shorter than `quiet` (a stalled peer, a busy machine) then writes nothing at all, where
/// writing each table would cost a record and an Event per Service moved, twice; a steady
/// stream of changes is still written every `longest`. The ARP answers never wait for this.
/// Pure: the caller passes the time.
#[derive(Debug, Clone)]
pub struct WriteSettle {
    quiet: std::time::Duration,
    longest: std::time::Duration,
    /// The first and the last change not yet written.
    pending: Option<(Instant, Instant)>,
}

impl WriteSettle {
    pub fn new(quiet: std::time::Duration, longest: std::time::Duration) -> Self {
        WriteSettle {
            quiet,
            longest: longest.max(quiet),
            pending: None,
        }
    }

    /// The table changed at `now`.
    pub fn changed(&mut self, now: Instant) {
        self.pending = Some(match self.pending {
            Some((first, _)) => (first, now),
            None => (now, now),
        });
    }

    /// When to write, if a change waits.
    pub fn due(&self) -> Option<Instant> {
        self.pending
            .map(|(first, last)| (last + self.quiet).min(first + self.longest))
    }

    /// The table as it is now is being written.
    pub fn written(&mut self) {
        self.pending = None;
    }
}

#[cfg(test)]
mod write_settle_tests {
    use super::*;

    fn ms(n: u64) -> std::time::Duration {
        std::time::Duration::from_millis(n)
    }

    #[test]
    fn nothing_is_due_until_something_changes() {
        let s = WriteSettle::new(ms(1000), ms(5000));
        assert_eq!(s.due(), None);
    }

    #[test]
    fn a_change_is_written_once_quiet_and_each_change_restarts_the_wait() {
        let t0 = Instant::now();
        let mut s = WriteSettle::new(ms(1000), ms(5000));
        s.changed(t0);
        assert_eq!(s.due(), Some(t0 + ms(1000)));
        // A flap: the table changes back 400 ms later; the write waits for the quiet again,
        // and by then the table is what was written before (nothing to write).
        s.changed(t0 + ms(400));
        assert_eq!(s.due(), Some(t0 + ms(1400)));
        s.written();
        assert_eq!(s.due(), None);
    }

    #[test]
    fn a_stream_of_changes_is_still_written_every_longest() {
        let t0 = Instant::now();
        let mut s = WriteSettle::new(ms(1000), ms(5000));
        for i in 0..100 {
            s.changed(t0 + ms(300 * i));
            assert!(
                s.due().is_some_and(|due| due <= t0 + ms(5000)),
                "change {i}"
            );
        }
        assert_eq!(s.due(), Some(t0 + ms(5000)));
        s.written();
        s.changed(t0 + ms(30_000));
        assert_eq!(s.due(), Some(t0 + ms(31_000)));
    }

    #[test]
    fn longest_is_never_shorter_than_quiet() {
        let t0 = Instant::now();
        let mut s = WriteSettle::new(ms(1000), ms(10));
        s.changed(t0);
        assert_eq!(s.due(), Some(t0 + ms(1000)));
    }
}

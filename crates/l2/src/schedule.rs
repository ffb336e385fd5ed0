//! When to send gratuitous announcements after taking an address over: at once, then about
//! every second for five seconds. Linux ignores a second neighbour update within `locktime`
//! (1 s by default), so a burst helps no one; 1.1 s apart keeps each round past the lock even
//! when the previous one was late.

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
}

impl GratuitousSchedule {
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
        self.pending.retain(|ip, (start, sent)| {
            let Some(offset) = GRATUITOUS_ROUNDS.get(*sent) else {
                return false;
            };
            if now >= *start + *offset {
                due.push(*ip);
                // Skip rounds that are already past as well.
                *sent += 1;
                while GRATUITOUS_ROUNDS
                    .get(*sent)
                    .is_some_and(|next| now >= *start + *next)
                {
                    *sent += 1;
                }
            }
            *sent < GRATUITOUS_ROUNDS.len()
        });
        due
    }

    /// When the next round is due, if any.
    pub fn next_due(&self) -> Option<Instant> {
        self.pending
            .values()
            .filter_map(|(start, sent)| GRATUITOUS_ROUNDS.get(*sent).map(|o| *start + *o))
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

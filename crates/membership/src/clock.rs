//! The wall clock membership reads: the system's wall clock once, when first read, then advanced
//! by the monotonic clock. Stamps on datagrams, `renewTime` on this agent's Lease and the moments
//! peers' renewals are seen all come from it, so a step of the system clock (NTP correcting a
//! node that was minutes off) changes nothing until the agent restarts: had the stamps followed
//! the step back, they would have stayed pinned ahead of the clock (a stamp never goes back, so
//! a replay can be told from a new message) and peers, whose estimate of this node's offset
//! follows its `renewTime`, would have refused them as `stale` until the clock caught up. It
//! still runs at the system clock's rate: NTP slews the monotonic clock too.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A wall clock anchored once and advanced by [`Instant`].
#[derive(Debug, Clone, Copy)]
pub struct SteadyClock {
    wall_micros: u64,
    at: Instant,
}

impl SteadyClock {
    /// Anchored at `wall_micros` (microseconds since the Unix epoch) at `at`.
    pub fn new(wall_micros: u64, at: Instant) -> Self {
        SteadyClock { wall_micros, at }
    }

    /// The time at `now`, in microseconds since the Unix epoch; never before the anchor.
    pub fn micros_at(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.at).as_micros();
        self.wall_micros
            .saturating_add(u64::try_from(elapsed).unwrap_or(u64::MAX))
    }
}

/// This process's clock, anchored at its first use.
pub fn process_clock() -> &'static SteadyClock {
    static CLOCK: OnceLock<SteadyClock> = OnceLock::new();
    CLOCK.get_or_init(|| SteadyClock::new(system_micros(), Instant::now()))
}

fn system_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_clock_runs_from_its_anchor_by_the_monotonic_clock_alone() {
        let at = Instant::now();
        let clock = SteadyClock::new(1_800_000_000_000_000, at);
        assert_eq!(clock.micros_at(at), 1_800_000_000_000_000);
        assert_eq!(
            clock.micros_at(at + Duration::from_millis(1500)),
            1_800_000_001_500_000
        );
        // An instant before the anchor reads as the anchor: the clock never goes back.
        let later = SteadyClock::new(5, at + Duration::from_secs(1));
        assert_eq!(later.micros_at(at), 5);
    }

    #[test]
    fn the_process_clock_is_anchored_once_and_follows_the_system_clock() {
        let first = process_clock();
        let second = process_clock();
        assert_eq!(first.micros_at(first.at), second.micros_at(second.at));
        let now = first.micros_at(Instant::now());
        // Within a minute of the system clock (nothing stepped it during the test).
        assert!(now.abs_diff(system_micros()) < 60_000_000, "{now}");
    }
}

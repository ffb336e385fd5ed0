//! When to sync: the pure timing rules of the sync loop, tested with made-up instants.
//!
//! - Changes are synced at most once per `min_interval`, and a sync starts no sooner than
//!   [`COST_SPACING`] times the previous sync's duration after the previous one started, so under
//!   constant churn at most a quarter of a core goes to syncing however large the ruleset is.
//!   A burst waits and is coalesced. One exception: while syncs of changes have used less than
//!   their quarter share of the recent past (each one's cost, times [`COST_SPACING`], charged to
//!   a clock of the share used, which may run at most [`COST_BURST`] ahead: a generic cell rate
//!   algorithm), the next goes at the floor. So the second of two close changes after a quiet
//!   spell (a Service created, then its status written by the controller) is not held four
//!   times the first one's cost, and the allowance, once spent, leaves the spacing as it was. kube-proxy spaces syncs by a fixed 1 s; spacing by cost lets a small or cheap change
//!   through in a few hundred milliseconds, and a slow backend slows itself down.
//! - A full-consistency sync runs when `period` has passed since the last full one: every Service
//!   is planned again and every chain whose content differs from what was applied (or whose
//!   canary is gone) is rewritten. Rewriting every chain regardless is due once per
//!   [`REWRITE_PERIOD`], as kube-proxy does: a rewrite of tens of thousands of rules takes seconds,
//!   and changes wait behind it.
//! - After a failure the next attempt waits an exponential backoff (from [`RETRY_INITIAL`], at
//!   most `period`), whether or not anything changed; the Syncer makes that attempt full.

use std::time::{Duration, Instant};

pub const RETRY_INITIAL: Duration = Duration::from_millis(500);

/// How often a periodic sync rewrites every chain rather than the ones that differ
/// (kube-proxy's `FullSyncPeriod`).
pub const REWRITE_PERIOD: Duration = Duration::from_secs(3600);

/// What one sync covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncScope {
    /// Plan every Service again, not only the changed ones.
    pub replan: bool,
    /// Rewrite every chain, not only those that differ from what was applied.
    pub rewrite: bool,
}

/// A sync that took `d` is followed by the next no sooner than `COST_SPACING × d` after it
/// started: syncing takes at most 1/`COST_SPACING` of the agent's time.
pub const COST_SPACING: u32 = 4;

/// How far syncs of changes may run ahead of their share ([`COST_SPACING`]) before they are
/// spaced: about two syncs of a 1,000-Service node in a debug build under load.
pub const COST_BURST: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncReason {
    /// Nothing synced yet.
    Initial,
    Changes,
    Periodic,
    Retry,
}

#[derive(Debug, Clone)]
pub struct SyncSchedule {
    min_interval: Duration,
    period: Duration,
    last_attempt: Option<Instant>,
    /// How long the last sync of changes took.
    last_cost: Duration,
    /// Until when syncs of changes have used their share of time: each one's start (or this,
    /// if later) plus [`COST_SPACING`] times its cost. A full sync's cost is not counted: it is
    /// rare (once per period), and changes waiting behind it should not wait four times longer.
    share_used_until: Option<Instant>,
    last_full: Option<Instant>,
    last_rewrite: Option<Instant>,
    failures: u32,
}

impl SyncSchedule {
    pub fn new(min_interval: Duration, period: Duration) -> Self {
        SyncSchedule {
            min_interval,
            period,
            last_attempt: None,
            last_cost: Duration::ZERO,
            share_used_until: None,
            last_full: None,
            last_rewrite: None,
            failures: 0,
        }
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The wait after `failures` consecutive failures.
    pub fn backoff(&self) -> Duration {
        let exponent = self.failures.saturating_sub(1).min(16);
        RETRY_INITIAL
            .saturating_mul(1 << exponent)
            .min(self.period.max(RETRY_INITIAL))
    }

    /// When the next sync is due (never before `now`) and why, given whether changes wait.
    pub fn next_sync(&self, now: Instant, pending: bool) -> (Instant, SyncReason) {
        let Some(last) = self.last_attempt else {
            return (now, SyncReason::Initial);
        };
        let floor = last + self.min_interval;
        let spaced = last + self.last_cost.saturating_mul(COST_SPACING);
        let share = self
            .share_used_until
            .map_or(floor, |until| until.checked_sub(COST_BURST).unwrap_or(last));
        let earliest = floor.max(spaced.min(share));
        if self.failures > 0 {
            return (
                (last + self.backoff()).max(earliest).max(now),
                SyncReason::Retry,
            );
        }
        let periodic = (self.last_full.unwrap_or(last) + self.period).max(earliest);
        if pending {
            let changes = earliest.max(now);
            if changes < periodic {
                return (changes, SyncReason::Changes);
            }
        }
        (periodic.max(now), SyncReason::Periodic)
    }

    /// What a sync for `reason` starting at `now` covers. A retry plans only what changed: the
    /// Syncer rewrites everything after a failure by itself.
    pub fn scope(&self, reason: SyncReason, now: Instant) -> SyncScope {
        match reason {
            SyncReason::Initial => SyncScope {
                replan: true,
                rewrite: true,
            },
            SyncReason::Periodic => SyncScope {
                replan: true,
                rewrite: self
                    .last_rewrite
                    .is_none_or(|at| now.saturating_duration_since(at) >= REWRITE_PERIOD),
            },
            SyncReason::Changes | SyncReason::Retry => SyncScope {
                replan: false,
                rewrite: false,
            },
        }
    }

    /// Records an attempt that began at `now` and took `cost`.
    pub fn record(&mut self, now: Instant, cost: Duration, reason: SyncReason, ok: bool) {
        let rewrote = self.scope(reason, now).rewrite;
        self.last_attempt = Some(now);
        if reason == SyncReason::Changes {
            self.last_cost = cost;
            let from = self.share_used_until.map_or(now, |until| until.max(now));
            self.share_used_until = Some(from + cost.saturating_mul(COST_SPACING));
        }
        if ok {
            self.failures = 0;
            // A retry after a failure is full too (the Syncer forces it).
            if reason != SyncReason::Changes {
                self.last_full = Some(now);
            }
            if rewrote {
                self.last_rewrite = Some(now);
            }
        } else {
            self.failures = self.failures.saturating_add(1);
        }
    }
}

/// Healthy while the last successful sync (or start-up, before the first) is at most two sync
/// periods old.
pub fn is_healthy(last_success_or_start: Instant, now: Instant, period: Duration) -> bool {
    now.saturating_duration_since(last_success_or_start) <= period.saturating_mul(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(1);
    const PERIOD: Duration = Duration::from_secs(30);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn first_sync_is_immediate_and_full() {
        let t0 = Instant::now();
        let schedule = SyncSchedule::new(MIN, PERIOD);
        assert_eq!(schedule.next_sync(t0, false), (t0, SyncReason::Initial));
    }

    #[test]
    fn changes_wait_for_the_min_interval_and_coalesce() {
        let t0 = Instant::now();
        let mut schedule = SyncSchedule::new(MIN, PERIOD);
        schedule.record(t0, ms(0), SyncReason::Initial, true);
        // A change 100 ms later waits until a second after the last sync.
        assert_eq!(
            schedule.next_sync(t0 + ms(100), true),
            (t0 + MIN, SyncReason::Changes)
        );
        // Long after, it runs at once.
        assert_eq!(
            schedule.next_sync(t0 + ms(5000), true),
            (t0 + ms(5000), SyncReason::Changes)
        );
    }

    #[test]
    fn an_expensive_sync_spaces_the_next_by_its_cost() {
        let t0 = Instant::now();
        let mut schedule = SyncSchedule::new(ms(100), PERIOD);
        schedule.record(t0, ms(20), SyncReason::Initial, true);
        // Cheap: the floor decides.
        assert_eq!(
            schedule.next_sync(t0 + ms(10), true),
            (t0 + ms(100), SyncReason::Changes)
        );
        // 300 ms of work after a quiet spell: 4 × 300 ms of share used, of which the burst
        // allowance forgives 1 s, so the next waits only 200 ms past the floor.
        schedule.record(t0 + ms(100), ms(300), SyncReason::Changes, true);
        assert_eq!(
            schedule.next_sync(t0 + ms(150), true),
            (t0 + ms(300), SyncReason::Changes)
        );
        // Another 300 ms at once: the allowance is spent, the next waits its full 4 × 300 ms.
        schedule.record(t0 + ms(300), ms(300), SyncReason::Changes, true);
        assert_eq!(
            schedule.next_sync(t0 + ms(600), true),
            (t0 + ms(1500), SyncReason::Changes)
        );
        // The periodic consistency sync is spaced the same way.
        assert_eq!(
            schedule.next_sync(t0 + ms(400), false),
            (t0 + PERIOD, SyncReason::Periodic)
        );
        // A full sync's own cost does not hold changes back.
        let mut after_full = SyncSchedule::new(ms(100), PERIOD);
        after_full.record(t0, ms(2000), SyncReason::Initial, true);
        assert_eq!(
            after_full.next_sync(t0 + ms(2000), true),
            (t0 + ms(2000), SyncReason::Changes)
        );
        // Once the share has caught up, a cheap sync is followed at the floor.
        schedule.record(t0 + ms(3000), ms(10), SyncReason::Changes, true);
        assert_eq!(
            schedule.next_sync(t0 + ms(3010), true),
            (t0 + ms(3100), SyncReason::Changes)
        );
    }

    #[test]
    fn a_change_right_after_another_is_not_held_by_the_first_ones_cost() {
        let t0 = Instant::now();
        let mut schedule = SyncSchedule::new(ms(100), PERIOD);
        schedule.record(t0, ms(20), SyncReason::Initial, true);
        // A Service created at 10 s (180 ms to sync), its status written 50 ms later: the
        // second sync starts at the floor, not 4 × 180 ms after the first.
        let created = t0 + ms(10_000);
        schedule.record(created, ms(180), SyncReason::Changes, true);
        assert_eq!(
            schedule.next_sync(created + ms(180), true),
            (created + ms(180), SyncReason::Changes)
        );
    }

    #[test]
    fn a_spent_allowance_is_not_paid_back_later() {
        let t0 = Instant::now();
        let mut schedule = SyncSchedule::new(ms(100), PERIOD);
        schedule.record(t0, ms(0), SyncReason::Initial, true);
        // Expensive syncs back to back put the share clock seconds ahead...
        let mut now = t0 + ms(1000);
        for _ in 0..5 {
            schedule.record(now, ms(500), SyncReason::Changes, true);
            now = schedule.next_sync(now + ms(500), true).0;
        }
        // ...yet after a cheap one the next waits only four times its cost, as before the
        // allowance existed: a burst of Services is not held back for what came before it.
        schedule.record(now, ms(50), SyncReason::Changes, true);
        assert_eq!(
            schedule.next_sync(now + ms(50), true),
            (now + ms(200), SyncReason::Changes)
        );
    }

    #[test]
    fn constant_churn_gets_at_most_its_share_plus_the_burst() {
        // Changes always waiting; each sync costs `cost`: over a minute, syncing takes at most
        // 1/COST_SPACING of the time, plus what the burst allowance lends once.
        for cost in [1, 10, 50, 100, 180, 250, 400, 1000, 3000] {
            for min in [0, 100, 1000] {
                let t0 = Instant::now();
                let mut schedule = SyncSchedule::new(ms(min), Duration::from_secs(3600));
                schedule.record(t0, ms(0), SyncReason::Initial, true);
                let mut now = t0;
                let mut busy = Duration::ZERO;
                while now < t0 + ms(60_000) {
                    let (at, reason) = schedule.next_sync(now, true);
                    assert_eq!(reason, SyncReason::Changes);
                    assert!(at >= now);
                    schedule.record(at, ms(cost), reason, true);
                    busy += ms(cost);
                    now = at + ms(cost);
                }
                let elapsed = now - t0;
                let allowed = elapsed / COST_SPACING + COST_BURST / COST_SPACING + ms(cost);
                assert!(
                    busy <= allowed,
                    "cost {cost} ms, floor {min} ms: busy {busy:?} of {elapsed:?}"
                );
            }
        }
    }

    #[test]
    fn without_changes_the_next_sync_is_the_periodic_one() {
        let t0 = Instant::now();
        let mut schedule = SyncSchedule::new(MIN, PERIOD);
        schedule.record(t0, ms(0), SyncReason::Initial, true);
        schedule.record(t0 + ms(2000), ms(0), SyncReason::Changes, true);
        // Counted from the last full sync, not the last partial one.
        assert_eq!(
            schedule.next_sync(t0 + ms(2500), false),
            (t0 + PERIOD, SyncReason::Periodic)
        );
        // Past due: now.
        let late = t0 + PERIOD + ms(1);
        assert_eq!(
            schedule.next_sync(late, false),
            (late, SyncReason::Periodic)
        );
        // Changes that come due with the periodic sync are folded into it.
        assert_eq!(schedule.next_sync(late, true), (late, SyncReason::Periodic));
    }

    #[test]
    fn periodic_syncs_rewrite_everything_once_per_rewrite_period() {
        let t0 = Instant::now();
        let mut schedule = SyncSchedule::new(MIN, PERIOD);
        let everything = SyncScope {
            replan: true,
            rewrite: true,
        };
        assert_eq!(schedule.scope(SyncReason::Initial, t0), everything);
        schedule.record(t0, ms(5000), SyncReason::Initial, true);
        // Thirty seconds on: every Service planned again, only drifted chains rewritten.
        let periodic = t0 + PERIOD;
        assert_eq!(
            schedule.scope(SyncReason::Periodic, periodic),
            SyncScope {
                replan: true,
                rewrite: false
            }
        );
        schedule.record(periodic, ms(300), SyncReason::Periodic, true);
        // An hour after the last rewrite, the periodic sync rewrites everything again.
        let hour = t0 + REWRITE_PERIOD;
        assert_eq!(schedule.scope(SyncReason::Periodic, hour), everything);
        schedule.record(hour, ms(5000), SyncReason::Periodic, true);
        assert!(!schedule.scope(SyncReason::Periodic, hour + PERIOD).rewrite);
        // Changes and retries plan only what changed.
        for reason in [SyncReason::Changes, SyncReason::Retry] {
            assert_eq!(
                schedule.scope(reason, hour),
                SyncScope {
                    replan: false,
                    rewrite: false
                }
            );
        }
    }

    #[test]
    fn failures_back_off_exponentially_up_to_the_period() {
        let t0 = Instant::now();
        let mut schedule = SyncSchedule::new(ms(100), Duration::from_secs(4));
        schedule.record(t0, ms(0), SyncReason::Initial, false);
        assert_eq!(schedule.backoff(), ms(500));
        assert_eq!(
            schedule.next_sync(t0, false),
            (t0 + ms(500), SyncReason::Retry)
        );
        let mut waits = Vec::new();
        let mut now = t0;
        for _ in 0..5 {
            let (at, reason) = schedule.next_sync(now, true);
            assert_eq!(reason, SyncReason::Retry);
            waits.push(at - now);
            now = at;
            schedule.record(now, ms(0), reason, false);
        }
        assert_eq!(waits, vec![ms(500), ms(1000), ms(2000), ms(4000), ms(4000)]);
        schedule.record(now, ms(0), SyncReason::Retry, true);
        assert_eq!(schedule.failures(), 0);
        // A successful retry was full: the periodic clock restarts from it.
        assert_eq!(
            schedule.next_sync(now, false),
            (now + Duration::from_secs(4), SyncReason::Periodic)
        );
    }

    #[test]
    fn backoff_respects_the_min_interval() {
        let t0 = Instant::now();
        let mut schedule = SyncSchedule::new(ms(2000), Duration::from_secs(30));
        schedule.record(t0, ms(0), SyncReason::Initial, false);
        assert_eq!(
            schedule.next_sync(t0, true),
            (t0 + ms(2000), SyncReason::Retry)
        );
    }

    #[test]
    fn health_allows_two_periods() {
        let t0 = Instant::now();
        let period = Duration::from_secs(10);
        assert!(is_healthy(t0, t0, period));
        assert!(is_healthy(t0, t0 + Duration::from_secs(20), period));
        assert!(!is_healthy(t0, t0 + Duration::from_secs(21), period));
        // A clock reading before the last success is not a failure.
        assert!(is_healthy(t0 + period, t0, period));
    }
}

/// The agent's health as `/healthz` and the health-check node ports see it. Clones share it.
#[derive(Debug, Clone)]
pub struct AgentHealth {
    period: Duration,
    last_success_or_start: std::sync::Arc<std::sync::Mutex<Instant>>,
    /// The Node is not being deleted (see [`node_eligible`]); true until the Node is seen.
    node_eligible: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Whether load balancers may keep sending to this node, as kube-proxy's `/healthz` says since
/// KEP-3836: not when the Node is being deleted or the cluster autoscaler has tainted it
/// `ToBeDeletedByClusterAutoscaler`.
pub fn node_eligible(node: &k8s_openapi::api::core::v1::Node) -> bool {
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| {
            taints
                .iter()
                .any(|t| t.key == berth_api::names::taint::TO_BE_DELETED_BY_CLUSTER_AUTOSCALER)
        });
    node.metadata.deletion_timestamp.is_none() && !tainted
}

impl AgentHealth {
    pub fn new(period: Duration, started: Instant) -> Self {
        AgentHealth {
            period,
            last_success_or_start: std::sync::Arc::new(std::sync::Mutex::new(started)),
            node_eligible: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true)),
        }
    }

    /// The flag the Node watch keeps (see [`crate::index::Index::with_node_eligibility`]).
    pub fn node_eligibility(&self) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
        self.node_eligible.clone()
    }

    pub fn is_node_eligible(&self) -> bool {
        self.node_eligible
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn record_success(&self, at: Instant) {
        let mut last = self
            .last_success_or_start
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *last = (*last).max(at);
    }

    pub fn is_healthy(&self) -> bool {
        let last = *self
            .last_success_or_start
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        is_healthy(last, Instant::now(), self.period)
    }
}

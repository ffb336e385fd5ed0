//! Leader election on a coordination.k8s.io Lease, as client-go does it: acquire when the
//! Lease is free or expired, renew every retry period, stop leading when renewals fail for
//! the renew deadline (shorter than the lease duration, so the old leader has stopped
//! before anyone may take over), and hand the Lease back on shutdown. The decision is a pure
//! function; the loop around it is thin.
//!
//! Expiry is client-go's observed-time rule: a Lease held by another replica is expired when
//! it has not *changed* for its duration, by this replica's own clock ([`Observed`]). The
//! holder's `renewTime` is never compared with the local clock, so a standby whose clock is
//! ahead cannot take over from a healthy leader, nor a leader whose clock is behind keep a
//! dead claim alive. The price, as in client-go: a standby that starts waits one full lease
//! duration before it may take over a Lease it has never seen change.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::LeaseConfig;
use crate::Error;

/// What to do with the Lease on this attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseAction {
    /// It does not exist: create it, holding it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Free or expired: take it over.
    TakeOver,
    /// Someone else holds it and their claim is current.
    Wait { holder: String },
}

/// The Lease as this replica last saw it, and when it last saw it change, by its own clock.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    record: Option<LeaseSpec>,
    since: Option<Instant>,
}

impl Observed {
    /// Records the Lease as read at `now` (`None`: absent); any change restarts the clock.
    pub fn observe(&mut self, spec: Option<&LeaseSpec>, now: Instant) {
        let changed = self.since.is_none() || self.record.as_ref() != spec;
        if changed {
            self.record = spec.cloned();
            self.since = Some(now);
        }
    }

    /// When the Lease last changed, by this replica's clock.
    pub fn since(&self) -> Option<Instant> {
        self.since
    }
}

/// Decides from the Lease as read (`None`: absent), observed as `observed`, at `now` (this
/// replica's clock). A Lease without its own duration counts with `default_duration`.
pub fn decide_lease(
    spec: Option<&LeaseSpec>,
    me: &str,
    observed: &Observed,
    now: Instant,
    default_duration: Duration,
) -> LeaseAction {
    let Some(spec) = spec else {
        return LeaseAction::Create;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() {
        return LeaseAction::TakeOver;
    }
    if holder == me {
        return LeaseAction::Renew;
    }
    let duration = spec
        .lease_duration_seconds
        .map(|s| Duration::from_secs(u64::try_from(s.max(0)).unwrap_or(0)))
        .unwrap_or(default_duration);
    // A holder that never wrote a time holds nothing.
    if spec.renew_time.is_none() && spec.acquire_time.is_none() {
        return LeaseAction::TakeOver;
    }
    let since = observed.since().unwrap_or(now);
    if now < since + duration {
        LeaseAction::Wait {
            holder: holder.to_string(),
        }
    } else {
        LeaseAction::TakeOver
    }
}

/// When an attempt must have an answer: a leader by its renew deadline, counted from its last
/// successful renewal (a hung request must not keep it leading while a standby takes over);
/// anyone else within one renew deadline.
pub fn attempt_limit(
    started: Instant,
    last_renew: Option<Instant>,
    leading: bool,
    cfg: &LeaseConfig,
) -> Instant {
    match last_renew {
        Some(t) if leading => t + cfg.renew_deadline,
        _ => started + cfg.renew_deadline,
    }
}

/// Until when this replica's leadership is certain, on the monotonic clock: the start of its
/// last successful renewal plus the renew deadline. Work that must never overlap a successor's
/// (calls to AWS) checks it before every call and is cut off when it passes, so a replica
/// that was partitioned, or paused and woken, stops before the election loop has even run
/// again; a standby cannot take over before the lease duration, which is longer. Shared by
/// cloning; without leader election it never ends.
#[derive(Debug, Clone)]
pub struct Term(Arc<Mutex<TermState>>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TermState {
    Ended,
    Until(tokio::time::Instant),
    Unbounded,
}

impl Default for Term {
    fn default() -> Self {
        Term(Arc::new(Mutex::new(TermState::Ended)))
    }
}

impl Term {
    fn set(&self, state: TermState) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = state;
    }

    /// Leads until told otherwise (no leader election).
    pub fn extend_unbounded(&self) {
        self.set(TermState::Unbounded);
    }

    /// Leading is certain until `until`.
    pub fn extend(&self, until: tokio::time::Instant) {
        self.set(TermState::Until(until));
    }

    /// Leading is over (lost, or about to hand the Lease back).
    pub fn end(&self) {
        self.set(TermState::Ended);
    }

    /// `Some(deadline)` while leading is certain (`None` once it is not); without leader
    /// election, a deadline a day ahead, renewed at every call.
    pub fn valid_until(&self, now: tokio::time::Instant) -> Option<tokio::time::Instant> {
        match *self.0.lock().unwrap_or_else(|e| e.into_inner()) {
            TermState::Ended => None,
            TermState::Until(t) => (t > now).then_some(t),
            TermState::Unbounded => Some(now + Duration::from_secs(86_400)),
        }
    }
}

/// Runs the election until shutdown, publishing whether this replica leads.
pub struct LeaderElector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    term: Term,
    observed: Mutex<Observed>,
}

impl LeaderElector {
    /// `cfg` as [`crate::ControllerOptions::validate`] checked it.
    pub fn new(client: Client, cfg: LeaseConfig) -> Self {
        Self {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            term: Term::default(),
            observed: Mutex::new(Observed::default()),
        }
    }

    /// Publishes the term's deadline into `term` as renewals succeed.
    pub fn with_term(mut self, term: Term) -> Self {
        self.term = term;
        self
    }

    /// Attempts every retry period; `leading` follows the outcome. On shutdown the flag drops
    /// first (nothing more is written) and then a held Lease is handed back, so a standby
    /// takes over at once instead of after the lease duration.
    pub async fn run(self, leading: watch::Sender<bool>, shutdown: CancellationToken) {
        let mut last_renew: Option<Instant> = None;
        loop {
            // The Lease records the time the attempt started, so that is when the claim
            // began; counting from the answer would let a slow answer stretch it past the
            // moment a standby may take over.
            let started = Instant::now();
            let limit = attempt_limit(started, last_renew, *leading.borrow(), &self.cfg);
            let attempt = tokio::time::timeout_at(limit.into(), self.try_acquire_or_renew()).await;
            let result = attempt.unwrap_or_else(|_| {
                Err(Error::Lease(
                    "no answer from the API server before the renew deadline".into(),
                ))
            });
            match result {
                Ok(true) => {
                    last_renew = Some(started);
                    self.term.extend((started + self.cfg.renew_deadline).into());
                    if !*leading.borrow() {
                        tracing::info!(identity = %self.cfg.identity, lease = %self.cfg.name, "became leader");
                    }
                    leading.send_replace(true);
                }
                Ok(false) => {
                    last_renew = None;
                    self.term.end();
                    if leading.send_replace(false) {
                        tracing::warn!(identity = %self.cfg.identity, "lost the lease to another replica");
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "lease attempt failed");
                    let expired = last_renew.is_none_or(|t| t.elapsed() >= self.cfg.renew_deadline);
                    if expired {
                        self.term.end();
                    }
                    if expired && leading.send_replace(false) {
                        tracing::warn!(identity = %self.cfg.identity, "renew deadline passed; stopped leading");
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(self.cfg.retry_period) => {}
            }
        }
        // Over before the Lease is handed back: a standby may take over at once.
        self.term.end();
        if leading.send_replace(false) {
            if let Err(e) = self.release().await {
                tracing::warn!(error = %e, "releasing the lease failed; a standby takes over when it expires");
            } else {
                tracing::info!(identity = %self.cfg.identity, "released the lease");
            }
        }
    }

    /// One attempt; `Ok(true)` when this replica holds the Lease afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, Error> {
        let current = self
            .api
            .get_opt(&self.cfg.name)
            .await
            .map_err(|e| Error::kube("reading the lease", e))?;
        let now = Timestamp::now();
        let spec = current.as_ref().and_then(|l| l.spec.as_ref());
        let action = {
            let mut observed = self
                .observed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let local = Instant::now();
            observed.observe(spec, local);
            decide_lease(
                spec,
                &self.cfg.identity,
                &observed,
                local,
                self.cfg.lease_duration,
            )
        };
        let secs = i32::try_from(self.cfg.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let result = match (action, current) {
            (LeaseAction::Wait { .. }, _) => return Ok(false),
            (LeaseAction::Create, _) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.cfg.name.clone()),
                        namespace: Some(self.cfg.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.cfg.identity.clone()),
                        lease_duration_seconds: Some(secs),
                        acquire_time: Some(MicroTime(now)),
                        renew_time: Some(MicroTime(now)),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            (action, Some(mut lease)) => {
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                if action == LeaseAction::TakeOver {
                    spec.holder_identity = Some(self.cfg.identity.clone());
                    spec.acquire_time = Some(MicroTime(now));
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.lease_duration_seconds = Some(secs);
                spec.renew_time = Some(MicroTime(now));
                // The resourceVersion read above makes this a compare-and-swap: of two
                // replicas racing for an expired Lease, one gets 409.
                self.api
                    .replace(&self.cfg.name, &PostParams::default(), &lease)
                    .await
            }
            (_, None) => return Ok(false),
        };
        match result {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(Error::kube("writing the lease", e)),
        }
    }

    /// Hands the Lease back if this replica holds it.
    pub async fn release(&self) -> Result<(), Error> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.cfg.name)
            .await
            .map_err(|e| Error::kube("reading the lease", e))?
        else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        self.api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
            .map(|_| ())
            .map_err(|e| Error::kube("releasing the lease", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn mk_spec(holder: Option<&str>, renewed: i64, secs: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            renew_time: Some(MicroTime(at(renewed))),
            lease_duration_seconds: Some(secs),
            ..LeaseSpec::default()
        }
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    const D: Duration = Duration::from_secs(15);

    #[test]
    fn a_leader_must_be_answered_by_its_renew_deadline() {
        let cfg = LeaseConfig::new("kube-system", "a");
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(4);
        assert_eq!(
            attempt_limit(later, Some(t0), true, &cfg),
            t0 + cfg.renew_deadline
        );
        assert_eq!(
            attempt_limit(later, Some(t0), false, &cfg),
            later + cfg.renew_deadline
        );
        assert_eq!(
            attempt_limit(later, None, false, &cfg),
            later + cfg.renew_deadline
        );
    }

    #[test]
    fn absent_lease_is_created() {
        let t0 = Instant::now();
        let mut seen = Observed::default();
        seen.observe(None, t0);
        assert_eq!(decide_lease(None, "a", &seen, t0, D), LeaseAction::Create);
    }

    #[test]
    fn own_lease_is_renewed_even_when_expired() {
        let t0 = Instant::now();
        let s = mk_spec(Some("a"), 0, 15);
        let mut seen = Observed::default();
        seen.observe(Some(&s), t0);
        assert_eq!(
            decide_lease(Some(&s), "a", &seen, t0 + secs(100), D),
            LeaseAction::Renew
        );
    }

    #[test]
    fn others_claim_is_respected_until_it_has_not_changed_for_its_duration() {
        let t0 = Instant::now();
        let mut seen = Observed::default();
        let s = mk_spec(Some("b"), 0, 15);
        seen.observe(Some(&s), t0);
        assert_eq!(
            decide_lease(Some(&s), "a", &seen, t0 + secs(14), D),
            LeaseAction::Wait { holder: "b".into() }
        );
        // Renewed (the record changed) at t0 + 10: another full duration from then.
        let renewed = mk_spec(Some("b"), 10, 15);
        seen.observe(Some(&renewed), t0 + secs(10));
        assert_eq!(
            decide_lease(Some(&renewed), "a", &seen, t0 + secs(24), D),
            LeaseAction::Wait { holder: "b".into() }
        );
        // Read again unchanged: the clock keeps running from the change.
        seen.observe(Some(&renewed), t0 + secs(20));
        assert_eq!(
            decide_lease(Some(&renewed), "a", &seen, t0 + secs(25), D),
            LeaseAction::TakeOver
        );
    }

    /// Clock skew: the holder's renewTime says nothing about expiry. A leader whose clock is
    /// an hour behind (its renewTime looks an hour old) keeps the Lease while it renews; one
    /// whose clock is an hour ahead cannot keep a dead claim alive.
    #[test]
    fn a_skewed_clock_neither_steals_a_live_lease_nor_keeps_a_dead_one() {
        let t0 = Instant::now();
        let mut seen = Observed::default();
        for i in 0..10u64 {
            // The leader renews every 2 s, its clock 3600 s behind the standby's.
            let s = mk_spec(Some("b"), (2 * i) as i64 - 3600, 15);
            seen.observe(Some(&s), t0 + secs(2 * i));
            assert_eq!(
                decide_lease(Some(&s), "a", &seen, t0 + secs(2 * i + 1), D),
                LeaseAction::Wait { holder: "b".into() },
                "renewal {i}"
            );
        }
        // A leader an hour ahead that died: its renewTime is in the standby's future, yet the
        // Lease is taken over once it has not changed for its duration.
        let mut seen = Observed::default();
        let s = mk_spec(Some("b"), 3600, 15);
        seen.observe(Some(&s), t0);
        assert_eq!(
            decide_lease(Some(&s), "a", &seen, t0 + secs(15), D),
            LeaseAction::TakeOver
        );
    }

    #[test]
    fn released_or_timeless_leases_are_free() {
        let t0 = Instant::now();
        let mut seen = Observed::default();
        let s = mk_spec(None, 0, 15);
        seen.observe(Some(&s), t0);
        assert_eq!(
            decide_lease(Some(&s), "a", &seen, t0 + secs(1), D),
            LeaseAction::TakeOver
        );
        let s = LeaseSpec {
            holder_identity: Some("b".into()),
            ..LeaseSpec::default()
        };
        seen.observe(Some(&s), t0);
        assert_eq!(
            decide_lease(Some(&s), "a", &seen, t0 + secs(1), D),
            LeaseAction::TakeOver
        );
    }
}

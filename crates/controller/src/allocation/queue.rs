//! Which Service the loop decides next: the dirty queue, the Services whose writes are in
//! flight, retries with backoff, and the watch echoes of berth's own writes. Pure: the loop
//! feeds it watch changes and job outcomes and asks for the next key.
//!
//! An echo is a watch change whose resourceVersion one of berth's own writes produced. Deciding
//! it again would find nothing to write, so it is not marked; a change with any other
//! resourceVersion — including one that landed between two of berth's writes — is.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use berth_ipam::ServiceKey;

use crate::allocation::write::JobOutcome;
use crate::error::{ErrorCategory, Retry};

const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// After a 409 the newer object is already on its way through the watch.
const CONFLICT_RETRY: Duration = Duration::from_millis(50);
const PROVIDER_RETRY_MIN: Duration = Duration::from_secs(5);
const PROVIDER_RETRY_MAX: Duration = Duration::from_secs(300);

/// The wait before attempt `attempt` (1 for the first retry) after an error of `category`.
pub(crate) fn retry_delay(category: ErrorCategory, attempt: u32) -> Duration {
    match (category, category.retry()) {
        (_, Retry::AtOnce) => CONFLICT_RETRY,
        // Load balancers back off as the cloud-controller-manager does.
        (ErrorCategory::Provider, _) => PROVIDER_RETRY_MIN
            .saturating_mul(1u32 << attempt.min(6))
            .min(PROVIDER_RETRY_MAX),
        (_, Retry::Backoff | Retry::Never) => RETRY_MIN
            .saturating_mul(1u32 << attempt.min(12))
            .min(RETRY_MAX),
    }
}

/// The echoes a Service's landed writes still owe: until they arrive, the cached object is
/// older than what berth wrote, and a decision made from it would see the status as it was
/// before (naming an address just cleared, say) and find nothing to write.
#[derive(Debug, Default)]
struct Echoes {
    pending: Vec<String>,
    /// Marked meanwhile: decided once the last echo arrives (or any newer version).
    marked: bool,
}

/// A Service whose writes are in flight.
#[derive(Debug, Default)]
struct InFlight {
    /// resourceVersions the watch showed meanwhile; the outcome tells whose they were.
    seen: Vec<Option<String>>,
    /// Marked for another reason meanwhile (a pool changed, space was freed, ...).
    redo: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Queue {
    dirty: VecDeque<ServiceKey>,
    dirty_set: HashSet<ServiceKey>,
    in_flight: HashMap<ServiceKey, InFlight>,
    /// resourceVersions written by the last finished job whose echo has not arrived yet.
    echoes: HashMap<ServiceKey, Echoes>,
    retries: BTreeMap<(Instant, u64), ServiceKey>,
    attempts: HashMap<ServiceKey, u32>,
    seq: u64,
}

impl Queue {
    /// To be decided (again); a Service in flight is decided once its writes finished.
    pub(crate) fn mark(&mut self, key: ServiceKey) {
        if let Some(f) = self.in_flight.get_mut(&key) {
            f.redo = true;
        } else if let Some(e) = self.echoes.get_mut(&key) {
            // Decided from the cache as it is, the Service would be decided from an object
            // older than berth's own writes: wait for them to come back.
            e.marked = true;
        } else if self.dirty_set.insert(key.clone()) {
            self.dirty.push_back(key);
        }
    }

    /// The watch showed `key` at `rv`: marked unless it is the echo of berth's own write.
    pub(crate) fn observe(&mut self, key: ServiceKey, rv: Option<&str>) {
        if let Some(f) = self.in_flight.get_mut(&key) {
            f.seen.push(rv.map(str::to_owned));
            return;
        }
        if let (Some(rv), Some(own)) = (rv, self.echoes.get_mut(&key)) {
            if let Some(i) = own.pending.iter().position(|o| o == rv) {
                // The watch delivers in order: earlier own versions will not come any more.
                own.pending.drain(..=i);
                if own.pending.is_empty() {
                    let marked = own.marked;
                    self.echoes.remove(&key);
                    if marked {
                        self.mark(key);
                    }
                }
                return;
            }
        }
        self.echoes.remove(&key);
        self.mark(key);
    }

    /// Whether the Service is waiting to be decided (now, or once its echoes are back).
    #[cfg(test)]
    pub(crate) fn is_marked(&self, key: &ServiceKey) -> bool {
        self.dirty_set.contains(key) || self.echoes.get(key).is_some_and(|e| e.marked)
    }

    /// The next Service to decide.
    pub(crate) fn pop(&mut self) -> Option<ServiceKey> {
        let key = self.dirty.pop_front()?;
        self.dirty_set.remove(&key);
        Some(key)
    }

    /// Its writes were handed to a job.
    pub(crate) fn started(&mut self, key: ServiceKey) {
        self.echoes.remove(&key);
        self.in_flight.insert(key, InFlight::default());
    }

    /// A decision found nothing to write: whatever failed before has healed.
    pub(crate) fn settled(&mut self, key: &ServiceKey) {
        self.attempts.remove(key);
    }

    /// Its job ended at `now`. Returns the error category when it failed; it is retried when
    /// the category says so, else decided again only once the Service changes.
    pub(crate) fn finished(
        &mut self,
        key: &ServiceKey,
        outcome: JobOutcome,
        now: Instant,
    ) -> Option<ErrorCategory> {
        let f = self.in_flight.remove(key).unwrap_or_default();
        let mut again = f.redo;
        let retry = match outcome {
            JobOutcome::Done { written } => {
                self.attempts.remove(key);
                again |= f
                    .seen
                    .iter()
                    .any(|rv| rv.as_ref().is_none_or(|rv| !written.contains(rv)));
                let pending: Vec<String> = written
                    .into_iter()
                    .filter(|w| !f.seen.iter().any(|rv| rv.as_ref() == Some(w)))
                    .collect();
                if !pending.is_empty() {
                    // Decided again (`again`) only once the cache has seen these writes.
                    let marked = std::mem::take(&mut again);
                    self.echoes.insert(key.clone(), Echoes { pending, marked });
                }
                None
            }
            JobOutcome::Gone => {
                self.attempts.remove(key);
                again |= !f.seen.is_empty();
                None
            }
            // Leadership dropped while the job ran. When it comes back before the term
            // notices (a renewal that missed its deadline, then a quick re-acquire), the
            // term goes on and nothing else would decide the Service again; when the term
            // ends, the retry goes with it.
            JobOutcome::NotLeading => {
                self.attempts.remove(key);
                again |= !f.seen.is_empty();
                self.seq += 1;
                self.retries
                    .insert((now + RETRY_MIN, self.seq), key.clone());
                None
            }
            JobOutcome::Retry { .. } | JobOutcome::Rejected { .. } => {
                let category = match outcome {
                    JobOutcome::Retry { category } => category,
                    _ => ErrorCategory::Conflict,
                };
                again |= !f.seen.is_empty();
                if category.is_retryable() {
                    let n = self.attempts.entry(key.clone()).or_insert(0);
                    *n += 1;
                    let delay = retry_delay(category, *n);
                    self.seq += 1;
                    self.retries.insert((now + delay, self.seq), key.clone());
                }
                Some(category)
            }
        };
        if again {
            self.mark(key.clone());
        }
        retry
    }

    /// The Service is gone: nothing of it is kept.
    pub(crate) fn forget(&mut self, key: &ServiceKey) {
        self.attempts.remove(key);
        self.echoes.remove(key);
    }

    pub(crate) fn next_retry(&self) -> Option<Instant> {
        self.retries.keys().next().map(|(t, _)| *t)
    }

    /// Marks every Service whose retry is due at `now`.
    pub(crate) fn due(&mut self, now: Instant) {
        while let Some(entry) = self.retries.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.mark(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocation::write::Write;

    fn mk_key(name: &str) -> ServiceKey {
        ServiceKey::new("ns".to_string(), name.to_string())
    }

    fn done(rvs: &[&str]) -> JobOutcome {
        JobOutcome::Done {
            written: rvs.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn drain(q: &mut Queue) -> Vec<String> {
        std::iter::from_fn(|| q.pop()).map(|k| k.name).collect()
    }

    /// One job for `k` that fails with a server error at `at`; the category it was counted as.
    fn fail_once(q: &mut Queue, k: &ServiceKey, at: Instant) -> Option<ErrorCategory> {
        q.started(k.clone());
        let failed = JobOutcome::Retry {
            category: ErrorCategory::Server,
        };
        q.finished(k, failed, at)
    }

    #[test]
    fn a_job_cut_short_by_a_leadership_gap_is_decided_again() {
        let mut q = Queue::default();
        let t0 = Instant::now();
        q.mark(mk_key("a"));
        let k = q.pop().unwrap();
        q.started(k.clone());
        assert_eq!(q.finished(&k, JobOutcome::NotLeading, t0), None);
        assert_eq!(q.pop(), None);
        assert_eq!(q.next_retry(), Some(t0 + RETRY_MIN));
        q.due(t0 + RETRY_MIN);
        assert_eq!(drain(&mut q), ["a"]);
    }

    #[test]
    fn marks_are_deduplicated_and_fifo() {
        let mut q = Queue::default();
        for n in ["a", "b", "a", "c", "b"] {
            q.mark(mk_key(n));
        }
        assert_eq!(drain(&mut q), ["a", "b", "c"]);
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn own_echoes_during_and_after_the_job_are_not_decided_again() {
        let mut q = Queue::default();
        let k = mk_key("a");
        q.started(k.clone());
        // The spec write's echo arrives before the job reports back.
        q.observe(k.clone(), Some("11"));
        assert_eq!(q.finished(&k, done(&["11", "12"]), Instant::now()), None);
        assert!(drain(&mut q).is_empty());
        // The status write's echo arrives after.
        q.observe(k.clone(), Some("12"));
        assert!(drain(&mut q).is_empty());
        // Anything later is someone else's change.
        q.observe(k.clone(), Some("13"));
        assert_eq!(drain(&mut q), ["a"]);
    }

    #[test]
    fn a_change_between_two_own_writes_is_decided_again() {
        let mut q = Queue::default();
        let k = mk_key("a");
        q.started(k.clone());
        q.observe(k.clone(), Some("11"));
        q.observe(k.clone(), Some("12"));
        q.finished(&k, done(&["11", "13"]), Instant::now());
        assert!(drain(&mut q).is_empty(), "waits for the echo of 13");
        q.observe(k.clone(), Some("13"));
        assert_eq!(drain(&mut q), ["a"]);
    }

    #[test]
    fn a_foreign_change_after_the_job_is_decided_even_before_the_echo() {
        let mut q = Queue::default();
        let k = mk_key("a");
        q.started(k.clone());
        q.finished(&k, done(&["11", "12"]), Instant::now());
        q.observe(k.clone(), Some("11"));
        assert!(drain(&mut q).is_empty());
        // A relist that skipped 12 and shows a newer version.
        q.observe(k.clone(), Some("14"));
        assert_eq!(drain(&mut q), ["a"]);
        // The echo table forgot the Service: 12 is no longer taken for an echo.
        q.observe(k.clone(), Some("12"));
        assert_eq!(drain(&mut q), ["a"]);
    }

    #[test]
    fn an_echo_skips_earlier_own_versions() {
        let mut q = Queue::default();
        let k = mk_key("a");
        q.started(k.clone());
        q.finished(&k, done(&["11", "12"]), Instant::now());
        // A relist may show only the last one.
        q.observe(k.clone(), Some("12"));
        assert!(drain(&mut q).is_empty());
        q.observe(k.clone(), Some("11"));
        assert_eq!(drain(&mut q), ["a"]);
    }

    #[test]
    fn a_change_without_version_is_never_an_echo() {
        let mut q = Queue::default();
        let k = mk_key("a");
        q.started(k.clone());
        q.observe(k.clone(), None);
        q.finished(&k, done(&["11"]), Instant::now());
        // Decided again, once the job's own write is back.
        q.observe(k.clone(), Some("11"));
        assert_eq!(drain(&mut q), ["a"]);
    }

    #[test]
    fn marks_while_in_flight_wait_for_the_job() {
        let mut q = Queue::default();
        let k = mk_key("a");
        q.started(k.clone());
        q.mark(k.clone());
        assert!(drain(&mut q).is_empty());
        q.finished(&k, done(&["11"]), Instant::now());
        // Decided once the cache has seen the job's write, not from the object before it.
        assert!(drain(&mut q).is_empty());
        q.observe(k.clone(), Some("11"));
        assert_eq!(drain(&mut q), ["a"]);
        // The echo was consumed: a later change is someone else's.
        q.observe(k.clone(), Some("12"));
        assert_eq!(drain(&mut q), ["a"]);
    }

    #[test]
    fn a_mark_after_a_landed_write_waits_for_its_echo() {
        // A pool change (another watch) marks the Service after its status write landed and
        // before the watch brought that write back: decided then, it would read the status
        // as it was before the write.
        let mut q = Queue::default();
        let k = mk_key("a");
        q.started(k.clone());
        q.finished(&k, done(&["11", "12"]), Instant::now());
        q.mark(k.clone());
        q.mark(k.clone());
        assert!(drain(&mut q).is_empty());
        q.observe(k.clone(), Some("11"));
        assert!(drain(&mut q).is_empty(), "one echo still owed");
        q.observe(k.clone(), Some("12"));
        assert_eq!(drain(&mut q), ["a"]);
        // A newer version than the writes (a relist that skipped the echoes) decides too.
        q.started(k.clone());
        q.finished(&k, done(&["21"]), Instant::now());
        q.mark(k.clone());
        q.observe(k.clone(), Some("25"));
        assert_eq!(drain(&mut q), ["a"]);
        // Without a mark, an echo decides nothing.
        q.started(k.clone());
        q.finished(&k, done(&["31"]), Instant::now());
        q.observe(k.clone(), Some("31"));
        assert!(drain(&mut q).is_empty());
    }

    #[test]
    fn gone_and_not_leading_redo_only_when_something_changed() {
        for outcome in [JobOutcome::Gone, JobOutcome::NotLeading] {
            let mut q = Queue::default();
            let k = mk_key("a");
            q.started(k.clone());
            q.finished(&k, outcome.clone(), Instant::now());
            assert!(drain(&mut q).is_empty());
            q.started(k.clone());
            q.observe(k.clone(), Some("5"));
            q.finished(&k, outcome, Instant::now());
            assert_eq!(drain(&mut q), ["a"]);
        }
    }

    #[test]
    fn retries_back_off_and_come_due() {
        let mut q = Queue::default();
        let k = mk_key("a");
        let t0 = Instant::now();
        for (attempt, want) in [(1u64, 200u64), (2, 400), (3, 800)] {
            let category = fail_once(&mut q, &k, t0);
            assert_eq!(
                category.map(ErrorCategory::as_str),
                Some("server"),
                "attempt {attempt}"
            );
            let due = q.next_retry().unwrap();
            assert_eq!(due - t0, Duration::from_millis(want));
            q.due(due - Duration::from_millis(1));
            assert!(drain(&mut q).is_empty());
            q.due(due);
            assert_eq!(drain(&mut q), ["a"]);
        }
        // Success resets the backoff.
        q.started(k.clone());
        q.finished(&k, done(&[]), t0);
        fail_once(&mut q, &k, t0);
        assert_eq!(q.next_retry().unwrap() - t0, Duration::from_millis(200));
    }

    #[test]
    fn settled_and_forgotten_services_start_backoff_afresh() {
        let mut q = Queue::default();
        let k = mk_key("a");
        let t0 = Instant::now();
        for _ in 0..3 {
            fail_once(&mut q, &k, t0);
        }
        q.settled(&k);
        fail_once(&mut q, &k, t0);
        q.due(t0 + Duration::from_secs(1));
        drain(&mut q);
        assert_eq!(q.next_retry(), None);
        q.forget(&k);
        fail_once(&mut q, &k, t0);
        assert_eq!(q.next_retry().unwrap() - t0, Duration::from_millis(200));
    }

    #[test]
    fn a_rejected_write_is_retried_as_a_conflict() {
        let mut q = Queue::default();
        let k = mk_key("a");
        let t0 = Instant::now();
        for write in [Write::Spec, Write::Status] {
            q.started(k.clone());
            let category = q.finished(&k, JobOutcome::Rejected { write }, t0);
            assert_eq!(category.map(ErrorCategory::as_str), Some("conflict"));
            assert_eq!(q.next_retry(), Some(t0 + CONFLICT_RETRY));
            q.due(t0 + CONFLICT_RETRY);
            assert_eq!(drain(&mut q), ["a"]);
        }
    }

    #[test]
    fn retry_delays_by_category() {
        assert_eq!(retry_delay(ErrorCategory::Conflict, 9), CONFLICT_RETRY);
        assert_eq!(
            retry_delay(ErrorCategory::Provider, 1),
            Duration::from_secs(10)
        );
        assert_eq!(retry_delay(ErrorCategory::Provider, 30), PROVIDER_RETRY_MAX);
        assert_eq!(
            retry_delay(ErrorCategory::Server, 1),
            Duration::from_millis(200)
        );
        assert_eq!(retry_delay(ErrorCategory::Server, 40), RETRY_MAX);
    }

    #[test]
    fn a_write_refused_as_invalid_is_tried_again_with_backoff() {
        // An admission policy or RBAC change can heal it while the Service stays as it is.
        for category in [ErrorCategory::Invalid, ErrorCategory::Rejected] {
            let mut q = Queue::default();
            let k = mk_key("a");
            let t0 = Instant::now();
            q.started(k.clone());
            let counted = q.finished(&k, JobOutcome::Retry { category }, t0);
            assert_eq!(counted, Some(category), "still counted");
            assert_eq!(
                q.next_retry(),
                Some(t0 + Duration::from_millis(200)),
                "{category}: retried after the first backoff step"
            );
        }
    }
}

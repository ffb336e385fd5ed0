//! The work queue: each Service is queued at most once however many changes arrive before a worker
//! takes it (bursts coalesce), is never synced by two workers at once, and failures come back
//! with exponential backoff.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::key::ObjectKey;

/// How a sync ended, which decides when the Service comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Done,
    /// Failed: back off, longer after each consecutive failure.
    Failed,
    /// Not possible yet (caches behind): look again after this long, not counted as a failure.
    After(Duration),
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pop {
    Key(ObjectKey),
    /// Nothing is due before this instant.
    Wait(Instant),
    Empty,
}

/// The queue's bookkeeping, free of time sources and locks so that it is tested directly.
#[derive(Debug)]
pub(crate) struct QueueState {
    due: HashMap<ObjectKey, Instant>,
    order: BTreeSet<(Instant, u64, ObjectKey)>,
    seq: HashMap<ObjectKey, u64>,
    next_seq: u64,
    /// Being synced; changes meanwhile are parked here with their due time.
    active: HashMap<ObjectKey, Option<Instant>>,
    failures: HashMap<ObjectKey, u32>,
    base_backoff: Duration,
    max_backoff: Duration,
}

impl QueueState {
    pub(crate) fn new(base_backoff: Duration, max_backoff: Duration) -> Self {
        QueueState {
            due: HashMap::new(),
            order: BTreeSet::new(),
            seq: HashMap::new(),
            next_seq: 0,
            active: HashMap::new(),
            failures: HashMap::new(),
            base_backoff,
            max_backoff,
        }
    }

    /// Queues `key` to be due at `at`; an earlier due time already queued stands.
    pub(crate) fn add(&mut self, key: ObjectKey, at: Instant) {
        if let Some(parked) = self.active.get_mut(&key) {
            *parked = Some(parked.map_or(at, |p| p.min(at)));
            return;
        }
        if let Some(due) = self.due.get(&key) {
            if *due <= at {
                return;
            }
            let seq = self.seq.get(&key).copied().unwrap_or(0);
            self.order.remove(&(*due, seq, key.clone()));
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert((at, seq, key.clone()));
        self.seq.insert(key.clone(), seq);
        self.due.insert(key, at);
    }

    pub(crate) fn pop(&mut self, now: Instant) -> Pop {
        let Some((at, _, _)) = self.order.first() else {
            return Pop::Empty;
        };
        if *at > now {
            return Pop::Wait(*at);
        }
        let Some((_, _, key)) = self.order.pop_first() else {
            return Pop::Empty;
        };
        self.due.remove(&key);
        self.seq.remove(&key);
        self.active.insert(key.clone(), None);
        Pop::Key(key)
    }

    fn backoff(&self, failures: u32) -> Duration {
        let factor = 1u32 << failures.saturating_sub(1).min(20);
        self.base_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }

    /// Ends the sync of `key`; changes parked while it ran queue it again.
    pub(crate) fn finish(&mut self, key: &ObjectKey, outcome: Outcome, now: Instant) {
        let parked = self.active.remove(key).flatten();
        let retry = match outcome {
            Outcome::Done => {
                self.failures.remove(key);
                None
            }
            Outcome::Failed => {
                let n = self.failures.entry(key.clone()).or_insert(0);
                *n = n.saturating_add(1);
                let n = *n;
                Some(now + self.backoff(n))
            }
            Outcome::After(d) => Some(now + d),
        };
        // A change seen while the sync ran is worth a prompt look even after a failure.
        let next = match (parked, retry) {
            (Some(p), Some(r)) => Some(p.min(r)),
            (p, r) => p.or(r),
        };
        if let Some(at) = next {
            self.add(key.clone(), at);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.due.len()
    }
}

/// The shared queue that watchers fill and workers drain.
#[derive(Debug)]
pub(crate) struct WorkQueue {
    state: Mutex<QueueState>,
    notify: Notify,
    /// Changes wait this long before they are due, so that a burst becomes one sync.
    batch: Duration,
}

impl WorkQueue {
    pub(crate) fn new(batch: Duration) -> Self {
        WorkQueue {
            state: Mutex::new(QueueState::new(
                Duration::from_millis(20),
                Duration::from_secs(60),
            )),
            notify: Notify::new(),
            batch,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut QueueState) -> T) -> T {
        // A panic elsewhere cannot leave the plain bookkeeping half-written, so keep going.
        let mut state = match self.state.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut state)
    }

    pub(crate) fn add_all(&self, keys: impl IntoIterator<Item = ObjectKey>) {
        let at = Instant::now() + self.batch;
        let added = self.with(|s| {
            let mut n = 0;
            for key in keys {
                s.add(key, at);
                n += 1;
            }
            n
        });
        if added > 0 {
            self.notify.notify_waiters();
            self.notify.notify_one();
        }
    }

    pub(crate) fn finish(&self, key: &ObjectKey, outcome: Outcome) {
        self.with(|s| s.finish(key, outcome, Instant::now()));
        self.notify.notify_one();
    }

    pub(crate) fn len(&self) -> usize {
        self.with(|s| s.len())
    }

    /// The next due key, or `None` once `shutdown` fires.
    pub(crate) async fn next(&self, shutdown: &CancellationToken) -> Option<ObjectKey> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wait = match self.with(|s| s.pop(Instant::now())) {
                Pop::Key(key) => return Some(key),
                Pop::Wait(at) => Some(at),
                Pop::Empty => None,
            };
            let sleep = async {
                match wait {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return None,
                () = &mut notified => {}
                () = sleep => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("ns", name)
    }

    fn state() -> QueueState {
        QueueState::new(Duration::from_millis(10), Duration::from_millis(100))
    }

    #[test]
    fn repeated_adds_coalesce_and_keep_the_earliest_due_time() {
        let t = Instant::now();
        let mut q = state();
        q.add(key("a"), t + Duration::from_millis(5));
        q.add(key("a"), t + Duration::from_millis(9));
        q.add(key("b"), t + Duration::from_millis(1));
        q.add(key("a"), t);
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop(t), Pop::Key(key("a")));
        assert_eq!(q.pop(t), Pop::Wait(t + Duration::from_millis(1)));
        assert_eq!(q.pop(t + Duration::from_millis(1)), Pop::Key(key("b")));
        assert_eq!(q.pop(t + Duration::from_secs(1)), Pop::Empty);
    }

    #[test]
    fn equal_due_times_keep_arrival_order() {
        let t = Instant::now();
        let mut q = state();
        for name in ["c", "a", "b"] {
            q.add(key(name), t);
        }
        let popped: Vec<Pop> = (0..3).map(|_| q.pop(t)).collect();
        assert_eq!(
            popped,
            vec![Pop::Key(key("c")), Pop::Key(key("a")), Pop::Key(key("b"))]
        );
    }

    #[test]
    fn a_key_being_synced_is_not_handed_out_twice_but_comes_back_after() {
        let t = Instant::now();
        let mut q = state();
        q.add(key("a"), t);
        assert_eq!(q.pop(t), Pop::Key(key("a")));
        q.add(key("a"), t);
        q.add(key("a"), t);
        assert_eq!(q.pop(t), Pop::Empty);
        q.finish(&key("a"), Outcome::Done, t);
        assert_eq!(q.pop(t), Pop::Key(key("a")));
        q.finish(&key("a"), Outcome::Done, t);
        assert_eq!(q.pop(t), Pop::Empty);
    }

    #[test]
    fn failures_back_off_exponentially_up_to_the_cap_and_success_resets() {
        let t = Instant::now();
        let mut q = state();
        let mut delays = Vec::new();
        q.add(key("a"), t);
        for _ in 0..6 {
            let Pop::Key(k) = q.pop(t + Duration::from_secs(10)) else {
                panic!("queued");
            };
            q.finish(&k, Outcome::Failed, t);
            match q.pop(t) {
                Pop::Wait(at) => delays.push(at - t),
                other => panic!("{other:?}"),
            }
        }
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, vec![10, 20, 40, 80, 100, 100]);
        let Pop::Key(k) = q.pop(t + Duration::from_secs(10)) else {
            panic!("queued");
        };
        q.finish(&k, Outcome::Done, t);
        q.add(key("a"), t);
        let Pop::Key(k) = q.pop(t) else {
            panic!("queued");
        };
        q.finish(&k, Outcome::Failed, t);
        assert_eq!(q.pop(t), Pop::Wait(t + Duration::from_millis(10)));
    }

    #[test]
    fn a_change_during_a_failed_sync_is_not_delayed_by_the_backoff() {
        let t = Instant::now();
        let mut q = state();
        q.add(key("a"), t);
        assert_eq!(q.pop(t), Pop::Key(key("a")));
        q.add(key("a"), t);
        q.finish(&key("a"), Outcome::Failed, t);
        assert_eq!(q.pop(t), Pop::Key(key("a")));
    }

    #[test]
    fn after_requeues_without_counting_a_failure() {
        let t = Instant::now();
        let mut q = state();
        q.add(key("a"), t);
        assert_eq!(q.pop(t), Pop::Key(key("a")));
        q.finish(&key("a"), Outcome::After(Duration::from_millis(3)), t);
        assert_eq!(q.pop(t), Pop::Wait(t + Duration::from_millis(3)));
        assert_eq!(q.pop(t + Duration::from_millis(3)), Pop::Key(key("a")));
        q.finish(&key("a"), Outcome::Failed, t);
        assert_eq!(q.pop(t), Pop::Wait(t + Duration::from_millis(10)));
    }

    #[tokio::test]
    async fn next_waits_for_work_and_stops_on_shutdown() {
        let q = std::sync::Arc::new(WorkQueue::new(Duration::ZERO));
        let shutdown = CancellationToken::new();
        let waiter = {
            let (q, s) = (q.clone(), shutdown.clone());
            tokio::spawn(async move { q.next(&s).await })
        };
        tokio::task::yield_now().await;
        q.add_all([key("a")]);
        assert_eq!(waiter.await.unwrap(), Some(key("a")));
        shutdown.cancel();
        assert_eq!(q.next(&shutdown).await, None);
    }
}

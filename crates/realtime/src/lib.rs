//! berth-realtime: the work of an agent that must not wait — liveness heartbeats and timers
//! (berth-membership) and the ARP/NDP answers (berth-l2) — runs on a thread of its own, with
//! a tokio runtime of its own, at real-time priority when the process may ask for it
//! ([`priority`]). The agent's shared runtime, however busy (watches, an election over every
//! Service, a datapath sync) or stalled, then delays neither, and neither do the other
//! processes of a loaded node.
//!
//! No thread started here writes log lines in place: berth-telemetry queues them for a writer
//! thread of their own, so a stalled log output cannot hold these threads either.

use std::future::Future;
use std::io;

use tokio::sync::oneshot;

pub mod priority;

/// Everything that can fail in starting a dedicated thread.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("starting thread {thread} failed")]
    Spawn {
        thread: String,
        #[source]
        source: io::Error,
    },
    #[error("building the runtime of thread {thread} failed")]
    Runtime {
        thread: String,
        #[source]
        source: io::Error,
    },
    #[error("thread {0} ended without a result")]
    Ended(String),
}

/// A thread started by [`spawn_dedicated`]; [`Dedicated::join`] waits for its result.
#[derive(Debug)]
pub struct Dedicated<T> {
    thread: String,
    done: Result<oneshot::Receiver<Result<T, Error>>, Error>,
}

impl<T> Dedicated<T> {
    /// The result of the thread's future, once it has run to completion; an error when the
    /// thread could not be started or ended without one (a panic).
    pub async fn join(self) -> Result<T, Error> {
        let done = self.done?;
        done.await.unwrap_or(Err(Error::Ended(self.thread)))
    }
}

/// Starts a thread named `name` that asks for real-time priority (logged, as `what`, with the
/// outcome: without `CAP_SYS_NICE` it runs at normal priority), builds a current-thread tokio
/// runtime and runs the future `make` returns on it to completion. The future is made on the
/// thread, so what it registers with a runtime (sockets, timers) registers with this one.
pub fn spawn_dedicated<F, Fut>(name: &str, what: &'static str, make: F) -> Dedicated<Fut::Output>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future,
    Fut::Output: Send + 'static,
{
    let (done_tx, done_rx) = oneshot::channel();
    let thread = name.to_string();
    let started = std::thread::Builder::new().name(thread.clone()).spawn({
        let thread = thread.clone();
        move || {
            log_priority(&thread, what, priority::raise_current_thread());
            let ran = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|source| Error::Runtime {
                    thread: thread.clone(),
                    source,
                })
                .map(|runtime| runtime.block_on(make()));
            let _ = done_tx.send(ran);
        }
    });
    Dedicated {
        done: started.map(|_| done_rx).map_err(|source| Error::Spawn {
            thread: thread.clone(),
            source,
        }),
        thread,
    }
}

fn log_priority(thread: &str, what: &str, raised: io::Result<()>) {
    match raised {
        Ok(()) => tracing::info!(
            thread,
            priority = priority::REALTIME_PRIORITY,
            "{what} runs on a real-time thread (SCHED_RR)"
        ),
        Err(err) => tracing::info!(
            thread,
            error = %err,
            "{what} runs at normal priority (SCHED_RR needs CAP_SYS_NICE)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn the_future_runs_on_the_named_thread_with_a_runtime_of_its_own() {
        let thread = spawn_dedicated("berth-test-rt", "a test", || async {
            // A timer of this runtime, made and polled on the thread.
            tokio::time::sleep(Duration::from_millis(1)).await;
            let name = std::thread::current().name().map(str::to_string);
            let flavor = tokio::runtime::Handle::current().runtime_flavor();
            (name, flavor)
        });
        let (name, flavor) = thread.join().await.expect("a result");
        assert_eq!(name.as_deref(), Some("berth-test-rt"));
        assert_eq!(flavor, tokio::runtime::RuntimeFlavor::CurrentThread);
    }

    #[tokio::test]
    async fn a_panicking_future_is_an_error_not_a_hang() {
        let thread = spawn_dedicated("berth-test-panic", "a test", || async {
            if std::thread::current().name().is_some() {
                panic!("on purpose");
            }
        });
        let err = thread.join().await.expect_err("no result");
        assert!(
            matches!(err, Error::Ended(ref t) if t == "berth-test-panic"),
            "{err}"
        );
    }
}

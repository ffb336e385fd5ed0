//! Every interface's speaker on a thread of its own (`berth-l2-answer`), with a runtime of its
//! own, at real-time priority when permitted ([`berth_realtime`]). On the agent's shared runtime
//! an answer waited for whatever else ran there — watches, an election over every Service, a
//! datapath sync — and a late answer was refused by the liveness deadline rather than sent
//! wrong, but it was still no answer. Here only the speakers run: an answer costs a table
//! lookup and a send, whatever the rest of the agent is doing.

use std::sync::Arc;

use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::answers::Answers;
use crate::speaker::{run_link_with, L2Metrics, LinkOptions};
use crate::transport::Link;
use crate::Error;

/// The name of the speakers' thread, as `top -H` and `perf` show it.
pub const SPEAKER_THREAD: &str = "berth-l2-answer";

/// The speakers' thread, started by [`spawn_speakers`].
#[derive(Debug)]
pub struct Speakers {
    opened: oneshot::Receiver<Vec<String>>,
    thread: berth_realtime::Dedicated<()>,
}

impl Speakers {
    /// The interfaces that could be opened (an empty list when none could, or the thread could
    /// not start), and the thread, to join once `stop` is cancelled.
    pub async fn opened(self) -> (Vec<String>, SpeakersRunning) {
        let opened = self.opened.await.unwrap_or_default();
        (opened, SpeakersRunning(self.thread))
    }
}

/// The speakers' thread once its interfaces are open.
#[derive(Debug)]
pub struct SpeakersRunning(berth_realtime::Dedicated<()>);

impl SpeakersRunning {
    /// Waits until every speaker has stopped.
    pub async fn join(self) -> Result<(), berth_realtime::Error> {
        self.0.join().await
    }
}

/// Opens each of `interfaces` with `open` on the speakers' thread (sockets register with the
/// runtime that opens them) and serves every one that opened from `answers` with `options`,
/// until `stop` is cancelled or the answers' sender is dropped. An interface that cannot be
/// opened is logged and left out.
pub fn spawn_speakers<L, O>(
    interfaces: Vec<String>,
    open: O,
    answers: watch::Receiver<Arc<Answers>>,
    metrics: L2Metrics,
    options: LinkOptions,
    stop: CancellationToken,
) -> Speakers
where
    L: Link,
    O: Fn(&str) -> Result<L, Error> + Send + 'static,
{
    let (opened_tx, opened_rx) = oneshot::channel();
    let thread = berth_realtime::spawn_dedicated(SPEAKER_THREAD, "ARP and NDP answering", {
        move || async move {
            let mut opened = Vec::new();
            let mut tasks = tokio::task::JoinSet::new();
            for name in interfaces {
                match open(&name) {
                    Ok(link) => {
                        tracing::info!(interface = %name, "answering ARP and NDP");
                        tasks.spawn(run_link_with(
                            link,
                            answers.clone(),
                            metrics.clone(),
                            options.clone(),
                            stop.clone().cancelled_owned(),
                        ));
                        opened.push(name);
                    }
                    Err(err) => {
                        tracing::warn!(interface = %name, error = %err, "cannot answer on this interface")
                    }
                }
            }
            let _ = opened_tx.send(opened);
            drop(answers);
            while tasks.join_next().await.is_some() {}
        }
    });
    Speakers {
        opened: opened_rx,
        thread,
    }
}

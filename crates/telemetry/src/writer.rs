//! Where log lines go: a queue that a thread of its own empties into the real output, so a
//! thread that logs never waits for the output. A log file on a disk the kernel is throttling
//! (dirty pages under heavy writes beside berth) or a pipe nobody reads (its 64 KiB full) blocks
//! the writer, and a writer called in place blocks whichever thread logged: measured, the
//! real-time liveness threads of three lab agents woke 1.8–4 s late at the same instants while
//! builds beside them wrote gigabytes. The queue is bounded and lossy: when the output stalls long
//! enough to fill it, new lines are dropped and counted (`berth_log_lines_dropped_total`)
//! rather than waited for.

use std::io::Write;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};
use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};

/// Lines the queue holds while the output is stalled. A line is one `Vec` of a few hundred
/// bytes, and the queue's slots are allocated up front (about 40 bytes each), so this bounds
/// both the memory a stalled output costs and the slots every process carries; at the agent's
/// busiest (a thousand Services moving) it holds several seconds of lines.
pub const LOG_QUEUE_LINES: usize = 8192;

/// The name of the thread that writes the lines out.
const WRITER_THREAD: &str = "berth-log-writer";

/// How many log lines were dropped because the output stalled and the queue was full. Clones
/// share the count; registered as a counter, it is read at each scrape.
#[derive(Debug, Clone)]
pub struct DroppedLines(ErrorCounter);

impl DroppedLines {
    /// The lines dropped so far.
    pub fn get(&self) -> u64 {
        u64::try_from(self.0.dropped_lines()).unwrap_or(u64::MAX)
    }
}

impl TypedMetric for DroppedLines {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for DroppedLines {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.get(), None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// Keeps the writer thread for the life of the process: dropping it (at the end of `main`)
/// writes out the lines still queued, waiting at most about a second for a stalled output.
#[derive(Debug)]
pub struct LogGuard {
    _worker: WorkerGuard,
    dropped: DroppedLines,
}

impl LogGuard {
    /// The count of dropped lines, for the process's metrics.
    pub fn dropped_lines(&self) -> DroppedLines {
        self.dropped.clone()
    }
}

/// A writer that queues each line (up to `queue_lines` of them) for a thread of its own to write
/// to `output`, dropping and counting lines while the queue is full; and its guard.
pub fn build_non_blocking<W: Write + Send + 'static>(
    output: W,
    queue_lines: usize,
) -> (NonBlocking, LogGuard) {
    let (writer, worker) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(queue_lines)
        .thread_name(WRITER_THREAD)
        .finish(output);
    let dropped = DroppedLines(writer.error_counter());
    (
        writer,
        LogGuard {
            _worker: worker,
            dropped,
        },
    )
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::mpsc;
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::logging::{build_subscriber, LogConfig, LogFormat};
    use crate::MetricsRegistry;

    /// An output that blocks every write until it is opened, as a pipe nobody reads does once
    /// full, or a file the kernel throttles; what was written after opening is kept.
    #[derive(Clone, Default)]
    struct Gate {
        open: Arc<(Mutex<bool>, Condvar)>,
        written: Arc<Mutex<Vec<u8>>>,
    }

    impl Gate {
        fn open(&self) {
            let (open, changed) = &*self.open;
            *open.lock().unwrap_or_else(|e| e.into_inner()) = true;
            changed.notify_all();
        }

        fn text(&self) -> String {
            String::from_utf8_lossy(&self.written.lock().unwrap_or_else(|e| e.into_inner()))
                .into_owned()
        }
    }

    impl io::Write for Gate {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let (open, changed) = &*self.open;
            let mut is_open = open.lock().unwrap_or_else(|e| e.into_inner());
            while !*is_open {
                is_open = changed.wait(is_open).unwrap_or_else(|e| e.into_inner());
            }
            self.written
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    const QUEUE: usize = 16;
    const LINES: usize = 200;

    /// Logs `lines` lines through a subscriber writing to `writer`, on a thread of its own;
    /// true when every call returned within `limit`.
    fn logging_returns<W>(writer: W, lines: usize, limit: Duration) -> bool
    where
        W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
    {
        let config = LogConfig {
            format: LogFormat::Json,
            filter: "info".to_owned(),
        };
        let subscriber = build_subscriber(&config, writer, false).unwrap();
        let (done_tx, done_rx) = mpsc::channel();
        std::thread::spawn(move || {
            tracing::subscriber::with_default(subscriber, || {
                for line in 0..lines {
                    tracing::info!(line, "a line while the output is stalled");
                }
            });
            let _ = done_tx.send(());
        });
        done_rx.recv_timeout(limit).is_ok()
    }

    #[test]
    fn logging_into_a_stalled_output_returns_and_counts_what_it_dropped() {
        let gate = Gate::default();
        let (writer, guard) = build_non_blocking(gate.clone(), QUEUE);
        assert!(
            logging_returns(writer, LINES, Duration::from_secs(10)),
            "a logging call waited for the stalled output"
        );
        // The writer thread holds one line in its blocked write, the queue `QUEUE` more:
        // every other line was dropped and counted.
        let dropped = guard.dropped_lines().get();
        let kept = LINES as u64 - dropped;
        assert!(
            (QUEUE as u64..=QUEUE as u64 + 1).contains(&kept),
            "dropped {dropped} of {LINES}"
        );

        // The output resumes: what was queued is written out, and nothing more is dropped.
        gate.open();
        drop(guard);
        let text = gate.text();
        assert_eq!(text.lines().count() as u64, kept, "{text}");
        assert!(
            text.contains("\"line\":0"),
            "the first line was kept: {text}"
        );
    }

    #[test]
    fn an_output_called_in_place_blocks_the_thread_that_logs() {
        // The control: the same stalled output without the queue holds the logging thread
        // (released at the end, so that thread ends).
        let gate = Gate::default();
        let writer = {
            let gate = gate.clone();
            move || gate.clone()
        };
        assert!(!logging_returns(writer, 1, Duration::from_millis(500)));
        gate.open();
    }

    #[test]
    fn nothing_is_dropped_while_the_output_keeps_up() {
        let gate = Gate::default();
        gate.open();
        let (writer, guard) = build_non_blocking(gate.clone(), LOG_QUEUE_LINES);
        assert!(logging_returns(writer, LINES, Duration::from_secs(10)));
        assert_eq!(guard.dropped_lines().get(), 0);
        drop(guard);
        assert_eq!(gate.text().lines().count(), LINES);
    }

    #[test]
    fn dropped_lines_are_a_berth_counter() {
        let gate = Gate::default();
        let (writer, guard) = build_non_blocking(gate.clone(), 1);
        assert!(logging_returns(writer, LINES, Duration::from_secs(10)));
        let mut metrics = MetricsRegistry::new();
        metrics.register_log_drops(guard.dropped_lines());
        let out = metrics.into_shared().encode().unwrap();
        let dropped = guard.dropped_lines().get();
        assert!(dropped >= LINES as u64 - 2, "{dropped}");
        assert!(
            out.contains("# TYPE berth_log_lines_dropped counter\n"),
            "{out}"
        );
        assert!(
            out.contains(&format!("berth_log_lines_dropped_total {dropped}\n")),
            "{out}"
        );
        gate.open();
    }
}

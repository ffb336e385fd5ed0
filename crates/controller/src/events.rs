//! Events off the allocation path, as client-go's recorder keeps them off a reconcile: a write
//! job hands its Events to a bounded queue and goes on with the next write; one task sends them
//! with a few requests in flight. A full queue makes the job wait (backpressure) rather than
//! drop an Event; Events still queued when leadership ends are not sent, since only the leader
//! may write.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use berth_api::names::event as ev;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::error::ErrorCategory;
use crate::metrics::Metrics;

/// Events waiting to be sent. A cold start of 10,000 LoadBalancer Services queues three
/// each; an entry is a few hundred bytes, so the whole burst fits without making a write job
/// wait.
pub const EVENT_QUEUE: usize = 32_768;
/// Event requests in flight at once: enough to keep up with steady churn, few enough that
/// allocations (spec and status writes) get most of the API server during a burst.
pub const EVENT_WRITERS: usize = 4;

/// `Normal` or `Warning`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One Event as recorded, before it is sent. The time is when it happened, not when the
/// queue got to it.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingEvent {
    /// Shared by the Events of one write job.
    pub regarding: Arc<ObjectReference>,
    pub type_: EventType,
    pub reason: &'static str,
    pub note: String,
    pub at: Timestamp,
}

/// The events.k8s.io/v1 Event for `pending`. Each is created as is (Events are only emitted on
/// transitions): kube-runtime's recorder would add series bookkeeping whose cache it sweeps on
/// every publish, which costs O(events) per Event at scale. `seq` keeps names unique within
/// one instance even for Events of the same nanosecond.
pub fn build_event(pending: &PendingEvent, instance: &str, seq: u64) -> Event {
    let ns = pending
        .regarding
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = pending.regarding.name.clone().unwrap_or_default();
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{:x}{seq:x}", pending.at.as_nanosecond())),
            namespace: Some(ns),
            ..ObjectMeta::default()
        },
        action: Some("Allocate".into()),
        reason: Some(pending.reason.to_string()),
        // User text (annotation values, pool names) flows into notes: the API server refuses
        // a note over 1 KiB, and the Event would be retried and lost.
        note: Some(berth_api::bounded(&pending.note, berth_api::MAX_EVENT_NOTE)),
        type_: Some(pending.type_.as_str().into()),
        event_time: Some(MicroTime(pending.at)),
        regarding: Some((*pending.regarding).clone()),
        reporting_controller: Some(ev::CONTROLLER_COMPONENT.into()),
        reporting_instance: Some(instance.to_string()),
        ..Event::default()
    }
}

/// The recording side, held by write jobs; clones share the queue.
#[derive(Clone)]
pub struct EventRecorder {
    tx: mpsc::Sender<PendingEvent>,
    metrics: Metrics,
}

impl EventRecorder {
    /// Queues an Event; waits only while the queue is full.
    pub async fn record(
        &self,
        regarding: &Arc<ObjectReference>,
        type_: EventType,
        reason: &'static str,
        note: String,
    ) {
        let pending = PendingEvent {
            regarding: regarding.clone(),
            type_,
            reason,
            note,
            at: Timestamp::now(),
        };
        self.metrics.events_queued.inc();
        if self.tx.send(pending).await.is_err() {
            // The sender task is gone: the term ended and nothing may be written any more.
            self.metrics.events_queued.dec();
        }
    }
}

/// The sending side: one task per leadership term.
pub struct EventWriter {
    rx: mpsc::Receiver<PendingEvent>,
    sender: EventSender,
    writers: usize,
}

struct EventSender {
    client: kube::Client,
    instance: String,
    metrics: Metrics,
    leading: watch::Receiver<bool>,
    seq: AtomicU64,
}

/// A connected recorder and writer; nothing is sent until [`EventWriter::run`].
pub fn event_queue(
    client: kube::Client,
    instance: impl Into<String>,
    metrics: Metrics,
    leading: watch::Receiver<bool>,
    capacity: usize,
    writers: usize,
) -> (EventRecorder, EventWriter) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let recorder = EventRecorder {
        tx,
        metrics: metrics.clone(),
    };
    let writer = EventWriter {
        rx,
        sender: EventSender {
            client,
            instance: instance.into(),
            metrics,
            leading,
            seq: AtomicU64::new(0),
        },
        writers: writers.max(1),
    };
    (recorder, writer)
}

impl EventWriter {
    /// Sends queued Events until `token` is cancelled, or every recorder is dropped and the
    /// queue is empty.
    pub async fn run(self, token: CancellationToken) {
        let Self {
            mut rx,
            sender,
            writers,
        } = self;
        let mut in_flight = FuturesUnordered::new();
        let mut open = true;
        while open || !in_flight.is_empty() {
            tokio::select! {
                biased;
                _ = token.cancelled() => break,
                Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
                next = rx.recv(), if open && in_flight.len() < writers => match next {
                    Some(p) => {
                        sender.metrics.events_queued.dec();
                        in_flight.push(sender.send(p));
                    }
                    None => open = false,
                },
            }
        }
        rx.close();
        sender.metrics.events_queued.dec_by(rx.len() as i64);
    }
}

impl EventSender {
    async fn send(&self, pending: PendingEvent) {
        if !*self.leading.borrow() {
            return;
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let event = build_event(&pending, &self.instance, seq);
        let ns = event.metadata.namespace.clone().unwrap_or_default();
        self.metrics.write("event");
        if let Err(e) = Api::<Event>::namespaced(self.client.clone(), &ns)
            .create(&PostParams::default(), &event)
            .await
        {
            self.metrics.error(ErrorCategory::of_api(&e));
            tracing::debug!(error = %e, reason = pending.reason, "publishing an event failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_pending(name: &str, reason: &'static str) -> PendingEvent {
        PendingEvent {
            regarding: Arc::new(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Service".into()),
                namespace: Some("web".into()),
                name: Some(name.into()),
                uid: Some("u-1".into()),
                resource_version: Some("7".into()),
                ..ObjectReference::default()
            }),
            type_: EventType::Warning,
            reason,
            note: "provided port is already allocated".into(),
            at: Timestamp::from_second(1_700_000_000).unwrap(),
        }
    }

    #[test]
    fn a_note_of_user_text_is_bounded_to_what_the_api_server_accepts() {
        let mut p = mk_pending("api", ev::ALLOCATION_FAILED);
        p.note = format!("IPPool \"{}\" not found", "ü".repeat(4000));
        let note = build_event(&p, "replica-a", 1).note.unwrap();
        assert!(note.len() <= berth_api::MAX_EVENT_NOTE, "{}", note.len());
        assert!(note.starts_with("IPPool \"ü") && note.ends_with("..."));
    }

    #[test]
    fn event_names_the_service_and_keeps_the_recorded_time() {
        let e = build_event(&mk_pending("api", ev::ALLOCATION_FAILED), "replica-a", 3);
        assert_eq!(e.metadata.namespace.as_deref(), Some("web"));
        let name = e.metadata.name.unwrap();
        assert!(name.starts_with("api."), "{name}");
        assert!(name.ends_with('3'), "{name}");
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.reason.as_deref(), Some(ev::ALLOCATION_FAILED));
        assert_eq!(
            e.note.as_deref(),
            Some("provided port is already allocated")
        );
        assert_eq!(
            e.event_time.unwrap().0,
            Timestamp::from_second(1_700_000_000).unwrap()
        );
        let regarding = e.regarding.unwrap();
        assert_eq!(regarding.uid.as_deref(), Some("u-1"));
        assert_eq!(regarding.kind.as_deref(), Some("Service"));
        assert_eq!(e.reporting_instance.as_deref(), Some("replica-a"));
        assert_eq!(
            e.reporting_controller.as_deref(),
            Some(ev::CONTROLLER_COMPONENT)
        );
    }

    #[test]
    fn names_differ_by_sequence_within_one_instant() {
        let p = mk_pending("api", ev::IP_ALLOCATED);
        let a = build_event(&p, "r", 1).metadata.name;
        let b = build_event(&p, "r", 2).metadata.name;
        assert_ne!(a, b);
    }

    async fn lab() -> (berth_lab::LabApiServerHandle, kube::Client) {
        let server = berth_lab::LabApiServer::builder().start().await.unwrap();
        server
            .seed([serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": "web"}})])
            .unwrap();
        let client = server.client().unwrap();
        (server, client)
    }

    async fn sent(client: &kube::Client) -> Vec<String> {
        let mut events = Api::<Event>::namespaced(client.clone(), "web")
            .list(&Default::default())
            .await
            .unwrap()
            .items;
        events.sort_by_key(|e| e.event_time.clone().map(|t| t.0));
        events.into_iter().filter_map(|e| e.note).collect()
    }

    fn mk_metrics() -> Metrics {
        Metrics::new(&mut prometheus_client::registry::Registry::default())
    }

    #[tokio::test]
    async fn queued_events_are_sent_with_their_own_times_and_the_queue_drains() {
        let (server, client) = lab().await;
        let metrics = mk_metrics();
        let (_tx, leading) = watch::channel(true);
        let (recorder, writer) = event_queue(client.clone(), "r", metrics.clone(), leading, 2, 1);
        let regarding = mk_pending("api", ev::IP_ALLOCATED).regarding;
        // More Events than the queue holds: recording waits for room, nothing is dropped.
        let record = async move {
            for i in 0..5 {
                recorder
                    .record(
                        &regarding,
                        EventType::Normal,
                        ev::IP_ALLOCATED,
                        format!("n{i}"),
                    )
                    .await;
            }
        };
        let token = CancellationToken::new();
        tokio::join!(record, writer.run(token));
        assert_eq!(sent(&client).await, ["n0", "n1", "n2", "n3", "n4"]);
        assert_eq!(metrics.events_queued.get(), 0);
        server.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn nothing_is_sent_while_not_leading() {
        let (server, client) = lab().await;
        let metrics = mk_metrics();
        let (_tx, leading) = watch::channel(false);
        let (recorder, writer) = event_queue(client.clone(), "r", metrics.clone(), leading, 8, 2);
        let regarding = mk_pending("api", ev::IP_ALLOCATED).regarding;
        recorder
            .record(&regarding, EventType::Normal, ev::IP_ALLOCATED, "x".into())
            .await;
        assert_eq!(metrics.events_queued.get(), 1);
        drop(recorder);
        writer.run(CancellationToken::new()).await;
        assert!(sent(&client).await.is_empty());
        assert_eq!(metrics.events_queued.get(), 0);
        server.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn events_still_queued_when_the_term_ends_are_not_sent() {
        let (server, client) = lab().await;
        let metrics = mk_metrics();
        let (_tx, leading) = watch::channel(true);
        let (recorder, writer) = event_queue(client.clone(), "r", metrics.clone(), leading, 8, 1);
        let regarding = mk_pending("api", ev::IP_ALLOCATED).regarding;
        for note in ["a", "b"] {
            recorder
                .record(&regarding, EventType::Normal, ev::IP_ALLOCATED, note.into())
                .await;
        }
        let token = CancellationToken::new();
        token.cancel();
        writer.run(token).await;
        assert!(sent(&client).await.is_empty());
        assert_eq!(metrics.events_queued.get(), 0);
        // Recording after the term is a no-op.
        recorder
            .record(&regarding, EventType::Normal, ev::IP_ALLOCATED, "c".into())
            .await;
        assert_eq!(metrics.events_queued.get(), 0);
        server.shutdown().await.unwrap();
    }

    #[test]
    fn a_missing_namespace_is_the_default_one() {
        let mut p = mk_pending("api", ev::IP_ALLOCATED);
        Arc::make_mut(&mut p.regarding).namespace = None;
        let e = build_event(&p, "r", 0);
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
    }
}

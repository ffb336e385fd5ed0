//! The Events the L2 announcer records on Services: "announcing from node X" once the record
//! of an address this node took over is written (by the `ServiceL2Status` writer), and a
//! Warning when another host announces an address this node answers for.

use berth_api::names::event;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// What the report task records.
#[derive(Debug)]
pub(crate) enum Report {
    /// This node took over the Service's address.
    Announcing(berth_l2::ServiceKey, std::net::IpAddr),
    /// Another host announced the Service's address, which this node answers for.
    Conflict(berth_l2::ServiceKey, berth_l2::Conflict),
}

/// Records the Event for each taken-over Service, one at a time: there are as many as this
/// node's takeovers, not as Services.
pub(crate) async fn run_reports(
    client: Client,
    node: String,
    mut rx: mpsc::Receiver<Report>,
    stop: CancellationToken,
) {
    let mut seq: u64 = 0;
    loop {
        let next = tokio::select! {
            () = stop.cancelled() => return,
            next = rx.recv() => next,
        };
        let Some(report) = next else {
            return;
        };
        seq += 1;
        let (namespace, name, event) = match report {
            Report::Announcing((namespace, name), ip) => {
                let event = build_announcing_event(&namespace, &name, &node, ip, seq);
                (namespace, name, event)
            }
            Report::Conflict((namespace, name), conflict) => {
                let event = build_conflict_event(&namespace, &name, &node, &conflict, seq);
                (namespace, name, event)
            }
        };
        if let Err(err) = Api::<Event>::namespaced(client.clone(), &namespace)
            .create(&PostParams::default(), &event)
            .await
        {
            tracing::warn!(%namespace, %name, error = %err, "recording the announcing Event failed");
        }
    }
}

/// The Warning Event: another host announced the Service's address, which `node` answers for.
pub fn build_conflict_event(
    namespace: &str,
    name: &str,
    node: &str,
    conflict: &berth_l2::Conflict,
    seq: u64,
) -> Event {
    let mac = conflict
        .mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let mut event = build_announcing_event(namespace, name, node, conflict.ip, seq);
    event.action = Some("Announce".into());
    event.reason = Some(event::ADDRESS_CONFLICT.into());
    event.type_ = Some("Warning".into());
    event.note = Some(format!(
        "another host ({mac}) announces {} on {}, which node {node} answers for: two hosts claim the address",
        conflict.ip, conflict.interface
    ));
    event
}

/// The events.k8s.io/v1 Event "announcing from node X" about a Service.
pub fn build_announcing_event(
    namespace: &str,
    name: &str,
    node: &str,
    ip: std::net::IpAddr,
    seq: u64,
) -> Event {
    let now = Timestamp::now();
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{:x}{seq:x}", now.as_nanosecond())),
            namespace: Some(namespace.to_string()),
            ..ObjectMeta::default()
        },
        action: Some("Announce".into()),
        reason: Some(event::ANNOUNCING.into()),
        note: Some(format!("announcing from node {node} ({ip})")),
        type_: Some("Normal".into()),
        event_time: Some(MicroTime(now)),
        regarding: Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: Some(namespace.to_string()),
            name: Some(name.to_string()),
            ..ObjectReference::default()
        }),
        reporting_controller: Some(event::AGENT_COMPONENT.into()),
        reporting_instance: Some(node.to_string()),
        ..Event::default()
    }
}

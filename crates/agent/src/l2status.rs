//! Keeps this node's `ServiceL2Status` records equal to what it announces: one record per
//! Service, in the agent's own namespace, written by server-side apply with the agent's field
//! manager and deleted when the node stops announcing the Service (also on a graceful stop).
//! A node that takes a Service's addresses over deletes the records other nodes hold for just
//! those addresses: a crashed agent cannot delete its own, and records the Event "announcing
//! from node X" on the Service.
//! The agent needs no right on Services for it. Writes follow the announcer's table once it
//! has been unchanged for a second ([`WriteSettle`]; at most five seconds late under constant
//! change), never a timer: a liveness flap shorter than that writes nothing, where following
//! each table cost a record and an Event per Service moved, and there and back. A failed write
//! is retried with backoff.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_api::names::{field_manager, label};
use berth_api::ServiceL2Status;
use berth_l2::{
    build_status, is_own_record, parse_status, plan_status, superseded_records, Announced,
    ServiceKey, WriteSettle,
};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::Client;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::l2events::Report;

/// What this node announces, per Service.
pub type AnnouncedSet = Arc<BTreeMap<ServiceKey, Announced>>;

const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// How long a stopping agent spends deleting its records.
const STOP_DEADLINE: Duration = Duration::from_secs(2);
/// How long the announcer's table must stay unchanged before it is written.
const WRITE_QUIET: Duration = Duration::from_secs(1);
/// How late a table that keeps changing is written at most.
const WRITE_LONGEST: Duration = Duration::from_secs(5);

/// Writes `node`'s records in `namespace` until `stop`, then deletes them. Each Service (and
/// address) this node newly announces goes to `reports` for its Event once its record is
/// written.
pub(crate) async fn run_status_records(
    client: Client,
    node: String,
    namespace: String,
    mut desired: watch::Receiver<AnnouncedSet>,
    reports: mpsc::Sender<Report>,
    stop: CancellationToken,
) {
    let api: Api<ServiceL2Status> = Api::namespaced(client, &namespace);
    let mut retry = RETRY_MIN;
    // What the records say, read back once (a restarted agent removes what it no longer
    // announces) and then kept from this task's own writes.
    let mut written = loop {
        match fetch_own(&api, &node).await {
            Ok(written) => break written,
            Err(err) => {
                tracing::warn!(error = %err, "listing this node's ServiceL2Status records failed; retrying");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(retry) => {}
                }
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    };
    retry = RETRY_MIN;
    let mut settle = WriteSettle::new(WRITE_QUIET, WRITE_LONGEST);
    // The table as it is now may differ from what was read back.
    settle.changed(Instant::now());
    let mut retry_at: Option<Instant> = None;
    loop {
        let next = match (settle.due(), retry_at) {
            (Some(due), Some(at)) => Some(due.min(at)),
            (due, at) => due.or(at),
        };
        tokio::select! {
            () = stop.cancelled() => break,
            changed = desired.changed() => {
                if changed.is_err() {
                    break;
                }
                settle.changed(Instant::now());
                continue;
            }
            () = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
        let want = desired.borrow_and_update().clone();
        settle.written();
        if apply_plan(&api, &node, &namespace, &want, &mut written, Some(&reports)).await {
            retry = RETRY_MIN;
            retry_at = None;
        } else {
            retry_at = Some(Instant::now() + retry);
            retry = (retry * 2).min(RETRY_MAX);
        }
    }
    // The node no longer answers: its records go, within a bound.
    let cleared = tokio::time::timeout(
        STOP_DEADLINE,
        apply_plan(
            &api,
            &node,
            &namespace,
            &BTreeMap::new(),
            &mut written,
            None,
        ),
    )
    .await;
    if !matches!(cleared, Ok(true)) {
        tracing::warn!(
            left = written.len(),
            "not every ServiceL2Status record of this node was deleted on stop"
        );
    }
}

/// This node's records as they are, keyed by Service. A record of this node that does not
/// parse is kept under its Service with nothing announced, so the plan replaces it.
async fn fetch_own(
    api: &Api<ServiceL2Status>,
    node: &str,
) -> Result<BTreeMap<ServiceKey, Announced>, kube::Error> {
    let list = api.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .filter(|s| is_own_record(node, s))
        .map(|s| {
            parse_status(node, s).unwrap_or_else(|| {
                (
                    (
                        s.spec.service_namespace.clone(),
                        s.spec.service_name.clone(),
                    ),
                    Announced::default(),
                )
            })
        })
        .collect())
}

/// Deletes the records a crashed peer left for the addresses this node took over; returns
/// whether that succeeded.
async fn clear_superseded(
    api: &Api<ServiceL2Status>,
    node: &str,
    key: &ServiceKey,
    announced: &Announced,
) -> bool {
    let selector = format!(
        "{}={},{}={}",
        label::SERVICE_NAMESPACE,
        key.0,
        label::SERVICE_NAME,
        key.1
    );
    let records = match api.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => list.items,
        Err(err) => {
            tracing::warn!(error = %err, "listing the ServiceL2Status records of a taken-over Service failed");
            return false;
        }
    };
    let mut ok = true;
    for name in superseded_records(node, key, announced, &records) {
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::info!(record = %name, "deleted a ServiceL2Status record of the previous announcer")
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => {
                tracing::warn!(record = %name, error = %err, "deleting the previous announcer's ServiceL2Status failed");
                ok = false;
            }
        }
    }
    ok
}

/// Writes what differs; returns whether every write succeeded. The addresses a written record
/// newly holds go to `reports`, one Event each.
async fn apply_plan(
    api: &Api<ServiceL2Status>,
    node: &str,
    namespace: &str,
    desired: &BTreeMap<ServiceKey, Announced>,
    written: &mut BTreeMap<ServiceKey, Announced>,
    reports: Option<&mpsc::Sender<Report>>,
) -> bool {
    let plan = plan_status(desired, written);
    let mut complete = true;
    let params = PatchParams::apply(field_manager::AGENT).force();
    for key in plan.apply {
        let Some(announced) = desired.get(&key) else {
            continue;
        };
        let status = build_status(node, namespace, &key, announced);
        let name = status.metadata.name.clone().unwrap_or_default();
        match api.patch(&name, &params, &Patch::Apply(&status)).await {
            Ok(_) => {
                tracing::debug!(service = %format!("{}/{}", key.0, key.1), record = %name, "ServiceL2Status written");
                let before = written.insert(key.clone(), announced.clone());
                if before.is_none() && !clear_superseded(api, node, &key, announced).await {
                    complete = false;
                    // Written again next pass, and the others' records looked at again.
                    written.remove(&key);
                    continue;
                }
                let gained = announced
                    .addresses
                    .iter()
                    .filter(|ip| before.as_ref().is_none_or(|b| !b.addresses.contains(ip)));
                for ip in gained {
                    let sent = reports.map(|r| r.try_send(Report::Announcing(key.clone(), *ip)));
                    if matches!(sent, Some(Err(_))) {
                        tracing::warn!("announcement reports are backed up; one is not written");
                    }
                }
            }
            Err(err) => {
                tracing::warn!(service = %format!("{}/{}", key.0, key.1), error = %err, "writing the ServiceL2Status failed");
                complete = false;
            }
        }
    }
    for key in plan.delete {
        let name = berth_l2::status_name(node, &key);
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {
                written.remove(&key);
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                written.remove(&key);
            }
            Err(err) => {
                tracing::warn!(service = %format!("{}/{}", key.0, key.1), error = %err, "deleting the ServiceL2Status failed");
                complete = false;
            }
        }
    }
    complete
}

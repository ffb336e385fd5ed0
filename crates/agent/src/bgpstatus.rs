//! Keeps this node's `BGPSessionState` records equal to what its FRR says: one record per
//! BGPPeer that selects the node, in the agent's own namespace, written by server-side apply
//! with the agent's field manager only when the observation changes, and deleted when the peer
//! no longer applies and on a graceful stop. The agent needs no right on BGPPeers for it; the
//! admission policy lets each agent write only its own node's records.
//!
//! FRR is asked (`vtysh -c 'show bgp neighbors json'`) every [`POLL`], right after a
//! configuration was applied, and whenever the peers change; the verdicts are
//! `berth_bgp::compute_sessions`'.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use berth_api::names::field_manager;
use berth_api::{BGPSessionState, BGPSessionStateSpec};
use berth_bgp::{
    build_session_event, build_session_state, compute_sessions, is_own_session_record,
    parse_md5_failures, parse_neighbors, same_observation, session_record_name, PeerEntry,
    SessionMemory,
};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How often FRR is asked about its sessions.
pub const POLL: Duration = Duration::from_secs(2);
/// Longest a `vtysh` question may take.
const VTYSH_TIMEOUT: Duration = Duration::from_secs(10);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// How long a stopping agent spends deleting its records.
const STOP_DEADLINE: Duration = Duration::from_secs(2);

/// Whose records, where, and where FRR is.
#[derive(Debug, Clone)]
pub struct StatusConfig {
    pub node: String,
    pub namespace: String,
    pub frr_dir: PathBuf,
}

/// Writes `config.node`'s records until `stop`, then deletes them. `peers` is `None` until the
/// speaker's first pass; `applied` ticks when a configuration was applied.
pub async fn run_session_status(
    client: Client,
    config: StatusConfig,
    mut peers: watch::Receiver<Option<Vec<PeerEntry>>>,
    mut applied: watch::Receiver<u64>,
    stop: CancellationToken,
) {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let api: Api<BGPSessionState> = Api::namespaced(client, &config.namespace);
    let mut retry = POLL;
    let mut written = loop {
        match fetch_own(&api, &config.node).await {
            Ok(written) => break written,
            Err(err) => {
                tracing::warn!(error = %err, "listing this node's BGPSessionState records failed; retrying");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(retry) => {}
                }
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    };
    let mut memory = SessionMemory::default();
    let mut wait = POLL;
    loop {
        let current = peers.borrow_and_update().clone();
        if let Some(entries) = current {
            let neighbors = if entries.iter().any(|p| p.left_out.is_none()) {
                ask_frr(&config.frr_dir).await
            } else {
                Some(BTreeMap::new())
            };
            let md5 = tokio::fs::read_to_string("/proc/net/netstat")
                .await
                .ok()
                .and_then(|t| parse_md5_failures(&t));
            let (reports, next) = compute_sessions(&entries, neighbors.as_ref(), md5, &memory);
            memory = next;
            let now = Time(k8s_openapi::jiff::Timestamp::now());
            // A session turning to a misconfiguration is a Warning Event on its BGPPeer.
            for report in &reports {
                let before = written
                    .get(&report.peer)
                    .and_then(|w| w.conditions.first())
                    .map(|c| c.reason.as_str());
                if let Some(event) = build_session_event(&config.node, before, report, now.0) {
                    if let Err(err) = events.create(&PostParams::default(), &event).await {
                        tracing::warn!(peer = %report.peer, error = %err, "recording the BGP session's Event failed");
                    }
                }
            }
            let desired: BTreeMap<String, BGPSessionState> = reports
                .iter()
                .map(|r| {
                    let previous = written.get(&r.peer);
                    let record = build_session_state(
                        &config.node,
                        &config.namespace,
                        r,
                        previous,
                        now.clone(),
                    );
                    (r.peer.clone(), record)
                })
                .collect();
            let complete = apply_records(&api, &config.node, &desired, &mut written).await;
            wait = if complete {
                POLL
            } else {
                (wait * 2).min(RETRY_MAX)
            };
        }
        tokio::select! {
            () = stop.cancelled() => break,
            changed = peers.changed() => if changed.is_err() { break },
            changed = applied.changed() => if changed.is_err() { break },
            () = tokio::time::sleep(wait) => {}
        }
    }
    let cleared = tokio::time::timeout(
        STOP_DEADLINE,
        apply_records(&api, &config.node, &BTreeMap::new(), &mut written),
    )
    .await;
    if !matches!(cleared, Ok(true)) {
        tracing::warn!(
            left = written.len(),
            "not every BGPSessionState record of this node was deleted on stop"
        );
    }
}

/// FRR's neighbors, or `None` when it does not answer.
async fn ask_frr(
    frr_dir: &std::path::Path,
) -> Option<BTreeMap<std::net::IpAddr, berth_bgp::NeighborFacts>> {
    let run = tokio::process::Command::new("vtysh")
        .arg("--vty_socket")
        .arg(frr_dir)
        .args(["-c", "show bgp neighbors json"])
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(VTYSH_TIMEOUT, run).await {
        Ok(Ok(out)) if out.status.success() => out,
        Ok(Ok(out)) => {
            tracing::debug!(status = %out.status, "vtysh failed");
            return None;
        }
        Ok(Err(err)) => {
            tracing::debug!(error = %err, "running vtysh failed");
            return None;
        }
        Err(_) => return None,
    };
    let text = String::from_utf8_lossy(&out.stdout);
    // Without a BGP instance vtysh prints nothing or a `%` line: no neighbors yet.
    if text.trim().is_empty() || text.trim_start().starts_with('%') {
        return Some(BTreeMap::new());
    }
    parse_neighbors(&text).ok()
}

/// This node's records as they are, keyed by peer.
async fn fetch_own(
    api: &Api<BGPSessionState>,
    node: &str,
) -> Result<BTreeMap<String, BGPSessionStateSpec>, kube::Error> {
    let list = api.list(&ListParams::default()).await?;
    Ok(list
        .items
        .into_iter()
        .filter(|r| is_own_session_record(node, r))
        .map(|r| (r.spec.peer.clone(), r.spec))
        .collect())
}

/// Writes the records that differ and deletes those of peers no longer due; returns whether
/// every call succeeded.
async fn apply_records(
    api: &Api<BGPSessionState>,
    node: &str,
    desired: &BTreeMap<String, BGPSessionState>,
    written: &mut BTreeMap<String, BGPSessionStateSpec>,
) -> bool {
    let mut complete = true;
    let params = PatchParams::apply(field_manager::AGENT).force();
    for (peer, record) in desired {
        if written
            .get(peer)
            .is_some_and(|w| same_observation(w, &record.spec))
        {
            continue;
        }
        let name = record.metadata.name.clone().unwrap_or_default();
        match api.patch(&name, &params, &Patch::Apply(record)).await {
            Ok(_) => {
                tracing::info!(
                    peer = %peer,
                    state = %record.spec.bgp_state,
                    reason = %record.spec.conditions.first().map(|c| c.reason.as_str()).unwrap_or(""),
                    "BGP session state"
                );
                written.insert(peer.clone(), record.spec.clone());
            }
            Err(err) => {
                tracing::warn!(peer = %peer, error = %err, "writing the BGPSessionState failed");
                complete = false;
            }
        }
    }
    let gone: Vec<String> = written
        .keys()
        .filter(|p| !desired.contains_key(*p))
        .cloned()
        .collect();
    for peer in gone {
        let name = session_record_name(node, &peer);
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {
                written.remove(&peer);
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                written.remove(&peer);
            }
            Err(err) => {
                tracing::warn!(peer = %peer, error = %err, "deleting the BGPSessionState failed");
                complete = false;
            }
        }
    }
    complete
}

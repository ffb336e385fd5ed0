//! Watch streams: newline-delimited JSON events from the store's history, with bookmarks, initial
//! events for streaming lists, 410 Gone as an ERROR event, timeouts and injected drops.

use super::{ApiError, App};
use crate::resource::ResourceInfo;
use crate::store::ListQuery;
use crate::table::{build_table, partial_metadata, IncludeObject, Wanted};
use crate::watch::{project, EventType};
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use futures::channel::mpsc;
use futures::SinkExt;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Default)]
pub struct WatchParams {
    /// None: start from now, after sending the current state (as rv "" and "0" do upstream).
    pub resource_version: Option<u64>,
    pub bookmarks: bool,
    pub send_initial_events: bool,
    pub timeout: Option<Duration>,
}

impl WatchParams {
    pub fn from_query(query: &HashMap<String, String>) -> Result<Self, ApiError> {
        let flag = |k: &str| query.get(k).is_some_and(|v| v == "true" || v == "1");
        let resource_version =
            match query.get("resourceVersion").map(String::as_str) {
                None | Some("") | Some("0") => None,
                Some(rv) => Some(rv.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid resource version {rv:?}"))
                })?),
            };
        let timeout =
            match query.get("timeoutSeconds") {
                Some(t) if !t.is_empty() => Some(Duration::from_secs(t.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid timeoutSeconds {t:?}"))
                })?)),
                _ => None,
            };
        let send_initial_events = flag("sendInitialEvents");
        if send_initial_events && !flag("allowWatchBookmarks") {
            return Err(ApiError::unprocessable(
                "sendInitialEvents requires allowWatchBookmarks=true",
            ));
        }
        Ok(Self {
            resource_version,
            bookmarks: flag("allowWatchBookmarks"),
            send_initial_events,
            timeout,
        })
    }
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut out = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    out.push(b'\n');
    Bytes::from(out)
}

/// An event around an object's stored JSON text: watchers copy the text encoded once per change.
fn event_line_text(kind: &str, object: &str) -> Bytes {
    let mut out = Vec::with_capacity(object.len() + kind.len() + 24);
    out.extend_from_slice(b"{\"type\":");
    out.extend_from_slice(Value::String(kind.to_owned()).to_string().as_bytes());
    out.extend_from_slice(b",\"object\":");
    out.extend_from_slice(object.as_bytes());
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

/// A watch that asked for Tables gets each object as a one-row Table, as `kubectl get -w` asks.
fn table_line(
    info: &ResourceInfo,
    kind: &str,
    obj: &Arc<Value>,
    api_version: &str,
    include: IncludeObject,
) -> Bytes {
    let meta = json!({"resourceVersion": obj["metadata"]["resourceVersion"]});
    let now = chrono::Utc::now();
    event_line(
        kind,
        &build_table(info, &[obj], meta, api_version, include, now),
    )
}

fn bookmark(info: &ResourceInfo, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    event_line(
        "BOOKMARK",
        &json!({"kind": info.kind, "apiVersion": info.api_version(), "metadata": meta}),
    )
}

pub fn serve_watch(
    app: Arc<App>,
    info: ResourceInfo,
    ns: Option<String>,
    q: ListQuery,
    params: WatchParams,
    wanted: Wanted,
) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(256);
    tokio::spawn(run(app, info, ns, q, params, wanted, tx));
    let mut resp = Response::new(Body::from_stream(rx));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

async fn run(
    app: Arc<App>,
    info: ResourceInfo,
    ns: Option<String>,
    q: ListQuery,
    params: WatchParams,
    wanted: Wanted,
    mut tx: mpsc::Sender<Result<Bytes, Infallible>>,
) {
    let api_version = info.api_version();
    let storage_key = info.storage_key();
    let scope = ns.filter(|_| info.namespaced);
    let mut changed = app.subscribe();
    let selection = ListQuery {
        limit: None,
        continue_token: None,
        ..q.clone()
    };
    let start = {
        let store = app.store();
        // A streaming list always starts with the current state (which is never older than asked).
        match params
            .resource_version
            .filter(|_| !params.send_initial_events)
        {
            Some(rv) => store.changes_since(rv).map(|_| (rv, Vec::new())),
            None => store
                .list(&info, scope.as_deref(), &selection)
                .map(|page| (page.resource_version, page.items)),
        }
    };
    let (mut cursor, initial) = match start {
        Ok(s) => s,
        Err(e) => {
            let _ = tx.send(Ok(event_line("ERROR", &e.to_status()))).await;
            return;
        }
    };
    for stored in &initial {
        if tx
            .send(Ok(match wanted {
                Wanted::Json => event_line_text("ADDED", &stored.json_as(&api_version)),
                Wanted::Table {
                    api_version,
                    include,
                } => table_line(&info, "ADDED", &stored.obj, api_version, include),
                Wanted::Metadata { api_version } => {
                    event_line("ADDED", &partial_metadata(&stored.obj, api_version))
                }
            }))
            .await
            .is_err()
        {
            return;
        }
    }
    if params.send_initial_events
        && params.bookmarks
        && tx.send(Ok(bookmark(&info, cursor, true))).await.is_err()
    {
        return;
    }
    let deadline = params.timeout.map(|t| tokio::time::Instant::now() + t);
    let tick = app.bookmark_interval.min(Duration::from_secs(1));
    let mut idle = Duration::ZERO;
    loop {
        let batch = {
            let store = app.store();
            store
                .changes_since(cursor)
                .map(|c| (c, store.resource_version()))
        };
        let (changes, now_rv) = match batch {
            Ok(b) => b,
            Err(e) => {
                let _ = tx.send(Ok(event_line("ERROR", &e.to_status()))).await;
                return;
            }
        };
        for change in &changes {
            if change.storage_key != storage_key
                || scope.as_deref().is_some_and(|s| s != change.namespace)
            {
                continue;
            }
            if let Some(kind) = project(change, |o| q.matches(o)) {
                let shown = match (change.kind, kind, &change.old) {
                    // Leaving the selection: the object as it last matched.
                    (EventType::Modified, EventType::Deleted, Some(old)) => old,
                    _ => &change.object,
                };
                let line = match wanted {
                    Wanted::Json => {
                        event_line_text(kind.as_str(), &change.text_seen_as(kind, &api_version))
                    }
                    Wanted::Table {
                        api_version,
                        include,
                    } => table_line(&info, kind.as_str(), shown, api_version, include),
                    Wanted::Metadata { api_version } => {
                        let mut partial = partial_metadata(shown, api_version);
                        // Every event carries its change's version, where a resumed watch starts.
                        partial["metadata"]["resourceVersion"] = json!(change.rv.to_string());
                        event_line(kind.as_str(), &partial)
                    }
                };
                if tx.send(Ok(line)).await.is_err() {
                    return;
                }
            }
        }
        cursor = cursor.max(now_rv);
        if !changes.is_empty() {
            idle = Duration::ZERO;
        }
        if app.fault_state().drop_watch() {
            return;
        }
        let sleep = match deadline {
            Some(d) => tick.min(d.saturating_duration_since(tokio::time::Instant::now())),
            None => tick,
        };
        tokio::select! {
            _ = changed.changed() => {}
            _ = tokio::time::sleep(sleep) => {
                idle += sleep;
                if tx.is_closed() {
                    return;
                }
                if params.bookmarks && idle >= app.bookmark_interval {
                    idle = Duration::ZERO;
                    if tx.send(Ok(bookmark(&info, cursor, false))).await.is_err() {
                        return;
                    }
                }
            }
            _ = app.shutdown.cancelled() => return,
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn params_from_query() {
        let p = WatchParams::from_query(&q(&[
            ("resourceVersion", "42"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", "5"),
        ]))
        .unwrap();
        assert_eq!(p.resource_version, Some(42));
        assert!(p.bookmarks && !p.send_initial_events);
        assert_eq!(p.timeout, Some(Duration::from_secs(5)));
        for rv in ["", "0"] {
            assert_eq!(
                WatchParams::from_query(&q(&[("resourceVersion", rv)]))
                    .unwrap()
                    .resource_version,
                None
            );
        }
        assert_eq!(
            WatchParams::from_query(&q(&[("resourceVersion", "x")]))
                .unwrap_err()
                .code,
            400
        );
        assert_eq!(
            WatchParams::from_query(&q(&[("sendInitialEvents", "true")]))
                .unwrap_err()
                .code,
            422
        );
    }

    #[test]
    fn bookmark_shapes() {
        let info = crate::resource::built_ins().remove(1);
        let line: Value = serde_json::from_slice(&bookmark(&info, 7, true)).unwrap();
        assert_eq!(line["type"], "BOOKMARK");
        assert_eq!(line["object"]["metadata"]["resourceVersion"], "7");
        assert_eq!(
            line["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );
        let plain: Value = serde_json::from_slice(&bookmark(&info, 8, false)).unwrap();
        assert!(plain["object"]["metadata"].get("annotations").is_none());
    }

    #[test]
    fn event_around_stored_text() {
        let object = json!({"kind": "Pod", "metadata": {"name": "p\"q"}});
        let line = event_line_text("MODIFIED", &object.to_string());
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        let parsed: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(parsed, json!({"type": "MODIFIED", "object": object}));
        assert_eq!(
            serde_json::from_slice::<Value>(&line).unwrap(),
            serde_json::from_slice::<Value>(&event_line("MODIFIED", &object)).unwrap()
        );
    }
}

//! The HTTP face of the store: one fallback handler that routes Kubernetes API paths by hand, because
//! custom resources appear and disappear at run time.

mod requests;
mod route;
mod scale;
mod verbs;
mod watch;

pub use requests::RecordedRequest;

use super::discovery;
use super::error::ApiError;
use super::faults::{FaultState, Faults};
use super::store::Store;
use super::write::{Door, Managed, WriteCtx};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use axum::Router;
use requests::RequestLog;
use route::Route;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Shared server state.
pub struct App {
    store: Mutex<Store>,
    changed: tokio::sync::watch::Sender<u64>,
    faults: Mutex<FaultState>,
    pub shutdown: CancellationToken,
    pub bookmark_interval: Duration,
    pub server_address: Mutex<String>,
    reads: AtomicU64,
    writes: AtomicU64,
    /// Off unless the server was built with `record_requests`.
    pub requests: RequestLog,
}

/// Kubernetes API requests served so far (admin and health endpoints not counted), so that
/// benchmarks can report what a client costs the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestCounts {
    /// get, list and watch.
    pub reads: u64,
    /// create, update, patch and delete.
    pub writes: u64,
}

impl App {
    pub fn new(store: Store, faults: Faults, bookmark_interval: Duration) -> Self {
        let (changed, _) = tokio::sync::watch::channel(store.resource_version());
        Self {
            store: Mutex::new(store),
            changed,
            faults: Mutex::new(FaultState::new(faults)),
            shutdown: CancellationToken::new(),
            bookmark_interval,
            server_address: Mutex::new(String::new()),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            requests: RequestLog::default(),
        }
    }

    pub fn request_counts(&self) -> RequestCounts {
        RequestCounts {
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
        }
    }

    /// The store, even if a panicking thread poisoned the lock: the store's own invariants hold
    /// between calls, since every write completes before it is published.
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run a write and wake the watchers.
    pub fn write<T>(&self, f: impl FnOnce(&mut Store) -> T) -> T {
        let (out, rv) = {
            let mut store = self.store();
            let out = f(&mut store);
            (out, store.resource_version())
        };
        self.changed.send_if_modified(|cur| {
            let moved = *cur != rv;
            *cur = rv;
            moved
        });
        out
    }

    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub fn fault_state(&self) -> MutexGuard<'_, FaultState> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_faults(&self, faults: Faults) -> Result<(), String> {
        faults.validate()?;
        self.fault_state().set(faults);
        Ok(())
    }
}

/// The time a write is stamped with, as the API shows times (RFC 3339, whole seconds, UTC).
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The field manager of a non-apply write: the `fieldManager` parameter, else the client's
/// user-agent product name, as the apiserver derives it.
fn manager_of(query: &HashMap<String, String>, headers: &HeaderMap) -> String {
    if let Some(m) = query.get("fieldManager").filter(|m| !m.is_empty()) {
        return m.clone();
    }
    headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .filter(|s| !s.is_empty())
        .unwrap_or("unknown")
        .to_owned()
}

/// Runs a create, update or non-apply patch: the request's field manager owns what it sets,
/// and the write is stamped with the time it was asked for.
fn write_as_manager<T>(
    app: &App,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    door: Door,
    write: impl FnOnce(&mut Store, &WriteCtx) -> T,
) -> T {
    let manager = manager_of(query, headers);
    let t = now();
    let ctx = WriteCtx {
        now: &t,
        door,
        managed: Managed::Track(&manager),
    };
    app.write(|s| write(s, &ctx))
}

pub fn router(app: Arc<App>) -> Router {
    Router::new().fallback(dispatch).with_state(app)
}

/// A discovery document, or the apiserver's 404 for a group or version it does not serve.
fn found(doc: Option<Value>, uri: &Uri) -> Result<Response, ApiError> {
    doc.map(|d| json_response(StatusCode::OK, &d))
        .ok_or_else(|| ApiError::page_not_found(uri.path()))
}

pub(crate) fn json_response(code: StatusCode, body: &Value) -> Response {
    bytes_response(code, serde_json::to_vec(body).unwrap_or_default())
}

pub(crate) fn bytes_response(code: StatusCode, body: Vec<u8>) -> Response {
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

pub(crate) fn error_response(err: &ApiError) -> Response {
    let code = StatusCode::from_u16(err.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = json_response(code, &err.to_status());
    if let Some(secs) = err
        .details
        .as_ref()
        .and_then(|d| d["retryAfterSeconds"].as_u64())
    {
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    resp
}

fn query_map(uri: &Uri) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for pair in uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.insert(decode(k), decode(v));
    }
    out
}

/// Percent-decoding of query components (`+` is a space in form encoding).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'+', _) => out.push(b' '),
            (b'%', Some(b)) => {
                out.push(b);
                i += 2;
            }
            (b, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn dispatch(
    State(app): State<Arc<App>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let route = route::parse(uri.path());
    let query = query_map(&uri);
    match route {
        Route::Faults => return faults_endpoint(&app, &method, &body),
        Route::Compact => {
            app.write(Store::compact);
            return json_response(
                StatusCode::OK,
                &serde_json::json!({"compacted": app.store().resource_version()}),
            );
        }
        Route::Healthz => return bytes_response(StatusCode::OK, b"ok".to_vec()),
        Route::Requests => return requests_endpoint(&app, &method),
        Route::Resource(ref path) => app.requests.record(&method, path, &query, &headers),
        _ => {}
    }
    // A server-side apply that creates its object answers 201; the authorizer checks `create`
    // for it as well as `patch`.
    let applied = match &route {
        Route::Resource(path) if method == Method::PATCH => Some(path.clone()),
        _ => None,
    };
    let counter = if method == Method::GET || method == Method::HEAD {
        &app.reads
    } else {
        &app.writes
    };
    counter.fetch_add(1, Ordering::Relaxed);
    let latency = app.fault_state().faults().latency();
    if let Some(latency) = latency {
        tokio::time::sleep(latency).await;
    }
    let result = match route {
        Route::Version => Ok(json_response(StatusCode::OK, &discovery::version())),
        Route::CoreGroup => {
            let addr = app
                .server_address
                .lock()
                .map(|a| a.clone())
                .unwrap_or_default();
            Ok(json_response(
                StatusCode::OK,
                &discovery::api_versions(&addr),
            ))
        }
        Route::Groups => Ok(json_response(
            StatusCode::OK,
            &discovery::api_group_list(app.store().catalogue()),
        )),
        Route::Group(g) => found(discovery::api_group(app.store().catalogue(), &g), &uri),
        Route::GroupVersion { group, version } => found(
            discovery::resource_list(app.store().catalogue(), &group, &version),
            &uri,
        ),
        Route::OpenApiV3Root => Ok(json_response(
            StatusCode::OK,
            &discovery::openapi_v3_root(app.store().catalogue()),
        )),
        Route::OpenApiV3(gv) => found(
            discovery::openapi_v3_group_version(app.store().catalogue(), &gv),
            &uri,
        ),
        Route::Resource(path) => {
            verbs::handle(app.clone(), method, path, query, &headers, body).await
        }
        Route::OpenApi
        | Route::Unknown
        | Route::Faults
        | Route::Compact
        | Route::Healthz
        | Route::Requests => Err(ApiError::page_not_found(uri.path())),
    };
    let response = result.unwrap_or_else(|e| error_response(&e));
    if let Some(path) = applied.filter(|_| response.status() == StatusCode::CREATED) {
        app.requests.record_create_by_apply(&path, &headers);
    }
    response
}

/// `GET /lab/requests`: the request log; `DELETE` empties it.
fn requests_endpoint(app: &App, method: &Method) -> Response {
    if *method == Method::DELETE {
        app.requests.clear();
    }
    json_response(
        StatusCode::OK,
        &serde_json::json!({
            "enabled": app.requests.is_enabled(),
            "requests": app.requests.snapshot(),
        }),
    )
}

fn faults_endpoint(app: &App, method: &Method, body: &[u8]) -> Response {
    if *method == Method::PUT || *method == Method::POST {
        let parsed: Result<Faults, _> = serde_json::from_slice(body);
        match parsed
            .map_err(|e| e.to_string())
            .and_then(|f| app.set_faults(f))
        {
            Ok(()) => {}
            Err(e) => return error_response(&ApiError::bad_request(e)),
        }
    }
    let current = app.fault_state().faults().clone();
    json_response(
        StatusCode::OK,
        &serde_json::to_value(current).unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn percent_decoding() {
        assert_eq!(decode("app%3Dweb%2Ctier+in+%28a%29"), "app=web,tier in (a)");
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("a%2"), "a%2");
    }
}

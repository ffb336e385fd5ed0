//! The request log: what each client asked of the API, in RBAC's terms (verb, API group, resource,
//! subresource, namespace, name), so that tests can compare what berth really calls with the rules
//! its Helm chart grants. Off unless the server was started with it; served at `/lab/requests`.
//!
//! A client is told apart by its bearer token (give each component a kubeconfig with its own
//! token), else by its `User-Agent`. Identical requests are counted, not repeated, so the log
//! stays small however long a run is.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use axum::http::{header, HeaderMap, Method};
use serde::{Deserialize, Serialize};

use super::route::ResourcePath;

/// One kind of request as an RBAC authorizer sees it. Empty strings stand for "none": the core
/// API group, no subresource, a cluster-wide request, a request on a collection.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedRequest {
    pub identity: String,
    pub verb: String,
    pub api_group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// How many times it was made.
    pub count: u64,
}

/// The RBAC verb of a request on a resource path, as the apiserver's request-info resolver
/// derives it.
pub fn rbac_verb(
    method: &Method,
    path: &ResourcePath,
    query: &HashMap<String, String>,
) -> &'static str {
    let watch = query.get("watch").is_some_and(|v| v == "true" || v == "1");
    match (method.as_str(), path.name.is_some()) {
        ("GET" | "HEAD", _) if watch => "watch",
        ("GET" | "HEAD", true) => "get",
        ("GET" | "HEAD", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

/// Who made a request: the bearer token, else the user agent, else `anonymous`.
pub fn identity(headers: &HeaderMap) -> String {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let agent = || {
        headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .filter(|a| !a.is_empty())
    };
    bearer.or_else(agent).unwrap_or("anonymous").to_owned()
}

type Key = (String, String, String, String, String, String, String);

#[derive(Debug, Default)]
pub struct RequestLog {
    enabled: AtomicBool,
    seen: Mutex<BTreeMap<Key, u64>>,
}

impl RequestLog {
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    fn seen(&self) -> MutexGuard<'_, BTreeMap<Key, u64>> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one request, when the log is on.
    pub fn record(
        &self,
        method: &Method,
        path: &ResourcePath,
        query: &HashMap<String, String>,
        headers: &HeaderMap,
    ) {
        self.record_as(rbac_verb(method, path, query), path, headers);
    }

    /// Counts the `create` an RBAC authorizer also checks when a server-side apply (a `patch`)
    /// creates its object: an apply that may create needs both verbs.
    pub fn record_create_by_apply(&self, path: &ResourcePath, headers: &HeaderMap) {
        self.record_as("create", path, headers);
    }

    fn record_as(&self, verb: &str, path: &ResourcePath, headers: &HeaderMap) {
        if !self.is_enabled() {
            return;
        }
        let key = (
            identity(headers),
            verb.to_owned(),
            path.group.clone(),
            path.plural.clone(),
            path.subresource.clone().unwrap_or_default(),
            path.namespace.clone().unwrap_or_default(),
            path.name.clone().unwrap_or_default(),
        );
        *self.seen().entry(key).or_insert(0) += 1;
    }

    /// Everything recorded so far, sorted.
    pub fn snapshot(&self) -> Vec<RecordedRequest> {
        self.seen()
            .iter()
            .map(|(k, count)| RecordedRequest {
                identity: k.0.clone(),
                verb: k.1.clone(),
                api_group: k.2.clone(),
                resource: k.3.clone(),
                subresource: k.4.clone(),
                namespace: k.5.clone(),
                name: k.6.clone(),
                count: *count,
            })
            .collect()
    }

    pub fn clear(&self) {
        self.seen().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::route::{parse, Route};
    use axum::http::HeaderValue;

    fn path(p: &str) -> ResourcePath {
        match parse(p) {
            Route::Resource(r) => r,
            other => panic!("{p}: {other:?}"),
        }
    }

    fn query(q: &[(&str, &str)]) -> HashMap<String, String> {
        q.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn verbs_follow_the_apiserver() {
        let svc = path("/api/v1/namespaces/web/services/a");
        let all = path("/api/v1/services");
        let none = query(&[]);
        for (method, p, q, verb) in [
            (Method::GET, &svc, &none, "get"),
            (Method::GET, &all, &none, "list"),
            (Method::GET, &all, &query(&[("watch", "true")]), "watch"),
            (Method::GET, &all, &query(&[("watch", "1")]), "watch"),
            (Method::GET, &all, &query(&[("watch", "false")]), "list"),
            (Method::POST, &all, &none, "create"),
            (Method::PUT, &svc, &none, "update"),
            (Method::PATCH, &svc, &none, "patch"),
            (Method::DELETE, &svc, &none, "delete"),
            (Method::DELETE, &all, &none, "deletecollection"),
            (Method::OPTIONS, &all, &none, "unknown"),
        ] {
            assert_eq!(rbac_verb(&method, p, q), verb, "{method} {p:?} {q:?}");
        }
    }

    #[test]
    fn identity_is_the_token_then_the_user_agent() {
        let mut h = HeaderMap::new();
        assert_eq!(identity(&h), "anonymous");
        h.insert(
            header::USER_AGENT,
            HeaderValue::from_static("kubectl/v1.34"),
        );
        assert_eq!(identity(&h), "kubectl/v1.34");
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer agent"),
        );
        assert_eq!(identity(&h), "agent");
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic eDp5"),
        );
        assert_eq!(identity(&h), "kubectl/v1.34");
    }

    #[test]
    fn requests_are_counted_per_kind_and_only_when_on() {
        let log = RequestLog::default();
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer c"));
        let status = path("/api/v1/namespaces/web/services/a/status");
        let q = query(&[]);
        log.record(&Method::PATCH, &status, &q, &h);
        assert!(log.snapshot().is_empty(), "recorded while off");
        log.set_enabled(true);
        log.record(&Method::PATCH, &status, &q, &h);
        log.record(&Method::PATCH, &status, &q, &h);
        log.record(
            &Method::GET,
            &path("/apis/berth.dev/v1alpha1/ippools"),
            &q,
            &h,
        );
        let got = log.snapshot();
        assert_eq!(got.len(), 2);
        let patch = got.iter().find(|r| r.verb == "patch").unwrap();
        assert_eq!(
            (
                patch.identity.as_str(),
                patch.api_group.as_str(),
                patch.resource.as_str(),
                patch.subresource.as_str(),
                patch.namespace.as_str(),
                patch.name.as_str(),
                patch.count
            ),
            ("c", "", "services", "status", "web", "a", 2)
        );
        let list = got.iter().find(|r| r.verb == "list").unwrap();
        assert_eq!(
            (
                list.api_group.as_str(),
                list.resource.as_str(),
                list.namespace.as_str()
            ),
            ("berth.dev", "ippools", "")
        );
        log.clear();
        assert!(log.snapshot().is_empty());
    }
}

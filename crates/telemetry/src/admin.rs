//! The admin HTTP endpoint every berth process exposes: liveness, readiness and metrics.

use std::future::Future;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use crate::{Error, Readiness, SharedRegistry, OPENMETRICS_CONTENT_TYPE};

const TEXT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";

#[derive(Clone)]
struct AdminState {
    registry: SharedRegistry,
    readiness: Readiness,
}

/// `/healthz` (the process is serving), `/readyz` (every readiness check passes; the body names
/// the failing ones) and `/metrics` (OpenMetrics text).
pub fn admin_router(registry: SharedRegistry, readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(AdminState {
            registry,
            readiness,
        })
}

async fn healthz() -> Response {
    ([(CONTENT_TYPE, TEXT_CONTENT_TYPE)], "ok\n").into_response()
}

async fn readyz(State(state): State<AdminState>) -> Response {
    let report = state.readiness.report();
    let status = if report.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, [(CONTENT_TYPE, TEXT_CONTENT_TYPE)], report.render()).into_response()
}

async fn metrics(State(state): State<AdminState>) -> Response {
    match state.registry.encode() {
        Ok(body) => ([(CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], body).into_response(),
        Err(err) => {
            tracing::warn!(error = %err, "encoding metrics failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(CONTENT_TYPE, TEXT_CONTENT_TYPE)],
                format!("{err}\n"),
            )
                .into_response()
        }
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets in-flight requests finish.
/// The caller binds the listener, so it chooses the address (and tests can use port 0).
pub async fn serve_admin<F>(listener: TcpListener, router: Router, shutdown: F) -> Result<(), Error>
where
    F: Future<Output = ()> + Send + 'static,
{
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "admin endpoint listening");
    }
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(Error::Serve)
}

#[cfg(test)]
mod tests {
    use axum::body::{to_bytes, Body};
    use axum::http::{Method, Request};
    use prometheus_client::metrics::counter::Counter;
    use tower::ServiceExt;

    use super::*;
    use crate::MetricsRegistry;

    async fn call(router: Router, method: Method, path: &str) -> (StatusCode, String, String) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap();
        let response = router.oneshot(request).await.unwrap();
        let status = response.status();
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let body = to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (
            status,
            content_type,
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    fn mk_router(readiness: &Readiness) -> (Router, Counter) {
        let mut metrics = MetricsRegistry::new();
        let counter = Counter::default();
        metrics.register("reconciles", "Reconciles run", counter.clone());
        (
            admin_router(metrics.into_shared(), readiness.clone()),
            counter,
        )
    }

    #[tokio::test]
    async fn healthz_is_ok_even_when_not_ready() {
        let readiness = Readiness::new();
        let _check = readiness.register("leader").unwrap();
        let (router, _) = mk_router(&readiness);
        let (status, content_type, body) = call(router, Method::GET, "/healthz").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type, TEXT_CONTENT_TYPE);
        assert_eq!(body, "ok\n");
    }

    #[tokio::test]
    async fn readyz_names_the_failing_check() {
        let readiness = Readiness::new();
        let leader = readiness.register("leader").unwrap();
        let _informers = readiness.register("informers").unwrap();
        leader.set_ready(true);
        let (router, _) = mk_router(&readiness);
        let (status, _, body) = call(router, Method::GET, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            body,
            "[+]leader ok\n[-]informers failed\nreadyz check failed\n"
        );
    }

    #[tokio::test]
    async fn readyz_follows_flips_on_the_same_router() {
        let readiness = Readiness::new();
        let check = readiness.register("datapath").unwrap();
        let (router, _) = mk_router(&readiness);
        let (status, _, _) = call(router.clone(), Method::GET, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        check.set_ready(true);
        let (status, _, body) = call(router.clone(), Method::GET, "/readyz").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, "[+]datapath ok\nreadyz check passed\n");
        drop(check);
        let (status, _, _) = call(router, Method::GET, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    }

    #[tokio::test]
    async fn metrics_are_openmetrics_text() {
        let readiness = Readiness::new();
        let (router, counter) = mk_router(&readiness);
        counter.inc_by(5);
        let (status, content_type, body) = call(router, Method::GET, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type, OPENMETRICS_CONTENT_TYPE);
        assert!(body.contains("# TYPE berth_reconciles counter\n"), "{body}");
        assert!(body.contains("berth_reconciles_total 5\n"), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");
    }

    #[tokio::test]
    async fn unknown_paths_are_not_found() {
        let (router, _) = mk_router(&Readiness::new());
        let (status, _, _) = call(router, Method::GET, "/debug").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn writes_are_not_allowed() {
        let (router, _) = mk_router(&Readiness::new());
        let (status, _, _) = call(router, Method::POST, "/readyz").await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    }

    #[tokio::test]
    async fn head_is_answered_for_probes() {
        let (router, _) = mk_router(&Readiness::new());
        let (status, _, body) = call(router, Method::HEAD, "/healthz").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.is_empty());
    }
}

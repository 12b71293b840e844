//! The admin HTTP listener: `/metrics` (Prometheus text), `/healthz`, `/readyz`,
//! `GET /pipelines` (status with active versions and counters, never secrets) and
//! `POST /pipelines/NAME/swap` (hot-swap to another component file; a bearer token can be
//! required). Binds 127.0.0.1 by default.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::pipeline::Pipeline;

/// What the admin handlers share.
pub struct AdminState {
    /// Every pipeline of the manifest.
    pub pipelines: Vec<Arc<Pipeline>>,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// Bearer token for mutating endpoints, when configured.
    pub token: Option<String>,
    /// Set once every pipeline joined its group.
    pub ready: AtomicBool,
}

#[derive(Deserialize)]
struct SwapBody {
    path: PathBuf,
}

fn authorized(state: &AdminState, headers: &HeaderMap) -> bool {
    let Some(token) = &state.token else {
        return true;
    };
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t == token)
}

async fn metrics(State(s): State<Arc<AdminState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.encode(),
    )
        .into_response()
}

async fn ready(State(s): State<Arc<AdminState>>) -> Response {
    if s.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response()
    }
}

async fn pipelines(State(s): State<Arc<AdminState>>) -> Response {
    let status: Vec<_> = s.pipelines.iter().map(|p| p.status()).collect();
    axum::Json(status).into_response()
}

async fn swap(
    State(s): State<Arc<AdminState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Response {
    if !authorized(&s, &headers) {
        return (
            StatusCode::UNAUTHORIZED,
            "a valid bearer token is required\n",
        )
            .into_response();
    }
    let Some(p) = s.pipelines.iter().find(|p| p.name() == name) else {
        return (
            StatusCode::NOT_FOUND,
            format!("no pipeline named {name:?}\n"),
        )
            .into_response();
    };
    let path = match serde_json::from_str::<SwapBody>(&body) {
        Ok(b) => b.path,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("expected {{\"path\": \"...\"}}: {e}\n"),
            )
                .into_response();
        }
    };
    match p.swap(&path).await {
        Ok(hash) => axum::Json(serde_json::json!({ "pipeline": name, "active_version": hash }))
            .into_response(),
        Err(e) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(serde_json::json!({ "pipeline": name, "error": e.to_string() })),
        )
            .into_response(),
    }
}

/// Serves the admin endpoints on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AdminState>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/pipelines", get(pipelines))
        .route("/pipelines/{name}/swap", post(swap))
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(token: Option<&str>) -> AdminState {
        AdminState {
            pipelines: Vec::new(),
            metrics: Arc::new(Metrics::new()),
            token: token.map(str::to_owned),
            ready: AtomicBool::new(false),
        }
    }

    fn headers(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(header::AUTHORIZATION, a.parse().expect("header value"));
        }
        h
    }

    #[test]
    fn mutating_endpoints_need_the_bearer_token_when_one_is_set() {
        assert!(
            authorized(&state(None), &headers(None)),
            "no token configured: open"
        );
        let s = state(Some("s3cret"));
        assert!(!authorized(&s, &headers(None)));
        assert!(!authorized(&s, &headers(Some("Bearer wrong"))));
        assert!(
            !authorized(&s, &headers(Some("s3cret"))),
            "the Bearer scheme is required"
        );
        assert!(authorized(&s, &headers(Some("Bearer s3cret"))));
    }
}

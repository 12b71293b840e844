//! The admin HTTP listener: `/metrics` (Prometheus text), `/healthz`, `/readyz`,
//! `GET /pipelines` (status with active versions and counters, never secrets),
//! `GET /pipelines/NAME/versions`, and the rollout endpoints, which a bearer token can guard:
//! `POST /pipelines/NAME/swap`, `.../rollback`, `.../shadow` (and `DELETE`), `.../canary`
//! (and `DELETE`), `.../promote`. Binds 127.0.0.1 by default.

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
use crate::pipeline::{Pipeline, SwapError};
use crate::rollout::{CanaryRequest, ShadowRequest};

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

/// The pipeline a mutating request is for, after checking its token: `Err` is the answer to
/// send (401 or 404).
fn target(s: &AdminState, headers: &HeaderMap, name: &str) -> Result<Arc<Pipeline>, Box<Response>> {
    if !authorized(s, headers) {
        return Err(Box::new(
            (
                StatusCode::UNAUTHORIZED,
                "a valid bearer token is required\n",
            )
                .into_response(),
        ));
    }
    s.pipelines
        .iter()
        .find(|p| p.name() == name)
        .cloned()
        .ok_or_else(|| {
            Box::new(
                (
                    StatusCode::NOT_FOUND,
                    format!("no pipeline named {name:?}\n"),
                )
                    .into_response(),
            )
        })
}

/// A JSON body, or the 400 answer naming what was expected.
fn body<T: serde::de::DeserializeOwned>(text: &str, expected: &str) -> Result<T, Box<Response>> {
    // An empty body is an empty object: `{}` and nothing mean the same for optional fields.
    let text = if text.trim().is_empty() { "{}" } else { text };
    serde_json::from_str(text).map_err(|e| {
        Box::new(
            (
                StatusCode::BAD_REQUEST,
                format!("expected {expected}: {e}\n"),
            )
                .into_response(),
        )
    })
}

/// The answer to a version change: 200 with `key` = the hash, or 422 with the reason.
fn outcome(name: &str, key: &str, r: Result<String, SwapError>) -> Response {
    match r {
        Ok(hash) => axum::Json(serde_json::json!({ "pipeline": name, key: hash })).into_response(),
        Err(e) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(serde_json::json!({ "pipeline": name, "error": e.to_string() })),
        )
            .into_response(),
    }
}

async fn versions(State(s): State<Arc<AdminState>>, Path(name): Path<String>) -> Response {
    match s.pipelines.iter().find(|p| p.name() == name) {
        Some(p) => axum::Json(p.versions()).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no pipeline named {name:?}\n"),
        )
            .into_response(),
    }
}

#[derive(Deserialize)]
struct RollbackBody {
    hash: Option<String>,
}

async fn rollback(
    State(s): State<Arc<AdminState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    text: String,
) -> Response {
    let p = match target(&s, &headers, &name) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let b: RollbackBody = match body(&text, r#"{"hash": "..."} or nothing"#) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    outcome(&name, "active_version", p.rollback(b.hash.as_deref()).await)
}

async fn shadow(
    State(s): State<Arc<AdminState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    text: String,
) -> Response {
    let p = match target(&s, &headers, &name) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let req: ShadowRequest = match body(&text, r#"{"path": "...", "sample": 0.5}"#) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    outcome(&name, "candidate", p.start_shadow(req).await)
}

async fn shadow_stop(
    State(s): State<Arc<AdminState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let p = match target(&s, &headers, &name) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    match p.stop_shadow() {
        Some(status) => {
            axum::Json(serde_json::json!({ "pipeline": name, "shadow": status })).into_response()
        }
        None => (
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(serde_json::json!({ "pipeline": name, "error": "no shadow is running" })),
        )
            .into_response(),
    }
}

async fn canary(
    State(s): State<Arc<AdminState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    text: String,
) -> Response {
    let p = match target(&s, &headers, &name) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let req: CanaryRequest = match body(
        &text,
        r#"{"path": "...", "percent": 10, "promote_after": {"batches": 100}, "rollback_if": {...}}"#,
    ) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    outcome(&name, "candidate", p.start_canary(req).await)
}

async fn canary_stop(
    State(s): State<Arc<AdminState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let p = match target(&s, &headers, &name) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    outcome(&name, "active_version", p.stop_canary().await)
}

async fn promote(
    State(s): State<Arc<AdminState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let p = match target(&s, &headers, &name) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    outcome(&name, "active_version", p.promote_canary().await)
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
        .route("/pipelines/{name}/versions", get(versions))
        .route("/pipelines/{name}/rollback", post(rollback))
        .route("/pipelines/{name}/shadow", post(shadow).delete(shadow_stop))
        .route("/pipelines/{name}/canary", post(canary).delete(canary_stop))
        .route("/pipelines/{name}/promote", post(promote))
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

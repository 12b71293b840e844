//! The admin HTTP listener: `/metrics` (Prometheus text), `/healthz`, `/readyz`,
//! `GET /pipelines` (status with active versions and counters, never secrets),
//! `GET /pipelines/NAME/versions`, and the rollout endpoints, which a bearer token can guard:
//! `POST /pipelines/NAME/swap`, `.../rollback`, `.../shadow` (and `DELETE`), `.../canary`
//! (and `DELETE`), `.../promote`. Binds 127.0.0.1 by default. The console in the browser and
//! its read endpoints (`/console`, `GET /host`, `GET /faults`, a pipeline's dead letters) are
//! in [`crate::console`]; what both share (the state and the token check) in [`context`], so the
//! console depends on that alone. Every request of both passes [`guard`] first: its `Host`
//! must name the listener, and one that changes something must be JSON from no other origin.

pub(crate) mod context;
pub(crate) mod guard;

pub use context::AdminState;
pub(crate) use context::authorized;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio_util::sync::CancellationToken;

use sharehost_api::{
    self as api, CanaryBody, CandidateStarted, PipelineRoute, Refused, RollbackRequest, ShadowBody,
    ShadowStopped, SwapRequest, VersionChanged,
};

use crate::api::parse_body;
use crate::pipeline::{Pipeline, SwapError};
use crate::rollout::{CanaryRequest, ShadowRequest};

async fn metrics(State(s): State<Arc<AdminState>>) -> Response {
    s.metrics.ready.set(i64::from(s.tenants.ready().is_ok()));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.encode(),
    )
        .into_response()
}

/// Ready means every pipeline is loaded, in its group and able to write: not while one
/// failed to load, is still joining, cannot reach its coordinator, or waits for its writes.
async fn ready(State(s): State<Arc<AdminState>>) -> Response {
    match s.tenants.ready() {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready:\n{why}\n"),
        )
            .into_response(),
    }
}

async fn pipelines(State(s): State<Arc<AdminState>>) -> Response {
    axum::Json(s.tenants.status()).into_response()
}

/// How the host's manifest was last read: when the one it runs was applied, re-reads applied
/// and refused, and why the last was refused.
async fn manifest_status(State(s): State<Arc<AdminState>>) -> Response {
    axum::Json(s.tenants.manifest_status()).into_response()
}

/// The fleet as this host sees it: what the fleet wants of each pipeline, every host's last
/// status (stale ones marked). Read-only, like `/pipelines`: changes go through signed
/// actions in the deployments topic (`sharehost fleet`), never through one host's API.
async fn fleet(State(s): State<Arc<AdminState>>) -> Response {
    match &s.fleet {
        Some(f) => axum::Json(f.view()).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "this host is not in a fleet (no [fleet] in its manifest)\n",
        )
            .into_response(),
    }
}

async fn swap(
    State(s): State<Arc<AdminState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    text: Bytes,
) -> Answer {
    let p = target(&s, &headers, &name)?;
    let b: SwapRequest = body(&text, r#"{"path": "..."}"#)?;
    Ok(changed(&name, p.swap(&b.path).await))
}

/// A request refused before it reached its pipeline (401, 404, 400): the answer to send.
/// Boxed because a `Response` is large and travels in every handler's `Err`.
struct Refusal(Box<Response>);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        *self.0
    }
}

fn refusal(status: StatusCode, text: String) -> Refusal {
    Refusal(Box::new((status, text).into_response()))
}

/// What a mutating handler answers: the pipeline's answer, or why it never got there.
type Answer = Result<Response, Refusal>;

/// The pipeline a mutating request is for, after checking its token (401, 404 otherwise).
fn target(s: &AdminState, headers: &HeaderMap, name: &str) -> Result<Arc<Pipeline>, Refusal> {
    if !authorized(s, headers) {
        return Err(refusal(
            StatusCode::UNAUTHORIZED,
            "a valid bearer token is required\n".into(),
        ));
    }
    s.tenants.find(name).ok_or_else(|| {
        refusal(
            StatusCode::NOT_FOUND,
            format!("no pipeline named {name:?}\n"),
        )
    })
}

/// A JSON body ([`parse_body`]), or the 400 answer naming what was expected.
fn body<T: serde::de::DeserializeOwned>(bytes: &[u8], expected: &str) -> Result<T, Refusal> {
    parse_body(bytes).map_err(|e| {
        refusal(
            StatusCode::BAD_REQUEST,
            format!("expected {expected}: {e}\n"),
        )
    })
}

/// The answer to a version change: 200 with the hash now active, or 422 with the reason.
fn changed(name: &str, r: Result<String, SwapError>) -> Response {
    outcome(name, r, |active_version| {
        axum::Json(VersionChanged {
            active_version,
            pipeline: name.to_owned(),
        })
        .into_response()
    })
}

/// The answer to a started shadow or canary: 200 with the candidate's hash, or 422.
fn started(name: &str, r: Result<String, SwapError>) -> Response {
    outcome(name, r, |candidate| {
        axum::Json(CandidateStarted {
            candidate,
            pipeline: name.to_owned(),
        })
        .into_response()
    })
}

/// `ok` applied to the hash, or 422 with the reason.
fn outcome(
    name: &str,
    r: Result<String, SwapError>,
    ok: impl FnOnce(String) -> Response,
) -> Response {
    match r {
        Ok(hash) => ok(hash),
        Err(e) => refused(name, e.to_string()),
    }
}

/// 422: the pipeline refused, saying why.
fn refused(name: &str, error: String) -> Response {
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        axum::Json(Refused {
            error,
            pipeline: name.to_owned(),
        }),
    )
        .into_response()
}

async fn versions(State(s): State<Arc<AdminState>>, Path(name): Path<String>) -> Response {
    match s.tenants.find(&name) {
        Some(p) => axum::Json(p.versions()).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no pipeline named {name:?}\n"),
        )
            .into_response(),
    }
}

async fn rollback(
    State(s): State<Arc<AdminState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    text: Bytes,
) -> Answer {
    let p = target(&s, &headers, &name)?;
    let b: RollbackRequest = body(&text, r#"{"hash": "..."} or nothing"#)?;
    Ok(changed(&name, p.rollback(b.hash.as_deref()).await))
}

async fn shadow(
    State(s): State<Arc<AdminState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    text: Bytes,
) -> Answer {
    let p = target(&s, &headers, &name)?;
    let req: ShadowBody = body(&text, r#"{"path": "...", "sample": 0.5}"#)?;
    Ok(started(
        &name,
        p.start_shadow(ShadowRequest::from(&req)).await,
    ))
}

async fn shadow_stop(
    State(s): State<Arc<AdminState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Answer {
    let p = target(&s, &headers, &name)?;
    Ok(match p.stop_shadow() {
        Some(shadow) => axum::Json(ShadowStopped {
            pipeline: name,
            shadow,
        })
        .into_response(),
        None => refused(&name, "no shadow is running".to_owned()),
    })
}

async fn canary(
    State(s): State<Arc<AdminState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    text: Bytes,
) -> Answer {
    let p = target(&s, &headers, &name)?;
    let req: CanaryBody = body(
        &text,
        r#"{"path": "...", "percent": 10, "promote_after": {"batches": 100}, "rollback_if": {...}}"#,
    )?;
    Ok(started(
        &name,
        p.start_canary(CanaryRequest::from(&req)).await,
    ))
}

async fn canary_stop(
    State(s): State<Arc<AdminState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Answer {
    let p = target(&s, &headers, &name)?;
    Ok(changed(&name, p.end_canary_now(false).await))
}

async fn promote(
    State(s): State<Arc<AdminState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Answer {
    let p = target(&s, &headers, &name)?;
    Ok(changed(&name, p.end_canary_now(true).await))
}

/// Serves the admin endpoints on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AdminState>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route(api::METRICS, get(metrics))
        .route(api::HEALTHZ, get(|| async { "ok\n" }))
        .route(api::READYZ, get(ready))
        .route(api::PIPELINES, get(pipelines))
        .route(api::FLEET, get(fleet))
        .route(api::MANIFEST, get(manifest_status))
        .route(PipelineRoute::Swap.pattern(), post(swap))
        .route(PipelineRoute::Versions.pattern(), get(versions))
        .route(PipelineRoute::Rollback.pattern(), post(rollback))
        .route(
            PipelineRoute::Shadow.pattern(),
            post(shadow).delete(shadow_stop),
        )
        .route(
            PipelineRoute::Canary.pattern(),
            post(canary).delete(canary_stop),
        )
        .route(PipelineRoute::Promote.pattern(), post(promote))
        .merge(crate::console::routes())
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::guard,
        ))
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::tenants::Tenants;

    fn state(token: Option<&str>) -> AdminState {
        AdminState {
            tenants: Arc::new(Tenants::new([])),
            metrics: Arc::new(Metrics::new()),
            token: token.map(str::to_owned),
            manifest: None,
            fleet: None,
            allowed_hosts: Vec::new(),
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
        for scheme in ["bearer", "BEARER", "bEaReR"] {
            assert!(
                authorized(&s, &headers(Some(&format!("{scheme} s3cret")))),
                "the scheme is case-insensitive: {scheme}"
            );
        }
        assert!(authorized(&s, &headers(Some("Bearer  s3cret"))));
        assert!(!authorized(&s, &headers(Some("Bearers3cret"))));
        assert!(!authorized(&s, &headers(Some("Basic s3cret"))));
    }
}

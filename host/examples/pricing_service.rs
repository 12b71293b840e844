//! A tiny pricing API for the enricher example and the demo (`dev/demo`): `GET /price/{sku}`
//! answers `{"sku": "A-1", "unit_price": 2.5}` for the known SKUs (A-1, B-2, C-3), 503 with
//! `Retry-After: 3` for BUSY-1, a price that is not a number for ODD-1 (so the enrichers' retry
//! paths can be compared, host/tests/languages.rs) and 404 for any other. Optional: `--throttle-every N` answers 429 (`Retry-After: 1`) to every Nth
//! request, so a pipeline shows its `retry` verdicts; `--token T` requires
//! `Authorization: Bearer T` (401 otherwise); `--delay-ms D` answers after D ms.
//!
//! It also scores orders for the plugin guide's fraud check (examples/fraud-check):
//! `POST /score` with an order `{"id": ..., "amount": N, ...}` answers `{"score": floor(N / 10)}`
//! (400 for a body that is not such an order), with the same `--token` and `--delay-ms`; with
//! `--throttle-every N` every Nth request answers 503 there, so the fraud check's retry shows.
//!
//! `cargo run -p sharehost --example pricing_service -- --listen 127.0.0.1:8088`
//! (loopback addresses only).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{
    Json, Router,
    routing::{get, post},
};
use clap::Parser;

/// Command line (and the settings of [`app`]).
#[derive(Parser, Default)]
pub struct Args {
    /// Address to listen on (loopback only).
    #[arg(long, default_value = "127.0.0.1:8088")]
    pub listen: Option<SocketAddr>,
    /// Answer 429 to every Nth request (0: never).
    #[arg(long, default_value_t = 0)]
    pub throttle_every: u64,
    /// Require `Authorization: Bearer TOKEN`.
    #[arg(long, env = "PRICING_TOKEN")]
    pub token: Option<String>,
    /// Answer every request after this many milliseconds.
    #[arg(long, default_value_t = 0)]
    pub delay_ms: u64,
}

/// Shared by every request: the settings and the request counter.
struct Service {
    args: Args,
    requests: AtomicU64,
}

async fn price(
    State(s): State<Arc<Service>>,
    Path(sku): Path<String>,
    headers: HeaderMap,
) -> Response {
    let n = s.requests.fetch_add(1, Ordering::Relaxed) + 1;
    tokio::time::sleep(Duration::from_millis(s.args.delay_ms)).await;
    if let Some(token) = &s.args.token {
        let expected = format!("Bearer {token}");
        if headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            != Some(expected.as_str())
        {
            return StatusCode::UNAUTHORIZED.into_response();
        }
    }
    if s.args.throttle_every > 0 && n % s.args.throttle_every == 0 {
        return (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, "1")]).into_response();
    }
    let unit_price = match sku.as_str() {
        "A-1" => 2.5,
        "B-2" => 9.5,
        "C-3" => 12.25,
        "BUSY-1" => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "3")],
            )
                .into_response();
        }
        "ODD-1" => {
            return Json(serde_json::json!({ "sku": sku, "unit_price": "n/a" })).into_response();
        }
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    Json(serde_json::json!({ "sku": sku, "unit_price": unit_price })).into_response()
}

/// `POST /score`: an order's fraud score, from its amount.
async fn score(State(s): State<Arc<Service>>, headers: HeaderMap, body: String) -> Response {
    let n = s.requests.fetch_add(1, Ordering::Relaxed) + 1;
    tokio::time::sleep(Duration::from_millis(s.args.delay_ms)).await;
    if let Some(token) = &s.args.token
        && headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            != Some(format!("Bearer {token}").as_str())
    {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    if s.args.throttle_every > 0 && n % s.args.throttle_every == 0 {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let order: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    match (order["id"].as_str(), order["amount"].as_f64()) {
        (Some(_), Some(amount)) => {
            Json(serde_json::json!({ "score": (amount / 10.0).floor() as i64 })).into_response()
        }
        _ => StatusCode::BAD_REQUEST.into_response(),
    }
}

/// The service's routes with these settings (`listen` is not read): what `main` serves, and
/// what tests serve on a port of their own.
pub fn app(args: Args) -> Router {
    let service = Arc::new(Service {
        args,
        requests: AtomicU64::new(0),
    });
    Router::new()
        .route("/price/{sku}", get(price))
        .route("/score", post(score))
        .with_state(service)
}

#[allow(dead_code)] // tests include this file for `app` alone
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let listen = args.listen.context("--listen is required")?;
    if !listen.ip().is_loopback() {
        bail!("--listen {listen}: only loopback addresses are allowed");
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    println!(
        "pricing service listening on http://{}",
        listener.local_addr()?
    );
    axum::serve(listener, app(args)).await.context("serving")
}

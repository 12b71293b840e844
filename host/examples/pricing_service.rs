//! A tiny pricing API for the enricher example and the demo (`dev/demo`): `GET /price/{sku}`
//! answers `{"sku": "A-1", "unit_price": 2.5}` for the known SKUs (A-1, B-2, C-3) and 404 for
//! any other. Optional: `--throttle-every N` answers 429 (`Retry-After: 1`) to every Nth
//! request, so a pipeline shows its `retry` verdicts; `--token T` requires
//! `Authorization: Bearer T` (401 otherwise); `--delay-ms D` answers after D ms.
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
use axum::{Json, Router, routing::get};
use clap::Parser;

/// Command line.
#[derive(Parser)]
struct Args {
    /// Address to listen on (loopback only).
    #[arg(long, default_value = "127.0.0.1:8088")]
    listen: SocketAddr,
    /// Answer 429 to every Nth request (0: never).
    #[arg(long, default_value_t = 0)]
    throttle_every: u64,
    /// Require `Authorization: Bearer TOKEN`.
    #[arg(long, env = "PRICING_TOKEN")]
    token: Option<String>,
    /// Answer every request after this many milliseconds.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
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
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    Json(serde_json::json!({ "sku": sku, "unit_price": unit_price })).into_response()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !args.listen.ip().is_loopback() {
        bail!(
            "--listen {}: only loopback addresses are allowed",
            args.listen
        );
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    println!(
        "pricing service listening on http://{}",
        listener.local_addr()?
    );
    let service = Arc::new(Service {
        args,
        requests: AtomicU64::new(0),
    });
    let app = Router::new()
        .route("/price/{sku}", get(price))
        .with_state(service);
    axum::serve(listener, app).await.context("serving")
}

//! The slow HTTP server of `dev/bench-http`: answers every request on loopback after a fixed
//! delay (20 ms by default), so a pipeline's throughput is bounded by how many requests it keeps
//! in flight, not by the server's work. It counts what it served so a run can check that the
//! client really had the requests in flight it was asked for.
//!
//! - `ANY /...`: waits the delay, answers 200 with a small JSON price
//!   (`{"sku":"A-1","price":12.5,"unit_price":12.5}`: `unit_price` is what the enricher examples
//!   read).
//! - `GET /__stats`: `requests=N max_in_flight=M in_flight=K` for the requests since the last
//!   reset (this request itself is not counted).
//! - `POST /__reset`: zeroes the counters (between runs).
//!
//! The first line on stdout is `listening on http://127.0.0.1:PORT` once the socket is bound
//! (`--port 0`, the default, takes a free port); on SIGTERM or SIGINT it prints the final stats
//! and exits.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::routing::{any, get, post};
use clap::Parser;

/// Loopback only: the benchmark never listens on another address.
const HOST: &str = "127.0.0.1";

#[derive(Parser)]
#[command(about = "Answers every request on 127.0.0.1 after a fixed delay and counts them")]
struct Args {
    /// Port on 127.0.0.1 (0: any free one; the first stdout line names it).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Delay before each answer, in milliseconds.
    #[arg(long, default_value_t = 20)]
    delay_ms: u64,
    /// Tokio worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

/// The counters of the requests served since the last reset.
#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
}

impl Counters {
    fn line(&self) -> String {
        format!(
            "requests={} max_in_flight={} in_flight={}\n",
            self.requests.load(Ordering::Relaxed),
            self.max_in_flight.load(Ordering::Relaxed),
            self.in_flight.load(Ordering::Relaxed),
        )
    }
}

/// Keeps `in_flight` right even when a client hangs up mid-delay (axum drops the handler then).
struct InFlight<'a>(&'a Counters);

impl<'a> InFlight<'a> {
    fn enter(c: &'a Counters) -> Self {
        let now = c.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        c.max_in_flight.fetch_max(now, Ordering::Relaxed);
        Self(c)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

struct App {
    delay: Duration,
    counters: Counters,
}

async fn slow(State(app): State<Arc<App>>) -> &'static str {
    let guard = InFlight::enter(&app.counters);
    tokio::time::sleep(app.delay).await;
    app.counters.requests.fetch_add(1, Ordering::Relaxed);
    drop(guard);
    "{\"sku\":\"A-1\",\"price\":12.5,\"unit_price\":12.5}"
}

async fn stats(State(app): State<Arc<App>>) -> String {
    app.counters.line()
}

async fn reset(State(app): State<Arc<App>>) -> &'static str {
    app.counters.requests.store(0, Ordering::Relaxed);
    // In-flight requests of a previous run (none, between runs) still count toward the new maximum.
    let now = app.counters.in_flight.load(Ordering::Relaxed);
    app.counters.max_in_flight.store(now, Ordering::Relaxed);
    "reset\n"
}

async fn terminated() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                eprintln!("bench-http-server: cannot watch SIGTERM ({e}); stop it with SIGINT");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if args.threads > 0 {
        rt.worker_threads(args.threads);
    }
    rt.enable_all().build()?.block_on(serve(args))
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let app = Arc::new(App {
        delay: Duration::from_millis(args.delay_ms),
        counters: Counters::default(),
    });
    let router = Router::new()
        .route("/__stats", get(stats))
        .route("/__reset", post(reset))
        .fallback(any(slow))
        .with_state(app.clone());
    let listener = tokio::net::TcpListener::bind((HOST, args.port))
        .await
        .with_context(|| format!("cannot bind {HOST}:{}", args.port))?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    axum::serve(listener, router)
        .with_graceful_shutdown(terminated())
        .await?;
    print!("final: {}", app.counters.line());
    Ok(())
}

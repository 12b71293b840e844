//! The native ceiling of `dev/bench-http`: the work of the HTTP-bound pipeline (one GET per
//! record, body read to its end, 2xx counted as done) done by a plain async Rust program with
//! reqwest, with a fixed number of requests in flight, so sharehost's records/s can be put next
//! to what the same concurrency gives without a broker, a sandbox or batches.
//!
//! Modes:
//! - `free` (the ceiling): `--in-flight K` requests at all times; a new one starts as soon as
//!   any finishes.
//! - `batched`: `K / --batch B` workers, each issuing B requests at once and starting the next B
//!   only when all B are done: the shape of a plugin batch, without the host. It separates the
//!   cost of waiting for a batch's slowest request from the cost of the host itself.
//!
//! `--no-pool` opens a new connection per request (as a plugin's `wasi:http` requests do),
//! instead of reqwest's keep-alive pool.
//!
//! Output, one line: `requests=N in_flight=K mode=M pool=P wall_ms=... steady_ms=...
//! records_per_s=... steady_records_per_s=...`, where wall is from the first request's start to
//! the last one's end and steady from the first request's end to the last one's (the span a
//! pipeline's judged counter shows), steady rate = (N - 1) / steady.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use clap::{Parser, ValueEnum};
use futures::StreamExt as _;
use futures::stream::{self, FuturesUnordered};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// K requests in flight at all times.
    Free,
    /// K / B workers, each B requests at a time, waiting for all B.
    Batched,
}

#[derive(Parser)]
#[command(
    about = "Fetches one URL N times with K requests in flight (reqwest) and prints the rate"
)]
struct Args {
    /// The URL (http://127.0.0.1:PORT/...): loopback only.
    #[arg(long)]
    url: String,
    /// Requests in all.
    #[arg(long)]
    requests: u64,
    /// Requests in flight at once.
    #[arg(long)]
    in_flight: usize,
    /// How requests are kept in flight.
    #[arg(long, value_enum, default_value_t = Mode::Free)]
    mode: Mode,
    /// Requests per batch in `batched` mode (must divide --in-flight).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// A new connection per request instead of the keep-alive pool.
    #[arg(long)]
    no_pool: bool,
    /// Per-request timeout, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    timeout_ms: u64,
    /// Tokio worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

/// First and last completion times, as nanoseconds since the start.
struct Ends {
    start: Instant,
    first: AtomicU64,
    last: AtomicU64,
}

impl Ends {
    fn done(&self) {
        let ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.first.fetch_min(ns, Ordering::Relaxed);
        self.last.fetch_max(ns, Ordering::Relaxed);
    }
}

async fn fetch(client: &reqwest::Client, url: &str, ends: &Ends) -> anyhow::Result<()> {
    let response = client.get(url).send().await.context("request")?;
    let status = response.status();
    let body = response.bytes().await.context("body")?;
    ensure!(status.is_success(), "status {status}");
    std::hint::black_box(body);
    ends.done();
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if args.threads > 0 {
        rt.worker_threads(args.threads);
    }
    rt.enable_all().build()?.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    ensure!(
        args.url.starts_with("http://127.0.0.1:"),
        "only http://127.0.0.1:PORT/... URLs (loopback), not {}",
        args.url
    );
    ensure!(args.requests > 1, "--requests must be at least 2");
    ensure!(args.in_flight > 0, "--in-flight must be positive");
    if args.mode == Mode::Batched {
        ensure!(
            args.batch > 0 && args.in_flight.is_multiple_of(args.batch),
            "--batch {} must divide --in-flight {}",
            args.batch,
            args.in_flight
        );
    }
    let mut builder = reqwest::Client::builder()
        .timeout(Duration::from_millis(args.timeout_ms))
        .no_proxy();
    builder = if args.no_pool {
        builder.pool_max_idle_per_host(0)
    } else {
        builder.pool_max_idle_per_host(args.in_flight)
    };
    let client = builder.build().context("reqwest client")?;
    let ends = Arc::new(Ends {
        start: Instant::now(),
        first: AtomicU64::new(u64::MAX),
        last: AtomicU64::new(0),
    });
    let failures = match args.mode {
        Mode::Free => {
            stream::iter(0..args.requests)
                .map(|_| fetch(&client, &args.url, &ends))
                .buffer_unordered(args.in_flight)
                .filter_map(|r| async move { r.err() })
                .collect::<Vec<_>>()
                .await
        }
        Mode::Batched => {
            let workers = args.in_flight / args.batch;
            let next = Arc::new(AtomicU64::new(0));
            let mut tasks = FuturesUnordered::new();
            for _ in 0..workers {
                let (client, ends, next, url) =
                    (client.clone(), ends.clone(), next.clone(), args.url.clone());
                let (batch, total) = (args.batch as u64, args.requests);
                tasks.push(tokio::spawn(async move {
                    let mut failures = Vec::new();
                    loop {
                        let from = next.fetch_add(batch, Ordering::Relaxed);
                        if from >= total {
                            break;
                        }
                        let n = batch.min(total - from);
                        let all = (0..n).map(|_| fetch(&client, &url, &ends));
                        for r in futures::future::join_all(all).await {
                            if let Err(e) = r {
                                failures.push(e);
                            }
                        }
                    }
                    failures
                }));
            }
            let mut failures = Vec::new();
            while let Some(r) = tasks.next().await {
                failures.extend(r.context("worker panicked")?);
            }
            failures
        }
    };
    let wall = ends.start.elapsed();
    if let Some(e) = failures.first() {
        bail!(
            "{} of {} requests failed, first: {e:#}",
            failures.len(),
            args.requests
        );
    }
    let first = Duration::from_nanos(ends.first.load(Ordering::Relaxed));
    let last = Duration::from_nanos(ends.last.load(Ordering::Relaxed));
    let steady = last.saturating_sub(first);
    println!(
        "requests={} in_flight={} mode={} pool={} wall_ms={:.1} steady_ms={:.1} records_per_s={:.1} steady_records_per_s={:.1}",
        args.requests,
        args.in_flight,
        match args.mode {
            Mode::Free => "free",
            Mode::Batched => "batched",
        },
        !args.no_pool,
        wall.as_secs_f64() * 1e3,
        steady.as_secs_f64() * 1e3,
        args.requests as f64 / wall.as_secs_f64(),
        (args.requests - 1) as f64 / steady.as_secs_f64().max(1e-9),
    );
    Ok(())
}

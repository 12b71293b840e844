//! `pipeline_bench`: `sharehost run` with a native handler in place of every pipeline's Wasm
//! component: `dev/bench`'s native rows (accept-all and the plugin work twins), the sandbox's cost.
//!
//! It reads the same manifest as `sharehost run`, builds the same plugin runtime, serves the
//! same admin endpoints and drains the same way on SIGTERM, and runs every pipeline through
//! the same [`Pipeline`] code; only the batch handler differs (a native function that accepts
//! every record instead of a call into the sandbox). `dev/bench` runs it next to
//! `sharehost run` with `target/guests/accept_all.wasm`, so their ratio is the cost of the
//! sandbox alone.
//!
//! Usage: `pipeline_bench MANIFEST` (plaintext, TLS and SASL as the manifest says). Logging
//! goes to stderr, filtered by `SHAREHOST_LOG` (default `warn`). `PIPELINE_BENCH_HANDLER`
//! picks the handler: `accept-all` (default), `value-reader` or `order-validator`, the native
//! twins of `target/guests/{accept_all,value_reader,order_validator}.wasm`. The last two are
//! compiled from the examples' own source files, so both sides run one logic.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use sharehost::admin::{self, AdminState};
use sharehost::kafka::KafkaClient;
use sharehost::manifest::Manifest;
use sharehost::metrics::Metrics;
use sharehost::pipeline::{NativeHandler, Pipeline};
use sharehost::runtime::{PluginRuntime, Record, Verdict};
use sharehost::tenants::Tenants;
use tokio_util::sync::CancellationToken;

/// The native twin of `examples/accept-all`: accepts every record without looking at it.
struct AcceptAll;

impl NativeHandler for AcceptAll {
    fn name(&self) -> &str {
        "accept-all"
    }

    fn handle(&self, records: &[Record]) -> Vec<Verdict> {
        vec![Verdict::Accept; records.len()]
    }
}

#[path = "../../examples/value-reader/src/judge.rs"]
mod value_reader;

#[path = "../../examples/order-validator/src/check.rs"]
mod order_validator;

/// The native twin of `examples/value-reader`: reads every byte of every value.
struct ValueReader;

impl NativeHandler for ValueReader {
    fn name(&self) -> &str {
        "value-reader"
    }

    fn handle(&self, records: &[Record]) -> Vec<Verdict> {
        records
            .iter()
            .map(|r| match value_reader::accepts(r.value.as_deref()) {
                true => Verdict::Accept,
                false => Verdict::Reject(None),
            })
            .collect()
    }
}

/// The native twin of `examples/order-validator` at its default `max-quantity` (1000).
struct OrderValidator;

impl NativeHandler for OrderValidator {
    fn name(&self) -> &str {
        "order-validator"
    }

    fn handle(&self, records: &[Record]) -> Vec<Verdict> {
        records
            .iter()
            .map(
                |r| match order_validator::check(r.value.as_deref(), 1000, |_| ()) {
                    Ok(()) => Verdict::Accept,
                    Err(reason) => Verdict::Reject(Some(reason)),
                },
            )
            .collect()
    }
}

/// The handler `PIPELINE_BENCH_HANDLER` names.
fn handler() -> Result<Arc<dyn NativeHandler>> {
    let name = std::env::var("PIPELINE_BENCH_HANDLER").unwrap_or_default();
    Ok(match name.as_str() {
        "" | "accept-all" => Arc::new(AcceptAll),
        "value-reader" => Arc::new(ValueReader),
        "order-validator" => Arc::new(OrderValidator),
        other => bail!(
            "PIPELINE_BENCH_HANDLER: unknown handler `{other}` (accept-all, value-reader, order-validator)"
        ),
    })
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SHAREHOST_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let mut args = std::env::args_os().skip(1);
    let (Some(path), None) = (args.next(), args.next()) else {
        bail!("usage: pipeline_bench MANIFEST");
    };
    // The same runtime as the `sharehost` binary's.
    sharehost::host_threads::runtime()
        .context("starting the async runtime")?
        .block_on(run(PathBuf::from(path)))
}

async fn run(path: PathBuf) -> Result<()> {
    let handler = handler()?;
    let manifest = Manifest::load(&path)?;
    // Built as `sharehost run` builds it, so both processes carry the same runtime (pool
    // reservation, epoch ticker thread) and differ only in the handler.
    let runtime =
        PluginRuntime::new(manifest.runtime_config()).context("cannot start the plugin runtime")?;
    let metrics = Arc::new(Metrics::new());
    let pipelines: Vec<Arc<Pipeline>> = manifest
        .pipelines
        .iter()
        .map(|spec| {
            Pipeline::native(
                spec.clone(),
                runtime.clone(),
                metrics.clone(),
                handler.clone(),
            )
        })
        .collect();

    let config = manifest
        .cluster
        .connection_config()
        .map_err(anyhow::Error::msg)?;
    let client = Arc::new(KafkaClient::connect(&manifest.cluster.bootstrap, config).await?);
    let listener = tokio::net::TcpListener::bind(&manifest.admin.listen)
        .await
        .with_context(|| format!("admin.listen: cannot bind {}", manifest.admin.listen))?;
    let admin_state = Arc::new(AdminState {
        tenants: Arc::new(Tenants::loaded(&pipelines)),
        metrics,
        token: None,
        manifest: None,
        fleet: None,
        allowed_hosts: manifest.admin.allowed_hosts.clone(),
    });
    let admin_stop = CancellationToken::new();
    let admin_task = tokio::spawn(admin::serve(
        listener,
        admin_state.clone(),
        admin_stop.clone(),
    ));

    let shutdown = CancellationToken::new();
    {
        let shutdown = shutdown.clone();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            shutdown.cancel();
        });
    }
    let failures = sharehost::pipeline::run_all(&pipelines, client, shutdown).await;
    for p in &pipelines {
        let s = p.status();
        let accepted: u64 = s.versions.values().map(|c| c.accepted).sum();
        println!("pipeline {}: accepted {accepted}", s.name);
    }
    admin_stop.cancel();
    let _ = admin_task.await;
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    Ok(())
}

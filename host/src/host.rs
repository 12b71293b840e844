//! `sharehost run` and `sharehost check`: the top-level wiring (anyhow lives here, at the edge).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};
use sharehost::admin::{self, AdminState};
use sharehost::kafka::{ConnectionConfig, KafkaClient};
use sharehost::manifest::{Manifest, PipelineSpec};
use sharehost::metrics::Metrics;
use sharehost::pipeline::{Pipeline, short};
use sharehost::runtime::{PluginRuntime, RuntimeConfig, default_cache_dir, signature_path};
use tokio_util::sync::CancellationToken;

/// How often component files are checked for replacement.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

fn plugin_runtime(manifest: &Manifest) -> Result<PluginRuntime> {
    PluginRuntime::new(RuntimeConfig {
        cache_dir: Some(default_cache_dir()),
        ..manifest.runtime_config()
    })
    .context("cannot start the plugin runtime")
}

/// Loads every pipeline; with `state_dir` (at `run`), each comes back on the version that was
/// active before a restart when the rule of [`Pipeline::load_remembering`] allows it.
async fn load_pipelines(
    manifest: &Manifest,
    runtime: &PluginRuntime,
    metrics: &Arc<Metrics>,
    state_dir: Option<&Path>,
) -> Result<Vec<Arc<Pipeline>>> {
    let mut out = Vec::new();
    for spec in &manifest.pipelines {
        let (spec, runtime, metrics) = (spec.clone(), runtime.clone(), metrics.clone());
        out.push(match state_dir {
            Some(dir) => Pipeline::load_remembering(spec, runtime, metrics, dir).await?,
            None => Pipeline::load(spec, runtime, metrics).await?,
        });
    }
    Ok(out)
}

/// Validates the manifest and every component, without a broker.
pub async fn check(path: &Path) -> Result<()> {
    let manifest = Manifest::load(path)?;
    manifest
        .cluster
        .sasl_settings()
        .map_err(anyhow::Error::msg)?;
    let runtime = plugin_runtime(&manifest)?;
    let metrics = Arc::new(Metrics::new());
    let loaded = load_pipelines(&manifest, &runtime, &metrics, None).await?;
    for (p, spec) in loaded.iter().zip(&manifest.pipelines) {
        println!(
            "ok: pipeline {}: {} (version {}{})",
            p.name(),
            p.component().display(),
            short(&p.active_hash()),
            trust_note(spec)
        );
    }
    println!("ok: {} is valid", path.display());
    Ok(())
}

/// What `check` says of a pipeline's signing policy: nothing when it trusts no key (no
/// signature needed), else the keys its component's verified signature may come from.
fn trust_note(spec: &PipelineSpec) -> String {
    match &spec.trust {
        Some(t) => format!(
            ", signature verified; trusted keys {}",
            t.key_ids().join(", ")
        ),
        None => String::new(),
    }
}

/// Logs, at start, which pipelines require signed components and from which keys, and warns
/// when some do and others do not (a mixed manifest is allowed, but worth seeing).
fn log_trust(manifest: &Manifest) {
    let unsigned: Vec<&str> = manifest
        .pipelines
        .iter()
        .filter(|p| p.trust.is_none())
        .map(|p| p.name.as_str())
        .collect();
    for p in &manifest.pipelines {
        if let Some(t) = &p.trust {
            tracing::info!(
                pipeline = %p.name,
                "components must be signed (NAME.wasm.minisig) by one of the keys {}",
                t.key_ids().join(", ")
            );
        }
    }
    if !unsigned.is_empty() && unsigned.len() < manifest.pipelines.len() {
        tracing::warn!(
            "pipelines without [trust] load unsigned components: {}",
            unsigned.join(", ")
        );
    }
}

fn connection_config(manifest: &Manifest) -> Result<ConnectionConfig> {
    manifest
        .cluster
        .connection_config()
        .map_err(anyhow::Error::msg)
}

/// A file's modification time and size.
type FileStamp = (SystemTime, u64);

fn file_stamp(path: &Path) -> Option<FileStamp> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// The component's stamp with its detached signature's (`NAME.wasm.minisig`, when there is
/// one): a signature put in place after its component (or before) changes the stamp too, so a
/// swap refused for the old signature is tried again with the new one.
fn stamp(path: &Path) -> Option<(FileStamp, Option<FileStamp>)> {
    Some((file_stamp(path)?, file_stamp(&signature_path(path))))
}

/// What the file watch last saw of a pipeline's active component.
type Seen = (PathBuf, Option<(FileStamp, Option<FileStamp>)>);

/// Swaps every pipeline whose component file changed since `seen` (the file watch), or every
/// pipeline when `force` (SIGHUP). A pipeline whose active path changed (an HTTP swap) is not
/// reloaded again: its new file just becomes the one watched.
async fn reload_changed(pipelines: &[Arc<Pipeline>], seen: &mut [Seen], force: bool) {
    for (i, p) in pipelines.iter().enumerate() {
        let path = p.component();
        let now = stamp(&path);
        let moved = seen[i].0 != path;
        let unchanged = now == seen[i].1;
        seen[i] = (path.clone(), now);
        if now.is_none() || (!force && (moved || unchanged)) {
            continue;
        }
        // A failed swap is logged, counted and shown in /pipelines; the old version runs on.
        let _ = p.swap(&path).await;
    }
}

/// Runs every pipeline until a signal, then drains.
pub async fn run(path: &Path) -> Result<()> {
    let manifest = Manifest::load(path)?;
    log_trust(&manifest);
    let runtime = plugin_runtime(&manifest)?;
    let metrics = Arc::new(Metrics::new());
    // Components are loaded and initialised before any group is joined.
    let state_dir = sharehost::state::default_state_dir();
    let pipelines = load_pipelines(&manifest, &runtime, &metrics, Some(&state_dir)).await?;
    let config = connection_config(&manifest)?;
    let client = Arc::new(KafkaClient::connect(&manifest.cluster.bootstrap, config).await?);
    let token =
        match &manifest.admin.token_env {
            Some(var) => Some(std::env::var(var).with_context(|| {
                format!("admin.token_env: environment variable {var} is not set")
            })?),
            None => None,
        };
    let listener = tokio::net::TcpListener::bind(&manifest.admin.listen)
        .await
        .with_context(|| format!("admin.listen: cannot bind {}", manifest.admin.listen))?;
    tracing::info!(
        "admin endpoints on http://{}",
        listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    );

    let shutdown = CancellationToken::new();
    let admin_state = Arc::new(AdminState {
        pipelines: pipelines.clone(),
        metrics: metrics.clone(),
        token,
        ready: false.into(),
    });
    let admin_stop = CancellationToken::new();
    let admin_task = tokio::spawn(admin::serve(
        listener,
        admin_state.clone(),
        admin_stop.clone(),
    ));

    // Signals: the first SIGTERM/SIGINT drains, a second exits at once; SIGHUP reloads
    // changed components.
    let (hup_tx, mut hup_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    {
        let shutdown = shutdown.clone();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                    _ = hup.recv() => { let _ = hup_tx.send(()); continue; }
                }
                if shutdown.is_cancelled() {
                    eprintln!("second signal: exiting now");
                    std::process::exit(130);
                }
                tracing::info!("signal received: draining (send it again to exit at once)");
                shutdown.cancel();
            }
        });
    }
    {
        let pipelines = pipelines.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let mut stamps: Vec<Seen> = pipelines
                .iter()
                .map(|p| {
                    let path = p.component();
                    let now = stamp(&path);
                    (path, now)
                })
                .collect();
            let mut tick = tokio::time::interval(WATCH_INTERVAL);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tick.tick() => reload_changed(&pipelines, &mut stamps, false).await,
                    Some(()) = hup_rx.recv() => {
                        tracing::info!("SIGHUP: reloading every pipeline's component");
                        reload_changed(&pipelines, &mut stamps, true).await;
                    }
                }
            }
        });
    }

    admin_state.ready.store(true, Ordering::Relaxed);
    let failures = sharehost::pipeline::run_all(&pipelines, client, shutdown).await;
    for p in &pipelines {
        let s = p.status();
        let total = |f: fn(&sharehost::pipeline::VersionCounters) -> u64| {
            s.versions.values().map(f).sum::<u64>()
        };
        println!(
            "pipeline {}: accepted {}, rejected {}, released {}, dead-lettered {}, faults {}, versions {}",
            s.name,
            total(|c| c.accepted),
            total(|c| c.rejected),
            total(|c| c.released),
            s.dead_lettered,
            total(|c| c.faults),
            s.versions.len()
        );
    }
    admin_stop.cancel();
    let _ = admin_task.await;
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    Ok(())
}

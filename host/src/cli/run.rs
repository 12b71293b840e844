//! `sharehost run` and `sharehost check`: the top-level wiring (anyhow lives here, at the edge).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};
use std::collections::HashMap;

use sharehost::admin::{self, AdminState};
use sharehost::fleet::Fleet;
use sharehost::kafka::backoff::{Backoff, BackoffConfig};
use sharehost::kafka::{ConnectionConfig, KafkaClient};
use sharehost::manifest::{Manifest, PipelineSpec};
use sharehost::metrics::Metrics;
use sharehost::pipeline::{Pipeline, short};
use sharehost::runtime::{PluginRuntime, RuntimeConfig, default_cache_dir, signature_path};
use sharehost::tenants::Tenants;
use tokio_util::sync::CancellationToken;

/// How often component files are checked for replacement.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

pub(crate) fn plugin_runtime(manifest: &Manifest) -> Result<PluginRuntime> {
    PluginRuntime::new(RuntimeConfig {
        cache_dir: Some(default_cache_dir()),
        ..manifest.runtime_config()
    })
    .context("cannot start the plugin runtime")
}

/// Loads every pipeline; with `state_dir` (at `run`), each comes back on the version that was
/// active before a restart when the rule of [`Pipeline::load_remembering`] allows it.
pub(crate) async fn load_pipelines(
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
        for warning in spec.loss_warnings() {
            println!("warning: {warning}");
        }
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

pub(crate) fn connection_config(manifest: &Manifest) -> Result<ConnectionConfig> {
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
async fn reload_changed(tenants: &Tenants, seen: &mut HashMap<String, Seen>, force: bool) {
    for p in tenants.pipelines() {
        let path = p.component();
        let now = stamp(&path);
        // A pipeline loaded since the last look is watched from now on.
        let Some(last) = seen.get_mut(p.name()) else {
            seen.insert(p.name().to_owned(), (path, now));
            continue;
        };
        let moved = last.0 != path;
        let unchanged = now == last.1;
        *last = (path.clone(), now);
        if now.is_none() || (!force && (moved || unchanged)) {
            continue;
        }
        // A failed swap is logged, counted and shown in /pipelines; the old version runs on.
        let _ = p.swap(&path).await;
    }
}

/// One pipeline of a running host, loaded and run on its own.
struct Tenant {
    spec: PipelineSpec,
    tenants: Arc<Tenants>,
    runtime: PluginRuntime,
    metrics: Arc<Metrics>,
    state_dir: PathBuf,
    client: Arc<KafkaClient>,
    shutdown: CancellationToken,
    strict: bool,
    fleet: Option<Arc<Fleet>>,
}

impl Tenant {
    /// Loads the pipeline (unless `strict` loaded it already) and runs it until shutdown;
    /// a failure to load or to run is counted, shown and tried again after a backoff.
    /// Returns an error only when `strict`.
    async fn run(self) -> Result<(), String> {
        let name = self.spec.name.clone();
        let mut backoff = Backoff::new(TENANT_BACKOFF);
        // One that failed to load at start waits its first backoff before it is tried again.
        if self.tenants.find(&name).is_none() && !self.wait(&mut backoff).await {
            return Ok(());
        }
        loop {
            let pipeline = match self.tenants.find(&name) {
                Some(p) => p,
                None => match Pipeline::load_remembering(
                    self.spec.clone(),
                    self.runtime.clone(),
                    self.metrics.clone(),
                    &self.state_dir,
                )
                .await
                {
                    Ok(p) => {
                        self.tenants.set_loaded(p.clone());
                        p
                    }
                    Err(e) => {
                        self.tenants.set_failed(&name, e.to_string());
                        failed_to_load(&self.metrics, &name, &e.to_string());
                        if !self.wait(&mut backoff).await {
                            return Ok(());
                        }
                        continue;
                    }
                },
            };
            backoff.reset();
            if let Some(f) = &self.fleet {
                f.reconcile_before_run(&pipeline).await;
            }
            match pipeline
                .run(self.client.clone(), self.shutdown.clone())
                .await
            {
                Ok(()) => return Ok(()),
                Err(e) if self.strict => return Err(e),
                Err(e) => {
                    count_failure(&self.metrics, &name, "run");
                    tracing::error!(pipeline = %name, "pipeline failed; the other pipelines run on, this one is run again: {e}");
                    if !self.wait(&mut backoff).await {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Waits for the next attempt; `false` when the host is shutting down instead.
    async fn wait(&self, backoff: &mut Backoff) -> bool {
        let delay = backoff.next_delay().unwrap_or(TENANT_BACKOFF.max);
        tokio::select! {
            _ = self.shutdown.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }
}

fn count_failure(metrics: &Metrics, pipeline: &str, stage: &str) {
    metrics
        .pipeline_failures
        .get_or_create(&vec![
            ("pipeline", pipeline.to_owned()),
            ("stage", stage.to_owned()),
        ])
        .inc();
}

/// Counts and logs a pipeline that failed to load; the others run on.
fn failed_to_load(metrics: &Metrics, pipeline: &str, error: &str) {
    count_failure(metrics, pipeline, "load");
    metrics
        .pipeline_up
        .get_or_create(&vec![("pipeline", pipeline.to_owned())])
        .set(0);
    tracing::error!(
        pipeline,
        "pipeline failed to load; the other pipelines run on, this one is tried again: {error}"
    );
}

/// How a failed pipeline is tried again: from 1 s, doubling to a minute.
const TENANT_BACKOFF: BackoffConfig = BackoffConfig {
    initial: Duration::from_secs(1),
    max: Duration::from_secs(60),
    factor: 2.0,
};

/// The admin API's bearer token, read before anything is loaded: a variable that is not set,
/// or set to nothing, is refused (an empty token would let any `Authorization: Bearer `
/// through).
fn admin_token(manifest: &Manifest) -> Result<Option<String>> {
    let Some(var) = &manifest.admin.token_env else {
        return Ok(None);
    };
    let token = std::env::var(var)
        .with_context(|| format!("admin.token_env: environment variable {var} is not set"))?;
    if token.trim().is_empty() {
        bail!("admin.token_env: environment variable {var} is empty");
    }
    Ok(Some(token))
}

/// What the file watch compares to see the manifest replaced: its modification time, size
/// and inode (a file replaced by rename, as Kubernetes updates a ConfigMap volume, has a new
/// inode even when its time and size match).
fn manifest_stamp(path: &Path) -> Option<(SystemTime, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

/// Whether the manifest is being written in place, from the kernel's file events (inotify on
/// the file itself, symlinks followed): a write (`IN_MODIFY`, truncation included) not yet
/// followed by its writer closing the file (`IN_CLOSE_WRITE`) means a reader would see part of
/// the new text, which may well be a valid manifest with pipelines missing. The watch reads
/// the manifest only when no write is open. A file replaced by rename is complete when it
/// appears and is watched anew (its inode changes). Without inotify (an error at start) the
/// watch falls back to the file's stamp alone.
struct ManifestWrites {
    inotify: Option<rustix::fd::OwnedFd>,
    /// The watch descriptor and the inode it watches.
    watched: Option<(i32, u64)>,
    /// A write seen and its close not yet, and since which look (for the patience below).
    open_since: Option<u32>,
    looks: u32,
}

/// Looks (one per [`WATCH_INTERVAL`]) a write may stay open before the manifest is read
/// anyway: a writer that keeps the file open for good (a process appending to it) must not
/// stop every re-read.
const WRITE_PATIENCE_LOOKS: u32 = 30;

impl ManifestWrites {
    fn new() -> ManifestWrites {
        use rustix::fs::inotify::{CreateFlags, init};
        let inotify = init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC)
            .map_err(|e| {
                tracing::warn!(
                    "no inotify ({e}): a manifest written in place may be read while it is written"
                );
            })
            .ok();
        ManifestWrites {
            inotify,
            watched: None,
            open_since: None,
            looks: 0,
        }
    }

    /// Whether a write of `path` (inode `ino`) is open now: watches the file's current inode
    /// (again, when it was replaced), then reads the events since the last look.
    fn writing(&mut self, path: &Path, ino: Option<u64>) -> bool {
        use rustix::fs::inotify::{ReadFlags, Reader, WatchFlags, add_watch, remove_watch};
        self.looks = self.looks.wrapping_add(1);
        let Some(fd) = &self.inotify else {
            return false;
        };
        if let Some(ino) = ino
            && self.watched.map(|(_, i)| i) != Some(ino)
        {
            if let Some((wd, _)) = self.watched.take() {
                let _ = remove_watch(fd, wd);
            }
            self.open_since = None;
            if let Ok(wd) = add_watch(fd, path, WatchFlags::MODIFY | WatchFlags::CLOSE_WRITE) {
                self.watched = Some((wd, ino));
            }
        }
        let wd = self.watched.map(|(wd, _)| wd);
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
        let mut events = Reader::new(fd, &mut buf);
        // Until the queue is empty (EAGAIN) or unreadable.
        while let Ok(event) = events.next() {
            let flags = event.events();
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                // Events were lost: what is open is unknown; the stamp decides.
                self.open_since = None;
            } else if Some(event.wd()) != wd {
                // The file this path named before it was replaced: not the manifest any more.
            } else if flags.contains(ReadFlags::CLOSE_WRITE) {
                self.open_since = None;
            } else if flags.contains(ReadFlags::MODIFY) && self.open_since.is_none() {
                self.open_since = Some(self.looks);
            }
        }
        match self.open_since {
            Some(since) if self.looks.wrapping_sub(since) >= WRITE_PATIENCE_LOOKS => {
                tracing::warn!(
                    "manifest {}: written and still open after {WRITE_PATIENCE_LOOKS} looks; reading it anyway",
                    path.display()
                );
                self.open_since = None;
                false
            }
            open => open.is_some(),
        }
    }
}

/// The pipelines a host runs now, each a tenant task with a cancellation token of its own, so
/// one is drained and stopped (removed from the manifest, or restarted with a changed table)
/// while the others keep their members, sessions and in-flight records.
struct Live {
    running: HashMap<String, (PipelineSpec, CancellationToken, tokio::task::JoinHandle<()>)>,
    failures: Arc<std::sync::Mutex<Vec<String>>>,
    tenants: Arc<Tenants>,
    runtime: PluginRuntime,
    metrics: Arc<Metrics>,
    state_dir: PathBuf,
    client: Arc<KafkaClient>,
    shutdown: CancellationToken,
    strict: bool,
    fleet: Option<Arc<Fleet>>,
}

impl Live {
    /// Starts a tenant for `spec`.
    fn start(&mut self, spec: PipelineSpec) {
        let t = &*self;
        let stop = t.shutdown.child_token();
        t.tenants.add(&spec.name);
        let tenant = Tenant {
            spec: spec.clone(),
            tenants: t.tenants.clone(),
            runtime: t.runtime.clone(),
            metrics: t.metrics.clone(),
            state_dir: t.state_dir.clone(),
            client: t.client.clone(),
            shutdown: stop.clone(),
            strict: t.strict,
            fleet: t.fleet.clone(),
        };
        let (failures, host_shutdown) = (self.failures.clone(), t.shutdown.clone());
        let task = tokio::spawn(async move {
            use futures::FutureExt;
            // Only a strict host (or a panic) sees a failure here: everything stops then.
            let failure = match std::panic::AssertUnwindSafe(tenant.run())
                .catch_unwind()
                .await
            {
                Ok(Ok(())) => return,
                Ok(Err(e)) => e,
                Err(_) => "pipeline task panicked".to_owned(),
            };
            tracing::error!("{failure}");
            failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(failure);
            host_shutdown.cancel();
        });
        self.running.insert(spec.name.clone(), (spec, stop, task));
    }

    /// Drains and stops the tenant `name` (its records released, its group left).
    async fn stop(&mut self, name: &str) {
        if let Some((_, stop, task)) = self.running.remove(name) {
            stop.cancel();
            if let Err(e) = task.await {
                tracing::error!(pipeline = name, "pipeline task panicked: {e}");
            }
        }
    }

    /// Re-reads the manifest at `path` and applies it: added pipelines start, removed ones
    /// drain and stop, changed ones restart alone; the rest are untouched. A manifest that does
    /// not validate, or that changes what only a restart can change, is refused whole
    /// (logged, counted, shown in `GET /manifest`) and the host runs on as before.
    async fn reread(&mut self, path: &Path, current: &mut Manifest) {
        let metrics = self.metrics.clone();
        let tenants = self.tenants.clone();
        let count = |result: &str| {
            metrics
                .manifest_rereads
                .get_or_create(&vec![("result", result.to_owned())])
                .inc();
        };
        let refuse = |why: String| {
            tracing::error!(
                "manifest re-read refused; the host runs on the manifest it has: {why}"
            );
            count("refused");
            tenants.update_manifest_status(|m| {
                m.refused += 1;
                m.last_refused = Some(why);
                m.last_refused_at_ms = Some(sharehost::kafka::now_ms());
            });
        };
        let next = match Manifest::load(path) {
            Ok(m) => m,
            Err(e) => return refuse(format!("{e:#}")),
        };
        let restart_only: Vec<&str> = [
            ("[cluster]", next.cluster != current.cluster),
            ("[admin]", next.admin != current.admin),
            ("[runtime]", next.runtime != current.runtime),
            ("[trust]", next.trust != current.trust),
            ("[fleet]", next.fleet != current.fleet),
        ]
        .into_iter()
        .filter_map(|(table, changed)| changed.then_some(table))
        .collect();
        if !restart_only.is_empty() {
            return refuse(format!(
                "{}: {} changed, which only a restart applies",
                path.display(),
                restart_only.join(", ")
            ));
        }
        if next.pipelines == current.pipelines {
            return;
        }
        let names: Vec<String> = next.pipelines.iter().map(|p| p.name.clone()).collect();
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|n| !names.contains(n))
            .cloned()
            .collect();
        for name in gone {
            tracing::info!(pipeline = %name, "manifest re-read: pipeline removed; draining it");
            self.stop(&name).await;
            tenants.remove(&name);
        }
        for spec in &next.pipelines {
            match self.running.get(&spec.name) {
                Some((old, ..)) if old == spec => {}
                Some((old, ..)) => {
                    let widened = spec.grants_widened_from(Some(old));
                    if !widened.is_empty() {
                        tracing::warn!(pipeline = %spec.name, "manifest re-read: the pipeline's grants widen: {}", widened.join("; "));
                    }
                    tracing::info!(pipeline = %spec.name, "manifest re-read: pipeline changed; draining it and starting it again");
                    self.stop(&spec.name).await;
                    tenants.reset(&spec.name);
                    self.start(spec.clone());
                }
                None => {
                    let granted = spec.grants_widened_from(None);
                    if !granted.is_empty() {
                        tracing::warn!(pipeline = %spec.name, "manifest re-read: an added pipeline is granted: {}", granted.join("; "));
                    }
                    tracing::info!(pipeline = %spec.name, "manifest re-read: pipeline added; starting it");
                    self.start(spec.clone());
                }
            }
        }
        count("applied");
        // The last refusal stays (with its time) beside the newer applied time: an operator
        // sees both that a bad manifest was written and that a good one followed.
        tenants.update_manifest_status(|m| {
            m.applied += 1;
            m.applied_at_ms = sharehost::kafka::now_ms();
        });
        *current = next;
    }

    /// Waits for every tenant to end (after shutdown); returns the failures of a strict host.
    async fn join(self) -> Vec<String> {
        for (name, (_, _, task)) in self.running {
            if let Err(e) = task.await {
                tracing::error!(pipeline = %name, "pipeline task panicked: {e}");
            }
        }
        std::mem::take(&mut *self.failures.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Runs every pipeline until a signal, then drains. Each pipeline is a tenant of its own: one
/// that fails to load or to run is reported failed and tried again with backoff while the
/// others run. With `strict`, any pipeline that fails to load stops the start (nothing runs),
/// and one that fails to run stops the host, as a platform that wants all or nothing asks.
pub async fn run(path: &Path, strict: bool) -> Result<()> {
    let manifest = Manifest::load(path)?;
    let token = admin_token(&manifest)?;
    log_trust(&manifest);
    for warning in manifest.pipelines.iter().flat_map(|p| p.loss_warnings()) {
        tracing::warn!("{warning}");
    }
    let runtime = plugin_runtime(&manifest)?;
    if let Some(t) = &manifest.telemetry {
        sharehost::telemetry::install(t)?;
        tracing::info!(collector = %t.otlp_endpoint, sample = t.sample, "tracing batches and records");
    }
    let metrics = Arc::new(Metrics::new());
    let state_dir = sharehost::persisted::default_state_dir();
    let tenants = Arc::new(Tenants::new(
        manifest.pipelines.iter().map(|p| p.name.clone()),
    ));
    // At 0 from the start, so an alert on their increase sees the first failure.
    for spec in &manifest.pipelines {
        for stage in ["load", "run"] {
            let _ = metrics.pipeline_failures.get_or_create(&vec![
                ("pipeline", spec.name.clone()),
                ("stage", stage.to_owned()),
            ]);
        }
    }
    // Components are loaded and initialised before any group is joined (and before the
    // admin listener answers); one that fails is tried again by its tenant, unless `strict`.
    if strict {
        for p in load_pipelines(&manifest, &runtime, &metrics, Some(&state_dir)).await? {
            tenants.set_loaded(p);
        }
    } else {
        for spec in &manifest.pipelines {
            let (s, r, m) = (spec.clone(), runtime.clone(), metrics.clone());
            match Pipeline::load_remembering(s, r, m, &state_dir).await {
                Ok(p) => tenants.set_loaded(p),
                Err(e) => {
                    tenants.set_failed(&spec.name, e.to_string());
                    failed_to_load(&metrics, &spec.name, &e.to_string());
                }
            }
        }
    }
    let config = connection_config(&manifest)?;
    let client = Arc::new(KafkaClient::connect(&manifest.cluster.bootstrap, config).await?);
    // A fleet's host reads the fleet's state to its end before any pipeline takes a batch;
    // each tenant brings its pipeline to it before it runs.
    let fleet = match &manifest.fleet {
        Some(spec) => Some(
            Fleet::start(spec.clone(), client.clone(), metrics.clone(), &state_dir)
                .await
                .with_context(|| format!("fleet {}", spec.name))?,
        ),
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
        tenants: tenants.clone(),
        metrics: metrics.clone(),
        token,
        manifest: Some(path.to_owned()),
        fleet: fleet.clone(),
        allowed_hosts: manifest.admin.allowed_hosts.clone(),
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
    // The file watch: every second, each pipeline's component file and the manifest; SIGHUP
    // forces both. A changed component is hot-swapped; a changed manifest is re-read by the
    // loop below.
    let (reread_tx, mut reread_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    {
        let tenants = tenants.clone();
        let shutdown = shutdown.clone();
        let path = path.to_owned();
        tokio::spawn(async move {
            let mut stamps: HashMap<String, Seen> = HashMap::new();
            let mut manifest_seen = manifest_stamp(&path);
            let mut writes = ManifestWrites::new();
            let mut waiting = false;
            let mut tick = tokio::time::interval(WATCH_INTERVAL);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tick.tick() => {
                        reload_changed(&tenants, &mut stamps, false).await;
                        let now = manifest_stamp(&path);
                        // A manifest being written is read once its writer closes it.
                        if writes.writing(&path, now.map(|(_, _, ino)| ino)) {
                            if !waiting {
                                tracing::info!("manifest {} is being written; it is re-read when its writer closes it", path.display());
                                waiting = true;
                            }
                            continue;
                        }
                        waiting = false;
                        if now != manifest_seen {
                            manifest_seen = now;
                            let _ = reread_tx.send(());
                        }
                    }
                    Some(()) = hup_rx.recv() => {
                        tracing::info!("SIGHUP: re-reading the manifest and reloading every pipeline's component");
                        let _ = reread_tx.send(());
                        reload_changed(&tenants, &mut stamps, true).await;
                    }
                }
            }
        });
    }

    if let Some(f) = &fleet {
        tokio::spawn(f.clone().run(tenants.clone(), shutdown.clone()));
    }
    tenants.update_manifest_status(|m| {
        m.path = Some(path.display().to_string());
        m.applied_at_ms = sharehost::kafka::now_ms();
    });
    let mut live = Live {
        running: HashMap::new(),
        failures: Arc::default(),
        tenants: tenants.clone(),
        runtime: runtime.clone(),
        metrics: metrics.clone(),
        state_dir: state_dir.clone(),
        client: client.clone(),
        shutdown: shutdown.clone(),
        strict,
        fleet: fleet.clone(),
    };
    for spec in &manifest.pipelines {
        live.start(spec.clone());
    }
    let mut current = manifest;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(()) = reread_rx.recv() => live.reread(path, &mut current).await,
        }
    }
    // Only a strict host (or a panic) sees a failure here: everything stops then.
    let failures = live.join().await;
    let pipelines = tenants.pipelines();
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
    sharehost::telemetry::shutdown();
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    Ok(())
}

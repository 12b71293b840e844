//! One loaded plugin version and the fault model of a call into it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::{Component, Func};
use wasmtime::{Store, Trap, UpdateDeadline};

use super::batch::{Record, WireBatch};
use super::bindings::sharehost::plugin::types::{Batch, Verdict as WireVerdict};
use super::bindings::{self, PluginPre};
use super::config::{InstanceMode, PluginLimits};
use super::engine::PluginRuntime;
use super::error::LoadError;
use super::host::{Drained, HOSTCALL_FUEL, StoreState};
pub use sharehost_bounded_lift::Verdict;
use sharehost_bounded_lift::{VerdictBounds, VerdictLiftError, VerdictList, with_verdict_bounds};

/// Extra wall time granted beyond the deadline before the call is abandoned from the
/// outside. Epochs stop a spinning guest; this backstop stops one blocked in a host call
/// (e.g. a WASI sleep), which epochs cannot interrupt.
const OUTER_TIMEOUT_GRACE: Duration = Duration::from_millis(250);

/// Why a batch got no verdicts from the plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// The guest trapped (unreachable, bad memory access, `wasi:cli/exit`, ...).
    Trap,
    /// The guest panicked (Rust panics abort with a message on stderr).
    Panic,
    /// The guest ran past the batch deadline and was interrupted.
    Timeout,
    /// The guest tried to grow its memory past the plugin's limit.
    OutOfMemory,
    /// The guest exhausted its stack (e.g. unbounded recursion).
    StackOverflow,
    /// The guest returned a different number of verdicts than records.
    WrongVerdictCount,
    /// The guest returned a verdict list the host cannot read (out of its memory, an
    /// unknown verdict, a reason that is not valid text).
    UnreadableVerdicts,
    /// A fresh instance could not be created or its `init` failed.
    InitFailed,
    /// The batch could not be handed to the guest (larger than the 4 GiB wire format).
    BatchTooLarge,
}

impl FaultKind {
    /// A stable lower-case name, for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Trap => "trap",
            Self::Panic => "panic",
            Self::Timeout => "timeout",
            Self::OutOfMemory => "out_of_memory",
            Self::StackOverflow => "stack_overflow",
            Self::WrongVerdictCount => "wrong_verdict_count",
            Self::UnreadableVerdicts => "unreadable_verdicts",
            Self::InitFailed => "init_failed",
            Self::BatchTooLarge => "batch_too_large",
        }
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A plugin fault for one batch. The instance that faulted is already discarded; the next
/// batch gets a fresh one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// What went wrong.
    pub kind: FaultKind,
    /// Human-readable detail (trap message, panic message, counts).
    pub message: String,
    /// How many records the batch had: all of them get the fault policy's verdict.
    pub records: usize,
}

/// The result of one `handle` call: never an error, because nothing a guest does may
/// bring down the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOutcome {
    /// Exactly one verdict per record, in record order.
    Verdicts(Vec<Verdict>),
    /// The plugin faulted; the caller applies its fault policy to every record.
    Fault(Fault),
}

impl BatchOutcome {
    /// The verdicts, or `policy` for every record when the plugin faulted (the pipeline's
    /// fault policy: release by default).
    pub fn verdicts_or(self, policy: &Verdict) -> Vec<Verdict> {
        match self {
            Self::Verdicts(v) => v,
            Self::Fault(f) => vec![policy.clone(); f.records],
        }
    }

    /// The fault, if the batch faulted.
    pub fn fault(&self) -> Option<&Fault> {
        match self {
            Self::Verdicts(_) => None,
            Self::Fault(f) => Some(f),
        }
    }
}

/// Counters of one plugin, for metrics and `test-plugin`'s summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginStats {
    /// Batches handled (including faulted ones).
    pub batches: u64,
    /// Records handed to the plugin.
    pub records: u64,
    /// Batches that faulted.
    pub faults: u64,
    /// Instances created (the first, recycles, and fresh-per-batch ones).
    pub instances: u64,
    /// Log messages dropped for exceeding the per-batch budget.
    pub log_messages_dropped: u64,
    /// stdout/stderr bytes dropped for exceeding the per-batch bound.
    pub output_bytes_dropped: u64,
}

/// A warm instance and how many batches it has served.
struct Warm {
    store: Store<StoreState>,
    /// The `handle` export, called with the host's own result type ([`VerdictList`]) that
    /// checks the verdict count before reading any verdict and reads reasons only up to their
    /// bound (the generated binding would copy the whole list, every reason in full).
    handle: Func,
    batches: u32,
}

/// One loaded, validated and initialised plugin version. Handles one batch at a time
/// (`&mut self`); run several `Plugin`s for parallelism.
pub struct Plugin {
    runtime: PluginRuntime,
    name: Arc<str>,
    path: PathBuf,
    content_hash: String,
    pre: PluginPre<StoreState>,
    limits: PluginLimits,
    config: Vec<(String, String)>,
    warm: Option<Warm>,
    wire: WireBatch,
    stats: PluginStats,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("content_hash", &self.content_hash)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Plugin {
    pub(crate) async fn new(
        runtime: PluginRuntime,
        path: &Path,
        component: Component,
        content_hash: String,
        limits: PluginLimits,
        config: Vec<(String, String)>,
    ) -> Result<Self, LoadError> {
        let wrong_world = |e: wasmtime::Error| LoadError::WrongWorld {
            path: path.to_owned(),
            message: format!("{e:#}"),
        };
        let instance_pre = runtime
            .inner
            .linker
            .instantiate_pre(&component)
            .map_err(wrong_world)?;
        let pre = PluginPre::new(instance_pre).map_err(wrong_world)?;
        let name: Arc<str> = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "plugin".into())
            .into();
        let mut plugin = Self {
            runtime,
            name,
            path: path.to_owned(),
            content_hash,
            pre,
            limits,
            config,
            warm: None,
            wire: WireBatch::default(),
            stats: PluginStats::default(),
        };
        // Instantiate and init once now, so a bad configuration is refused at load.
        let warm = plugin.instantiate().await.map_err(|f| LoadError::Init {
            path: path.to_owned(),
            message: f.message,
        })?;
        if matches!(plugin.limits.instance_mode, InstanceMode::Reuse { .. }) {
            plugin.warm = Some(warm);
        }
        Ok(plugin)
    }

    /// The plugin's name (its file stem), as it appears in logs.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// SHA-256 of the component bytes: the identity of this plugin version.
    pub fn content_hash(&self) -> &str {
        &self.content_hash
    }

    /// Counters since load.
    pub fn stats(&self) -> &PluginStats {
        &self.stats
    }

    /// Judges one batch. Returns exactly one verdict per record, or a [`Fault`] for the whole
    /// batch (the faulted instance is discarded; the next batch gets a fresh one). Every
    /// fault is logged with the plugin name and the batch's record range.
    ///
    /// # Cancel safety
    /// Dropping the future abandons the call; the instance it was using is dropped with it,
    /// so the next call starts from a fresh instance.
    pub async fn handle(&mut self, records: &[Record]) -> BatchOutcome {
        self.stats.batches += 1;
        self.stats.records += records.len() as u64;
        if records.is_empty() {
            return BatchOutcome::Verdicts(Vec::new());
        }
        let outcome = self.call(records).await;
        if let BatchOutcome::Fault(f) = &outcome {
            self.stats.faults += 1;
            let (first, last) = (&records[0], &records[records.len() - 1]);
            tracing::warn!(
                plugin = &*self.name,
                fault = f.kind.as_str(),
                topic = &*first.topic,
                partition = first.partition,
                first_offset = first.offset,
                last_offset = last.offset,
                records = records.len(),
                "plugin fault: {}",
                f.message
            );
        }
        outcome
    }

    /// Judges a batch like [`Plugin::handle`], but when the batch faults, splits it in halves
    /// (recursively, on fresh instances) to find the poison records, so the innocent ones are
    /// judged normally. Records that fault on their own get `policy`; the faults met on the
    /// way are returned (the first is the whole batch's). At most `max_extra_calls` additional
    /// calls are made (a spinning guest costs one deadline per call); ranges left unresolved
    /// when the budget runs out get `policy` too.
    pub async fn handle_isolating(
        &mut self,
        records: &[Record],
        policy: &Verdict,
        max_extra_calls: usize,
    ) -> (Vec<Verdict>, Vec<Fault>) {
        let mut verdicts: Vec<Option<Verdict>> = vec![None; records.len()];
        let mut faults = Vec::new();
        let mut pending = vec![(0, records.len())];
        let mut calls = 0usize;
        while let Some((start, end)) = pending.pop() {
            if start == end {
                continue;
            }
            if calls > max_extra_calls {
                verdicts[start..end].fill(Some(policy.clone()));
                continue;
            }
            calls += 1;
            match self.handle(&records[start..end]).await {
                BatchOutcome::Verdicts(v) => {
                    for (slot, v) in verdicts[start..end].iter_mut().zip(v) {
                        *slot = Some(v);
                    }
                }
                BatchOutcome::Fault(f) => {
                    faults.push(f);
                    if end - start == 1 {
                        verdicts[start] = Some(policy.clone());
                    } else {
                        let mid = start + (end - start) / 2;
                        // Pushed in reverse so the first half is judged first.
                        pending.push((mid, end));
                        pending.push((start, mid));
                    }
                }
            }
        }
        let verdicts = verdicts
            .into_iter()
            .map(|v| v.unwrap_or_else(|| policy.clone()))
            .collect();
        (verdicts, faults)
    }

    async fn call(&mut self, records: &[Record]) -> BatchOutcome {
        let n = records.len();
        let fault = |kind, message: String| {
            BatchOutcome::Fault(Fault {
                kind,
                message,
                records: n,
            })
        };
        if self.wire.fill(records).is_err() {
            return fault(
                FaultKind::BatchTooLarge,
                "batch bytes exceed the 4 GiB wire format".into(),
            );
        }
        // Take the warm instance out: if this future is dropped mid-call, it is gone.
        let mut warm = match self.warm.take() {
            Some(w) => w,
            None => match self.instantiate().await {
                Ok(w) => w,
                Err(f) => return BatchOutcome::Fault(Fault { records: n, ..f }),
            },
        };
        let deadline = self.limits.batch_deadline;
        warm.store.data_mut().begin_call(Instant::now() + deadline);
        warm.store.set_epoch_deadline(1);
        let handle = warm.handle;
        let batch = &self.wire.batch;
        let store = &mut warm.store;
        let bounds = VerdictBounds {
            records: n,
            max_reason_bytes: self.limits.max_reason_bytes,
        };
        // The verdicts are lifted into owned values inside the call: wasmtime runs the
        // guest's post-return (which frees the list and its reasons) before it returns.
        let call = with_verdict_bounds(bounds, async {
            let typed = handle.typed::<(&Batch,), (VerdictList<WireVerdict>,)>(&*store)?;
            let (list,) = typed.call_async(&mut *store, (batch,)).await?;
            Ok::<_, wasmtime::Error>(list)
        });
        let result = tokio::time::timeout(deadline + OUTER_TIMEOUT_GRACE, call).await;
        let drained = warm.store.data_mut().drain_stdio();
        self.count_dropped(&drained);
        let stderr = drained.stderr;
        let verdicts = match result {
            Ok(Ok(list)) => list.verdicts,
            Ok(Err(e)) => {
                let (kind, message) = classify(&e, warm.store.data(), &stderr);
                return fault(kind, message);
            }
            Err(_) => {
                return fault(
                    FaultKind::Timeout,
                    format!("no answer within {deadline:?} (blocked in a host call)"),
                );
            }
        };
        warm.batches += 1;
        if let InstanceMode::Reuse { max_batches } = self.limits.instance_mode
            && warm.batches < max_batches
        {
            self.warm = Some(warm);
        }
        BatchOutcome::Verdicts(verdicts)
    }

    fn count_dropped(&mut self, d: &Drained) {
        self.stats.log_messages_dropped += d.log_messages_dropped;
        self.stats.output_bytes_dropped += d.output_bytes_dropped;
    }

    /// A fresh store and instance, with `init(config)` already run under the deadline.
    async fn instantiate(&mut self) -> Result<Warm, Fault> {
        self.stats.instances += 1;
        let inner = &self.runtime.inner;
        let mut store = Store::new(
            &inner.engine,
            StoreState::new(
                self.name.clone(),
                self.limits.max_memory,
                self.limits.http.clone(),
            ),
        );
        store.limiter(|s| &mut s.limiter);
        store.set_hostcall_fuel(HOSTCALL_FUEL);
        store.epoch_deadline_callback(|mut ctx| {
            let state = ctx.data_mut();
            if Instant::now() >= state.deadline {
                state.timed_out = true;
                return Ok(UpdateDeadline::Interrupt);
            }
            // Time-slice: give other tasks on this executor thread a turn every tick.
            Ok(UpdateDeadline::YieldCustom(
                1,
                Box::pin(tokio::task::yield_now()),
            ))
        });
        let deadline = self.limits.batch_deadline;
        store.data_mut().begin_call(Instant::now() + deadline);
        store.set_epoch_deadline(1);
        let init_fault = |kind: FaultKind, message: String| Fault {
            kind,
            message,
            records: 0,
        };
        let setup = async {
            let instance = self
                .pre
                .instance_pre()
                .instantiate_async(&mut store)
                .await?;
            let bindings = bindings::Plugin::new(&mut store, &instance)?;
            let handle = instance
                .get_func(&mut store, "handle")
                .ok_or_else(|| wasmtime::format_err!("export `handle` disappeared"))?;
            let r = bindings.call_init(&mut store, &self.config, &[]).await?;
            Ok::<_, wasmtime::Error>((handle, r))
        };
        let result = tokio::time::timeout(deadline + OUTER_TIMEOUT_GRACE, setup).await;
        let drained = store.data_mut().drain_stdio();
        self.count_dropped(&drained);
        let stderr = drained.stderr;
        match result {
            Ok(Ok((handle, Ok(())))) => Ok(Warm {
                store,
                handle,
                batches: 0,
            }),
            Ok(Ok((_, Err(message)))) => Err(init_fault(
                FaultKind::InitFailed,
                format!("init refused the configuration: {message}"),
            )),
            Ok(Err(e)) => {
                let (kind, message) = classify(&e, store.data(), &stderr);
                Err(init_fault(
                    FaultKind::InitFailed,
                    format!("instantiation or init failed ({kind}): {message}"),
                ))
            }
            Err(_) => Err(init_fault(
                FaultKind::InitFailed,
                format!("init gave no answer within {deadline:?}"),
            )),
        }
    }
}

/// Longest fault message kept (a deep recursion's wasm backtrace can run to megabytes).
const MAX_FAULT_MESSAGE: usize = 512;

/// The cause of a failed call without wasmtime's wasm backtrace context, bounded.
fn cause(e: &wasmtime::Error) -> String {
    truncate(e.root_cause().to_string(), MAX_FAULT_MESSAGE)
}

/// Maps a failed call onto a fault kind, most specific evidence first.
fn classify(e: &wasmtime::Error, state: &StoreState, stderr: &str) -> (FaultKind, String) {
    // The guest returned, and the host refused what it returned.
    match e.downcast_ref::<VerdictLiftError>() {
        Some(l @ VerdictLiftError::WrongCount { .. }) => {
            return (FaultKind::WrongVerdictCount, l.to_string());
        }
        Some(l @ VerdictLiftError::Unreadable(_)) => {
            return (
                FaultKind::UnreadableVerdicts,
                truncate(l.to_string(), MAX_FAULT_MESSAGE),
            );
        }
        None => {}
    }
    if state.timed_out {
        return (
            FaultKind::Timeout,
            "interrupted at the batch deadline".into(),
        );
    }
    if state.limiter.hit {
        return (FaultKind::OutOfMemory, cause(e));
    }
    if let Some(at) = stderr.find("panicked at") {
        // Rust's panic hook prints "thread '…' panicked at FILE:LINE:COL:\nMESSAGE".
        let text = stderr[at..].trim();
        let text = text.split("\nnote: run with").next().unwrap_or(text);
        return (
            FaultKind::Panic,
            truncate(text.replace('\n', " "), MAX_FAULT_MESSAGE),
        );
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::StackOverflow) => (FaultKind::StackOverflow, cause(e)),
        Some(Trap::Interrupt) => (FaultKind::Timeout, cause(e)),
        _ => (FaultKind::Trap, cause(e)),
    }
}

/// Cuts `s` to at most `max` bytes on a character boundary.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

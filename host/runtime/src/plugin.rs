//! One loaded plugin version: its instances (a warm one reused, or a fresh one per batch), a
//! call into it under the plugin's budgets, poison isolation, and the hand-off of a call that
//! computes past its first tick to the guest threads. What a failed call is lives in
//! `fault.rs`; what an instance owns in `store.rs`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use sharehost_bounded_lift::{Verdict, VerdictBounds, VerdictList, with_verdict_bounds};
use wasmtime::Store;
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Func, InstancePre};

use crate::batch::WireBatch;
use crate::bindings::v01::sharehost::plugin::types::Verdict as WireVerdictV01;
use crate::bindings::v02::sharehost::plugin::types::{Batch, Verdict as WireVerdict};
use crate::capability::Outcome;
use crate::config::{InstanceMode, PluginLimits};
use crate::engine::{Compiled, Origin, Placement, PluginRuntime};
use crate::error::LoadError;
use crate::fault::{BatchOutcome, Fault, FaultKind, MAX_FAULT_MESSAGE, MAX_INIT_ERROR, classify};
use crate::meter::Metered;
use crate::outputs::Emit;
use crate::record::Record;
use crate::secrets::Secrets;
use crate::store::StoreState;

/// Extra wall time granted beyond the deadline before the call is abandoned from the
/// outside. Epochs stop a spinning guest; this backstop stops one blocked in a host call
/// (e.g. a WASI sleep), which epochs cannot interrupt.
const OUTER_TIMEOUT_GRACE: Duration = Duration::from_millis(250);

/// CPU deadlines' worth of extra calls after which [`Plugin::handle_isolating`] starts no
/// more: a faulting batch costs its first call plus at most about three deadlines.
pub const ISOLATION_DEADLINES: u32 = 2;

/// Which version of the `sharehost:plugin` contract a component implements. The host speaks
/// both: a 0.1 component never sees outputs, secrets or `retry`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Contract {
    /// `sharehost:plugin@0.1.x` (`wit/0.1.0/plugin.wit`).
    V0_1,
    /// `sharehost:plugin@0.2.x` (`wit/plugin.wit`).
    V0_2,
}

impl Contract {
    /// The version as shown to users (`0.1`, `0.2`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V0_1 => "0.1",
            Self::V0_2 => "0.2",
        }
    }

    /// Tells the versions apart by `init`'s parameters (0.2 adds `secrets`), which every
    /// component of either version exports, unlike the contract interfaces it may not import.
    fn of(component: &Component, engine: &wasmtime::Engine) -> Contract {
        match component
            .component_type()
            .get_export(engine, "init")
            .map(|e| e.ty)
        {
            Some(ComponentItem::ComponentFunc(f)) if f.params().len() == 2 => Contract::V0_2,
            _ => Contract::V0_1,
        }
    }
}

/// Verdicts and emits of a batch judged with poison isolation ([`Plugin::handle_isolating`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Judged {
    /// One per record, in record order.
    pub verdicts: Vec<Verdict>,
    /// What the plugin emitted, bound to records of the batch by index (emits of calls that
    /// faulted are not here: those calls' records got the fault policy).
    pub emits: Vec<Emit>,
    /// The faults met on the way (the first is the whole batch's).
    pub faults: Vec<Fault>,
    /// The records that got the fault policy, each with the index in `faults` of the fault
    /// that gave it: a record released for a fault and dead-lettered later, at its delivery
    /// cap, can say which fault it met.
    pub faulted: Vec<(usize, usize)>,
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
    /// Records emitted in calls that returned verdicts.
    pub emits: u64,
    /// Emits refused (unknown output, over a bound, ...): the guest saw the error.
    pub emits_refused: u64,
    /// Instances replaced between batches because they had used 3/4 of their memory
    /// headroom (a guest that leaks per call is recycled before it faults).
    pub recycled_for_memory: u64,
    /// Instances replaced between batches because they still held half the host resources
    /// they may hold (a guest runtime that lets go of its requests' handles only when its
    /// garbage collector runs, as JavaScript's does, is recycled before a batch faults).
    pub recycled_for_resources: u64,
}

/// A warm instance and how many batches it has served.
struct Warm {
    store: Store<StoreState>,
    /// The `handle` export, called with the host's own result type ([`VerdictList`]) that
    /// checks the verdict count before reading any verdict and reads reasons only up to their
    /// bound (the generated binding would copy the whole list, every reason in full).
    handle: Func,
    batches: u32,
    /// Linear memory held right after `init`: the instance's baseline.
    baseline_memory: usize,
}

impl Warm {
    /// Whether the instance has used three quarters of the memory headroom it had after
    /// `init`. Memory never shrinks, and some toolchains leak per call (a componentize-js 0.23
    /// component grows by about the batch's bytes on every call and reached 64 MiB after 98
    /// batches of 500 × 1 KiB; ComponentizeJS no longer frees what is allocated through
    /// `cabi_realloc`, see its PR #319 and issue #330), so an instance that kept growing is
    /// replaced by a fresh one *between* batches, before a batch runs out of memory and
    /// faults.
    fn near_memory_limit(&self, max_memory: usize) -> bool {
        let used = self.store.data().limiter().memory_bytes;
        let headroom = max_memory.saturating_sub(self.baseline_memory);
        used > self.baseline_memory + headroom / 4 * 3
    }

    /// Whether the instance, between calls, still holds half the host resources it may hold
    /// at once. StarlingMonkey (JavaScript) drops a finished `fetch`'s handles (its request,
    /// response, header maps, streams and pollables: 7 for a GET) only when its garbage
    /// collector finalizes their objects, which a plugin allocating little never triggers,
    /// so 100 requests a batch filled the table of a 32 MiB instance by the third batch
    /// and faulted it. The guest cannot be told to let go, and the host cannot take a handle
    /// the guest may still drop; a fresh instance frees them all. A walk of the table
    /// (thousands of entries at most) once per batch.
    fn near_resource_limit(&mut self) -> bool {
        let table = &mut self.store.data_mut().table;
        let max = table.max_capacity();
        table.iter_mut().count() > max / 2
    }
}

/// The `init` configuration of one plugin version: what every fresh instance receives.
#[derive(Debug, Clone, Default)]
pub struct PluginInit {
    /// The manifest's `config` pairs, in manifest order.
    pub config: Vec<(String, String)>,
    /// The pipeline's resolved secrets (contract 0.2; a 0.1 component never receives them).
    pub secrets: Arc<Secrets>,
    /// The pipeline's name: whose fair share of the guest threads its calls take, so that
    /// every version of one pipeline shares one share and two pipelines running the same
    /// component do not, and on every line the plugin logs. `None`: the component's file
    /// name is the share, and lines carry only that.
    pub tenant: Option<Arc<str>>,
}

/// One loaded, validated and initialised plugin version. Handles one batch at a time
/// (`&mut self`); run several `Plugin`s for parallelism.
pub struct Plugin {
    /// Keeps the epoch ticker (the deadlines) alive as long as a plugin of this runtime
    /// exists, and wakes it for each call.
    runtime: PluginRuntime,
    name: Arc<str>,
    path: PathBuf,
    content_hash: String,
    /// Compiled at load, or mapped from the precompiled cache.
    origin: Origin,
    /// Which allocator its instances come from, and why not the pool when it is not.
    placement: Placement,
    /// The key id of the trusted key that signed it (`None`: its pipeline requires no
    /// signature).
    signer: Option<String>,
    contract: Contract,
    pre: InstancePre<StoreState>,
    limits: PluginLimits,
    init: PluginInit,
    warm: Option<Warm>,
    wire: WireBatch,
    /// Emits of the last call that returned verdicts.
    emits: Vec<Emit>,
    stats: PluginStats,
    /// The trace context of the batch the next calls judge (see [`Plugin::set_traceparent`]).
    traceparent: Option<http::HeaderValue>,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("content_hash", &self.content_hash)
            .field("contract", &self.contract)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Plugin {
    pub(crate) async fn new(
        runtime: PluginRuntime,
        path: &Path,
        compiled: Compiled,
        limits: PluginLimits,
        init: PluginInit,
    ) -> Result<Self, LoadError> {
        let Compiled {
            component,
            hash: content_hash,
            origin,
            placement,
            signer,
        } = compiled;
        let wrong_world = |e: wasmtime::Error| LoadError::WrongWorld {
            path: path.to_owned(),
            message: format!("{e:#}"),
        };
        let contract = Contract::of(&component, component.engine());
        let pre = runtime
            .linker_for(&component)
            .instantiate_pre(&component)
            .map_err(wrong_world)?;
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
            origin,
            placement,
            signer,
            contract,
            pre,
            limits,
            init,
            warm: None,
            wire: WireBatch::default(),
            emits: Vec::new(),
            stats: PluginStats::default(),
            traceparent: None,
        };
        // Instantiate and init once now, so a bad configuration is refused at load (and an
        // export of the wrong type as a wrong world).
        let warm = plugin.instantiate().await.map_err(|f| match f.kind {
            FaultKind::WrongWorld => LoadError::WrongWorld {
                path: path.to_owned(),
                message: f.message,
            },
            _ => LoadError::Init {
                path: path.to_owned(),
                message: f.message,
            },
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

    /// The key id (minisign's, e.g. `8A52150A5C80B347`) of the trusted key whose signature
    /// was verified at load: who published this version, for `/pipelines`, metrics and
    /// dead-letter provenance. `None` when its pipeline trusts no keys.
    pub fn signer(&self) -> Option<&str> {
        self.signer.as_deref()
    }

    /// Where its instances live (pool or on-demand, and why), for `/pipelines`: a component
    /// too big for a pool slot still runs, and the operator sees that it pays on-demand cost.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Bytes of linear memory the warm instance holds (all its memories), if one is warm:
    /// what one instance of this plugin costs beyond the host's own, for the benchmark.
    pub fn instance_memory_bytes(&self) -> Option<usize> {
        self.warm
            .as_ref()
            .map(|w| w.store.data().limiter().memory_bytes)
    }

    /// Whether loading compiled the component or mapped it from the precompiled cache (the
    /// difference is seconds for a Python or JavaScript component), for `test-plugin`.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// Counters since load.
    pub fn stats(&self) -> &PluginStats {
        &self.stats
    }

    /// The contract version the component implements.
    pub fn contract(&self) -> Contract {
        self.contract
    }

    /// Sets the trace context (a W3C `traceparent` value) the next calls judge their batch in:
    /// every outbound HTTP request they make that carries no `traceparent` of its own gets this
    /// one, so the service called continues the host's trace. `None` (or a value that cannot
    /// be a header) sends none.
    pub fn set_traceparent(&mut self, traceparent: Option<&str>) {
        self.traceparent = traceparent.and_then(|t| http::HeaderValue::from_str(t).ok());
    }

    /// Takes the emits of the last [`Plugin::handle`] call that returned verdicts (record
    /// indices are positions in the batch that call judged). Empty after a fault: a faulted
    /// call's emits are discarded with its instance.
    pub fn take_emits(&mut self) -> Vec<Emit> {
        std::mem::take(&mut self.emits)
    }

    /// Judges one batch. Returns exactly one verdict per record, or a [`Fault`] for the whole
    /// batch (the faulted instance is discarded; the next batch gets a fresh one). Every
    /// fault is logged at debug level with the plugin name and the batch's record range (the
    /// pipeline logs one warning per faulted batch, isolation calls included).
    ///
    /// # Cancel safety
    /// Dropping the future abandons the call; the instance it was using is dropped with it,
    /// so the next call starts from a fresh instance.
    pub async fn handle(&mut self, records: &[Record]) -> BatchOutcome {
        self.emits.clear();
        self.stats.batches += 1;
        self.stats.records += records.len() as u64;
        if records.is_empty() {
            return BatchOutcome::Verdicts(Vec::new());
        }
        let outcome = self.call(records).await;
        if let BatchOutcome::Fault(f) = &outcome {
            self.stats.faults += 1;
            let (first, last) = (&records[0], &records[records.len() - 1]);
            tracing::debug!(
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
    /// way are returned (the first is the whole batch's). Isolation is bounded in calls and in
    /// time: at most `max_extra_calls` additional calls, and none started once the extra calls
    /// have used [`ISOLATION_DEADLINES`] CPU deadlines (a call cut by its deadline counts as a
    /// whole one), so a guest that spins on every record costs a batch at most four deadlines,
    /// not one per call. Ranges left unresolved when a budget runs out get `policy` too.
    pub async fn handle_isolating(
        &mut self,
        records: &[Record],
        policy: &Verdict,
        max_extra_calls: usize,
    ) -> Judged {
        let mut verdicts: Vec<Option<Verdict>> = vec![None; records.len()];
        let mut emits = Vec::new();
        let mut faults: Vec<Fault> = Vec::new();
        let mut faulted = Vec::new();
        // Breadth first: both halves of a range are judged before its quarters, so a budget
        // spent on one poison record's halves leaves fewer innocent records unjudged.
        // Each range with the fault of the range it was split from (its records get that
        // fault's verdict when a budget leaves them unjudged).
        let mut pending = std::collections::VecDeque::from([(0, records.len(), None)]);
        let mut calls = 0usize;
        let deadline = self.limits.batch_deadline;
        let time_budget = deadline.saturating_mul(ISOLATION_DEADLINES);
        let mut spent = Duration::ZERO;
        while let Some((start, end, parent)) = pending.pop_front() {
            if start == end {
                continue;
            }
            if calls > max_extra_calls || spent >= time_budget {
                let verdict =
                    match parent.and_then(|i: usize| faults.get(i).map(|f: &Fault| (i, f))) {
                        Some((i, f)) => {
                            faulted.extend((start..end).map(|r| (r, i)));
                            f.verdict_under(policy)
                        }
                        None => policy.clone(),
                    };
                verdicts[start..end].fill(Some(verdict));
                continue;
            }
            let extra = calls > 0;
            calls += 1;
            let started = Instant::now();
            let outcome = self.handle(&records[start..end]).await;
            if extra {
                spent += match &outcome {
                    BatchOutcome::Fault(f) if f.kind == FaultKind::Timeout => deadline,
                    _ => started.elapsed().min(deadline),
                };
            }
            match outcome {
                BatchOutcome::Verdicts(v) => {
                    for (slot, v) in verdicts[start..end].iter_mut().zip(v) {
                        *slot = Some(v);
                    }
                    emits.extend(self.take_emits().into_iter().map(|mut e| {
                        e.record += start;
                        e
                    }));
                }
                BatchOutcome::Fault(f) => {
                    if end - start == 1 {
                        verdicts[start] = Some(f.verdict_under(policy));
                        faulted.push((start, faults.len()));
                    } else {
                        let mid = start + (end - start) / 2;
                        pending.push_back((start, mid, Some(faults.len())));
                        pending.push_back((mid, end, Some(faults.len())));
                    }
                    faults.push(f);
                }
            }
        }
        let verdicts = verdicts
            .into_iter()
            .map(|v| v.unwrap_or_else(|| policy.clone()))
            .collect();
        // Sub-batches are judged breadth first: put the emits back in record order (stable,
        // so one record's emits keep theirs).
        emits.sort_by_key(|e: &Emit| e.record);
        faulted.sort_unstable();
        Judged {
            verdicts,
            emits,
            faults,
            faulted,
        }
    }

    /// Runs `work` on this plugin and gives the plugin back with its result: its first slice
    /// (up to one epoch tick) where it is called, the rest on the runtime's guest threads. A
    /// call that ends within its first tick (most calls) so costs no cross-thread hand-off,
    /// while one that computes on, or waits, never holds a host thread for more than that
    /// tick. `None` when the moved task did not finish: the runtime is shutting down, and the
    /// instance is gone with it. A panic inside `work` is passed on.
    pub async fn on_guest_threads<T, W>(mut self: Box<Self>, work: W) -> Option<(Box<Self>, T)>
    where
        T: Send + 'static,
        W: for<'a> FnOnce(
                &'a mut Plugin,
            )
                -> std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>
            + Send
            + 'static,
    {
        let runtime = self.runtime.clone();
        let mut call = Box::pin(async move {
            let out = work(&mut self).await;
            (self, out)
        });
        // One poll here: the guest runs until its first epoch yield (or a host call that
        // waits) and is then moved, its future intact, to a guest thread. Two hand-offs per
        // call cost about 45 µs of host CPU, more than a cheap plugin's whole call.
        let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
        if let Poll::Ready(done) = first {
            return Some(done);
        }
        let task = runtime.spawn_guest(call);
        match task.await {
            Ok(done) => Some(done),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => None,
        }
    }

    async fn call(&mut self, records: &[Record]) -> BatchOutcome {
        let n = records.len();
        let secrets = self.init.secrets.clone();
        let fault = |kind, message: String| {
            BatchOutcome::Fault(Fault {
                kind,
                message: secrets.redact_then_cut(&message, MAX_FAULT_MESSAGE, false),
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
        let (cpu, wall) = (self.limits.batch_deadline, self.limits.wall_budget());
        let _ticking = self.runtime.guest_running();
        let state = warm.store.data_mut();
        state.begin_call(cpu, wall, u32::try_from(n).ok(), self.traceparent.as_ref());
        let meter = state.meter();
        warm.store.set_epoch_deadline(1);
        let handle = warm.handle;
        let batch = &self.wire.batch;
        let store = &mut warm.store;
        let bounds = VerdictBounds {
            records: n,
            max_reason_bytes: self.limits.max_reason_bytes,
        };
        let contract = self.contract;
        // The verdicts are lifted into owned values inside the call: wasmtime runs the
        // guest's post-return (which frees the list and its reasons) before it returns.
        let call = with_verdict_bounds(bounds, async {
            let list = match contract {
                Contract::V0_2 => {
                    let typed = handle.typed::<(&Batch,), (VerdictList<WireVerdict>,)>(&*store)?;
                    typed.call_async(&mut *store, (batch,)).await?.0.verdicts
                }
                Contract::V0_1 => {
                    let typed =
                        handle.typed::<(&Batch,), (VerdictList<WireVerdictV01>,)>(&*store)?;
                    typed.call_async(&mut *store, (batch,)).await?.0.verdicts
                }
            };
            Ok::<_, wasmtime::Error>(list)
        });
        let result =
            tokio::time::timeout(wall + OUTER_TIMEOUT_GRACE, Metered::new(call, meter)).await;
        let ended = warm.store.data_mut().end_call();
        let outcome = match &result {
            Ok(Ok(_)) => Outcome::Judged,
            _ => Outcome::Faulted,
        };
        ended.count(outcome, &mut self.stats);
        let (emits, stderr) = (ended.outputs.emits, ended.log.stderr);
        let mut verdicts = match result {
            Ok(Ok(verdicts)) => verdicts,
            Ok(Err(e)) => {
                let (kind, message) = classify(&e, warm.store.data(), &stderr);
                return fault(kind, message);
            }
            Err(_) => {
                let (guest, host) = warm.store.data().times();
                return fault(
                    FaultKind::Timeout,
                    format!(
                        "no answer within the wall-clock deadline of {wall:?} (blocked in a host call; guest time {guest:?}, waiting in host calls {host:?})"
                    ),
                );
            }
        };
        if !secrets.is_empty() {
            for v in verdicts.iter_mut() {
                if let Verdict::Reject(Some(reason)) = v {
                    // A reason at its bound may have been cut where it was read, maybe
                    // through a secret.
                    let cut = reason.len() + 4 > self.limits.max_reason_bytes;
                    *reason = secrets.redact_then_cut(reason, usize::MAX, cut);
                }
            }
        }
        self.emits = emits;
        warm.batches += 1;
        if let InstanceMode::Reuse { max_batches } = self.limits.instance_mode
            && warm.batches < max_batches
        {
            if warm.near_memory_limit(self.limits.max_memory) {
                self.stats.recycled_for_memory += 1;
                tracing::debug!(
                    plugin = %self.name,
                    memory = warm.store.data().limiter().memory_bytes,
                    limit = self.limits.max_memory,
                    batches = warm.batches,
                    "replacing an instance that used 3/4 of its memory headroom"
                );
            } else if warm.near_resource_limit() {
                self.stats.recycled_for_resources += 1;
                tracing::debug!(
                    plugin = %self.name,
                    batches = warm.batches,
                    "replacing an instance that still holds half the host resources it may"
                );
            } else {
                self.warm = Some(warm);
            }
        }
        BatchOutcome::Verdicts(verdicts)
    }

    /// A fresh store and instance, with `init(config)` already run under the deadline.
    async fn instantiate(&mut self) -> Result<Warm, Fault> {
        self.stats.instances += 1;
        let mut store = StoreState::new(
            self.name.clone(),
            &self.limits,
            self.init.secrets.clone(),
            self.runtime.turns().clone(),
            self.init.tenant.clone(),
        )
        .into_store(self.pre.component().engine());
        let (cpu, wall) = (self.limits.batch_deadline, self.limits.wall_budget());
        let _ticking = self.runtime.guest_running();
        store.data_mut().begin_call(cpu, wall, None, None);
        let meter = store.data().meter();
        store.set_epoch_deadline(1);
        let init_fault = |kind: FaultKind, message: String| Fault {
            kind,
            message,
            records: 0,
        };
        type Pairs<'a> = &'a [(String, String)];
        let (config, secrets) = (&self.init.config[..], self.init.secrets.pairs());
        let contract = self.contract;
        let setup = async {
            let instance = self.pre.instantiate_async(&mut store).await?;
            let func = |store: &mut Store<StoreState>, name: &str| {
                instance
                    .get_func(&mut *store, name)
                    .ok_or_else(|| WrongType(format!("missing export `{name}`")))
            };
            let handle = func(&mut store, "handle")?;
            let init = func(&mut store, "init")?;
            let wrong = |e: wasmtime::Error| WrongType(format!("{e:#}"));
            let r = match contract {
                Contract::V0_2 => {
                    handle
                        .typed::<(&Batch,), (VerdictList<WireVerdict>,)>(&store)
                        .map_err(|e| wrong(e.context("export `handle`")))?;
                    let init = init
                        .typed::<(Pairs<'_>, Pairs<'_>), (Result<(), String>,)>(&store)
                        .map_err(|e| wrong(e.context("export `init`")))?;
                    init.call_async(&mut store, (config, secrets)).await?.0
                }
                Contract::V0_1 => {
                    handle
                        .typed::<(&Batch,), (VerdictList<WireVerdictV01>,)>(&store)
                        .map_err(|e| wrong(e.context("export `handle`")))?;
                    let init = init
                        .typed::<(Pairs<'_>,), (Result<(), String>,)>(&store)
                        .map_err(|e| wrong(e.context("export `init`")))?;
                    init.call_async(&mut store, (config,)).await?.0
                }
            };
            Ok::<_, wasmtime::Error>((handle, r))
        };
        let result =
            tokio::time::timeout(wall + OUTER_TIMEOUT_GRACE, Metered::new(setup, meter)).await;
        let ended = store.data_mut().end_call();
        ended.count(Outcome::Init, &mut self.stats);
        let stderr = ended.log.stderr;
        match result {
            Ok(Ok((handle, Ok(())))) => Ok(Warm {
                baseline_memory: store.data().limiter().memory_bytes,
                store,
                handle,
                batches: 0,
            }),
            Ok(Ok((_, Err(message)))) => Err(init_fault(
                FaultKind::InitFailed,
                format!(
                    "init refused the configuration: {}",
                    self.init
                        .secrets
                        .redact_then_cut(&message, MAX_INIT_ERROR, false)
                ),
            )),
            Ok(Err(e)) if e.is::<WrongType>() => {
                Err(init_fault(FaultKind::WrongWorld, format!("{e}")))
            }
            Ok(Err(e)) => {
                let (kind, message) = classify(&e, store.data(), &stderr);
                // A panic in init may well print what it was handed.
                let message = self
                    .init
                    .secrets
                    .redact_then_cut(&message, MAX_FAULT_MESSAGE, false);
                Err(init_fault(
                    FaultKind::InitFailed,
                    format!("instantiation or init failed ({kind}): {message}"),
                ))
            }
            Err(_) => Err(init_fault(
                FaultKind::InitFailed,
                format!("init gave no answer within {wall:?}"),
            )),
        }
    }
}

/// An export whose type is not the contract's: the component is of another world.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct WrongType(String);

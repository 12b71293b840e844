//! What a guest can reach: the bounded `log` import, an empty WASI context whose stdout and
//! stderr are captured into bounded buffers, and the per-store state the limits live in.
//!
//! Every granted host call is bounded in what one call may cost, because epochs only
//! interrupt guest code, never a host call in progress: `log` reads at most 4 KiB of its
//! message ([`LogMessage`]), random bytes come at most
//! [`MAX_RANDOM_BYTES_PER_CALL`] per call, stdout/stderr writes accept at most the 16 KiB
//! their `check-write` permits, and no call may carry more than [`HOSTCALL_FUEL`] bytes
//! from the guest. A guest that wants more must call again, and between calls its deadline
//! applies.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, ResourceTable};
use wasmtime::{CallHook, ResourceLimiter};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::sharehost::plugin::host::Level;
use super::config::PluginLimits;
use super::outputs::EmitBuffer;
use super::secrets::Secrets;
use super::turns::{CallUnderWay, Turn, Turns};
use sharehost_bounded_lift::LogMessage;

/// Log messages a guest may emit per batch; further ones are dropped and counted.
pub(crate) const MAX_LOG_MESSAGES_PER_BATCH: u32 = 256;
/// Log bytes a guest may emit per batch.
pub(crate) const MAX_LOG_BYTES_PER_BATCH: usize = 64 << 10;
/// Bytes of stdout (and, separately, stderr) kept per batch; the rest is dropped and counted.
pub(crate) const MAX_STDIO_BYTES_PER_BATCH: usize = 16 << 10;
/// Largest host-side header map (`wasi:http` `fields`) a plugin may build, names and values
/// together (wasmtime-wasi-http allows 128 KiB): far above what requests to APIs carry.
pub(crate) const MAX_FIELDS_BYTES: usize = 16 << 10;

/// Host resources (header maps, requests, bodies, streams, pollables) one instance may hold
/// at once, per MiB of its memory limit, between [`MIN_RESOURCES`] and [`MAX_RESOURCES`].
/// wasmtime allows a million, each header map up to 128 KiB: host memory outside the plugin's
/// cap. With 16 KiB maps the host holds at most about the plugin's own memory limit for it.
const RESOURCES_PER_MIB: usize = (1 << 20) / MAX_FIELDS_BYTES;
/// The fewest host resources an instance may hold: every plugin needs a few dozen.
const MIN_RESOURCES: usize = 256;
/// The most host resources an instance may hold, whatever its memory limit.
const MAX_RESOURCES: usize = 16_384;

/// How many host resources an instance with `max_memory` bytes of memory may hold.
pub(crate) fn max_resources(max_memory: usize) -> usize {
    (max_memory >> 20)
        .saturating_mul(RESOURCES_PER_MIB)
        .clamp(MIN_RESOURCES, MAX_RESOURCES)
}

/// Table elements an instance may grow to; Rust guests need a few hundred.
const MAX_TABLE_ELEMENTS: usize = 100_000;
/// Largest `get-random-bytes` (and insecure) request served in one call: generated in well
/// under a millisecond even in a debug build, where wasmtime-wasi's own 64 MiB default took
/// about 15 s, a host call no deadline could interrupt. Larger requests trap.
pub(crate) const MAX_RANDOM_BYTES_PER_CALL: u64 = 64 << 10;
/// Most bytes one host call may carry from the guest into the host (wasmtime's "hostcall
/// fuel", 128 MiB by default). The grants need far less: stdout/stderr writes are permitted
/// 16 KiB at a time, and `log` and the verdicts are read by the host's own bounded lifts,
/// which never draw on it. A call over it traps.
pub(crate) const HOSTCALL_FUEL: usize = 1 << 20;

/// The interface names the plugin contract's imports are defined under, per contract version
/// this host speaks (a 0.1.x guest links to the first pair, a 0.2.x guest to the second:
/// wasmtime matches 0.x versions by minor). `log` is the same function in both.
const CONTRACT_INSTANCES: [(&str, &str); 2] = [
    (
        "sharehost:plugin/types@0.1.0",
        "sharehost:plugin/host@0.1.0",
    ),
    (
        "sharehost:plugin/types@0.2.0",
        "sharehost:plugin/host@0.2.0",
    ),
];

/// Defines the contract's imports in `linker`: `log` reads its message through the bounded
/// lift instead of the generated binding's, which copies the whole string first; `emit` is
/// the outputs room's.
pub(crate) fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    for (types, host) in CONTRACT_INSTANCES {
        linker.instance(types)?;
        linker.instance(host)?.func_wrap(
            "log",
            |mut store: StoreContextMut<'_, StoreState>, (level, message): (Level, LogMessage)| {
                store.data_mut().log(level, message);
                Ok(())
            },
        )?;
    }
    super::outputs::add_to_linker(linker)
}

/// Everything one store (one instance) owns. Dropped with the store, so nothing a guest
/// did survives a recycle.
pub(crate) struct StoreState {
    wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    /// Outbound HTTP (`wasi:http`), refused unless the pipeline grants hosts.
    pub(crate) http: super::http::HttpState,
    /// Memory cap and whether the guest hit it.
    pub(crate) limiter: Limiter,
    /// The plugin's name (its file's), on every log line.
    pub(crate) plugin: Arc<str>,
    /// The pipeline running it, on every log line too: two pipelines may run one file.
    /// `None` outside a pipeline (`test-plugin`, the benchmarks).
    pub(crate) pipeline: Option<Arc<str>>,
    /// Log budget of the current call.
    pub(crate) log: LogBudget,
    /// Captured stdout.
    pub(crate) stdout: Capture,
    /// Captured stderr (panic messages land here).
    pub(crate) stderr: Capture,
    /// The current call's budgets and where its time went (checked on every epoch tick).
    clock: CallClock,
    /// Set by the epoch callback when it interrupted the guest, with the deadline that passed.
    pub(crate) timed_out: Option<Deadline>,
    /// Emits of the current `handle` call (contract 0.2 outputs).
    pub(crate) emits: EmitBuffer,
    /// Redacts the pipeline's secrets from everything the guest makes the host print.
    pub(crate) secrets: Arc<Secrets>,
    /// The guest's turn on the guest threads while it computes past its first tick.
    pub(crate) turn: TurnSlot,
}

/// A store's place at the [`Turns`] gate: the turn it holds (if any), under its tenant (the
/// pipeline's name).
/// Shared with the tick's yield future, which gives the turn back and waits for the next.
pub(crate) struct TurnSlot {
    turns: Arc<Turns>,
    tenant: Arc<str>,
    held: Arc<Mutex<Option<Turn>>>,
    /// The tick at which the guest's epoch deadline falls (one past the tick it last resumed
    /// at): a host call made before it is the guest's own, one made at or after it is
    /// (almost always) the epoch check itself, which must not give the turn away.
    next_tick: Arc<AtomicU64>,
    /// The call under way (its tenant counts as active meanwhile).
    call: Option<CallUnderWay>,
}

impl TurnSlot {
    fn new(turns: Arc<Turns>, tenant: Arc<str>) -> Self {
        TurnSlot {
            turns,
            tenant,
            held: Arc::new(Mutex::new(None)),
            next_tick: Arc::new(AtomicU64::new(0)),
            call: None,
        }
    }

    /// A call begins, with an epoch deadline of one tick.
    pub(crate) fn started(&mut self) {
        self.call = Some(self.turns.call_began(&self.tenant));
        self.next_tick
            .store(self.turns.ticks() + 1, Ordering::Relaxed);
    }

    /// The call ended: its turn goes back, and it no longer keeps its tenant active.
    pub(crate) fn finished(&mut self) {
        self.give_back();
        self.call = None;
    }

    /// A host call begins: one that may wait (HTTP) holds no turn while it does. The epoch
    /// check is a host call too, and there the tick's own logic decides.
    fn entering_host(&self) {
        if self.turns.ticks() < self.next_tick.load(Ordering::Relaxed) {
            self.give_back();
        }
    }

    fn held(&self) -> MutexGuard<'_, Option<Turn>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the guest awaits at a tick: a yield to the other tasks on its thread, then a
    /// turn. A guest that holds one keeps it unless a guest of another waits (the gate's
    /// policy decides who runs next); one that holds none (its first tick, or back from a
    /// host call) queues for one.
    pub(crate) fn next_slice(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let (turns, tenant, held) = (self.turns.clone(), self.tenant.clone(), self.held.clone());
        let next_tick = self.next_tick.clone();
        Box::pin(async move {
            tokio::task::yield_now().await;
            let given_back = {
                let mut slot = held.lock().unwrap_or_else(|e| e.into_inner());
                if slot.is_some() && !turns.contended() {
                    next_tick.store(turns.ticks() + 1, Ordering::Relaxed);
                    return;
                }
                slot.take()
            };
            // Given back first, so that the gate can hand it to whoever waits.
            drop(given_back);
            let turn = turns.acquire(&tenant).await;
            *held.lock().unwrap_or_else(|e| e.into_inner()) = Some(turn);
            next_tick.store(turns.ticks() + 1, Ordering::Relaxed);
        })
    }

    /// Gives the turn back (the call ended, or entered a host call that may wait).
    pub(crate) fn give_back(&self) {
        let turn = self.held().take();
        drop(turn);
    }
}

/// Which budget of a call ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deadline {
    /// The guest computed for longer than its CPU deadline.
    Cpu,
    /// The call (guest time plus waiting in host calls, e.g. on HTTP) ran past its wall-clock
    /// deadline.
    Wall,
}

/// The CPU time the calling thread has used.
pub(crate) fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// The CPU time one call has used: the thread CPU clock, read at the start and the end of
/// every poll of the call's future ([`Metered`]). What runs inside a poll counts (the guest,
/// and the host's own work for it: a copy, a header map, a TLS record); what happens between
/// polls does not (waiting on a socket or a timer, waiting for a turn after a time-slice
/// yield, other work on a busy machine).
#[derive(Debug, Default)]
pub(crate) struct CpuMeter {
    /// CPU time of the polls that ended, in nanoseconds.
    spent: AtomicU64,
    /// CPU time of host work done for the call on other tasks ([`Charged`]): its outbound
    /// HTTP requests, their connections and bodies, in nanoseconds.
    charged: AtomicU64,
    /// The thread CPU time at the start of the poll under way (`u64::MAX`: none).
    from: AtomicU64,
}

impl CpuMeter {
    fn new() -> Arc<Self> {
        Arc::new(CpuMeter {
            spent: AtomicU64::new(0),
            charged: AtomicU64::new(0),
            from: AtomicU64::new(u64::MAX),
        })
    }

    fn nanos(d: Duration) -> u64 {
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1)
    }

    /// The CPU time so far, the poll under way and host work charged to the call included
    /// (read on the polling thread).
    pub(crate) fn spent(&self) -> Duration {
        let spent = Duration::from_nanos(
            self.spent
                .load(Ordering::Relaxed)
                .saturating_add(self.charged.load(Ordering::Relaxed)),
        );
        match self.from.load(Ordering::Relaxed) {
            u64::MAX => spent,
            from => spent + thread_cpu().saturating_sub(Duration::from_nanos(from)),
        }
    }

    fn poll_started(&self) {
        self.from
            .store(Self::nanos(thread_cpu()), Ordering::Relaxed);
    }

    /// Host work done for the call elsewhere: counted against its CPU deadline.
    pub(crate) fn charge(&self, cpu: Duration) {
        self.charged.fetch_add(Self::nanos(cpu), Ordering::Relaxed);
    }

    /// The part of [`CpuMeter::spent`] that was host work on other tasks.
    pub(crate) fn charged(&self) -> Duration {
        Duration::from_nanos(self.charged.load(Ordering::Relaxed))
    }

    fn poll_ended(&self) {
        let from = self.from.swap(u64::MAX, Ordering::Relaxed);
        if from != u64::MAX {
            let d = Self::nanos(thread_cpu()).saturating_sub(from);
            self.spent.fetch_add(d, Ordering::Relaxed);
        }
    }
}

/// A call's future, its CPU time measured poll by poll by its [`CpuMeter`]. Boxed so that it
/// is `Unpin` without unsafe pin projection.
pub(crate) struct Metered<F> {
    inner: Pin<Box<F>>,
    meter: Arc<CpuMeter>,
}

impl<F: Future> Metered<F> {
    pub(crate) fn new(inner: F, meter: Arc<CpuMeter>) -> Self {
        Metered {
            inner: Box::pin(inner),
            meter,
        }
    }
}

impl<F: Future> Future for Metered<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.meter.poll_started();
        let r = self.inner.as_mut().poll(cx);
        self.meter.poll_ended();
        r
    }
}

/// A future polled on some task other than the call's (an HTTP exchange, a connection),
/// whose thread CPU time per poll is charged to the call that started it.
pub(crate) struct Charged<F: ?Sized> {
    meter: Arc<CpuMeter>,
    inner: Pin<Box<F>>,
}

impl<F: Future + ?Sized> Charged<F> {
    pub(crate) fn new(inner: Pin<Box<F>>, meter: Arc<CpuMeter>) -> Self {
        Charged { meter, inner }
    }
}

impl<F: Future + ?Sized> Future for Charged<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let from = thread_cpu();
        let r = self.inner.as_mut().poll(cx);
        self.meter.charge(thread_cpu().saturating_sub(from));
        r
    }
}

/// Where a call's time goes: guest time is its CPU time ([`CpuMeter`]), host time the wall
/// time spent inside host calls (for fault messages).
struct CallClock {
    cpu_budget: Duration,
    wall_deadline: Instant,
    in_host: Duration,
    host_since: Option<Instant>,
    meter: Arc<CpuMeter>,
}

impl CallClock {
    fn new(cpu_budget: Duration, wall_deadline: Instant) -> Self {
        Self {
            cpu_budget,
            wall_deadline,
            in_host: Duration::ZERO,
            host_since: None,
            meter: CpuMeter::new(),
        }
    }

    fn entered_host(&mut self, now: Instant) {
        // Host calls do not nest in a component instance; keep the outermost entry if they do.
        self.host_since.get_or_insert(now);
    }

    fn left_host(&mut self, now: Instant) {
        if let Some(since) = self.host_since.take() {
            self.in_host += now.saturating_duration_since(since);
        }
    }

    fn host_time(&self, now: Instant) -> Duration {
        self.in_host
            + self
                .host_since
                .map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
    }

    fn guest_time(&self) -> Duration {
        self.meter.spent()
    }
}

impl StoreState {
    /// A state with an empty WASI context: no preopens, no environment, no arguments, stdin
    /// closed, networking denied (wasmtime-wasi 48's default), stdio captured; outbound HTTP
    /// and outputs as `limits` grant them.
    pub(crate) fn new(
        plugin: Arc<str>,
        limits: &PluginLimits,
        secrets: Arc<Secrets>,
        turns: Arc<Turns>,
        pipeline: Option<Arc<str>>,
    ) -> Self {
        let stdout = Capture::new();
        let stderr = Capture::new();
        let wasi = WasiCtx::builder()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_blocking_current_thread(false)
            .max_random_size(MAX_RANDOM_BYTES_PER_CALL)
            .build();
        let now = Instant::now();
        let mut table = ResourceTable::new();
        table.set_max_capacity(max_resources(limits.max_memory));
        Self {
            wasi,
            table,
            http: super::http::HttpState::new(
                limits.http.clone(),
                plugin.clone(),
                pipeline.clone(),
                secrets.clone(),
            ),
            emits: EmitBuffer::new(limits.outputs.clone()),
            secrets,
            limiter: Limiter {
                max_memory: limits.max_memory,
                hit: false,
                memory_bytes: 0,
            },
            log: LogBudget::default(),
            stdout,
            stderr,
            clock: CallClock::new(Duration::ZERO, now),
            timed_out: None,
            turn: TurnSlot::new(turns, pipeline.clone().unwrap_or_else(|| plugin.clone())),
            plugin,
            pipeline,
        }
    }

    /// Resets the per-call budgets before a call into the guest: `cpu` of CPU time (the call's
    /// own, see [`CpuMeter`]: waiting in host calls, e.g. on HTTP, does not count) within `wall`
    /// of wall time.
    pub(crate) fn begin_call(&mut self, cpu: Duration, wall: Duration) {
        let now = Instant::now();
        self.clock = CallClock::new(cpu, now + wall.max(cpu));
        self.turn.started();
        self.timed_out = None;
        self.log = LogBudget::default();
        self.http.refusals().reset();
        self.http.charge_to(self.clock.meter.clone());
    }

    /// The meter of the call [`StoreState::begin_call`] started: wrap the call's future in a
    /// [`Metered`] with it.
    pub(crate) fn meter(&self) -> Arc<CpuMeter> {
        self.clock.meter.clone()
    }

    /// Called on every epoch tick, on the thread running the guest: which deadline, if any,
    /// has passed.
    pub(crate) fn check_deadlines(&mut self) -> Option<Deadline> {
        let now = Instant::now();
        let passed = if now >= self.clock.wall_deadline {
            Some(Deadline::Wall)
        } else if self.clock.guest_time() >= self.clock.cpu_budget {
            Some(Deadline::Cpu)
        } else {
            None
        };
        if passed.is_some() {
            self.timed_out = passed;
        }
        passed
    }

    /// The call hook: brackets every host call (and libcall), so that waiting in one is not
    /// counted as guest time.
    pub(crate) fn on_call_hook(&mut self, hook: CallHook) {
        match hook {
            CallHook::CallingHost => {
                self.clock.entered_host(Instant::now());
                self.turn.entering_host();
            }
            CallHook::ReturningFromHost => self.clock.left_host(Instant::now()),
            CallHook::CallingWasm | CallHook::ReturningFromWasm => {}
        }
    }

    /// Host work done on other tasks for the call so far (its HTTP requests), counted in its
    /// CPU time (for fault messages).
    pub(crate) fn charged(&self) -> Duration {
        self.clock.meter.charged()
    }

    /// Guest time and host-call time of the call so far (for fault messages).
    pub(crate) fn times(&self) -> (Duration, Duration) {
        let now = Instant::now();
        (self.clock.guest_time(), self.clock.host_time(now))
    }

    /// Logs what the guest printed during the call (bounded) and returns its stderr text
    /// (the fault classifier reads panic messages there) and what was dropped.
    pub(crate) fn drain_stdio(&mut self) -> Drained {
        let (out, out_dropped) = self.stdout.take();
        let (err, err_dropped) = self.stderr.take();
        let plugin = &*self.plugin;
        let pipeline = self.pipeline.as_deref();
        // Kept only up to the bound, so a secret may run past the end of what was kept.
        let out = self.secrets.redact_then_cut(
            &String::from_utf8_lossy(&out),
            usize::MAX,
            out_dropped > 0,
        );
        for line in out.lines().filter(|l| !l.is_empty()) {
            tracing::info!(plugin, pipeline, stream = "stdout", "{line}");
        }
        let err = self.secrets.redact_then_cut(
            &String::from_utf8_lossy(&err),
            usize::MAX,
            err_dropped > 0,
        );
        for line in err.lines().filter(|l| !l.is_empty()) {
            tracing::warn!(plugin, pipeline, stream = "stderr", "{line}");
        }
        if out_dropped + err_dropped > 0 {
            tracing::warn!(
                plugin,
                pipeline,
                stdout_dropped = out_dropped,
                stderr_dropped = err_dropped,
                "plugin output over the per-batch bound was dropped"
            );
        }
        if self.log.dropped > 0 {
            tracing::warn!(
                plugin,
                pipeline,
                dropped = self.log.dropped,
                "plugin log messages over the per-batch bound were dropped"
            );
        }
        let refusals = self.http.refusals().dropped();
        if refusals > 0 {
            tracing::warn!(
                plugin,
                pipeline,
                not_logged = refusals,
                "refused outbound HTTP requests over the per-call bound were not logged (counted in sharehost_http_requests)"
            );
        }
        Drained {
            stderr: err,
            log_messages_dropped: self.log.dropped,
            output_bytes_dropped: (out_dropped + err_dropped) as u64,
        }
    }
}

/// What a call left behind in the captured streams.
pub(crate) struct Drained {
    /// The captured stderr text (bounded).
    pub(crate) stderr: String,
    /// Log messages over the per-batch budget.
    pub(crate) log_messages_dropped: u64,
    /// stdout + stderr bytes over the per-batch bound.
    pub(crate) output_bytes_dropped: u64,
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// The memory cap of one instance. Growth past it is a trap (never a silent `-1` the guest
/// might mishandle), and `hit` tells the fault classifier it was out of memory.
pub(crate) struct Limiter {
    pub(crate) max_memory: usize,
    /// Whether the guest asked for more than `max_memory`.
    pub(crate) hit: bool,
    /// Bytes of linear memory the instance holds, all memories together (they never shrink):
    /// what one instance of a plugin costs, for the benchmark and the plugin guide.
    pub(crate) memory_bytes: usize,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_memory {
            self.hit = true;
            return Err(wasmtime::format_err!(
                "plugin memory limit of {} bytes exceeded (asked for {desired})",
                self.max_memory
            ));
        }
        self.memory_bytes += desired.saturating_sub(current);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// What the guest may still log in the current call.
#[derive(Default)]
pub(crate) struct LogBudget {
    messages: u32,
    bytes: usize,
    /// Messages dropped for being over the budget.
    pub(crate) dropped: u64,
}

impl StoreState {
    /// The `log` import: tagged with the plugin's name, bounded per message (by the lift)
    /// and per batch.
    fn log(&mut self, level: Level, message: LogMessage) {
        let budget = &mut self.log;
        if budget.messages >= MAX_LOG_MESSAGES_PER_BATCH || budget.bytes >= MAX_LOG_BYTES_PER_BATCH
        {
            budget.dropped += 1;
            return;
        }
        let LogMessage { text, truncated } = message;
        // Only a prefix was read: a secret may run past its end.
        let mut message = self.secrets.redact_then_cut(&text, usize::MAX, truncated);
        if truncated {
            message.push_str("…[truncated]");
        }
        budget.messages += 1;
        budget.bytes += message.len();
        let plugin = &*self.plugin;
        let pipeline = self.pipeline.as_deref();
        match level {
            Level::Trace => tracing::trace!(plugin, pipeline, "{message}"),
            Level::Debug => tracing::debug!(plugin, pipeline, "{message}"),
            Level::Info => tracing::info!(plugin, pipeline, "{message}"),
            Level::Warn => tracing::warn!(plugin, pipeline, "{message}"),
            Level::Error => tracing::error!(plugin, pipeline, "{message}"),
        }
    }
}

/// A bounded in-memory sink for a guest's stdout or stderr. Writes past the bound succeed
/// (so a chatty guest never fails or panics on a print) but the bytes are dropped and counted.
#[derive(Clone)]
pub(crate) struct Capture {
    inner: Arc<Mutex<CaptureBuf>>,
}

#[derive(Default)]
struct CaptureBuf {
    bytes: Vec<u8>,
    dropped: usize,
}

impl Capture {
    fn new() -> Self {
        Self {
            inner: Arc::new(Mutex::new(CaptureBuf::default())),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CaptureBuf> {
        // A poisoned lock only means a writer panicked mid-append; the bytes are still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn append(&self, bytes: &[u8]) {
        let mut buf = self.lock();
        let room = MAX_STDIO_BYTES_PER_BATCH.saturating_sub(buf.bytes.len());
        let kept = room.min(bytes.len());
        buf.bytes.extend_from_slice(&bytes[..kept]);
        buf.dropped += bytes.len() - kept;
    }

    /// Takes the captured bytes and the count of dropped ones, leaving the sink empty.
    fn take(&self) -> (Vec<u8>, usize) {
        let mut buf = self.lock();
        let dropped = std::mem::take(&mut buf.dropped);
        (std::mem::take(&mut buf.bytes), dropped)
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Capture {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl OutputStream for Capture {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(MAX_STDIO_BYTES_PER_BATCH)
    }
}

impl AsyncWrite for Capture {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.append(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

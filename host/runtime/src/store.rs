//! The store: everything one instance owns, and the one list of the capabilities it holds.
//!
//! [`StoreState`] holds each capability's state ([`Capabilities`], made by the
//! `capabilities!` list below: WASI's empty context whose stdout and stderr go to the log's
//! captures, log, outputs, HTTP), the resource table they share, the memory cap and the budgets
//! of the call under way. Each capability is one module implementing
//! [`crate::capability::Capability`] (its state, its imports, its per-call hooks, its
//! counters) and one line in that list, as Spin's factors are one crate and one field of the
//! runtime's factors. Secrets are no capability: the guest imports nothing for them (they
//! enter through `init`'s parameter), and the log and HTTP redact with the same [`Secrets`].
//!
//! Every granted host call is bounded in what one call may cost, because epochs only
//! interrupt guest code, never a host call in progress: `log` reads at most 4 KiB of its
//! message, random bytes come at most
//! [`MAX_RANDOM_BYTES_PER_CALL`](crate::wasi::MAX_RANDOM_BYTES_PER_CALL) per call, stdout/stderr
//! writes accept at most the 16 KiB their `check-write` permits, and no call may carry more
//! than [`HOSTCALL_FUEL`] bytes from the guest. A guest that wants more must call again, and
//! between calls its deadline applies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::{Linker, ResourceTable};
use wasmtime::{CallHook, Engine, ResourceLimiter, Store, UpdateDeadline};

use crate::capability::{Call, Setup, capabilities};
use crate::config::PluginLimits;
use crate::http::{HttpCtx, MAX_FIELDS_BYTES};
use crate::log::{LogCtx, Stdio};
use crate::meter::{CallClock, CpuMeter, Deadline};
use crate::outputs::OutputsCtx;
use crate::secrets::Secrets;
use crate::turns::{TurnSlot, Turns};
use crate::wasi::Wasi;

capabilities! {
    /// WASI, served from an empty context (`wasi.rs`); first: the others' interfaces use its
    /// streams and pollables.
    wasi: Wasi,
    /// The `log` import and the captured stdout and stderr (`log.rs`).
    log: LogCtx,
    /// Emits of the current `handle` call (contract 0.2 outputs, `outputs.rs`).
    outputs: OutputsCtx,
    /// Outbound HTTP (`wasi:http`), refused unless the pipeline grants hosts (`http/`).
    http: HttpCtx,
}

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
/// Most bytes one host call may carry from the guest into the host (wasmtime's "hostcall
/// fuel", 128 MiB by default). The grants need far less: stdout/stderr writes are permitted
/// 16 KiB at a time, and `log` and the verdicts are read by the host's own bounded lifts,
/// which never draw on it. A call over it traps.
pub(crate) const HOSTCALL_FUEL: usize = 1 << 20;

/// Defines every import a plugin may be granted in `linker`: every capability's. Whether a
/// plugin may import each is decided at load (`validate.rs`) and per request (its HTTP
/// grant), never here.
pub(crate) fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    Capabilities::add_to_linker(linker)
}

/// Everything one store (one instance) owns. Dropped with the store, so nothing a guest
/// did survives a recycle.
pub(crate) struct StoreState {
    /// The resources the capabilities hand the guest (WASI streams, HTTP requests, ...),
    /// bounded by the plugin's memory limit ([`max_resources`]).
    pub(crate) table: ResourceTable,
    /// Every capability's state.
    pub(crate) caps: Capabilities,
    /// Memory cap and whether the guest hit it.
    limiter: Limiter,
    /// The current call's budgets and where its time went (checked on every epoch tick).
    clock: CallClock,
    /// Set by the epoch callback when it interrupted the guest, with the deadline that passed.
    timed_out: Option<Deadline>,
    /// The guest's turn on the guest threads while it computes past its first tick.
    turn: TurnSlot,
}

impl StoreState {
    /// A state for one instance of `plugin`, run by `pipeline` (`None` outside one): every
    /// capability as `limits` grant it, everything the guest makes the host print redacted of
    /// `secrets`; its calls take turns on the guest threads as the pipeline's (or, outside a
    /// pipeline, the plugin's).
    pub(crate) fn new(
        plugin: Arc<str>,
        limits: &PluginLimits,
        secrets: Arc<Secrets>,
        turns: Arc<Turns>,
        pipeline: Option<Arc<str>>,
    ) -> Self {
        let caps = Capabilities::new(&Setup {
            plugin: &plugin,
            pipeline: &pipeline,
            limits,
            secrets: &secrets,
            stdio: &Stdio::new(),
        });
        let mut table = ResourceTable::new();
        table.set_max_capacity(max_resources(limits.max_memory));
        Self {
            table,
            caps,
            limiter: Limiter {
                max_memory: limits.max_memory,
                hit: false,
                memory_bytes: 0,
            },
            clock: CallClock::new(Duration::ZERO, Instant::now()),
            timed_out: None,
            turn: TurnSlot::new(turns, pipeline.unwrap_or(plugin)),
        }
    }

    /// A store of `engine` around this state, with the limits and hooks every plugin store
    /// has: the memory cap, the hostcall fuel, the call hook that tells guest time from host
    /// time, and the epoch callback that enforces the deadlines and time-slices the guest.
    pub(crate) fn into_store(self, engine: &Engine) -> Store<StoreState> {
        let mut store = Store::new(engine, self);
        store.limiter(|s| &mut s.limiter);
        store.set_hostcall_fuel(HOSTCALL_FUEL);
        store.call_hook(|mut ctx, hook| {
            ctx.data_mut().on_call_hook(hook);
            Ok(())
        });
        store.epoch_deadline_callback(|mut ctx| {
            if ctx.data_mut().check_deadlines().is_some() {
                return Ok(UpdateDeadline::Interrupt);
            }
            // Time-slice: every tick, other tasks on this thread run, and past its first tick
            // the guest computes only on a turn of the fair share (the call's CPU meter stops
            // between polls, so waiting for a turn costs it nothing).
            Ok(UpdateDeadline::YieldCustom(1, ctx.data().turn.next_slice()))
        });
        store
    }

    /// Resets the per-call budgets before a call into the guest: `cpu` of CPU time (the call's
    /// own, see [`CpuMeter`]: waiting in host calls, e.g. on HTTP, does not count) within `wall`
    /// of wall time. `records` opens the outputs for a `handle` call over that many records
    /// (`None`: `init`, where every emit is refused).
    pub(crate) fn begin_call(
        &mut self,
        cpu: Duration,
        wall: Duration,
        records: Option<u32>,
        traceparent: Option<&http::HeaderValue>,
    ) {
        let now = Instant::now();
        self.clock = CallClock::new(cpu, now + wall.max(cpu));
        self.turn.started();
        self.timed_out = None;
        let meter = self.clock.meter().clone();
        self.caps.begin_call(&Call {
            records,
            meter: &meter,
            traceparent,
        });
    }

    /// The call ended (or was abandoned): its turn goes back, and every capability reports
    /// what the call left behind (its emits, what it printed, which is logged now).
    pub(crate) fn end_call(&mut self) -> Ended {
        self.turn.finished();
        self.caps.end_call()
    }

    /// The meter of the call [`StoreState::begin_call`] started: wrap the call's future in a
    /// [`crate::meter::Metered`] with it.
    pub(crate) fn meter(&self) -> Arc<CpuMeter> {
        self.clock.meter().clone()
    }

    /// Called on every epoch tick, on the thread running the guest: which deadline, if any,
    /// has passed.
    fn check_deadlines(&mut self) -> Option<Deadline> {
        let passed = self.clock.passed(Instant::now());
        if passed.is_some() {
            self.timed_out = passed;
        }
        passed
    }

    /// The call hook: brackets every host call (and libcall), so that waiting in one is not
    /// counted as guest time.
    fn on_call_hook(&mut self, hook: CallHook) {
        match hook {
            CallHook::CallingHost => {
                self.clock.entered_host(Instant::now());
                self.turn.entering_host();
            }
            CallHook::ReturningFromHost => self.clock.left_host(Instant::now()),
            CallHook::CallingWasm | CallHook::ReturningFromWasm => {}
        }
    }

    /// The deadline the epoch callback interrupted the call at, if it did.
    pub(crate) fn timed_out(&self) -> Option<Deadline> {
        self.timed_out
    }

    /// Host work done on other tasks for the call so far (its HTTP requests), counted in its
    /// CPU time (for fault messages).
    pub(crate) fn charged(&self) -> Duration {
        self.clock.meter().charged()
    }

    /// Guest time and host-call time of the call so far (for fault messages).
    pub(crate) fn times(&self) -> (Duration, Duration) {
        let now = Instant::now();
        (self.clock.guest_time(), self.clock.host_time(now))
    }

    /// The instance's memory cap.
    pub(crate) fn limiter(&self) -> &Limiter {
        &self.limiter
    }
}

/// The memory cap of one instance. Growth past it is a trap (never a silent `-1` the guest
/// might mishandle), and `hit` tells the fault classifier it was out of memory.
pub(crate) struct Limiter {
    /// The plugin's memory limit.
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

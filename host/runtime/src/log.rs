//! Log: what a plugin may print. The contract's `log` import (`sharehost:plugin/host`, both
//! contract versions) and the guest's stdout and stderr, captured into bounded buffers and
//! written to the host's log when the call ends, every line tagged with the plugin's name and
//! its pipeline and with the pipeline's secrets redacted.
//!
//! In the shape of wasmtime's capability crates: a context per store ([`LogCtx`], made by
//! [`LogCtxBuilder`], whose defaults are documented there), a view made for each host call
//! ([`Log`]), and [`add_to_linker`] with a function that makes the view from the store's state;
//! [`LogCtx`]'s [`Capability`] implementation plugs all of it into the store (`store.rs`).
//!
//! `log` alone of the contract's imports is wired by hand, not through the `Host` trait that
//! `bindgen!` generates: the generated lift reads the message into a `String` whole (up to the
//! store's hostcall fuel, 1 MiB) before any host code runs, where the bounded lift reads at
//! most the 4 KiB it keeps. What the WIT declares still binds it at compile time: the level is
//! the generated type, the message's type is checked against the generated trait's signature
//! (`GENERATED_LOG`), and the type-only `types` interface is linked by the generated code.
//!
//! Bounds: `log` reads at most 4 KiB of a message (the host's own bounded lift,
//! [`LogMessage`]); a batch may log [`MAX_LOG_MESSAGES_PER_BATCH`] messages and
//! [`MAX_LOG_BYTES_PER_BATCH`] bytes, and keep [`MAX_STDIO_BYTES_PER_BATCH`] of stdout and as
//! much of stderr; stdout and stderr writes accept at most that much per `check-write`. What
//! is over a bound is dropped and counted, never an error the guest sees.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use sharehost_bounded_lift::LogMessage;
use tokio::io::AsyncWrite;
use wasmtime::StoreContextMut;
use wasmtime::component::{HasData, Linker};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

use crate::bindings::v02::sharehost::plugin::host::{self as wire, Level};
use crate::bindings::{v01, v02};
use crate::capability::{Capability, Outcome, Setup};
use crate::plugin::PluginStats;
use crate::secrets::Secrets;
use crate::store::StoreState;

/// Log messages a guest may emit per batch; further ones are dropped and counted.
pub(crate) const MAX_LOG_MESSAGES_PER_BATCH: u32 = 256;
/// Log bytes a guest may emit per batch.
pub(crate) const MAX_LOG_BYTES_PER_BATCH: usize = 64 << 10;
/// Bytes of stdout (and, separately, stderr) kept per batch; the rest is dropped and counted.
pub(crate) const MAX_STDIO_BYTES_PER_BATCH: usize = 16 << 10;

/// The interface names the hand-wired `log` is defined under, per contract version this host
/// speaks (a 0.1.x guest links to the first, a 0.2.x guest to the second: wasmtime matches 0.x
/// versions by minor). `log` is the same function in both.
const HOST_INSTANCES: [&str; 2] = ["sharehost:plugin/host@0.1.0", "sharehost:plugin/host@0.2.0"];

/// The generated `log` of contract 0.2, as a function pointer of the signature the hand-wired
/// one lifts (`level`, then the message, which the generated code lifts as a `String`). A
/// change to `log` in the WIT fails to compile here, as a change to any other import fails in
/// its generated trait's implementation.
const GENERATED_LOG: fn(&mut (dyn wire::Host + 'static), Level, String) = <dyn wire::Host>::log;

/// The generated `log` of contract 0.1, checked the same way.
const GENERATED_LOG_V01: fn(
    &mut (dyn v01::sharehost::plugin::host::Host + 'static),
    v01::sharehost::plugin::host::Level,
    String,
) = <dyn v01::sharehost::plugin::host::Host>::log;

/// The guest's stdout and stderr, captured: one store's WASI context writes to them and its
/// log drains them when a call ends.
#[derive(Clone)]
pub(crate) struct Stdio {
    /// The guest's stdout.
    pub(crate) stdout: Capture,
    /// The guest's stderr.
    pub(crate) stderr: Capture,
}

impl Stdio {
    /// Two empty captures.
    pub(crate) fn new() -> Self {
        Self {
            stdout: Capture::new(),
            stderr: Capture::new(),
        }
    }
}

/// Builds a [`LogCtx`]. The defaults: lines tagged `plugin` and no pipeline, nothing to
/// redact, stdio captures of its own; the per-batch bounds are this module's constants, the
/// same for every plugin.
pub(crate) struct LogCtxBuilder {
    plugin: Arc<str>,
    pipeline: Option<Arc<str>>,
    secrets: Arc<Secrets>,
    stdio: Stdio,
}

impl LogCtxBuilder {
    /// A builder with the defaults.
    pub(crate) fn new() -> Self {
        Self {
            plugin: Arc::from("plugin"),
            pipeline: None,
            secrets: Arc::default(),
            stdio: Stdio::new(),
        }
    }

    /// The plugin's name (its file's), on every line.
    pub(crate) fn plugin(mut self, plugin: Arc<str>) -> Self {
        self.plugin = plugin;
        self
    }

    /// The pipeline running the plugin, on every line too: two pipelines may run one file.
    /// `None` outside a pipeline (`test-plugin`, the benchmarks).
    pub(crate) fn pipeline(mut self, pipeline: Option<Arc<str>>) -> Self {
        self.pipeline = pipeline;
        self
    }

    /// The secrets redacted from every line.
    pub(crate) fn secrets(mut self, secrets: Arc<Secrets>) -> Self {
        self.secrets = secrets;
        self
    }

    /// The captures of the guest's stdout and stderr (the ones its WASI context writes to).
    pub(crate) fn stdio(mut self, stdio: Stdio) -> Self {
        self.stdio = stdio;
        self
    }

    /// The context, with a full budget.
    pub(crate) fn build(self) -> LogCtx {
        LogCtx {
            plugin: self.plugin,
            pipeline: self.pipeline,
            secrets: self.secrets,
            budget: LogBudget::default(),
            stdout: self.stdio.stdout,
            stderr: self.stdio.stderr,
        }
    }
}

/// What one store keeps for the log capability: who its lines are tagged with, the secrets
/// they are redacted of, the current call's budget and the captured stdio.
pub(crate) struct LogCtx {
    plugin: Arc<str>,
    pipeline: Option<Arc<str>>,
    secrets: Arc<Secrets>,
    budget: LogBudget,
    stdout: Capture,
    stderr: Capture,
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

impl LogCtx {
    /// A builder with the defaults.
    pub(crate) fn builder() -> LogCtxBuilder {
        LogCtxBuilder::new()
    }

    /// A call begins: its log budget is full again.
    pub(crate) fn begin_call(&mut self) {
        self.budget = LogBudget::default();
    }

    /// The call ended: logs what the guest printed during it (bounded, redacted) and returns
    /// its stderr text (the fault classifier reads panic messages there) and what was dropped.
    pub(crate) fn drain(&mut self) -> Drained {
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
        if self.budget.dropped > 0 {
            tracing::warn!(
                plugin,
                pipeline,
                dropped = self.budget.dropped,
                "plugin log messages over the per-batch bound were dropped"
            );
        }
        Drained {
            stderr: err,
            log_messages_dropped: self.budget.dropped,
            output_bytes_dropped: (out_dropped + err_dropped) as u64,
        }
    }
}

/// What the guest may still log in the current call.
#[derive(Default)]
struct LogBudget {
    messages: u32,
    bytes: usize,
    /// Messages dropped for being over the budget.
    dropped: u64,
}

/// The log capability as one host call sees it.
pub(crate) struct Log<'a> {
    ctx: &'a mut LogCtx,
}

impl<'a> Log<'a> {
    /// A view of `ctx` for one call.
    pub(crate) fn new(ctx: &'a mut LogCtx) -> Self {
        Self { ctx }
    }

    /// The `log` import: tagged with the plugin's name, bounded per message (by the lift)
    /// and per batch.
    fn log(&mut self, level: Level, message: LogMessage) {
        let ctx = &mut *self.ctx;
        let budget = &mut ctx.budget;
        if budget.messages >= MAX_LOG_MESSAGES_PER_BATCH || budget.bytes >= MAX_LOG_BYTES_PER_BATCH
        {
            budget.dropped += 1;
            return;
        }
        let LogMessage { text, truncated } = message;
        // Only a prefix was read: a secret may run past its end.
        let mut message = ctx.secrets.redact_then_cut(&text, usize::MAX, truncated);
        if truncated {
            message.push_str("…[truncated]");
        }
        budget.messages += 1;
        budget.bytes += message.len();
        let plugin = &*ctx.plugin;
        let pipeline = ctx.pipeline.as_deref();
        match level {
            Level::Trace => tracing::trace!(plugin, pipeline, "{message}"),
            Level::Debug => tracing::debug!(plugin, pipeline, "{message}"),
            Level::Info => tracing::info!(plugin, pipeline, "{message}"),
            Level::Warn => tracing::warn!(plugin, pipeline, "{message}"),
            Level::Error => tracing::error!(plugin, pipeline, "{message}"),
        }
    }
}

impl v02::sharehost::plugin::types::Host for Log<'_> {}
impl v01::sharehost::plugin::types::Host for Log<'_> {}

impl Capability for LogCtx {
    type Report = Drained;

    fn new(setup: &Setup<'_>) -> Self {
        LogCtx::builder()
            .plugin(setup.plugin.clone())
            .pipeline(setup.pipeline.clone())
            .secrets(setup.secrets.clone())
            .stdio(setup.stdio.clone())
            .build()
    }

    fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
        add_to_linker(linker, |state| Log::new(&mut state.caps.log))
    }

    fn begin_call(&mut self, _call: &crate::capability::Call<'_>) {
        LogCtx::begin_call(self);
    }

    fn end_call(&mut self) -> Drained {
        self.drain()
    }

    /// What was dropped counts whatever the call's outcome.
    fn count(report: &Drained, _outcome: Outcome, stats: &mut PluginStats) {
        stats.log_messages_dropped += report.log_messages_dropped;
        stats.output_bytes_dropped += report.output_bytes_dropped;
    }
}

/// What the generated `add_to_linker` of the type-only `types` interface is handed.
struct LogImports;

impl HasData for LogImports {
    type Data<'a> = Log<'a>;
}

/// Defines the contract's `host` interface and its type-only `types` in `linker`, for both
/// contract versions: `types` through the generated bindings, `log` by hand, reading its
/// message through the bounded lift ([`LogMessage`]) instead of the generated binding's,
/// which copies the whole string first. `view` makes the capability's view from the store's
/// state, per call.
pub(crate) fn add_to_linker<T: 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> Log<'_>,
) -> wasmtime::Result<()> {
    let _ = (GENERATED_LOG, GENERATED_LOG_V01);
    v01::sharehost::plugin::types::add_to_linker::<T, LogImports>(linker, view)?;
    v02::sharehost::plugin::types::add_to_linker::<T, LogImports>(linker, view)?;
    for host in HOST_INSTANCES {
        linker.instance(host)?.func_wrap(
            "log",
            move |mut store: StoreContextMut<'_, T>, (level, message): (Level, LogMessage)| {
                view(store.data_mut()).log(level, message);
                Ok(())
            },
        )?;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn message(text: &str) -> LogMessage {
        LogMessage {
            text: text.to_owned(),
            truncated: false,
        }
    }

    #[test]
    fn a_call_logs_at_most_its_budget_and_counts_the_rest() {
        let mut ctx = LogCtx::builder().build();
        ctx.begin_call();
        let over = 10;
        for _ in 0..MAX_LOG_MESSAGES_PER_BATCH + over {
            Log::new(&mut ctx).log(Level::Debug, message("hello"));
        }
        assert_eq!(ctx.drain().log_messages_dropped, u64::from(over));
        // The next call has a full budget again.
        ctx.begin_call();
        Log::new(&mut ctx).log(Level::Debug, message("hello"));
        assert_eq!(ctx.drain().log_messages_dropped, 0);
    }

    #[test]
    fn what_a_call_dropped_counts_whatever_its_outcome() {
        for outcome in [Outcome::Init, Outcome::Judged, Outcome::Faulted] {
            let mut ctx = LogCtx::builder().build();
            ctx.begin_call();
            for _ in 0..=MAX_LOG_MESSAGES_PER_BATCH {
                Log::new(&mut ctx).log(Level::Debug, message("hello"));
            }
            OutputStream::write(
                &mut ctx.stderr.clone(),
                Bytes::from(vec![b'x'; MAX_STDIO_BYTES_PER_BATCH + 3]),
            )
            .expect("a write past the bound succeeds");
            let report = Capability::end_call(&mut ctx);
            let mut stats = PluginStats::default();
            LogCtx::count(&report, outcome, &mut stats);
            assert_eq!(
                (stats.log_messages_dropped, stats.output_bytes_dropped),
                (1, 3),
                "{outcome:?}"
            );
        }
    }

    #[test]
    fn the_store_s_stdio_is_the_one_the_log_drains() {
        let stdio = Stdio::new();
        let mut ctx = LogCtx::builder().stdio(stdio.clone()).build();
        OutputStream::write(
            &mut stdio.stderr.clone(),
            Bytes::from_static(b"panicked at"),
        )
        .expect("write");
        assert_eq!(ctx.drain().stderr, "panicked at");
    }

    #[test]
    fn captured_stdio_keeps_its_bound_and_counts_the_rest() {
        let mut ctx = LogCtx::builder().build();
        let mut out = ctx.stdout.clone();
        OutputStream::write(
            &mut out,
            Bytes::from(vec![b'x'; MAX_STDIO_BYTES_PER_BATCH + 5]),
        )
        .expect("a write past the bound succeeds");
        let drained = ctx.drain();
        assert_eq!(drained.output_bytes_dropped, 5);
        assert_eq!(ctx.drain().output_bytes_dropped, 0, "drained means empty");
    }
}

//! The fault model of a call into a plugin: nothing a guest does may bring down the host, so a
//! call that gives no verdicts is a [`Fault`] of a [`FaultKind`], its batch a
//! [`BatchOutcome::Fault`] the pipeline applies its fault policy to. Also how a failed call is
//! told apart ([`classify`]) and how long what a fault says may be.

use sharehost_bounded_lift::{Verdict, VerdictLiftError};
use wasmtime::Trap;

use crate::meter::Deadline;
use crate::store::{HOSTCALL_FUEL, StoreState, max_resources};

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
    /// An export has a type other than the contract's (reported at load as a wrong world).
    WrongWorld,
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
            Self::WrongWorld => "wrong_world",
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

impl Fault {
    /// The verdict a record of this fault's batch gets under the fault `policy`: the policy
    /// itself, except that a reject says it was this fault (kind and message), so its dead
    /// letter tells a fault from the plugin's own reject.
    pub fn verdict_under(&self, policy: &Verdict) -> Verdict {
        match policy {
            Verdict::Reject(_) => Verdict::Reject(Some(format!(
                "plugin fault ({}): {}",
                self.kind, self.message
            ))),
            other => other.clone(),
        }
    }
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

/// Longest fault message kept (a deep recursion's wasm backtrace can run to megabytes). Cut
/// after redaction ([`Secrets::redact_then_cut`]).
pub(crate) const MAX_FAULT_MESSAGE: usize = 512;

/// Longest text a fault message is built from before it is redacted and cut to
/// [`MAX_FAULT_MESSAGE`]: far enough past the final cut that a secret crossing that cut is
/// still whole when it is redacted.
const MAX_FAULT_SOURCE: usize = 16 << 10;

/// Longest `init` error kept (redacted first): a plugin refusing its configuration with a
/// megabyte of text, in fresh-instance mode once per batch, would otherwise flood the log.
pub(crate) const MAX_INIT_ERROR: usize = 1 << 10;

/// The cause of a failed call without wasmtime's wasm backtrace context, bounded.
fn cause(e: &wasmtime::Error) -> String {
    sharehost_text::cut(&e.root_cause().to_string(), MAX_FAULT_SOURCE).to_owned()
}

/// Maps a failed call onto a fault kind, most specific evidence first: what the host refused of
/// the guest's answer, a deadline the epoch callback hit (`state`), the memory cap, a panic
/// message on the captured `stderr`, a bound of the store, then the trap itself.
pub(crate) fn classify(
    e: &wasmtime::Error,
    state: &StoreState,
    stderr: &str,
) -> (FaultKind, String) {
    // The guest returned, and the host refused what it returned.
    match e.downcast_ref::<VerdictLiftError>() {
        Some(l @ VerdictLiftError::WrongCount { .. }) => {
            return (FaultKind::WrongVerdictCount, l.to_string());
        }
        Some(l @ VerdictLiftError::Unreadable(_)) => {
            return (
                FaultKind::UnreadableVerdicts,
                sharehost_text::cut(&l.to_string(), MAX_FAULT_SOURCE).to_owned(),
            );
        }
        None => {}
    }
    match state.timed_out() {
        Some(Deadline::Cpu) => {
            let charged = state.charged();
            let message = if charged.is_zero() {
                "interrupted at the batch's CPU deadline".to_owned()
            } else {
                format!(
                    "interrupted at the batch's CPU deadline ({charged:?} of it host work for the plugin's HTTP requests)"
                )
            };
            return (FaultKind::Timeout, message);
        }
        Some(Deadline::Wall) => {
            let (guest, host) = state.times();
            return (
                FaultKind::Timeout,
                format!(
                    "interrupted at the batch's wall-clock deadline (guest time {guest:?}, waiting in host calls {host:?})"
                ),
            );
        }
        None => {}
    }
    if state.limiter().hit {
        return (FaultKind::OutOfMemory, cause(e));
    }
    if let Some((_, after)) = stderr.split_once("panicked at") {
        // Rust's panic hook prints "thread '…' panicked at FILE:LINE:COL:\nMESSAGE".
        let after = after.split("\nnote: run with").next().unwrap_or(after);
        let text = format!("panicked at{}", after.trim_end()).replace('\n', " ");
        return (
            FaultKind::Panic,
            sharehost_text::cut(&text, MAX_FAULT_SOURCE).to_owned(),
        );
    }
    let root = cause(e);
    if root.contains("maximum concurrent limit of") {
        // wasmtime's pool is out of slots (instances, or core instances, memories, tables of
        // them). Every pooled component fits one slot's share, so this means more instances
        // are alive than the runtime was sized for.
        return (
            FaultKind::Trap,
            format!(
                "the plugin instance pool is exhausted ({root}): sharehost reserves \
                 3 × concurrency + 3 instances per pipeline ([pipeline] concurrency; \
                 test-plugin reserves 4), so more instances are alive than that"
            ),
        );
    }
    if root.contains("resource table has no free keys") {
        // wasmtime's words for the store's resource table being full (the cap on what a
        // plugin makes the host hold for it): say which bound and what raises it.
        let limit = state.limiter().max_memory;
        return (
            FaultKind::Trap,
            format!(
                "the plugin holds more host resources at once (HTTP requests and responses, \
                 header maps, streams, pollables) than its memory limit allows: {} for {} MiB \
                 (64 per MiB of memory_limit_mib); hold fewer at once (fewer requests in \
                 flight in one call: send_all in smaller groups in Rust and Python, fewer \
                 fetches under one Promise.all in JavaScript) or raise the limit",
                max_resources(limit),
                limit >> 20
            ),
        );
    }
    if root.contains("fuel allocated for hostcalls has been exhausted") {
        // wasmtime's words for the store's hostcall fuel running out: say which bound it is
        // and what usually crosses it.
        return (
            FaultKind::Trap,
            format!(
                "too much data in one host call: more than {} MiB from the plugin, the most a \
                 call may carry (an emit's key, value and headers together, or one write to \
                 stdout or stderr, are bounded by it)",
                HOSTCALL_FUEL >> 20
            ),
        );
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::StackOverflow) => (FaultKind::StackOverflow, cause(e)),
        Some(Trap::Interrupt) => (FaultKind::Timeout, cause(e)),
        _ => (FaultKind::Trap, with_last_words(stderr, cause(e))),
    }
}

/// A trap's cause with the last line the guest wrote to stderr in front: the Python and
/// JavaScript SDKs write an uncaught exception's message and location there just before they
/// trap, where the trap alone says only "unreachable". The stderr text is already bounded and
/// redacted when it reaches here.
fn with_last_words(stderr: &str, cause: String) -> String {
    match stderr.lines().map(str::trim).rfind(|l| !l.is_empty()) {
        Some(line) => format!("{} ({cause})", sharehost_text::cut(line, MAX_FAULT_SOURCE)),
        None => cause,
    }
}

#[cfg(test)]
mod last_words_tests {
    use super::*;

    #[test]
    fn a_trap_shows_the_last_line_the_guest_wrote_to_stderr_first() {
        let cause = "wasm trap: wasm `unreachable` instruction executed".to_owned();
        assert_eq!(
            with_last_words(
                "warming up\nplugin fault: ValueError: bad (at plugin.py:3 in handle)\n\n",
                cause.clone()
            ),
            format!("plugin fault: ValueError: bad (at plugin.py:3 in handle) ({cause})")
        );
        assert_eq!(with_last_words(" \n", cause.clone()), cause);
    }
}

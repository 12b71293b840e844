//! Where and when guest code runs: the guest threads (apart from the host's own, so a guest
//! computing to its deadline never holds a thread the host's I/O waits on) and the epoch
//! ticker, the dedicated thread whose ticks enforce the CPU deadline and time-slice guests.
//! Which guest runs on the threads when more compute than there are threads is `turns.rs`'
//! business.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use wasmtime::Engine;

use crate::error::RuntimeError;
use crate::turns::Turns;

/// The threads guests run on, apart from the host's own: a guest computing to its deadline
/// takes one of these, never a thread that the share engine's I/O, another pipeline's
/// acknowledgements or the admin API wait on. One per core; which guest runs on them when
/// there are more busy guests than threads is [`Turns`]' business.
pub(crate) struct GuestThreads {
    runtime: Option<tokio::runtime::Runtime>,
}

impl GuestThreads {
    /// Starts `threads` guest threads (at least one).
    pub(crate) fn start(threads: usize) -> Result<Self, RuntimeError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("sharehost-guest")
            .enable_all()
            .build()
            .map_err(|e| RuntimeError::Engine(format!("cannot start the guest threads: {e}")))?;
        Ok(Self {
            runtime: Some(runtime),
        })
    }

    /// Runs `future` on the guest threads.
    pub(crate) fn spawn<F>(&self, future: F) -> GuestTask<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let rt = self
            .runtime
            .as_ref()
            .expect("the guest threads live as long as the runtime");
        GuestTask {
            handle: rt.spawn(future),
        }
    }
}

impl Drop for GuestThreads {
    fn drop(&mut self) {
        // The last handle may go inside an async context (a test, a drained pipeline):
        // a blocking shutdown would panic there. Guests still running are cut off.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// A future run on the guest threads ([`GuestThreads::spawn`]): awaiting it gives its
/// output; dropping it cancels it there (as dropping the future itself would have).
pub(crate) struct GuestTask<T> {
    handle: tokio::task::JoinHandle<T>,
}

impl<T> Drop for GuestTask<T> {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

impl<T> Future for GuestTask<T> {
    type Output = Result<T, tokio::task::JoinError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.handle).poll(cx)
    }
}

/// The dedicated epoch thread. A tokio task would stop ticking exactly when it matters most:
/// when a spinning guest (or anything else) blocks the executor's threads. It ticks only while
/// guest code may run: idle, it parks instead of waking 500 times a second (half a percent of
/// a core whatever the number of pipelines). Stops, and its thread is joined, when dropped.
pub(crate) struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Guest calls under way ([`GuestRunning`] guards).
    running: Arc<AtomicUsize>,
    /// The ticker is parked until a call starts (not just between two ticks).
    asleep: Arc<AtomicBool>,
    /// The ticker's thread, to unpark it when the first call starts.
    waker: Thread,
}

/// Ticks the ticker keeps making after the last guest call ended before it parks: calls
/// that follow each other closely (a pipeline's batches, thousands a second) then find it
/// ticking, instead of each waking it (a futex wake and a thread switch per call, then a
/// park again: a fifth of the host's CPU at 1 KiB records). At the 2 ms default tick, an
/// idle host parks the ticker 100 ms after its last call.
const IDLE_TICKS_BEFORE_PARKING: u32 = 50;

/// Held while guest code may run (instantiation, `init`, `handle`): the epoch ticker, which
/// enforces the CPU deadline and time-slices the guest, ticks while any guard exists.
pub(crate) struct GuestRunning {
    running: Arc<AtomicUsize>,
}

impl Drop for GuestRunning {
    fn drop(&mut self) {
        self.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Ticker {
    /// Starts the ticker thread: every `tick` while guests run, it advances the epoch of every
    /// engine in `engines` and counts the tick at `turns`.
    pub(crate) fn start(
        engines: Vec<Engine>,
        tick: Duration,
        turns: Arc<Turns>,
    ) -> Result<Ticker, RuntimeError> {
        let stop = Arc::new(AtomicBool::new(false));
        let running = Arc::new(AtomicUsize::new(0));
        let asleep = Arc::new(AtomicBool::new(false));
        let (flag, calls, parked) = (stop.clone(), running.clone(), asleep.clone());
        let tick = tick.max(Duration::from_micros(100));
        let thread = std::thread::Builder::new()
            .name("sharehost-epoch".into())
            .spawn(move || {
                let mut idle = 0u32;
                while !flag.load(Ordering::Relaxed) {
                    if calls.load(Ordering::SeqCst) == 0 {
                        idle = idle.saturating_add(1);
                    } else {
                        idle = 0;
                    }
                    if idle > IDLE_TICKS_BEFORE_PARKING {
                        // No guest ran for a while: sleep until the first call (or the
                        // runtime's drop) unparks us. `asleep` is set before `running` is read
                        // again, and a starting call raises `running` before it reads `asleep`
                        // (both SeqCst): either we see the call and do not park, or the call
                        // sees us asleep and unparks us (its token makes a late park return).
                        parked.store(true, Ordering::SeqCst);
                        if calls.load(Ordering::SeqCst) == 0 {
                            std::thread::park();
                        }
                        parked.store(false, Ordering::SeqCst);
                        idle = 0;
                        continue;
                    }
                    // park_timeout, not sleep: dropping the runtime unparks us at once.
                    std::thread::park_timeout(tick);
                    for engine in &engines {
                        engine.increment_epoch();
                    }
                    turns.tick();
                }
            })
            .map_err(RuntimeError::Ticker)?;
        Ok(Ticker {
            stop,
            waker: thread.thread().clone(),
            thread: Some(thread),
            running,
            asleep,
        })
    }

    /// Starts the ticker (if it was parked) for a guest call; it keeps ticking until the
    /// guard is dropped, and a while after.
    pub(crate) fn guest_running(&self) -> GuestRunning {
        if self.running.fetch_add(1, Ordering::SeqCst) == 0 && self.asleep.load(Ordering::SeqCst) {
            self.waker.unpark();
        }
        GuestRunning {
            running: self.running.clone(),
        }
    }
}

//! What a call costs: its CPU time, measured poll by poll on the thread that runs it, plus the
//! host work done for it on other tasks (its HTTP exchanges), against its CPU and wall-clock
//! budgets. Written by hand because the measure is the thread CPU clock read around each poll
//! of one future, which no crate offers; it is what the CPU deadline of a plugin call counts.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

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

/// Where a call's time goes, against its budgets: guest time is its CPU time ([`CpuMeter`]),
/// host time the wall time spent inside host calls (for fault messages).
pub(crate) struct CallClock {
    cpu_budget: Duration,
    wall_deadline: Instant,
    in_host: Duration,
    host_since: Option<Instant>,
    meter: Arc<CpuMeter>,
}

impl CallClock {
    /// A clock for a call with `cpu_budget` of CPU time, to end by `wall_deadline`.
    pub(crate) fn new(cpu_budget: Duration, wall_deadline: Instant) -> Self {
        Self {
            cpu_budget,
            wall_deadline,
            in_host: Duration::ZERO,
            host_since: None,
            meter: CpuMeter::new(),
        }
    }

    /// The guest called into the host.
    pub(crate) fn entered_host(&mut self, now: Instant) {
        // Host calls do not nest in a component instance; keep the outermost entry if they do.
        self.host_since.get_or_insert(now);
    }

    /// The host call returned to the guest.
    pub(crate) fn left_host(&mut self, now: Instant) {
        if let Some(since) = self.host_since.take() {
            self.in_host += now.saturating_duration_since(since);
        }
    }

    /// Wall time spent in host calls so far.
    pub(crate) fn host_time(&self, now: Instant) -> Duration {
        self.in_host
            + self
                .host_since
                .map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
    }

    /// CPU time of the call so far (see [`CpuMeter::spent`]).
    pub(crate) fn guest_time(&self) -> Duration {
        self.meter.spent()
    }

    /// The call's meter: its future is wrapped in a [`Metered`] with it, and host work done
    /// for it elsewhere is [`Charged`] to it.
    pub(crate) fn meter(&self) -> &Arc<CpuMeter> {
        &self.meter
    }

    /// Which budget, if any, has run out (the wall-clock one first: it is the outer bound).
    pub(crate) fn passed(&self, now: Instant) -> Option<Deadline> {
        if now >= self.wall_deadline {
            Some(Deadline::Wall)
        } else if self.guest_time() >= self.cpu_budget {
            Some(Deadline::Cpu)
        } else {
            None
        }
    }
}

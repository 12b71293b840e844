//! The one guard for counts that must come back down: room a fetch reserves from the in-flight
//! bound, and requests carrying acknowledgements that `flush` waits for. Raised by hand and
//! lowered by hand, such a count stays up for good when the code between returns early, panics,
//! or is dropped mid-await (a leader task aborted by `close`'s timeout): the bound would shrink
//! for good, or `flush` would wait for an answer that never comes.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// A count raised by `by` for as long as this value lives; dropping it lowers the count again
/// (and wakes the waiters of `notify`, when given), however the scope ends.
#[must_use = "the count comes back down when this guard is dropped"]
pub(super) struct Raised<'a> {
    count: &'a AtomicUsize,
    by: usize,
    notify: Option<&'a Notify>,
}

impl<'a> Raised<'a> {
    /// Raises `count` by `by`.
    pub(super) fn by(count: &'a AtomicUsize, by: usize) -> Self {
        count.fetch_add(by, Ordering::AcqRel);
        Raised {
            count,
            by,
            notify: None,
        }
    }

    /// Wakes every waiter of `notify` once the count is down again (after it is lowered, so a
    /// woken waiter sees the lower count).
    pub(super) fn waking(mut self, notify: &'a Notify) -> Self {
        self.notify = Some(notify);
        self
    }
}

impl Drop for Raised<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(self.by, Ordering::AcqRel);
        if let Some(n) = self.notify {
            n.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raises the count, then leaves early as an error path does.
    fn leaves_early(count: &AtomicUsize, fail: bool) -> Result<usize, &'static str> {
        let _raised = Raised::by(count, 3);
        if fail {
            return Err("early");
        }
        Ok(count.load(Ordering::Acquire))
    }

    #[test]
    fn the_count_is_up_while_the_guard_lives_and_down_after_an_early_return() {
        let count = AtomicUsize::new(1);
        assert_eq!(leaves_early(&count, false), Ok(4), "raised inside");
        assert_eq!(count.load(Ordering::Acquire), 1);
        assert_eq!(leaves_early(&count, true), Err("early"));
        assert_eq!(
            count.load(Ordering::Acquire),
            1,
            "down after the early return"
        );
    }

    #[test]
    fn the_count_comes_down_when_the_scope_panics() {
        let count = AtomicUsize::new(0);
        let caught = std::panic::catch_unwind(|| {
            let _raised = Raised::by(&count, 2);
            assert_eq!(count.load(Ordering::Acquire), 2);
            panic!("mid-request");
        });
        assert!(caught.is_err());
        assert_eq!(count.load(Ordering::Acquire), 0, "down after the panic");
    }

    #[tokio::test]
    async fn a_dropped_future_lowers_the_count_and_wakes_the_waiters() {
        let count = AtomicUsize::new(0);
        let answered = Notify::new();
        let waiter = answered.notified();
        tokio::pin!(waiter);
        waiter.as_mut().enable();
        {
            // A request future holding the guard, dropped before it is answered (aborted).
            let request = async {
                let _raised = Raised::by(&count, 1).waking(&answered);
                std::future::pending::<()>().await;
            };
            tokio::pin!(request);
            assert!(futures_poll_once(request.as_mut()).await.is_none());
            assert_eq!(count.load(Ordering::Acquire), 1, "raised while in flight");
        }
        assert_eq!(count.load(Ordering::Acquire), 0, "down once dropped");
        assert!(
            futures_poll_once(waiter.as_mut()).await.is_some(),
            "the drop woke the waiter"
        );
    }

    /// Polls `f` once; `None` when it is still pending.
    async fn futures_poll_once<F: std::future::Future + Unpin>(f: F) -> Option<F::Output> {
        let mut f = f;
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
                std::task::Poll::Ready(v) => Some(v),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }
}

//! What a request holds while it is under way: its permit ([`Flight`], given back when both
//! the body and the connection are done, or at the request's deadline whatever the guest
//! does), and the response body as the guest reads it ([`CappedBody`]: cut past the size cap
//! or the deadline). The body is read only as fast as the guest reads it, so the host holds
//! at most hyper's read buffer per request, never the body.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};
use wasmtime_wasi_http::Error as HttpError;

use super::report::{HttpStats, bump};

/// The permit of one request and its in-flight gauge, shared by the response body and the
/// connection task: released when both are done.
///
/// Also ended at the request's deadline by a timer, whatever the guest does: a plugin that
/// starts requests and never reads (or drops) their responses, keeping them in a static of a
/// reused instance, would otherwise hold every permit of the pipeline across batches.
pub(crate) struct Flight {
    permit: std::sync::Mutex<Option<OwnedSemaphorePermit>>,
    /// The grant's counters (its in-flight gauge, what the body ends with).
    stats: Arc<HttpStats>,
    /// The grant's pipeline, on log lines.
    pipeline: Arc<str>,
}

impl Flight {
    /// A request holding `permit`, counted in `stats`.
    pub(crate) fn new(
        permit: OwnedSemaphorePermit,
        stats: Arc<HttpStats>,
        pipeline: Arc<str>,
    ) -> Arc<Self> {
        Arc::new(Flight {
            permit: std::sync::Mutex::new(Some(permit)),
            stats,
            pipeline,
        })
    }

    /// Gives the permit back (once); returns whether this call did.
    fn end(&self) -> bool {
        let permit = self.permit.lock().unwrap_or_else(|e| e.into_inner()).take();
        if permit.is_some() {
            self.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
        permit.is_some()
    }

    /// Ends the flight at `deadline` if it is still under way then.
    pub(crate) fn end_at(flight: &Arc<Flight>, deadline: Instant, origin: String) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak = Arc::downgrade(flight);
        runtime.spawn(async move {
            tokio::time::sleep_until(deadline).await;
            if let Some(flight) = weak.upgrade()
                && flight.end()
            {
                tracing::debug!(
                    pipeline = &*flight.pipeline,
                    origin = %origin,
                    "outbound HTTP request still held at its deadline: its permit is given back"
                );
            }
        });
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        self.end();
    }
}

/// A response body that fails past the size cap or the request's deadline, and releases the
/// request's permit as soon as it ends.
pub(crate) struct CappedBody {
    inner: Option<hyper::body::Incoming>,
    cap: u64,
    received: u64,
    deadline: Pin<Box<Sleep>>,
    flight: Option<Arc<Flight>>,
    origin: String,
}

impl CappedBody {
    /// The body `incoming` of the request of `flight` to `origin`, cut past `cap` bytes or
    /// at `deadline`.
    pub(crate) fn new(
        incoming: hyper::body::Incoming,
        cap: u64,
        deadline: Instant,
        flight: Arc<Flight>,
        origin: String,
    ) -> Self {
        Self {
            inner: Some(incoming),
            cap,
            received: 0,
            deadline: Box::pin(tokio::time::sleep_until(deadline)),
            flight: Some(flight),
            origin,
        }
    }

    fn end(&mut self, counter: Option<fn(&HttpStats) -> &AtomicU64>) {
        if let (Some(counter), Some(flight)) = (counter, &self.flight) {
            bump(counter(&flight.stats));
        }
        self.inner = None;
        self.flight = None;
    }

    fn pipeline(&self) -> Arc<str> {
        self.flight
            .as_ref()
            .map(|f| f.pipeline.clone())
            .unwrap_or_else(|| Arc::from(""))
    }
}

impl Body for CappedBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received = this.received.saturating_add(data.len() as u64);
                    if this.received > this.cap {
                        tracing::warn!(
                            pipeline = &*this.pipeline(),
                            origin = %this.origin,
                            max_response_bytes = this.cap,
                            "outbound HTTP response cut: body over http_max_response_bytes"
                        );
                        let received = this.received;
                        this.end(Some(|s| &s.too_large));
                        return Poll::Ready(Some(Err(HttpError::HttpResponseBodySize(Some(
                            received,
                        )))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.end(Some(|s| &s.failed));
                Poll::Ready(Some(Err(HttpError::Hyper(e))))
            }
            Poll::Ready(None) => {
                this.end(None);
                Poll::Ready(None)
            }
            Poll::Pending => {
                if this.deadline.as_mut().poll(cx).is_ready() {
                    tracing::debug!(
                        pipeline = &*this.pipeline(),
                        origin = %this.origin,
                        "outbound HTTP response body timed out (http_timeout_ms)"
                    );
                    this.end(Some(|s| &s.timed_out));
                    return Poll::Ready(Some(Err(HttpError::ConnectionReadTimeout)));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map(Body::size_hint)
            .unwrap_or_else(|| SizeHint::with_exact(0))
    }
}

/// The body of an outgoing request as the guest writes it, drained to its end should the
/// request be dropped before (refused, or its connection failed or reset): the guest's writes
/// to a body nobody reads would fail, and a guest runtime that does not expect that traps
/// (StarlingMonkey, under JavaScript's `fetch`, hits `unreachable` on a POST to a refused
/// host) instead of seeing the request's own error, which its response then carries. What is
/// drained is discarded as it comes, so it costs no memory; the drain ends when the guest
/// finishes the body or drops it.
pub(crate) struct DrainedRequestBody {
    inner: Option<wasmtime_wasi_http::WasiBody>,
}

impl DrainedRequestBody {
    /// Wraps the body of a request about to be handled.
    pub(crate) fn new(body: wasmtime_wasi_http::WasiBody) -> Self {
        Self { inner: Some(body) }
    }
}

impl Body for DrainedRequestBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            // Read to its end: nothing left to drain.
            self.inner = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for DrainedRequestBody {
    fn drop(&mut self) {
        let Some(mut body) = self.inner.take() else {
            return;
        };
        if body.is_end_stream() {
            return;
        }
        // Dropped outside a runtime (never in the host, where requests live on its tasks),
        // the body goes with it as before.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                use http_body_util::BodyExt;
                while let Some(Ok(_)) = body.frame().await {}
            });
        }
    }
}

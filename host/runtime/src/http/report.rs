//! What outbound HTTP tells an operator: the counters of a grant's requests (the pipeline's
//! metrics) and the log of a store's refused requests (bounded per call, redacted, cut).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::secrets::Secrets;

/// Counters of one grant's requests, for the pipeline's metrics: they tell an operator
/// whether a plugin is being refused, throttled or failing, without reading logs.
#[derive(Debug, Default)]
pub struct HttpStats {
    pub(crate) sent: AtomicU64,
    pub(crate) refused_by_list: AtomicU64,
    pub(crate) refused_by_address: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) timed_out: AtomicU64,
    pub(crate) too_large: AtomicU64,
    pub(crate) in_flight: AtomicU64,
    pub(crate) waiting: AtomicU64,
}

/// A copy of [`HttpStats`] at one moment, plain numbers for export.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HttpCounts {
    /// Requests that left the host (a connection was attempted).
    pub sent: u64,
    /// Requests refused because their origin is not in `allowed_outbound_hosts`.
    pub refused_by_list: u64,
    /// Requests refused because the name resolved only to addresses not permitted.
    pub refused_by_address: u64,
    /// Requests (or response bodies) that failed otherwise: DNS, connect, TLS, protocol.
    pub failed: u64,
    /// Requests (or response bodies) that ran out of `request_timeout`.
    pub timed_out: u64,
    /// Responses refused or cut at `max_response_bytes`, or refused for a head over 64 KiB.
    pub too_large: u64,
    /// Requests holding a permit now (gauge).
    pub in_flight: u64,
    /// Requests waiting for a permit now (gauge).
    pub waiting: u64,
}

impl HttpStats {
    /// Reads every counter (each atomically, not all at one instant).
    pub fn snapshot(&self) -> HttpCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        HttpCounts {
            sent: get(&self.sent),
            refused_by_list: get(&self.refused_by_list),
            refused_by_address: get(&self.refused_by_address),
            failed: get(&self.failed),
            timed_out: get(&self.timed_out),
            too_large: get(&self.too_large),
            in_flight: get(&self.in_flight),
            waiting: get(&self.waiting),
        }
    }
}

/// Counts one more.
pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Holds a gauge up while it lives.
pub(crate) struct Gauge<'a>(&'a AtomicU64);

impl<'a> Gauge<'a> {
    /// Raises `gauge` until the guard is dropped.
    pub(crate) fn enter(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Gauge(gauge)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Refused requests logged per call; the rest are counted and said in one line when the call
/// ends. A plugin asking for thousands of refused hosts a batch would otherwise write a line
/// for each, outside its log budget.
pub(crate) const MAX_REFUSALS_LOGGED_PER_CALL: u64 = 8;

/// Longest origin text a refusal line shows: a plugin chooses the name (60 KB names made
/// 120 MB of log in 15 s).
const MAX_LOGGED_ORIGIN: usize = 256;

/// The refusals of one instance's calls: logged with the plugin's name, within a per-call
/// budget, with the plugin's secrets redacted (the origin is lower-cased, so ignoring case)
/// and the origin cut.
pub(crate) struct Refusals {
    plugin: Arc<str>,
    pipeline: Option<Arc<str>>,
    secrets: Arc<Secrets>,
    logged: AtomicU64,
    dropped: AtomicU64,
}

impl Refusals {
    /// An empty log for the calls of `plugin` in `pipeline`, with `secrets` redacted.
    pub(crate) fn new(plugin: Arc<str>, pipeline: Option<Arc<str>>, secrets: Arc<Secrets>) -> Self {
        Self {
            plugin,
            pipeline,
            secrets,
            logged: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Logs one refused request to `origin` (within the call's budget), saying `what`.
    pub(crate) fn note(&self, origin: &str, what: &'static str) {
        if self.logged.fetch_add(1, Ordering::Relaxed) >= MAX_REFUSALS_LOGGED_PER_CALL {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut origin = self.secrets.redact_ignoring_case(origin);
        if origin.len() > MAX_LOGGED_ORIGIN {
            sharehost_text::truncate(&mut origin, MAX_LOGGED_ORIGIN);
            origin.push_str("…[truncated]");
        }
        tracing::warn!(plugin = &*self.plugin, pipeline = self.pipeline.as_deref(), origin = %origin, "{what}");
    }

    /// Starts a call's budget; returns how many refusals the last call did not log.
    pub(crate) fn reset(&self) -> u64 {
        self.logged.store(0, Ordering::Relaxed);
        self.dropped.swap(0, Ordering::Relaxed)
    }

    /// How many refusals of the current call were not logged.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The call ended: says in one line how many of its refusals were not logged, if any.
    pub(crate) fn end_call(&self) {
        let not_logged = self.dropped();
        if not_logged > 0 {
            tracing::warn!(
                plugin = &*self.plugin,
                pipeline = self.pipeline.as_deref(),
                not_logged,
                "refused outbound HTTP requests over the per-call bound were not logged (counted in sharehost_http_requests)"
            );
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A refusal log of plugin `p` in pipeline `orders` with these secrets.
    pub(crate) fn refusals_of(secrets: &[(&str, &str)]) -> Refusals {
        Refusals::new(
            Arc::from("p"),
            Some(Arc::from("orders")),
            Arc::new(Secrets::new(
                secrets
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                    .collect(),
            )),
        )
    }

    #[test]
    fn refusals_are_logged_within_a_budget_redacted_and_cut() {
        #[derive(Clone, Default)]
        struct Buf(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let refusals = refusals_of(&[("token", "Sekret-Token-Value")]);
        let long = format!("http://{}.example.com:80", "a".repeat(60_000));
        tracing::subscriber::with_default(subscriber, || {
            refusals.note("http://sekret-token-value.example.com:80", "refused");
            for _ in 0..10_000 {
                refusals.note(&long, "refused");
            }
        });
        let text =
            String::from_utf8_lossy(&buf.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
        assert!(!text.to_ascii_lowercase().contains("sekret"), "{text}");
        assert!(text.contains("[secret token]"), "{text}");
        assert_eq!(
            text.matches("refused").count() as u64,
            MAX_REFUSALS_LOGGED_PER_CALL
        );
        assert!(text.len() < 8 * 1024, "{} bytes of log", text.len());
        assert_eq!(refusals.dropped(), 10_001 - MAX_REFUSALS_LOGGED_PER_CALL);
        assert_eq!(refusals.reset(), 10_001 - MAX_REFUSALS_LOGGED_PER_CALL);
        assert_eq!(refusals.dropped(), 0);
    }
}

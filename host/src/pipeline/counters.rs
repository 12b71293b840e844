//! What a pipeline counts: per plugin version (what `GET /pipelines` shows), the engine's
//! numbers as last published, its writes apart from verdicts, the stall of a hot swap, and the
//! last fault of records released for one. Every series is created at zero when the pipeline
//! (or a version) starts, so dashboards and alerts see each family from the start.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use sharehost_api::VersionCounters;

use super::versions::short;
use crate::metrics::{DeliveryCounts, Labels, Metrics};
use crate::recent_faults::RecentFaults;
use crate::runtime::{Fault, HttpGrant};
use crate::share::consumer::ShareConsumer;

/// The engine's numbers as last published, for `GET /pipelines`.
#[derive(Debug, Default)]
pub(super) struct EngineCounts {
    /// The engine's totals last published as counters (session resets, rebalances, released
    /// by the broker, acks ok, acks failed, released at the delivery limit, verdicts unsent,
    /// verdicts replayed).
    published: Mutex<[u64; 8]>,
    pub(super) peak: AtomicU64,
    pub(super) limit: AtomicU64,
    pub(super) fetches: AtomicU64,
    pub(super) acquired: AtomicU64,
    pub(super) acquired_split: AtomicU64,
}

/// The pipeline's own count of its writes (outputs and dead letters), apart from verdicts.
#[derive(Debug, Default)]
pub(super) struct WriteCounts {
    /// Batches whose writes wait for a retry now.
    pub(super) waiting: AtomicUsize,
    /// Failed produce requests.
    pub(super) failures: AtomicU64,
    /// Records released because the pipeline stopped before their writes landed.
    pub(super) released: AtomicU64,
    /// Dead letters written without the record's key, value and headers.
    pub(super) shrunk: AtomicU64,
}

/// The verdicts `sharehost_records_total` counts, in [`VersionSeries::records`]' order.
const VERDICTS: [&str; 5] = ["accept", "release", "reject", "renew", "retry"];

/// The series of one version that every batch touches, looked up once: each look-up builds a
/// label set and hashes it, and a batch made about ten of them.
pub(super) struct VersionSeries {
    /// `sharehost_batches_total`.
    pub(super) batches: Counter,
    /// `sharehost_guest_seconds`.
    pub(super) guest_seconds: Histogram,
    /// `sharehost_records_total` by verdict, as [`VERDICTS`] lists them.
    records: [Counter; 5],
}

impl VersionSeries {
    /// `sharehost_records_total` of `verdict` (one of [`VERDICTS`]; `None` for another).
    pub(super) fn records(&self, verdict: &str) -> Option<&Counter> {
        VERDICTS
            .iter()
            .position(|v| *v == verdict)
            .and_then(|i| self.records.get(i))
    }
}

/// The pipeline's counts, in one place: the per-version counters, the engine's and the writes'
/// numbers, and the metrics registry they are published to under the pipeline's name.
pub(super) struct Counters {
    name: String,
    pub(super) metrics: Arc<Metrics>,
    per_version: Mutex<HashMap<String, VersionCounters>>,
    /// Records dead-lettered.
    pub(super) dead_lettered: AtomicU64,
    /// Records acquired and not yet judged, as last published.
    pub(super) in_flight: AtomicU64,
    /// Whether the pipeline's member is in its group (the coordinator answered it last).
    pub(super) joined: AtomicBool,
    pub(super) engine: EngineCounts,
    pub(super) writes: WriteCounts,
    /// Batches waiting for the schema registry (to decode their records or encode their
    /// emits): while any does, the pipeline shows degraded.
    pub(super) schema_waiting: std::sync::atomic::AtomicUsize,
    pub(super) stall: Mutex<SwapStall>,
    /// The last fault of records released for one, for their dead letter at the cap.
    pub(super) last_faults: Mutex<LastFaults>,
    /// The last faults met, in words, for `GET /faults` and the console.
    pub(super) recent_faults: Arc<RecentFaults>,
    /// Each version's [`VersionSeries`], by hash.
    series: Mutex<HashMap<String, Arc<VersionSeries>>>,
    /// `sharehost_delivery_count` of the pipeline, looked up once.
    delivery_count: DeliveryCounts,
    /// The series [`Counters::publish_engine`] sets, looked up once.
    engine_series: EngineSeries,
}

/// What the HTTP client counted, in the order `sharehost_http_requests`' `result` label names.
const HTTP_RESULTS: [&str; 8] = [
    "sent",
    "refused_host",
    "refused_address",
    "failed",
    "timed_out",
    "too_large",
    "in_flight",
    "waiting",
];

/// The pipeline's series the engine's numbers go to, looked up once: they are published on
/// every turn of the run loop (so a scrape sees an assignment change as soon as the records
/// it brought), and a look-up per series builds and hashes a label set.
struct EngineSeries {
    up: Gauge,
    in_flight: Gauge,
    /// The engine's totals, in the order of [`EngineCounts::published`].
    totals: [Counter; 8],
    /// `sharehost_http_requests` by [`HTTP_RESULTS`], made at the first publish with an HTTP
    /// grant (a pipeline without one has no such series).
    http: std::sync::OnceLock<[Gauge; 8]>,
    labels: Labels,
}

impl EngineSeries {
    fn new(m: &Metrics, l: &Labels) -> EngineSeries {
        // One statement per look-up: a family's guard lives to the end of its statement, and
        // a second look-up in the same family that inserts would wait on it for ever.
        let with = |key: &'static str, value: &str| {
            let mut l = l.clone();
            l.push((key, value.into()));
            l
        };
        let acks_ok = m.acks.get_or_create(&with("result", "ok")).clone();
        let acks_failed = m.acks.get_or_create(&with("result", "failed")).clone();
        let unsent = m
            .verdicts_lost
            .get_or_create(&lost_labels(l, "unsent"))
            .clone();
        EngineSeries {
            up: m.pipeline_up.get_or_create(l).clone(),
            in_flight: m.in_flight.get_or_create(l).clone(),
            totals: [
                m.session_resets.get_or_create(l).clone(),
                m.rebalances.get_or_create(l).clone(),
                m.released_by_broker.get_or_create(l).clone(),
                acks_ok,
                acks_failed,
                m.released_at_delivery_limit.get_or_create(l).clone(),
                unsent,
                m.verdicts_replayed.get_or_create(l).clone(),
            ],
            http: std::sync::OnceLock::new(),
            labels: l.clone(),
        }
    }

    fn http(&self, m: &Metrics) -> &[Gauge; 8] {
        self.http.get_or_init(|| {
            HTTP_RESULTS.map(|r| {
                let mut l = self.labels.clone();
                l.push(("result", r.into()));
                m.http_requests.get_or_create(&l).clone()
            })
        })
    }
}

impl Counters {
    /// Counts for pipeline `name`, published to `metrics`.
    pub(super) fn new(name: &str, metrics: Arc<Metrics>) -> Counters {
        let delivery_count = metrics
            .delivery_count
            .get_or_create(&vec![("pipeline", name.to_owned())])
            .clone();
        let engine_series = EngineSeries::new(&metrics, &vec![("pipeline", name.to_owned())]);
        Counters {
            name: name.to_owned(),
            metrics,
            engine_series,
            per_version: Mutex::new(HashMap::new()),
            dead_lettered: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            joined: AtomicBool::new(false),
            engine: EngineCounts::default(),
            writes: WriteCounts::default(),
            schema_waiting: std::sync::atomic::AtomicUsize::new(0),
            stall: Mutex::new(SwapStall::default()),
            last_faults: Mutex::new(LastFaults::default()),
            recent_faults: Arc::default(),
            series: Mutex::new(HashMap::new()),
            delivery_count,
        }
    }

    /// The series of version `hash` every batch touches.
    pub(super) fn series(&self, hash: &str) -> Arc<VersionSeries> {
        let mut all = self.series.lock();
        if let Some(s) = all.get(hash) {
            return s.clone();
        }
        let l = self.labels(hash);
        let m = &self.metrics;
        let series = Arc::new(VersionSeries {
            batches: m.batches.get_or_create(&l).clone(),
            guest_seconds: m.guest_seconds.get_or_create(&l).clone(),
            records: VERDICTS.map(|v| {
                let mut l = l.clone();
                l.push(("verdict", v.into()));
                m.records.get_or_create(&l).clone()
            }),
        });
        all.insert(hash.to_owned(), series.clone());
        series
    }

    /// `sharehost_delivery_count` of the pipeline.
    pub(super) fn delivery_count(&self) -> &DeliveryCounts {
        &self.delivery_count
    }

    /// The pipeline's name.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// The labels of one version's series.
    pub(super) fn labels(&self, hash: &str) -> Labels {
        vec![
            ("pipeline", self.name.clone()),
            ("version", short(hash).to_owned()),
        ]
    }

    /// Changes the counters of version `hash`.
    pub(super) fn count(&self, hash: &str, f: impl FnOnce(&mut VersionCounters)) {
        let mut all = self.per_version.lock();
        // Found without allocating the key, which happens twice per batch.
        match all.get_mut(hash) {
            Some(v) => f(v),
            None => f(all.entry(hash.to_owned()).or_default()),
        }
    }

    /// Every version's counters.
    pub(super) fn per_version(&self) -> HashMap<String, VersionCounters> {
        self.per_version.lock().clone()
    }

    /// One version's counters (zero when it has none yet).
    pub(super) fn of(&self, hash: &str) -> VersionCounters {
        self.per_version
            .lock()
            .get(hash)
            .cloned()
            .unwrap_or_default()
    }

    /// `n` records of version `hash` got `verdict` (`sharehost_records_total`).
    pub(super) fn record_n(&self, hash: &str, verdict: &str, n: u64) {
        if let Some(c) = self.series(hash).records(verdict) {
            c.inc_by(n);
            return;
        }
        let mut l = self.labels(hash);
        l.push(("verdict", verdict.into()));
        self.metrics.records.get_or_create(&l).inc_by(n);
    }

    /// Creates the pipeline's series of every family at zero, so dashboards and alerts see
    /// them from the start, not from their first event.
    pub(super) fn init_series(&self, hash: &str) {
        let m = &self.metrics;
        let l: Labels = vec![("pipeline", self.name.clone())];
        let _ = m.in_flight.get_or_create(&l);
        let _ = m.session_resets.get_or_create(&l);
        let _ = m.rebalances.get_or_create(&l);
        let _ = m.released_by_broker.get_or_create(&l);
        let _ = m.released_at_delivery_limit.get_or_create(&l);
        let _ = m.writes_waiting.get_or_create(&l);
        let _ = m.released_unwritten.get_or_create(&l);
        let _ = m.verdicts_replayed.get_or_create(&l);
        let _ = m.settled_earlier.get_or_create(&l);
        for when in ["unsent", "late"] {
            let _ = m.verdicts_lost.get_or_create(&lost_labels(&l, when));
        }
        let _ = m.dead_letters_shrunk.get_or_create(&l);
        let _ = m.pipeline_up.get_or_create(&l);
        let _ = m.delivery_count.get_or_create(&l);
        for kind in ["output", "dead_letter"] {
            let mut l = l.clone();
            l.push(("kind", kind.into()));
            let _ = m.write_seconds.get_or_create(&l);
        }
        for request in ["fetch", "acknowledge"] {
            let mut l = l.clone();
            l.push(("request", request.into()));
            let _ = m.request_seconds.get_or_create(&l);
        }
        for result in ["ok", "failed"] {
            let mut l = l.clone();
            l.push(("result", result.into()));
            let _ = m.acks.get_or_create(&l);
        }
        // Alerts on rare events (`increase(...[15m]) > 0`) see the first one only when its
        // series was there before it, at 0.
        for result in ["ok", "failed", "rollback"] {
            let mut l = l.clone();
            l.push(("result", result.into()));
            let _ = m.swaps.get_or_create(&l);
        }
        for result in ["started", "promoted", "rolled_back"] {
            let mut l = l.clone();
            l.push(("result", result.into()));
            let _ = m.canary_transitions.get_or_create(&l);
        }
        let v = self.labels(hash);
        let _ = m.batches.get_or_create(&v);
        let _ = m.guest_seconds.get_or_create(&v);
        let _ = m.renewals.get_or_create(&v);
        let _ = m.dead_lettered.get_or_create(&v);
        for verdict in ["accept", "release", "reject", "renew", "retry"] {
            let mut l = v.clone();
            l.push(("verdict", verdict.into()));
            let _ = m.records.get_or_create(&l);
        }
        for result in ["produced", "discarded", "failed"] {
            let mut l = v.clone();
            l.push(("result", result.into()));
            let _ = m.emits.get_or_create(&l);
        }
    }

    /// `n` emits of version `hash` ended `result` (produced, discarded or failed).
    pub(super) fn count_emits(&self, hash: &str, result: &str, n: u64) {
        let mut l = self.labels(hash);
        l.push(("result", result.into()));
        self.metrics.emits.get_or_create(&l).inc_by(n);
        self.count(hash, |c| match result {
            "produced" => c.emits_produced += n,
            "discarded" => c.emits_discarded += n,
            _ => c.emits_failed += n,
        });
    }

    /// Publishes what the engine counted (in flight, joined, its totals as counters) and the
    /// HTTP grant's counts; `running`: the pipeline is in its running state.
    pub(super) fn publish_engine(
        &self,
        consumer: &ShareConsumer,
        running: bool,
        http: Option<&HttpGrant>,
    ) {
        let s = consumer.stats();
        let series = &self.engine_series;
        let in_flight = consumer.in_flight();
        self.in_flight.store(in_flight as u64, Ordering::Relaxed);
        let joined = consumer.joined();
        self.joined.store(joined, Ordering::Relaxed);
        series.up.set(i64::from(joined && running));
        let e = &self.engine;
        e.peak
            .store(s.in_flight_peak.load(Ordering::Relaxed), Ordering::Relaxed);
        e.limit
            .store(consumer.in_flight_limit() as u64, Ordering::Relaxed);
        e.fetches
            .store(s.fetches.load(Ordering::Relaxed), Ordering::Relaxed);
        e.acquired
            .store(s.acquired.load(Ordering::Relaxed), Ordering::Relaxed);
        e.acquired_split
            .store(s.acquired_split.load(Ordering::Relaxed), Ordering::Relaxed);
        series.in_flight.set(in_flight as i64);
        // The engine's totals as counters: each advances by what its consumer counted since
        // the last look (a run after a failure starts a new consumer, whose totals start at 0).
        let totals = [
            &s.session_resets,
            &s.assignment_changes,
            &s.released_by_broker,
            &s.acks_ok,
            &s.acks_failed,
            &s.released_at_limit,
            &s.verdicts_unsent,
            &s.verdicts_replayed,
        ];
        let mut last = self.engine.published.lock();
        for ((last, counter), now) in last.iter_mut().zip(&series.totals).zip(totals) {
            let now = now.load(Ordering::Relaxed);
            let before = if now >= *last { *last } else { 0 };
            counter.inc_by(now - before);
            *last = now;
        }
        drop(last);
        if let Some(http) = http {
            let c = http.stats().snapshot();
            let values = [
                c.sent,
                c.refused_by_list,
                c.refused_by_address,
                c.failed,
                c.timed_out,
                c.too_large,
                c.in_flight,
                c.waiting,
            ];
            for (gauge, v) in series.http(&self.metrics).iter().zip(values) {
                gauge.set(i64::try_from(v).unwrap_or(i64::MAX));
            }
        }
    }
}

/// Most records whose last fault is kept: a bound on what a faulting plugin makes the host
/// hold (an entry is about 300 bytes); the oldest goes first.
const MAX_LAST_FAULTS: usize = 4096;

/// Longest fault text kept per record.
const MAX_LAST_FAULT_TEXT: usize = 256;

/// A record by topic, partition and offset.
pub(super) type RecordId = (Arc<str>, i32, i64);

/// The fault each record met last, when the fault policy released it: a record that faults
/// on every delivery reaches the delivery cap released, and its dead letter then says why
/// ("delivery cap reached" alone hid it). Bounded at [`MAX_LAST_FAULTS`], oldest first.
#[derive(Default)]
pub(super) struct LastFaults {
    by_record: HashMap<RecordId, String>,
    order: VecDeque<RecordId>,
}

impl LastFaults {
    pub(super) fn note(&mut self, record: RecordId, fault: &Fault) {
        let mut text = format!("{}: {}", fault.kind, fault.message);
        sharehost_text::truncate(&mut text, MAX_LAST_FAULT_TEXT);
        if self.by_record.insert(record.clone(), text).is_none() {
            self.order.push_back(record);
        }
        while self.by_record.len() > MAX_LAST_FAULTS {
            match self.order.pop_front() {
                Some(old) => {
                    self.by_record.remove(&old);
                }
                None => break,
            }
        }
    }

    /// The record's last fault, forgotten once read.
    pub(super) fn take(&mut self, record: &RecordId) -> Option<String> {
        let text = self.by_record.remove(record)?;
        self.order.retain(|r| r != record);
        Some(text)
    }
}

/// How long judging paused around a hot swap (a swap under load must not stall the pipeline;
/// `dev/bench-swap` measures it): the longest gap between two consecutive judged batches,
/// from the last batch judged before the swap was asked for to the first batch the new
/// version judged.
#[derive(Debug, Default)]
pub(super) struct SwapStall {
    /// When the last batch finished judging.
    last_done: Option<Instant>,
    /// A swap under way: the longest gap so far, and the new version's hash once it loaded.
    open: Option<(Duration, Option<String>)>,
    /// The last completed swap's stall.
    pub(super) last: Option<Duration>,
}

impl SwapStall {
    pub(super) fn swap_requested(&mut self) {
        self.open = Some((Duration::ZERO, None));
    }

    /// The new version loaded and is about to become active.
    pub(super) fn swap_ready(&mut self, hash: &str) {
        if let Some((_, new)) = &mut self.open {
            *new = Some(hash.to_owned());
        }
    }

    pub(super) fn swap_refused(&mut self) {
        self.open = None;
    }

    /// A batch finished judging on version `hash` at `now`; returns the stall of the swap
    /// that this batch, the new version's first, completes.
    pub(super) fn judged(&mut self, hash: &str, now: Instant) -> Option<Duration> {
        let gap = self.last_done.map(|l| now.saturating_duration_since(l));
        self.last_done = Some(now);
        let (longest, new) = self.open.as_mut()?;
        *longest = (*longest).max(gap.unwrap_or_default());
        if new.as_deref() != Some(hash) {
            return None;
        }
        let stall = *longest;
        self.open = None;
        self.last = Some(stall);
        Some(stall)
    }
}

/// The pipeline's labels with the `when` of a lost verdict.
pub(super) fn lost_labels(pipeline: &Labels, when: &'static str) -> Labels {
    let mut l = pipeline.clone();
    l.push(("when", when.into()));
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_swap_stall_is_the_longest_gap_from_the_last_old_batch_to_the_first_new_one() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut stall = SwapStall::default();
        assert_eq!(stall.judged("old", at(0)), None, "no swap under way");
        assert_eq!(stall.judged("old", at(1)), None);
        stall.swap_requested();
        assert_eq!(
            stall.judged("old", at(3)),
            None,
            "a gap of 2 ms, still the old version"
        );
        stall.swap_ready("new");
        assert_eq!(
            stall.judged("old", at(10)),
            None,
            "a batch that started before the swap"
        );
        assert_eq!(
            stall.judged("new", at(12)),
            Some(Duration::from_millis(7)),
            "the longest gap: 3 -> 10"
        );
        assert_eq!(stall.last, Some(Duration::from_millis(7)));
        assert_eq!(
            stall.judged("new", at(100)),
            None,
            "closed: later gaps are not the swap's"
        );
        stall.swap_requested();
        stall.swap_refused();
        assert_eq!(
            stall.judged("new", at(101)),
            None,
            "a refused swap measures nothing"
        );
        assert_eq!(stall.last, Some(Duration::from_millis(7)));
    }
}

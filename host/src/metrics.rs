//! The host's Prometheus metrics, in one registry passed down (never a global), encoded in the
//! text format by `prometheus-client`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Label set: ordered (name, value) pairs.
pub type Labels = Vec<(&'static str, String)>;

fn guest_histogram() -> Histogram {
    // 50 µs .. ~52 s: plugin calls range from trivial to their deadline (5 s by default, and a
    // wall-clock deadline may be set far above it), so the top buckets cover the deadlines.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.000_05, 2.0, 21,
    ))
}

/// Buckets of [`DeliveryCounts`]: one per delivery up to the broker's highest delivery
/// limit (10), then `+Inf`.
const DELIVERY_BUCKETS: usize = 11;

/// A histogram of delivery counts, counted a batch at a time. Every record handed to a plugin
/// is observed: `prometheus-client`'s histogram takes a lock and a float bucket search per
/// observation (3 % of a host's CPU at 100 B), where delivery counts are small integers that
/// a batch can tally first and add with one atomic per bucket it touched. Its text is that
/// histogram's with buckets 1 to 10.
#[derive(Debug, Clone, Default)]
pub struct DeliveryCounts(std::sync::Arc<DeliveryInner>);

#[derive(Debug, Default)]
struct DeliveryInner {
    buckets: [AtomicU64; DELIVERY_BUCKETS],
    sum: AtomicI64,
}

impl DeliveryCounts {
    /// Observes one delivery count per item of `counts` (a batch's records).
    pub fn observe_all(&self, counts: impl IntoIterator<Item = i16>) {
        let mut tally = [0u64; DELIVERY_BUCKETS];
        let (mut n, mut sum) = (0usize, 0i64);
        for c in counts {
            // A count below 1 (a broker's mistake) falls in the first bucket, as it did in the
            // float histogram; above 10 in +Inf.
            let bucket = usize::try_from(c.saturating_sub(1)).unwrap_or(0);
            tally[bucket.min(DELIVERY_BUCKETS - 1)] += 1;
            n += 1;
            sum += i64::from(c);
        }
        if n == 0 {
            return;
        }
        let inner = &self.0;
        for (bucket, t) in inner.buckets.iter().zip(tally) {
            if t > 0 {
                bucket.fetch_add(t, Ordering::Relaxed);
            }
        }
        inner.sum.fetch_add(sum, Ordering::Relaxed);
    }
}

impl TypedMetric for DeliveryCounts {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for DeliveryCounts {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let inner = &self.0;
        let buckets: Vec<(f64, u64)> = inner
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let upper = if i + 1 < DELIVERY_BUCKETS {
                    (i + 1) as f64
                } else {
                    f64::INFINITY
                };
                (upper, b.load(Ordering::Relaxed))
            })
            .collect();
        // Bucket counts are read one by one while batches add to them: the count is their
        // sum, so a scrape never shows more in the buckets than in the count.
        let count = buckets.iter().map(|(_, n)| n).sum();
        encoder.encode_histogram::<NoLabelSet>(
            inner.sum.load(Ordering::Relaxed) as f64,
            count,
            &buckets,
            None,
        )
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

fn seconds_histogram() -> Histogram {
    // 0.5 ms .. ~65 s: a produce or a request round trip, from loopback to a broker that
    // answers only at its request timeout.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.000_5, 2.0, 18,
    ))
}

/// Every metric the host exports, per pipeline and (where it matters) per plugin version.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// Records by final verdict source: accept, release, reject, renew, dead_lettered, ...
    pub records: Family<Labels, Counter>,
    /// Plugin calls.
    pub batches: Family<Labels, Counter>,
    /// Plugin faults by kind.
    pub faults: Family<Labels, Counter>,
    /// Time spent in the guest per call.
    pub guest_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    /// The delivery count of every record handed to a plugin: records near the group's
    /// delivery limit show as mass in the top buckets before the broker archives them.
    pub delivery_count: Family<Labels, DeliveryCounts>,
    /// One series, value 1, labelled with the host's version.
    pub build_info: Family<Labels, Gauge>,
    /// Records renewed at the plugin's request.
    pub renewals: Family<Labels, Counter>,
    /// Records produced to the dead-letter topic.
    pub dead_lettered: Family<Labels, Counter>,
    /// Records acquired and not yet judged.
    pub in_flight: Family<Labels, Gauge>,
    /// Acknowledged offsets by result (ok / failed).
    pub acks: Family<Labels, Counter>,
    /// Share sessions re-opened.
    pub session_resets: Family<Labels, Counter>,
    /// Records released by the broker when a session ended.
    pub released_by_broker: Family<Labels, Counter>,
    /// Hot-swaps by result (ok / failed / rollback).
    pub swaps: Family<Labels, Counter>,
    /// One series per plugin version: 1 while active, 0 once replaced, labelled with the key
    /// id that signed it (empty when unsigned).
    pub plugin_version: Family<Labels, Gauge>,
    /// Records a shadow compared, by the active version's and the candidate's verdict kinds
    /// (`active == candidate`: agreement).
    pub shadow_verdicts: Family<Labels, Counter>,
    /// Canary transitions by result (started / promoted / rolled_back): every automatic
    /// decision is visible to alerting, not only in the log.
    pub canary_transitions: Family<Labels, Counter>,
    /// Assignment changes (share-group rebalances) seen by the pipeline's member.
    pub rebalances: Family<Labels, Counter>,
    /// Records plugins emitted, by result: produced (before their source's Accept),
    /// discarded (the source ended otherwise), failed (producing failed: the source was
    /// released), refused (the guest saw an error).
    pub emits: Family<Labels, Counter>,
    /// Outbound HTTP requests of plugins, by result (sent, refused by the allow-list or the
    /// address check, failed, timed out, response too large).
    pub http_requests: Family<Labels, Gauge>,
    /// Failed produce requests of outputs and dead letters, by pipeline, kind, topic and
    /// error: each is retried, its records stay acquired (not a plugin verdict).
    pub write_failures: Family<Labels, Counter>,
    /// Batches whose writes wait for a retry now (the pipeline is degraded meanwhile).
    pub writes_waiting: Family<Labels, Gauge>,
    /// Records released because the pipeline stopped before their writes landed.
    pub released_unwritten: Family<Labels, Counter>,
    /// Accepts and rejects the broker never got (`when`: `unsent`, waiting in the engine when
    /// the session ended or the leadership moved; `late`, made after their record's session
    /// had ended): each such record is delivered and judged again, so at-least-once's
    /// duplicates are counted here as they happen.
    pub verdicts_lost: Family<Labels, Counter>,
    /// Records delivered again after their verdict was lost, settled with that verdict without
    /// a second plugin call (the duplicates the engine spared).
    pub verdicts_replayed: Family<Labels, Counter>,
    /// Records delivered again that the settled log showed committed (an exactly-once
    /// pipeline): acknowledged as then, without a second plugin call or write.
    pub settled_earlier: Family<Labels, Counter>,
    /// Dead letters written without the record's key, value and headers (the whole record
    /// was larger than the dead-letter topic accepts).
    pub dead_letters_shrunk: Family<Labels, Counter>,
    /// Fleet records skipped (malformed, oversized, unknown, unsigned, tampered, from a host
    /// with a clashing id), by topic and reason.
    pub fleet_records_skipped: Family<Labels, Counter>,
    /// Fleet actions by result: applied to the fleet's state, refused by it (not newer, does
    /// not apply), or not applied on this host (cannot fetch, verify or load).
    pub fleet_actions: Family<Labels, Counter>,
    /// Fleet records this host could not write (its status, a canary decision), by record:
    /// the host judges on, and tries again at the next status interval.
    pub fleet_write_failures: Family<Labels, Counter>,
    /// Times the fleet agent panicked and was started again (a bug: the host keeps running).
    pub fleet_agent_restarts: Counter,
    /// Manifest re-reads (SIGHUP or the file replaced), by result: applied or refused.
    pub manifest_rereads: Family<Labels, Counter>,
    /// Whether each pipeline runs (1) or not (0: failed to load or run, joining, draining).
    pub pipeline_up: Family<Labels, Gauge>,
    /// Failed attempts to load a pipeline or to run it, by stage (load, run).
    pub pipeline_failures: Family<Labels, Counter>,
    /// Records of each pipeline's share group not yet acknowledged, per topic and partition,
    /// as the group coordinator reports them (DescribeShareGroupOffsets v1): the backlog an
    /// autoscaler and a lag alert look at.
    pub share_group_lag: Family<Labels, Gauge>,
    /// Time of each produce request of outputs and dead letters, by pipeline and kind,
    /// failed ones included.
    pub write_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    /// Time of each ShareFetch (long-poll wait included) and ShareAcknowledge round trip, by
    /// pipeline and request.
    pub request_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    /// Records released at their last delivery (the group's delivery limit): the broker
    /// archives them; without a group dead-letter topic nothing of them remains.
    pub released_at_delivery_limit: Family<Labels, Counter>,
    /// 1 when the host is ready as `/readyz` answers (every pipeline loaded, in its group and
    /// writing), else 0; set at every scrape, so an alert sees what a probe sees.
    pub ready: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `sharehost_` prefix.
    pub fn new() -> Metrics {
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("sharehost");
        let m = Metrics {
            registry: Mutex::new(Registry::default()),
            records: Family::default(),
            batches: Family::default(),
            faults: Family::default(),
            guest_seconds: Family::new_with_constructor(guest_histogram),
            delivery_count: Family::default(),
            build_info: Family::default(),
            renewals: Family::default(),
            dead_lettered: Family::default(),
            in_flight: Family::default(),
            acks: Family::default(),
            session_resets: Family::default(),
            released_by_broker: Family::default(),
            swaps: Family::default(),
            canary_transitions: Family::default(),
            shadow_verdicts: Family::default(),
            plugin_version: Family::default(),
            rebalances: Family::default(),
            emits: Family::default(),
            http_requests: Family::default(),
            write_failures: Family::default(),
            writes_waiting: Family::default(),
            released_unwritten: Family::default(),
            verdicts_lost: Family::default(),
            verdicts_replayed: Family::default(),
            settled_earlier: Family::default(),
            dead_letters_shrunk: Family::default(),
            fleet_records_skipped: Family::default(),
            fleet_actions: Family::default(),
            fleet_write_failures: Family::default(),
            fleet_agent_restarts: Counter::default(),
            manifest_rereads: Family::default(),
            pipeline_up: Family::default(),
            pipeline_failures: Family::default(),
            share_group_lag: Family::default(),
            write_seconds: Family::new_with_constructor(seconds_histogram),
            request_seconds: Family::new_with_constructor(seconds_histogram),
            released_at_delivery_limit: Family::default(),
            ready: Gauge::default(),
        };
        registry.register(
            "records",
            "Records judged, by pipeline, plugin version and verdict",
            m.records.clone(),
        );
        registry.register(
            "batches",
            "Plugin calls, by pipeline and plugin version",
            m.batches.clone(),
        );
        registry.register(
            "plugin_faults",
            "Plugin faults, by pipeline, plugin version and kind",
            m.faults.clone(),
        );
        registry.register(
            "guest_seconds",
            "Time spent in the guest per call",
            m.guest_seconds.clone(),
        );
        registry.register(
            "renewals",
            "Records whose lock was renewed at the plugin's request",
            m.renewals.clone(),
        );
        registry.register(
            "dead_lettered",
            "Records produced to the dead-letter topic",
            m.dead_lettered.clone(),
        );
        registry.register(
            "in_flight",
            "Records acquired and not yet judged",
            m.in_flight.clone(),
        );
        registry.register(
            "acknowledged_offsets",
            "Acknowledged offsets, by result",
            m.acks.clone(),
        );
        registry.register(
            "session_resets",
            "Share sessions re-opened after errors",
            m.session_resets.clone(),
        );
        registry.register(
            "released_by_broker",
            "Records the broker released when a session ended",
            m.released_by_broker.clone(),
        );
        registry.register("swaps", "Plugin hot-swaps, by result", m.swaps.clone());
        registry.register(
            "plugin_version",
            "Plugin versions by pipeline: 1 while active, 0 once replaced; labelled with the key id that signed it",
            m.plugin_version.clone(),
        );
        registry.register(
            "shadow_verdicts",
            "Records a shadow candidate judged, by the active version's and the candidate's verdict",
            m.shadow_verdicts.clone(),
        );
        registry.register(
            "canary_transitions",
            "Canary transitions, by result (started, promoted, rolled_back)",
            m.canary_transitions.clone(),
        );
        registry.register(
            "rebalances",
            "Assignment changes seen by the pipeline's member",
            m.rebalances.clone(),
        );
        registry.register(
            "emits",
            "Records emitted by plugins, by pipeline, plugin version and result",
            m.emits.clone(),
        );
        registry.register(
            "http_requests",
            "Outbound HTTP requests of plugins, by pipeline and result",
            m.http_requests.clone(),
        );
        registry.register(
            "write_failures",
            "Failed produce requests of outputs and dead letters (retried; their records stay acquired)",
            m.write_failures.clone(),
        );
        registry.register(
            "writes_waiting",
            "Batches whose outputs or dead letters wait for a retry",
            m.writes_waiting.clone(),
        );
        registry.register(
            "released_unwritten",
            "Records released because the pipeline stopped before their writes landed",
            m.released_unwritten.clone(),
        );
        registry.register(
            "verdicts_lost",
            "Accepts and rejects the broker never got, by when (unsent: waiting when the session ended; late: made after it ended); each record comes again",
            m.verdicts_lost.clone(),
        );
        registry.register(
            "verdicts_replayed",
            "Records delivered again after their verdict was lost, settled with that verdict without calling the plugin again",
            m.verdicts_replayed.clone(),
        );
        registry.register(
            "settled_earlier",
            "Records delivered again that a committed transaction had settled (exactly-once), acknowledged without calling the plugin or writing again",
            m.settled_earlier.clone(),
        );
        registry.register(
            "dead_letters_shrunk",
            "Dead letters written without the record's key, value and headers (too large for the topic)",
            m.dead_letters_shrunk.clone(),
        );
        registry.register(
            "fleet_records_skipped",
            "Fleet records skipped: malformed, oversized, unknown, unsigned, tampered or from a clashing host id",
            m.fleet_records_skipped.clone(),
        );
        registry.register(
            "fleet_actions",
            "Fleet actions by result (applied, refused, not_applied on this host)",
            m.fleet_actions.clone(),
        );
        registry.register(
            "fleet_write_failures",
            "Fleet records this host could not write, by record (status, decision); tried again at the next interval",
            m.fleet_write_failures.clone(),
        );
        registry.register(
            "fleet_agent_restarts",
            "Times the fleet agent panicked and was started again with backoff (the host keeps running)",
            m.fleet_agent_restarts.clone(),
        );
        registry.register(
            "manifest_rereads",
            "Manifest re-reads (SIGHUP or the file replaced) by result: applied, refused (the host runs on the manifest before)",
            m.manifest_rereads.clone(),
        );
        registry.register(
            "pipeline_up",
            "Whether the pipeline runs (1) or not (0: failed, joining, draining)",
            m.pipeline_up.clone(),
        );
        registry.register(
            "pipeline_failures",
            "Failed attempts to load or run a pipeline, by stage",
            m.pipeline_failures.clone(),
        );
        registry.register(
            "delivery_count",
            "Delivery count of the records handed to plugins",
            m.delivery_count.clone(),
        );
        registry.register(
            "build_info",
            "The host's version (value 1)",
            m.build_info.clone(),
        );
        m.build_info
            .get_or_create(&vec![("version", env!("CARGO_PKG_VERSION").to_owned())])
            .set(1);
        registry.register(
            "share_group_lag",
            "Records of the pipeline's share group not yet acknowledged, per topic and partition (the group coordinator's DescribeShareGroupOffsets)",
            m.share_group_lag.clone(),
        );
        registry.register(
            "write_seconds",
            "Time of each produce request of outputs and dead letters, by pipeline and kind",
            m.write_seconds.clone(),
        );
        registry.register(
            "request_seconds",
            "Time of each ShareFetch (long-poll wait included) and ShareAcknowledge round trip, by pipeline and request",
            m.request_seconds.clone(),
        );
        registry.register(
            "released_at_delivery_limit",
            "Records released at their last delivery (the group's delivery limit): the broker archives them",
            m.released_at_delivery_limit.clone(),
        );
        registry.register(
            "ready",
            "Whether the host is ready (1) as /readyz answers: every pipeline loaded, in its group and writing",
            m.ready.clone(),
        );
        root.register_collector(Box::new(Process));
        root.register_collector(Box::new(Traces));
        *m.registry.lock().unwrap_or_else(|p| p.into_inner()) = root;
        m
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // Encoding into a String cannot fail.
        let _ = encode(&mut out, &registry);
        out
    }
}

/// The standard `process_*` series (CPU, memory, file descriptors, start time) of this
/// process, read from `/proc/self` at every scrape. Written here because prometheus-client
/// has no process collector and the `prometheus` crate's would be a second metrics library;
/// the names are the Prometheus client libraries' own, so existing dashboards work.
#[derive(Debug)]
struct Process;

/// What `/proc/self/stat` and friends say; `None` off Linux or when a file is unreadable.
struct ProcessSample {
    cpu_seconds: f64,
    resident_bytes: i64,
    virtual_bytes: i64,
    start_time_seconds: f64,
    open_fds: i64,
    max_fds: i64,
}

fn sample_process() -> Option<ProcessSample> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields follow the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): field n is fields[n - 3].
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    let page = rustix::param::page_size() as u64;
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as i64;
    let max_fds = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
    Some(ProcessSample {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        resident_bytes: i64::try_from(field(24)? * page).unwrap_or(i64::MAX),
        virtual_bytes: i64::try_from(field(23)?).unwrap_or(i64::MAX),
        start_time_seconds: boot as f64 + field(22)? as f64 / ticks,
        open_fds,
        max_fds,
    })
}

/// `sharehost_trace_spans_total{outcome}`: what became of the sampled spans (`ended`,
/// `exported`, `failed`), read from the tracer at every scrape; nothing without `[telemetry]`.
/// Ended minus exported and failed, once the export queue has drained, were dropped.
#[derive(Debug)]
struct Traces;

impl prometheus_client::collector::Collector for Traces {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::counter::ConstCounter;
        let Some(t) = crate::telemetry::current() else {
            return Ok(());
        };
        let c = t.counts();
        let mut family = encoder.encode_descriptor(
            "sharehost_trace_spans",
            "Sampled spans, by outcome: ended (handed to the export queue), exported (taken by the collector), failed (in export requests that failed); ended - exported - failed, once the queue drained, were dropped because it was full",
            None,
            MetricType::Counter,
        )?;
        for (outcome, n) in [
            ("ended", &c.ended),
            ("exported", &c.exported),
            ("failed", &c.failed),
        ] {
            ConstCounter::new(n.load(Ordering::Relaxed))
                .encode(family.encode_family(&[("outcome", outcome)])?)?;
        }
        Ok(())
    }
}

impl prometheus_client::collector::Collector for Process {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let Some(p) = sample_process() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(p.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time of the host process, in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges: [(&str, &str, ConstGauge<f64>); 5] = [
            (
                "process_resident_memory_bytes",
                "Resident memory of the host process",
                ConstGauge::new(p.resident_bytes as f64),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory of the host process (the instance pool reserves much of it)",
                ConstGauge::new(p.virtual_bytes as f64),
            ),
            (
                "process_start_time_seconds",
                "Start of the host process, seconds since the Unix epoch",
                ConstGauge::new(p.start_time_seconds),
            ),
            (
                "process_open_fds",
                "Open file descriptors of the host process",
                ConstGauge::new(p.open_fds as f64),
            ),
            (
                "process_max_fds",
                "The host process's limit of open file descriptors",
                ConstGauge::new(p.max_fds as f64),
            ),
        ];
        for (name, help, g) in gauges {
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_counts_encode_as_the_float_histogram_of_the_same_observations() {
        let counts: Vec<i16> = [1, 1, 1, 2, 3, 10, 11, 250, 0, -4, 7, 1]
            .into_iter()
            .cycle()
            .take(1000)
            .collect();
        let ours = DeliveryCounts::default();
        for part in counts.chunks(97) {
            ours.observe_all(part.iter().copied());
        }
        let theirs = Histogram::new((1..=10).map(f64::from));
        for c in &counts {
            theirs.observe(f64::from(*c));
        }
        let text = |register: &dyn Fn(&mut Registry)| {
            let mut r = Registry::default();
            register(&mut r);
            let mut out = String::new();
            encode(&mut out, &r).expect("encode");
            out
        };
        let a = text(&|r| r.register("delivery_count", "d", ours.clone()));
        let b = text(&|r| r.register("delivery_count", "d", theirs.clone()));
        assert_eq!(a, b);
        assert!(a.contains("delivery_count_count 1000"), "{a}");
    }

    #[test]
    fn the_process_series_are_read_from_proc_and_exported_without_the_prefix() {
        let p = sample_process().expect("/proc/self is readable on Linux");
        assert!(p.resident_bytes > 0 && p.open_fds > 0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        assert!(p.start_time_seconds > 0.0 && p.start_time_seconds <= now + 1.0);
        let text = Metrics::new().encode();
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
            "sharehost_build_info",
        ] {
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&format!("# TYPE {name}")) || l.starts_with(name)),
                "{name} missing from:\n{text}"
            );
        }
        assert!(!text.contains("sharehost_process_"));
    }
}

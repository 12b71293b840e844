//! The host's Prometheus metrics, in one registry passed down (never a global), encoded in the
//! text format by `prometheus-client`.

use std::sync::Mutex;

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

fn delivery_histogram() -> Histogram {
    // One bucket per delivery up to the broker's highest delivery limit (10).
    Histogram::new((1..=10).map(f64::from))
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
    pub delivery_count: Family<Labels, Histogram, fn() -> Histogram>,
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
    /// Dead letters written without the record's key, value and headers (the whole record
    /// was larger than the dead-letter topic accepts).
    pub dead_letters_shrunk: Family<Labels, Counter>,
    /// Whether each pipeline runs (1) or not (0: failed to load or run, joining, draining).
    pub pipeline_up: Family<Labels, Gauge>,
    /// Failed attempts to load a pipeline or to run it, by stage (load, run).
    pub pipeline_failures: Family<Labels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `sharehost_` prefix.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("sharehost");
        let m = Metrics {
            registry: Mutex::new(Registry::default()),
            records: Family::default(),
            batches: Family::default(),
            faults: Family::default(),
            guest_seconds: Family::new_with_constructor(guest_histogram),
            delivery_count: Family::new_with_constructor(delivery_histogram),
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
            dead_letters_shrunk: Family::default(),
            pipeline_up: Family::default(),
            pipeline_failures: Family::default(),
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
            "dead_letters_shrunk",
            "Dead letters written without the record's key, value and headers (too large for the topic)",
            m.dead_letters_shrunk.clone(),
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
        *m.registry.lock().unwrap_or_else(|p| p.into_inner()) = registry;
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

//! OpenTelemetry traces, when the manifest's `[telemetry]` names a collector: a span per batch
//! a pipeline judges and one per record, the record's continuing the trace its producer started
//! (the W3C `traceparent` header), and every record the plugin emits carrying its source
//! record's span as its own `traceparent`, so a consumer of the output continues the same
//! trace. Spans go to the collector over OTLP/HTTP (protobuf) from a background thread, in
//! batches. Without `[telemetry]` nothing here is built and a batch pays one `Option` check.
//!
//! Exporting never holds a record back: the batch processor's queue is bounded
//! ([`MAX_QUEUED_SPANS`], or `OTEL_BSP_MAX_QUEUE_SIZE`) and a span that finds it full is dropped.
//! [`SpanCounts`] make that visible: spans ended, exported and refused by the collector, on
//! `/metrics` as `sharehost_trace_spans_total`; ended minus exported and refused, once the queue
//! has drained, is what was dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{
    Link, SpanContext, SpanKind, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider, SpanData,
    SpanExporter, SpanProcessor,
};

/// Spans the batch processor holds for export at most (the SDK's default is 2,048, which a
/// host sampling every record at a few hundred thousand records a second fills in a few
/// milliseconds): a burst is absorbed, a flood is dropped and counted. With its attributes a
/// span is about a kilobyte, so the queue holds about 20 MiB at most (peak RSS 54 MiB against
/// 31 MiB untraced, docs/benchmarks.md). `OTEL_BSP_MAX_QUEUE_SIZE` overrides it.
pub const MAX_QUEUED_SPANS: usize = 16_384;
/// Spans per export request (the SDK's default is 512): fewer, larger requests to the
/// collector. `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` overrides it.
const EXPORT_BATCH_SPANS: usize = 4_096;
/// How long a span may wait in the queue before its batch is sent (the SDK's default is 5 s).
/// `OTEL_BSP_SCHEDULE_DELAY` (in ms) overrides it.
const EXPORT_DELAY: Duration = Duration::from_millis(500);

/// What became of the sampled spans: the counts behind `sharehost_trace_spans_total`.
#[derive(Debug, Default)]
pub struct SpanCounts {
    /// Spans ended and handed to the batch processor.
    pub ended: AtomicU64,
    /// Spans the collector took.
    pub exported: AtomicU64,
    /// Spans in export requests that failed (the collector refused them or could not be
    /// reached).
    pub failed: AtomicU64,
}

/// The batch processor with each ended span counted.
#[derive(Debug)]
struct Counting {
    inner: BatchSpanProcessor,
    counts: Arc<SpanCounts>,
}

impl SpanProcessor for Counting {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        self.counts.ended.fetch_add(1, Ordering::Relaxed);
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter with each request's spans counted as exported or failed.
#[derive(Debug)]
struct CountedExporter<E> {
    inner: E,
    counts: Arc<SpanCounts>,
}

impl<E: SpanExporter> SpanExporter for CountedExporter<E> {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let n = batch.len() as u64;
        let sent = self.inner.export(batch);
        let counts = self.counts.clone();
        async move {
            let result = sent.await;
            match &result {
                Ok(()) => counts.exported.fetch_add(n, Ordering::Relaxed),
                Err(_) => counts.failed.fetch_add(n, Ordering::Relaxed),
            };
            result
        }
    }

    fn shutdown_with_timeout(&mut self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// The batch settings: ours, unless the standard `OTEL_BSP_*` variables say otherwise.
fn batch_config() -> opentelemetry_sdk::trace::BatchConfig {
    let set = |name: &str| std::env::var_os(name).is_some();
    let mut config = BatchConfigBuilder::default();
    if !set("OTEL_BSP_MAX_QUEUE_SIZE") {
        config = config.with_max_queue_size(MAX_QUEUED_SPANS);
    }
    if !set("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") {
        config = config.with_max_export_batch_size(EXPORT_BATCH_SPANS);
    }
    if !set("OTEL_BSP_SCHEDULE_DELAY") {
        config = config.with_scheduled_delay(EXPORT_DELAY);
    }
    config.build()
}

/// The host's tracer, once `run` installed one from `[telemetry]`.
static CURRENT: std::sync::OnceLock<Arc<Telemetry>> = std::sync::OnceLock::new();

/// Starts the exporter `spec` names and makes it the host's (the first install wins: the
/// manifest's `[telemetry]` is read once, at start).
pub fn install(spec: &TelemetrySpec) -> Result<(), TelemetryError> {
    let telemetry = Telemetry::start(spec)?;
    let _ = CURRENT.set(telemetry);
    Ok(())
}

/// The host's tracer, if `[telemetry]` installed one.
pub fn current() -> Option<&'static Arc<Telemetry>> {
    CURRENT.get()
}

/// Sends the spans still buffered, at the host's exit.
pub fn shutdown() {
    if let Some(t) = CURRENT.get() {
        t.shutdown();
    }
}

/// The header that carries a span's context (W3C Trace Context).
pub const TRACEPARENT: &str = "traceparent";

/// `[telemetry]`: where spans go and how many traces are kept.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetrySpec {
    /// The collector's OTLP/HTTP base, e.g. `http://127.0.0.1:4318` (spans go to `/v1/traces`).
    pub otlp_endpoint: String,
    /// The fraction of new traces sampled (a record whose producer's trace is sampled is
    /// always traced, one whose producer's is not never is).
    pub sample: f64,
    /// The service name spans carry.
    pub service_name: String,
}

/// The exporter could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("telemetry: {0}")]
pub struct TelemetryError(String);

/// The host's tracer, built from `[telemetry]`.
pub struct Telemetry {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
    counts: Arc<SpanCounts>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Telemetry")
    }
}

impl Telemetry {
    /// Starts the exporter and the tracer.
    pub fn start(spec: &TelemetrySpec) -> Result<Arc<Telemetry>, TelemetryError> {
        let spec = spec.clone();
        let counts = Arc::new(SpanCounts::default());
        let counted = counts.clone();
        // The exporter's blocking HTTP client owns a runtime of its own, which may not be made
        // (or dropped) on one of the host's async threads: it is built on a thread of its own
        // and then lives on the batch processor's thread.
        let provider = std::thread::spawn(move || -> Result<SdkTracerProvider, TelemetryError> {
            use opentelemetry_otlp::WithExportConfig;
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(format!(
                    "{}/v1/traces",
                    spec.otlp_endpoint.trim_end_matches('/')
                ))
                .with_timeout(Duration::from_secs(10))
                .build()
                .map_err(|e| TelemetryError(e.to_string()))?;
            let exporter = CountedExporter {
                inner: exporter,
                counts: counted.clone(),
            };
            let processor = Counting {
                inner: BatchSpanProcessor::builder(exporter)
                    .with_batch_config(batch_config())
                    .build(),
                counts: counted,
            };
            Ok(SdkTracerProvider::builder()
                .with_span_processor(processor)
                .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                    spec.sample,
                ))))
                .with_resource(
                    opentelemetry_sdk::Resource::builder()
                        .with_service_name(spec.service_name.clone())
                        .build(),
                )
                .build())
        })
        .join()
        .map_err(|_| TelemetryError("the exporter's setup panicked".into()))??;
        let tracer = provider.tracer("sharehost");
        Ok(Arc::new(Telemetry {
            provider,
            tracer,
            propagator: TraceContextPropagator::new(),
            counts,
        }))
    }

    /// What became of the sampled spans so far.
    pub fn counts(&self) -> &SpanCounts {
        &self.counts
    }

    /// Sends what is left and stops the exporter (at the host's exit); from a thread of its own,
    /// as the exporter's client needs.
    pub fn shutdown(self: &Arc<Self>) {
        let me = self.clone();
        let _ = std::thread::spawn(move || {
            let _ = me.provider.shutdown_with_timeout(Duration::from_secs(5));
        })
        .join();
    }

    /// The producer's span context a record's headers carry, if any (and valid).
    pub fn parent_of<'a>(
        &self,
        headers: impl Iterator<Item = (&'a str, Option<&'a [u8]>)>,
    ) -> Option<Context> {
        let value = headers
            .filter(|(k, _)| k.eq_ignore_ascii_case(TRACEPARENT))
            .find_map(|(_, v)| v.and_then(|v| std::str::from_utf8(v).ok()))?;
        let cx = self.propagator.extract(&One(TRACEPARENT, value.to_owned()));
        cx.span().span_context().is_valid().then_some(cx)
    }

    /// Starts a batch's span: a child of the producers' trace when every traced record of the
    /// batch continues the same one, else a trace of its own linked to each record's.
    pub fn batch(&self, pipeline: &str, records: usize, parents: &[Option<Context>]) -> Traced {
        let contexts: Vec<SpanContext> = parents
            .iter()
            .flatten()
            .map(|c| c.span().span_context().clone())
            .collect();
        let one_trace = contexts
            .first()
            .filter(|first| contexts.iter().all(|c| c.trace_id() == first.trace_id()));
        let builder = self
            .tracer
            .span_builder("sharehost.batch")
            .with_kind(SpanKind::Consumer)
            .with_attributes([
                KeyValue::new("sharehost.pipeline", pipeline.to_owned()),
                KeyValue::new("messaging.batch.message_count", records as i64),
            ]);
        let span = match (one_trace, parents.iter().flatten().next()) {
            (Some(_), Some(parent)) => builder.start_with_context(&self.tracer, parent),
            _ => builder
                .with_links(contexts.into_iter().map(Link::with_context).collect())
                .start_with_context(&self.tracer, &Context::new()),
        };
        Traced {
            cx: Context::new().with_span(span),
        }
    }

    /// Starts a record's span: a child of its producer's (`parent`) when it has one, else of
    /// its batch's.
    pub fn record(
        &self,
        batch: &Traced,
        parent: Option<&Context>,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Traced {
        let span = self
            .tracer
            .span_builder("sharehost.record")
            .with_kind(SpanKind::Consumer)
            .with_attributes([
                KeyValue::new("messaging.system", "kafka"),
                KeyValue::new("messaging.destination.name", topic.to_owned()),
                KeyValue::new("messaging.destination.partition.id", partition.to_string()),
                KeyValue::new("messaging.kafka.offset", offset),
            ])
            .start_with_context(&self.tracer, parent.unwrap_or(&batch.cx));
        Traced {
            cx: Context::new().with_span(span),
        }
    }

    /// `traced`'s context as a `traceparent` value, when it is sampled.
    pub fn traceparent(&self, traced: &Traced) -> Option<String> {
        let sc = traced.cx.span().span_context().clone();
        if !sc.is_valid() || !sc.is_sampled() {
            return None;
        }
        let mut out = One(TRACEPARENT, String::new());
        self.propagator.inject_context(&traced.cx, &mut out);
        Some(out.1).filter(|v| !v.is_empty())
    }
}

/// A span the host started, with its context; ended with [`Traced::end`] (or when dropped).
pub struct Traced {
    cx: Context,
}

impl Traced {
    /// Sets an attribute.
    pub fn set(&self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        self.cx.span().set_attribute(KeyValue::new(key, value));
    }

    /// Whether the span is sampled (recorded and exported).
    pub fn sampled(&self) -> bool {
        self.cx.span().span_context().is_sampled()
    }

    /// Ends the span now.
    pub fn end(self) {
        self.cx.span().end();
    }
}

/// One header, as the propagator reads and writes it.
struct One(&'static str, String);

impl Extractor for One {
    fn get(&self, key: &str) -> Option<&str> {
        (key == self.0).then_some(self.1.as_str())
    }
    fn keys(&self) -> Vec<&str> {
        vec![self.0]
    }
}

impl Injector for One {
    fn set(&mut self, key: &str, value: String) {
        if key == self.0 {
            self.1 = value;
        }
    }
}

//! A batch's spans, when the host traces ([`crate::telemetry`]): the batch's, each record's
//! (continuing its producer's trace from its `traceparent` header), the verdicts on them, and
//! each emit stamped with its source record's span so the output's consumer continues it.

use crate::runtime::{Emit, EmitHeader, Verdict};
use crate::share::consumer::ShareRecord;
use crate::telemetry::{TRACEPARENT, Telemetry, Traced};

/// The spans of one batch, ended together once the batch is acted on (or dropped). A record
/// without a producer's context in a batch nobody samples gets no span: it would record
/// nothing, and starting one per record was most of what tracing cost when nothing is kept.
pub(super) struct BatchTrace {
    telemetry: &'static Telemetry,
    batch: Traced,
    records: Vec<Option<Traced>>,
}

impl BatchTrace {
    /// Starts the spans of `batch` (before its headers move into the plugin's records).
    pub(super) fn start(
        telemetry: &'static Telemetry,
        pipeline: &str,
        batch: &[ShareRecord],
    ) -> BatchTrace {
        let parents: Vec<_> = batch
            .iter()
            .map(|r| {
                telemetry.parent_of(
                    r.record
                        .headers
                        .iter()
                        .map(|h| (h.key.as_str(), h.value.as_deref())),
                )
            })
            .collect();
        let span = telemetry.batch(pipeline, batch.len(), &parents);
        let sampled = span.sampled();
        let records = batch
            .iter()
            .zip(&parents)
            .map(|(r, parent)| {
                (sampled || parent.is_some()).then(|| {
                    telemetry.record(
                        &span,
                        parent.as_ref(),
                        &r.topic,
                        r.partition.partition,
                        r.record.offset,
                    )
                })
            })
            .collect();
        BatchTrace {
            telemetry,
            batch: span,
            records,
        }
    }

    /// The batch's span as a `traceparent` value (when sampled): the context the plugin's
    /// outbound requests carry.
    pub(super) fn batch_traceparent(&self) -> Option<String> {
        self.telemetry.traceparent(&self.batch)
    }

    /// Notes each record's verdict (and reason) on its span.
    pub(super) fn judged(&self, verdicts: &[Verdict]) {
        for (span, v) in self.records.iter().zip(verdicts) {
            let Some(span) = span else { continue };
            span.set("sharehost.verdict", v.kind());
            if let Verdict::Reject(Some(reason)) = v {
                span.set("sharehost.reason", reason.clone());
            }
        }
    }

    /// Gives each emit its source record's span as its `traceparent` (replacing one the plugin
    /// set: the record's span is where the emit came from).
    pub(super) fn stamp(&self, emits: &mut [Emit]) {
        for e in emits {
            let Some(value) = self
                .records
                .get(e.record)
                .and_then(Option::as_ref)
                .and_then(|span| self.telemetry.traceparent(span))
            else {
                continue;
            };
            e.headers
                .retain(|h| !h.key.eq_ignore_ascii_case(TRACEPARENT));
            e.headers.push(EmitHeader {
                key: TRACEPARENT.to_owned(),
                value: Some(value.into_bytes().into()),
            });
        }
    }

    /// Ends every span of the batch.
    pub(super) fn end(self) {
        for span in self.records.into_iter().flatten() {
            span.end();
        }
        self.batch.end();
    }
}

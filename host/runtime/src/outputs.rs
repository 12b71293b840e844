//! Outputs: records a plugin emits, each bound to one record of the batch it is judging
//! (contract 0.2's `sharehost:plugin/outputs`).
//!
//! In the shape of wasmtime's capability crates: what a pipeline grants ([`OutputGrant`],
//! shared by every instance of a plugin version), a context per store ([`OutputsCtx`], made by
//! [`OutputsCtxBuilder`], whose defaults are documented there), a view made for each host call
//! ([`Outputs`]), which implements the `Host` trait `bindgen!` generates from the contract
//! (`wit/plugin.wit`), and [`add_to_linker`], the generated one, with a function that makes
//! the view from the store's state. A change to `emit` in the WIT is a compile error here.
//! [`OutputsCtx`]'s [`Capability`] implementation plugs all of it into the store (`store.rs`).
//!
//! The generated lift of `emit`'s arguments is the one a hand-written `func_wrap` with the
//! same tuple would use (`String`, `Option<Vec<u8>>`, `Vec<Header>`): it copies what the guest
//! hands over before the checks below run, bounded per call by the store's hostcall fuel.
//!
//! The runtime checks and keeps emits; it knows no topic. The manifest grants output *names*
//! (`[pipeline.outputs] valid = "orders-valid"`), the runtime refuses any other name, and the
//! pipeline maps names to topics and produces an emit before its source record's Accept (and
//! discards it when the record ends otherwise). Every refusal is a value the guest sees
//! ([`EmitError`]); nothing is dropped silently.
//!
//! Bounds: one `emit` call carries at most the store's hostcall fuel (1 MiB) from the guest,
//! and a batch at most [`OutputGrant::max_emits`] emits and [`OutputGrant::max_bytes`] bytes
//! (keys, values, header keys and values). Emits live in the store only for the duration of
//! one `handle` call.

use std::sync::Arc;

use bytes::Bytes;
use wasmtime::component::{HasData, Linker};

use crate::bindings::v02::sharehost::plugin::outputs::{
    self as wire, EmitError, Header as WireHeader,
};
use crate::capability::{Call, Capability, Outcome, Setup};
use crate::plugin::PluginStats;
use crate::store::StoreState;

/// The header prefix the host reserves for its provenance headers.
pub const RESERVED_HEADER_PREFIX: &str = "sharehost.";

/// What a pipeline grants for outputs: the output names and the per-batch bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputGrant {
    /// Output names a plugin may emit to (the manifest's `[pipeline.outputs]` keys).
    pub names: Vec<Arc<str>>,
    /// Most emits per batch (`max_emits_per_batch`).
    pub max_emits: u32,
    /// Most emitted bytes per batch (`max_emit_bytes_per_batch`).
    pub max_bytes: u64,
}

/// Default `max_emits_per_batch`: ten outputs per record of a full default batch.
pub const DEFAULT_MAX_EMITS_PER_BATCH: u32 = 10_000;
/// Default `max_emit_bytes_per_batch` (16 MiB).
pub const DEFAULT_MAX_EMIT_BYTES_PER_BATCH: u64 = 16 << 20;

impl Default for OutputGrant {
    fn default() -> Self {
        Self {
            names: Vec::new(),
            max_emits: DEFAULT_MAX_EMITS_PER_BATCH,
            max_bytes: DEFAULT_MAX_EMIT_BYTES_PER_BATCH,
        }
    }
}

/// One header of an emitted record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmitHeader {
    /// Header key (never with the reserved `sharehost.` prefix).
    pub key: String,
    /// Header value; `None` is a null value.
    pub value: Option<Bytes>,
}

/// A record a plugin emitted, bound to its source record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emit {
    /// Index of the source record in the batch that was judged.
    pub record: usize,
    /// The output name: one of the grant's names, or the name of an emit refused as
    /// `unknown-output` (kept empty, so the pipeline rejects its record, never accepts it
    /// without the output its plugin meant to write).
    pub output: Arc<str>,
    /// Key; `None` is a null key.
    pub key: Option<Bytes>,
    /// Value; `None` is a null value.
    pub value: Option<Bytes>,
    /// The plugin's headers (the pipeline appends provenance headers).
    pub headers: Vec<EmitHeader>,
}

impl Emit {
    /// Bytes the emit counts against the batch's bound.
    fn size(&self) -> u64 {
        let len = |b: &Option<Bytes>| b.as_ref().map_or(0, |b| b.len() as u64);
        len(&self.key)
            + len(&self.value)
            + self
                .headers
                .iter()
                .map(|h| h.key.len() as u64 + len(&h.value))
                .sum::<u64>()
    }
}

/// Builds an [`OutputsCtx`]. The default grant names no output, so every emit is refused as
/// `unknown-output` (and marked, see [`Emit::output`]), within the default bounds
/// ([`DEFAULT_MAX_EMITS_PER_BATCH`], [`DEFAULT_MAX_EMIT_BYTES_PER_BATCH`]).
#[derive(Default)]
pub(crate) struct OutputsCtxBuilder {
    grant: Arc<OutputGrant>,
}

impl OutputsCtxBuilder {
    /// The outputs the pipeline grants and their per-batch bounds.
    pub(crate) fn grant(mut self, grant: Arc<OutputGrant>) -> Self {
        self.grant = grant;
        self
    }

    /// The context, closed: every emit is refused until a `handle` call opens it.
    pub(crate) fn build(self) -> OutputsCtx {
        OutputsCtx {
            grant: self.grant,
            ..OutputsCtx::default()
        }
    }
}

/// What one store keeps for the outputs capability: the grant, and the emits of the call in
/// progress.
#[derive(Debug, Default)]
pub(crate) struct OutputsCtx {
    grant: Arc<OutputGrant>,
    /// Records of the batch being judged; `None` outside `handle` (during `init`).
    records: Option<u32>,
    emits: Vec<Emit>,
    bytes: u64,
    /// Emits refused in this call (for the plugin's counters).
    pub(crate) refused: u64,
    /// Of the emits kept, the markers of refused unknown outputs (not emits to count).
    pub(crate) markers: u64,
}

impl OutputsCtx {
    /// A builder with the defaults.
    pub(crate) fn builder() -> OutputsCtxBuilder {
        OutputsCtxBuilder::default()
    }

    /// Opens the buffer for a `handle` call over `records` records, dropping anything left.
    pub(crate) fn begin(&mut self, records: Option<u32>) {
        self.records = records;
        self.emits.clear();
        self.bytes = 0;
        self.refused = 0;
        self.markers = 0;
    }

    /// Closes the buffer and hands over the call's emits.
    pub(crate) fn finish(&mut self) -> Vec<Emit> {
        self.records = None;
        self.bytes = 0;
        std::mem::take(&mut self.emits)
    }
}

/// What one call left behind in the outputs.
#[derive(Debug, Default)]
pub(crate) struct OutputsReport {
    /// What it emitted (markers of refused unknown outputs included).
    pub(crate) emits: Vec<Emit>,
    /// Emits refused in the call.
    pub(crate) refused: u64,
    /// Of `emits`, the markers of refused unknown outputs.
    pub(crate) markers: u64,
}

impl Capability for OutputsCtx {
    type Report = OutputsReport;

    fn new(setup: &Setup<'_>) -> Self {
        OutputsCtx::builder()
            .grant(setup.limits.outputs.clone())
            .build()
    }

    fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
        add_to_linker(linker, |state| Outputs::new(&mut state.caps.outputs))
    }

    /// Opens the outputs for a `handle` call (an `init` call refuses every emit).
    fn begin_call(&mut self, call: &Call<'_>) {
        self.begin(call.records);
    }

    fn end_call(&mut self) -> OutputsReport {
        OutputsReport {
            emits: self.finish(),
            refused: self.refused,
            markers: self.markers,
        }
    }

    /// Only a call that returned verdicts counts its emits (a faulted one's are discarded).
    fn count(report: &OutputsReport, outcome: Outcome, stats: &mut PluginStats) {
        if outcome == Outcome::Judged {
            stats.emits += report.emits.len() as u64 - report.markers;
            stats.emits_refused += report.refused;
        }
    }
}

/// The outputs capability as one host call sees it.
pub(crate) struct Outputs<'a> {
    ctx: &'a mut OutputsCtx,
}

impl<'a> Outputs<'a> {
    /// A view of `ctx` for one call.
    pub(crate) fn new(ctx: &'a mut OutputsCtx) -> Self {
        Self { ctx }
    }

    fn check_and_keep(
        &mut self,
        record: u32,
        output: &str,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        headers: Vec<WireHeader>,
    ) -> Result<(), EmitError> {
        let ctx = &mut *self.ctx;
        if ctx.records.is_none_or(|n| record >= n) {
            return Err(EmitError::NoSuchRecord);
        }
        let Some(name) = ctx.grant.names.iter().find(|n| ***n == *output) else {
            // Kept as an empty emit under the name the plugin used (within the batch's count
            // bound), so the pipeline sees the misconfiguration: a record whose plugin meant to
            // write somewhere the manifest does not map never ends accepted without it.
            if (ctx.emits.len() as u64) < u64::from(ctx.grant.max_emits) {
                ctx.markers += 1;
                ctx.emits.push(Emit {
                    record: record as usize,
                    output: Arc::from(output),
                    key: None,
                    value: None,
                    headers: Vec::new(),
                });
            }
            return Err(EmitError::UnknownOutput(output.to_owned()));
        };
        // Ignoring case: a reader that matches header names loosely must not take a plugin's
        // `Sharehost.Source.Offset` for the host's provenance.
        if let Some(h) = headers.iter().find(|h| {
            h.key
                .as_bytes()
                .get(..RESERVED_HEADER_PREFIX.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED_HEADER_PREFIX.as_bytes()))
        }) {
            return Err(EmitError::ReservedHeader(h.key.clone()));
        }
        if ctx.emits.len() as u64 >= u64::from(ctx.grant.max_emits) {
            return Err(EmitError::TooManyEmits(ctx.grant.max_emits));
        }
        let emit = Emit {
            record: record as usize,
            output: name.clone(),
            key: key.map(Bytes::from),
            value: value.map(Bytes::from),
            headers: headers
                .into_iter()
                .map(|h| EmitHeader {
                    key: h.key,
                    value: h.value.map(Bytes::from),
                })
                .collect(),
        };
        let bytes = ctx.bytes.saturating_add(emit.size());
        if bytes > ctx.grant.max_bytes {
            return Err(EmitError::TooManyBytes(ctx.grant.max_bytes));
        }
        ctx.bytes = bytes;
        ctx.emits.push(emit);
        Ok(())
    }
}

impl wire::Host for Outputs<'_> {
    /// The `emit` import: checks the record index, the output name, the reserved header
    /// prefix and the batch's bounds, in that order, and keeps the emit.
    fn emit(
        &mut self,
        record: u32,
        output: String,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        headers: Vec<WireHeader>,
    ) -> Result<(), EmitError> {
        let result = self.check_and_keep(record, &output, key, value, headers);
        if result.is_err() {
            self.ctx.refused += 1;
        }
        result
    }
}

/// What the generated `add_to_linker` hands each `emit` call: the capability's view.
struct OutputsImports;

impl HasData for OutputsImports {
    type Data<'a> = Outputs<'a>;
}

/// Defines `sharehost:plugin/outputs@0.2.0` (any 0.2.x guest links to it) in `linker`, through
/// the generated bindings. `view` makes the capability's view from the store's state, per call.
pub(crate) fn add_to_linker<T: 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> Outputs<'_>,
) -> wasmtime::Result<()> {
    wire::add_to_linker::<T, OutputsImports>(linker, view)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer(max_emits: u32, max_bytes: u64) -> OutputsCtx {
        let mut b = OutputsCtx::builder()
            .grant(Arc::new(OutputGrant {
                names: vec!["valid".into(), "audit".into()],
                max_emits,
                max_bytes,
            }))
            .build();
        b.begin(Some(3));
        b
    }

    impl OutputsCtx {
        /// One `emit` call, through the view the linker makes.
        fn emit(
            &mut self,
            record: u32,
            output: &str,
            key: Option<Vec<u8>>,
            value: Option<Vec<u8>>,
            headers: Vec<WireHeader>,
        ) -> Result<(), EmitError> {
            wire::Host::emit(
                &mut Outputs::new(self),
                record,
                output.into(),
                key,
                value,
                headers,
            )
        }
    }

    fn header(key: &str) -> WireHeader {
        WireHeader {
            key: key.into(),
            value: Some(b"v".to_vec()),
        }
    }

    #[test]
    fn an_emit_names_a_granted_output_and_a_record_of_the_batch() {
        let mut b = buffer(10, 1000);
        assert_eq!(
            b.emit(0, "valid", None, Some(b"x".to_vec()), vec![header("h")]),
            Ok(())
        );
        assert_eq!(
            b.emit(3, "valid", None, None, vec![]),
            Err(EmitError::NoSuchRecord)
        );
        assert_eq!(
            b.emit(1, "orders-valid", None, None, vec![]),
            Err(EmitError::UnknownOutput("orders-valid".into()))
        );
        assert_eq!(
            b.emit(
                1,
                "audit",
                None,
                None,
                vec![header("sharehost.source.offset")]
            ),
            Err(EmitError::ReservedHeader("sharehost.source.offset".into()))
        );
        assert_eq!(
            b.emit(
                1,
                "audit",
                None,
                None,
                vec![header("ShareHost.Source.Offset")]
            ),
            Err(EmitError::ReservedHeader("ShareHost.Source.Offset".into()))
        );
        assert_eq!(b.refused, 4);
        let emits = b.finish();
        assert_eq!(emits.len(), 2, "the emit and the unknown output's marker");
        assert_eq!((emits[0].record, &*emits[0].output), (0, "valid"));
        assert_eq!(emits[0].headers[0].key, "h");
        assert_eq!((emits[1].record, &*emits[1].output), (1, "orders-valid"));
        assert_eq!(emits[1].value, None, "a marker carries nothing to write");
    }

    #[test]
    fn the_batch_bounds_refuse_emits_past_them_and_keep_the_earlier_ones() {
        let mut b = buffer(2, 1000);
        assert!(b.emit(0, "valid", None, None, vec![]).is_ok());
        assert!(b.emit(1, "valid", None, None, vec![]).is_ok());
        assert_eq!(
            b.emit(2, "valid", None, None, vec![]),
            Err(EmitError::TooManyEmits(2))
        );
        assert_eq!(b.finish().len(), 2);

        let mut b = buffer(10, 10);
        assert!(
            b.emit(0, "valid", Some(b"k".to_vec()), Some(vec![0; 8]), vec![])
                .is_ok()
        );
        assert_eq!(
            b.emit(1, "valid", None, Some(vec![0; 2]), vec![]),
            Err(EmitError::TooManyBytes(10))
        );
        // A smaller one still fits.
        assert!(b.emit(1, "valid", None, Some(vec![0; 1]), vec![]).is_ok());
        assert_eq!(b.finish().len(), 2);
    }

    #[test]
    fn outside_a_handle_call_every_emit_is_refused() {
        let mut b = buffer(10, 1000);
        b.finish();
        assert_eq!(
            b.emit(0, "valid", None, None, vec![]),
            Err(EmitError::NoSuchRecord)
        );
        b.begin(None);
        assert_eq!(
            b.emit(0, "valid", None, None, vec![]),
            Err(EmitError::NoSuchRecord)
        );
    }

    #[test]
    fn a_calls_emits_count_only_when_it_returned_verdicts() {
        let mut b = buffer(10, 1000);
        assert!(b.emit(0, "valid", None, None, vec![]).is_ok());
        assert!(b.emit(0, "unknown", None, None, vec![]).is_err());
        assert!(b.emit(9, "valid", None, None, vec![]).is_err());
        let report = Capability::end_call(&mut b);
        assert_eq!(
            (report.emits.len(), report.markers, report.refused),
            (2, 1, 2)
        );
        for outcome in [Outcome::Init, Outcome::Faulted] {
            let mut stats = PluginStats::default();
            OutputsCtx::count(&report, outcome, &mut stats);
            assert_eq!((stats.emits, stats.emits_refused), (0, 0), "{outcome:?}");
        }
        let mut stats = PluginStats::default();
        OutputsCtx::count(&report, Outcome::Judged, &mut stats);
        assert_eq!(
            (stats.emits, stats.emits_refused),
            (1, 2),
            "the marker is no emit"
        );
    }

    #[test]
    fn the_default_context_refuses_every_emit_as_an_unknown_output() {
        let mut ctx = OutputsCtx::builder().build();
        ctx.begin(Some(1));
        assert_eq!(
            ctx.emit(0, "valid", None, None, vec![]),
            Err(EmitError::UnknownOutput("valid".into()))
        );
        let emits = ctx.finish();
        assert_eq!(
            (emits.len(), ctx.markers),
            (1, 1),
            "only the marker is kept"
        );
    }
}

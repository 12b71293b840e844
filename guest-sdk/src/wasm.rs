//! The component glue, compiled only for wasm32: the generated bindings, the adapter from
//! the columnar wire batch to [`Record`] slices, emits, and the `wasi:http` transport.

pub(crate) mod http;

use std::any::Any;
use std::cell::RefCell;

use crate::{Config, EmitError, Header, Level, Plugin, Record, Verdict};

/// Generated from `wit/plugin.wit`. Unsafe code is allowed here only: it is the canonical ABI.
#[allow(unsafe_code, missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "sharehost:plugin/plugin",
        pub_export_macro: true,
        export_macro_name: "__export_world_plugin",
        default_bindings_module: "::sharehost_guest::__private::bindings",
        runtime_path: "::sharehost_guest::__private::bindings::__wit_bindgen_rt",
        // `emit`'s headers are passed borrowed (no copy of keys and values per emit).
        ownership: Borrowing { duplicate_if_necessary: true },
    });

    #[doc(hidden)]
    pub use wit_bindgen::rt as __wit_bindgen_rt;
}

use bindings::sharehost::plugin::host::{self, Level as WireLevel};
use bindings::sharehost::plugin::outputs::{self, EmitError as WireEmitError};
use bindings::sharehost::plugin::types::{Batch, Verdict as WireVerdict};

thread_local! {
    /// The plugin value created by `init`; one per instance (components are single-threaded).
    static STATE: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

pub(crate) fn log(level: Level, message: &str) {
    let level = match level {
        Level::Trace => WireLevel::Trace,
        Level::Debug => WireLevel::Debug,
        Level::Info => WireLevel::Info,
        Level::Warn => WireLevel::Warn,
        Level::Error => WireLevel::Error,
    };
    host::log(level, message);
}

/// The `init` export: builds `P` and keeps it for the instance's lifetime.
pub fn init<P: Plugin>(
    config: Vec<(String, String)>,
    secrets: Vec<(String, String)>,
) -> Result<(), String> {
    let plugin = P::init(&Config {
        pairs: config,
        secrets,
    })?;
    STATE.with_borrow_mut(|s| *s = Some(Box::new(plugin)));
    Ok(())
}

/// The wire encoding of "null" in a span's start position (see `wit/plugin.wit`).
const NULL_SPAN: u32 = u32::MAX;

/// The bytes of span `i` (entries `2i`, `2i+1`) of `spans`; `None` for a null span. Spans
/// outside `data` (a broken host) read as empty rather than panicking.
fn span<'a>(data: &'a [u8], spans: &[u32], i: usize) -> Option<&'a [u8]> {
    let start = *spans.get(2 * i)?;
    if start == NULL_SPAN {
        return None;
    }
    let len = spans.get(2 * i + 1).copied().unwrap_or(0) as usize;
    let start = start as usize;
    Some(data.get(start..start.saturating_add(len)).unwrap_or(&[]))
}

/// The `handle` export: views the columnar batch as `Record`s and asks `P`.
pub fn handle<P: Plugin>(batch: Batch) -> Vec<WireVerdict> {
    let data = &batch.data[..];
    let header_count = batch.header_spans.len() / 4;
    let headers: Vec<Header<'_>> = (0..header_count)
        .map(|h| Header {
            // The host sends header keys that were valid UTF-8 Kafka strings.
            key: span(data, &batch.header_spans, 2 * h)
                .and_then(|k| std::str::from_utf8(k).ok())
                .unwrap_or(""),
            value: span(data, &batch.header_spans, 2 * h + 1),
        })
        .collect();
    let n = batch.offsets.len();
    let records: Vec<Record<'_>> = (0..n)
        .map(|i| {
            let first = batch.header_ranges.get(2 * i).copied().unwrap_or(0) as usize;
            let count = batch.header_ranges.get(2 * i + 1).copied().unwrap_or(0) as usize;
            Record {
                // A batch never holds more than u32::MAX records (its lists are indexed by u32).
                index: u32::try_from(i).unwrap_or(u32::MAX),
                topic: batch
                    .topic_index
                    .get(i)
                    .and_then(|t| batch.topics.get(*t as usize))
                    .map_or("", String::as_str),
                partition: batch.partitions.get(i).copied().unwrap_or(0),
                offset: batch.offsets.get(i).copied().unwrap_or(0),
                timestamp: batch.timestamps.get(i).copied().unwrap_or(0),
                delivery_count: batch.delivery_counts.get(i).copied().unwrap_or(1),
                key: span(data, &batch.key_spans, i),
                value: span(data, &batch.value_spans, i),
                headers: headers
                    .get(first..first.saturating_add(count))
                    .unwrap_or(&[]),
            }
        })
        .collect();
    let mut verdicts = Vec::with_capacity(records.len());
    STATE.with_borrow_mut(|s| match s.as_mut().and_then(|b| b.downcast_mut::<P>()) {
        Some(p) => p.handle_batch(&records, &mut verdicts),
        // `handle` before a successful `init` breaks the contract; give everything back.
        None => verdicts.resize(records.len(), Verdict::Release),
    });
    verdicts
        .into_iter()
        .map(|v| match v {
            Verdict::Accept => WireVerdict::Accept,
            Verdict::Release => WireVerdict::Release,
            Verdict::Reject(r) => WireVerdict::Reject(r),
            Verdict::Renew => WireVerdict::Renew,
            Verdict::Retry { after_ms } => WireVerdict::Retry(after_ms),
        })
        .collect()
}

/// [`Record::emit`] in a component: the host's `outputs.emit`.
pub(crate) fn emit(
    index: u32,
    output: &str,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[Header<'_>],
) -> Result<(), EmitError> {
    let wire: Vec<outputs::Header<'_>> = headers
        .iter()
        .map(|h| outputs::Header {
            key: h.key,
            value: h.value,
        })
        .collect();
    outputs::emit(index, output, key, value, &wire).map_err(|e| match e {
        WireEmitError::NoSuchRecord => EmitError::NoSuchRecord,
        WireEmitError::UnknownOutput(name) => EmitError::UnknownOutput(name),
        WireEmitError::TooManyEmits(n) => EmitError::TooManyEmits(n),
        WireEmitError::TooManyBytes(n) => EmitError::TooManyBytes(n),
        WireEmitError::ReservedHeader(key) => EmitError::ReservedHeader(key),
    })
}

//! The component glue, compiled only for wasm32: the generated bindings and the adapter from
//! the flat wire batch to [`Record`] slices.

use std::any::Any;
use std::cell::RefCell;

use crate::{Config, Header, Level, Plugin, Record, Verdict};

/// Generated from `wit/plugin.wit`. Unsafe code is allowed here only: it is the canonical ABI.
#[allow(unsafe_code, missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "sharehost:plugin/plugin",
        pub_export_macro: true,
        export_macro_name: "__export_world_plugin",
        default_bindings_module: "::sharehost_guest::__private::bindings",
        runtime_path: "::sharehost_guest::__private::bindings::__wit_bindgen_rt",
    });

    #[doc(hidden)]
    pub use wit_bindgen::rt as __wit_bindgen_rt;
}

use bindings::sharehost::plugin::host::{self, Level as WireLevel};
use bindings::sharehost::plugin::types::{Batch, Span, Verdict as WireVerdict};

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
pub fn init<P: Plugin>(config: Vec<(String, String)>) -> Result<(), String> {
    let plugin = P::init(&Config { pairs: config })?;
    STATE.with_borrow_mut(|s| *s = Some(Box::new(plugin)));
    Ok(())
}

fn slice(data: &[u8], span: Span) -> &[u8] {
    let start = span.start as usize;
    data.get(start..start.saturating_add(span.len as usize))
        .unwrap_or(&[])
}

/// The `handle` export: views the flat batch as `Record`s and asks `P`.
pub fn handle<P: Plugin>(batch: Batch) -> Vec<WireVerdict> {
    let data = &batch.data[..];
    let headers: Vec<Header<'_>> = batch
        .headers
        .iter()
        .map(|h| Header {
            // The host sends header keys that were valid UTF-8 Kafka strings.
            key: std::str::from_utf8(slice(data, h.key)).unwrap_or(""),
            value: h.value.map(|v| slice(data, v)),
        })
        .collect();
    let records: Vec<Record<'_>> = batch
        .records
        .iter()
        .map(|r| {
            let hs = r.headers_start as usize;
            Record {
                topic: batch
                    .topics
                    .get(r.topic as usize)
                    .map_or("", String::as_str),
                partition: r.partition,
                offset: r.offset,
                timestamp: r.timestamp,
                delivery_count: r.delivery_count,
                key: r.key.map(|s| slice(data, s)),
                value: r.value.map(|s| slice(data, s)),
                headers: headers
                    .get(hs..hs.saturating_add(r.headers_len as usize))
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
        })
        .collect()
}

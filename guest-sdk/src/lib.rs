//! Write a [sharehost](https://example.invalid/sharehost) plugin in plain Rust.
//!
//! A plugin judges records fetched from a Kafka share group: for each record it returns a
//! [`Verdict`] (accept, release, reject with a reason, or renew). You implement the
//! [`Plugin`] trait over pure types ([`Record`], [`Verdict`], [`Config`]) that compile on
//! any target, so your logic is unit-tested with a plain `cargo test`, no WebAssembly
//! involved. One line, [`export!`], turns the type into a WebAssembly component when you
//! build for `wasm32-wasip2`.
//!
//! # A complete plugin
//!
//! ```
//! use sharehost_guest::{Config, Plugin, Record, Verdict};
//!
//! /// Rejects records whose value is larger than a configured limit.
//! pub struct SizeLimit {
//!     max: usize,
//! }
//!
//! impl Plugin for SizeLimit {
//!     fn init(config: &Config) -> Result<Self, String> {
//!         let max = config
//!             .get("max-bytes")
//!             .unwrap_or("1024")
//!             .parse()
//!             .map_err(|e| format!("max-bytes: {e}"))?;
//!         Ok(Self { max })
//!     }
//!
//!     fn handle(&mut self, record: &Record<'_>) -> Verdict {
//!         match record.value {
//!             Some(v) if v.len() > self.max => Verdict::reject("value too large"),
//!             _ => Verdict::Accept,
//!         }
//!     }
//! }
//!
//! // Exports `SizeLimit` as the component's `init`/`handle` on wasm32; on other targets it
//! // only checks that `SizeLimit` implements `Plugin`.
//! sharehost_guest::export!(SizeLimit);
//!
//! // The same logic, tested natively:
//! let mut p = SizeLimit::init(&Config::from_pairs([("max-bytes", "3")])).unwrap();
//! assert_eq!(p.handle(&Record::with_value(b"abc")), Verdict::Accept);
//! assert_eq!(p.handle(&Record::with_value(b"abcd")), Verdict::reject("value too large"));
//! ```
//!
//! Build the component with `cargo build --release --target wasm32-wasip2` in a crate with
//! `crate-type = ["cdylib"]` (see `docs/plugin-guide.md`), then try it offline with
//! `sharehost test-plugin target/wasm32-wasip2/release/NAME.wasm --input records.jsonl`.
//!
//! # A wrong signature is a compile error
//!
//! `export!` only accepts types that implement [`Plugin`]; anything else fails with
//! "`NotAPlugin` is not a sharehost plugin" and a note listing the two methods to write:
//!
//! ```compile_fail
//! pub struct NotAPlugin;
//!
//! impl NotAPlugin {
//!     // Looks right, but is not the trait's method: no `impl Plugin for NotAPlugin`.
//!     pub fn handle(&mut self, _value: &[u8]) -> bool {
//!         true
//!     }
//! }
//!
//! sharehost_guest::export!(NotAPlugin);
//! ```
//!
//! ```compile_fail
//! use sharehost_guest::{Config, Plugin, Record, Verdict};
//!
//! pub struct WrongReturn;
//!
//! impl Plugin for WrongReturn {
//!     fn init(_config: &Config) -> Result<Self, String> {
//!         Ok(WrongReturn)
//!     }
//!     // error[E0053]: method `handle` has an incompatible type for trait
//!     fn handle(&mut self, _record: &Record<'_>) -> bool {
//!         true
//!     }
//! }
//! ```
//!
//! # What the sandbox allows
//! No files, no network, no environment variables; stdout and stderr are captured and
//! logged by the host (bounded). Use [`log`] for structured messages. Every batch runs under
//! a memory cap and a CPU deadline; a panic, trap or timeout turns the whole batch into a
//! fault (its records get the pipeline's fault policy, release by default) and the next
//! batch runs on a fresh instance.

use std::fmt;

/// One record of a batch, borrowed from the batch buffer: reading keys, values and headers
/// copies nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// The topic the record was fetched from.
    pub topic: &'a str,
    /// The partition the record was fetched from.
    pub partition: i32,
    /// The record's offset in its partition.
    pub offset: i64,
    /// Record timestamp, milliseconds since the Unix epoch.
    pub timestamp: i64,
    /// How many times the broker has delivered this record, including now (1 = first time).
    pub delivery_count: u16,
    /// The key; `None` is a null key, distinct from an empty one.
    pub key: Option<&'a [u8]>,
    /// The value; `None` is a null value (a tombstone).
    pub value: Option<&'a [u8]>,
    /// Headers in order (keys may repeat).
    pub headers: &'a [Header<'a>],
}

/// One record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    /// The header key.
    pub key: &'a str,
    /// The header value; `None` is a null value.
    pub value: Option<&'a [u8]>,
}

impl<'a> Record<'a> {
    /// A record with this value and neutral metadata (topic `test`, partition 0, offset 0,
    /// first delivery, no key, no headers): a starting point for unit tests.
    pub const fn with_value(value: &'a [u8]) -> Self {
        Self {
            topic: "test",
            partition: 0,
            offset: 0,
            timestamp: 0,
            delivery_count: 1,
            key: None,
            value: Some(value),
            headers: &[],
        }
    }

    /// The same record with this key (for building test records).
    pub const fn key(mut self, key: &'a [u8]) -> Self {
        self.key = Some(key);
        self
    }

    /// The same record with these headers (for building test records).
    pub const fn headers(mut self, headers: &'a [Header<'a>]) -> Self {
        self.headers = headers;
        self
    }

    /// The same record with this delivery count (for building test records).
    pub const fn delivery_count(mut self, delivery_count: u16) -> Self {
        self.delivery_count = delivery_count;
        self
    }

    /// The value as UTF-8 text, if present and valid.
    pub fn value_str(&self) -> Option<&'a str> {
        self.value.and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The key as UTF-8 text, if present and valid.
    pub fn key_str(&self) -> Option<&'a str> {
        self.key.and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The value of the first header named `key`: `None` when absent, `Some(None)` when
    /// present with a null value.
    pub fn header(&self, key: &str) -> Option<Option<&'a [u8]>> {
        self.headers.iter().find(|h| h.key == key).map(|h| h.value)
    }
}

/// What should happen to one record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Processed: acknowledge it; it is never delivered again.
    Accept,
    /// Not processed now: hand it back for redelivery (to any consumer of the group).
    Release,
    /// Never deliver it again (dead-lettered when the pipeline has a dead-letter topic). The
    /// reason is logged and travels with the dead letter; the host bounds its length.
    Reject(Option<String>),
    /// Still working on it: keep the lock (KIP-932 renew) and deliver it here again later.
    Renew,
}

impl Verdict {
    /// A rejection with a reason.
    pub fn reject(reason: impl Into<String>) -> Self {
        Self::Reject(Some(reason.into()))
    }
}

/// The pipeline's configuration for this plugin: the manifest's key/value pairs, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    pairs: Vec<(String, String)>,
}

impl Config {
    /// A configuration from pairs (for tests, and what the host passes to `init`).
    pub fn from_pairs<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self {
            pairs: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }

    /// The value of the last pair named `key` (later entries override earlier ones).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// All pairs, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// A sharehost plugin: created once per instance by [`Plugin::init`], then asked to judge
/// batches. Instances are recycled by the host (after N batches, and after any fault), so
/// keep only caches in `self`, never state that must survive.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a sharehost plugin",
    label = "`{Self}` must implement `sharehost_guest::Plugin`",
    note = "implement `fn init(config: &Config) -> Result<Self, String>` and `fn handle(&mut self, record: &Record<'_>) -> Verdict`"
)]
pub trait Plugin: Sized + 'static {
    /// Builds the plugin from the pipeline configuration. An `Err` refuses the
    /// configuration: at load the pipeline does not start and shows the message.
    fn init(config: &Config) -> Result<Self, String>;

    /// Judges one record.
    fn handle(&mut self, record: &Record<'_>) -> Verdict;

    /// Judges a batch, pushing exactly one verdict per record, in order. The default calls
    /// [`Plugin::handle`] for each record; override it to work on the batch as a whole.
    fn handle_batch(&mut self, records: &[Record<'_>], verdicts: &mut Vec<Verdict>) {
        verdicts.extend(records.iter().map(|r| self.handle(r)));
    }
}

/// Severity of a log message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something unusual the operator may want to know.
    Warn,
    /// Something failed.
    Error,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Trace => "TRACE",
            Level::Debug => "DEBUG",
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        })
    }
}

/// Logging to the host's log, tagged with the plugin's name.
///
/// In a component this calls the host's `log` import (bounded per batch by the host: long
/// messages are truncated, floods dropped and counted). In native builds (your unit tests)
/// messages go to stderr.
pub mod log {
    use super::Level;

    /// Logs `message` at `level`.
    pub fn log(level: Level, message: &str) {
        #[cfg(target_arch = "wasm32")]
        crate::wasm::log(level, message);
        #[cfg(not(target_arch = "wasm32"))]
        eprintln!("[{level}] {message}");
    }

    /// Logs at trace level.
    pub fn trace(message: &str) {
        log(Level::Trace, message);
    }

    /// Logs at debug level.
    pub fn debug(message: &str) {
        log(Level::Debug, message);
    }

    /// Logs at info level.
    pub fn info(message: &str) {
        log(Level::Info, message);
    }

    /// Logs at warn level.
    pub fn warn(message: &str) {
        log(Level::Warn, message);
    }

    /// Logs at error level.
    pub fn error(message: &str) {
        log(Level::Error, message);
    }
}

/// Exports a [`Plugin`] implementation as the component's `init` and `handle`.
///
/// Use it once per plugin crate, at the crate root: `sharehost_guest::export!(MyPlugin);`.
/// On `wasm32` it generates the component exports; on other targets it only checks that the
/// type implements [`Plugin`] (so a wrong signature fails `cargo test` too, with the error
/// "`MyPlugin` is not a sharehost plugin").
#[macro_export]
macro_rules! export {
    ($plugin:ty) => {
        const _: () = {
            const fn __sharehost_assert_plugin<P: $crate::Plugin>() {}
            __sharehost_assert_plugin::<$plugin>();
        };
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct __SharehostExport;
            impl $crate::__private::Guest for __SharehostExport {
                fn init(
                    config: ::std::vec::Vec<(::std::string::String, ::std::string::String)>,
                ) -> ::std::result::Result<(), ::std::string::String> {
                    $crate::__private::init::<$plugin>(config)
                }
                fn handle(
                    batch: $crate::__private::Batch,
                ) -> ::std::vec::Vec<$crate::__private::WireVerdict> {
                    $crate::__private::handle::<$plugin>(batch)
                }
            }
            $crate::__private::__export_world_plugin!(
                __SharehostExport with_types_in $crate::__private::bindings
            );
        };
    };
}

// The generated bindings name their own crate by path (`::sharehost_guest::...`) so the
// export macro works from the plugin's crate; this makes the same path work inside the SDK.
#[cfg(target_arch = "wasm32")]
extern crate self as sharehost_guest;

#[cfg(target_arch = "wasm32")]
mod wasm;

/// Implementation details of [`export!`]; not a public API.
#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod __private {
    pub use crate::wasm::bindings;
    pub use crate::wasm::bindings::__export_world_plugin;
    pub use crate::wasm::bindings::Guest;
    pub use crate::wasm::bindings::sharehost::plugin::types::{Batch, Verdict as WireVerdict};
    pub use crate::wasm::{handle, init};
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo;

    impl Plugin for Echo {
        fn init(config: &Config) -> Result<Self, String> {
            match config.get("fail") {
                Some(m) => Err(m.to_owned()),
                None => Ok(Echo),
            }
        }

        fn handle(&mut self, record: &Record<'_>) -> Verdict {
            match record.header("verdict").flatten() {
                Some(b"release") => Verdict::Release,
                Some(b"renew") => Verdict::Renew,
                Some(other) => Verdict::reject(String::from_utf8_lossy(other)),
                None => Verdict::Accept,
            }
        }
    }

    crate::export!(Echo);

    #[test]
    fn config_last_value_wins_and_init_can_refuse() {
        let c = Config::from_pairs([("a", "1"), ("a", "2"), ("fail", "no")]);
        assert_eq!(c.get("a"), Some("2"));
        assert_eq!(c.iter().count(), 3);
        assert_eq!(Echo::init(&c).err(), Some("no".to_owned()));
    }

    #[test]
    fn default_handle_batch_gives_one_verdict_per_record_in_order() {
        let h1 = [Header {
            key: "verdict",
            value: Some(b"renew"),
        }];
        let h2 = [Header {
            key: "verdict",
            value: Some(b"bad"),
        }];
        let records = [
            Record::with_value(b"x"),
            Record::with_value(b"y").headers(&h1),
            Record::with_value(b"z").headers(&h2),
        ];
        let mut p = Echo;
        let mut out = Vec::new();
        p.handle_batch(&records, &mut out);
        assert_eq!(
            out,
            vec![Verdict::Accept, Verdict::Renew, Verdict::reject("bad")]
        );
    }

    #[test]
    fn record_accessors_distinguish_null_from_absent() {
        let h = [Header {
            key: "n",
            value: None,
        }];
        let r = Record::with_value(b"v")
            .key(b"k")
            .headers(&h)
            .delivery_count(3);
        assert_eq!(r.key_str(), Some("k"));
        assert_eq!(r.value_str(), Some("v"));
        assert_eq!(r.header("n"), Some(None));
        assert_eq!(r.header("missing"), None);
        assert_eq!(r.delivery_count, 3);
    }
}

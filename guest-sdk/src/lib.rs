//! Write a [sharehost](https://example.invalid/sharehost) plugin in plain Rust.
//!
//! A plugin judges records fetched from a Kafka share group: for each record it returns a
//! [`Verdict`] (accept, release, reject with a reason, renew, or retry after a delay). You
//! implement the [`Plugin`] trait over pure types ([`Record`], [`Verdict`], [`Config`]) that
//! compile on any target, so your logic is unit-tested with a plain `cargo test`, no
//! WebAssembly involved. One line, [`export!`], turns the type into a WebAssembly component
//! (contract `sharehost:plugin@0.2.0`) when you build for `wasm32-wasip2`.
//!
//! A plugin may also act before it judges: [`Record::emit`] a record to an output the
//! manifest names, call an API with [`http`] (only hosts the pipeline grants), and read its
//! [`Config::secret`]s. Natively, [`testing`] stands in for the host: it collects emits and
//! answers HTTP requests from a mock.
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
//! # Acting on a record: emit, HTTP, secrets, retry
//!
//! ```
//! use sharehost_guest::{Config, Header, Plugin, Record, Verdict, http, testing};
//!
//! /// Asks a service about each record and forwards its answer to the `checked` output.
//! pub struct Checker {
//!     url: String,
//!     token: Option<String>,
//! }
//!
//! impl Plugin for Checker {
//!     fn init(config: &Config) -> Result<Self, String> {
//!         Ok(Self {
//!             url: config.get("url").ok_or("set `url`")?.to_owned(),
//!             token: config.secret("api-token").map(str::to_owned),
//!         })
//!     }
//!
//!     fn handle(&mut self, record: &Record<'_>) -> Verdict {
//!         let mut request = http::Request::get(&self.url);
//!         if let Some(token) = &self.token {
//!             request = request.bearer_auth(token);
//!         }
//!         match http::send(request) {
//!             Ok(r) if r.status == 429 => Verdict::retry(2000),
//!             Ok(r) if r.is_success() => {
//!                 let headers = [Header { key: "checked-by", value: Some(b"checker") }];
//!                 match record.emit("checked", record.key, Some(&r.body), &headers) {
//!                     Ok(()) => Verdict::Accept,
//!                     // Refused (e.g. the batch's emit budget is spent): try again later.
//!                     Err(_) => Verdict::Release,
//!                 }
//!             }
//!             Ok(r) => Verdict::reject(format!("service answered {}", r.status)),
//!             Err(_) => Verdict::retry(2000),
//!         }
//!     }
//! }
//!
//! sharehost_guest::export!(Checker);
//!
//! // Natively, `testing` plays the host: a mock answers HTTP, emits are collected.
//! testing::reset();
//! testing::http::mock(|_req| Ok(http::Response::new(200).with_body("ok")));
//! let config = Config::from_pairs([("url", "http://127.0.0.1:8088/check")])
//!     .with_secret("api-token", "t0ken");
//! let mut checker = Checker::init(&config).unwrap();
//! assert_eq!(checker.handle(&Record::with_value(b"x")), Verdict::Accept);
//! assert_eq!(testing::http::take_requests()[0].header_value("authorization"), Some(&b"Bearer t0ken"[..]));
//! assert_eq!(testing::take_emits()[0].value.as_deref(), Some(&b"ok"[..]));
//! ```
//!
//! # What the sandbox allows
//! No files, no sockets, no environment variables; stdout and stderr are captured and
//! logged by the host (bounded). Use [`log`] for structured messages. Outbound HTTP reaches
//! only the hosts the pipeline's `allowed_outbound_hosts` lists (anything else is an
//! [`http::HttpError::Denied`]), and a component that calls [`http`] at all is refused at
//! load by a pipeline that grants no host. Every batch runs under a memory cap, a CPU
//! deadline and a wall-clock deadline; a panic, trap or timeout turns the whole batch into a
//! fault (its records get the pipeline's fault policy, release by default) and the next
//! batch runs on a fresh instance.

use std::fmt;
use std::time::Duration;

pub mod http;
// Native builds only (a component talks to the real host); documented on every target.
#[cfg(any(not(target_arch = "wasm32"), doc))]
pub mod testing;

/// One record of a batch, borrowed from the batch buffer: reading keys, values and headers
/// copies nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// The record's position in its batch (0-based): what binds an [`emit`](Record::emit) to
    /// this record, so the host produces the emit only if this record ends accepted.
    pub index: u32,
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
    /// A record with this value and neutral metadata (index 0, topic `test`, partition 0,
    /// offset 0, first delivery, no key, no headers): a starting point for unit tests.
    pub const fn with_value(value: &'a [u8]) -> Self {
        Self {
            index: 0,
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

    /// The same record at this position in its batch (for building test batches whose
    /// emits must be told apart).
    pub const fn at_index(mut self, index: u32) -> Self {
        self.index = index;
        self
    }

    /// The same record with this offset (for building test records).
    pub const fn offset(mut self, offset: i64) -> Self {
        self.offset = offset;
        self
    }

    /// The same record with this delivery count (for building test records).
    pub const fn delivery_count(mut self, delivery_count: u16) -> Self {
        self.delivery_count = delivery_count;
        self
    }

    /// A name for this record that is the same at every delivery of it, `TOPIC/PARTITION/OFFSET`:
    /// hand it to a service the plugin calls (as an `Idempotency-Key` header, say) so that a
    /// call made again after a redelivery does its work once. The host cannot undo a call
    /// outside Kafka, even in an exactly-once pipeline; the service can, with this key.
    pub fn idempotency_key(&self) -> String {
        format!("{}/{}/{}", self.topic, self.partition, self.offset)
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

    /// Emits a record to the topic the manifest maps `output` to (`[pipeline.outputs]`),
    /// bound to this record: the host produces it (acks=all) before this record's Accept goes
    /// out, and discards it if this record ends released, rejected, renewed or retried. So
    /// emit first, then return [`Verdict::Accept`]; an accepted record never lacks its emits.
    ///
    /// `headers` may not use the reserved `sharehost.` prefix; the host adds provenance
    /// headers (`sharehost.source.topic`, `.partition`, `.offset`, `.delivery-count`) itself.
    /// An `Err` means the emit was not produced and never will be; what that means for the
    /// record is the plugin's call (usually release it or reject it with the error).
    ///
    /// Natively (unit tests) emits go to [`testing`]'s collector instead of a host.
    pub fn emit(
        &self,
        output: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[Header<'_>],
    ) -> Result<(), EmitError> {
        #[cfg(target_arch = "wasm32")]
        return wasm::emit(self.index, output, key, value, headers);
        #[cfg(not(target_arch = "wasm32"))]
        return testing::emit(self.index, output, key, value, headers);
    }
}

/// Why the host refused an emit (the contract's `emit-error`). Nothing is dropped silently:
/// a refused emit is not produced, and the plugin decides what that means for its record.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum EmitError {
    /// The record is not one of the batch being judged (or emit was called outside
    /// `handle`).
    #[error("no such record in the batch being judged")]
    NoSuchRecord,
    /// The manifest's `[pipeline.outputs]` has no output of this name.
    #[error(
        "unknown output `{0}` (not in the manifest's [pipeline.outputs], or test-plugin's --output)"
    )]
    UnknownOutput(String),
    /// The batch already emitted the most records the manifest allows (carried here).
    #[error("too many emits: the batch already emitted {0}, the manifest's max_emits_per_batch")]
    TooManyEmits(u32),
    /// This emit would take the batch past the bytes the manifest allows (carried here).
    #[error(
        "too many bytes: this emit would take the batch past {0} bytes (max_emit_bytes_per_batch)"
    )]
    TooManyBytes(u64),
    /// A header key starts with the reserved `sharehost.` prefix.
    #[error("header `{0}` uses the reserved `sharehost.` prefix")]
    ReservedHeader(String),
}

/// The header-key prefix the host keeps for its own (provenance) headers.
pub const RESERVED_HEADER_PREFIX: &str = "sharehost.";

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
    /// Not now, try again after `after_ms` milliseconds: the host keeps the record acquired
    /// and releases it for redelivery when the delay has passed (delivery count + 1), so a
    /// plugin facing a 429 or a down dependency backs off instead of spinning through
    /// deliveries. The host caps the delay (`max_retry_delay_ms`; on brokers without renew,
    /// the lock time). The record's emits are discarded.
    Retry {
        /// How long to wait before the record is delivered again, in milliseconds.
        after_ms: u32,
    },
}

impl Verdict {
    /// A rejection with a reason.
    pub fn reject(reason: impl Into<String>) -> Self {
        Self::Reject(Some(reason.into()))
    }

    /// Try again after `after_ms` milliseconds (see [`Verdict::Retry`]).
    pub const fn retry(after_ms: u32) -> Self {
        Self::Retry { after_ms }
    }

    /// Try again after `delay` (see [`Verdict::Retry`]); delays beyond `u32::MAX` ms (about
    /// 49 days, far past any cap) saturate.
    pub fn retry_after(delay: Duration) -> Self {
        Self::Retry {
            after_ms: u32::try_from(delay.as_millis()).unwrap_or(u32::MAX),
        }
    }
}

/// The pipeline's configuration for this plugin: the manifest's key/value pairs, in order,
/// and apart from them its secrets (`[pipeline.secrets]`).
///
/// Secrets are kept out of [`Config::get`] and [`Config::iter`] so that code dumping the
/// configuration never dumps them, and `{:?}` shows their names only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Config {
    pairs: Vec<(String, String)>,
    secrets: Vec<(String, String)>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Redacted<'a>(&'a [(String, String)]);
        impl fmt::Debug for Redacted<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_map()
                    .entries(self.0.iter().map(|(k, _)| (k, format_args!("<redacted>"))))
                    .finish()
            }
        }
        f.debug_struct("Config")
            .field("pairs", &self.pairs)
            .field("secrets", &Redacted(&self.secrets))
            .finish()
    }
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
            secrets: Vec::new(),
        }
    }

    /// The same configuration with one more secret (for tests; the host hands the
    /// pipeline's `[pipeline.secrets]` to `init` the same way).
    pub fn with_secret(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.secrets.push((key.into(), value.into()));
        self
    }

    /// The secret named `key` (from `[pipeline.secrets]`), e.g. an API token. Never in
    /// [`Config::get`] or [`Config::iter`], and never printed by `{:?}`: keep it out of logs,
    /// reasons and emits yourself.
    pub fn secret(&self, key: &str) -> Option<&str> {
        self.secrets
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of the last pair named `key` (later entries override earlier ones).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// All pairs, in order (secrets not included).
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
    /// Builds the plugin from the pipeline configuration (and its secrets, see
    /// [`Config::secret`]). An `Err` refuses the configuration: at load the pipeline does not
    /// start and shows the message (never include a secret in it).
    fn init(config: &Config) -> Result<Self, String>;

    /// Judges one record.
    fn handle(&mut self, record: &Record<'_>) -> Verdict;

    /// Judges a batch, pushing exactly one verdict per record, in order. The default calls
    /// [`Plugin::handle`] for each record; override it to work on the batch as a whole (e.g.
    /// one [`http::send_all`] for all its records).
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
                    secrets: ::std::vec::Vec<(::std::string::String, ::std::string::String)>,
                ) -> ::std::result::Result<(), ::std::string::String> {
                    $crate::__private::init::<$plugin>(config, secrets)
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
    fn secrets_are_kept_apart_from_the_config_pairs_and_never_debug_printed() {
        let c = Config::from_pairs([("url", "http://127.0.0.1:8088")])
            .with_secret("api-token", "s3cret-value");
        assert_eq!(c.secret("api-token"), Some("s3cret-value"));
        assert_eq!(c.get("api-token"), None);
        assert!(c.iter().all(|(_, v)| v != "s3cret-value"));
        assert_eq!(c.secret("missing"), None);
        let shown = format!("{c:?} {c:#?}");
        assert!(!shown.contains("s3cret-value"), "{shown}");
        assert!(
            shown.contains("api-token"),
            "the secret's name is shown: {shown}"
        );
        assert!(shown.contains("http://127.0.0.1:8088"), "{shown}");
    }

    #[test]
    fn retry_after_a_duration_is_in_milliseconds_and_saturates() {
        assert_eq!(
            Verdict::retry_after(Duration::from_secs(2)),
            Verdict::Retry { after_ms: 2000 }
        );
        assert_eq!(Verdict::retry(250), Verdict::Retry { after_ms: 250 });
        assert_eq!(
            Verdict::retry_after(Duration::from_secs(u64::MAX)),
            Verdict::Retry { after_ms: u32::MAX }
        );
    }

    #[test]
    fn emits_are_collected_with_their_record_index_in_order() {
        testing::reset();
        let h = [Header {
            key: "kind",
            value: Some(b"order"),
        }];
        let a = Record::with_value(b"a").at_index(0);
        let b = Record::with_value(b"b").at_index(5);
        assert_eq!(b.emit("urgent", Some(b"k"), Some(b"B"), &h), Ok(()));
        assert_eq!(a.emit("normal", None, None, &[]), Ok(()));
        let emits = testing::take_emits();
        assert_eq!(emits.len(), 2);
        assert_eq!(
            emits[0],
            testing::Emit {
                record_index: 5,
                output: "urgent".into(),
                key: Some(b"k".to_vec()),
                value: Some(b"B".to_vec()),
                headers: vec![("kind".into(), Some(b"order".to_vec()))],
            }
        );
        assert_eq!(emits[0].header("kind"), Some(Some(&b"order"[..])));
        assert_eq!(
            (emits[1].record_index, emits[1].value.as_deref()),
            (0, None)
        );
        assert!(testing::take_emits().is_empty(), "take clears");
    }

    #[test]
    fn the_fake_host_refuses_reserved_headers_and_what_its_policy_refuses() {
        testing::reset();
        let r = Record::with_value(b"v");
        let reserved = [Header {
            key: "sharehost.source.offset",
            value: Some(b"1"),
        }];
        assert_eq!(
            r.emit("out", None, None, &reserved),
            Err(EmitError::ReservedHeader("sharehost.source.offset".into()))
        );
        testing::refuse_emits(|e| match e.output.as_str() {
            "out" => Ok(()),
            other => Err(EmitError::UnknownOutput(other.to_owned())),
        });
        assert_eq!(r.emit("out", None, Some(b"1"), &[]), Ok(()));
        assert_eq!(
            r.emit("elsewhere", None, Some(b"2"), &[]),
            Err(EmitError::UnknownOutput("elsewhere".into()))
        );
        let emits = testing::take_emits();
        assert_eq!(emits.len(), 1, "refused emits are not collected: {emits:?}");
        assert_eq!(emits[0].output, "out");
        testing::reset();
        assert_eq!(
            r.emit("elsewhere", None, None, &[]),
            Ok(()),
            "reset drops the policy"
        );
        assert_eq!(
            EmitError::TooManyEmits(1000).to_string(),
            "too many emits: the batch already emitted 1000, the manifest's max_emits_per_batch"
        );
    }

    #[test]
    fn send_all_answers_in_request_order_and_records_the_requests() {
        testing::reset();
        testing::http::mock(|req| match req.url.rsplit('/').next() {
            Some("A-1") => Ok(http::Response::new(200).with_body("1")),
            Some("slow") => Err(http::HttpError::Timeout("slow".into())),
            _ => Ok(http::Response::new(404)),
        });
        let answers = http::send_all(vec![
            http::Request::get("http://127.0.0.1:8088/price/slow"),
            http::Request::get("http://127.0.0.1:8088/price/A-1"),
            http::Request::get("relative/path"),
            http::Request::get("http://127.0.0.1:8088/price/Z-9").bearer_auth("t"),
        ]);
        assert_eq!(answers[0], Err(http::HttpError::Timeout("slow".into())));
        assert_eq!(
            answers[1].as_ref().map(|r| r.body.as_slice()),
            Ok(&b"1"[..])
        );
        assert!(matches!(
            answers[2],
            Err(http::HttpError::InvalidRequest(_))
        ));
        assert_eq!(answers[3].as_ref().map(|r| r.status), Ok(404));
        let sent = testing::http::take_requests();
        assert_eq!(sent.len(), 4);
        assert_eq!(
            sent[3].header_value("Authorization"),
            Some(&b"Bearer t"[..])
        );
        assert_eq!(
            http::get("http://127.0.0.1:8088/price/A-1").map(|r| r.status),
            Ok(200)
        );
    }

    #[test]
    fn without_a_mock_every_request_is_denied_like_an_ungranted_pipeline() {
        testing::reset();
        assert!(matches!(
            http::get("http://127.0.0.1:8088/"),
            Err(http::HttpError::Denied(_))
        ));
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
        assert_eq!(
            r.idempotency_key(),
            format!("{}/{}/{}", r.topic, r.partition, r.offset)
        );
    }
}

//! sharehost-runtime: the plugin sandbox. Turns a WebAssembly component file into something a
//! pipeline can call with a bounded budget and only the capabilities it was granted. It knows
//! no Kafka type: records come in as its own [`Record`], so it builds and is tested alone.
//!
//! A map of the parts:
//! - [`PluginRuntime`] (`engine.rs`): the one wasmtime `Engine` per process (component model,
//!   async, epoch interruption ticked by a dedicated thread, pooling allocator with an
//!   on-demand fallback, copy-on-write memory images) and the precompiled-artifact cache
//!   (`cache.rs`).
//! - [`Plugin`] (`plugin.rs`): one loaded plugin version: validated imports and exports
//!   (`validate.rs`), an `InstancePre`, and a warm or fresh instance per batch. Every call runs
//!   under a memory cap, a CPU deadline and bounds on verdicts and logs; anything a guest does
//!   wrong becomes a [`BatchOutcome::Fault`], never a host crash.
//! - [`Record`], [`Header`] and the columnar wire batch (`batch.rs`): what a plugin judges, and
//!   how it crosses the sandbox boundary as a few integer columns plus one byte buffer.
//! - [`offline`]: JSON-lines records in, verdict lines out, for `sharehost test-plugin`.
//! - `component_file.rs`: the one reader of component files (regular files only, bounded,
//!   what-it-is errors) and the pre-compile look at a component's imports and exports.
//! - `trust.rs`: signed components: the keys a pipeline trusts and the signature check every
//!   load makes on the bytes it read, before parsing or compiling them.
//! - `host.rs`: what a guest may call (the bounded `log` import) and its captured stdio.
//!
//! The contract itself is `wit/plugin.wit`; see `docs/wit.md`.

mod batch;
mod bindings;
mod cache;
mod component_file;
mod config;
mod engine;
mod error;
mod fault;
mod fs;
mod http;
mod log;
mod meter;
pub mod offline;
mod outputs;
mod plugin;
mod record;
mod secrets;
mod store;
mod trust;
mod turns;
mod validate;

pub use cache::default_cache_dir;
pub use component_file::{DEFAULT_MAX_COMPONENT_BYTES, check_component_path, read_component};
pub use config::{DEFAULT_WALL_PER_CPU, InstanceMode, PluginLimits, RuntimeConfig};
pub use engine::{AllocatorKind, Compiled, Origin, Placement, PluginRuntime};
pub use error::{LoadError, RuntimeError};
pub use fault::{BatchOutcome, Fault, FaultKind};
pub use http::{
    AllowedOrigin, HttpCounts, HttpGrant, HttpGrantError, HttpSettings, HttpStats, OriginError,
    parse_allowed_origin,
};
pub use outputs::{
    DEFAULT_MAX_EMIT_BYTES_PER_BATCH, DEFAULT_MAX_EMITS_PER_BATCH, Emit, EmitHeader, OutputGrant,
    RESERVED_HEADER_PREFIX,
};
pub use plugin::{Contract, ISOLATION_DEADLINES, Judged, Plugin, PluginInit, PluginStats};
pub use record::{Header, Record};
pub use secrets::Secrets;
pub use sharehost_bounded_lift::Verdict;
pub use trust::{
    MAX_SIGNATURE_BYTES, SIGNATURE_SUFFIX, TrustPolicy, TrustRefusal, TrustedKey, parse_keys_file,
    signature_path,
};
pub use validate::{ALLOWED_WASI_INTERFACES, HOST_INTERFACE};

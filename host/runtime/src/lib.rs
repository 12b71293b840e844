//! sharehost-runtime: the plugin sandbox. Turns a WebAssembly component file into something a
//! pipeline can call with a bounded budget and only the capabilities it was granted. It knows
//! no Kafka type: records come in as its own [`Record`], so it builds and is tested alone.
//! The contract itself is `wit/plugin.wit`; see `docs/wit.md`.
//!
//! A map of the rooms, from the top down:
//!
//! - **Running a plugin.** [`PluginRuntime`] (`engine.rs`): the one runtime per process, its
//!   wasmtime engines configured in one place (component model, async, epoch interruption,
//!   the pooling allocator with an on-demand engine beside it, copy-on-write memory images),
//!   their linkers and where compiled code is placed. `threads.rs`: the guest threads and the
//!   epoch ticker; `turns.rs`: the fair share of those threads between pipelines.
//!   [`Plugin`] (`plugin.rs`): one loaded plugin version, a warm or fresh instance per batch,
//!   poison isolation; every call runs under a memory cap, a CPU and a wall-clock deadline
//!   (`meter.rs` measures them) and bounds on verdicts and logs. `fault.rs`: anything a guest
//!   does wrong becomes a [`BatchOutcome::Fault`], never a host crash.
//! - **Loading.** `loader.rs`: the runtime's loading methods ([`PluginRuntime::compile`], off
//!   the async workers, and `load`): read, verify, check, compile or map from the precompiled
//!   cache (`cache.rs`). `component_file.rs`: the one reader of component files, over the
//!   bounded file reader (`fs.rs`, an error of its own); `functions.rs`: bounds on what one
//!   function asks of the compiler; `trust.rs`: signed components;
//!   `validate.rs`: the contract's imports and exports.
//! - **What a guest can reach**, one room per capability in the shape of wasmtime's
//!   capability crates (a context, a builder with documented defaults, a per-call view,
//!   `add_to_linker`) and of Spin's factors (each implements `capability.rs`'s `Capability`:
//!   its store state, its imports, its per-call hooks, its counters): `wasi.rs` (the empty
//!   WASI context), `log.rs` (the `log` import and captured stdio), `outputs.rs` (`emit`,
//!   granted by an [`OutputGrant`]) and `http/` (outbound HTTP, granted by an [`HttpGrant`]).
//!   The contract's imports come from the `Host` traits `bindgen!` generates, except `log`,
//!   which keeps its bounded lift. `secrets.rs` ([`Secrets`], handed to `init` and redacted
//!   from everything the host shows) is no capability. `store.rs`: what one instance owns;
//!   its `capabilities!` list is the one place the capabilities are composed.
//! - **What a plugin judges.** [`Record`] and [`Header`] (`record.rs`); `batch.rs`: how a batch
//!   crosses the sandbox boundary as a few integer columns plus one byte buffer;
//!   `bindings.rs`: the types generated from the contract, both versions.
//! - **Settings and errors.** [`RuntimeConfig`], [`PluginLimits`] (`config.rs`);
//!   [`RuntimeError`], [`LoadError`] (`error.rs`).
//! - [`offline`]: JSON-lines records in, verdict lines out, for `sharehost test-plugin`.

mod batch;
mod bindings;
mod cache;
mod capability;
mod component_file;
mod config;
mod engine;
mod error;
mod fault;
pub mod fs;
mod functions;
mod http;
mod loader;
mod log;
mod meter;
pub mod offline;
mod outputs;
mod plugin;
mod record;
mod secrets;
mod store;
mod threads;
mod trust;
mod turns;
mod validate;
mod wasi;

pub use cache::default_cache_dir;
pub use component_file::{DEFAULT_MAX_COMPONENT_BYTES, check_component_path, read_component};
pub use config::{DEFAULT_WALL_PER_CPU, InstanceMode, PluginLimits, RuntimeConfig};
pub use engine::{AllocatorKind, Compiled, Origin, Placement, PluginRuntime};
pub use error::{LoadError, RuntimeError};
pub use fault::{BatchOutcome, Fault, FaultKind};
pub use functions::{
    CodeShape, DEFAULT_MAX_FUNCTION_NESTING, DEFAULT_MAX_FUNCTION_OPERATORS, FunctionAt,
    FunctionBounds,
};
pub use http::{
    AllowedOrigin, HttpCounts, HttpGrant, HttpGrantError, HttpSettings, HttpStats, OriginError,
    parse_allowed_origin, tls_connector,
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

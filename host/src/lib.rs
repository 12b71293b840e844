//! sharehost: runs sandboxed WebAssembly plugins on Apache Kafka share groups (KIP-932). This
//! crate is where the layers meet and the binary lives; the layers are crates of their own, so
//! the compiler keeps them apart:
//! - [`kafka`] (`sharehost-kafka`): the wire layer, bytes to and from brokers.
//! - [`share`] (`sharehost-share`): the KIP-932 engine on top of it.
//! - [`runtime`] (`sharehost-runtime`): the sandbox, knowing neither of the two.
//!
//! Its own parts:
//! - [`manifest`]: the TOML a host runs, parsed and checked with errors that point at the line.
//! - [`pipeline`]: the one place where the engine and the sandbox meet: records in, verdicts
//!   out, outputs and dead letters written, acknowledgements decided; hot-swap, shadow, canary.
//! - [`writes`]: produce that never costs a delivery (retried while the records stay held).
//! - [`rollout`]: the pure rules of shadow and canary runs; [`persisted`]: what survives a restart.
//! - [`tenants`]: a host's pipelines, each loading, running and failing on its own.
//! - [`api`]: the admin API's routes and bodies, written once; [`admin`]: the server (metrics,
//!   health, swap, rollout); `sharehost ctl` (in the binary's `cli`): its client.
//! - [`dlq`]: reading and replaying dead letters; [`provenance`]: the header names written.
//! - [`schema`]: records in the schema registry's wire format, decoded for plugins, emits
//!   encoded; [`telemetry`]: OpenTelemetry traces of batches and records.
//! - [`metrics`]: the registry passed down to everything that counts; [`host_threads`]: the
//!   runtime the host's own work runs on.

pub mod admin;
pub mod api;
pub mod console;
pub mod dlq;
pub mod fleet;
pub mod host_threads;
pub mod manifest;
pub mod metrics;
pub mod persisted;
pub mod pipeline;
pub mod provenance;
pub mod recent_faults;
pub mod rollout;
pub mod schema;
pub mod telemetry;
pub mod tenants;
pub mod writes;

/// The layers below, under the names the host's modules and the tests use.
pub use sharehost_kafka as kafka;
pub use sharehost_runtime as runtime;
pub use sharehost_share as share;

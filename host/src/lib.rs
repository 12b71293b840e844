//! sharehost: runs sandboxed WebAssembly plugins on Apache Kafka share groups (KIP-932).
//!
//! The crate is a map of its parts:
//! - [`kafka`]: the wire layer (frames, connections, TLS, SASL, metadata, produce/fetch).
//! - [`runtime`]: the sandboxed plugin runtime (wasmtime): load and validate a component, call
//!   it with a bounded budget, turn anything it does wrong into a fault for that batch.
//!
//! The share-group engine (`share`), the plugin runtime (`runtime`), the manifest and the
//! pipeline arrive with their issues; see `docs/` and the design notes.

pub mod admin;
pub mod console;
pub mod ctl;
pub mod dlq;
pub mod kafka;
pub mod manifest;
pub mod metrics;
pub mod pipeline;
pub mod provenance;
pub mod recent_faults;
pub mod rollout;
pub mod runtime;
pub mod share;
pub mod state;
pub mod tenants;
pub mod writes;

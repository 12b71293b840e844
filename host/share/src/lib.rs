//! sharehost-share: the KIP-932 share-group consumer engine: membership, per-leader share
//! sessions, acquisition with ShareFetch, the acknowledgement ledger and ShareAcknowledge.
//!
//! The state machines are pure data with exhaustive unit tests; the I/O loops only send, await
//! and feed responses back. Bytes on the wire are `sharehost-kafka`'s (its `protocol::share`).
//!
//! - [`membership`]: ShareGroupHeartbeat join/stable/fenced/leave transitions.
//! - [`session`]: one share session per leader: epochs, added and forgotten partitions, and
//!   the session part of every request, the closing one included.
//! - [`ledger`]: per-record verdicts to valid acknowledgement batches.
//! - [`consumer`]: the engine a caller drives: poll records, hand verdicts back, drain, close;
//!   its caller's API, heartbeat, supervisor and leader tasks in rooms of their own.

pub mod consumer;
pub mod ledger;
pub mod membership;
pub mod session;

//! The KIP-932 share-group consumer engine: membership, per-leader share sessions, acquisition
//! with ShareFetch, the acknowledgement ledger and ShareAcknowledge.
//!
//! The state machines are pure data with exhaustive unit tests; the I/O loops (coming next) only
//! send, await and feed responses back.
//!
//! - [`codec`], [`wire`]: ShareFetch/ShareAcknowledge v1-v2 on the wire.
//! - [`membership`]: ShareGroupHeartbeat join/stable/fenced/leave transitions.
//! - [`session`]: one share session per leader: epochs, added and forgotten partitions.
//! - [`ledger`]: per-record verdicts to valid acknowledgement batches.
//! - [`offsets`]: DescribeShareGroupOffsets v0-1, the group's lag per partition.

pub mod codec;
pub mod consumer;
pub mod ledger;
pub mod membership;
pub mod offsets;
pub mod session;
pub mod wire;

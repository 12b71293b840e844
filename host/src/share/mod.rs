//! The KIP-932 share-group consumer engine: membership, per-leader share sessions, acquisition
//! with ShareFetch, the acknowledgement ledger and ShareAcknowledge.
//!
//! - [`codec`], [`wire`]: ShareFetch/ShareAcknowledge v1-v2 on the wire.

pub mod codec;
pub mod wire;

//! What a plugin judges: the runtime's own record and header types, so the sandbox builds and
//! is tested without the Kafka wire layer (whoever feeds it converts, moving the payload bytes).

use std::sync::Arc;

use bytes::Bytes;

/// One record as the runtime hands it to a plugin. Owns cheap, reference-counted pieces
/// (`Bytes`, `Arc<str>`) so building it from a fetched record copies no payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The topic the record came from; shared between the records of a batch.
    pub topic: Arc<str>,
    /// The partition the record came from.
    pub partition: i32,
    /// The record's offset in its partition.
    pub offset: i64,
    /// Record timestamp, milliseconds since the Unix epoch.
    pub timestamp: i64,
    /// Deliveries so far including this one (KIP-932 delivery count; 1 on first delivery).
    pub delivery_count: u16,
    /// The key; `None` is a null key.
    pub key: Option<Bytes>,
    /// The value; `None` is a null value (tombstone).
    pub value: Option<Bytes>,
    /// Headers in order.
    pub headers: Vec<Header>,
}

/// One record header as a plugin sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Header {
    /// The header's key.
    pub key: String,
    /// The header's value; `None` is a null value.
    pub value: Option<Bytes>,
}

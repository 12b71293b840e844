//! What a plugin judges ([`Record`]) and how a batch crosses the sandbox boundary: flattened
//! into one byte arena plus a typed index (see `wit/plugin.wit` and docs/wit.md for why).

use std::sync::Arc;

use bytes::Bytes;

use super::bindings::sharehost::plugin::types::{Batch, HeaderEntry, RecordEntry, Span};
use crate::kafka::{ConsumedRecord, Header};

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

impl Record {
    /// Builds a record from what the wire layer decoded. A move of the payload handles: no
    /// bytes are copied. A negative delivery count (never sent by a correct broker) reads as 0.
    pub fn from_consumed(
        topic: Arc<str>,
        partition: i32,
        delivery_count: i16,
        record: ConsumedRecord,
    ) -> Self {
        Self {
            topic,
            partition,
            offset: record.offset,
            timestamp: record.timestamp,
            delivery_count: u16::try_from(delivery_count).unwrap_or(0),
            key: record.key,
            value: record.value,
            headers: record.headers,
        }
    }
}

/// The reusable wire batch: its vectors keep their capacity between calls, so steady-state
/// encoding allocates nothing on the host.
pub(crate) struct WireBatch {
    pub(crate) batch: Batch,
}

impl Default for WireBatch {
    fn default() -> Self {
        Self {
            batch: Batch {
                topics: Vec::new(),
                records: Vec::new(),
                headers: Vec::new(),
                data: Vec::new(),
            },
        }
    }
}

/// Why a batch cannot be encoded: the wire format uses 32-bit offsets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchTooLarge;

impl WireBatch {
    /// Refills the wire batch from `records`. Fails only when the batch's bytes exceed 4 GiB,
    /// which no plugin memory could hold anyway.
    pub(crate) fn fill(&mut self, records: &[Record]) -> Result<(), BatchTooLarge> {
        let b = &mut self.batch;
        b.topics.clear();
        b.records.clear();
        b.headers.clear();
        b.data.clear();
        let bytes: usize = records
            .iter()
            .map(|r| {
                r.key.as_ref().map_or(0, Bytes::len)
                    + r.value.as_ref().map_or(0, Bytes::len)
                    + r.headers
                        .iter()
                        .map(|h| h.key.len() + h.value.as_ref().map_or(0, Bytes::len))
                        .sum::<usize>()
            })
            .sum();
        if u32::try_from(bytes).is_err() {
            return Err(BatchTooLarge);
        }
        b.data.reserve(bytes);
        b.records.reserve(records.len());
        // Consecutive records usually share a topic: compare with the last one first (pointer,
        // then name) and search the (short) topic list only on a change.
        let mut last: Option<(&Arc<str>, u32)> = None;
        for r in records {
            let topic = match last {
                Some((t, i)) if Arc::ptr_eq(t, &r.topic) || **t == *r.topic => i,
                _ => {
                    let i = match b.topics.iter().position(|t| **t == *r.topic) {
                        Some(i) => i,
                        None => {
                            b.topics.push(r.topic.to_string());
                            b.topics.len() - 1
                        }
                    } as u32;
                    last = Some((&r.topic, i));
                    i
                }
            };
            let headers_start = b.headers.len();
            for h in &r.headers {
                let key = push(&mut b.data, h.key.as_bytes());
                let value = h.value.as_deref().map(|v| push(&mut b.data, v));
                b.headers.push(HeaderEntry { key, value });
            }
            let key = r.key.as_deref().map(|k| push(&mut b.data, k));
            let value = r.value.as_deref().map(|v| push(&mut b.data, v));
            b.records.push(RecordEntry {
                topic,
                partition: r.partition,
                offset: r.offset,
                timestamp: r.timestamp,
                delivery_count: r.delivery_count,
                key,
                value,
                headers_start: headers_start as u32,
                headers_len: r.headers.len() as u32,
            });
        }
        Ok(())
    }
}

/// Appends `bytes` to the arena and returns their span. The caller checked that the whole
/// batch fits in `u32`, so the casts cannot truncate.
fn push(data: &mut Vec<u8>, bytes: &[u8]) -> Span {
    let start = data.len() as u32;
    data.extend_from_slice(bytes);
    Span {
        start,
        len: bytes.len() as u32,
    }
}

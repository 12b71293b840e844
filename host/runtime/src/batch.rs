//! How a batch of [`Record`]s crosses the sandbox boundary: integer columns plus one byte
//! buffer (see `wit/plugin.wit` and docs/wit.md for why: each column is lowered into the guest
//! as one block copy).

use std::sync::Arc;

use bytes::Bytes;

use crate::bindings::v02::sharehost::plugin::types::Batch;
use crate::record::Record;

/// The wire encoding of "null" in a span's start position (see `wit/plugin.wit`).
pub(crate) const NULL_SPAN: u32 = u32::MAX;

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
                topic_index: Vec::new(),
                partitions: Vec::new(),
                offsets: Vec::new(),
                timestamps: Vec::new(),
                delivery_counts: Vec::new(),
                key_spans: Vec::new(),
                value_spans: Vec::new(),
                header_ranges: Vec::new(),
                header_spans: Vec::new(),
                data: Vec::new(),
            },
        }
    }
}

/// Why a batch cannot be encoded: the wire format uses 32-bit positions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchTooLarge;

impl WireBatch {
    /// Refills the wire batch from `records`. Fails only when the batch's bytes (or header
    /// count) exceed what 32-bit positions can address, which no plugin memory could hold.
    pub(crate) fn fill(&mut self, records: &[Record]) -> Result<(), BatchTooLarge> {
        let b = &mut self.batch;
        b.topics.clear();
        b.topic_index.clear();
        b.partitions.clear();
        b.offsets.clear();
        b.timestamps.clear();
        b.delivery_counts.clear();
        b.key_spans.clear();
        b.value_spans.clear();
        b.header_ranges.clear();
        b.header_spans.clear();
        b.data.clear();
        let mut bytes = 0usize;
        let mut headers = 0usize;
        for r in records {
            bytes += r.key.as_ref().map_or(0, Bytes::len) + r.value.as_ref().map_or(0, Bytes::len);
            for h in &r.headers {
                bytes += h.key.len() + h.value.as_ref().map_or(0, Bytes::len);
            }
            headers += r.headers.len();
        }
        // Positions are u32 and u32::MAX is the null marker.
        if bytes >= NULL_SPAN as usize || headers >= (u32::MAX / 4) as usize {
            return Err(BatchTooLarge);
        }
        let n = records.len();
        b.data.reserve(bytes);
        b.topic_index.reserve(n);
        b.partitions.reserve(n);
        b.offsets.reserve(n);
        b.timestamps.reserve(n);
        b.delivery_counts.reserve(n);
        b.key_spans.reserve(2 * n);
        b.value_spans.reserve(2 * n);
        b.header_ranges.reserve(2 * n);
        b.header_spans.reserve(4 * headers);
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
            b.topic_index.push(topic);
            b.partitions.push(r.partition);
            b.offsets.push(r.offset);
            b.timestamps.push(r.timestamp);
            b.delivery_counts.push(r.delivery_count);
            push_span(&mut b.data, &mut b.key_spans, r.key.as_deref());
            push_span(&mut b.data, &mut b.value_spans, r.value.as_deref());
            b.header_ranges
                .extend_from_slice(&[(b.header_spans.len() / 4) as u32, r.headers.len() as u32]);
            for h in &r.headers {
                push_span(&mut b.data, &mut b.header_spans, Some(h.key.as_bytes()));
                push_span(&mut b.data, &mut b.header_spans, h.value.as_deref());
            }
        }
        Ok(())
    }
}

/// Appends `bytes` (if any) to the arena and their (start, length) to `spans`; `None` is
/// encoded as start [`NULL_SPAN`]. The caller checked that the batch fits in `u32`.
fn push_span(data: &mut Vec<u8>, spans: &mut Vec<u32>, bytes: Option<&[u8]>) {
    match bytes {
        Some(bytes) => {
            spans.extend_from_slice(&[data.len() as u32, bytes.len() as u32]);
            data.extend_from_slice(bytes);
        }
        None => spans.extend_from_slice(&[NULL_SPAN, 0]),
    }
}

//! Records as sharehost sees them, and their conversion to and from Kafka record batches
//! (kafka-protocol encodes batches and does every compression codec; batches are decoded here,
//! straight into records whose keys, values and header values are views of the fetched bytes).

use crate::idempotence::ProducerIdentity;
use bytes::{Bytes, BytesMut};
use kafka_protocol::compression::{self as codec, Decompressor};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    NO_PARTITION_LEADER_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, Record,
    RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

pub use kafka_protocol::records::Compression;

/// One record header. Kafka allows repeated keys; the batch codecs here key headers by name
/// (kafka-protocol's encoder does, and the decoder does the same), so a repeated key keeps its
/// first place and its last value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Header name.
    pub key: String,
    /// Header value; `None` is a null value, distinct from empty.
    pub value: Option<Bytes>,
}

/// A record to produce.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProduceRecord {
    /// Record key.
    pub key: Option<Bytes>,
    /// Record value.
    pub value: Option<Bytes>,
    /// Headers in order.
    pub headers: Vec<Header>,
    /// Creation time in ms since the epoch; now when `None`.
    pub timestamp: Option<i64>,
}

/// A record read back from a log (Fetch or ShareFetch), control records excluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumedRecord {
    /// Offset in its partition.
    pub offset: i64,
    /// Timestamp (creation or log-append time, per the topic).
    pub timestamp: i64,
    /// Record key.
    pub key: Option<Bytes>,
    /// Record value.
    pub value: Option<Bytes>,
    /// Headers in order.
    pub headers: Vec<Header>,
}

/// Why a record set could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RecordsError(String);

/// The wall clock in milliseconds since the Unix epoch, as Kafka's timestamps count it: the one
/// reading for every record this host writes and every time it stamps on a status or a version
/// (0 on a clock set before 1970).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Encodes records as one v2 record batch with `compression`, from no producer in particular
/// (no idempotence: tests and tools that write a batch by hand).
pub fn encode_batch(
    records: &[ProduceRecord],
    compression: Compression,
) -> Result<Bytes, RecordsError> {
    encode_batch_as(records, compression, None)
}

/// Encodes records as one v2 record batch with `compression`, carrying `producer`'s identity and
/// the batch's base sequence when given, which is what lets the broker drop a retried copy.
pub fn encode_batch_as(
    records: &[ProduceRecord],
    compression: Compression,
    producer: Option<(ProducerIdentity, i32)>,
) -> Result<Bytes, RecordsError> {
    encode(records, compression, producer, false)
}

/// Encodes records as one batch of `producer`'s open transaction (the batch's transactional
/// flag set): a `read_committed` reader sees it only once the transaction commits.
pub fn encode_transactional_batch(
    records: &[ProduceRecord],
    compression: Compression,
    producer: ProducerIdentity,
    base_sequence: i32,
) -> Result<Bytes, RecordsError> {
    encode(records, compression, Some((producer, base_sequence)), true)
}

fn encode(
    records: &[ProduceRecord],
    compression: Compression,
    producer: Option<(ProducerIdentity, i32)>,
    transactional: bool,
) -> Result<Bytes, RecordsError> {
    let (producer_id, producer_epoch, base_sequence) = match producer {
        Some((identity, base)) => (identity.id, identity.epoch, base),
        None => (NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE),
    };
    let now = i64::try_from(now_ms()).unwrap_or(i64::MAX);
    let converted: Vec<Record> = records
        .iter()
        .enumerate()
        .map(|(i, r)| Record {
            transactional,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
            producer_id,
            producer_epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // The encoder starts a new batch whenever offset - sequence changes; keeping it
            // constant (the base sequence, or -1 without idempotence, plus the offset) yields
            // one batch. The caller keeps base + count within i32 (see idempotence.rs).
            sequence: base_sequence.wrapping_add(i as i32),
            timestamp: r.timestamp.unwrap_or(now),
            key: r.key.clone(),
            value: r.value.clone(),
            headers: r
                .headers
                .iter()
                .map(|h| (StrBytes::from_string(h.key.clone()), h.value.clone()))
                .collect::<IndexMap<_, _>>(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &converted,
        &RecordEncodeOptions {
            version: 2,
            compression,
        },
    )
    .map_err(|e| RecordsError(format!("cannot encode record batch: {e}")))?;
    Ok(buf.freeze())
}

/// Decodes every batch in `data`, dropping control records (transaction markers).
///
/// A trailing partial batch (brokers may cut the last batch at the byte limit) is ignored, as
/// the Java client does.
pub fn decode_batches(data: Bytes) -> Result<Vec<ConsumedRecord>, RecordsError> {
    // Sized once from the batch headers (a fetch brings thousands of records, and each regrowth
    // moves every record decoded so far), but never beyond what the bytes can hold: a header
    // may claim any count.
    let claimed: usize = batch_spans(&data)
        .iter()
        .map(|&(first, last)| usize::try_from(last - first + 1).unwrap_or(0))
        .fold(0, usize::saturating_add);
    let mut out = Vec::with_capacity(claimed.min(data.len() / MIN_RECORD_BYTES));
    decode_each(data, |r| {
        if !r.control {
            out.push(r.record);
        }
    })?;
    Ok(out)
}

/// A transaction the broker reports aborted in a `read_committed` fetch: its producer's
/// transactional records from `first_offset` on belong to it, up to its abort marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTransaction {
    /// The producer that aborted.
    pub producer_id: i64,
    /// The first offset of the aborted transaction in this partition.
    pub first_offset: i64,
}

/// What a `read_committed` fetch of one partition holds: its committed records and how far
/// it read.
#[derive(Debug, Clone, Default)]
pub struct CommittedRecords {
    /// Records of committed transactions and plain records, markers and aborted ones dropped.
    pub records: Vec<ConsumedRecord>,
    /// One past the last offset seen, markers and aborted records included (the next fetch's
    /// offset); `None` when the data held no complete batch.
    pub next_offset: Option<i64>,
}

/// Decodes a `read_committed` fetch's data: drops control records and the records of the
/// `aborted` transactions, as the Java consumer does (a producer's transactional records from
/// an aborted transaction's first offset up to its abort marker are skipped). A broker's
/// `read_committed` answer ends at the last stable offset, so every transaction in it is
/// decided.
pub fn decode_committed(
    data: Bytes,
    aborted: &[AbortedTransaction],
) -> Result<CommittedRecords, RecordsError> {
    let mut pending: Vec<AbortedTransaction> = aborted.to_vec();
    pending.sort_by_key(|a| std::cmp::Reverse(a.first_offset));
    let mut aborting: std::collections::HashSet<i64> = std::collections::HashSet::new();
    let mut out = CommittedRecords::default();
    decode_each(data, |r| {
        let offset = r.record.offset;
        out.next_offset = Some(
            out.next_offset
                .unwrap_or(i64::MIN)
                .max(offset.saturating_add(1)),
        );
        while pending.last().is_some_and(|a| a.first_offset <= offset) {
            if let Some(a) = pending.pop() {
                aborting.insert(a.producer_id);
            }
        }
        if r.control {
            // A marker's key: version (2 bytes), then its type, 0 for abort and 1 for commit;
            // either way the producer's transaction ends here.
            aborting.remove(&r.producer_id);
            return;
        }
        if r.transactional && aborting.contains(&r.producer_id) {
            return;
        }
        out.records.push(r.record);
    })?;
    Ok(out)
}

/// Where a producer's transaction ended in a partition's log: its marker's offset, and
/// whether it committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnMarker {
    /// The marker's offset.
    pub offset: i64,
    /// COMMIT (`true`) or ABORT.
    pub commit: bool,
}

/// The first transaction marker of `producer_id` above `after` in a `read_uncommitted` fetch's
/// `data`, and one past the last offset the data held (`None`: no complete batch). A producer
/// has one transaction open at a time, so the first of its markers after one of its records
/// ends the transaction that record belongs to.
pub fn find_marker(
    data: Bytes,
    producer_id: i64,
    after: i64,
) -> Result<(Option<TxnMarker>, Option<i64>), RecordsError> {
    let mut found: Option<TxnMarker> = None;
    let mut next: Option<i64> = None;
    decode_each(data, |r| {
        let offset = r.record.offset;
        next = Some(next.unwrap_or(i64::MIN).max(offset.saturating_add(1)));
        if found.is_none() && r.control && r.producer_id == producer_id && offset > after {
            // A marker's key: version (2 bytes), then its type (2 bytes): 0 abort, 1 commit.
            let commit = r
                .record
                .key
                .as_ref()
                .and_then(|k| k.get(2..4))
                .is_some_and(|t| i16::from_be_bytes([t[0], t[1]]) == 1);
            found = Some(TxnMarker { offset, commit });
        }
    })?;
    Ok((found, next))
}

/// One record of a log as the batch format has it: the record, and what the readers of a log
/// need of its batch.
struct LogRecord {
    record: ConsumedRecord,
    /// A transaction marker (a control batch's record).
    control: bool,
    /// Written in a transaction.
    transactional: bool,
    /// The producer that wrote its batch.
    producer_id: i64,
}

/// Bytes of a v2 batch header, up to and with its record count; the records follow.
const BATCH_HEADER_BYTES: usize = 61;

/// Decodes every complete batch in `data` and hands each record, control records included, to
/// `each` in log order.
///
/// Written here, not kafka-protocol's decoder: that one decodes each record into an interim
/// struct with a header map and copies it twice more on its way to a [`ConsumedRecord`], about
/// a fifth of the host's CPU at 100-byte records. This reads the same v2 format (KIP-98) with
/// the same checks (magic, CRC-32C, lengths, compression codec) and the ones kafka-protocol
/// lacks (counts the bytes cannot hold, deltas that overflow), and refuses what it refuses.
fn decode_each(mut data: Bytes, mut each: impl FnMut(LogRecord)) -> Result<(), RecordsError> {
    while data.len() >= 12 {
        // Batch header: base offset (8) then batch length (4) counting the bytes after it.
        let batch_len = i32::from_be_bytes([data[8], data[9], data[10], data[11]]);
        let Ok(batch_len) = usize::try_from(batch_len) else {
            return Err(RecordsError(format!(
                "negative record batch length {batch_len}"
            )));
        };
        if data.len() - 12 < batch_len {
            break; // partial trailing batch
        }
        let batch = data.split_to(12 + batch_len);
        decode_batch(batch, &mut each)?;
    }
    Ok(())
}

/// Decodes one whole v2 batch (`batch` is exactly its bytes).
fn decode_batch(batch: Bytes, each: &mut impl FnMut(LogRecord)) -> Result<(), RecordsError> {
    let fail = |what: String| RecordsError(format!("cannot decode record batch: {what}"));
    let magic = batch.get(16).map_or(-1, |m| *m as i8);
    match magic {
        2 => {}
        0 | 1 => return Err(fail(format!("message sets v{magic} are unsupported"))),
        _ => return Err(fail(format!("unknown record batch version ({magic})"))),
    }
    if batch.len() < BATCH_HEADER_BYTES {
        return Err(fail(format!(
            "a batch of {} bytes cannot hold its {BATCH_HEADER_BYTES}-byte header",
            batch.len()
        )));
    }
    let be_u32 =
        |at: usize| u32::from_be_bytes([batch[at], batch[at + 1], batch[at + 2], batch[at + 3]]);
    let supplied_crc = be_u32(17);
    let actual_crc = crc32c::crc32c(&batch[21..]);
    if supplied_crc != actual_crc {
        return Err(fail(format!(
            "cyclic redundancy check failed ({supplied_crc} != {actual_crc})"
        )));
    }
    let attributes = i16::from_be_bytes([batch[21], batch[22]]);
    let compression = match attributes & 0x7 {
        0 => Compression::None,
        1 => Compression::Gzip,
        2 => Compression::Snappy,
        3 => Compression::Lz4,
        4 => Compression::Zstd,
        other => return Err(fail(format!("unknown compression codec {other}"))),
    };
    let transactional = attributes & (1 << 4) != 0;
    let control = attributes & (1 << 5) != 0;
    let base = Bases {
        offset: be_i64(&batch, 0).unwrap_or(0),
        timestamp: be_i64(&batch, 27).unwrap_or(0),
    };
    let producer_id = be_i64(&batch, 43).unwrap_or(0);
    let record_count = be_u32(57) as i32;
    let Ok(count) = usize::try_from(record_count) else {
        return Err(fail(format!("negative record count ({record_count})")));
    };
    let mut body = batch.slice(BATCH_HEADER_BYTES..);
    let plain = decompress(&mut body, compression).map_err(|e| fail(e.to_string()))?;
    if count > plain.len() / MIN_RECORD_BYTES {
        return Err(RecordsError(format!(
            "record count {count} cannot fit in {} bytes of records",
            plain.len()
        )));
    }
    let mut rest = Cursor::new(&plain);
    for i in 0..count {
        let broken = |what: &str| {
            fail(format!(
                "record {i} of the batch at offset {}: {what}",
                base.offset
            ))
        };
        let size = rest.varint().ok_or_else(|| broken("no length"))?;
        let size = usize::try_from(size).map_err(|_| broken(&format!("negative length {size}")))?;
        let mut r = rest
            .sub(size)
            .ok_or_else(|| broken(&format!("length {size} runs past its batch")))?;
        r.byte().ok_or_else(|| broken("no attributes"))?;
        let ts_delta = r.varlong().ok_or_else(|| broken("no timestamp delta"))?;
        let offset_delta = r.varint().ok_or_else(|| broken("no offset delta"))?;
        let Some(timestamp) = base.timestamp.checked_add(ts_delta) else {
            return Err(RecordsError(format!(
                "record {i} of the batch at offset {}: timestamp delta {ts_delta} overflows the \
                 batch's first timestamp {}",
                base.offset, base.timestamp
            )));
        };
        let Some(offset) = base.offset.checked_add(i64::from(offset_delta)) else {
            return Err(RecordsError(format!(
                "record {i} of the batch at offset {}: offset delta {offset_delta} overflows it",
                base.offset
            )));
        };
        let key = r.nullable().map_err(|e| broken(&format!("key {e}")))?;
        let value = r.nullable().map_err(|e| broken(&format!("value {e}")))?;
        let header_count = r.varint().ok_or_else(|| broken("no header count"))?;
        let header_count = usize::try_from(header_count)
            .map_err(|_| broken(&format!("negative header count {header_count}")))?;
        if header_count > r.remaining() / MIN_HEADER_BYTES {
            return Err(RecordsError(format!(
                "header count {header_count} cannot fit in the {} bytes left of its record",
                r.remaining()
            )));
        }
        let mut headers: Vec<Header> = Vec::with_capacity(header_count);
        for h in 0..header_count {
            let key = r
                .nullable()
                .map_err(|e| broken(&format!("header {h}'s key {e}")))?
                .ok_or_else(|| broken(&format!("header {h}'s key is null")))?;
            let key = String::from_utf8(key.to_vec())
                .map_err(|_| broken(&format!("header {h}'s key is not UTF-8")))?;
            let value = r
                .nullable()
                .map_err(|e| broken(&format!("header {h}'s value {e}")))?;
            headers.push(Header { key, value });
        }
        each(LogRecord {
            record: ConsumedRecord {
                offset,
                timestamp,
                key,
                value,
                // Most records have no header or one: nothing to key then.
                headers: if headers.len() < 2 {
                    headers
                } else {
                    by_name(headers)
                },
            },
            control,
            transactional,
            producer_id,
        });
    }
    Ok(())
}

/// Headers keyed by name, as kafka-protocol's encoder keys them: a repeated key keeps its
/// first place and its last value.
fn by_name(headers: Vec<Header>) -> Vec<Header> {
    let mut out: Vec<Header> = Vec::with_capacity(headers.len());
    // A record may carry thousands of headers: past a few, the places are found by a map.
    let mut places: Option<std::collections::HashMap<String, usize>> = None;
    for h in headers {
        if places.is_none() && out.len() >= 16 {
            places = Some(
                out.iter()
                    .enumerate()
                    .map(|(i, h)| (h.key.clone(), i))
                    .collect(),
            );
        }
        let at = match &places {
            Some(map) => map.get(&h.key).copied(),
            None => out.iter().position(|o| o.key == h.key),
        };
        match at {
            Some(i) => out[i].value = h.value,
            None => {
                if let Some(map) = &mut places {
                    map.insert(h.key.clone(), out.len());
                }
                out.push(h);
            }
        }
    }
    out
}

/// A read position in part of a buffer (`at..end`); what it takes out are views of the
/// buffer, not copies. It borrows the buffer, so moving through a record costs no reference
/// count: only the fields taken out (a key, a value, a header's value) hold one.
struct Cursor<'a> {
    buf: &'a Bytes,
    at: usize,
    end: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor over the whole of `buf`.
    fn new(buf: &'a Bytes) -> Cursor<'a> {
        Cursor {
            buf,
            at: 0,
            end: buf.len(),
        }
    }

    fn remaining(&self) -> usize {
        self.end - self.at
    }

    fn byte(&mut self) -> Option<u8> {
        if self.at >= self.end {
            return None;
        }
        let b = *self.buf.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    /// What `read` makes of the bytes from here, moving past what it took.
    fn read<T>(&mut self, read: impl FnOnce(&mut &[u8]) -> Option<T>) -> Option<T> {
        let mut rest = self.buf.get(self.at..self.end)?;
        let before = rest.len();
        let v = read(&mut rest)?;
        self.at += before - rest.len();
        Some(v)
    }

    fn varint(&mut self) -> Option<i32> {
        self.read(varint)
    }

    fn varlong(&mut self) -> Option<i64> {
        self.read(varlong)
    }

    /// The next `n` bytes as a cursor of their own, moving past them.
    fn sub(&mut self, n: usize) -> Option<Cursor<'a>> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.end)?;
        let out = Cursor {
            buf: self.buf,
            at: self.at,
            end,
        };
        self.at = end;
        Some(out)
    }

    /// The next `n` bytes.
    fn take(&mut self, n: usize) -> Option<Bytes> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.end)?;
        let out = self.buf.slice(self.at..end);
        self.at = end;
        Some(out)
    }

    /// A length-prefixed field, -1 for null.
    fn nullable(&mut self) -> Result<Option<Bytes>, String> {
        let len = self.varint().ok_or("has no length")?;
        if len == -1 {
            return Ok(None);
        }
        let n = usize::try_from(len).map_err(|_| format!("has a negative length {len}"))?;
        self.take(n)
            .map(Some)
            .ok_or_else(|| format!("of {n} bytes runs past its record"))
    }
}

/// The offsets the complete batches in `data` cover, one `(base offset, last offset)` per batch
/// in the order they come, as their headers state them (last offset = base + last offset
/// delta). A trailing partial batch, which [`decode_batches`] skips, covers nothing; so does a
/// batch whose header is nonsense (negative delta, overflow).
///
/// Why: a share fetch can only have acquired offsets that its data covers, so the engine uses
/// these spans to bound the acquired ranges a broker claims (see `share::consumer`).
pub fn batch_spans(data: &[u8]) -> Vec<(i64, i64)> {
    let mut spans = Vec::new();
    let mut rest = data;
    while rest.len() >= 12 {
        let Ok(len) = usize::try_from(i32::from_be_bytes([rest[8], rest[9], rest[10], rest[11]]))
        else {
            break;
        };
        let Some(batch) = rest.get(..12 + len) else {
            break; // partial trailing batch
        };
        let base = be_i64(batch, 0);
        let delta = batch
            .get(23..27)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        if let (Some(base), Some(delta)) = (base, delta)
            && let Ok(delta) = u32::try_from(delta)
            && let Some(last) = base.checked_add(i64::from(delta))
        {
            spans.push((base, last));
        }
        rest = &rest[12 + len..];
    }
    spans
}

/// A big-endian i64 at `at`, if the bytes are there.
fn be_i64(data: &[u8], at: usize) -> Option<i64> {
    let b: [u8; 8] = data.get(at..at + 8)?.try_into().ok()?;
    Some(i64::from_be_bytes(b))
}

/// A batch's base offset and first timestamp, to which each record adds its deltas.
#[derive(Debug, Clone, Copy)]
struct Bases {
    offset: i64,
    timestamp: i64,
}

/// Fewest bytes one record takes in a v2 batch: its length, attributes, timestamp delta, offset
/// delta, key length, value length and header count, at least one byte each.
const MIN_RECORD_BYTES: usize = 7;

/// Fewest bytes one record header takes: its key length and value length.
const MIN_HEADER_BYTES: usize = 2;

/// The records of one batch, uncompressed, with kafka-protocol's own codecs.
fn decompress(records: &mut Bytes, compression: Compression) -> anyhow::Result<Bytes> {
    fn all(b: &mut Bytes) -> anyhow::Result<Bytes> {
        Ok(b.split_to(b.len()))
    }
    match compression {
        Compression::None => all(records),
        Compression::Gzip => codec::Gzip::decompress(records, all),
        Compression::Snappy => codec::Snappy::decompress(records, all),
        Compression::Lz4 => codec::Lz4::decompress(records, all),
        Compression::Zstd => codec::Zstd::decompress(records, all),
    }
}

/// An unsigned varint of at most `max_bytes` bytes, read as kafka-protocol reads it: one that
/// has not ended after `max_bytes` bytes ends there, and bits past the width are dropped.
fn uvarint(buf: &mut &[u8], max_bytes: usize) -> Option<u64> {
    let mut v: u64 = 0;
    for i in 0..max_bytes {
        let (&b, rest) = buf.split_first()?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            break;
        }
    }
    Some(v)
}

fn varint(buf: &mut &[u8]) -> Option<i32> {
    let z = uvarint(buf, 5)? as u32;
    Some(((z >> 1) as i32) ^ -((z & 1) as i32))
}

fn varlong(buf: &mut &[u8]) -> Option<i64> {
    let z = uvarint(buf, 10)?;
    Some(((z >> 1) as i64) ^ -((z & 1) as i64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::records::RecordBatchDecoder;
    use proptest::prelude::*;

    fn sample(n: usize) -> Vec<ProduceRecord> {
        (0..n)
            .map(|i| ProduceRecord {
                key: if i % 3 == 0 {
                    None
                } else {
                    Some(Bytes::from(format!("k{i}")))
                },
                value: Some(Bytes::from(vec![b'a' + (i % 26) as u8; 100 + i])),
                headers: vec![
                    Header {
                        key: "h1".into(),
                        value: Some(Bytes::from_static(b"v")),
                    },
                    Header {
                        key: "null".into(),
                        value: None,
                    },
                ],
                timestamp: Some(1_700_000_000_000 + i as i64),
            })
            .collect()
    }

    #[test]
    fn every_compression_round_trips_byte_exact() {
        for c in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let recs = sample(25);
            let bytes = encode_batch(&recs, c).expect("encode");
            let back = decode_batches(bytes).expect("decode");
            assert_eq!(back.len(), recs.len(), "{c:?}");
            for (i, (a, b)) in recs.iter().zip(&back).enumerate() {
                assert_eq!(b.offset, i as i64);
                assert_eq!(a.key, b.key, "{c:?}");
                assert_eq!(a.value, b.value, "{c:?}");
                assert_eq!(a.headers, b.headers, "{c:?}");
                assert_eq!(a.timestamp, Some(b.timestamp));
            }
        }
    }

    #[test]
    fn one_call_is_one_batch() {
        let bytes = encode_batch(&sample(10), Compression::None).expect("encode");
        let info = RecordBatchDecoder::decode_batch_info(&mut bytes.clone()).expect("headers");
        assert_eq!(info.len(), 1);
        assert_eq!(info[0].record_count, 10);
        assert_eq!(
            info[0].base_sequence, NO_SEQUENCE,
            "not an idempotent batch"
        );
    }

    #[test]
    fn partial_trailing_batch_is_ignored() {
        let mut two = BytesMut::new();
        two.extend_from_slice(&encode_batch(&sample(2), Compression::None).expect("encode"));
        let second = encode_batch(&sample(3), Compression::None).expect("encode");
        two.extend_from_slice(&second[..second.len() - 5]);
        let back = decode_batches(two.freeze()).expect("decode");
        assert_eq!(back.len(), 2);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut junk = BytesMut::new();
        junk.extend_from_slice(&[0u8; 8]);
        junk.extend_from_slice(&20i32.to_be_bytes());
        junk.extend_from_slice(&[0xffu8; 20]);
        assert!(decode_batches(junk.freeze()).is_err());
    }
    /// A batch with its CRC set right (CRC-32C of everything after the CRC field), as a broker
    /// would send it, so the decoder gets past its integrity check.
    fn with_crc(mut batch: Vec<u8>) -> Bytes {
        let mut crc = !0u32;
        for &b in &batch[21..] {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0x82f6_3b78
                } else {
                    crc >> 1
                };
            }
        }
        batch[17..21].copy_from_slice(&(!crc).to_be_bytes());
        Bytes::from(batch)
    }

    #[test]
    fn a_record_count_the_batch_cannot_hold_is_an_error_not_an_abort() {
        // Used to make kafka-protocol reserve room for i32::MAX records (~378 GB) and abort.
        for c in [Compression::None, Compression::Zstd] {
            let mut batch = encode_batch(&sample(1), c).expect("encode").to_vec();
            batch[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
            let err = decode_batches(with_crc(batch)).expect_err("must be refused");
            assert!(err.to_string().contains("record count"), "{c:?}: {err}");
        }
    }

    #[test]
    fn a_last_offset_delta_claiming_billions_of_records_sizes_nothing_by_it() {
        // The output is sized from the batch headers' offset spans: a span of i32::MAX offsets
        // over one record must not reserve room for them (~220 GB, an abort), only decode it.
        let mut batch = encode_batch(&sample(1), Compression::None)
            .expect("encode")
            .to_vec();
        batch[23..27].copy_from_slice(&i32::MAX.to_be_bytes());
        let data = with_crc(batch);
        assert_eq!(batch_spans(&data), vec![(0, i64::from(i32::MAX))]);
        let back = decode_batches(data).expect("one record");
        assert_eq!(back.len(), 1);
        assert!(back.capacity() < 64, "reserved {}", back.capacity());
    }

    #[test]
    fn a_header_count_the_record_cannot_hold_is_an_error_not_an_abort() {
        // One record: attributes, timestamp and offset deltas 0, null key and value, then a
        // header count of i32::MAX (used to make kafka-protocol reserve ~39 GB and abort).
        let batch = batch_of_raw_records(&[20, 0, 0, 0, 1, 1, 0xfe, 0xff, 0xff, 0xff, 0x0f]);
        let err = decode_batches(batch).expect_err("must be refused");
        assert!(err.to_string().contains("header count"), "{err}");
    }

    #[test]
    fn a_timestamp_delta_that_overflows_the_base_is_an_error_not_a_panic() {
        // Two records with timestamps 0 and 5 (deltas 0 and 5); the batch's first timestamp
        // (offset 27) then moved to i64::MAX - 2: base + 5 overflows. kafka-protocol adds them
        // with `+`, which panicked in debug builds.
        let two = [0, 5].map(|t| ProduceRecord {
            timestamp: Some(t),
            ..Default::default()
        });
        let mut batch = encode_batch(&two, Compression::None)
            .expect("encode")
            .to_vec();
        batch[27..35].copy_from_slice(&(i64::MAX - 2).to_be_bytes());
        let err = decode_batches(with_crc(batch)).expect_err("must be refused");
        assert!(
            err.to_string().contains("timestamp delta 5 overflows"),
            "{err}"
        );
        // At the edge it still decodes: base i64::MAX - 5 plus 5 is i64::MAX.
        let mut batch = encode_batch(&two, Compression::None)
            .expect("encode")
            .to_vec();
        batch[27..35].copy_from_slice(&(i64::MAX - 5).to_be_bytes());
        let back = decode_batches(with_crc(batch)).expect("decodes");
        assert_eq!(back[1].timestamp, i64::MAX);
    }

    #[test]
    fn an_offset_delta_that_overflows_the_base_offset_is_an_error_not_a_panic() {
        let two = [0, 5].map(|t| ProduceRecord {
            timestamp: Some(t),
            ..Default::default()
        });
        let mut batch = encode_batch(&two, Compression::None)
            .expect("encode")
            .to_vec();
        batch[0..8].copy_from_slice(&i64::MAX.to_be_bytes()); // base offset (not under the CRC)
        let err = decode_batches(Bytes::from(batch)).expect_err("must be refused");
        assert!(
            err.to_string().contains("offset delta 1 overflows"),
            "{err}"
        );
    }

    /// One batch at `offset`: `producer`'s records, transactional or not, or its marker
    /// (`marker`: Some(commit)).
    fn raw_batch(
        offset: i64,
        producer: i64,
        transactional: bool,
        marker: Option<bool>,
        n: usize,
    ) -> Bytes {
        let records: Vec<Record> = (0..n)
            .map(|i| Record {
                transactional,
                control: marker.is_some(),
                delete_horizon: false,
                partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
                producer_id: producer,
                producer_epoch: 0,
                timestamp_type: TimestampType::Creation,
                offset: offset + i as i64,
                sequence: i as i32,
                timestamp: 0,
                // A marker's key: version 0, then its type (0 abort, 1 commit).
                key: marker.map(|commit| Bytes::from(vec![0, 0, 0, u8::from(commit)])),
                value: Some(Bytes::from(format!("{}", offset + i as i64))),
                headers: IndexMap::new(),
            })
            .collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .expect("encodes");
        buf.freeze()
    }

    #[test]
    fn a_committed_read_drops_aborted_transactions_and_markers_and_reads_past_them() {
        let mut data = BytesMut::new();
        // Producer 7 aborts offsets 0-1 (marker at 2); producer 8 commits 3 (marker at 4); a
        // plain record at 5; producer 7 again, committed this time, at 6 (marker at 7).
        data.extend_from_slice(&raw_batch(0, 7, true, None, 2));
        data.extend_from_slice(&raw_batch(2, 7, true, Some(false), 1));
        data.extend_from_slice(&raw_batch(3, 8, true, None, 1));
        data.extend_from_slice(&raw_batch(4, 8, true, Some(true), 1));
        data.extend_from_slice(&raw_batch(5, -1, false, None, 1));
        data.extend_from_slice(&raw_batch(6, 7, true, None, 1));
        data.extend_from_slice(&raw_batch(7, 7, true, Some(true), 1));
        let aborted = [AbortedTransaction {
            producer_id: 7,
            first_offset: 0,
        }];
        let read = decode_committed(data.freeze(), &aborted).expect("decodes");
        let offsets: Vec<i64> = read.records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, vec![3, 5, 6]);
        assert_eq!(read.next_offset, Some(8), "past the last marker");
        let empty = decode_committed(Bytes::new(), &aborted).expect("decodes");
        assert_eq!(empty.next_offset, None);
    }

    #[test]
    fn a_producers_marker_is_found_after_its_records_and_tells_commit_from_abort() {
        let mut data = BytesMut::new();
        // Producer 7's records at 0-1, producer 8's commit at 2-3, producer 7's abort at 4,
        // then producer 7 again with a commit at 6.
        data.extend_from_slice(&raw_batch(0, 7, true, None, 2));
        data.extend_from_slice(&raw_batch(2, 8, true, None, 1));
        data.extend_from_slice(&raw_batch(3, 8, true, Some(true), 1));
        data.extend_from_slice(&raw_batch(4, 7, true, Some(false), 1));
        data.extend_from_slice(&raw_batch(5, 7, true, None, 1));
        data.extend_from_slice(&raw_batch(6, 7, true, Some(true), 1));
        let data = data.freeze();
        let (m, next) = find_marker(data.clone(), 7, 0).expect("decodes");
        assert_eq!(
            m,
            Some(TxnMarker {
                offset: 4,
                commit: false
            })
        );
        assert_eq!(next, Some(7));
        let (m, _) = find_marker(data.clone(), 7, 5).expect("decodes");
        assert_eq!(
            m,
            Some(TxnMarker {
                offset: 6,
                commit: true
            })
        );
        // Another producer's marker is not this one's; none after the last offset read.
        let (m, _) = find_marker(data.clone(), 9, 0).expect("decodes");
        assert_eq!(m, None);
        let (m, next) = find_marker(data.slice(0..0), 7, 0).expect("decodes");
        assert_eq!((m, next), (None, None));
    }

    #[test]
    fn batch_spans_cover_complete_batches_only() {
        let mut two = BytesMut::new();
        let mut first = encode_batch(&sample(3), Compression::None)
            .expect("encode")
            .to_vec();
        first[0..8].copy_from_slice(&100i64.to_be_bytes());
        two.extend_from_slice(&first);
        let second = encode_batch(&sample(2), Compression::Lz4).expect("encode");
        two.extend_from_slice(&second);
        assert_eq!(batch_spans(&two), vec![(100, 102), (0, 1)]);
        // The second batch cut short: only the first counts.
        assert_eq!(batch_spans(&two[..two.len() - 1]), vec![(100, 102)]);
        // A negative last offset delta covers nothing.
        first[23..27].copy_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(batch_spans(&first), vec![]);
        assert!(batch_spans(&[]).is_empty());
    }

    #[test]
    fn many_small_records_and_headers_still_decode() {
        // The count checks are lower bounds on bytes: the smallest records and headers pass.
        let tiny: Vec<ProduceRecord> = (0..500)
            .map(|_| ProduceRecord {
                headers: (0..20)
                    .map(|i| Header {
                        key: format!("{i}"),
                        value: None,
                    })
                    .collect(),
                timestamp: Some(0),
                ..Default::default()
            })
            .collect();
        for c in [Compression::None, Compression::Gzip, Compression::Lz4] {
            let back = decode_batches(encode_batch(&tiny, c).expect("encode")).expect("decode");
            assert_eq!(back.len(), 500, "{c:?}");
            assert!(back.iter().all(|r| r.headers.len() == 20), "{c:?}");
        }
        let empty: Vec<ProduceRecord> = (0..1000)
            .map(|_| ProduceRecord {
                timestamp: Some(0),
                ..Default::default()
            })
            .collect();
        let back = decode_batches(encode_batch(&empty, Compression::Zstd).expect("encode"))
            .expect("decode");
        assert_eq!(back.len(), 1000);
    }

    /// kafka-protocol's decoder, the oracle: what it makes of `data`, as records.
    fn oracle(mut data: Bytes) -> Option<Vec<ConsumedRecord>> {
        let mut out = Vec::new();
        while data.len() >= 12 {
            let set = RecordBatchDecoder::decode_with_custom_compression(
                &mut data,
                Some(|records: &mut Bytes, compression: Compression| {
                    decompress(records, compression)
                }),
            )
            .ok()?;
            out.extend(set.records.into_iter().filter(|r| !r.control).map(|r| {
                ConsumedRecord {
                    offset: r.offset,
                    timestamp: r.timestamp,
                    key: r.key,
                    value: r.value,
                    headers: r
                        .headers
                        .into_iter()
                        .map(|(k, v)| Header {
                            key: k.as_str().to_owned(),
                            value: v,
                        })
                        .collect(),
                }
            }));
        }
        Some(out)
    }

    fn header_strategy() -> impl Strategy<Value = Header> {
        (
            prop_oneof![Just("a".to_owned()), Just("b".to_owned()), "[a-z]{0,6}"],
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8)),
        )
            .prop_map(|(key, value)| Header {
                key,
                value: value.map(Bytes::from),
            })
    }

    fn record_strategy() -> impl Strategy<Value = ProduceRecord> {
        (
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..12)),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
            proptest::collection::vec(header_strategy(), 0..5),
            -1_000_000i64..1_000_000,
        )
            .prop_map(|(key, value, headers, ts)| ProduceRecord {
                key: key.map(Bytes::from),
                value: value.map(Bytes::from),
                headers,
                timestamp: Some(1_700_000_000_000 + ts),
            })
    }

    proptest! {
        /// The batches decode to what kafka-protocol's decoder makes of them (repeated header
        /// keys included), in every codec; and a batch with any one byte of its records
        /// changed (its CRC made right again, as a lying broker would) decodes to the same as
        /// the oracle's whenever it decodes at all, and never panics.
        #[test]
        fn batches_decode_as_kafka_protocol_decodes_them(
            records in proptest::collection::vec(record_strategy(), 1..20),
            codec in prop_oneof![
                Just(Compression::None), Just(Compression::Gzip), Just(Compression::Snappy),
                Just(Compression::Lz4), Just(Compression::Zstd)
            ],
            flip in proptest::option::of((any::<prop::sample::Index>(), 1u8..=255)),
        ) {
            let encoded = encode_batch(&records, codec).expect("encode");
            let ours = decode_batches(encoded.clone()).expect("decodes");
            prop_assert_eq!(Some(ours.clone()), oracle(encoded.clone()));
            prop_assert_eq!(ours.len(), records.len());
            for (r, p) in ours.iter().zip(&records) {
                prop_assert_eq!(&r.value, &p.value);
                prop_assert_eq!(&r.key, &p.key);
                prop_assert_eq!(Some(r.timestamp), p.timestamp);
            }
            if let Some((at, x)) = flip {
                let mut bytes = encoded.to_vec();
                let i = BATCH_HEADER_BYTES + at.index(bytes.len() - BATCH_HEADER_BYTES);
                bytes[i] ^= x;
                let changed = with_crc(bytes);
                if let Ok(ours) = decode_batches(changed.clone()) {
                    prop_assert_eq!(Some(ours), oracle(changed));
                }
            }
        }
    }

    fn zigzag(out: &mut Vec<u8>, v: i64) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        while z >= 0x80 {
            out.push((z as u8) | 0x80);
            z >>= 7;
        }
        out.push(z as u8);
    }

    /// One uncompressed batch at offset 0 of one record with `headers`, encoded by hand (the
    /// encoders here key headers by name, so they cannot write a repeated key).
    fn batch_with_headers(headers: &[(&str, &[u8])]) -> Bytes {
        let mut rec = vec![0u8]; // attributes
        zigzag(&mut rec, 0); // timestamp delta
        zigzag(&mut rec, 0); // offset delta
        zigzag(&mut rec, -1); // null key
        zigzag(&mut rec, 1);
        rec.push(b'v');
        zigzag(&mut rec, headers.len() as i64);
        for (k, v) in headers {
            zigzag(&mut rec, k.len() as i64);
            rec.extend_from_slice(k.as_bytes());
            zigzag(&mut rec, v.len() as i64);
            rec.extend_from_slice(v);
        }
        let mut records = Vec::new();
        zigzag(&mut records, rec.len() as i64);
        records.extend_from_slice(&rec);
        batch_of_raw_records(&records)
    }

    /// An uncompressed batch at offset 0 whose records are the bytes `records` (its header
    /// claims one record), its length and CRC set right, as a broker would send it.
    fn batch_of_raw_records(records: &[u8]) -> Bytes {
        let mut batch = encode_batch(
            &[ProduceRecord {
                timestamp: Some(0),
                ..Default::default()
            }],
            Compression::None,
        )
        .expect("encode")
        .to_vec();
        batch.truncate(BATCH_HEADER_BYTES);
        batch.extend_from_slice(records);
        let len = i32::try_from(batch.len() - 12).expect("small");
        batch[8..12].copy_from_slice(&len.to_be_bytes());
        with_crc(batch)
    }

    #[test]
    fn a_repeated_header_key_keeps_its_first_place_and_its_last_value_as_the_oracle_does() {
        let few = batch_with_headers(&[("a", b"1"), ("b", b"2"), ("a", b"3")]);
        let back = decode_batches(few.clone()).expect("decodes");
        let got: Vec<(&str, Option<&[u8]>)> = back[0]
            .headers
            .iter()
            .map(|h| (h.key.as_str(), h.value.as_deref()))
            .collect();
        assert_eq!(got, vec![("a", Some(&b"3"[..])), ("b", Some(&b"2"[..]))]);
        assert_eq!(Some(back), oracle(few));
        // Past sixteen headers the places are kept in a map: the same answer.
        let keys: Vec<String> = (0..40).map(|i| format!("k{}", i % 25)).collect();
        let values: Vec<Vec<u8>> = (0..40).map(|i: u8| vec![i]).collect();
        let many: Vec<(&str, &[u8])> = keys
            .iter()
            .zip(&values)
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        let many = batch_with_headers(&many);
        let back = decode_batches(many.clone()).expect("decodes");
        assert_eq!(back[0].headers.len(), 25);
        assert_eq!(back[0].headers[3].value.as_deref(), Some(&[28u8][..]));
        assert_eq!(Some(back), oracle(many));
    }
}

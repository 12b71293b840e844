//! Records as sharehost sees them, and their conversion to and from Kafka record batches
//! (kafka-protocol does the batch format and every compression codec).

use bytes::{Bytes, BytesMut};
use kafka_protocol::compression::{self as codec, Decompressor};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    NO_PARTITION_LEADER_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, Record,
    RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

pub use kafka_protocol::records::Compression;

/// One record header. Kafka allows repeated keys; note that kafka-protocol's batch codec keys
/// headers by name, so a repeated key keeps only its last value.
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

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Encodes records as one v2 record batch with `compression`.
pub fn encode_batch(
    records: &[ProduceRecord],
    compression: Compression,
) -> Result<Bytes, RecordsError> {
    let now = now_ms();
    let converted: Vec<Record> = records
        .iter()
        .enumerate()
        .map(|(i, r)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
            producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_PRODUCER_EPOCH,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // The encoder starts a new batch whenever offset - sequence changes; keeping it
            // constant with a base sequence of -1 (no idempotence) yields one batch.
            sequence: NO_SEQUENCE.wrapping_add(i as i32),
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
pub fn decode_batches(mut data: Bytes) -> Result<Vec<ConsumedRecord>, RecordsError> {
    let mut out = Vec::new();
    while data.len() >= 12 {
        // Batch header: base offset (8) then batch length (4) counting the bytes after it.
        let batch_len = i32::from_be_bytes([data[8], data[9], data[10], data[11]]);
        if batch_len < 0 {
            return Err(RecordsError(format!(
                "negative record batch length {batch_len}"
            )));
        }
        if data.len() < 12 + batch_len as usize {
            break; // partial trailing batch
        }
        // Offset 57 of a v2 batch: its record count (the decoder checks magic and CRC itself).
        let record_count = data
            .get(57..61)
            .map_or(0, |b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        let set = RecordBatchDecoder::decode_with_custom_compression(
            &mut data,
            Some(|records: &mut Bytes, compression: Compression| {
                let plain = decompress(records, compression)?;
                check_counts(&plain, record_count)?;
                Ok(plain)
            }),
        )
        .map_err(|e| RecordsError(format!("cannot decode record batch: {e}")))?;
        for r in set.records {
            if r.control {
                continue;
            }
            out.push(ConsumedRecord {
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
            });
        }
    }
    Ok(out)
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

/// Refuses counts that cannot fit in the uncompressed records, before kafka-protocol sees them:
/// it reserves room for `record_count` records, and for each record's header count, up front,
/// and an allocation that large fails and aborts the whole process. A batch of 72 bytes with a
/// correct CRC could do that (found by fuzzing, see docs/reliability.md).
///
/// Walks the records only as far as they are well formed: the decoder stops with an error at the
/// first malformed one, before it reserves anything for the records after it.
fn check_counts(records: &[u8], record_count: i32) -> Result<(), RecordsError> {
    let Ok(count) = usize::try_from(record_count) else {
        return Ok(()); // negative: the decoder refuses it
    };
    if count > records.len() / MIN_RECORD_BYTES {
        return Err(RecordsError(format!(
            "record count {count} cannot fit in {} bytes of records",
            records.len()
        )));
    }
    let mut rest = records;
    for _ in 0..count {
        let Some(size) = varint(&mut rest).and_then(|n| usize::try_from(n).ok()) else {
            return Ok(());
        };
        let Some(mut record) = rest.get(..size) else {
            return Ok(());
        };
        rest = &rest[size..];
        // Attributes, timestamp delta, offset delta, key, value; then the header count.
        if record.is_empty() {
            return Ok(());
        }
        record = &record[1..];
        if varlong(&mut record).is_none() || varint(&mut record).is_none() {
            return Ok(());
        }
        for _ in 0..2 {
            let Some(len) = varint(&mut record) else {
                return Ok(());
            };
            if let Ok(len) = usize::try_from(len) {
                let Some(tail) = record.get(len..) else {
                    return Ok(());
                };
                record = tail;
            }
        }
        let Some(headers) = varint(&mut record).and_then(|n| usize::try_from(n).ok()) else {
            return Ok(());
        };
        if headers > record.len() / MIN_HEADER_BYTES {
            return Err(RecordsError(format!(
                "header count {headers} cannot fit in the {} bytes left of its record",
                record.len()
            )));
        }
    }
    Ok(())
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
    fn a_header_count_the_record_cannot_hold_is_an_error_not_an_abort() {
        // One record: attributes, timestamp and offset deltas 0, null key and value, then a
        // header count of i32::MAX (used to make kafka-protocol reserve ~39 GB and abort).
        let mut batch = encode_batch(
            &[ProduceRecord {
                timestamp: Some(0),
                ..Default::default()
            }],
            Compression::None,
        )
        .expect("encode")
        .to_vec();
        batch.truncate(61);
        batch.extend_from_slice(&[20, 0, 0, 0, 1, 1, 0xfe, 0xff, 0xff, 0xff, 0x0f]);
        let len = i32::try_from(batch.len() - 12).expect("small");
        batch[8..12].copy_from_slice(&len.to_be_bytes());
        let err = decode_batches(with_crc(batch)).expect_err("must be refused");
        assert!(err.to_string().contains("header count"), "{err}");
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
}

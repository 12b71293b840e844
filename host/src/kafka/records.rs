//! Records as sharehost sees them, and their conversion to and from Kafka record batches
//! (kafka-protocol does the batch format and every compression codec).

use bytes::{Bytes, BytesMut};
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
        let set = RecordBatchDecoder::decode(&mut data)
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
}

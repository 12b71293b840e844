//! DescribeShareGroupOffsets (API 90) v0-1: a share group's start offset and, from v1
//! (KIP-1226, Kafka 4.2), its lag per partition, as the group coordinator reports them. The
//! host exports the lag as a metric, so an operator (and an autoscaler) sees the backlog the
//! way Apache's ShareGroupCommand shows it.
//!
//! Written by hand: kafka-protocol's message stops at v0, without `Lag`. Field lists follow
//! the Kafka 4.2+ schemas (`DescribeShareGroupOffsetsRequest.json`, `...Response.json`).

use anyhow::{Result, bail};
use bytes::BytesMut;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::buf::{ByteBuf, ByteBufMut};
use kafka_protocol::protocol::{
    Decodable, Encodable, HeaderVersion, Message, Request, VersionRange,
};
use uuid::Uuid;

use super::codec::*;
use crate::{KafkaClient, KafkaError};

/// Versions of DescribeShareGroupOffsets spoken here.
pub const OFFSETS_VERSIONS: VersionRange = VersionRange { min: 0, max: 1 };

/// Asks for every topic-partition of one group (null topics: all of them).
#[derive(Debug, Clone, PartialEq)]
pub struct DescribeShareGroupOffsetsRequest {
    /// The share group.
    pub group_id: String,
}

/// One partition of the answer.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionOffsets {
    /// The topic's name.
    pub topic: String,
    /// The topic's id.
    pub topic_id: Uuid,
    /// The partition.
    pub partition: i32,
    /// The share-partition start offset (SPSO): everything below it is done.
    pub start_offset: i64,
    /// Records from the start offset to the end not yet acknowledged (v1); -1 when the broker
    /// does not know it (v0, or a partition it has no state for yet).
    pub lag: i64,
    /// The partition's error code (0: none).
    pub error_code: i16,
}

/// The answer for the group.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DescribeShareGroupOffsetsResponse {
    /// The group's own error code (0: none).
    pub error_code: i16,
    /// The group's error message, if any.
    pub error_message: Option<String>,
    /// Every partition the group has state for.
    pub partitions: Vec<PartitionOffsets>,
}

fn size_of<T: Encodable>(msg: &T, version: i16) -> Result<usize> {
    let mut b = BytesMut::new();
    msg.encode(&mut b, version)?;
    Ok(b.len())
}

fn check(version: i16) -> Result<()> {
    if !(OFFSETS_VERSIONS.min..=OFFSETS_VERSIONS.max).contains(&version) {
        bail!("DescribeShareGroupOffsets version {version} is not supported (0-1)");
    }
    Ok(())
}

impl Encodable for DescribeShareGroupOffsetsRequest {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> Result<()> {
        check(version)?;
        put_array_len(buf, 1)?;
        put_compact_str(buf, Some(&self.group_id))?;
        // Topics: null (every topic-partition of the group).
        put_uvarint(buf, 0);
        put_no_tags(buf);
        put_no_tags(buf);
        Ok(())
    }

    fn compute_size(&self, version: i16) -> Result<usize> {
        size_of(self, version)
    }
}

impl Decodable for DescribeShareGroupOffsetsRequest {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> Result<Self> {
        check(version)?;
        if get_array_len(buf, 2)? != 1 {
            bail!("one group per request");
        }
        let group_id = get_compact_str(buf)?.unwrap_or_default();
        if get_uvarint(buf)? != 0 {
            bail!("only null topics are decoded");
        }
        skip_tags(buf)?;
        skip_tags(buf)?;
        Ok(Self { group_id })
    }
}

impl Encodable for DescribeShareGroupOffsetsResponse {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> Result<()> {
        check(version)?;
        put_i32(buf, 0);
        put_array_len(buf, 1)?;
        put_compact_str(buf, Some(""))?;
        let mut topics: Vec<(&str, Uuid, Vec<&PartitionOffsets>)> = Vec::new();
        for p in &self.partitions {
            match topics.iter_mut().find(|(t, _, _)| *t == p.topic) {
                Some((_, _, ps)) => ps.push(p),
                None => topics.push((&p.topic, p.topic_id, vec![p])),
            }
        }
        put_array_len(buf, topics.len())?;
        for (name, id, ps) in topics {
            put_compact_str(buf, Some(name))?;
            put_uuid(buf, &id);
            put_array_len(buf, ps.len())?;
            for p in ps {
                put_i32(buf, p.partition);
                put_i64(buf, p.start_offset);
                put_i32(buf, -1);
                if version >= 1 {
                    put_i64(buf, p.lag);
                }
                put_i16(buf, p.error_code);
                put_compact_str(buf, None)?;
                put_no_tags(buf);
            }
            put_no_tags(buf);
        }
        put_i16(buf, self.error_code);
        put_compact_str(buf, self.error_message.as_deref())?;
        put_no_tags(buf);
        put_no_tags(buf);
        Ok(())
    }

    fn compute_size(&self, version: i16) -> Result<usize> {
        size_of(self, version)
    }
}

impl Decodable for DescribeShareGroupOffsetsResponse {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> Result<Self> {
        check(version)?;
        let _throttle = get_i32(buf)?;
        let mut out = DescribeShareGroupOffsetsResponse::default();
        let groups = get_array_len(buf, 4)?;
        for _ in 0..groups {
            let _group = get_compact_str(buf)?;
            // Smallest topic: empty name, uuid, empty partitions, tags (19 bytes).
            let topics = get_array_len(buf, 19)?;
            for _ in 0..topics {
                let topic = get_compact_str(buf)?.unwrap_or_default();
                let topic_id = get_uuid(buf)?;
                // Smallest partition (v0): 4 + 8 + 4 + 2 + null message + tags.
                let partitions = get_array_len(buf, 12)?;
                for _ in 0..partitions {
                    let partition = get_i32(buf)?;
                    let start_offset = get_i64(buf)?;
                    let _leader_epoch = get_i32(buf)?;
                    let lag = if version >= 1 { get_i64(buf)? } else { -1 };
                    let error_code = get_i16(buf)?;
                    let _message = get_compact_str(buf)?;
                    skip_tags(buf)?;
                    out.partitions.push(PartitionOffsets {
                        topic: topic.clone(),
                        topic_id,
                        partition,
                        start_offset,
                        lag,
                        error_code,
                    });
                }
                skip_tags(buf)?;
            }
            out.error_code = get_i16(buf)?;
            out.error_message = get_compact_str(buf)?;
            skip_tags(buf)?;
        }
        skip_tags(buf)?;
        Ok(out)
    }
}

impl Message for DescribeShareGroupOffsetsRequest {
    const VERSIONS: VersionRange = OFFSETS_VERSIONS;
    const DEPRECATED_VERSIONS: Option<VersionRange> = None;
}
impl Message for DescribeShareGroupOffsetsResponse {
    const VERSIONS: VersionRange = OFFSETS_VERSIONS;
    const DEPRECATED_VERSIONS: Option<VersionRange> = None;
}
impl HeaderVersion for DescribeShareGroupOffsetsRequest {
    fn header_version(_version: i16) -> i16 {
        2
    }
}
impl HeaderVersion for DescribeShareGroupOffsetsResponse {
    fn header_version(_version: i16) -> i16 {
        1
    }
}
impl Request for DescribeShareGroupOffsetsRequest {
    const KEY: i16 = 90;
    type Response = DescribeShareGroupOffsetsResponse;
}

/// The group's offsets and lag per partition, asked of its coordinator.
pub async fn share_group_offsets(
    client: &KafkaClient,
    group: &str,
) -> Result<Vec<PartitionOffsets>, KafkaError> {
    let coordinator = client.find_coordinator(group).await?;
    let conn = client.connection(coordinator).await?;
    let version = conn.version_for(ApiKey::DescribeShareGroupOffsets, OFFSETS_VERSIONS)?;
    let req = DescribeShareGroupOffsetsRequest {
        group_id: group.to_owned(),
    };
    let resp = conn
        .send_version(&req, version, conn.request_timeout())
        .await?;
    if let Some(e) = KafkaError::from_code(
        conn.broker(),
        ApiKey::DescribeShareGroupOffsets,
        version,
        resp.error_code,
        resp.error_message.as_deref(),
    ) {
        return Err(e);
    }
    Ok(resp.partitions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_round_trips_in_both_versions_and_v0_has_no_lag() {
        let resp = DescribeShareGroupOffsetsResponse {
            error_code: 0,
            error_message: None,
            partitions: vec![
                PartitionOffsets {
                    topic: "orders".into(),
                    topic_id: Uuid::from_u128(7),
                    partition: 0,
                    start_offset: 100,
                    lag: 42,
                    error_code: 0,
                },
                PartitionOffsets {
                    topic: "orders".into(),
                    topic_id: Uuid::from_u128(7),
                    partition: 1,
                    start_offset: 5,
                    lag: 0,
                    error_code: 0,
                },
            ],
        };
        for version in [0, 1] {
            let mut b = BytesMut::new();
            resp.encode(&mut b, version).expect("encodes");
            let mut bytes = b.freeze();
            let back =
                DescribeShareGroupOffsetsResponse::decode(&mut bytes, version).expect("decodes");
            assert!(bytes.is_empty());
            let lags: Vec<i64> = back.partitions.iter().map(|p| p.lag).collect();
            assert_eq!(
                lags,
                if version == 1 {
                    vec![42, 0]
                } else {
                    vec![-1, -1]
                }
            );
            assert_eq!(back.partitions[0].start_offset, 100);
        }
    }

    #[test]
    fn a_truncated_response_is_an_error_not_a_panic() {
        let resp = DescribeShareGroupOffsetsResponse {
            partitions: vec![PartitionOffsets {
                topic: "t".into(),
                topic_id: Uuid::nil(),
                partition: 0,
                start_offset: 0,
                lag: 1,
                error_code: 0,
            }],
            ..Default::default()
        };
        let mut b = BytesMut::new();
        resp.encode(&mut b, 1).expect("encodes");
        let whole = b.freeze();
        for cut in 0..whole.len() {
            let mut part = whole.slice(..cut);
            assert!(DescribeShareGroupOffsetsResponse::decode(&mut part, 1).is_err());
        }
    }
}

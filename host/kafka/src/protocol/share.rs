//! ShareFetch and ShareAcknowledge, versions 1 and 2, as plain data with their encoders and
//! decoders. kafka-protocol covers these only up to v1; v2 adds ShareAcquireMode and IsRenewAck
//! (KIP-1206, KIP-1222), which the engine needs. Field lists follow the Kafka 4.2+ schemas.
//!
//! The types implement kafka-protocol's public `Request`/`Encodable`/`Decodable` traits so they
//! travel through the same connection code as every other message.

use anyhow::{Result, bail};
use bytes::{Bytes, BytesMut};
use kafka_protocol::protocol::buf::{ByteBuf, ByteBufMut};
use kafka_protocol::protocol::{
    Decodable, Encodable, HeaderVersion, Message, Request, VersionRange,
};
use uuid::Uuid;

use super::codec::*;

/// Versions of ShareFetch and ShareAcknowledge this engine speaks.
pub const SHARE_VERSIONS: VersionRange = VersionRange { min: 1, max: 2 };

/// Acknowledgement type codes on the wire.
pub mod ack_type {
    /// An acquired offset without a record (compacted, control batch); the broker archives it.
    pub const GAP: i8 = 0;
    /// Processed: never delivered again.
    pub const ACCEPT: i8 = 1;
    /// Give back for redelivery (delivery count is kept).
    pub const RELEASE: i8 = 2;
    /// Unprocessable: archived, never delivered again.
    pub const REJECT: i8 = 3;
    /// Keep the lock (v2 with IsRenewAck only).
    pub const RENEW: i8 = 4;
}

/// One acknowledgement batch: an inclusive offset range with one type for all of it or one per
/// offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckBatch {
    /// First offset.
    pub first_offset: i64,
    /// Last offset, inclusive.
    pub last_offset: i64,
    /// One type for the whole range, or exactly one per offset.
    pub types: Vec<i8>,
}

/// Acknowledgements (and, for ShareFetch, session membership) of one partition.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PartitionAcks {
    /// Partition index.
    pub partition: i32,
    /// Batches, ascending and non-overlapping.
    pub batches: Vec<AckBatch>,
}

/// Partitions of one topic in a request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TopicAcks {
    /// Topic id.
    pub topic_id: Uuid,
    /// Its partitions.
    pub partitions: Vec<PartitionAcks>,
}

/// Partitions to drop from a share session.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ForgottenTopic {
    /// Topic id.
    pub topic_id: Uuid,
    /// Partition indexes.
    pub partitions: Vec<i32>,
}

/// ShareFetch request (API key 78).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShareFetchRequest {
    /// Share group id (never null: the broker rejects null).
    pub group_id: String,
    /// The member id the heartbeat uses.
    pub member_id: String,
    /// 0 opens, -1 closes, otherwise the next epoch.
    pub share_session_epoch: i32,
    /// Long-poll time.
    pub max_wait_ms: i32,
    /// Minimum bytes before answering.
    pub min_bytes: i32,
    /// Maximum bytes in the response.
    pub max_bytes: i32,
    /// Record budget for the whole request (v1+).
    pub max_records: i32,
    /// Preferred acquired-range and ack batch size (v1+).
    pub batch_size: i32,
    /// 0 batch-optimized, 1 record-limit (v2+).
    pub share_acquire_mode: i8,
    /// True when any ack is Renew (v2+); then all limits must be 0.
    pub is_renew_ack: bool,
    /// Partitions to add to the session and/or acknowledge.
    pub topics: Vec<TopicAcks>,
    /// Partitions to remove from the session.
    pub forgotten_topics: Vec<ForgottenTopic>,
}

/// The leader a partition error points to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaderIdAndEpoch {
    /// New leader id, -1 when unknown.
    pub leader_id: i32,
    /// Its epoch.
    pub leader_epoch: i32,
}

/// An offset range acquired by this member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquiredRange {
    /// First offset.
    pub first_offset: i64,
    /// Last offset, inclusive.
    pub last_offset: i64,
    /// How many times these records have been delivered, this time included.
    pub delivery_count: i16,
}

/// One partition of a ShareFetch response.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FetchPartitionData {
    /// Partition index.
    pub partition: i32,
    /// Fetch error.
    pub error_code: i16,
    /// Fetch error text.
    pub error_message: Option<String>,
    /// Result of the piggybacked acknowledgements.
    pub acknowledge_error_code: i16,
    /// Its text.
    pub acknowledge_error_message: Option<String>,
    /// New leader hint on leadership errors.
    pub current_leader: LeaderIdAndEpoch,
    /// Record batches (may include records not acquired by us).
    pub records: Bytes,
    /// What we own.
    pub acquired: Vec<AcquiredRange>,
}

/// One topic of a ShareFetch response.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FetchTopicResponse {
    /// Topic id.
    pub topic_id: Uuid,
    /// Its partitions.
    pub partitions: Vec<FetchPartitionData>,
}

/// A broker endpoint named in a response (new leaders).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeEndpoint {
    /// Node id.
    pub node_id: i32,
    /// Host.
    pub host: String,
    /// Port.
    pub port: i32,
    /// Rack.
    pub rack: Option<String>,
}

/// ShareFetch response.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShareFetchResponse {
    /// Throttle time.
    pub throttle_time_ms: i32,
    /// Top-level error (session errors).
    pub error_code: i16,
    /// Its text.
    pub error_message: Option<String>,
    /// Lock duration of the acquired records.
    pub acquisition_lock_timeout_ms: i32,
    /// Per-topic results.
    pub responses: Vec<FetchTopicResponse>,
    /// Endpoints of new leaders.
    pub node_endpoints: Vec<NodeEndpoint>,
}

/// ShareAcknowledge request (API key 79).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShareAcknowledgeRequest {
    /// Share group id.
    pub group_id: String,
    /// Member id.
    pub member_id: String,
    /// Next epoch (never 0), or -1 to close.
    pub share_session_epoch: i32,
    /// True when any ack is Renew (v2+).
    pub is_renew_ack: bool,
    /// Acknowledgements.
    pub topics: Vec<TopicAcks>,
}

/// One partition of a ShareAcknowledge response.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AckPartitionResult {
    /// Partition index.
    pub partition: i32,
    /// Ack error.
    pub error_code: i16,
    /// Its text.
    pub error_message: Option<String>,
    /// New leader hint.
    pub current_leader: LeaderIdAndEpoch,
}

/// One topic of a ShareAcknowledge response.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AckTopicResult {
    /// Topic id.
    pub topic_id: Uuid,
    /// Its partitions.
    pub partitions: Vec<AckPartitionResult>,
}

/// ShareAcknowledge response.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShareAcknowledgeResponse {
    /// Throttle time.
    pub throttle_time_ms: i32,
    /// Top-level error.
    pub error_code: i16,
    /// Its text.
    pub error_message: Option<String>,
    /// Lock duration (v2+).
    pub acquisition_lock_timeout_ms: i32,
    /// Per-topic results.
    pub responses: Vec<AckTopicResult>,
    /// Endpoints of new leaders.
    pub node_endpoints: Vec<NodeEndpoint>,
}

fn check_version(version: i16) -> Result<()> {
    if !(SHARE_VERSIONS.min..=SHARE_VERSIONS.max).contains(&version) {
        bail!("share message version {version} is not supported (1-2)");
    }
    Ok(())
}

fn put_topics<B: ByteBufMut>(buf: &mut B, topics: &[TopicAcks]) -> Result<()> {
    put_array_len(buf, topics.len())?;
    for t in topics {
        put_uuid(buf, &t.topic_id);
        put_array_len(buf, t.partitions.len())?;
        for p in &t.partitions {
            put_i32(buf, p.partition);
            put_array_len(buf, p.batches.len())?;
            for b in &p.batches {
                put_i64(buf, b.first_offset);
                put_i64(buf, b.last_offset);
                put_array_len(buf, b.types.len())?;
                for t in &b.types {
                    put_i8(buf, *t);
                }
                put_no_tags(buf);
            }
            put_no_tags(buf);
        }
        put_no_tags(buf);
    }
    Ok(())
}

fn get_topics<B: ByteBuf>(buf: &mut B) -> Result<Vec<TopicAcks>> {
    let n = get_array_len(buf, 18)?;
    let mut topics = Vec::with_capacity(n);
    for _ in 0..n {
        let topic_id = get_uuid(buf)?;
        let np = get_array_len(buf, 6)?;
        let mut partitions = Vec::with_capacity(np);
        for _ in 0..np {
            let partition = get_i32(buf)?;
            let nb = get_array_len(buf, 18)?;
            let mut batches = Vec::with_capacity(nb);
            for _ in 0..nb {
                let first_offset = get_i64(buf)?;
                let last_offset = get_i64(buf)?;
                let nt = get_array_len(buf, 1)?;
                let mut types = Vec::with_capacity(nt);
                for _ in 0..nt {
                    types.push(get_i8(buf)?);
                }
                skip_tags(buf)?;
                batches.push(AckBatch {
                    first_offset,
                    last_offset,
                    types,
                });
            }
            skip_tags(buf)?;
            partitions.push(PartitionAcks { partition, batches });
        }
        skip_tags(buf)?;
        topics.push(TopicAcks {
            topic_id,
            partitions,
        });
    }
    Ok(topics)
}

fn put_endpoints<B: ByteBufMut>(buf: &mut B, eps: &[NodeEndpoint]) -> Result<()> {
    put_array_len(buf, eps.len())?;
    for e in eps {
        put_i32(buf, e.node_id);
        put_compact_str(buf, Some(&e.host))?;
        put_i32(buf, e.port);
        put_compact_str(buf, e.rack.as_deref())?;
        put_no_tags(buf);
    }
    Ok(())
}

fn get_endpoints<B: ByteBuf>(buf: &mut B) -> Result<Vec<NodeEndpoint>> {
    let n = get_array_len(buf, 11)?;
    let mut eps = Vec::with_capacity(n);
    for _ in 0..n {
        let node_id = get_i32(buf)?;
        let host = get_compact_str(buf)?.unwrap_or_default();
        let port = get_i32(buf)?;
        let rack = get_compact_str(buf)?;
        skip_tags(buf)?;
        eps.push(NodeEndpoint {
            node_id,
            host,
            port,
            rack,
        });
    }
    Ok(eps)
}

fn put_leader<B: ByteBufMut>(buf: &mut B, l: &LeaderIdAndEpoch) {
    put_i32(buf, l.leader_id);
    put_i32(buf, l.leader_epoch);
    put_no_tags(buf);
}

fn get_leader<B: ByteBuf>(buf: &mut B) -> Result<LeaderIdAndEpoch> {
    let leader_id = get_i32(buf)?;
    let leader_epoch = get_i32(buf)?;
    skip_tags(buf)?;
    Ok(LeaderIdAndEpoch {
        leader_id,
        leader_epoch,
    })
}

fn size_of<T: Encodable>(msg: &T, version: i16) -> Result<usize> {
    let mut b = BytesMut::new();
    msg.encode(&mut b, version)?;
    Ok(b.len())
}

impl Encodable for ShareFetchRequest {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> Result<()> {
        check_version(version)?;
        if version < 2 && (self.is_renew_ack || self.share_acquire_mode != 0) {
            bail!("renew acknowledgements and record-limit acquisition need ShareFetch v2");
        }
        put_compact_str(buf, Some(&self.group_id))?;
        put_compact_str(buf, Some(&self.member_id))?;
        put_i32(buf, self.share_session_epoch);
        put_i32(buf, self.max_wait_ms);
        put_i32(buf, self.min_bytes);
        put_i32(buf, self.max_bytes);
        put_i32(buf, self.max_records);
        put_i32(buf, self.batch_size);
        if version >= 2 {
            put_i8(buf, self.share_acquire_mode);
            put_i8(buf, i8::from(self.is_renew_ack));
        }
        put_topics(buf, &self.topics)?;
        put_array_len(buf, self.forgotten_topics.len())?;
        for f in &self.forgotten_topics {
            put_uuid(buf, &f.topic_id);
            put_array_len(buf, f.partitions.len())?;
            for p in &f.partitions {
                put_i32(buf, *p);
            }
            put_no_tags(buf);
        }
        put_no_tags(buf);
        Ok(())
    }

    fn compute_size(&self, version: i16) -> Result<usize> {
        size_of(self, version)
    }
}

impl Decodable for ShareFetchRequest {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> Result<Self> {
        check_version(version)?;
        let mut r = ShareFetchRequest {
            group_id: get_compact_str(buf)?.unwrap_or_default(),
            member_id: get_compact_str(buf)?.unwrap_or_default(),
            share_session_epoch: get_i32(buf)?,
            max_wait_ms: get_i32(buf)?,
            min_bytes: get_i32(buf)?,
            max_bytes: get_i32(buf)?,
            max_records: get_i32(buf)?,
            batch_size: get_i32(buf)?,
            ..Default::default()
        };
        if version >= 2 {
            r.share_acquire_mode = get_i8(buf)?;
            r.is_renew_ack = get_bool(buf)?;
        }
        r.topics = get_topics(buf)?;
        let n = get_array_len(buf, 18)?;
        for _ in 0..n {
            let topic_id = get_uuid(buf)?;
            let np = get_array_len(buf, 4)?;
            let mut partitions = Vec::with_capacity(np);
            for _ in 0..np {
                partitions.push(get_i32(buf)?);
            }
            skip_tags(buf)?;
            r.forgotten_topics.push(ForgottenTopic {
                topic_id,
                partitions,
            });
        }
        skip_tags(buf)?;
        Ok(r)
    }
}

impl Encodable for ShareFetchResponse {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> Result<()> {
        check_version(version)?;
        put_i32(buf, self.throttle_time_ms);
        put_i16(buf, self.error_code);
        put_compact_str(buf, self.error_message.as_deref())?;
        put_i32(buf, self.acquisition_lock_timeout_ms);
        put_array_len(buf, self.responses.len())?;
        for t in &self.responses {
            put_uuid(buf, &t.topic_id);
            put_array_len(buf, t.partitions.len())?;
            for p in &t.partitions {
                put_i32(buf, p.partition);
                put_i16(buf, p.error_code);
                put_compact_str(buf, p.error_message.as_deref())?;
                put_i16(buf, p.acknowledge_error_code);
                put_compact_str(buf, p.acknowledge_error_message.as_deref())?;
                put_leader(buf, &p.current_leader);
                put_compact_bytes(buf, &p.records)?;
                put_array_len(buf, p.acquired.len())?;
                for a in &p.acquired {
                    put_i64(buf, a.first_offset);
                    put_i64(buf, a.last_offset);
                    put_i16(buf, a.delivery_count);
                    put_no_tags(buf);
                }
                put_no_tags(buf);
            }
            put_no_tags(buf);
        }
        put_endpoints(buf, &self.node_endpoints)?;
        put_no_tags(buf);
        Ok(())
    }

    fn compute_size(&self, version: i16) -> Result<usize> {
        size_of(self, version)
    }
}

impl Decodable for ShareFetchResponse {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> Result<Self> {
        check_version(version)?;
        let throttle_time_ms = get_i32(buf)?;
        let error_code = get_i16(buf)?;
        let error_message = get_compact_str(buf)?;
        let acquisition_lock_timeout_ms = get_i32(buf)?;
        let nt = get_array_len(buf, 18)?;
        let mut responses = Vec::with_capacity(nt);
        for _ in 0..nt {
            let topic_id = get_uuid(buf)?;
            let np = get_array_len(buf, 20)?;
            let mut partitions = Vec::with_capacity(np);
            for _ in 0..np {
                let partition = get_i32(buf)?;
                let error_code = get_i16(buf)?;
                let error_message = get_compact_str(buf)?;
                let acknowledge_error_code = get_i16(buf)?;
                let acknowledge_error_message = get_compact_str(buf)?;
                let current_leader = get_leader(buf)?;
                let records = get_compact_bytes(buf)?;
                let na = get_array_len(buf, 19)?;
                let mut acquired = Vec::with_capacity(na);
                for _ in 0..na {
                    let first_offset = get_i64(buf)?;
                    let last_offset = get_i64(buf)?;
                    let delivery_count = get_i16(buf)?;
                    skip_tags(buf)?;
                    acquired.push(AcquiredRange {
                        first_offset,
                        last_offset,
                        delivery_count,
                    });
                }
                skip_tags(buf)?;
                partitions.push(FetchPartitionData {
                    partition,
                    error_code,
                    error_message,
                    acknowledge_error_code,
                    acknowledge_error_message,
                    current_leader,
                    records,
                    acquired,
                });
            }
            skip_tags(buf)?;
            responses.push(FetchTopicResponse {
                topic_id,
                partitions,
            });
        }
        let node_endpoints = get_endpoints(buf)?;
        skip_tags(buf)?;
        Ok(ShareFetchResponse {
            throttle_time_ms,
            error_code,
            error_message,
            acquisition_lock_timeout_ms,
            responses,
            node_endpoints,
        })
    }
}

impl Encodable for ShareAcknowledgeRequest {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> Result<()> {
        check_version(version)?;
        if version < 2 && self.is_renew_ack {
            bail!("renew acknowledgements need ShareAcknowledge v2");
        }
        put_compact_str(buf, Some(&self.group_id))?;
        put_compact_str(buf, Some(&self.member_id))?;
        put_i32(buf, self.share_session_epoch);
        if version >= 2 {
            put_i8(buf, i8::from(self.is_renew_ack));
        }
        put_topics(buf, &self.topics)?;
        put_no_tags(buf);
        Ok(())
    }

    fn compute_size(&self, version: i16) -> Result<usize> {
        size_of(self, version)
    }
}

impl Decodable for ShareAcknowledgeRequest {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> Result<Self> {
        check_version(version)?;
        let group_id = get_compact_str(buf)?.unwrap_or_default();
        let member_id = get_compact_str(buf)?.unwrap_or_default();
        let share_session_epoch = get_i32(buf)?;
        let is_renew_ack = if version >= 2 { get_bool(buf)? } else { false };
        let topics = get_topics(buf)?;
        skip_tags(buf)?;
        Ok(ShareAcknowledgeRequest {
            group_id,
            member_id,
            share_session_epoch,
            is_renew_ack,
            topics,
        })
    }
}

impl Encodable for ShareAcknowledgeResponse {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> Result<()> {
        check_version(version)?;
        put_i32(buf, self.throttle_time_ms);
        put_i16(buf, self.error_code);
        put_compact_str(buf, self.error_message.as_deref())?;
        if version >= 2 {
            put_i32(buf, self.acquisition_lock_timeout_ms);
        }
        put_array_len(buf, self.responses.len())?;
        for t in &self.responses {
            put_uuid(buf, &t.topic_id);
            put_array_len(buf, t.partitions.len())?;
            for p in &t.partitions {
                put_i32(buf, p.partition);
                put_i16(buf, p.error_code);
                put_compact_str(buf, p.error_message.as_deref())?;
                put_leader(buf, &p.current_leader);
                put_no_tags(buf);
            }
            put_no_tags(buf);
        }
        put_endpoints(buf, &self.node_endpoints)?;
        put_no_tags(buf);
        Ok(())
    }

    fn compute_size(&self, version: i16) -> Result<usize> {
        size_of(self, version)
    }
}

impl Decodable for ShareAcknowledgeResponse {
    fn decode<B: ByteBuf>(buf: &mut B, version: i16) -> Result<Self> {
        check_version(version)?;
        let throttle_time_ms = get_i32(buf)?;
        let error_code = get_i16(buf)?;
        let error_message = get_compact_str(buf)?;
        let acquisition_lock_timeout_ms = if version >= 2 { get_i32(buf)? } else { 0 };
        let nt = get_array_len(buf, 18)?;
        let mut responses = Vec::with_capacity(nt);
        for _ in 0..nt {
            let topic_id = get_uuid(buf)?;
            let np = get_array_len(buf, 17)?;
            let mut partitions = Vec::with_capacity(np);
            for _ in 0..np {
                let partition = get_i32(buf)?;
                let error_code = get_i16(buf)?;
                let error_message = get_compact_str(buf)?;
                let current_leader = get_leader(buf)?;
                skip_tags(buf)?;
                partitions.push(AckPartitionResult {
                    partition,
                    error_code,
                    error_message,
                    current_leader,
                });
            }
            skip_tags(buf)?;
            responses.push(AckTopicResult {
                topic_id,
                partitions,
            });
        }
        let node_endpoints = get_endpoints(buf)?;
        skip_tags(buf)?;
        Ok(ShareAcknowledgeResponse {
            throttle_time_ms,
            error_code,
            error_message,
            acquisition_lock_timeout_ms,
            responses,
            node_endpoints,
        })
    }
}

macro_rules! message_impls {
    ($req:ty, $resp:ty, $key:expr) => {
        impl Message for $req {
            const VERSIONS: VersionRange = SHARE_VERSIONS;
            const DEPRECATED_VERSIONS: Option<VersionRange> = None;
        }
        impl Message for $resp {
            const VERSIONS: VersionRange = SHARE_VERSIONS;
            const DEPRECATED_VERSIONS: Option<VersionRange> = None;
        }
        impl HeaderVersion for $req {
            fn header_version(_version: i16) -> i16 {
                2
            }
        }
        impl HeaderVersion for $resp {
            fn header_version(_version: i16) -> i16 {
                1
            }
        }
        impl Request for $req {
            const KEY: i16 = $key;
            type Response = $resp;
        }
    };
}

message_impls!(ShareFetchRequest, ShareFetchResponse, 78);
message_impls!(ShareAcknowledgeRequest, ShareAcknowledgeResponse, 79);

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Encodable + Decodable + PartialEq + std::fmt::Debug>(msg: &T, version: i16) {
        let mut b = BytesMut::new();
        msg.encode(&mut b, version).expect("encodes");
        assert_eq!(b.len(), msg.compute_size(version).expect("size"));
        let mut bytes = b.freeze();
        let back = T::decode(&mut bytes, version).expect("decodes");
        assert!(bytes.is_empty(), "no trailing bytes");
        assert_eq!(&back, msg);
    }

    fn topics() -> Vec<TopicAcks> {
        vec![TopicAcks {
            topic_id: Uuid::from_u128(0x1234_5678_9abc_def0_1122_3344_5566_7788),
            partitions: vec![PartitionAcks {
                partition: 3,
                batches: vec![
                    AckBatch {
                        first_offset: 10,
                        last_offset: 19,
                        types: vec![ack_type::ACCEPT],
                    },
                    AckBatch {
                        first_offset: 20,
                        last_offset: 22,
                        types: vec![1, 2, 0],
                    },
                ],
            }],
        }]
    }

    #[test]
    fn share_fetch_request_round_trips_in_v1_and_v2() {
        let mut req = ShareFetchRequest {
            group_id: "g".into(),
            member_id: "m".into(),
            share_session_epoch: 7,
            max_wait_ms: 500,
            min_bytes: 1,
            max_bytes: 52_428_800,
            max_records: 500,
            batch_size: 500,
            topics: topics(),
            forgotten_topics: vec![ForgottenTopic {
                topic_id: Uuid::from_u128(9),
                partitions: vec![0, 1],
            }],
            ..Default::default()
        };
        round_trip(&req, 1);
        req.share_acquire_mode = 1;
        req.is_renew_ack = true;
        round_trip(&req, 2);
    }

    #[test]
    fn v2_only_fields_are_refused_at_v1() {
        let req = ShareFetchRequest {
            is_renew_ack: true,
            ..Default::default()
        };
        assert!(req.encode(&mut BytesMut::new(), 1).is_err());
        let req = ShareFetchRequest {
            share_acquire_mode: 1,
            ..Default::default()
        };
        assert!(req.encode(&mut BytesMut::new(), 1).is_err());
        let ack = ShareAcknowledgeRequest {
            is_renew_ack: true,
            ..Default::default()
        };
        assert!(ack.encode(&mut BytesMut::new(), 1).is_err());
    }

    #[test]
    fn v2_request_layout_matches_the_schema() {
        // GroupId "g", MemberId "m", epoch 1, four limits, MaxRecords, BatchSize, then the two
        // v2 fields, then empty Topics and ForgottenTopicsData and the tag section.
        let req = ShareFetchRequest {
            group_id: "g".into(),
            member_id: "m".into(),
            share_session_epoch: 1,
            share_acquire_mode: 1,
            is_renew_ack: true,
            ..Default::default()
        };
        let mut b = BytesMut::new();
        req.encode(&mut b, 2).expect("encodes");
        let mut want = vec![2, b'g', 2, b'm', 0, 0, 0, 1];
        want.extend_from_slice(&[0; 4 * 5]);
        want.extend_from_slice(&[1, 1, 1, 1, 0]);
        assert_eq!(b.as_ref(), want.as_slice());
    }

    #[test]
    fn share_fetch_response_round_trips() {
        let resp = ShareFetchResponse {
            throttle_time_ms: 0,
            error_code: 0,
            error_message: None,
            acquisition_lock_timeout_ms: 30_000,
            responses: vec![FetchTopicResponse {
                topic_id: Uuid::from_u128(5),
                partitions: vec![FetchPartitionData {
                    partition: 0,
                    error_code: 6,
                    error_message: Some("not leader".into()),
                    acknowledge_error_code: 121,
                    acknowledge_error_message: None,
                    current_leader: LeaderIdAndEpoch {
                        leader_id: 2,
                        leader_epoch: 4,
                    },
                    records: Bytes::from_static(b"batches"),
                    acquired: vec![AcquiredRange {
                        first_offset: 0,
                        last_offset: 9,
                        delivery_count: 1,
                    }],
                }],
            }],
            node_endpoints: vec![NodeEndpoint {
                node_id: 2,
                host: "b2".into(),
                port: 9092,
                rack: None,
            }],
        };
        round_trip(&resp, 1);
        round_trip(&resp, 2);
    }

    #[test]
    fn share_acknowledge_round_trips_and_lock_timeout_is_v2_only() {
        let req = ShareAcknowledgeRequest {
            group_id: "g".into(),
            member_id: "m".into(),
            share_session_epoch: 3,
            is_renew_ack: false,
            topics: topics(),
        };
        round_trip(&req, 1);
        round_trip(
            &ShareAcknowledgeRequest {
                is_renew_ack: true,
                ..req
            },
            2,
        );
        let resp = ShareAcknowledgeResponse {
            acquisition_lock_timeout_ms: 15_000,
            responses: vec![AckTopicResult {
                topic_id: Uuid::from_u128(1),
                partitions: vec![AckPartitionResult {
                    partition: 1,
                    error_code: 0,
                    ..Default::default()
                }],
            }],
            ..Default::default()
        };
        round_trip(&resp, 2);
        let v1 = ShareAcknowledgeResponse {
            acquisition_lock_timeout_ms: 0,
            ..resp
        };
        round_trip(&v1, 1);
    }

    #[test]
    fn truncated_responses_are_errors() {
        let mut b = BytesMut::new();
        ShareFetchResponse::default()
            .encode(&mut b, 2)
            .expect("encodes");
        let full = b.freeze();
        for cut in 0..full.len() {
            let mut part = full.slice(..cut);
            assert!(
                ShareFetchResponse::decode(&mut part, 2).is_err(),
                "cut at {cut}"
            );
        }
    }
}

//! A bounded pre-pass over every response body the host decodes with kafka-protocol.
//!
//! Why it exists: kafka-protocol 0.18 decodes an array by reading its length off the wire and
//! calling `Vec::with_capacity(length)` before it decodes a single element. A response that
//! claims 2^31 elements and carries ten bytes asks for tens of gigabytes; the allocation fails
//! and Rust aborts the whole process (an abort, not a panic a task could survive). One lying or
//! corrupt response on any connection would take the host down.
//!
//! Why a walk over the schema and not a wrapper around the buffer: the decoder is generic over
//! its buffer (`ByteBuf`), but the array length is read with the same `try_get_i32`/`try_get_u8`
//! calls as every other integer field, and the allocation follows immediately, so a buffer
//! wrapper cannot tell a length from a port number and never gets a say before the allocation.
//! Nor can the allocation be caught (allocation failure aborts). So before kafka-protocol sees a
//! body, [`check_body`] walks it with the response's field list (the facts of Kafka's message
//! schemas, per version, written down below for the APIs the host sends) and checks every array,
//! string and byte length against the bytes left, and that every element an array announces is
//! really there. Only a body that passes is handed to kafka-protocol, whose allocations are then
//! bounded by elements that exist. A body that fails is a typed [`BoundsError`]; the connection
//! layer turns it into `KafkaError::Decode` and drops the connection.
//!
//! The walk follows kafka-protocol's decoders step by step (including their quirks: a known
//! tagged field is read from the stream whatever size its header gives), so whatever it accepts
//! is parsed by kafka-protocol exactly the same way. It allocates nothing and recurses at most as
//! deep as the schemas nest. When kafka-protocol bounds its allocations itself (upstream pull
//! requests 152/161/200), this module can go.

use kafka_protocol::messages::ApiKey;

/// Why a response body was refused before decoding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundsError {
    /// A length or count claims more than the bytes left in the body.
    #[error("{what} claims {claimed} but only {left} bytes are left")]
    Overlong {
        /// Which kind of length (array, string, bytes, tagged field).
        what: &'static str,
        /// The length read off the wire.
        claimed: u64,
        /// The bytes left after it.
        left: usize,
    },
    /// The body ended in the middle of a field.
    #[error("body ends in the middle of a field ({needed} bytes needed, {left} left)")]
    Truncated {
        /// Bytes the field needs.
        needed: usize,
        /// Bytes left.
        left: usize,
    },
    /// A negative length other than -1 (null).
    #[error("negative {what} length {length}")]
    Negative {
        /// Which kind of length.
        what: &'static str,
        /// The length read off the wire.
        length: i64,
    },
    /// An API or version this pre-pass has no field list for. The host only sends the APIs
    /// listed in [`check_body`], so this means a caller sent something new: add its schema.
    #[error("no bounded field list for {api:?} v{version}")]
    Unknown {
        /// The API.
        api: ApiKey,
        /// The version.
        version: i16,
    },
}

/// One field's wire shape.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// A fixed-width field of this many bytes (int8..int64, bool, uuid, float64).
    Fixed(usize),
    /// A (nullable) string: int16 length, or a compact (varint length + 1) one when flexible.
    Str,
    /// (Nullable) bytes or records: int32 length, or compact when flexible.
    Bytes,
    /// A (nullable) array of structs.
    Array(&'static Struct),
    /// A (nullable) array of fixed-width values.
    ArrayOf(usize),
    /// An array of strings.
    ArrayOfStr,
    /// A struct behind a presence byte (1 = present), as kafka-protocol's `OptionStruct`.
    Optional(&'static Struct),
    /// A struct inline (only in tagged fields).
    Inline(&'static Struct),
}

/// A field present in versions `min..=max`.
#[derive(Debug, Clone, Copy)]
struct Field {
    min: i16,
    max: i16,
    kind: Kind,
}

/// A known tagged field: kafka-protocol decodes its value from the stream when `tag` appears
/// in versions `min..=max` and skips it as unknown bytes otherwise.
#[derive(Debug, Clone, Copy)]
struct Tagged {
    tag: u32,
    min: i16,
    max: i16,
    kind: Kind,
}

/// A struct: its fields in wire order, then (in flexible versions) its tagged fields.
#[derive(Debug)]
struct Struct {
    fields: &'static [Field],
    tags: &'static [Tagged],
}

/// A response body: the versions kafka-protocol decodes and the first flexible version.
#[derive(Debug)]
struct Body {
    min: i16,
    max: i16,
    flexible_from: i16,
    root: &'static Struct,
}

const ANY: i16 = i16::MAX;
const I8: Kind = Kind::Fixed(1);
const BOOL: Kind = Kind::Fixed(1);
const I16: Kind = Kind::Fixed(2);
const I32: Kind = Kind::Fixed(4);
const I64: Kind = Kind::Fixed(8);
const UUID: Kind = Kind::Fixed(16);
const I32S: Kind = Kind::ArrayOf(4);

/// A field in every version.
const fn all(kind: Kind) -> Field {
    Field {
        min: 0,
        max: ANY,
        kind,
    }
}
/// A field from `min` on.
const fn since(min: i16, kind: Kind) -> Field {
    Field {
        min,
        max: ANY,
        kind,
    }
}
/// A field in `min..=max`.
const fn within(min: i16, max: i16, kind: Kind) -> Field {
    Field { min, max, kind }
}
/// A struct without known tagged fields.
const fn plain(fields: &'static [Field]) -> Struct {
    Struct { fields, tags: &[] }
}
const fn tag(tag: u32, min: i16, kind: Kind) -> Tagged {
    Tagged {
        tag,
        min,
        max: ANY,
        kind,
    }
}

// ApiVersions v0-4 (flexible from 3).
const API_VERSION: Struct = plain(&[all(I16), all(I16), all(I16)]);
const FEATURE: Struct = plain(&[since(3, Kind::Str), since(3, I16), since(3, I16)]);
const API_VERSIONS: Struct = Struct {
    fields: &[all(I16), all(Kind::Array(&API_VERSION)), since(1, I32)],
    tags: &[
        tag(0, 0, Kind::Array(&FEATURE)),
        tag(1, 0, I64),
        tag(2, 0, Kind::Array(&FEATURE)),
        tag(3, 0, BOOL),
    ],
};

// SaslHandshake v0-1 (never flexible), SaslAuthenticate v0-2 (flexible from 2).
const SASL_HANDSHAKE: Struct = plain(&[all(I16), all(Kind::ArrayOfStr)]);
const SASL_AUTHENTICATE: Struct =
    plain(&[all(I16), all(Kind::Str), all(Kind::Bytes), since(1, I64)]);

// Metadata v0-13 (flexible from 9).
const METADATA_BROKER: Struct = plain(&[all(I32), all(Kind::Str), all(I32), since(1, Kind::Str)]);
const METADATA_PARTITION: Struct = plain(&[
    all(I16),
    all(I32),
    all(I32),
    since(7, I32),
    all(I32S),
    all(I32S),
    since(5, I32S),
]);
const METADATA_TOPIC: Struct = plain(&[
    all(I16),
    all(Kind::Str),
    since(10, UUID),
    since(1, BOOL),
    all(Kind::Array(&METADATA_PARTITION)),
    since(8, I32),
]);
const METADATA: Struct = plain(&[
    since(3, I32),
    all(Kind::Array(&METADATA_BROKER)),
    since(2, Kind::Str),
    since(1, I32),
    all(Kind::Array(&METADATA_TOPIC)),
    within(8, 10, I32),
    since(13, I16),
]);

// FindCoordinator v0-6 (flexible from 3).
const COORDINATOR: Struct = plain(&[
    since(4, Kind::Str),
    since(4, I32),
    since(4, Kind::Str),
    since(4, I32),
    since(4, I16),
    since(4, Kind::Str),
]);
const FIND_COORDINATOR: Struct = plain(&[
    since(1, I32),
    within(0, 3, I16),
    within(1, 3, Kind::Str),
    within(0, 3, I32),
    within(0, 3, Kind::Str),
    within(0, 3, I32),
    since(4, Kind::Array(&COORDINATOR)),
]);

// InitProducerId v0-5 (flexible from 2); v6's two-phase-commit fields are not asked for.
const INIT_PRODUCER_ID: Struct = plain(&[all(I32), all(I16), all(I64), all(I16)]);

// AddPartitionsToTxn v0-3 (flexible from 3), the client's form; v4-5 (the brokers' own, a
// result per transaction) are not asked for.
const ADD_PARTITIONS_RESULT: Struct = plain(&[all(I32), all(I16)]);
const ADD_PARTITIONS_TOPIC: Struct =
    plain(&[all(Kind::Str), all(Kind::Array(&ADD_PARTITIONS_RESULT))]);
const ADD_PARTITIONS_TO_TXN: Struct =
    plain(&[all(I32), within(0, 3, Kind::Array(&ADD_PARTITIONS_TOPIC))]);

// EndTxn v0-5 (flexible from 3); v5 answers with the producer's next id and epoch.
const END_TXN: Struct = plain(&[all(I32), all(I16), since(5, I64), since(5, I16)]);

// ShareGroupHeartbeat v1 (flexible).
const SGH_TOPIC_PARTITIONS: Struct = plain(&[all(UUID), all(I32S)]);
const SGH_ASSIGNMENT: Struct = plain(&[all(Kind::Array(&SGH_TOPIC_PARTITIONS))]);
const SHARE_GROUP_HEARTBEAT: Struct = plain(&[
    all(I32),
    all(I16),
    all(Kind::Str),
    all(Kind::Str),
    all(I32),
    all(I32),
    all(Kind::Optional(&SGH_ASSIGNMENT)),
]);

// Produce v3-13 (flexible from 9).
const PRODUCE_RECORD_ERROR: Struct = plain(&[since(8, I32), since(8, Kind::Str)]);
const PRODUCE_LEADER: Struct = plain(&[since(10, I32), since(10, I32)]);
const PRODUCE_NODE: Struct = plain(&[
    since(10, I32),
    since(10, Kind::Str),
    since(10, I32),
    since(10, Kind::Str),
]);
const PRODUCE_PARTITION: Struct = Struct {
    fields: &[
        all(I32),
        all(I16),
        all(I64),
        all(I64),
        since(5, I64),
        since(8, Kind::Array(&PRODUCE_RECORD_ERROR)),
        since(8, Kind::Str),
    ],
    tags: &[tag(0, 10, Kind::Inline(&PRODUCE_LEADER))],
};
const PRODUCE_TOPIC: Struct = plain(&[
    within(0, 12, Kind::Str),
    since(13, UUID),
    all(Kind::Array(&PRODUCE_PARTITION)),
]);
const PRODUCE: Struct = Struct {
    fields: &[all(Kind::Array(&PRODUCE_TOPIC)), all(I32)],
    tags: &[tag(0, 10, Kind::Array(&PRODUCE_NODE))],
};

// Fetch v4-18 (flexible from 12).
const FETCH_ABORTED: Struct = plain(&[all(I64), all(I64)]);
const FETCH_EPOCH_END: Struct = plain(&[since(12, I32), since(12, I64)]);
const FETCH_LEADER: Struct = plain(&[since(12, I32), since(12, I32)]);
const FETCH_SNAPSHOT: Struct = plain(&[all(I64), all(I32)]);
const FETCH_NODE: Struct = plain(&[
    since(16, I32),
    since(16, Kind::Str),
    since(16, I32),
    since(16, Kind::Str),
]);
const FETCH_PARTITION: Struct = Struct {
    fields: &[
        all(I32),
        all(I16),
        all(I64),
        all(I64),
        since(5, I64),
        all(Kind::Array(&FETCH_ABORTED)),
        since(11, I32),
        all(Kind::Bytes),
    ],
    tags: &[
        tag(0, 0, Kind::Inline(&FETCH_EPOCH_END)),
        tag(1, 0, Kind::Inline(&FETCH_LEADER)),
        tag(2, 0, Kind::Inline(&FETCH_SNAPSHOT)),
    ],
};
const FETCH_TOPIC: Struct = plain(&[
    within(0, 12, Kind::Str),
    since(13, UUID),
    all(Kind::Array(&FETCH_PARTITION)),
]);
const FETCH: Struct = Struct {
    fields: &[
        all(I32),
        since(7, I16),
        since(7, I32),
        all(Kind::Array(&FETCH_TOPIC)),
    ],
    tags: &[tag(0, 16, Kind::Array(&FETCH_NODE))],
};

// ListOffsets v1-10 (flexible from 6).
const LIST_OFFSETS_PARTITION: Struct =
    plain(&[all(I32), all(I16), all(I64), all(I64), since(4, I32)]);
const LIST_OFFSETS_TOPIC: Struct =
    plain(&[all(Kind::Str), all(Kind::Array(&LIST_OFFSETS_PARTITION))]);
const LIST_OFFSETS: Struct = plain(&[since(2, I32), all(Kind::Array(&LIST_OFFSETS_TOPIC))]);

// CreateTopics v2-7 (flexible from 5).
const CREATE_TOPICS_CONFIG: Struct = plain(&[
    since(5, Kind::Str),
    since(5, Kind::Str),
    since(5, BOOL),
    since(5, I8),
    since(5, BOOL),
]);
const CREATE_TOPICS_RESULT: Struct = Struct {
    fields: &[
        all(Kind::Str),
        since(7, UUID),
        all(I16),
        all(Kind::Str),
        since(5, I32),
        since(5, I16),
        since(5, Kind::Array(&CREATE_TOPICS_CONFIG)),
    ],
    tags: &[tag(0, 0, I16)],
};
const CREATE_TOPICS: Struct = plain(&[all(I32), all(Kind::Array(&CREATE_TOPICS_RESULT))]);

// IncrementalAlterConfigs v0-1 (flexible from 1).
const ALTER_CONFIGS_RESOURCE: Struct = plain(&[all(I16), all(Kind::Str), all(I8), all(Kind::Str)]);
const INCREMENTAL_ALTER_CONFIGS: Struct =
    plain(&[all(I32), all(Kind::Array(&ALTER_CONFIGS_RESOURCE))]);

// DeleteTopics v1-6 (flexible from 4).
const DELETE_TOPICS_RESULT: Struct = plain(&[
    all(Kind::Str),
    since(6, UUID),
    all(I16),
    since(5, Kind::Str),
]);
const DELETE_TOPICS: Struct = plain(&[all(I32), all(Kind::Array(&DELETE_TOPICS_RESULT))]);

// DescribeConfigs v1-4 (flexible from 4).
const DESCRIBE_CONFIGS_SYNONYM: Struct = plain(&[all(Kind::Str), all(Kind::Str), all(I8)]);
const DESCRIBE_CONFIGS_CONFIG: Struct = plain(&[
    all(Kind::Str),
    all(Kind::Str),
    all(BOOL),
    all(I8),
    all(BOOL),
    all(Kind::Array(&DESCRIBE_CONFIGS_SYNONYM)),
    since(3, I8),
    since(3, Kind::Str),
]);
const DESCRIBE_CONFIGS_RESULT: Struct = plain(&[
    all(I16),
    all(Kind::Str),
    all(I8),
    all(Kind::Str),
    all(Kind::Array(&DESCRIBE_CONFIGS_CONFIG)),
]);
const DESCRIBE_CONFIGS: Struct = plain(&[all(I32), all(Kind::Array(&DESCRIBE_CONFIGS_RESULT))]);

const fn body(min: i16, max: i16, flexible_from: i16, root: &'static Struct) -> Body {
    Body {
        min,
        max,
        flexible_from,
        root,
    }
}

/// The field list of `api`'s response, `None` for APIs the host does not decode with
/// kafka-protocol.
fn schema(api: ApiKey) -> Option<Body> {
    Some(match api {
        ApiKey::ApiVersions => body(0, 4, 3, &API_VERSIONS),
        ApiKey::SaslHandshake => body(0, 1, ANY, &SASL_HANDSHAKE),
        ApiKey::SaslAuthenticate => body(0, 2, 2, &SASL_AUTHENTICATE),
        ApiKey::Metadata => body(0, 13, 9, &METADATA),
        ApiKey::FindCoordinator => body(0, 6, 3, &FIND_COORDINATOR),
        ApiKey::ShareGroupHeartbeat => body(1, 1, 0, &SHARE_GROUP_HEARTBEAT),
        ApiKey::Produce => body(3, 13, 9, &PRODUCE),
        ApiKey::InitProducerId => body(0, 5, 2, &INIT_PRODUCER_ID),
        ApiKey::AddPartitionsToTxn => body(0, 3, 3, &ADD_PARTITIONS_TO_TXN),
        ApiKey::EndTxn => body(0, 5, 3, &END_TXN),
        ApiKey::Fetch => body(4, 18, 12, &FETCH),
        ApiKey::ListOffsets => body(1, 10, 6, &LIST_OFFSETS),
        ApiKey::CreateTopics => body(2, 7, 5, &CREATE_TOPICS),
        ApiKey::IncrementalAlterConfigs => body(0, 1, 1, &INCREMENTAL_ALTER_CONFIGS),
        ApiKey::DeleteTopics => body(1, 6, 4, &DELETE_TOPICS),
        ApiKey::DescribeConfigs => body(1, 4, 4, &DESCRIBE_CONFIGS),
        _ => return None,
    })
}

/// Whether responses to `api` are decoded by our own bounded decoders (`share::codec`), which
/// need no pre-pass.
fn own_decoder(api: ApiKey) -> bool {
    matches!(
        api,
        ApiKey::ShareFetch | ApiKey::ShareAcknowledge | ApiKey::DescribeShareGroupOffsets
    )
}

/// Checks a response body (the bytes after the response header) of `api` at `version`: every
/// length fits in the bytes left and every announced element is present. `Ok` means
/// kafka-protocol can decode it without allocating for anything that is not there.
pub fn check_body(api: ApiKey, version: i16, body: &[u8]) -> Result<(), BoundsError> {
    if own_decoder(api) {
        return Ok(());
    }
    let schema = schema(api)
        .filter(|s| (s.min..=s.max).contains(&version))
        .ok_or(BoundsError::Unknown { api, version })?;
    let mut walk = Walk {
        rest: body,
        version,
        flexible: version >= schema.flexible_from,
    };
    walk.structure(schema.root)
}

/// The walk's cursor.
struct Walk<'a> {
    rest: &'a [u8],
    version: i16,
    flexible: bool,
}

impl Walk<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], BoundsError> {
        if self.rest.len() < n {
            return Err(BoundsError::Truncated {
                needed: n,
                left: self.rest.len(),
            });
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn skip(&mut self, what: &'static str, n: u64) -> Result<(), BoundsError> {
        let left = self.rest.len();
        match usize::try_from(n) {
            Ok(n) if n <= left => {
                self.rest = &self.rest[n..];
                Ok(())
            }
            _ => Err(BoundsError::Overlong {
                what,
                claimed: n,
                left,
            }),
        }
    }

    fn i16(&mut self) -> Result<i16, BoundsError> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self) -> Result<i32, BoundsError> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// An unsigned varint exactly as kafka-protocol reads one: at most five bytes, bits past
    /// 32 dropped.
    fn uvarint(&mut self) -> Result<u32, BoundsError> {
        let mut value: u32 = 0;
        for i in 0..5 {
            let b = u32::from(self.take(1)?[0]);
            value |= (b & 0x7f) << (i * 7);
            if b < 0x80 {
                break;
            }
        }
        Ok(value)
    }

    /// A length: `None` for null. Compact lengths are stored plus one (0 = null).
    fn length(&mut self, what: &'static str, wide: bool) -> Result<Option<u64>, BoundsError> {
        let n = if self.flexible {
            return Ok(self.uvarint()?.checked_sub(1).map(u64::from));
        } else if wide {
            i64::from(self.i32()?)
        } else {
            i64::from(self.i16()?)
        };
        match n {
            -1 => Ok(None),
            n if n < 0 => Err(BoundsError::Negative { what, length: n }),
            n => Ok(Some(n.unsigned_abs())),
        }
    }

    /// An array's element count, refused when even one byte per element cannot fit.
    fn count(&mut self, element_bytes: usize) -> Result<Option<u64>, BoundsError> {
        let Some(n) = self.length("array", true)? else {
            return Ok(None);
        };
        let left = self.rest.len();
        if n.saturating_mul(element_bytes.max(1) as u64) > left as u64 {
            return Err(BoundsError::Overlong {
                what: "array",
                claimed: n,
                left,
            });
        }
        Ok(Some(n))
    }

    fn kind(&mut self, kind: Kind) -> Result<(), BoundsError> {
        match kind {
            Kind::Fixed(n) => self.take(n).map(drop),
            Kind::Str => match self.length("string", false)? {
                Some(n) => self.skip("string", n),
                None => Ok(()),
            },
            Kind::Bytes => match self.length("bytes", true)? {
                Some(n) => self.skip("bytes", n),
                None => Ok(()),
            },
            Kind::ArrayOf(width) => match self.count(width)? {
                Some(n) => self.skip("array", n.saturating_mul(width as u64)),
                None => Ok(()),
            },
            Kind::ArrayOfStr => {
                for _ in 0..self.count(1)?.unwrap_or(0) {
                    self.kind(Kind::Str)?;
                }
                Ok(())
            }
            Kind::Array(s) => {
                for _ in 0..self.count(1)?.unwrap_or(0) {
                    self.structure(s)?;
                }
                Ok(())
            }
            Kind::Optional(s) => {
                if self.take(1)?[0] == 1 {
                    self.structure(s)?;
                }
                Ok(())
            }
            Kind::Inline(s) => self.structure(s),
        }
    }

    fn structure(&mut self, s: &Struct) -> Result<(), BoundsError> {
        let v = self.version;
        for f in s.fields.iter().filter(|f| (f.min..=f.max).contains(&v)) {
            self.kind(f.kind)?;
        }
        if !self.flexible {
            return Ok(());
        }
        let fields = self.uvarint()?;
        for _ in 0..fields {
            let tag = self.uvarint()?;
            let size = self.uvarint()?;
            match s
                .tags
                .iter()
                .find(|t| t.tag == tag && (t.min..=t.max).contains(&v))
            {
                // kafka-protocol decodes a known tag's value from the stream, whatever `size`
                // says; so do we.
                Some(t) => self.kind(t.kind)?,
                None => self.skip("tagged field", u64::from(size))?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::{
        ApiVersionsResponse, FetchResponse, FindCoordinatorResponse, MetadataResponse,
        ProduceResponse, ShareGroupHeartbeatResponse,
    };
    use kafka_protocol::protocol::{Decodable, Encodable};

    fn encode<T: Encodable>(msg: &T, version: i16) -> Bytes {
        let mut b = BytesMut::new();
        msg.encode(&mut b, version).expect("encode");
        b.freeze()
    }

    /// Every prefix of a valid body is refused (never a panic), and the whole body passes.
    fn whole_passes_prefixes_fail(api: ApiKey, version: i16, body: &[u8]) {
        check_body(api, version, body).expect("an honest body passes");
        for cut in 0..body.len() {
            // A strict prefix can still be a valid body when it ends on a struct boundary
            // with nothing after it; what matters is that the walk never panics.
            let _ = check_body(api, version, &body[..cut]);
        }
    }

    #[test]
    fn honest_bodies_pass_at_every_version() {
        use kafka_protocol::messages::metadata_response::{
            MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
        };
        let meta = MetadataResponse::default()
            .with_brokers(vec![MetadataResponseBroker::default().with_port(9092)])
            .with_topics(vec![MetadataResponseTopic::default().with_partitions(
                vec![
                MetadataResponsePartition::default()
                    .with_replica_nodes(vec![kafka_protocol::messages::BrokerId(1)]),
            ],
            )]);
        for v in 1..=13 {
            whole_passes_prefixes_fail(ApiKey::Metadata, v, &encode(&meta, v));
        }
        for v in 0..=6 {
            let fc = FindCoordinatorResponse::default().with_coordinators(if v >= 4 {
                vec![Default::default()]
            } else {
                vec![]
            });
            whole_passes_prefixes_fail(ApiKey::FindCoordinator, v, &encode(&fc, v));
        }
        for v in 3..=13 {
            let p = ProduceResponse::default();
            whole_passes_prefixes_fail(ApiKey::Produce, v, &encode(&p, v));
        }
        for v in 4..=18 {
            let f = FetchResponse::default();
            whole_passes_prefixes_fail(ApiKey::Fetch, v, &encode(&f, v));
        }
        whole_passes_prefixes_fail(
            ApiKey::ShareGroupHeartbeat,
            1,
            &encode(&ShareGroupHeartbeatResponse::default(), 1),
        );
        whole_passes_prefixes_fail(
            ApiKey::ApiVersions,
            3,
            &encode(&ApiVersionsResponse::default(), 3),
        );
    }

    #[test]
    fn the_admin_and_sasl_responses_pass_at_every_version() {
        use kafka_protocol::messages::create_topics_response::{
            CreatableTopicConfigs, CreatableTopicResult,
        };
        use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
        use kafka_protocol::messages::describe_configs_response::{
            DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
        };
        use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
        use kafka_protocol::messages::list_offsets_response::{
            ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
        };
        use kafka_protocol::messages::{
            CreateTopicsResponse, DeleteTopicsResponse, DescribeConfigsResponse,
            IncrementalAlterConfigsResponse, ListOffsetsResponse, SaslAuthenticateResponse,
            SaslHandshakeResponse, TopicName,
        };
        use kafka_protocol::protocol::StrBytes;
        let name = || StrBytes::from_static_str("orders");
        let lo = ListOffsetsResponse::default().with_topics(vec![
            ListOffsetsTopicResponse::default()
                .with_name(TopicName(name()))
                .with_partitions(vec![
                    ListOffsetsPartitionResponse::default().with_offset(42),
                ]),
        ]);
        for v in 1..=10 {
            whole_passes_prefixes_fail(ApiKey::ListOffsets, v, &encode(&lo, v));
        }
        let ip = kafka_protocol::messages::InitProducerIdResponse::default()
            .with_producer_id(kafka_protocol::messages::ProducerId(7))
            .with_producer_epoch(3);
        for v in 0..=5 {
            whole_passes_prefixes_fail(ApiKey::InitProducerId, v, &encode(&ip, v));
        }
        use kafka_protocol::messages::add_partitions_to_txn_response::{
            AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
        };
        let apt = kafka_protocol::messages::AddPartitionsToTxnResponse::default()
            .with_results_by_topic_v3_and_below(vec![
                AddPartitionsToTxnTopicResult::default()
                    .with_name(kafka_protocol::messages::TopicName(
                        StrBytes::from_static_str("outputs"),
                    ))
                    .with_results_by_partition(vec![
                        AddPartitionsToTxnPartitionResult::default()
                            .with_partition_index(2)
                            .with_partition_error_code(51),
                    ]),
            ]);
        for v in 0..=3 {
            whole_passes_prefixes_fail(ApiKey::AddPartitionsToTxn, v, &encode(&apt, v));
        }
        let et = kafka_protocol::messages::EndTxnResponse::default()
            .with_error_code(90)
            .with_producer_id(kafka_protocol::messages::ProducerId(7))
            .with_producer_epoch(2);
        for v in 0..=5 {
            whole_passes_prefixes_fail(ApiKey::EndTxn, v, &encode(&et, v));
        }
        for v in 2..=7 {
            let mut result = CreatableTopicResult::default()
                .with_name(TopicName(name()))
                .with_topic_config_error_code(if v >= 5 { 3 } else { 0 });
            if v >= 5 {
                result = result.with_configs(Some(vec![
                    CreatableTopicConfigs::default().with_name(name()),
                ]));
            }
            let ct = CreateTopicsResponse::default().with_topics(vec![result]);
            whole_passes_prefixes_fail(ApiKey::CreateTopics, v, &encode(&ct, v));
        }
        let iac = IncrementalAlterConfigsResponse::default().with_responses(vec![
            AlterConfigsResourceResponse::default().with_resource_name(name()),
        ]);
        for v in 0..=1 {
            whole_passes_prefixes_fail(ApiKey::IncrementalAlterConfigs, v, &encode(&iac, v));
        }
        let dt = DeleteTopicsResponse::default().with_responses(vec![
            DeletableTopicResult::default()
                .with_name(Some(TopicName(name())))
                .with_error_code(3),
        ]);
        for v in 1..=6 {
            whole_passes_prefixes_fail(ApiKey::DeleteTopics, v, &encode(&dt, v));
        }
        let dc = DescribeConfigsResponse::default().with_results(vec![
            DescribeConfigsResult::default()
                .with_resource_name(name())
                .with_configs(vec![
                    DescribeConfigsResourceResult::default()
                        .with_name(name())
                        .with_value(Some(name()))
                        .with_synonyms(vec![
                            DescribeConfigsSynonym::default()
                                .with_name(name())
                                .with_value(Some(name())),
                        ]),
                ]),
        ]);
        for v in 1..=4 {
            whole_passes_prefixes_fail(ApiKey::DescribeConfigs, v, &encode(&dc, v));
        }
        let hs = SaslHandshakeResponse::default().with_mechanisms(vec![name(), name()]);
        for v in 0..=1 {
            whole_passes_prefixes_fail(ApiKey::SaslHandshake, v, &encode(&hs, v));
        }
        let auth = SaslAuthenticateResponse::default()
            .with_auth_bytes(Bytes::from_static(b"server-final"));
        for v in 0..=2 {
            whole_passes_prefixes_fail(ApiKey::SaslAuthenticate, v, &encode(&auth, v));
        }
    }

    /// A Metadata v12 body whose broker array claims 0x7fffffff - 1 entries and carries three
    /// bytes: kafka-protocol alone asks for tens of gigabytes here and aborts.
    fn lying_metadata_v12() -> Vec<u8> {
        let mut body = vec![0, 0, 0, 0]; // throttle_time_ms
        body.extend([0xff, 0xff, 0xff, 0xff, 0x07]); // compact length 0x7fffffff
        body.extend([0, 0, 0]);
        body
    }

    #[test]
    fn a_lying_array_length_is_refused_before_decoding() {
        let err = check_body(ApiKey::Metadata, 12, &lying_metadata_v12()).expect_err("refused");
        assert!(
            matches!(
                err,
                BoundsError::Overlong {
                    what: "array",
                    claimed: 0x7fff_fffe,
                    left: 3
                }
            ),
            "{err}"
        );
        // Non-flexible, nested: a Produce v8 partition's record-error array.
        let mut body = 1i32.to_be_bytes().to_vec(); // one topic
        body.extend(0i16.to_be_bytes()); // name ""
        body.extend(1i32.to_be_bytes()); // one partition
        body.extend([0u8; 4 + 2 + 8 + 8 + 8]); // index, error, base offset, append time, start
        body.extend(i32::MAX.to_be_bytes()); // record_errors: i32::MAX entries
        body.extend([0u8; 6]);
        assert!(matches!(
            check_body(ApiKey::Produce, 8, &body),
            Err(BoundsError::Overlong { what: "array", .. })
        ));
        // An array of int32 needs four bytes per element, not one.
        let mut sgh = vec![0u8; 4 + 2]; // throttle_time_ms, error_code
        sgh.extend([0, 0]); // null error message, null member id
        sgh.extend([0u8; 4 + 4]); // member epoch, heartbeat interval
        sgh.push(1); // assignment present
        sgh.push(2); // one topic
        sgh.extend([0u8; 16]); // topic id
        sgh.push(3); // two partitions (8 bytes) …
        sgh.extend([0u8; 5]); // … but five bytes left
        assert!(matches!(
            check_body(ApiKey::ShareGroupHeartbeat, 1, &sgh),
            Err(BoundsError::Overlong {
                what: "array",
                claimed: 2,
                ..
            })
        ));
    }

    #[test]
    fn an_api_without_a_field_list_is_refused_not_decoded_blind() {
        assert_eq!(
            check_body(ApiKey::DescribeGroups, 5, &[]),
            Err(BoundsError::Unknown {
                api: ApiKey::DescribeGroups,
                version: 5
            })
        );
        assert!(check_body(ApiKey::Metadata, 14, &[]).is_err());
        assert!(
            check_body(ApiKey::ShareFetch, 1, &[]).is_ok(),
            "share::codec bounds itself"
        );
    }

    /// The walk and kafka-protocol agree on the honest responses the host really sees: a
    /// decoded-and-re-encoded body passes and decodes back.
    #[test]
    fn the_walk_and_kafka_protocol_agree_on_tagged_fields() {
        use kafka_protocol::messages::fetch_response::{
            FetchableTopicResponse, LeaderIdAndEpoch, PartitionData, SnapshotId,
        };
        let f = FetchResponse::default().with_responses(vec![
            FetchableTopicResponse::default().with_partitions(vec![
                PartitionData::default()
                    .with_current_leader(
                        LeaderIdAndEpoch::default()
                            .with_leader_id(kafka_protocol::messages::BrokerId(3)),
                    )
                    .with_snapshot_id(SnapshotId::default().with_end_offset(7))
                    .with_records(Some(Bytes::from_static(b"abc"))),
            ]),
        ]);
        for v in 12..=18 {
            let b = encode(&f, v);
            check_body(ApiKey::Fetch, v, &b).expect("passes");
            FetchResponse::decode(&mut b.clone(), v).expect("decodes");
        }
    }
}

//! Writes the seed inputs of every fuzz target into `fuzz/seeds/<target>/`: real encoded frames,
//! ShareFetch/ShareAcknowledge responses (v1, v2) with record batches in every codec, record
//! batches, the responses decoded with kafka-protocol (Metadata, FindCoordinator,
//! ShareGroupHeartbeat, Produce, Fetch) at several versions plus a lying array length each, and
//! the example manifests, each with the selector prefix its target expects, and the admin API's
//! request bodies as `sharehost ctl` writes them (plus the empty body and a form's).
//!
//! Run from the repository root after changing an input layout (any toolchain; the root target
//! dir reuses the workspace's debug build, a fresh one would compile wasmtime again):
//! `cargo run --manifest-path fuzz/Cargo.toml --target-dir target --example gen_seeds`
//! It overwrites only the files it writes itself (the `finding-*` inputs stay).

use std::path::{Path, PathBuf};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, BrokerId, FetchResponse, FindCoordinatorResponse,
    MetadataResponse, ProduceResponse, ResponseHeader, ShareGroupHeartbeatResponse, TopicName,
    api_versions_response::ApiVersion, fetch_response, find_coordinator_response::Coordinator,
    metadata_response::MetadataResponseBroker, metadata_response::MetadataResponsePartition,
    metadata_response::MetadataResponseTopic, produce_response, share_group_heartbeat_response,
};
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::records::{Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
use sharehost::kafka::frame::encode_request;
use sharehost::kafka::records::{Compression, Header, ProduceRecord, encode_batch};
use sharehost::kafka::protocol::share::{
    AckBatch, AckPartitionResult, AckTopicResult, AcquiredRange, FetchPartitionData,
    FetchTopicResponse, LeaderIdAndEpoch, NodeEndpoint, PartitionAcks, ShareAcknowledgeResponse,
    ShareFetchRequest, ShareFetchResponse, TopicAcks,
};
use sharehost_fuzz::batch_layout::CODECS;
use sharehost_fuzz::frame_layout::{self, Api};
use sharehost_fuzz::response;
use sharehost_fuzz::share_layout::selector_byte;
use uuid::Uuid;

/// Errors are strings here: a seed generator either works or says what broke.
type Result<T> = std::result::Result<T, String>;

fn sample_records(n: usize) -> Vec<ProduceRecord> {
    (0..n)
        .map(|i| ProduceRecord {
            key: (i % 3 != 0).then(|| Bytes::from(format!("order-{i}"))),
            value: Some(Bytes::from(format!(
                "{{\"id\":{i},\"sku\":\"A-{i}\",\"quantity\":{}}}",
                i % 7 + 1
            ))),
            headers: vec![
                Header {
                    key: "trace".into(),
                    value: Some(Bytes::from(format!("t{i}"))),
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

fn batch(n: usize, codec: Compression) -> Result<Bytes> {
    encode_batch(&sample_records(n), codec).map_err(|e| e.to_string())
}

/// A transaction marker (control batch) followed by nothing: what a read_committed gap looks like.
fn control_batch() -> Result<Bytes> {
    let marker = Record {
        transactional: true,
        control: true,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: 42,
        producer_epoch: 1,
        timestamp_type: TimestampType::Creation,
        offset: 5,
        sequence: -1,
        timestamp: 1_700_000_000_000,
        // Control record key: version 0, type 1 (commit).
        key: Some(Bytes::from_static(&[0, 0, 0, 1])),
        value: Some(Bytes::from_static(&[0, 0, 0, 0, 0, 0])),
        headers: IndexMap::new(),
    };
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &[marker],
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| e.to_string())?;
    Ok(buf.freeze())
}

fn fetch_response() -> Result<ShareFetchResponse> {
    let mut partitions = Vec::new();
    for (i, codec) in CODECS.iter().enumerate() {
        partitions.push(FetchPartitionData {
            partition: i as i32,
            records: batch(3 + i, *codec)?,
            acquired: vec![AcquiredRange {
                first_offset: 0,
                last_offset: 2 + i as i64,
                delivery_count: 1 + i as i16,
            }],
            ..Default::default()
        });
    }
    partitions.push(FetchPartitionData {
        partition: 9,
        error_code: 6,
        error_message: Some("This server is not the leader for that topic-partition.".into()),
        acknowledge_error_code: 0,
        acknowledge_error_message: None,
        current_leader: LeaderIdAndEpoch {
            leader_id: 2,
            leader_epoch: 7,
        },
        records: Bytes::new(),
        acquired: vec![],
    });
    Ok(ShareFetchResponse {
        throttle_time_ms: 0,
        error_code: 0,
        error_message: None,
        acquisition_lock_timeout_ms: 30_000,
        responses: vec![FetchTopicResponse {
            topic_id: Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef),
            partitions,
        }],
        node_endpoints: vec![NodeEndpoint {
            node_id: 2,
            host: "broker-2".into(),
            port: 9092,
            rack: Some("rack-b".into()),
        }],
    })
}

fn ack_response() -> ShareAcknowledgeResponse {
    ShareAcknowledgeResponse {
        throttle_time_ms: 0,
        error_code: 0,
        error_message: None,
        acquisition_lock_timeout_ms: 15_000,
        responses: vec![AckTopicResult {
            topic_id: Uuid::from_u128(7),
            partitions: vec![
                AckPartitionResult {
                    partition: 0,
                    ..Default::default()
                },
                AckPartitionResult {
                    partition: 1,
                    error_code: 121,
                    error_message: Some("invalid record state".into()),
                    current_leader: LeaderIdAndEpoch {
                        leader_id: -1,
                        leader_epoch: -1,
                    },
                },
            ],
        }],
        node_endpoints: vec![],
    }
}

fn encode<T: Encodable>(msg: &T, version: i16) -> Result<Bytes> {
    let mut buf = BytesMut::new();
    msg.encode(&mut buf, version).map_err(|e| e.to_string())?;
    Ok(buf.freeze())
}

/// An encoding whose final (top-level) tagged-field section carries one unknown field.
fn with_unknown_tag(encoded: &Bytes) -> Bytes {
    let mut b = BytesMut::from(&encoded[..encoded.len() - 1]);
    b.put_slice(&[1, 77, 3, b'x', b'y', b'z']);
    b.freeze()
}

/// A response frame: length prefix, response header (correlation id 7), body.
fn response_frame<T: Encodable>(api: ApiKey, version: i16, body: &T) -> Result<Bytes> {
    let mut inner = BytesMut::new();
    ResponseHeader::default()
        .with_correlation_id(7)
        .encode(&mut inner, api.response_header_version(version))
        .map_err(|e| e.to_string())?;
    body.encode(&mut inner, version)
        .map_err(|e| e.to_string())?;
    let mut out = BytesMut::new();
    out.put_i32(i32::try_from(inner.len()).map_err(|e| e.to_string())?);
    out.put_slice(&inner);
    Ok(out.freeze())
}

fn prefixed(prefix: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut v = prefix.to_vec();
    v.extend_from_slice(rest);
    v
}

fn frame_seeds() -> Result<Vec<(&'static str, Vec<u8>)>> {
    let dflt = frame_layout::DEFAULT_LIMIT;
    let api = frame_layout::api_byte;
    let fetch = fetch_response()?;
    let request = ShareFetchRequest {
        group_id: "orders-validators".into(),
        member_id: "m-1".into(),
        share_session_epoch: 1,
        max_wait_ms: 500,
        min_bytes: 1,
        max_bytes: 52_428_800,
        max_records: 500,
        batch_size: 100,
        topics: vec![TopicAcks {
            topic_id: Uuid::from_u128(7),
            partitions: vec![PartitionAcks {
                partition: 0,
                batches: vec![AckBatch {
                    first_offset: 0,
                    last_offset: 9,
                    types: vec![1],
                }],
            }],
        }],
        ..Default::default()
    };
    let req_frame = encode_request(ApiKey::ShareFetch, 2, 7, "sharehost", &request)
        .map_err(|e| e.to_string())?;
    let fetch_v1 = response_frame(ApiKey::ShareFetch, 1, &fetch)?;
    let fetch_v2 = response_frame(ApiKey::ShareFetch, 2, &fetch)?;
    let api_versions = ApiVersionsResponse::default().with_api_keys(vec![
        ApiVersion::default()
            .with_api_key(ApiKey::ShareFetch as i16)
            .with_min_version(1)
            .with_max_version(2),
        ApiVersion::default()
            .with_api_key(ApiKey::Metadata as i16)
            .with_min_version(0)
            .with_max_version(13),
    ]);
    let metadata = MetadataResponse::default()
        .with_brokers(vec![
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(1))
                .with_host(StrBytes::from_static_str("127.0.0.1"))
                .with_port(9092),
        ])
        .with_cluster_id(Some(StrBytes::from_static_str("c-1")))
        .with_controller_id(BrokerId(1))
        .with_topics(vec![
            MetadataResponseTopic::default()
                .with_name(Some(TopicName(StrBytes::from_static_str("orders"))))
                .with_topic_id(Uuid::from_u128(7))
                .with_partitions(vec![
                    MetadataResponsePartition::default()
                        .with_partition_index(0)
                        .with_leader_id(BrokerId(1))
                        .with_replica_nodes(vec![BrokerId(1)])
                        .with_isr_nodes(vec![BrokerId(1)]),
                ]),
        ]);
    let coordinator = FindCoordinatorResponse::default().with_coordinators(vec![
        Coordinator::default()
            .with_key(StrBytes::from_static_str("orders-validators"))
            .with_node_id(BrokerId(1))
            .with_host(StrBytes::from_static_str("127.0.0.1"))
            .with_port(9092),
    ]);
    let heartbeat = ShareGroupHeartbeatResponse::default()
        .with_member_id(Some(StrBytes::from_static_str("m-1")))
        .with_member_epoch(3)
        .with_heartbeat_interval_ms(5000);
    let mut two = fetch_v2.to_vec();
    two.extend_from_slice(&response_frame(
        ApiKey::ShareAcknowledge,
        2,
        &ack_response(),
    )?);
    let mut lying = 0x7fff_fff0_i32.to_be_bytes().to_vec();
    lying.extend_from_slice(b"only a few bytes follow");
    let mut just_over = 65_i32.to_be_bytes().to_vec();
    just_over.extend_from_slice(&[0; 65]);
    Ok(vec![
        (
            "request-share-fetch-v2",
            prefixed(&[dflt, 0, api(Api::ShareFetchV2)], &req_frame),
        ),
        (
            "share-fetch-v1",
            prefixed(&[dflt, 0x23, api(Api::ShareFetchV1)], &fetch_v1),
        ),
        (
            "share-fetch-v2",
            prefixed(&[dflt, 0x05, api(Api::ShareFetchV2)], &fetch_v2),
        ),
        (
            "share-ack-v1",
            prefixed(
                &[dflt, 0x31, api(Api::ShareAckV1)],
                &response_frame(ApiKey::ShareAcknowledge, 1, &ack_response())?,
            ),
        ),
        (
            "fetch-then-ack-v2",
            prefixed(&[dflt, 0x07, api(Api::ShareAckV2)], &two),
        ),
        // Frames of other APIs: the reader's work is the same; their bodies do not decode as
        // share messages.
        (
            "api-versions-v3",
            prefixed(
                &[dflt, 0x02, api(Api::ShareFetchV2)],
                &response_frame(ApiKey::ApiVersions, 3, &api_versions)?,
            ),
        ),
        (
            "metadata-v12",
            prefixed(
                &[dflt, 0x00, api(Api::ShareFetchV2)],
                &response_frame(ApiKey::Metadata, 12, &metadata)?,
            ),
        ),
        (
            "find-coordinator-v6",
            prefixed(
                &[dflt, 0x11, api(Api::ShareFetchV2)],
                &response_frame(ApiKey::FindCoordinator, 6, &coordinator)?,
            ),
        ),
        (
            "share-group-heartbeat-v1",
            prefixed(
                &[dflt, 0x00, api(Api::ShareFetchV2)],
                &response_frame(ApiKey::ShareGroupHeartbeat, 1, &heartbeat)?,
            ),
        ),
        (
            "lying-length",
            prefixed(&[dflt, 0x04, api(Api::ShareFetchV2)], &lying),
        ),
        // Limit 64 (selector 1): a 65-byte frame is one too many.
        (
            "over-small-limit",
            prefixed(&[1, 0x00, api(Api::ShareFetchV2)], &just_over),
        ),
        (
            "truncated-share-fetch-v2",
            prefixed(
                &[dflt, 0x09, api(Api::ShareFetchV2)],
                &fetch_v2[..fetch_v2.len() / 2],
            ),
        ),
    ])
}

/// A response frame without its length prefix (header + body), as `decode_response` takes it.
fn unprefixed<T: Encodable>(api: ApiKey, version: i16, body: &T) -> Result<Vec<u8>> {
    Ok(response_frame(api, version, body)?[4..].to_vec())
}

/// Seeds of one response target: `[selector, frame]` at each of `versions`, plus a frame whose
/// first array claims 0x7fff_fffe elements with a few bytes after it (`lying_at`: the bytes of
/// the body before that array, at the last version).
fn response_target_seeds<T: Encodable>(
    api: ApiKey,
    all: std::ops::RangeInclusive<i16>,
    versions: &[i16],
    msg: impl Fn(i16) -> T,
    lying_at: &[u8],
) -> Result<Seeds> {
    let mut out = Vec::new();
    for &v in versions {
        let sel = response::version_byte(&all, v);
        out.push((
            format!("v{v}"),
            prefixed(&[sel], &unprefixed(api, v, &msg(v))?),
        ));
    }
    let last = *versions.last().ok_or("no versions")?;
    let mut lying = BytesMut::new();
    ResponseHeader::default()
        .with_correlation_id(7)
        .encode(&mut lying, api.response_header_version(last))
        .map_err(|e| e.to_string())?;
    lying.put_slice(lying_at);
    if api.response_header_version(last) >= 1 {
        lying.put_slice(&[0xff, 0xff, 0xff, 0xff, 0x07]); // compact length 0x7fffffff
    } else {
        lying.put_i32(0x7fff_fffe);
    }
    lying.put_slice(b"abc");
    out.push((
        format!("lying-array-length-v{last}"),
        prefixed(&[response::version_byte(&all, last)], &lying),
    ));
    Ok(out)
}

/// Named seed inputs.
type Seeds = Vec<(String, Vec<u8>)>;

fn response_seeds() -> Result<Vec<(&'static str, Seeds)>> {
    let metadata = |v: i16| {
        MetadataResponse::default()
            .with_brokers(vec![
                MetadataResponseBroker::default()
                    .with_node_id(BrokerId(1))
                    .with_host(StrBytes::from_static_str("127.0.0.1"))
                    .with_port(9092)
                    .with_rack(Some(StrBytes::from_static_str("rack-a"))),
            ])
            .with_cluster_id((v >= 2).then(|| StrBytes::from_static_str("c-1")))
            .with_controller_id(BrokerId(1))
            .with_topics(vec![
                MetadataResponseTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_static_str("orders"))))
                    .with_topic_id(Uuid::from_u128(7))
                    .with_partitions(vec![
                        MetadataResponsePartition::default()
                            .with_partition_index(0)
                            .with_leader_id(BrokerId(1))
                            .with_replica_nodes(vec![BrokerId(1), BrokerId(2)])
                            .with_isr_nodes(vec![BrokerId(1)]),
                    ]),
            ])
    };
    let coordinator = |v: i16| {
        if v < 4 {
            FindCoordinatorResponse::default()
                .with_node_id(BrokerId(1))
                .with_host(StrBytes::from_static_str("127.0.0.1"))
                .with_port(9092)
        } else {
            FindCoordinatorResponse::default().with_coordinators(vec![
                Coordinator::default()
                    .with_key(StrBytes::from_static_str("orders-validators"))
                    .with_node_id(BrokerId(1))
                    .with_host(StrBytes::from_static_str("127.0.0.1"))
                    .with_port(9092),
            ])
        }
    };
    let heartbeat = ShareGroupHeartbeatResponse::default()
        .with_member_id(Some(StrBytes::from_static_str("m-1")))
        .with_member_epoch(3)
        .with_heartbeat_interval_ms(5000)
        .with_assignment(Some(
            share_group_heartbeat_response::Assignment::default().with_topic_partitions(vec![
                share_group_heartbeat_response::TopicPartitions::default()
                    .with_topic_id(Uuid::from_u128(7))
                    .with_partitions(vec![0, 1, 2]),
            ]),
        ));
    let produce = ProduceResponse::default().with_responses(vec![
        produce_response::TopicProduceResponse::default()
            .with_name(TopicName(StrBytes::from_static_str("orders")))
            .with_partition_responses(vec![
                produce_response::PartitionProduceResponse::default()
                    .with_index(0)
                    .with_base_offset(42),
            ]),
    ]);
    let fetch = FetchResponse::default().with_responses(vec![
        fetch_response::FetchableTopicResponse::default()
            .with_topic(TopicName(StrBytes::from_static_str("orders")))
            .with_partitions(vec![
                fetch_response::PartitionData::default()
                    .with_partition_index(0)
                    .with_high_watermark(3)
                    .with_records(Some(batch(3, Compression::Lz4)?)),
                fetch_response::PartitionData::default()
                    .with_partition_index(1)
                    .with_aborted_transactions(Some(vec![
                        fetch_response::AbortedTransaction::default()
                            .with_producer_id(kafka_protocol::messages::ProducerId(5)),
                    ]))
                    .with_records(Some(control_batch()?)),
            ]),
    ]);
    Ok(vec![
        (
            "metadata_response",
            response_target_seeds(
                ApiKey::Metadata,
                0..=13,
                &[1, 9, 10, 12, 13],
                metadata,
                &[0; 4],
            )?,
        ),
        (
            "find_coordinator_response",
            response_target_seeds(
                ApiKey::FindCoordinator,
                0..=6,
                &[2, 3, 4, 6],
                coordinator,
                &[0; 4],
            )?,
        ),
        (
            "share_group_heartbeat_response",
            response_target_seeds(
                ApiKey::ShareGroupHeartbeat,
                1..=1,
                &[1],
                |_| heartbeat.clone(),
                // throttle, error, null message, member id "m", epoch, interval, assignment
                &[0, 0, 0, 0, 0, 0, 0, 2, b'm', 0, 0, 0, 1, 0, 0, 0, 1, 1],
            )?,
        ),
        (
            "produce_response",
            response_target_seeds(
                ApiKey::Produce,
                3..=13,
                &[3, 8, 9, 12],
                |_| produce.clone(),
                &[],
            )?,
        ),
        (
            "fetch_response",
            response_target_seeds(
                ApiKey::Fetch,
                4..=18,
                &[4, 11, 12, 16],
                |_| fetch.clone(),
                &[0; 10],
            )?,
        ),
    ])
}

fn share_seeds() -> Result<Vec<(&'static str, Vec<u8>)>> {
    let fetch = fetch_response()?;
    let mut out = Vec::new();
    for (v, fetch_name, tag_name, ack_name) in [
        (1, "fetch-v1", "fetch-v1-unknown-tag", "ack-v1"),
        (2, "fetch-v2", "fetch-v2-unknown-tag", "ack-v2"),
    ] {
        let body = encode(&fetch, v)?;
        out.push((fetch_name, prefixed(&[selector_byte(v, false)], &body)));
        out.push((
            tag_name,
            prefixed(&[selector_byte(v, false)], &with_unknown_tag(&body)),
        ));
        out.push((
            ack_name,
            prefixed(&[selector_byte(v, true)], &encode(&ack_response(), v)?),
        ));
    }
    out.push((
        "fetch-v2-empty",
        prefixed(
            &[selector_byte(2, false)],
            &encode(&ShareFetchResponse::default(), 2)?,
        ),
    ));
    Ok(out)
}

fn batch_seeds() -> Result<Vec<(&'static str, Vec<u8>)>> {
    const NAMES: [&str; 5] = [
        "batch-none",
        "batch-gzip",
        "batch-snappy",
        "batch-lz4",
        "batch-zstd",
    ];
    let mut out = Vec::new();
    for (i, (codec, name)) in CODECS.iter().zip(NAMES).enumerate() {
        // Re-encode in the next codec, so every decode codec meets another encode codec.
        out.push((name, prefixed(&[(i as u8 + 1) % 5], &batch(4, *codec)?)));
    }
    let mut two = batch(2, Compression::None)?.to_vec();
    two.extend_from_slice(&batch(3, Compression::Zstd)?);
    out.push(("two-batches", prefixed(&[0], &two)));
    let mut partial = batch(2, Compression::Gzip)?.to_vec();
    let next = batch(3, Compression::None)?;
    partial.extend_from_slice(&next[..next.len() - 7]);
    out.push(("partial-trailing", prefixed(&[1], &partial)));
    let mut control = control_batch()?.to_vec();
    control.extend_from_slice(&batch(1, Compression::Snappy)?);
    out.push(("control-then-data", prefixed(&[3], &control)));
    let nulls = encode_batch(
        &[ProduceRecord {
            key: None,
            value: None,
            headers: vec![],
            timestamp: Some(0),
        }],
        Compression::None,
    )
    .map_err(|e| e.to_string())?;
    out.push(("null-key-and-value", prefixed(&[4], &nulls)));
    Ok(out)
}

/// The first ```toml block of a markdown file.
fn toml_block(md: &str) -> Result<String> {
    let start = md.find("```toml\n").ok_or("no ```toml block")? + "```toml\n".len();
    let len = md[start..]
        .find("```")
        .ok_or("unterminated ```toml block")?;
    Ok(md[start..start + len].to_owned())
}

fn manifest_seeds(root: &Path) -> Result<Vec<(&'static str, Vec<u8>)>> {
    let read = |p: &str| std::fs::read_to_string(root.join(p)).map_err(|e| format!("{p}: {e}"));
    let orders = read("examples/orders.toml")?;
    let reference = toml_block(&read("docs/manifest.md")?)?;
    let reference_local = reference.replace("/etc/sharehost/ca.pem", "ca.pem");
    let minimal = "[cluster]\nbootstrap = \"127.0.0.1:9092\"\n\n[[pipeline]]\nname = \"orders\"\n\
                   topics = [\"orders\"]\ngroup = \"orders-g\"\ncomponent = \"plugin.wasm\"\n";
    let mtls = format!(
        "[cluster]\nbootstrap = \"[::1]:9094,b2:9094\"\n\n[cluster.tls]\nca_file = \"ca.pem\"\n\
         cert_file = \"client.pem\"\nkey_file = \"client.key\"\nserver_name = \"kafka\"\n\n\
         [cluster.sasl]\nmechanism = \"PLAIN\"\nusername = \"u\"\npassword_file = \"password.txt\"\n\n\
         {}\n[[pipeline]]\nname = \"second\"\ntopics = [\"a\", \"b\"]\ngroup = \"g2\"\n\
         component = \"plugin.wasm\"\ninstance_mode = \"fresh\"\nfault_policy = \"reject\"\n\
         dead_letter_topic = \"dlq\"\nauto_renew_after = 0.9\n",
        &minimal[minimal.find("[[pipeline]]").unwrap_or(0)..]
    );
    let unknown_field = minimal.replace("group =", "grup =");
    let bad_value = format!("{minimal}batch_size = 0\n");
    let wrong_type = format!("{minimal}max_in_flight = \"many\"\n");
    let duplicate = format!(
        "{minimal}\n{}",
        &minimal[minimal.find("[[pipeline]]").unwrap_or(0)..]
    );
    Ok(vec![
        ("examples-orders", orders.into_bytes()),
        ("docs-reference", reference.into_bytes()),
        ("docs-reference-local-ca", reference_local.into_bytes()),
        ("minimal", minimal.as_bytes().to_vec()),
        ("mtls-plain-two-pipelines", mtls.into_bytes()),
        ("unknown-field", unknown_field.into_bytes()),
        ("bad-value", bad_value.into_bytes()),
        ("wrong-type", wrong_type.into_bytes()),
        ("duplicate-name", duplicate.into_bytes()),
    ])
}

/// The admin API's request bodies, written from its own types as `sharehost ctl` sends them,
/// every optional field given; the empty body (read as `{}`); and what a `text/plain` form on
/// another site would post.
fn admin_body_seeds() -> Result<Vec<(&'static str, Vec<u8>)>> {
    use sharehost::api::{
        CanaryBody, PromoteAfterBody, ReplayRequest, RollbackIfBody, RollbackRequest, ShadowBody,
        SwapRequest,
    };
    fn json<T: serde::Serialize>(body: &T) -> Result<Vec<u8>> {
        serde_json::to_vec(body).map_err(|e| e.to_string())
    }
    Ok(vec![
        (
            "swap",
            json(&SwapRequest {
                path: "/srv/plugins/orders.wasm".into(),
            })?,
        ),
        (
            "rollback",
            json(&RollbackRequest {
                hash: Some("ab12".into()),
            })?,
        ),
        (
            "shadow",
            json(&ShadowBody {
                path: "candidate.wasm".into(),
                sample: Some(0.5),
            })?,
        ),
        (
            "canary",
            json(&CanaryBody {
                path: "candidate.wasm".into(),
                percent: 10.0,
                promote_after: Some(PromoteAfterBody {
                    batches: Some(100),
                    seconds: Some(600),
                }),
                rollback_if: Some(RollbackIfBody {
                    max_fault_rate: Some(0.01),
                    max_reject_rate_increase: Some(0.05),
                    max_release_rate_increase: Some(0.05),
                }),
            })?,
        ),
        (
            "replay",
            json(&ReplayRequest {
                reason: Some("^ledger: .*$".into()),
                offsets: Some("0..10".into()),
                partition: Some(2),
                dry_run: true,
            })?,
        ),
        ("empty", Vec::new()),
        ("form", b"path=%2Fsrv%2Fevil.wasm".to_vec()),
    ])
}

fn write<N: AsRef<Path>>(dir: &Path, seeds: Vec<(N, Vec<u8>)>) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (name, bytes) in seeds {
        let p = dir.join(name.as_ref());
        std::fs::write(&p, bytes).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

fn main() -> Result<()> {
    let fuzz = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = fuzz.parent().ok_or("fuzz/ has no parent")?;
    let seeds = fuzz.join("seeds");
    write(&seeds.join("frame"), frame_seeds()?)?;
    write(&seeds.join("share_fetch_response"), share_seeds()?)?;
    write(&seeds.join("record_batch"), batch_seeds()?)?;
    write(&seeds.join("manifest"), manifest_seeds(root)?)?;
    write(&seeds.join("admin_body"), admin_body_seeds()?)?;
    for (target, list) in response_seeds()? {
        write(&seeds.join(target), list)?;
    }
    println!("seeds written to {}", seeds.display());
    Ok(())
}

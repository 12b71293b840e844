//! A small fake Kafka broker on loopback for the malicious-broker tests (`tests/hostile_broker.rs`).
//!
//! It is not a mock of the protocol: what those tests check is our decoder and what the host does
//! with a response it cannot decode, so the fake answers ApiVersions, Metadata, FindCoordinator,
//! Produce and Fetch honestly (one broker, itself; one topic with one partition) and lets the
//! test replace any answer with crafted bytes. Claims about the protocol itself are tested
//! against the real broker elsewhere.
//!
//! Plain std threads and blocking sockets, so the fake is independent of the test's runtime.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, BrokerId, FetchResponse, FindCoordinatorResponse,
    InitProducerIdResponse, MetadataResponse, ProduceResponse, ProducerId, ResponseHeader,
    TopicName, api_versions_response::ApiVersion, fetch_response,
    find_coordinator_response::Coordinator, metadata_response::MetadataResponseBroker,
    metadata_response::MetadataResponsePartition, metadata_response::MetadataResponseTopic,
    produce_response,
};
use kafka_protocol::protocol::{Encodable, StrBytes};
use uuid::Uuid;

/// The one topic the fake broker knows.
pub const TOPIC: &str = "orders";
/// Its id.
pub const TOPIC_ID: Uuid = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
/// The fake broker's node id.
pub const NODE_ID: i32 = 1;

/// One request as the fake broker saw it.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    /// Its API.
    pub api: ApiKey,
    /// Its version.
    pub version: i16,
    /// Which connection (0 = the first accepted) carried it.
    pub connection: usize,
    /// How many requests of this API came before it, over all connections.
    pub nth: usize,
    /// When it was read.
    pub at: std::time::Instant,
}

/// What to answer.
pub enum Answer {
    /// The honest answer (or, for an API the fake does not speak, a closed connection).
    Honest,
    /// This response body (the fake writes the response header and length prefix).
    Body(Vec<u8>),
}

type Script = dyn Fn(&Seen) -> Answer + Send + Sync;

#[derive(Default)]
struct State {
    requests: Vec<Seen>,
    connections: usize,
    /// Connections the client closed (the fake read end-of-stream on them).
    closed_by_client: Vec<usize>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    stop: AtomicBool,
    addr: SocketAddr,
    script: Box<Script>,
}

/// A fake broker listening on 127.0.0.1 (an ephemeral port) until dropped.
pub struct FakeBroker {
    shared: Arc<Shared>,
}

impl FakeBroker {
    /// Starts the broker; `script` picks the answer to each request.
    pub fn start(script: impl Fn(&Seen) -> Answer + Send + Sync + 'static) -> FakeBroker {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            addr,
            script: Box::new(script),
        });
        let s = shared.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if s.stop.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let id = {
                    let mut st = lock(&s.state);
                    st.connections += 1;
                    st.connections - 1
                };
                s.changed.notify_all();
                let s = s.clone();
                std::thread::spawn(move || serve(&s, stream, id));
            }
        });
        FakeBroker { shared }
    }

    /// The bootstrap address.
    pub fn addr(&self) -> String {
        self.shared.addr.to_string()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        lock(&self.shared.state).connections
    }

    /// Requests seen so far, in order.
    pub fn requests(&self) -> Vec<Seen> {
        lock(&self.shared.state).requests.clone()
    }

    /// Waits until `cond` holds over (requests, connections, connections closed by the client),
    /// at most 30 s (then panics naming `what`): an awaited event, not a sleep.
    pub fn wait_until(&self, what: &str, cond: impl Fn(&[Seen], usize, &[usize]) -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut st = lock(&self.shared.state);
        while !cond(&st.requests, st.connections, &st.closed_by_client) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(!left.is_zero(), "fake broker: timed out waiting for {what}");
            st = self
                .shared
                .changed
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }
}

impl Drop for FakeBroker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.shared.addr);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves one connection until the client closes it, the script answers an API the fake does
/// not speak, or the broker stops.
fn serve(s: &Shared, mut stream: TcpStream, id: usize) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    loop {
        if s.stop.load(Ordering::Relaxed) {
            return;
        }
        let frame = match read_frame(&mut stream, &s.stop) {
            Ok(Some(f)) => f,
            Ok(None) => {
                lock(&s.state).closed_by_client.push(id);
                s.changed.notify_all();
                return;
            }
            Err(_) => return,
        };
        if frame.len() < 8 {
            return;
        }
        let key = i16::from_be_bytes([frame[0], frame[1]]);
        let version = i16::from_be_bytes([frame[2], frame[3]]);
        let correlation = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
        let Ok(api) = ApiKey::try_from(key) else {
            return;
        };
        let seen = {
            let mut st = lock(&s.state);
            let nth = st.requests.iter().filter(|r| r.api == api).count();
            let seen = Seen {
                api,
                version,
                connection: id,
                nth,
                at: std::time::Instant::now(),
            };
            st.requests.push(seen);
            seen
        };
        s.changed.notify_all();
        let body = match (s.script)(&seen) {
            Answer::Body(b) => b,
            Answer::Honest => match honest(api, version, s.addr) {
                Some(b) => b,
                None => return,
            },
        };
        let mut out = BytesMut::new();
        out.put_i32(0);
        let header = ResponseHeader::default().with_correlation_id(correlation);
        if header
            .encode(&mut out, api.response_header_version(version))
            .is_err()
        {
            return;
        }
        out.put_slice(&body);
        let len = i32::try_from(out.len() - 4).unwrap_or(i32::MAX);
        out[..4].copy_from_slice(&len.to_be_bytes());
        if stream.write_all(&out).is_err() {
            return;
        }
    }
}

/// One request frame without its length prefix; `None` when the client closed the connection.
fn read_frame(stream: &mut TcpStream, stop: &AtomicBool) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    if !read_exact(stream, &mut len, stop)? {
        return Ok(None);
    }
    let n = usize::try_from(i32::from_be_bytes(len))
        .unwrap_or(0)
        .min(1 << 20);
    let mut frame = vec![0u8; n];
    if !read_exact(stream, &mut frame, stop)? {
        return Ok(None);
    }
    Ok(Some(frame))
}

/// Fills `buf`, riding out read timeouts (which only let the loop see `stop`); `false` on end
/// of stream.
fn read_exact(stream: &mut TcpStream, buf: &mut [u8], stop: &AtomicBool) -> std::io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match stream.read(&mut buf[got..]) {
            Ok(0) => return Ok(false),
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if stop.load(Ordering::Relaxed) {
                    return Err(e);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn encode<T: Encodable>(msg: &T, version: i16) -> Option<Vec<u8>> {
    let mut b = BytesMut::new();
    msg.encode(&mut b, version).ok()?;
    Some(b.to_vec())
}

/// The honest answer of a one-broker cluster with one topic, or `None` for an API the fake
/// does not speak.
fn honest(api: ApiKey, version: i16, addr: SocketAddr) -> Option<Vec<u8>> {
    let host = StrBytes::from_string(addr.ip().to_string());
    let port = i32::from(addr.port());
    match api {
        ApiKey::ApiVersions => {
            let keys = [
                (ApiKey::Produce, 3, 12),
                (ApiKey::Fetch, 4, 12),
                (ApiKey::ListOffsets, 1, 10),
                (ApiKey::Metadata, 10, 13),
                (ApiKey::FindCoordinator, 4, 6),
                (ApiKey::InitProducerId, 0, 5),
                (ApiKey::ApiVersions, 0, 4),
                (ApiKey::ShareGroupHeartbeat, 1, 1),
                (ApiKey::ShareFetch, 1, 2),
                (ApiKey::ShareAcknowledge, 1, 2),
            ];
            let resp = ApiVersionsResponse::default().with_api_keys(
                keys.iter()
                    .map(|(k, min, max)| {
                        ApiVersion::default()
                            .with_api_key(*k as i16)
                            .with_min_version(*min)
                            .with_max_version(*max)
                    })
                    .collect(),
            );
            encode(&resp, version)
        }
        ApiKey::Metadata => {
            let resp = MetadataResponse::default()
                .with_brokers(vec![
                    MetadataResponseBroker::default()
                        .with_node_id(BrokerId(NODE_ID))
                        .with_host(host)
                        .with_port(port),
                ])
                .with_controller_id(BrokerId(NODE_ID))
                .with_topics(vec![
                    MetadataResponseTopic::default()
                        .with_name(Some(TopicName(StrBytes::from_static_str(TOPIC))))
                        .with_topic_id(TOPIC_ID)
                        .with_partitions(vec![
                            MetadataResponsePartition::default()
                                .with_leader_id(BrokerId(NODE_ID))
                                .with_replica_nodes(vec![BrokerId(NODE_ID)])
                                .with_isr_nodes(vec![BrokerId(NODE_ID)]),
                        ]),
                ]);
            encode(&resp, version)
        }
        ApiKey::FindCoordinator => {
            let resp = FindCoordinatorResponse::default().with_coordinators(vec![
                Coordinator::default()
                    .with_key(StrBytes::from_static_str("hostile-group"))
                    .with_node_id(BrokerId(NODE_ID))
                    .with_host(host)
                    .with_port(port),
            ]);
            encode(&resp, version)
        }
        ApiKey::InitProducerId => {
            let resp = InitProducerIdResponse::default()
                .with_producer_id(ProducerId(1))
                .with_producer_epoch(0);
            encode(&resp, version)
        }
        ApiKey::Produce => {
            let resp = ProduceResponse::default().with_responses(vec![
                produce_response::TopicProduceResponse::default()
                    .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
                    .with_partition_responses(vec![
                        produce_response::PartitionProduceResponse::default().with_base_offset(0),
                    ]),
            ]);
            encode(&resp, version)
        }
        ApiKey::Fetch => {
            let resp = FetchResponse::default().with_responses(vec![
                fetch_response::FetchableTopicResponse::default()
                    .with_topic(TopicName(StrBytes::from_static_str(TOPIC)))
                    .with_partitions(vec![
                        fetch_response::PartitionData::default()
                            .with_records(Some(bytes::Bytes::new())),
                    ]),
            ]);
            encode(&resp, version)
        }
        _ => None,
    }
}

/// A response body of `api` at `version` whose first array claims 0x7fff_fffe elements and
/// carries three bytes: the lie that aborted the host before responses were bounded.
/// `before` is the body up to that array (fixed-width fields).
pub fn lying_array_body(flexible: bool, before: &[u8]) -> Vec<u8> {
    let mut b = before.to_vec();
    if flexible {
        b.extend([0xff, 0xff, 0xff, 0xff, 0x07]); // compact length 0x7fffffff
    } else {
        b.extend(0x7fff_fffe_i32.to_be_bytes());
    }
    b.extend([0, 0, 0]);
    b
}

/// The script of a member whose one partition keeps moving: every ShareGroupHeartbeat assigns
/// partition 0 of [`TOPIC`], every ShareFetch answers it NOT_LEADER_OR_FOLLOWER with no records
/// (while the metadata still names this broker its leader), ShareAcknowledge succeeds.
pub fn moving_partition() -> impl Fn(&Seen) -> Answer + Send + Sync + 'static {
    use kafka_protocol::messages::ShareGroupHeartbeatResponse;
    use kafka_protocol::messages::share_group_heartbeat_response::{Assignment, TopicPartitions};
    use sharehost::kafka::protocol::share::{
        FetchPartitionData, FetchTopicResponse, ShareAcknowledgeResponse, ShareFetchResponse,
    };

    fn encode<T: Encodable>(msg: &T, version: i16) -> Vec<u8> {
        let mut b = BytesMut::new();
        msg.encode(&mut b, version).expect("encode");
        b.to_vec()
    }
    move |seen| match seen.api {
        ApiKey::ShareGroupHeartbeat => Answer::Body(encode(
            &ShareGroupHeartbeatResponse::default()
                .with_member_id(Some(kafka_protocol::protocol::StrBytes::from_static_str(
                    "m",
                )))
                .with_member_epoch(i32::try_from(seen.nth + 1).unwrap_or(1))
                .with_heartbeat_interval_ms(200)
                .with_assignment(Some(Assignment::default().with_topic_partitions(vec![
                    TopicPartitions::default()
                        .with_topic_id(TOPIC_ID)
                        .with_partitions(vec![0]),
                ]))),
            seen.version,
        )),
        ApiKey::ShareFetch => Answer::Body(encode(
            &ShareFetchResponse {
                acquisition_lock_timeout_ms: 30_000,
                responses: vec![FetchTopicResponse {
                    topic_id: TOPIC_ID,
                    partitions: vec![FetchPartitionData {
                        partition: 0,
                        error_code: kafka_protocol::ResponseError::NotLeaderOrFollower.code(),
                        ..Default::default()
                    }],
                }],
                ..Default::default()
            },
            seen.version,
        )),
        ApiKey::ShareAcknowledge => {
            Answer::Body(encode(&ShareAcknowledgeResponse::default(), seen.version))
        }
        _ => Answer::Honest,
    }
}

/// The script of a share-group member test: the first ShareGroupHeartbeat answer lies about its
/// assignment array's length (0x7fff_fffe entries in three bytes), later ones assign partition
/// 0 of [`TOPIC`]; the first ShareFetch answer carries one batch of `values` (offsets 0, 1, ...)
/// but acquires `0..=i64::MAX`, later ones are empty; ShareAcknowledge succeeds.
pub fn lying_share_member(values: &[&str]) -> impl Fn(&Seen) -> Answer + Send + Sync + 'static {
    use kafka_protocol::messages::ShareGroupHeartbeatResponse;
    use kafka_protocol::messages::share_group_heartbeat_response::{Assignment, TopicPartitions};
    use sharehost::kafka::protocol::share::{
        AcquiredRange, FetchPartitionData, FetchTopicResponse, ShareAcknowledgeResponse,
        ShareFetchResponse,
    };
    use sharehost::kafka::records::encode_batch;
    use sharehost::kafka::{Compression, ProduceRecord};

    fn encode<T: Encodable>(msg: &T, version: i16) -> Vec<u8> {
        let mut b = BytesMut::new();
        msg.encode(&mut b, version).expect("encode");
        b.to_vec()
    }

    let records: Vec<ProduceRecord> = values
        .iter()
        .map(|v| ProduceRecord {
            value: Some(bytes::Bytes::copy_from_slice(v.as_bytes())),
            ..Default::default()
        })
        .collect();
    let batch = encode_batch(&records, Compression::None).expect("batch");
    move |seen| match (seen.api, seen.nth) {
        // throttle, error, null message, null member id, epoch, interval, assignment present,
        // then the topic-partitions array: 0x7fff_fffe entries, three bytes.
        (ApiKey::ShareGroupHeartbeat, 0) => {
            let mut before = vec![0u8; 4 + 2];
            before.extend([0, 0]);
            before.extend([0u8; 8]);
            before.push(1);
            Answer::Body(lying_array_body(true, &before))
        }
        (ApiKey::ShareGroupHeartbeat, _) => Answer::Body(encode(
            &ShareGroupHeartbeatResponse::default()
                .with_member_epoch(i32::try_from(seen.nth).unwrap_or(1))
                .with_heartbeat_interval_ms(200)
                .with_assignment(Some(Assignment::default().with_topic_partitions(vec![
                    TopicPartitions::default()
                        .with_topic_id(TOPIC_ID)
                        .with_partitions(vec![0]),
                ]))),
            seen.version,
        )),
        (ApiKey::ShareFetch, n) => {
            let partition = if n == 0 {
                FetchPartitionData {
                    partition: 0,
                    records: batch.clone(),
                    acquired: vec![AcquiredRange {
                        first_offset: 0,
                        last_offset: i64::MAX,
                        delivery_count: 1,
                    }],
                    ..Default::default()
                }
            } else {
                FetchPartitionData::default()
            };
            Answer::Body(encode(
                &ShareFetchResponse {
                    acquisition_lock_timeout_ms: 30_000,
                    responses: vec![FetchTopicResponse {
                        topic_id: TOPIC_ID,
                        partitions: vec![partition],
                    }],
                    ..Default::default()
                },
                seen.version,
            ))
        }
        (ApiKey::ShareAcknowledge, _) => {
            Answer::Body(encode(&ShareAcknowledgeResponse::default(), seen.version))
        }
        _ => Answer::Honest,
    }
}

//! One multiplexed connection to one broker: correlation ids, a writer task, a reader task, and
//! a oneshot per request. It moves frames and knows nothing of what is in them.
//!
//! Cancellation safety comes from the split: a caller only ever hands a complete frame to the
//! writer task through a channel (which either takes the whole frame or nothing), so dropping a
//! caller can never leave half a frame on the socket; and a guard removes the caller's pending
//! entry when it is dropped, so nothing is left waiting for a response nobody reads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::Encodable;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::addr::BrokerAddr;
use super::error::KafkaError;
use super::frame::{self, FrameError};

/// How many complete frames may queue for the writer before callers wait.
const WRITE_QUEUE: usize = 64;

type Reply = oneshot::Sender<Result<Bytes, KafkaError>>;

struct State {
    pending: HashMap<i32, Reply>,
    /// Set once, when the connection dies; every later request fails fast with it.
    dead: Option<Arc<str>>,
}

struct Shared {
    broker: BrokerAddr,
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means another task panicked while holding it; the map itself is
        // still consistent (every operation on it is a single insert/remove).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the connection dead and fails every pending request with the same reason.
    fn die(&self, reason: &str) {
        let drained: Vec<Reply> = {
            let mut st = self.lock();
            if st.dead.is_some() {
                return;
            }
            st.dead = Some(Arc::from(reason));
            st.pending.drain().map(|(_, tx)| tx).collect()
        };
        tracing::debug!(broker = %self.broker, reason, "connection closed");
        let reason: Arc<str> = Arc::from(reason);
        for tx in drained {
            let _ = tx.send(Err(KafkaError::ConnectionLost {
                broker: self.broker.clone(),
                reason: reason.clone(),
            }));
        }
    }
}

/// Removes a request's pending entry when the request future is dropped or finishes.
struct PendingGuard<'a> {
    shared: &'a Shared,
    correlation_id: i32,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.shared.lock().pending.remove(&self.correlation_id);
    }
}

/// Frame-level settings of a connection.
#[derive(Debug, Clone)]
pub struct MessengerConfig {
    /// Sent in every request header; shows up in broker logs and quotas.
    pub client_id: String,
    /// Largest response frame accepted.
    pub max_frame_bytes: usize,
}

/// A multiplexed, cancel-safe request/response channel to one broker.
pub struct Messenger {
    shared: Arc<Shared>,
    writes: mpsc::Sender<Bytes>,
    next_correlation_id: AtomicI32,
    client_id: String,
    _tasks: DropGuard,
}

impl Messenger {
    /// Takes over `stream` (already connected, TLS done) and starts its reader and writer tasks.
    pub fn new<S>(stream: S, broker: BrokerAddr, config: MessengerConfig) -> Messenger
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (mut reader, mut writer) = tokio::io::split(stream);
        let shared = Arc::new(Shared {
            broker,
            state: Mutex::new(State {
                pending: HashMap::new(),
                dead: None,
            }),
        });
        let cancel = CancellationToken::new();
        let (tx, mut rx) = mpsc::channel::<Bytes>(WRITE_QUEUE);

        let w_shared = shared.clone();
        let w_cancel = cancel.clone();
        tokio::spawn(async move {
            loop {
                let frame = tokio::select! {
                    _ = w_cancel.cancelled() => break,
                    f = rx.recv() => match f { Some(f) => f, None => break },
                };
                // Each frame is written whole; this task is the only writer.
                if let Err(e) = writer.write_all(&frame).await {
                    w_shared.die(&format!("write failed: {e}"));
                    break;
                }
            }
            let _ = writer.shutdown().await;
        });

        let r_shared = shared.clone();
        let r_cancel = cancel.clone();
        let max = config.max_frame_bytes;
        tokio::spawn(async move {
            loop {
                let res = tokio::select! {
                    _ = r_cancel.cancelled() => {
                        r_shared.die("connection closed by the client");
                        break;
                    }
                    r = frame::read_frame(&mut reader, max) => r,
                };
                match res {
                    Ok(frame) => {
                        let Some(id) = frame::peek_correlation_id(&frame) else {
                            continue;
                        };
                        let waiter = r_shared.lock().pending.remove(&id);
                        match waiter {
                            Some(tx) => {
                                let _ = tx.send(Ok(frame));
                            }
                            // The caller gave up (timeout or drop); the response is late.
                            None => {
                                tracing::debug!(broker = %r_shared.broker, id, "dropping response nobody waits for")
                            }
                        }
                    }
                    Err(e) => {
                        let reason = match e {
                            FrameError::Closed { mid_frame: false } => {
                                "closed by the broker".to_owned()
                            }
                            other => other.to_string(),
                        };
                        r_shared.die(&reason);
                        break;
                    }
                }
            }
        });

        Messenger {
            shared,
            writes: tx,
            next_correlation_id: AtomicI32::new(1),
            client_id: config.client_id,
            _tasks: cancel.drop_guard(),
        }
    }

    /// The broker this connection talks to.
    pub fn broker(&self) -> &BrokerAddr {
        &self.shared.broker
    }

    /// Why the connection died, or `None` while it is usable.
    pub fn dead_reason(&self) -> Option<Arc<str>> {
        self.shared.lock().dead.clone()
    }

    /// Requests currently waiting for a response (tests use it to prove nothing leaks).
    pub fn pending_requests(&self) -> usize {
        self.shared.lock().pending.len()
    }

    /// Kills the connection on purpose, failing everything pending. Share sessions live and
    /// die with their TCP connection, so a caller that cannot trust the session state anymore
    /// (a timed-out ShareFetch) closes the connection instead of guessing.
    pub fn close(&self, reason: &str) {
        self.shared.die(reason);
        // Dropping the write side is not possible while other callers hold the sender; the
        // dead flag makes every later request fail, and the tasks stop when the messenger drops.
    }

    /// Sends one request and waits for its response frame (header included).
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped, either the whole frame was queued for writing or
    /// none of it was, and the pending entry is removed. A response that arrives later is
    /// discarded by the reader task.
    pub async fn request<B: Encodable>(
        &self,
        api: ApiKey,
        version: i16,
        body: &B,
        timeout: Duration,
    ) -> Result<Bytes, KafkaError> {
        let id = self.next_id();
        let frame =
            frame::encode_request(api, version, id, &self.client_id, body).map_err(|e| {
                KafkaError::Encode {
                    api,
                    version,
                    reason: e.to_string(),
                }
            })?;
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.shared.lock();
            if let Some(reason) = &st.dead {
                return Err(self.lost(reason.clone()));
            }
            st.pending.insert(id, tx);
        }
        let _guard = PendingGuard {
            shared: &self.shared,
            correlation_id: id,
        };
        let work = async {
            self.writes
                .send(frame)
                .await
                .map_err(|_| self.lost(Arc::from("writer stopped")))?;
            match rx.await {
                Ok(r) => r,
                Err(_) => Err(self.lost(
                    self.dead_reason()
                        .unwrap_or_else(|| Arc::from("reader stopped")),
                )),
            }
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(KafkaError::Timeout {
                broker: self.shared.broker.clone(),
                api,
                version,
                timeout,
            }),
        }
    }

    fn lost(&self, reason: Arc<str>) -> KafkaError {
        KafkaError::ConnectionLost {
            broker: self.shared.broker.clone(),
            reason,
        }
    }

    fn next_id(&self) -> i32 {
        // Wraps around at i32::MAX back to 0; ids only need to be unique among pending requests.
        self.next_correlation_id
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(if v == i32::MAX { 0 } else { v + 1 })
            })
            .unwrap_or(0)
    }
}

impl std::fmt::Debug for Messenger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Messenger")
            .field("broker", &self.shared.broker)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{Buf, BufMut, BytesMut};
    use kafka_protocol::messages::{MetadataRequest, RequestHeader};
    use kafka_protocol::protocol::Decodable;
    use tokio::io::{AsyncReadExt, DuplexStream};

    fn cfg() -> MessengerConfig {
        MessengerConfig {
            client_id: "test".into(),
            max_frame_bytes: 1 << 20,
        }
    }

    /// A tiny in-memory broker: reads whole request frames, checks each decodes, and answers
    /// each with a frame holding only its correlation id, unless told to stay silent.
    async fn echo_broker(
        mut s: DuplexStream,
        silent_for: Option<i32>,
        frames_seen: mpsc::UnboundedSender<i32>,
    ) {
        loop {
            let mut len = [0u8; 4];
            if s.read_exact(&mut len).await.is_err() {
                return;
            }
            let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
            if s.read_exact(&mut body).await.is_err() {
                return;
            }
            let mut b = Bytes::from(body);
            let header = RequestHeader::decode(&mut b, 2).expect("a whole, well-formed frame");
            MetadataRequest::decode(&mut b, 12).expect("a whole body");
            assert!(!b.has_remaining(), "no trailing bytes from another frame");
            let _ = frames_seen.send(header.correlation_id);
            if Some(header.correlation_id) == silent_for {
                continue;
            }
            let mut out = BytesMut::new();
            out.put_i32(4);
            out.put_i32(header.correlation_id);
            if s.write_all(&out).await.is_err() {
                return;
            }
        }
    }

    #[tokio::test]
    async fn concurrent_requests_get_their_own_responses() {
        let (client, server) = tokio::io::duplex(1024);
        let (seen_tx, _seen) = mpsc::unbounded_channel();
        tokio::spawn(echo_broker(server, None, seen_tx));
        let m = Arc::new(Messenger::new(client, BrokerAddr::new("mem", 1), cfg()));
        let mut handles = Vec::new();
        for _ in 0..20 {
            let m = m.clone();
            handles.push(tokio::spawn(async move {
                m.request(
                    ApiKey::Metadata,
                    12,
                    &MetadataRequest::default(),
                    Duration::from_secs(5),
                )
                .await
            }));
        }
        for h in handles {
            let frame = h.await.expect("join").expect("response");
            assert_eq!(frame.len(), 4);
        }
        assert_eq!(m.pending_requests(), 0);
    }

    #[tokio::test]
    async fn dropped_caller_leaves_no_half_frame_and_no_pending_entry() {
        // A 16-byte pipe forces the frame to be written in many small pieces, so the caller is
        // dropped while its frame is still being written.
        let (client, server) = tokio::io::duplex(16);
        let (seen_tx, mut seen) = mpsc::unbounded_channel();
        let m = Messenger::new(client, BrokerAddr::new("mem", 1), cfg());
        let topics: Vec<_> = (0..50)
            .map(|i| {
                kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                    .with_name(Some(kafka_protocol::messages::TopicName(
                        kafka_protocol::protocol::StrBytes::from_string(format!("topic-{i}")),
                    )))
            })
            .collect();
        let big = MetadataRequest::default().with_topics(Some(topics));
        // Start the request and drop it before the broker has read anything.
        {
            let fut = m.request(ApiKey::Metadata, 12, &big, Duration::from_secs(5));
            tokio::pin!(fut);
            let polled = futures::poll!(fut.as_mut());
            assert!(polled.is_pending());
        }
        assert_eq!(
            m.pending_requests(),
            0,
            "the dropped caller's entry is gone"
        );
        // Only now does the broker start reading: it must see whole frames only (it asserts so).
        tokio::spawn(echo_broker(server, None, seen_tx));
        let r = m
            .request(
                ApiKey::Metadata,
                12,
                &MetadataRequest::default(),
                Duration::from_secs(5),
            )
            .await;
        assert!(r.is_ok(), "the connection still works: {r:?}");
        assert_eq!(m.pending_requests(), 0);
        let first = seen.recv().await.expect("frame");
        let second = seen.recv().await.expect("frame");
        assert_eq!(
            (first, second),
            (1, 2),
            "the dropped request's frame went out whole, then ours"
        );
    }

    #[tokio::test]
    async fn timeout_frees_the_entry_and_late_response_is_ignored() {
        let (client, server) = tokio::io::duplex(1024);
        let (seen_tx, _seen) = mpsc::unbounded_channel();
        // The broker never answers correlation id 1.
        tokio::spawn(echo_broker(server, Some(1), seen_tx));
        let m = Messenger::new(client, BrokerAddr::new("mem", 1), cfg());
        let r = m
            .request(
                ApiKey::Metadata,
                12,
                &MetadataRequest::default(),
                Duration::from_millis(50),
            )
            .await;
        assert!(matches!(r, Err(KafkaError::Timeout { .. })), "{r:?}");
        assert_eq!(m.pending_requests(), 0);
        let r = m
            .request(
                ApiKey::Metadata,
                12,
                &MetadataRequest::default(),
                Duration::from_secs(5),
            )
            .await;
        assert!(r.is_ok());
    }

    #[tokio::test]
    async fn peer_hangup_fails_pending_and_later_requests() {
        let (client, server) = tokio::io::duplex(1024);
        let m = Messenger::new(client, BrokerAddr::new("mem", 1), cfg());
        let req = MetadataRequest::default();
        let pending = m.request(ApiKey::Metadata, 12, &req, Duration::from_secs(30));
        let closer = async {
            drop(server);
        };
        let (r, ()) = tokio::join!(pending, closer);
        match r {
            Err(KafkaError::ConnectionLost { reason, .. }) => {
                // The reader sees EOF or the writer sees a broken pipe, whichever comes first.
                assert!(
                    reason.contains("closed") || reason.contains("broken pipe"),
                    "{reason}"
                )
            }
            other => panic!("expected ConnectionLost, got {other:?}"),
        }
        assert!(m.dead_reason().is_some());
        let again = m
            .request(
                ApiKey::Metadata,
                12,
                &MetadataRequest::default(),
                Duration::from_secs(30),
            )
            .await;
        assert!(matches!(again, Err(KafkaError::ConnectionLost { .. })));
        assert_eq!(m.pending_requests(), 0);
    }

    #[tokio::test]
    async fn oversized_response_kills_the_connection() {
        let (client, mut server) = tokio::io::duplex(1024);
        let m = Messenger::new(
            client,
            BrokerAddr::new("mem", 1),
            MessengerConfig {
                client_id: "t".into(),
                max_frame_bytes: 1024,
            },
        );
        let body = MetadataRequest::default();
        let req = m.request(ApiKey::Metadata, 12, &body, Duration::from_secs(30));
        let liar = async {
            let mut len = [0u8; 4];
            server.read_exact(&mut len).await.expect("len");
            let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
            server.read_exact(&mut body).await.expect("body");
            server
                .write_all(&(1i32 << 30).to_be_bytes())
                .await
                .expect("write");
            server
        };
        let (r, _server) = tokio::join!(req, liar);
        match r {
            Err(KafkaError::ConnectionLost { reason, .. }) => {
                assert!(reason.contains("exceeds the limit"), "{reason}")
            }
            other => panic!("expected ConnectionLost, got {other:?}"),
        }
    }
}

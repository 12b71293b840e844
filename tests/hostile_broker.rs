//! Malicious-broker tests: a fake broker on loopback (`support::fake_broker`) answers with
//! crafted frames that lie about their array lengths. What is tested is our decoder and what the
//! host does with a response it cannot decode, not the protocol: the host logs it, drops the
//! connection that carried it, and keeps working on a new one.
//!
//! Before responses were bounded (`kafka::bounded`) each of these lies made kafka-protocol
//! reserve tens of gigabytes and the whole test process aborted (SIGABRT, "memory allocation
//! of ... bytes failed").

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::ApiKey;
use sharehost::kafka::{
    Compression, ConnectionConfig, ErrorClass, KafkaClient, KafkaError, ProduceRecord,
};
use sharehost_tests::CapturedLog;
use sharehost_tests::fake_broker::{Answer, FakeBroker, NODE_ID, TOPIC, lying_array_body};

/// Log lines of the current test (the subscriber is thread-local; tokio's test runtime runs
/// the client's tasks on this thread).
fn capture_logs() -> (CapturedLog, tracing::subscriber::DefaultGuard) {
    let logs = CapturedLog::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

fn config() -> ConnectionConfig {
    let mut c = ConnectionConfig::new("hostile-broker-test");
    c.request_timeout = Duration::from_secs(10);
    c
}

#[tokio::test]
async fn a_lying_metadata_response_drops_the_connection_and_the_client_reconnects() {
    let (logs, _guard) = capture_logs();
    // The first Metadata response (v13, flexible) claims 2^31 brokers and carries 3 bytes.
    let broker = FakeBroker::start(|seen| {
        if seen.api == ApiKey::Metadata && seen.nth == 0 {
            Answer::Body(lying_array_body(true, &[0; 4]))
        } else {
            Answer::Honest
        }
    });
    let client = KafkaClient::connect(&broker.addr(), config())
        .await
        .expect("the client recovers on a new connection");
    assert!(
        client.topic(TOPIC).is_some(),
        "metadata from the honest answer"
    );
    let requests = broker.requests();
    let metadata: Vec<_> = requests
        .iter()
        .filter(|r| r.api == ApiKey::Metadata)
        .collect();
    assert_eq!(metadata.len(), 2, "{requests:?}");
    assert_ne!(
        metadata[0].connection, metadata[1].connection,
        "the retry went out on a new connection"
    );
    let lied_on = metadata[0].connection;
    broker.wait_until(
        "the client to close the connection that lied",
        |_, _, closed| closed.contains(&lied_on),
    );
    let text = logs.text();
    assert!(
        text.contains("dropping the connection: cannot decode the response")
            && text.contains("array claims"),
        "logs: {text}"
    );
}

#[tokio::test]
async fn lying_find_coordinator_produce_and_fetch_responses_cost_a_reconnect_not_the_host() {
    let (logs, _guard) = capture_logs();
    let broker = FakeBroker::start(|seen| match (seen.api, seen.nth) {
        // FindCoordinator v6: throttle_time_ms, then the coordinators array.
        (ApiKey::FindCoordinator, 0) => Answer::Body(lying_array_body(true, &[0; 4])),
        // Produce v12: the responses array comes first.
        (ApiKey::Produce, 0) => Answer::Body(lying_array_body(true, &[])),
        // Fetch v12: throttle_time_ms, error_code, session_id, then the responses array.
        (ApiKey::Fetch, 0) => Answer::Body(lying_array_body(true, &[0; 10])),
        _ => Answer::Honest,
    });
    let client = KafkaClient::connect(&broker.addr(), config())
        .await
        .expect("connect");

    let lie = client
        .find_coordinator("hostile-group")
        .await
        .expect_err("a lying FindCoordinator response is an error");
    assert!(
        matches!(
            lie,
            KafkaError::Decode {
                api: ApiKey::FindCoordinator,
                ..
            }
        ),
        "{lie}"
    );
    assert_eq!(lie.class(), ErrorClass::Retry, "retried, not fatal: {lie}");
    assert_eq!(
        client
            .find_coordinator("hostile-group")
            .await
            .expect("the next one works"),
        NODE_ID
    );

    // Produce and Fetch retry on a new connection inside the client: the call succeeds.
    let record = [ProduceRecord {
        value: Some(bytes::Bytes::from_static(b"v")),
        ..Default::default()
    }];
    client
        .produce(TOPIC, 0, &record, Compression::None)
        .await
        .expect("produce retries past a lying response");
    client
        .fetch(TOPIC, 0, 0, Duration::from_millis(10))
        .await
        .expect("fetch retries past a lying response");

    // Each lie cost its connection: the client closed three connections that it had opened
    // to broker 1 and opened new ones.
    let requests = broker.requests();
    let lied_on: Vec<usize> = requests
        .iter()
        .filter(|r| {
            r.nth == 0
                && matches!(
                    r.api,
                    ApiKey::FindCoordinator | ApiKey::Produce | ApiKey::Fetch
                )
        })
        .map(|r| r.connection)
        .collect();
    assert_eq!(lied_on.len(), 3, "{requests:?}");
    for api in [ApiKey::FindCoordinator, ApiKey::Produce, ApiKey::Fetch] {
        let on: Vec<usize> = requests
            .iter()
            .filter(|r| r.api == api)
            .map(|r| r.connection)
            .collect();
        assert_eq!(on.len(), 2, "{api:?}: {requests:?}");
        assert_ne!(
            on[0], on[1],
            "{api:?}: the next request went out on a new connection"
        );
    }
    broker.wait_until(
        "the client to close every connection that lied",
        |_, _, closed| lied_on.iter().all(|c| closed.contains(c)),
    );
    let text = logs.text();
    for api in ["FindCoordinator", "Produce", "Fetch"] {
        assert!(
            text.contains(&format!("api={api}")) && text.contains("dropping the connection"),
            "no log line for {api}: {text}"
        );
    }
}

/// The share engine against a broker that lies twice: its first ShareGroupHeartbeat response
/// claims 2^31 assigned topics (the decoder used to abort the host), and its first ShareFetch
/// acquires `0..=i64::MAX` with three records (the engine used to walk all 2^63 offsets into its
/// ledger). The member logs the first, rejoins on a new connection and keeps heartbeating; the
/// second delivers the three records, and the offsets no batch covers are released within a
/// bound instead of walked.
#[tokio::test]
async fn a_share_member_survives_a_lying_heartbeat_and_a_huge_acquired_range() {
    use sharehost::share::consumer::{ShareConsumer, ShareConsumerConfig};
    use sharehost_tests::fake_broker::lying_share_member;

    let (logs, _guard) = capture_logs();
    let broker = FakeBroker::start(lying_share_member(&["r0", "r1", "r2"]));
    let client = Arc::new(
        KafkaClient::connect(&broker.addr(), config())
            .await
            .expect("connect"),
    );
    let mut cfg = ShareConsumerConfig::new("hostile-group", &[TOPIC]);
    cfg.max_wait = Duration::from_millis(100);
    let consumer = ShareConsumer::start(client, cfg).await.expect("start");
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while got.len() < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {got:?} delivered; logs: {}",
            logs.text()
        );
        if let Some(d) = consumer
            .poll(Duration::from_secs(1))
            .await
            .expect("the member is still running")
        {
            got.extend(d.records.iter().map(|r| r.record.offset));
        }
    }
    assert_eq!(got, vec![0, 1, 2]);
    // The lying heartbeat cost its connection; the member heartbeats on a new one.
    broker.wait_until("a heartbeat on a new connection", |requests, _, _| {
        let on: Vec<usize> = requests
            .iter()
            .filter(|r| r.api == ApiKey::ShareGroupHeartbeat)
            .map(|r| r.connection)
            .collect();
        on.len() >= 2 && on[1] != on[0]
    });
    let text = logs.text();
    assert!(
        text.contains("api=ShareGroupHeartbeat") && text.contains("dropping the connection"),
        "logs: {text}"
    );
    assert!(
        text.contains("the broker acquired offsets its response has no batches for"),
        "logs: {text}"
    );
    consumer.close(Duration::from_secs(5)).await;
}

/// A partition whose leader keeps answering "not the leader" while the metadata still names
/// it (a leader change not yet seen by every broker): each answer comes at once, without the
/// long poll, so a member that fetched again straight away sent hundreds of requests a second
/// (800 were seen in one second in a chaos run). It waits a growing backoff between such
/// fetches. Read from the fake broker's own clock of each request: a busy machine only
/// spaces them further.
#[tokio::test]
async fn a_partition_that_keeps_answering_moved_is_fetched_at_the_backoffs_pace_not_in_a_loop() {
    use sharehost::share::consumer::{ShareConsumer, ShareConsumerConfig};
    use sharehost_tests::fake_broker::moving_partition;

    let broker = FakeBroker::start(moving_partition());
    let client = Arc::new(
        KafkaClient::connect(&broker.addr(), config())
            .await
            .expect("connect"),
    );
    let mut cfg = ShareConsumerConfig::new("moving-group", &[TOPIC]);
    cfg.max_wait = Duration::from_millis(100);
    let consumer = ShareConsumer::start(client, cfg).await.expect("start");
    const FETCHES: usize = 6;
    let b = Arc::new(broker);
    let watched = b.clone();
    tokio::task::spawn_blocking(move || {
        watched.wait_until("six ShareFetch requests", |requests, _, _| {
            requests
                .iter()
                .filter(|r| r.api == ApiKey::ShareFetch)
                .count()
                >= FETCHES
        })
    })
    .await
    .expect("join");
    let at: Vec<std::time::Instant> = b
        .requests()
        .iter()
        .filter(|r| r.api == ApiKey::ShareFetch)
        .map(|r| r.at)
        .take(FETCHES)
        .collect();
    let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
    // The backoff's delays: 50-100 ms, then 100-200, 200-400, 400-800, 500-1000 (jittered
    // within the upper half of a ceiling that doubles to 1 s).
    assert!(
        gaps.iter().all(|g| *g >= Duration::from_millis(45))
            && gaps
                .last()
                .is_some_and(|g| *g >= Duration::from_millis(400)),
        "each fetch after a 'moved' answer waits a growing backoff: gaps {gaps:?}"
    );
    consumer.close(Duration::from_secs(5)).await;
}

//! A broker stopped in the middle of a request: the caller gets an error promptly, never a hang,
//! and the client recovers once the broker is back. Its own test binary, because stopping the
//! broker would disturb tests running beside it (cargo runs test binaries one after another).

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, TopicName};
use kafka_protocol::protocol::{StrBytes, VersionRange};
use sharehost::kafka::{Compression, KafkaError, OffsetSpec, ProduceRecord};
use sharehost_tests::{bootstrap, client, harness, init_logging, unique};

#[tokio::test]
async fn a_broker_stopped_mid_request_gives_an_error_and_the_client_recovers() {
    init_logging();
    let client = client().await;
    let topic = unique("restart");
    client
        .create_topic(&topic, 1, 1, &[])
        .await
        .expect("create topic");
    let leader = client.leader(&topic, 0).expect("leader");
    let conn = client.connection(leader).await.expect("connection");
    let end = client
        .list_offset(&topic, 0, OffsetSpec::Latest)
        .await
        .expect("end");
    let long_poll = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(30_000)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_session_epoch(-1)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_string(topic.clone())))
                .with_partitions(vec![
                    FetchPartition::default()
                        .with_partition(0)
                        .with_current_leader_epoch(-1)
                        .with_fetch_offset(end)
                        .with_last_fetched_epoch(-1)
                        .with_log_start_offset(-1)
                        .with_partition_max_bytes(1 << 20),
                ]),
        ]);
    // The request timeout (120 s) is far beyond the broker's stop time: only the broken
    // connection can end the wait early, so a hang would show as a timeout error instead.
    let request = conn.send_within(
        &long_poll,
        VersionRange { min: 4, max: 12 },
        Duration::from_secs(120),
    );
    let stopper = async {
        while conn.pending_requests() == 0 {
            tokio::task::yield_now().await;
        }
        tokio::task::spawn_blocking(|| harness("stop-broker"))
            .await
            .expect("join");
    };
    let (result, ()) = tokio::join!(request, stopper);
    let restarted = tokio::task::spawn_blocking(|| harness("start-broker"));
    match result {
        Err(KafkaError::ConnectionLost { .. }) => {}
        // A broker shutting down may answer the long poll early with an empty or error result
        // before closing; that is not a hang either, but the connection must then be dead.
        Ok(_) | Err(KafkaError::Broker { .. }) => {}
        other => panic!("expected the stop to end the request, got {other:?}"),
    }
    restarted.await.expect("join");
    bootstrap();
    // The client recovers on its own: new connection, same topic, data flows.
    let record = ProduceRecord {
        value: Some(Bytes::from_static(b"after restart")),
        ..Default::default()
    };
    let offset = client
        .produce(&topic, 0, &[record], Compression::None)
        .await
        .expect("produce after restart");
    let fetched = client
        .fetch(&topic, 0, offset, Duration::from_millis(500))
        .await
        .expect("fetch after restart");
    assert_eq!(
        fetched.records.first().and_then(|r| r.value.clone()),
        Some(Bytes::from_static(b"after restart"))
    );
}

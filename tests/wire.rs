//! The wire layer against the real broker: version negotiation, produce/fetch in every
//! compression, TLS + SASL, and the errors a user sees when something is wrong.

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::messages::MetadataRequest;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use sharehost::kafka::client::is_topic_exists;
use sharehost::kafka::{
    Compression, ConnectionConfig, Header, KafkaClient, KafkaError, Mechanism, OffsetSpec,
    ProduceRecord, TlsSettings,
};
use sharehost_tests::proxy::Proxy;
use sharehost_tests::{SaslSsl, bootstrap, client, init_logging, repo_root, unique};

fn sample_records(n: usize, tag: &str) -> Vec<ProduceRecord> {
    (0..n)
        .map(|i| ProduceRecord {
            key: if i % 4 == 0 {
                None
            } else {
                Some(Bytes::from(format!("{tag}-key-{i}")))
            },
            // Binary values including zero bytes and every byte value, of varying length.
            value: Some(Bytes::from(
                (0..(50 + i * 7))
                    .map(|b| (b * 31 + i) as u8)
                    .collect::<Vec<u8>>(),
            )),
            headers: vec![
                Header {
                    key: "trace".into(),
                    value: Some(Bytes::from(format!("t{i}"))),
                },
                Header {
                    key: "empty".into(),
                    value: Some(Bytes::new()),
                },
                Header {
                    key: "null".into(),
                    value: None,
                },
            ],
            timestamp: Some(1_760_000_000_000 + i as i64),
        })
        .collect()
}

async fn round_trip(client: &KafkaClient, topic: &str, compression: Compression, n: usize) {
    let records = sample_records(n, &format!("{compression:?}"));
    let start = client
        .list_offset(topic, 0, OffsetSpec::Latest)
        .await
        .expect("latest offset");
    let base = client
        .produce(topic, 0, &records, compression)
        .await
        .expect("produce");
    assert_eq!(
        base, start,
        "{compression:?}: base offset is the previous end"
    );
    let mut got = Vec::new();
    while got.len() < n {
        let fetched = client
            .fetch(
                topic,
                0,
                base + got.len() as i64,
                Duration::from_millis(500),
            )
            .await
            .expect("fetch");
        got.extend(fetched.records);
    }
    got.truncate(n);
    for (i, (sent, back)) in records.iter().zip(&got).enumerate() {
        assert_eq!(back.offset, base + i as i64, "{compression:?} offset");
        assert_eq!(back.key, sent.key, "{compression:?} key of record {i}");
        assert_eq!(
            back.value, sent.value,
            "{compression:?} value of record {i}"
        );
        assert_eq!(
            back.headers, sent.headers,
            "{compression:?} headers of record {i}"
        );
        assert_eq!(
            Some(back.timestamp),
            sent.timestamp,
            "{compression:?} timestamp of record {i}"
        );
    }
}

async fn fresh_topic(client: &KafkaClient, prefix: &str) -> String {
    let topic = unique(prefix);
    match client.create_topic(&topic, 1, 1, &[]).await {
        Ok(_) => topic,
        Err(e) if is_topic_exists(&e) => topic,
        Err(e) => panic!("create topic {topic}: {e}"),
    }
}

/// A produce whose answer is lost (the broker appended the batch, the connection died before its
/// reply reached the client) is retried by the client and lands once: the batch carries the
/// client's producer id and sequence, and the broker answers the retry from what it appended.
/// Without them, the retry is appended a second time.
#[tokio::test]
async fn a_produce_whose_answer_is_lost_is_retried_and_lands_once() {
    init_logging();
    let setup = client().await;
    let topic = fresh_topic(&setup, "lost-answer").await;
    let leader = setup.leader(&topic, 0).expect("the topic's leader");
    let broker = setup.broker(leader).expect("the leader's address");
    // A client whose connection to the leader goes through a proxy the test controls (the
    // addresses metadata gives later are the broker's own: the retry goes straight there).
    let proxy = Proxy::start("127.0.0.1:0", &broker.socket_addr_string()).await;
    let client = KafkaClient::connect(&bootstrap(), ConnectionConfig::new("lost-answer"))
        .await
        .expect("connect");
    client.learn_broker(leader, "127.0.0.1", proxy.addr().port());
    // The first write asks for the producer id and opens the proxied connection.
    let first = client
        .produce(&topic, 0, &sample_records(1, "first"), Compression::None)
        .await
        .expect("first produce");
    proxy.lose_next_answer();
    let second = client
        .produce(&topic, 0, &sample_records(3, "second"), Compression::None)
        .await
        .expect("the produce whose answer was lost, retried");
    assert_eq!(proxy.lost_answers(), 1, "the broker's answer was dropped");
    assert_eq!(
        second,
        first + 1,
        "the retry was answered with the first append's offset"
    );
    let latest = setup
        .list_offset(&topic, 0, OffsetSpec::Latest)
        .await
        .expect("latest offset");
    assert_eq!(
        latest,
        first + 4,
        "1 + 3 records in the log, the lost answer's batch once"
    );
}

/// A write is never queued behind a long poll: a broker serves one connection's requests one
/// after another, so produce requests go over connections of their own. A fetch that waits up to
/// 20 s for records that do not come is still waiting when a produce to the same broker is
/// answered (on a shared connection the produce would be answered only after the fetch).
#[tokio::test]
async fn a_produce_is_answered_while_a_long_poll_waits_on_the_same_broker() {
    init_logging();
    let client = client().await;
    let quiet = fresh_topic(&client, "long-poll").await;
    let written = fresh_topic(&client, "not-behind-it").await;
    // Both on the same broker (the test broker is one node; the cluster tests cover more).
    assert_eq!(client.leader(&quiet, 0), client.leader(&written, 0));
    let end = client
        .list_offset(&quiet, 0, OffsetSpec::Latest)
        .await
        .expect("latest offset");
    let poll = client.fetch(&quiet, 0, end, Duration::from_secs(20));
    tokio::pin!(poll);
    let record = sample_records(1, "now");
    let produce = client.produce(&written, 0, &record, Compression::None);
    tokio::pin!(produce);
    // Let the fetch go out first: whichever finishes, the test learns which came first.
    let first = tokio::select! {
        biased;
        r = &mut poll => format!("the long poll ended first: {:?}", r.map(|f| f.records.len())),
        r = &mut produce => {
            r.expect("produce");
            "the produce".to_owned()
        }
    };
    assert_eq!(
        first, "the produce",
        "the produce was answered while the 20 s long poll still waited"
    );
}

#[tokio::test]
async fn api_versions_lists_the_share_apis_at_the_versions_we_need() {
    init_logging();
    let client = client().await;
    let id = client.broker_ids()[0];
    let conn = client.connection(id).await.expect("connection");
    let v = conn.versions();
    let heartbeat = v
        .range(ApiKey::ShareGroupHeartbeat)
        .expect("ShareGroupHeartbeat advertised");
    assert!(
        heartbeat.min <= 1 && heartbeat.max >= 1,
        "ShareGroupHeartbeat {heartbeat}"
    );
    let fetch = v.range(ApiKey::ShareFetch).expect("ShareFetch advertised");
    assert!(
        fetch.max >= 2,
        "ShareFetch v2 (KIP-1222 renew) needs Kafka 4.2+: {fetch}"
    );
    let ack = v
        .range(ApiKey::ShareAcknowledge)
        .expect("ShareAcknowledge advertised");
    assert!(ack.max >= 2, "ShareAcknowledge {ack}");
    assert!(
        v.range(ApiKey::FindCoordinator)
            .expect("FindCoordinator")
            .max
            >= 6
    );
}

#[tokio::test]
async fn produce_then_fetch_is_byte_exact_in_every_compression() {
    init_logging();
    let client = client().await;
    let topic = fresh_topic(&client, "wire-compression").await;
    for c in [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        round_trip(&client, &topic, c, 40).await;
    }
    let meta = client.topic(&topic).expect("topic in metadata");
    assert_eq!(
        client.topic_name(meta.id).as_deref(),
        Some(topic.as_str()),
        "id ↔ name mapping"
    );
}

#[tokio::test]
async fn group_coordinator_is_found_with_the_group_key_type() {
    init_logging();
    let client = client().await;
    let group = unique("wire-coord");
    let id = client.find_coordinator(&group).await.expect("coordinator");
    assert!(
        client.broker(id).is_some(),
        "coordinator {id} is a known broker"
    );
    client
        .alter_group_configs(&group, &[("share.auto.offset.reset", "earliest")])
        .await
        .expect("group configs accepted");
}

#[tokio::test]
async fn a_cancelled_long_poll_leaves_the_connection_clean() {
    init_logging();
    let client = client().await;
    let topic = fresh_topic(&client, "wire-cancel").await;
    let leader = client.leader(&topic, 0).expect("leader");
    let conn = client.connection(leader).await.expect("connection");
    let end = client
        .list_offset(&topic, 0, OffsetSpec::Latest)
        .await
        .expect("end");
    // A fetch at the log end with a 10 s long poll: the broker holds it; we walk away.
    let long_poll = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(10_000)
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
    let versions = kafka_protocol::protocol::VersionRange { min: 4, max: 12 };
    let cancelled = tokio::time::timeout(
        Duration::from_millis(200),
        conn.send_within(&long_poll, versions, Duration::from_secs(30)),
    )
    .await;
    assert!(
        cancelled.is_err(),
        "the long poll was still pending when dropped"
    );
    assert_eq!(
        conn.pending_requests(),
        0,
        "the dropped request left no pending entry"
    );
    // The same connection still answers, in order, without waiting for the abandoned poll's
    // frame to be misattributed to us.
    let meta = conn
        .send(&MetadataRequest::default())
        .await
        .expect("metadata on the same connection");
    assert!(!meta.brokers.is_empty());
    assert!(!conn.is_dead());
    assert_eq!(conn.pending_requests(), 0);
}

#[tokio::test]
async fn sasl_ssl_works_for_every_mechanism() {
    init_logging();
    let s = SaslSsl::from_harness();
    for mechanism in [
        Mechanism::Plain,
        Mechanism::ScramSha256,
        Mechanism::ScramSha512,
    ] {
        let client = KafkaClient::connect(&s.bootstrap, s.config(mechanism, &s.password))
            .await
            .unwrap_or_else(|e| panic!("{mechanism}: {e}"));
        let topic = fresh_topic(
            &client,
            &format!("wire-sasl-{}", mechanism.name().to_lowercase()),
        )
        .await;
        round_trip(&client, &topic, Compression::Zstd, 10).await;
    }
}

#[tokio::test]
async fn a_wrong_password_is_an_authentication_error_that_says_so() {
    init_logging();
    let s = SaslSsl::from_harness();
    for mechanism in [
        Mechanism::Plain,
        Mechanism::ScramSha256,
        Mechanism::ScramSha512,
    ] {
        let err = KafkaClient::connect(&s.bootstrap, s.config(mechanism, "not-the-password"))
            .await
            .expect_err("wrong password must fail");
        assert!(
            matches!(err, KafkaError::Auth { .. }),
            "{mechanism}: {err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("authentication") && msg.contains(mechanism.name()),
            "{msg}"
        );
    }
}

#[tokio::test]
async fn a_wrong_ca_is_a_tls_error_that_says_so() {
    init_logging();
    let s = SaslSsl::from_harness();
    let config = ConnectionConfig::new("sharehost-tests")
        .with_tls(&TlsSettings {
            ca_file: Some(repo_root().join("tests/fixtures/unrelated-ca.pem")),
            ..Default::default()
        })
        .expect("the unrelated CA file is valid PEM");
    let err = KafkaClient::connect(&s.bootstrap, config)
        .await
        .expect_err("unknown CA must fail");
    assert!(matches!(err, KafkaError::Tls { .. }), "{err:?}");
    assert!(
        err.to_string().contains("not signed by a trusted CA"),
        "{err}"
    );
}

#[tokio::test]
async fn a_cut_connection_fails_the_pending_request_instead_of_hanging() {
    init_logging();
    // A loopback proxy the test controls stands between us and the broker.
    let upstream = bootstrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let proxy_addr = listener.local_addr().expect("addr");
    let (cut_tx, cut_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                return;
            };
            let upstream = upstream.clone();
            let mut cut = cut_rx.clone();
            tokio::spawn(async move {
                let Ok(mut outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    _ = cut.wait_for(|c| *c) => {}
                }
            });
        }
    });
    let conn = sharehost::kafka::BrokerConnection::connect(
        &sharehost::kafka::BrokerAddr::new("127.0.0.1", proxy_addr.port()),
        &ConnectionConfig::new("sharehost-tests"),
    )
    .await
    .expect("connect through the proxy");
    let client = client().await;
    let topic = fresh_topic(&client, "wire-cut").await;
    let end = client
        .list_offset(&topic, 0, OffsetSpec::Latest)
        .await
        .expect("end");
    let long_poll = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(20_000)
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
    let versions = kafka_protocol::protocol::VersionRange { min: 4, max: 12 };
    let request = conn.send_within(&long_poll, versions, Duration::from_secs(60));
    let cutter = async {
        // Cut once the request is on the wire (the broker is holding the long poll).
        while conn.pending_requests() == 0 {
            tokio::task::yield_now().await;
        }
        let _ = cut_tx.send(true);
    };
    let (result, ()) = tokio::join!(request, cutter);
    match result {
        Err(KafkaError::ConnectionLost { .. }) => {}
        other => panic!("expected ConnectionLost, got {other:?}"),
    }
    assert!(conn.is_dead());
    assert_eq!(conn.pending_requests(), 0);
}

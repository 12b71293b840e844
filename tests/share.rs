//! The share consumer engine against the real broker.

use std::collections::HashSet;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sharehost::kafka::{Compression, KafkaClient, ProduceRecord};
use sharehost::share::consumer::{ShareConsumer, ShareConsumerConfig};
use sharehost::share::ledger::AckKind;
use sharehost_tests::{client, init_logging, repo_root, unique};

/// Creates a topic with `partitions` partitions and `per_partition` records in each; values
/// name their partition and index so the test can check exactly-once delivery.
async fn topic_with_records(
    client: &KafkaClient,
    partitions: i32,
    per_partition: usize,
) -> (String, HashSet<String>) {
    let topic = unique("share");
    client
        .create_topic(&topic, partitions, 1, &[])
        .await
        .expect("create topic");
    let mut ids = HashSet::new();
    for p in 0..partitions {
        let records: Vec<ProduceRecord> = (0..per_partition)
            .map(|i| {
                let id = format!("{p}-{i}");
                ids.insert(id.clone());
                ProduceRecord {
                    value: Some(Bytes::from(id)),
                    ..Default::default()
                }
            })
            .collect();
        client
            .produce(&topic, p, &records, Compression::Lz4)
            .await
            .expect("produce");
    }
    (topic, ids)
}

/// A group that starts from the earliest offset and heartbeats every second (the harness lowers
/// the broker minimum so tests do not wait 5 s for an assignment).
async fn fast_group(client: &KafkaClient) -> String {
    let group = unique("group");
    client
        .alter_group_configs(
            &group,
            &[
                ("share.auto.offset.reset", "earliest"),
                ("share.heartbeat.interval.ms", "1000"),
            ],
        )
        .await
        .expect("group config");
    group
}

/// Polls and accepts until `want` distinct records arrived; returns what each poll gave.
async fn accept_all(consumer: &ShareConsumer, want: usize, accepted: &mut Vec<String>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while accepted.len() < want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {want} records arrived",
            accepted.len()
        );
        let Some(d) = consumer.poll(Duration::from_secs(1)).await.expect("poll") else {
            continue;
        };
        assert!(d.poison.is_empty());
        for r in &d.records {
            accepted.push(
                String::from_utf8_lossy(r.record.value.as_deref().unwrap_or_default()).into_owned(),
            );
            assert!(
                consumer.acknowledge(r, AckKind::Accept).expect("ack"),
                "fresh session"
            );
        }
    }
}

/// The group's lag per partition, from Apache's own ShareGroupCommand.
fn group_lag(group: &str) -> Vec<i64> {
    let out = Command::new(repo_root().join("dev/kafka"))
        .args([
            "tool",
            "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
            "--bootstrap-server",
            &sharehost_tests::bootstrap(),
            "--describe",
            "--group",
            group,
        ])
        .output()
        .expect("run ShareGroupCommand");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ShareGroupCommand failed: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .filter(|l| l.starts_with(group))
        .filter_map(|l| l.split_whitespace().last()?.parse().ok())
        .collect()
}

#[tokio::test]
async fn one_member_gets_every_record_exactly_once_and_leaves_nothing_in_flight() {
    init_logging();
    let client = Arc::new(client().await);
    let (topic, ids) = topic_with_records(&client, 3, 100).await;
    let group = fast_group(&client).await;
    let consumer =
        ShareConsumer::start(client.clone(), ShareConsumerConfig::new(&group, &[&topic]))
            .await
            .expect("start");
    let mut accepted = Vec::new();
    accept_all(&consumer, ids.len(), &mut accepted).await;
    consumer.close(Duration::from_secs(30)).await;
    let unique: HashSet<String> = accepted.iter().cloned().collect();
    assert_eq!(accepted.len(), unique.len(), "no record delivered twice");
    assert_eq!(unique, ids, "every record delivered");
    assert_eq!(consumer.in_flight(), 0);
    let lag = group_lag(&group);
    assert_eq!(lag.len(), 3, "one row per partition");
    assert!(
        lag.iter().all(|l| *l == 0),
        "nothing left in flight or unconsumed: {lag:?}"
    );
}

#[tokio::test]
async fn two_members_in_one_group_accept_each_record_once_and_miss_none() {
    init_logging();
    let client = Arc::new(client().await);
    let (topic, ids) = topic_with_records(&client, 4, 150).await;
    let group = fast_group(&client).await;
    let a = ShareConsumer::start(client.clone(), ShareConsumerConfig::new(&group, &[&topic]))
        .await
        .expect("a");
    let b = ShareConsumer::start(client.clone(), ShareConsumerConfig::new(&group, &[&topic]))
        .await
        .expect("b");
    let mut got_a = Vec::new();
    let mut got_b = Vec::new();
    let total = ids.len();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while got_a.len() + got_b.len() < total {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {total}",
            got_a.len() + got_b.len()
        );
        for (c, got) in [(&a, &mut got_a), (&b, &mut got_b)] {
            if let Some(d) = c.poll(Duration::from_millis(200)).await.expect("poll") {
                for r in &d.records {
                    got.push(
                        String::from_utf8_lossy(r.record.value.as_deref().unwrap_or_default())
                            .into_owned(),
                    );
                    c.acknowledge(r, AckKind::Accept).expect("ack");
                }
            }
        }
    }
    a.close(Duration::from_secs(30)).await;
    b.close(Duration::from_secs(30)).await;
    let all: Vec<String> = got_a.iter().chain(&got_b).cloned().collect();
    let set: HashSet<String> = all.iter().cloned().collect();
    assert_eq!(all.len(), set.len(), "no record accepted twice");
    assert_eq!(set, ids, "none missing");
}

//! The malicious-broker test at the level of the `sharehost` binary: `sharehost run` against the
//! fake broker of `support::fake_broker`, which lies about an array length in its first
//! ShareGroupHeartbeat answer and acquires `0..=i64::MAX` in its first ShareFetch answer. The
//! process must drop the connection that lied, join on a new one, judge the three records the
//! fetch carried, and keep running until it is told to stop. (`tests/hostile_broker.rs` covers
//! each lying response against the library, with the log line checked.)
//!
//! Part of the host package's tests (it needs the `sharehost` binary Cargo builds for them),
//! kept here with the other broker tests.

use std::path::PathBuf;

use kafka_protocol::messages::ShareGroupHeartbeatResponse;
use kafka_protocol::messages::share_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::{ApiKey, ShareAcknowledgeResponse};
use kafka_protocol::protocol::Encodable;
use sharehost::kafka::records::encode_batch;
use sharehost::kafka::{Compression, ProduceRecord};
use sharehost::share::wire::{
    AcquiredRange, FetchPartitionData, FetchTopicResponse, ShareFetchResponse,
};
use sharehost_tests::fake_broker::{Answer, FakeBroker, TOPIC, TOPIC_ID, lying_array_body};
use sharehost_tests::host::HostProcess;
use sharehost_tests::{guest, repo_root, unique};

fn sharehost() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sharehost"))
}

fn encode<T: Encodable>(msg: &T, version: i16) -> Vec<u8> {
    let mut b = bytes::BytesMut::new();
    msg.encode(&mut b, version).expect("encode");
    b.to_vec()
}

#[test]
fn sharehost_run_survives_a_lying_heartbeat_and_a_huge_acquired_range() {
    let records: Vec<ProduceRecord> = ["1", "2", "3"]
        .iter()
        .map(|id| ProduceRecord {
            value: Some(bytes::Bytes::from_static(id.as_bytes())),
            ..Default::default()
        })
        .collect();
    let batch = encode_batch(&records, Compression::None).expect("batch");
    let broker = FakeBroker::start(move |seen| match (seen.api, seen.nth) {
        // throttle, error, null message, null member id, epoch, interval, assignment present,
        // then a topic-partitions array that claims 0x7fff_fffe entries and has three bytes.
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
    });

    let dir = repo_root().join("target/hostile-broker-host");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let manifest = dir.join(format!("{}.toml", unique("manifest")));
    std::fs::write(
        &manifest,
        format!(
            r#"[cluster]
bootstrap = "{bootstrap}"

[admin]
listen = "127.0.0.1:0"

[[pipeline]]
name = "ledger"
topics = ["{TOPIC}"]
group = "{group}"
component = "{component}"
config = {{ reject-every = "7" }}
"#,
            bootstrap = broker.addr(),
            group = unique("lying-group"),
            component = guest("fixture_ledger").display(),
        ),
    )
    .expect("write manifest");

    let host = HostProcess::start(&sharehost(), &manifest, "host");
    // The three records of the huge range are judged: the host joined after the lie, on a new
    // connection, and did not walk 2^63 offsets.
    let seen = host.wait_for("the three records judged", |s| s.accepted.len() >= 3);
    assert_eq!(
        seen.distinct(),
        ["1", "2", "3"].into_iter().collect(),
        "the plugin judged exactly the records the fetch carried"
    );
    broker.wait_until(
        "the connection that lied dropped and a new one opened",
        |requests, connections, closed| {
            let lied_on = requests
                .iter()
                .find(|r| r.api == ApiKey::ShareGroupHeartbeat && r.nth == 0)
                .map(|r| r.connection);
            lied_on.is_some_and(|c| closed.contains(&c))
                && requests
                    .iter()
                    .any(|r| r.api == ApiKey::ShareGroupHeartbeat && r.nth > 0)
                && connections >= 2
        },
    );
    // Still running: it answers on its admin endpoint and drains on SIGTERM with exit 0.
    let (code, _) = host.http("GET", "/pipelines", "");
    assert_eq!(code, 200, "the host still serves its admin endpoint");
    let (summary, _) = host.stop();
    assert!(
        summary.contains("pipeline ledger"),
        "the run summary after SIGTERM: {summary}"
    );
}

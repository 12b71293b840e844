//! Topics for a test: created with records or beside their dead-letter topic, filled with
//! ids, and read back to their end.

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use sharehost::kafka::{Compression, KafkaClient, ProduceRecord};

use crate::unique;

/// A fresh topic named after `prefix` with `partitions` partitions (one replica), and a fresh
/// share group for it with a 30 s lock and a 6 s session timeout, so a killed host's records
/// come back soon: what the rollout and fleet scenarios start from. Returns (topic, group).
pub async fn topic_and_group(
    client: &KafkaClient,
    prefix: &str,
    partitions: i32,
) -> (String, String) {
    let topic = unique(prefix);
    client
        .create_topic(&topic, partitions, 1, &[])
        .await
        .expect("create topic");
    let group = crate::fresh_group_with(
        client,
        Some(30_000),
        &[("share.session.timeout.ms", "6000")],
    )
    .await;
    (topic, group)
}

/// Creates a topic with `partitions` partitions and `per_partition` records in each; values
/// name their partition and index so the test can check exactly-once delivery.
pub async fn topic_with_records(
    client: &KafkaClient,
    partitions: i32,
    per_partition: usize,
) -> (String, HashSet<String>) {
    let topic = unique("topic");
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

/// A fresh topic named after `prefix` with `partitions` partitions, and its dead-letter topic
/// `TOPIC-dlq` with `dlq_partitions` (both with one replica): what every scenario whose
/// pipeline rejects records starts from. Returns (topic, dead-letter topic).
pub async fn topic_with_dead_letters(
    client: &KafkaClient,
    prefix: &str,
    partitions: i32,
    dlq_partitions: i32,
) -> (String, String) {
    let topic = unique(prefix);
    let dlq = format!("{topic}-dlq");
    client
        .create_topic(&topic, partitions, 1, &[])
        .await
        .expect("create topic");
    client
        .create_topic(&dlq, dlq_partitions, 1, &[])
        .await
        .expect("create dead-letter topic");
    (topic, dlq)
}

/// Produces the decimal ids of `ids` as record values into `topic`, 100 per batch, batches
/// round-robin over `partitions`; returns the ids (what the fault tests' ledgers start from).
pub async fn produce_ids(
    client: &KafkaClient,
    topic: &str,
    partitions: i32,
    ids: std::ops::Range<u64>,
) -> Vec<String> {
    let all: Vec<String> = ids.map(|i| i.to_string()).collect();
    for (n, chunk) in all.chunks(100).enumerate() {
        let records: Vec<ProduceRecord> = chunk
            .iter()
            .map(|id| ProduceRecord {
                value: Some(Bytes::from(id.clone())),
                ..Default::default()
            })
            .collect();
        let p = i32::try_from(n).unwrap_or(0) % partitions;
        client
            .produce(topic, p, &records, Compression::Lz4)
            .await
            .unwrap_or_else(|e| panic!("produce to {topic}: {e}"));
    }
    all
}

/// Every record value in `topic` (partitions `0..partitions`) up to its current end, as text:
/// how the fault tests read a dead-letter topic.
pub async fn topic_values(client: &KafkaClient, topic: &str, partitions: i32) -> Vec<String> {
    topic_records(client, topic, partitions)
        .await
        .iter()
        .map(|(_, r)| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        .collect()
}

/// The committed records of `topic` (partitions `0..partitions`) up to its current end, with
/// their partitions, read `read_committed` as a downstream consumer of an exactly-once
/// pipeline's outputs does: aborted transactions' records are not among them. Waits (a hang
/// guard of PATIENCE) for transactions still open at the end, which their coordinator decides.
pub async fn committed_records(
    client: &KafkaClient,
    topic: &str,
    partitions: i32,
) -> Vec<(i32, sharehost::kafka::ConsumedRecord)> {
    read_to_end(client, topic, partitions, true).await
}

/// Every record in `topic` (partitions `0..partitions`) up to its current end, with its
/// partition, read with plain Fetch (no group): how tests read output and dead-letter topics.
pub async fn topic_records(
    client: &KafkaClient,
    topic: &str,
    partitions: i32,
) -> Vec<(i32, sharehost::kafka::ConsumedRecord)> {
    read_to_end(client, topic, partitions, false).await
}

/// Each partition of `topic` read from 0 to the end it has now (`committed`: read_committed),
/// past transaction markers.
async fn read_to_end(
    client: &KafkaClient,
    topic: &str,
    partitions: i32,
    committed: bool,
) -> Vec<(i32, sharehost::kafka::ConsumedRecord)> {
    use sharehost::kafka::OffsetSpec;
    let mut records = Vec::new();
    for p in 0..partitions {
        let end = client
            .list_offset(topic, p, OffsetSpec::Latest)
            .await
            .unwrap_or_else(|e| panic!("end offset of {topic}-{p}: {e}"));
        let mut next = 0;
        let mut progress = std::time::Instant::now();
        while next < end {
            let (read, past, lso) = if committed {
                let f = client
                    .fetch_committed(topic, p, next, Duration::ZERO)
                    .await
                    .unwrap_or_else(|e| panic!("fetch {topic}-{p} at {next} read_committed: {e}"));
                (f.records, f.next_offset, f.last_stable_offset)
            } else {
                let f = client
                    .fetch(topic, p, next, Duration::from_millis(500))
                    .await
                    .unwrap_or_else(|e| panic!("fetch {topic}-{p} at {next}: {e}"));
                (f.records, f.next_offset, f.high_watermark)
            };
            records.extend(read.into_iter().map(|r| (p, r)));
            if past > next {
                next = past;
                progress = std::time::Instant::now();
            } else {
                // A transaction still open holds the last stable offset back: Kafka tells no
                // one when its coordinator decides it, so ask again.
                assert!(
                    progress.elapsed() < crate::host::PATIENCE,
                    "{topic}-{p}: reading stayed at {next} below {end} (last stable offset {lso})"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    records
}

/// `sharehost consume TOPIC --from-beginning --follow` in the background: every record it
/// prints is kept (and wakes `watch`) until it is dropped. What an author does to watch a
/// pipeline's outputs and dead letters arrive.
pub struct Follower {
    child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    ended: std::sync::Arc<std::sync::Mutex<bool>>,
}

impl Follower {
    /// Starts following `topic` with the cluster of `manifest`, running `bin` (the `sharehost`
    /// binary).
    pub fn start(
        bin: &std::path::Path,
        manifest: &std::path::Path,
        topic: &str,
        watch: &crate::host::Watch,
    ) -> Follower {
        use std::io::BufRead;
        use std::sync::PoisonError;
        let mut child = std::process::Command::new(bin)
            .args([
                "consume",
                topic,
                "--from-beginning",
                "--follow",
                "--manifest",
            ])
            .arg(manifest)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("start sharehost consume");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
        let ended: std::sync::Arc<std::sync::Mutex<bool>> = Default::default();
        let (kept, end, bell) = (lines.clone(), ended.clone(), watch.clone());
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                kept.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(line);
                bell.bump();
            }
            *end.lock().unwrap_or_else(PoisonError::into_inner) = true;
            bell.bump();
        });
        Follower {
            child,
            lines,
            ended,
        }
    }

    /// The records printed so far, as JSON.
    pub fn records(&self) -> Vec<serde_json::Value> {
        self.lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The records' keys printed so far.
    pub fn keys(&self) -> std::collections::BTreeSet<String> {
        self.records()
            .iter()
            .filter_map(|v| v["key"].as_str().map(str::to_owned))
            .collect()
    }

    /// Whether its output ended (the process exited).
    pub fn ended(&self) -> bool {
        *self
            .ended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every record of `topic` from its beginning to its end, as `sharehost consume` (`bin`) prints
/// them with the cluster of `manifest`.
pub fn consume_all(
    bin: &std::path::Path,
    manifest: &std::path::Path,
    topic: &str,
) -> Vec<serde_json::Value> {
    let out = std::process::Command::new(bin)
        .args(["consume", topic, "--from-beginning", "--manifest"])
        .arg(manifest)
        .output()
        .expect("run sharehost consume");
    assert!(
        out.status.success(),
        "sharehost consume {topic} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("consume prints JSON lines"))
        .collect()
}

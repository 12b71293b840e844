//! What a pipeline must write before it may acknowledge a record: the outputs of an accepted
//! record and the dead letter of a rejected one. A write that fails never costs a delivery:
//! its source records stay acquired (the share engine keeps renewing their locks) and the write
//! is retried with backoff until it lands, the pipeline stops, or, on a broker without renew,
//! the lock is about to run out. Only then are the sources released, and that release is the
//! one delivery a stop inevitably spends.
//!
//! Writes are produced like the Java producer does: acks=all, lz4, in batches per partition
//! under a byte bound. A batch the broker refuses as too large is split in halves; a single
//! record still too large is written in its smaller form when it has one (a dead letter
//! without the record's key, value and headers) or reported back as unwritable (an output
//! larger than its topic accepts), so the caller can reject its source with that reason.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use tokio_util::sync::CancellationToken;

use crate::kafka::backoff::{Backoff, BackoffConfig};
use crate::kafka::{Compression, KafkaClient, KafkaError, ProduceRecord, partitioner};

/// Outputs and dead letters are produced compressed: they are usually small and alike (JSON),
/// and lz4 costs the least CPU of Kafka's codecs, on a machine whose cores the broker shares.
pub const WRITE_COMPRESSION: Compression = Compression::Lz4;

/// Uncompressed bytes per produce batch: well under the broker's default `message.max.bytes`
/// (1 MiB), which a larger batch would exceed and be refused whole.
pub const MAX_WRITE_BATCH_BYTES: usize = 512 << 10;

/// How a failed write is retried: from 200 ms, doubling to 5 s, so an outage of a minute costs
/// about fifteen attempts per write, and a recovered topic is written within 5 s.
pub const WRITE_BACKOFF: BackoffConfig = BackoffConfig {
    initial: Duration::from_millis(200),
    max: Duration::from_secs(5),
    factor: 2.0,
};

/// A failed write is logged at its first failure and then every this many attempts, so an
/// outage of many batches is seen without flooding the log.
const LOG_EVERY_ATTEMPTS: u32 = 10;

/// How the partition of a write is chosen once its topic's partition count is known (it may
/// change while a write waits for a topic that was deleted and created again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionBy {
    /// By key like the Java client's default partitioner (murmur2); keyless records go to the
    /// source partition modulo the topic's, so the writes of one source partition stay in
    /// order in one partition and a rewrite after a crash lands beside the first.
    KeyOrSource(i32),
    /// The source partition modulo the topic's (dead letters: in the order of their source).
    Source(i32),
}

impl PartitionBy {
    /// The partition of a record with `key` in a topic of `partitions` partitions.
    pub fn partition(self, key: Option<&[u8]>, partitions: usize) -> i32 {
        match self {
            PartitionBy::KeyOrSource(s) => partitioner::by_key_or(key, s, partitions),
            PartitionBy::Source(s) => partitioner::by_key_or(None, s, partitions),
        }
    }
}

/// One record to write on behalf of one source record (`owner`, an index into the caller's
/// list).
#[derive(Debug, Clone)]
pub struct Write {
    /// Which source record this write belongs to.
    pub owner: usize,
    /// The topic.
    pub topic: String,
    /// How its partition is chosen.
    pub partition_by: PartitionBy,
    /// The record.
    pub record: ProduceRecord,
    /// A smaller form written when `record` alone is too large for the topic; `None`: the
    /// record is unwritable then. While the smaller form is tried, this holds the full one.
    pub smaller: Option<ProduceRecord>,
    /// Whether `record` is the smaller form now.
    pub shrunk: bool,
}

impl Write {
    /// A write of `record` to `topic` for source record `owner`, with no smaller form.
    pub fn new(
        owner: usize,
        topic: &str,
        partition_by: PartitionBy,
        record: ProduceRecord,
    ) -> Write {
        Write {
            owner,
            topic: topic.to_owned(),
            partition_by,
            record,
            smaller: None,
            shrunk: false,
        }
    }
}

/// How the writes of one source record ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Landing {
    /// Every write landed (some perhaps in their smaller form).
    Landed,
    /// A write is larger than its topic accepts even alone and has no smaller form: it can
    /// never land. The text says which topic and what the broker said.
    Unwritable(String),
    /// The pipeline is stopping (or the lock is running out) before every write landed.
    Stopped,
}

/// What the caller learns of the writes while they go on: failures to count and show, the
/// start and end of waiting (the pipeline is degraded meanwhile).
pub trait WriteObserver: Sync {
    /// A produce to `topic` failed with `error` (one failed request, of `records` records).
    fn failed(&self, topic: &str, records: usize, error: &KafkaError);
    /// A write landed in its smaller form (a dead letter without its value).
    fn shrunk(&self, topic: &str);
    /// Writes wait for a retry (`true`) or stopped waiting (`false`).
    fn waiting(&self, waiting: bool);
    /// One produce request took `took`, whatever its result.
    fn produced(&self, _took: std::time::Duration) {}
}

/// The outcome of writing everything one batch owes: per owner, how its writes ended, and
/// how many attempts the slowest write took.
#[derive(Debug)]
pub struct Written {
    /// Per owner (index), how its writes ended; owners without writes are `Landed`.
    pub landings: Vec<Landing>,
    /// Rounds of produce requests it took (1 when everything landed at once).
    pub rounds: u32,
}

/// Writes every record of `writes` (owners `0..owners`), retrying what fails with
/// [`WRITE_BACKOFF`] until it lands, `stop` is cancelled or `deadline` (the earliest lock end
/// of the owners, on a broker that cannot renew) would be passed.
///
/// # Cancel safety
/// Not cancel safe in the sense that matters here: dropping the future loses track of which
/// writes landed. Stop it with `stop` instead; it then returns at its next wait.
pub async fn write_all(
    client: &KafkaClient,
    pipeline: &str,
    owners: usize,
    writes: Vec<Write>,
    stop: &CancellationToken,
    deadline: Option<Instant>,
    observer: &dyn WriteObserver,
) -> Written {
    let mut landings = vec![Landing::Landed; owners];
    let mut backoff = match deadline {
        Some(d) => Backoff::with_deadline(WRITE_BACKOFF, d.into()),
        None => Backoff::new(WRITE_BACKOFF),
    };
    let started = Instant::now();
    // Batches of writes: what failed is retried as the batch it was sent in (or in the halves
    // of a batch refused for its size), never merged again with others.
    let mut pending = vec![writes];
    let mut rounds = 0u32;
    let mut waiting = false;
    while !pending.is_empty() {
        rounds += 1;
        let round = attempt(client, pending, observer).await;
        for (owner, why) in round.unwritable {
            if landings[owner] == Landing::Landed {
                landings[owner] = Landing::Unwritable(why);
            }
        }
        // A write whose owner can never be acknowledged as planned needs no retry.
        pending = round
            .retry
            .into_iter()
            .map(|mut batch| {
                batch.retain(|w| landings[w.owner] == Landing::Landed);
                batch
            })
            .filter(|batch| !batch.is_empty())
            .collect();
        if pending.is_empty() {
            break;
        }
        if round.split_only {
            continue;
        }
        if rounds == 1 || rounds.is_multiple_of(LOG_EVERY_ATTEMPTS) {
            let first = round.first_error.as_deref().unwrap_or("");
            tracing::error!(
                pipeline,
                writes = pending.iter().map(Vec::len).sum::<usize>(),
                attempts = rounds,
                "writes failed, retrying with backoff; their source records stay acquired: {first}"
            );
        }
        // The smaller form is only for a topic that refused the whole record a moment ago:
        // after a wait, every write is tried whole again.
        for w in pending.iter_mut().flatten().filter(|w| w.shrunk) {
            if let Some(full) = w.smaller.take() {
                w.smaller = Some(std::mem::replace(&mut w.record, full));
                w.shrunk = false;
            }
        }
        if !waiting {
            waiting = true;
            observer.waiting(true);
        }
        let delay = backoff.next_delay();
        let stopped = match delay {
            None => true,
            Some(d) => tokio::select! {
                _ = stop.cancelled() => true,
                _ = tokio::time::sleep(d) => false,
            },
        };
        if stopped {
            tracing::warn!(
                pipeline,
                writes = pending.iter().map(Vec::len).sum::<usize>(),
                attempts = rounds,
                "writes not landed before the pipeline stopped or the lock ran out; their source records are released"
            );
            for w in pending.iter().flatten() {
                landings[w.owner] = Landing::Stopped;
            }
            break;
        }
    }
    if waiting {
        observer.waiting(false);
        if landings.iter().all(|l| *l != Landing::Stopped) {
            tracing::info!(
                pipeline,
                attempts = rounds,
                seconds = started.elapsed().as_secs_f64(),
                "writes landed after retrying"
            );
        }
    }
    Written { landings, rounds }
}

/// What one round of produce requests left to do.
struct Round {
    /// Batches of writes to try again.
    retry: Vec<Vec<Write>>,
    /// Owners with a write that can never land.
    unwritable: Vec<(usize, String)>,
    /// Every write to retry only needs another request (a batch split or a record shrunk),
    /// not a wait.
    split_only: bool,
    first_error: Option<String>,
}

/// Places the writes of every batch in their partitions (looking up partition counts),
/// produces each batch's share of a partition in requests under [`MAX_WRITE_BATCH_BYTES`], all
/// concurrently, and sorts the failures.
async fn attempt(
    client: &KafkaClient,
    batches: Vec<Vec<Write>>,
    observer: &dyn WriteObserver,
) -> Round {
    let mut round = Round {
        retry: Vec::new(),
        unwritable: Vec::new(),
        split_only: true,
        first_error: None,
    };
    let mut partitions: BTreeMap<String, usize> = BTreeMap::new();
    for w in batches.iter().flatten() {
        if partitions.contains_key(&w.topic) {
            continue;
        }
        let n = match client.topic(&w.topic) {
            Some(t) if !t.partitions.is_empty() => t.partitions.len(),
            _ => {
                let _ = client
                    .refresh_metadata(std::slice::from_ref(&w.topic))
                    .await;
                client.topic(&w.topic).map_or(0, |t| t.partitions.len())
            }
        };
        partitions.insert(w.topic.clone(), n);
    }
    let mut groups: Vec<((String, i32), Vec<Write>)> = Vec::new();
    for batch in batches {
        let mut placed: BTreeMap<(String, i32), Vec<Write>> = BTreeMap::new();
        let mut unplaced = Vec::new();
        for w in batch {
            match partitions.get(&w.topic).copied().unwrap_or(0) {
                0 => unplaced.push(w),
                n => {
                    let p = w.partition_by.partition(w.record.key.as_deref(), n);
                    placed.entry((w.topic.clone(), p)).or_default().push(w);
                }
            }
        }
        if let Some(w) = unplaced.first() {
            let e = KafkaError::UnknownTopic(w.topic.clone());
            observer.failed(&w.topic, unplaced.len(), &e);
            round.first_error.get_or_insert_with(|| e.to_string());
            round.split_only = false;
            round.retry.push(unplaced);
        }
        groups.extend(placed);
    }
    let sends = groups.into_iter().flat_map(|((topic, partition), items)| {
        chunks_by_size(items).into_iter().map(move |chunk| {
            let topic = topic.clone();
            async move {
                let records: Vec<ProduceRecord> = chunk.iter().map(|w| w.record.clone()).collect();
                let started = std::time::Instant::now();
                let result = client
                    .produce(&topic, partition, &records, WRITE_COMPRESSION)
                    .await;
                observer.produced(started.elapsed());
                (topic, chunk, result)
            }
        })
    });
    for (topic, mut chunk, result) in futures::future::join_all(sends).await {
        let Err(e) = result else {
            for _ in chunk.iter().filter(|w| w.shrunk) {
                observer.shrunk(&topic);
            }
            continue;
        };
        observer.failed(&topic, chunk.len(), &e);
        if is_too_large(&e) {
            if chunk.len() > 1 {
                let rest = chunk.split_off(chunk.len() / 2);
                round.retry.push(chunk);
                round.retry.push(rest);
                continue;
            }
            if let Some(mut w) = chunk.pop() {
                let fits = match &w.smaller {
                    Some(smaller) if !w.shrunk => {
                        Some(what_fits(client, &topic, &w.record, smaller).await)
                    }
                    _ => None,
                };
                match w.smaller.take() {
                    // Shrunk only when the topic's limit takes the smaller form and not the
                    // whole one: a topic that refuses every record for a while (an
                    // operator's limit, lifted later) must not have the smaller form tried
                    // the moment after the whole one, nor when the limit was lifted between
                    // the refusal and the look at it.
                    Some(smaller) if fits == Some(Fits::Smaller) => {
                        w.smaller = Some(std::mem::replace(&mut w.record, smaller));
                        w.shrunk = true;
                        round.retry.push(vec![w]);
                    }
                    // Not even the smaller form fits (or the whole one does now): wait for
                    // the topic and try the whole record again.
                    Some(other) => {
                        w.smaller = Some(other);
                        round.first_error.get_or_insert_with(|| e.to_string());
                        round.split_only = false;
                        round.retry.push(vec![w]);
                    }
                    None => round.unwritable.push((
                        w.owner,
                        format!("a record larger than topic {topic} accepts: {e}"),
                    )),
                }
            }
            continue;
        }
        round.first_error.get_or_insert_with(|| e.to_string());
        round.split_only = false;
        round.retry.push(chunk);
    }
    round
}

/// Bytes a batch of one record adds around the record (batch header, record framing).
const ONE_RECORD_BATCH_OVERHEAD: usize = 128;

/// The most bytes a record's framing adds inside a batch: its length, attributes, timestamp
/// and offset deltas, key and value lengths and header count as varints, and two lengths per
/// header.
pub fn record_framing(p: &ProduceRecord) -> usize {
    36 + 10 * p.headers.len()
}

/// Whether `record` alone, compressed as every write is, fits a topic whose
/// `max.message.bytes` is `limit`. Exact near the limit (the one-record batch is encoded):
/// lz4 may take a compressible record under it, or grow an incompressible one past it. Used
/// where a refused write cannot be split and tried again alone (a transaction's).
pub fn fits_alone(record: &ProduceRecord, limit: usize) -> bool {
    let raw = record_bytes(record) + record_framing(record);
    if raw + raw / 64 + ONE_RECORD_BATCH_OVERHEAD <= limit {
        return true;
    }
    crate::kafka::records::encode_batch(std::slice::from_ref(record), WRITE_COMPRESSION)
        .is_ok_and(|b| b.len() <= limit)
}

/// The most bytes (records and their framing, uncompressed) a batch of several records may
/// carry to a topic whose `max.message.bytes` is `limit` (`None`: unknown, the broker's
/// default assumed), whatever lz4 then does to them: at worst it adds a 64th.
pub fn batch_budget(limit: Option<usize>) -> usize {
    match limit {
        None => MAX_WRITE_BATCH_BYTES,
        Some(l) => MAX_WRITE_BATCH_BYTES.min(l.saturating_sub(ONE_RECORD_BATCH_OVERHEAD) * 63 / 64),
    }
}

/// Which form of a record its topic's `max.message.bytes` (its own or the broker's) takes
/// now, read after the topic refused the whole record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fits {
    /// The whole record: the limit was raised since the refusal.
    Whole,
    /// Only the smaller form (or the limit cannot be read: the smaller form is tried, as a
    /// topic that refused the whole record most likely takes it).
    Smaller,
    /// Neither: the topic refuses everything for now.
    Neither,
}

/// Reads the topic's limit now and tells which form of the record it takes.
async fn what_fits(
    client: &KafkaClient,
    topic: &str,
    whole: &ProduceRecord,
    smaller: &ProduceRecord,
) -> Fits {
    let limit = match client.topic_config(topic, "max.message.bytes").await {
        Ok(Some(limit)) => limit.parse::<usize>().ok(),
        Ok(None) | Err(_) => None,
    };
    fits_under(limit, record_bytes(whole), record_bytes(smaller))
}

/// [`what_fits`] for a limit already read (`None`: unknown) and the two forms' sizes.
fn fits_under(limit: Option<usize>, whole: usize, smaller: usize) -> Fits {
    match limit {
        None => Fits::Smaller,
        Some(limit) if whole + ONE_RECORD_BATCH_OVERHEAD <= limit => Fits::Whole,
        Some(limit) if smaller + ONE_RECORD_BATCH_OVERHEAD <= limit => Fits::Smaller,
        Some(_) => Fits::Neither,
    }
}

/// Whether the broker refused a batch (or a record of it) for its size.
fn is_too_large(e: &KafkaError) -> bool {
    matches!(
        e.code(),
        Some(ResponseError::MessageTooLarge | ResponseError::RecordListTooLarge)
    )
}

/// The bytes a record adds to a batch before compression (key, value, header keys and values).
pub fn record_bytes(p: &ProduceRecord) -> usize {
    let len = |b: &Option<Bytes>| b.as_ref().map_or(0, Bytes::len);
    len(&p.key)
        + len(&p.value)
        + p.headers
            .iter()
            .map(|h| h.key.len() + len(&h.value))
            .sum::<usize>()
}

/// Splits one partition's writes into produce batches of at most [`MAX_WRITE_BATCH_BYTES`]
/// (uncompressed; a single larger record goes alone, and the broker decides), in order.
fn chunks_by_size(items: Vec<Write>) -> Vec<Vec<Write>> {
    let mut chunks = Vec::new();
    let (mut current, mut bytes) = (Vec::new(), 0usize);
    for item in items {
        let n = record_bytes(&item.record);
        if !current.is_empty() && bytes + n > MAX_WRITE_BATCH_BYTES {
            chunks.push(std::mem::take(&mut current));
            bytes = 0;
        }
        bytes += n;
        current.push(item);
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(owner: usize, bytes: usize) -> Write {
        let record = ProduceRecord {
            value: Some(Bytes::from(vec![b'x'; bytes])),
            ..Default::default()
        };
        Write::new(owner, "t", PartitionBy::Source(0), record)
    }

    #[test]
    fn write_batches_stay_under_the_size_bound_and_keep_record_order() {
        let items: Vec<Write> = (0..10).map(|i| write(i, 200 << 10)).collect();
        let chunks = chunks_by_size(items);
        assert_eq!(chunks.len(), 5, "two 200 KiB records per 512 KiB batch");
        let order: Vec<usize> = chunks.iter().flatten().map(|w| w.owner).collect();
        assert_eq!(order, (0..10).collect::<Vec<_>>());
        for c in &chunks {
            let bytes: usize = c.iter().map(|w| record_bytes(&w.record)).sum();
            assert!(bytes <= MAX_WRITE_BATCH_BYTES, "{bytes}");
        }
        let alone = chunks_by_size(vec![write(0, 2 << 20)]);
        assert_eq!(alone.len(), 1, "a record over the bound goes alone");
    }

    #[test]
    fn a_record_is_shrunk_only_when_the_limit_takes_its_smaller_form_and_not_the_whole() {
        // A limit of 1 byte (every record refused) waits, and so does a limit raised between
        // the refusal and the look at it: only the limit that takes the smaller form alone
        // shrinks the record.
        assert_eq!(fits_under(Some(1), 2_000_000, 300), Fits::Neither);
        assert_eq!(fits_under(Some(1 << 20), 2_000, 300), Fits::Whole);
        assert_eq!(fits_under(Some(1 << 20), 2 << 20, 300), Fits::Smaller);
        assert_eq!(fits_under(None, 2 << 20, 300), Fits::Smaller);
    }

    /// `n` random bytes: lz4 cannot shrink them.
    fn noise(n: usize, seed: u64) -> Bytes {
        use rand::{RngCore, SeedableRng};
        let mut v = vec![0; n];
        rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
        Bytes::from(v)
    }

    fn with_headers(value: Bytes) -> ProduceRecord {
        ProduceRecord {
            key: Some(Bytes::from_static(b"k-1")),
            value: Some(value),
            headers: (0..4)
                .map(|i| crate::kafka::Header {
                    key: format!("sharehost.h{i}"),
                    value: Some(Bytes::from(i.to_string())),
                })
                .collect(),
            timestamp: Some(1_700_000_000_000),
        }
    }

    fn encoded(records: &[ProduceRecord]) -> usize {
        crate::kafka::records::encode_batch(records, WRITE_COMPRESSION)
            .expect("encode")
            .len()
    }

    #[test]
    fn a_record_fits_alone_exactly_when_its_compressed_batch_is_within_the_limit() {
        let limit = 8192;
        let mut seen = (0, 0);
        for n in (0..20_000).step_by(211) {
            let r = with_headers(noise(n, n as u64));
            let fits = fits_alone(&r, limit);
            assert_eq!(
                fits,
                encoded(std::slice::from_ref(&r)) <= limit,
                "{n} bytes"
            );
            if fits { seen.0 += 1 } else { seen.1 += 1 }
        }
        assert!(seen.0 > 0 && seen.1 > 0, "{seen:?}");
        // Compressible: 20 KB of one byte is written under an 8 KiB limit.
        assert!(fits_alone(
            &with_headers(Bytes::from(vec![b'0'; 20_000])),
            limit
        ));
    }

    #[test]
    fn records_under_the_batch_budget_fit_the_limit_as_one_batch_whatever_they_hold() {
        for limit in [300, 8192, 100_000, 1_048_588] {
            let budget = batch_budget(Some(limit));
            for size in [1, 10, 100, 1000] {
                let mut batch = Vec::new();
                let mut bytes = 0;
                loop {
                    let r = with_headers(noise(size, (bytes + size) as u64));
                    let cost = record_bytes(&r) + record_framing(&r);
                    if bytes + cost > budget {
                        break;
                    }
                    bytes += cost;
                    batch.push(r);
                }
                if !batch.is_empty() {
                    let n = encoded(&batch);
                    assert!(
                        n <= limit,
                        "{} records of {size} B: {n} > {limit}",
                        batch.len()
                    );
                }
            }
        }
        assert_eq!(batch_budget(None), MAX_WRITE_BATCH_BYTES);
        assert_eq!(
            batch_budget(Some(10)),
            0,
            "a limit below a batch's header takes nothing"
        );
    }

    #[test]
    fn keyed_writes_follow_murmur2_and_keyless_ones_their_source_partition() {
        let by = PartitionBy::KeyOrSource(7);
        assert_eq!(by.partition(None, 3), 1);
        assert_eq!(
            by.partition(Some(b"foobar"), 12),
            partitioner::by_key_or(Some(b"foobar"), 0, 12)
        );
        assert_eq!(PartitionBy::Source(7).partition(Some(b"foobar"), 3), 1);
        assert_eq!(
            PartitionBy::Source(5).partition(None, 0),
            0,
            "no division by zero"
        );
    }
}

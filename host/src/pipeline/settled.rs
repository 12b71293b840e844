//! The settled log of an exactly-once pipeline: a topic per share group in which each
//! transaction that writes a batch's outputs and dead letters also writes which source records
//! it settles, and with which verdict. A record delivered again (its acknowledgement was lost
//! with a connection, a broker or a host) is looked up here before anyone judges it: settled
//! by a committed transaction, it is acknowledged as it was then, and nothing is written again.
//!
//! The lookup is only sound once every transaction that could hold the record is decided, so
//! it reads `read_committed` up to the end of the log that ListOffsets gave when it began, and
//! waits until the last stable offset has passed that point (a transaction still open holds it
//! back; the coordinator aborts one that runs past its timeout).
//!
//! Memory: only records at or above their share partition's start offset can be delivered
//! again, and at most the group's in-flight limit per partition lie above it, so the index keeps
//! nothing below the start offsets the group coordinator reports (DescribeShareGroupOffsets),
//! read before every catch-up.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::kafka::protocol::share_offsets::share_group_offsets;
use crate::kafka::{KafkaClient, KafkaError, OffsetSpec, ProduceRecord};
use crate::share::ledger::AckKind;

/// How long the settled log keeps what it was told (the topic's `retention.ms` when the host
/// creates it): a record whose acknowledgement was lost and that stays undelivered longer than
/// this after its transaction (no member of the group for a day) is judged again.
pub const SETTLED_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The most verdicts kept per source partition: four times the largest in-flight limit a group
/// may set (`group.share.max.partition.max.record.locks`, 4,000), so well-behaved writers never
/// reach it; a settled log written by something else cannot grow the index past it.
pub const MAX_VERDICTS_PER_PARTITION: usize = 16_384;

/// The settled log's topic for `group`: one per share group, so every host of the group reads
/// the same log. `None` when the group's name cannot be part of a topic name.
pub fn settled_topic(group: &str) -> Option<String> {
    let name = format!("sharehost-settled.{group}");
    let valid = name.len() <= 249
        && group
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    valid.then_some(name)
}

/// The settled log's one record per source partition and transaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SettledRecord {
    /// The source topic.
    pub topic: String,
    /// The source partition.
    pub partition: i32,
    /// Offset and verdict (`accept` or `reject`) of each record the transaction settles.
    pub verdicts: Vec<(i64, String)>,
}

impl SettledRecord {
    /// The record to write in the transaction, keyed by its source partition.
    pub fn produce(&self) -> ProduceRecord {
        ProduceRecord {
            key: Some(format!("{}/{}", self.topic, self.partition).into()),
            value: serde_json::to_vec(self).ok().map(Into::into),
            ..Default::default()
        }
    }
}

fn verdict_name(kind: AckKind) -> Option<&'static str> {
    match kind {
        AckKind::Accept => Some("accept"),
        AckKind::Reject => Some("reject"),
        _ => None,
    }
}

fn verdict_kind(name: &str) -> Option<AckKind> {
    match name {
        "accept" => Some(AckKind::Accept),
        "reject" => Some(AckKind::Reject),
        _ => None,
    }
}

/// The settled records for `settles` (source topic, partition, offset, final verdict), one per
/// source partition; verdicts other than accept and reject settle nothing.
pub fn settled_records(settles: &[(&str, i32, i64, AckKind)]) -> Vec<SettledRecord> {
    let mut by_partition: BTreeMap<(&str, i32), Vec<(i64, String)>> = BTreeMap::new();
    for &(topic, partition, offset, kind) in settles {
        if let Some(name) = verdict_name(kind) {
            by_partition
                .entry((topic, partition))
                .or_default()
                .push((offset, name.to_owned()));
        }
    }
    by_partition
        .into_iter()
        .map(|((topic, partition), verdicts)| SettledRecord {
            topic: topic.to_owned(),
            partition,
            verdicts,
        })
        .collect()
}

/// Why a lookup could not answer.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// Reading the log or the group's offsets failed.
    #[error("settled log {topic}: {source}")]
    Kafka {
        /// The settled topic.
        topic: String,
        /// The failure.
        source: KafkaError,
    },
    /// A transaction stayed open past the wait (the coordinator aborts it at its timeout).
    #[error(
        "settled log {topic}: a transaction is still open after {waited:?} (last stable offset {lso}, wanted {wanted})"
    )]
    Undecided {
        /// The settled topic.
        topic: String,
        /// How long the lookup waited.
        waited: Duration,
        /// The last stable offset seen.
        lso: i64,
        /// The offset it had to pass.
        wanted: i64,
    },
}

/// What a host knows of the settled log: how far it read, and the verdicts at or above each
/// partition's start offset.
#[derive(Debug)]
pub struct SettledIndex {
    topic: String,
    group: String,
    /// The longest a lookup waits for open transactions to be decided.
    patience: Duration,
    state: tokio::sync::Mutex<IndexState>,
    /// Settled records that could not be read (named in the log once each).
    malformed: std::sync::atomic::AtomicU64,
    /// Verdicts dropped over [`MAX_VERDICTS_PER_PARTITION`].
    dropped: std::sync::atomic::AtomicU64,
    /// Settled records for partitions the pipeline does not read.
    foreign: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct IndexState {
    /// The pipeline's source topics and their partition counts: a settled record for any other
    /// partition is not this group's (or not sharehost's), and is skipped.
    partitions: HashMap<String, usize>,
    /// The next offset to read; `None` before the first lookup.
    position: Option<i64>,
    /// Per source partition, the start offset last reported (nothing below it is kept).
    floors: HashMap<(String, i32), i64>,
    /// Per source partition, offset → verdict.
    verdicts: HashMap<(String, i32), BTreeMap<i64, AckKind>>,
}

impl SettledIndex {
    /// An index of `topic` for `group`, which reads `sources`; a lookup waits at most
    /// `patience` for open transactions (the transaction timeout plus the coordinator's abort
    /// check).
    pub fn new(topic: &str, group: &str, sources: &[String], patience: Duration) -> SettledIndex {
        SettledIndex {
            topic: topic.to_owned(),
            group: group.to_owned(),
            patience,
            state: tokio::sync::Mutex::new(IndexState {
                partitions: sources.iter().map(|t| (t.clone(), 0)).collect(),
                ..IndexState::default()
            }),
            malformed: std::sync::atomic::AtomicU64::new(0),
            dropped: std::sync::atomic::AtomicU64::new(0),
            foreign: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How many verdicts it holds (for the memory bound's tests and metrics).
    pub async fn verdicts_held(&self) -> usize {
        self.state
            .lock()
            .await
            .verdicts
            .values()
            .map(BTreeMap::len)
            .sum()
    }

    /// Settled records that could not be read.
    pub fn malformed(&self) -> u64 {
        self.malformed.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn kafka(&self, source: KafkaError) -> LookupError {
        LookupError::Kafka {
            topic: self.topic.clone(),
            source,
        }
    }

    /// The verdict a committed transaction settled each of `records` (source topic,
    /// partition, offset) with, `None` where none did; reads the log up to every transaction
    /// decided before answering.
    pub async fn lookup(
        &self,
        client: &Arc<KafkaClient>,
        records: &[(&str, i32, i64)],
    ) -> Result<Vec<Option<AckKind>>, LookupError> {
        let mut st = self.state.lock().await;
        // The start offsets first: what is below them is done and never asked for again. A
        // group the coordinator has no state for has no floor yet.
        // A coordinator still loading (a broker just started) is asked again within the
        // lookup's patience.
        let mut backoff = crate::kafka::backoff::Backoff::with_deadline(
            crate::kafka::backoff::BackoffConfig::default(),
            Instant::now() + self.patience,
        );
        let offsets = loop {
            match share_group_offsets(client, &self.group).await {
                Ok(o) => break o,
                Err(e) if e.code() == Some(kafka_protocol::ResponseError::GroupIdNotFound) => {
                    break Vec::new();
                }
                Err(e) if e.class() != crate::kafka::ErrorClass::Fatal && backoff.wait().await => {}
                Err(e) => return Err(self.kafka(e)),
            }
        };
        for (topic, count) in st.partitions.iter_mut() {
            if let Some(meta) = client.topic(topic) {
                *count = (*count).max(meta.partitions.len());
            }
        }
        for p in offsets.iter().filter(|p| p.error_code == 0) {
            st.floors
                .insert((p.topic.clone(), p.partition), p.start_offset);
        }
        let IndexState {
            floors, verdicts, ..
        } = &mut *st;
        for (key, map) in verdicts.iter_mut() {
            if let Some(floor) = floors.get(key) {
                *map = map.split_off(floor);
            }
        }
        verdicts.retain(|_, m| !m.is_empty());
        self.catch_up(client, &mut st).await?;
        Ok(verdicts_of(&st, records))
    }

    /// The verdicts the index holds now for `records`, without reading the log: sound only for
    /// records no transaction could have settled since the index last caught up (see
    /// `ExactlyOnce::suspects`).
    pub async fn known(&self, records: &[(&str, i32, i64)]) -> Vec<Option<AckKind>> {
        verdicts_of(&*self.state.lock().await, records)
    }

    /// Reads the log `read_committed` until it has passed the end of the log at the start,
    /// and the last stable offset has too.
    async fn catch_up(
        &self,
        client: &Arc<KafkaClient>,
        st: &mut IndexState,
    ) -> Result<(), LookupError> {
        let mut position = match st.position {
            Some(p) => p,
            None => client
                .list_offset(&self.topic, 0, OffsetSpec::Earliest)
                .await
                .map_err(|e| self.kafka(e))?,
        };
        let began = Instant::now();
        // The end of the log from ListOffsets, not from a fetch's high watermark: a leader just
        // elected answers fetches with the high watermark it had as a follower, which can lie
        // below transactions already committed (their records are in its log), and a lookup
        // that stopped there would miss them and judge their records again. ListOffsets refuses
        // (OFFSET_NOT_AVAILABLE, retried) until that leader's high watermark has caught up with
        // its log at election (KIP-207).
        let target = client
            .list_offset(&self.topic, 0, OffsetSpec::Latest)
            .await
            .map_err(|e| self.kafka(e))?;
        loop {
            let read = match client
                .fetch_committed(&self.topic, 0, position, Duration::ZERO)
                .await
            {
                Ok(read) => read,
                // Retention removed what this host had not read yet: what it held is older
                // than any record that can still come again (see SETTLED_RETENTION).
                Err(e) if e.code() == Some(kafka_protocol::ResponseError::OffsetOutOfRange) => {
                    position = client
                        .list_offset(&self.topic, 0, OffsetSpec::Earliest)
                        .await
                        .map_err(|e| self.kafka(e))?;
                    continue;
                }
                Err(e) => return Err(self.kafka(e)),
            };
            for r in &read.records {
                self.apply(st, r.offset, r.value.as_deref());
            }
            let before = position;
            position = read.next_offset.max(position);
            st.position = Some(position);
            // A read_committed answer ends at the last stable offset, so having read past the
            // target means every transaction below it was decided.
            if position >= target && read.last_stable_offset >= target {
                return Ok(());
            }
            if position == before {
                if began.elapsed() >= self.patience {
                    return Err(LookupError::Undecided {
                        topic: self.topic.clone(),
                        waited: began.elapsed(),
                        lso: read.last_stable_offset,
                        wanted: target,
                    });
                }
                // An open transaction holds the last stable offset back; its commit or abort
                // comes within the transaction timeout. (A long-polling read would hold the
                // client's shared connection meanwhile.)
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    fn apply(&self, st: &mut IndexState, offset: i64, value: Option<&[u8]>) {
        let parsed = value.and_then(|v| serde_json::from_slice::<SettledRecord>(v).ok());
        let Some(rec) = parsed else {
            if self
                .malformed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                == 0
            {
                tracing::warn!(topic = %self.topic, offset, "a record of the settled log is not one sharehost wrote; skipped (further ones are only counted)");
            }
            return;
        };
        let ours = st
            .partitions
            .get(&rec.topic)
            .is_some_and(|n| usize::try_from(rec.partition).is_ok_and(|p| p < *n));
        if !ours {
            self.foreign
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        let key = (rec.topic, rec.partition);
        let floor = st.floors.get(&key).copied().unwrap_or(i64::MIN);
        let map = st.verdicts.entry(key).or_default();
        for (o, name) in rec.verdicts {
            if o < floor {
                continue;
            }
            if let Some(kind) = verdict_kind(&name) {
                map.insert(o, kind);
            }
        }
        // Over the bound, the highest offsets go: a record comes again from the bottom of its
        // partition's window, and what lies far above it was never in flight.
        while map.len() > MAX_VERDICTS_PER_PARTITION {
            map.pop_last();
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// What `st` holds for each of `records` (source topic, partition, offset).
fn verdicts_of(st: &IndexState, records: &[(&str, i32, i64)]) -> Vec<Option<AckKind>> {
    records
        .iter()
        .map(|(t, p, o)| {
            st.verdicts
                .get(&((*t).to_owned(), *p))
                .and_then(|m| m.get(o).copied())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_names_its_topic_only_with_characters_a_topic_may_hold() {
        assert_eq!(
            settled_topic("orders-v1").as_deref(),
            Some("sharehost-settled.orders-v1")
        );
        assert_eq!(settled_topic("orders v1"), None);
        assert_eq!(settled_topic(&"g".repeat(300)), None);
    }

    #[test]
    fn settled_records_are_one_per_partition_and_keep_only_final_verdicts() {
        let recs = settled_records(&[
            ("a", 0, 5, AckKind::Accept),
            ("a", 1, 7, AckKind::Reject),
            ("a", 0, 6, AckKind::Release),
            ("a", 0, 8, AckKind::Reject),
        ]);
        assert_eq!(recs.len(), 2);
        assert_eq!(
            recs[0].verdicts,
            vec![(5, "accept".to_owned()), (8, "reject".to_owned())]
        );
        let back: SettledRecord =
            serde_json::from_slice(recs[1].produce().value.as_deref().unwrap_or_default())
                .expect("round trip");
        assert_eq!(back, recs[1]);
    }

    #[test]
    fn the_index_keeps_nothing_below_a_start_offset_and_skips_what_it_cannot_read() {
        let index = SettledIndex::new("t", "g", &["a".to_owned()], Duration::from_secs(1));
        let mut st = IndexState::default();
        st.partitions.insert("a".into(), 2);
        st.floors.insert(("a".into(), 0), 10);
        let rec = SettledRecord {
            topic: "a".into(),
            partition: 0,
            verdicts: vec![
                (9, "accept".into()),
                (10, "reject".into()),
                (11, "bogus".into()),
            ],
        };
        index.apply(&mut st, 0, rec.produce().value.as_deref());
        index.apply(&mut st, 1, Some(b"not json"));
        index.apply(&mut st, 2, None);
        let map = &st.verdicts[&("a".to_owned(), 0)];
        assert_eq!(map.len(), 1);
        assert_eq!(map.get(&10), Some(&AckKind::Reject));
        assert_eq!(index.malformed(), 2);
        // Another topic, a partition the topic does not have, a negative one: not ours.
        for (topic, partition) in [("b", 0), ("a", 2), ("a", -1)] {
            let rec = SettledRecord {
                topic: topic.into(),
                partition,
                verdicts: vec![(20, "accept".into())],
            };
            index.apply(&mut st, 3, rec.produce().value.as_deref());
        }
        assert_eq!(st.verdicts.len(), 1);
        assert_eq!(index.foreign.load(std::sync::atomic::Ordering::Relaxed), 3);
    }

    #[test]
    fn a_flood_of_verdicts_for_one_partition_stays_within_the_bound() {
        let index = SettledIndex::new("t", "g", &["a".to_owned()], Duration::from_secs(1));
        let mut st = IndexState::default();
        st.partitions.insert("a".into(), 2);
        st.floors.insert(("a".into(), 0), 100);
        // Far more than any group holds in flight, at offsets from the floor up to i64::MAX.
        for chunk in 0..40i64 {
            let rec = SettledRecord {
                topic: "a".into(),
                partition: 0,
                verdicts: (0..1_000i64)
                    .map(|i| {
                        let o = if chunk == 39 {
                            i64::MAX - i
                        } else {
                            100 + chunk * 1_000 + i
                        };
                        (o, "accept".to_owned())
                    })
                    .collect(),
            };
            index.apply(&mut st, chunk, rec.produce().value.as_deref());
        }
        let map = &st.verdicts[&("a".to_owned(), 0)];
        assert_eq!(map.len(), MAX_VERDICTS_PER_PARTITION);
        assert_eq!(
            map.first_key_value().map(|(o, _)| *o),
            Some(100),
            "the bottom of the window stays"
        );
        assert!(
            map.last_key_value()
                .is_some_and(|(o, _)| *o < i64::MAX - 1_000)
        );
        assert_eq!(
            index.dropped.load(std::sync::atomic::Ordering::Relaxed),
            40_000 - MAX_VERDICTS_PER_PARTITION as u64
        );
    }
}

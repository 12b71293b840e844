//! Acting on a plan exactly once (`guarantee = "exactly-once"`): the batch's outputs, its dead
//! letters and the settled log's record of which source records they settle go into one Kafka
//! transaction, and the records are acknowledged only once it committed. A record delivered
//! again is looked up in the settled log before it is judged (see [`super::settled`]).
//!
//! **A host that lost its locks never commits.** The commit is sent only if, after every write
//! of the transaction was acknowledged (acks=all), each of the batch's records still has time
//! left on the lock this host can prove ([`ShareConsumer::lock_left`], counted from when the
//! acquiring request was sent, renewals ignored). Then every write, the settled record
//! included, reached the log before any lock ran out, so before any other member could acquire
//! one of the records; that member's lookup starts after that, so it sees the settled record
//! below the high watermark it waits for, and waits until this transaction is decided: if it
//! commits (however late), the record is found settled and nothing is written again; if the
//! coordinator aborts it (its timeout, or this host's next InitProducerId), this host's late
//! commit is refused as fenced. A host that finds a lock short aborts instead and releases the
//! batch, and a pause after the check only delays a decision the other member waits for.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;

use super::act::{BatchContext, Cause, Decision, output_record, release_all};
use super::handle::Pipeline;
use super::settled::{SettledIndex, settled_records};
use crate::kafka::backoff::Backoff;
use crate::kafka::{ProduceRecord, TransactionalProducer, TxnError};
use crate::runtime::Emit;
use crate::share::consumer::{LOCK_MARGIN, Settle, ShareRecord};
use crate::share::ledger::AckKind;
use crate::writes::{
    MAX_WRITE_BATCH_BYTES, PartitionBy, WRITE_BACKOFF, WRITE_COMPRESSION, record_bytes,
};

/// What an exactly-once pipeline's run holds: its transactional producer and the settled
/// log's index.
#[derive(Debug)]
pub(super) struct ExactlyOnce {
    pub(super) producer: TransactionalProducer,
    pub(super) index: SettledIndex,
    /// The settled log's topic.
    pub(super) topic: String,
}

/// Why a transaction did not commit.
enum NotCommitted {
    /// A lock would run out: aborted, the records go back.
    LocksShort,
    /// The commit's answer never came: only a lookup can tell, so the records go back and
    /// their redelivery is looked up.
    Unknown(TxnError),
    /// Failed before the commit: aborted, may be tried again.
    Failed(TxnError),
}

impl Pipeline {
    /// Looks up the records of `batch` delivered before (delivery count above 1) in the settled
    /// log: each one a committed transaction settled is acknowledged as it was then, without
    /// judging or writing; returns the others. Records whose lookup fails go back to the broker
    /// (judging them might write twice).
    pub(super) async fn settled_earlier(
        &self,
        ctx: &BatchContext,
        eo: &ExactlyOnce,
        batch: Vec<ShareRecord>,
    ) -> Vec<ShareRecord> {
        let again: Vec<usize> = (0..batch.len())
            .filter(|&i| batch[i].delivery_count > 1)
            .collect();
        if again.is_empty() {
            return batch;
        }
        let keys: Vec<(&str, i32, i64)> = again
            .iter()
            .map(|&i| {
                let r = &batch[i];
                (&*r.topic, r.partition.partition, r.record.offset)
            })
            .collect();
        let found = match eo.index.lookup(&ctx.client, &keys).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(pipeline = %self.spec.name, records = again.len(), "records delivered again go back unjudged: {e}");
                let back: Vec<&ShareRecord> = again.iter().map(|&i| &batch[i]).collect();
                release_all(&ctx.consumer, back);
                let mut batch = batch;
                let mut i = 0;
                batch.retain(|_| {
                    i += 1;
                    again.binary_search(&(i - 1)).is_err()
                });
                return batch;
            }
        };
        let settled: Vec<(usize, AckKind)> = again
            .iter()
            .zip(found)
            .filter_map(|(&i, kind)| Some((i, kind?)))
            .collect();
        if settled.is_empty() {
            return batch;
        }
        tracing::info!(pipeline = %self.spec.name, records = settled.len(), "records delivered again were settled by a committed transaction: acknowledged as then, not judged or written again");
        let decisions: Vec<Decision<'_>> = settled
            .iter()
            .map(|&(i, kind)| Decision::new(&batch[i], Settle::Final(kind), Cause::Verdict))
            .collect();
        self.settle(&ctx.consumer, &decisions, &self.active_hash());
        self.metrics
            .settled_earlier
            .get_or_create(&vec![("pipeline", self.spec.name.clone())])
            .inc_by(settled.len() as u64);
        let mut batch = batch;
        let mut i = 0;
        batch.retain(|_| {
            i += 1;
            settled.binary_search_by_key(&(i - 1), |&(j, _)| j).is_err()
        });
        batch
    }

    /// Writes what a batch owes in one transaction with its settled record, then acknowledges:
    /// `producing` (accepted records and their emits) and `rejects` (rejected records and their
    /// reasons; dead-lettered where the pipeline has a topic for it). `now` (verdicts that owe
    /// no write) are settled at once. A failed transaction is tried again while the locks
    /// allow; what cannot be committed in time goes back to the broker.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn transact<'r>(
        &self,
        ctx: &BatchContext,
        eo: &ExactlyOnce,
        now: Vec<Decision<'r>>,
        producing: Vec<(&'r ShareRecord, Vec<Emit>)>,
        rejects: Vec<(&'r ShareRecord, String)>,
        hash: &str,
        permit: OwnedSemaphorePermit,
    ) {
        self.settle(&ctx.consumer, &now, hash);
        let mut permit = Some(permit);
        let (plugin, signer) = self.identity(hash);
        let mut writes: Vec<(String, PartitionBy, ProduceRecord)> = Vec::new();
        let mut decisions: Vec<Decision<'r>> = Vec::new();
        let mut emitted = 0u64;
        for (r, emits) in &producing {
            for e in emits {
                if let Some(topic) = self.spec.outputs.get(&*e.output) {
                    emitted += 1;
                    writes.push((
                        topic.clone(),
                        PartitionBy::KeyOrSource(r.partition.partition),
                        output_record(r, e),
                    ));
                }
            }
            decisions.push(Decision::new(
                r,
                Settle::Final(AckKind::Accept),
                Cause::Verdict,
            ));
        }
        let mut dead_lettered = 0u64;
        for (r, reason) in &rejects {
            match &self.spec.dead_letter_topic {
                Some(dlq) => {
                    dead_lettered += 1;
                    writes.push((
                        dlq.clone(),
                        PartitionBy::Source(r.partition.partition),
                        self.dead_letter(r, reason, &plugin, hash, signer.as_deref(), true),
                    ));
                    decisions.push(Decision::new(
                        r,
                        Settle::Final(AckKind::Reject),
                        Cause::DeadLettered,
                    ));
                }
                None => decisions.push(Decision::new(
                    r,
                    Settle::Final(AckKind::Reject),
                    Cause::Verdict,
                )),
            }
        }
        let settles: Vec<(&str, i32, i64, AckKind)> = decisions
            .iter()
            .filter_map(|d| match d.settle {
                Settle::Final(kind) => Some((
                    &*d.record.topic,
                    d.record.partition.partition,
                    d.record.record.offset,
                    kind,
                )),
                _ => None,
            })
            .collect();
        for s in settled_records(&settles) {
            writes.push((eo.topic.clone(), PartitionBy::Source(0), s.produce()));
        }
        let records: Vec<&ShareRecord> = decisions.iter().map(|d| d.record).collect();
        let mut backoff = Backoff::new(WRITE_BACKOFF);
        let mut waiting = false;
        let labels = vec![("pipeline", self.spec.name.clone())];
        let outcome = loop {
            match self.one_transaction(ctx, eo, &writes, &records).await {
                Ok(()) => break Ok(()),
                Err(NotCommitted::Failed(e)) => {
                    self.counters
                        .writes
                        .failures
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.metrics
                        .write_failures
                        .get_or_create(&vec![
                            ("pipeline", self.spec.name.clone()),
                            ("kind", "transaction".to_owned()),
                            ("topic", eo.topic.clone()),
                            ("error", "transaction".to_owned()),
                        ])
                        .inc();
                    tracing::warn!(pipeline = %self.spec.name, records = records.len(), "a batch's transaction failed and is tried again while its locks allow: {e}");
                    if !waiting {
                        waiting = true;
                        permit.take();
                        self.counters
                            .writes
                            .waiting
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        self.metrics.writes_waiting.get_or_create(&labels).inc();
                    }
                    let pause = backoff.next_delay().unwrap_or(WRITE_BACKOFF.max);
                    let left = records
                        .iter()
                        .map(|r| ctx.consumer.lock_left(r))
                        .min()
                        .unwrap_or_default();
                    if left <= pause + LOCK_MARGIN {
                        break Err(format!("the locks run out before the next try: {e}"));
                    }
                    tokio::select! {
                        _ = ctx.stop.cancelled() => break Err(format!("the pipeline stops: {e}")),
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
                Err(NotCommitted::LocksShort) => {
                    break Err("a lock would run out before the commit: aborted".to_owned());
                }
                Err(NotCommitted::Unknown(e)) => break Err(e.to_string()),
            }
        };
        if waiting {
            self.counters
                .writes
                .waiting
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            self.metrics.writes_waiting.get_or_create(&labels).dec();
        }
        drop(permit);
        match outcome {
            Ok(()) => {
                if emitted > 0 {
                    self.counters.count_emits(hash, "produced", emitted);
                }
                if dead_lettered > 0 {
                    self.counters
                        .dead_lettered
                        .fetch_add(dead_lettered, std::sync::atomic::Ordering::Relaxed);
                    self.metrics
                        .dead_lettered
                        .get_or_create(&self.counters.labels(hash))
                        .inc_by(dead_lettered);
                }
                self.settle(&ctx.consumer, &decisions, hash);
            }
            Err(why) => {
                tracing::warn!(pipeline = %self.spec.name, records = records.len(), "a batch's transaction did not commit; its records go back to the broker (a record delivered again is looked up in the settled log first): {why}");
                if emitted > 0 {
                    self.counters.count_emits(hash, "failed", emitted);
                }
                let back: Vec<Decision<'r>> = records
                    .iter()
                    .map(|r| Decision::new(r, Settle::Final(AckKind::Release), Cause::Unwritten))
                    .collect();
                self.settle(&ctx.consumer, &back, hash);
            }
        }
    }

    /// One try: begin, add every partition, write, check the locks, commit.
    async fn one_transaction(
        &self,
        ctx: &BatchContext,
        eo: &ExactlyOnce,
        writes: &[(String, PartitionBy, ProduceRecord)],
        records: &[&ShareRecord],
    ) -> Result<(), NotCommitted> {
        // Each write's partition, as the plain write path places it.
        let mut placed: BTreeMap<(String, i32), Vec<ProduceRecord>> = BTreeMap::new();
        for (topic, by, record) in writes {
            let n = match ctx.client.topic(topic) {
                Some(t) if !t.partitions.is_empty() => t.partitions.len(),
                _ => {
                    let _ = ctx
                        .client
                        .refresh_metadata(std::slice::from_ref(topic))
                        .await;
                    ctx.client.topic(topic).map_or(0, |t| t.partitions.len())
                }
            };
            if n == 0 {
                return Err(NotCommitted::Failed(TxnError::Kafka {
                    id: eo.producer.id().to_owned(),
                    source: crate::kafka::KafkaError::UnknownTopic(topic.clone()),
                }));
            }
            let p = by.partition(record.key.as_deref(), n);
            placed
                .entry((topic.clone(), p))
                .or_default()
                .push(record.clone());
        }
        let mut txn = eo.producer.begin().await.map_err(NotCommitted::Failed)?;
        let partitions: Vec<(String, i32)> = placed.keys().cloned().collect();
        txn.add(&partitions).await.map_err(NotCommitted::Failed)?;
        for ((topic, partition), records) in &placed {
            // Batches under the byte bound the plain writes keep.
            let mut start = 0;
            while start < records.len() {
                let mut end = start;
                let mut bytes = 0;
                while end < records.len()
                    && (end == start
                        || bytes + record_bytes(&records[end]) <= MAX_WRITE_BATCH_BYTES)
                {
                    bytes += record_bytes(&records[end]);
                    end += 1;
                }
                txn.send(topic, *partition, &records[start..end], WRITE_COMPRESSION)
                    .await
                    .map_err(NotCommitted::Failed)?;
                start = end;
            }
        }
        let left = records
            .iter()
            .map(|r| ctx.consumer.lock_left(r))
            .min()
            .unwrap_or_default();
        if left <= LOCK_MARGIN {
            if let Err(e) = txn.abort().await {
                tracing::debug!(pipeline = %self.spec.name, "abort after a short lock: {e}");
            }
            return Err(NotCommitted::LocksShort);
        }
        match txn.commit().await {
            Ok(()) => Ok(()),
            Err(e @ TxnError::CommitUnknown { .. }) => Err(NotCommitted::Unknown(e)),
            Err(e) => Err(NotCommitted::Failed(e)),
        }
    }
}

/// The transactional id of a pipeline's member: stable across restarts as long as the member
/// id is (kept beside the state file), so a restarted host fences its predecessor and the
/// coordinator aborts what that one left open.
pub(super) fn transactional_id(group: &str, member: &str) -> String {
    format!("sharehost.{group}.{member}")
}

/// How long a lookup waits for an open transaction to be decided: its timeout, then the
/// coordinator's check for timed-out transactions (10 s by default) and a margin.
pub(super) fn lookup_patience(transaction_timeout: Duration) -> Duration {
    transaction_timeout + Duration::from_secs(15)
}

/// Builds what an exactly-once run needs.
pub(super) fn exactly_once(
    client: &Arc<crate::kafka::KafkaClient>,
    group: &str,
    sources: &[String],
    member: &str,
    topic: &str,
    transaction_timeout: Duration,
) -> ExactlyOnce {
    ExactlyOnce {
        producer: TransactionalProducer::new(
            client.clone(),
            &transactional_id(group, member),
            transaction_timeout,
        ),
        index: SettledIndex::new(topic, group, sources, lookup_patience(transaction_timeout)),
        topic: topic.to_owned(),
    }
}

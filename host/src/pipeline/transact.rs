//! Acting on a plan exactly once (`guarantee = "exactly-once"`): the batch's outputs, its dead
//! letters and the settled log's record of which source records they settle go into one Kafka
//! transaction, and the records are acknowledged only once it committed. A record delivered
//! again is looked up in the settled log before it is judged (see [`super::settled`]).
//!
//! **A host that lost its locks never commits.** Once every write of the transaction was
//! acknowledged (acks=all), the settled record included, the host checks the time left on each
//! record's lock as it can prove it ([`ShareConsumer::lock_left`], counted from when the
//! acquiring request was sent: a short one aborts at once, with no round trip), and then asks
//! the broker to renew every record's lock and waits for its answer
//! ([`ShareConsumer::confirm_held`]). The broker renews only a record this member still holds,
//! so when it does, no other member has held the record since this host acquired it, and any
//! member that acquires it later does so after the settled record reached the log: that
//! member's lookup waits for a high watermark above it and then for this transaction's
//! decision. Committed (however late), the record is found settled and nothing is written
//! again; aborted (the coordinator's timeout, or this host's next InitProducerId), this host's
//! late commit is refused as fenced. A renewal refused or unanswered (the session ended, also
//! one the broker ended unseen, when a connection is cut on its side only: the broker released
//! the records with it) aborts the transaction, and the batch goes back.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;

use super::act::{BatchContext, Cause, Decision, output_record, release_all};
use super::handle::Pipeline;
use super::settled::{SettledIndex, settled_records};
use crate::kafka::backoff::Backoff;
use crate::kafka::{KafkaClient, ProduceRecord, TransactionalProducer, TxnError};
use crate::runtime::Emit;
use crate::share::consumer::{LOCK_MARGIN, Settle, ShareConsumer, ShareRecord};
use crate::share::ledger::AckKind;
use crate::writes::{
    PartitionBy, WRITE_BACKOFF, WRITE_COMPRESSION, batch_budget, fits_alone, record_bytes,
    record_framing,
};

/// What an exactly-once pipeline's run holds: its transactional producer, the settled log's
/// index, and the batches waiting to commit.
///
/// **Group commit.** A transaction costs the same few round trips whatever it carries
/// (AddPartitionsToTxn, the produces side by side, EndTxn), and a transactional id has one open
/// at a time. So batches do not queue for it one by one: each puts its writes in `pending`, and
/// whichever batch gets `committing` next writes and commits everything pending in one
/// transaction, then tells each batch its outcome.
pub(super) struct ExactlyOnce {
    pub(super) producer: TransactionalProducer,
    pub(super) index: SettledIndex,
    /// The settled log's topic.
    pub(super) topic: String,
    consumer: Arc<ShareConsumer>,
    client: Arc<KafkaClient>,
    pending: parking_lot::Mutex<Vec<Job>>,
    committing: tokio::sync::Mutex<()>,
    /// A commit the coordinator confirmed whose marker the settled log did not show: the
    /// partitions to commit again before the next transaction (see [`ExactlyOnce::in_the_log`]).
    unlanded: parking_lot::Mutex<Option<Unlanded>>,
    /// Each written topic's `max.message.bytes` as last read, and when (see
    /// [`ExactlyOnce::limit`]).
    limits: parking_lot::Mutex<HashMap<String, (Option<usize>, Instant)>>,
    /// The group's lock duration (also the transaction timeout).
    lock: Duration,
    /// What is known of each stint of a source partition (see [`ExactlyOnce::suspects`]).
    stints: parking_lot::Mutex<HashMap<u64, StintMark>>,
}

/// Where a stint of a source partition began (see [`ShareRecord::stint`]).
#[derive(Debug, Clone, Copy)]
struct StintMark {
    /// The partition's end (ListOffsets, which a leader just elected answers only once it has
    /// caught up) read after the stint had begun: a record an earlier stint handed out lies
    /// below it.
    below: i64,
    /// Whether a lookup that began after the stint read the settled log to its end with every
    /// transaction below that decided: what the index holds then answers for the stint's
    /// records, as no transaction written later can settle one of them.
    cleared: bool,
}

/// The most stints remembered per pipeline; the oldest half is forgotten past it (a stint
/// forgotten while its records are still coming is marked again: a lookup more, never less).
const MAX_STINT_MARKS: usize = 4096;

/// Why a batch waits whose locks ran short before its turn at a transaction came.
const SHORT_IN_QUEUE: &str = "a lock ran short while the batch waited for its transaction";

/// How long a topic's `max.message.bytes` is trusted before it is read again (a failed
/// transaction reads every limit again at once).
const LIMIT_TTL: Duration = Duration::from_secs(60);

/// A confirmed commit not seen in the log yet.
#[derive(Debug, Clone)]
struct Unlanded {
    identity: crate::kafka::idempotence::ProducerIdentity,
    /// Where its settled record's batch began.
    offset: i64,
    partitions: Vec<(String, i32)>,
}

/// How long a confirmed commit's marker may take to show in the settled log before the
/// partitions are committed again: the coordinator writes it right after its answer, so
/// anything beyond a few seconds means a broker stopped in between.
const MARKER_PATIENCE: Duration = Duration::from_secs(5);

impl std::fmt::Debug for ExactlyOnce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExactlyOnce")
            .field("producer", &self.producer)
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

/// One batch's share of a transaction.
struct Job {
    writes: Vec<(String, PartitionBy, ProduceRecord)>,
    records: Vec<ShareRecord>,
    /// In a transaction of its own: a job tried again after a failure does not fail the fresh
    /// batches of a group commit with it.
    alone: bool,
    done: tokio::sync::oneshot::Sender<Result<(), NotCommitted>>,
}

/// Why a batch's writes did not commit.
#[derive(Debug, Clone)]
enum NotCommitted {
    /// A lock ran short before the batch's turn: held, renewed and tried again.
    LocksShort,
    /// The commit's answer never came: only a lookup can tell, so the records go back and
    /// their redelivery is looked up.
    Unknown(String),
    /// The broker did not confirm the records are still this member's: aborted, the records go
    /// back (another member may hold them already).
    NotHeld(String),
    /// Failed before the commit: aborted, may be tried again.
    Failed(String),
}

impl ExactlyOnce {
    /// The `max.message.bytes` of `topic` (its own or the broker's; `None` when it cannot be
    /// read). A transaction's refused produce cannot be split and tried again alone, as a
    /// plain write's is: it fails the whole transaction, every batch that joined it, and again
    /// on every try. So a transaction's writes are sized by the limit before they are sent.
    async fn limit(&self, topic: &str) -> Option<usize> {
        if let Some((limit, at)) = self.limits.lock().get(topic)
            && at.elapsed() < LIMIT_TTL
        {
            return *limit;
        }
        let limit = match self.client.topic_config(topic, "max.message.bytes").await {
            Ok(Some(v)) => v.parse::<usize>().ok(),
            Ok(None) | Err(_) => None,
        };
        self.limits
            .lock()
            .insert(topic.to_owned(), (limit, Instant::now()));
        limit
    }

    /// [`ExactlyOnce::limit`] of each of `topics`.
    async fn limits(&self, topics: &[String]) -> HashMap<String, Option<usize>> {
        let mut out = HashMap::new();
        for t in topics {
            if !out.contains_key(t) {
                let limit = self.limit(t).await;
                out.insert(t.clone(), limit);
            }
        }
        out
    }

    /// Runs `work` while renewing the locks of `records` (each renewal confirmed within what
    /// is left of the lock, due when a quarter of it is gone), so that a long wait does not
    /// cost them a delivery; returns its output, and whether every renewal was confirmed (when
    /// one was not, the records can no longer be proven this member's, and the rest of the
    /// work runs on regardless, to its end).
    async fn while_held<T>(
        &self,
        records: &[&ShareRecord],
        work: impl std::future::Future<Output = T>,
    ) -> (T, bool) {
        let renew_below = renew_below(self.lock);
        let keep = async {
            loop {
                let wait = self
                    .lock_left(records.iter().copied())
                    .saturating_sub(renew_below);
                tokio::time::sleep(wait).await;
                let left = self.lock_left(records.iter().copied());
                let renewed = self
                    .consumer
                    .confirm_held(records, left.saturating_sub(LOCK_MARGIN))
                    .await;
                if !matches!(renewed, Ok(true)) {
                    return;
                }
            }
        };
        tokio::pin!(work, keep);
        let mut held = true;
        loop {
            tokio::select! {
                out = &mut work => return (out, held),
                () = &mut keep, if held => held = false,
            }
        }
    }

    /// The time left on the shortest lock of `records` (see [`ShareConsumer::lock_left`]).
    fn lock_left<'a>(&self, records: impl IntoIterator<Item = &'a ShareRecord>) -> Duration {
        records
            .into_iter()
            .map(|r| self.consumer.lock_left(r))
            .min()
            .unwrap_or_default()
    }

    /// Acknowledges nothing of a commit until it is in the log: the coordinator's answer says it
    /// decided, and its COMMIT marker in the settled log says `read_committed` readers, the
    /// lookup among them, will see it. A single-node Kafka 4.4 stopped right after confirming a
    /// commit was seen to come back with the transaction complete in its own log and no marker
    /// in any of its partitions, so that the producer's next marker (an abort) took the records
    /// with it. A marker that does not show within [`MARKER_PATIENCE`] is written again: an
    /// empty transaction over the same partitions, whose COMMIT markers end what was left
    /// open, as the coordinator confirmed. Until that succeeds the batches are not
    /// acknowledged (their records come back and are looked up) and no other transaction
    /// starts.
    async fn in_the_log(&self, u: Unlanded) -> Result<(), NotCommitted> {
        match self
            .producer
            .landed(u.identity, &self.topic, 0, u.offset, MARKER_PATIENCE)
            .await
        {
            Ok(crate::kafka::Landed::Committed) => Ok(()),
            Ok(crate::kafka::Landed::Aborted) => Err(NotCommitted::Failed(
                "the coordinator confirmed the commit, yet the settled log holds an abort marker for it".into(),
            )),
            Ok(crate::kafka::Landed::Open) | Err(_) => {
                tracing::warn!(
                    transactional_id = self.producer.id(),
                    partitions = u.partitions.len(),
                    "a commit the coordinator confirmed is not in the settled log after {MARKER_PATIENCE:?}: its partitions are committed again"
                );
                *self.unlanded.lock() = Some(u);
                self.land_earlier()
                    .await
                    .map_err(|e| NotCommitted::Unknown(format!("a confirmed commit is not in the log yet: {e}")))
            }
        }
    }

    /// Commits again the partitions of a confirmed commit the log did not show (see
    /// [`ExactlyOnce::in_the_log`]), unless its marker has come since.
    async fn land_earlier(&self) -> Result<(), String> {
        let Some(u) = self.unlanded.lock().clone() else {
            return Ok(());
        };
        let landed = self
            .producer
            .landed(u.identity, &self.topic, 0, u.offset, Duration::ZERO)
            .await;
        if !matches!(
            landed,
            Ok(crate::kafka::Landed::Committed | crate::kafka::Landed::Aborted)
        ) {
            self.producer
                .recommit(&u.partitions)
                .await
                .map_err(|e| e.to_string())?;
            match self
                .producer
                .landed(u.identity, &self.topic, 0, u.offset, MARKER_PATIENCE)
                .await
            {
                Ok(crate::kafka::Landed::Committed) => {}
                other => return Err(format!("committed again, and still no marker: {other:?}")),
            }
        }
        *self.unlanded.lock() = None;
        Ok(())
    }

    /// Commits `writes` for `records` in the next transaction, with whatever other batches
    /// have pending by then, unless `alone`.
    async fn commit(
        &self,
        writes: Vec<(String, PartitionBy, ProduceRecord)>,
        records: Vec<ShareRecord>,
        alone: bool,
    ) -> Result<(), NotCommitted> {
        let (done, mut outcome) = tokio::sync::oneshot::channel();
        self.pending.lock().push(Job {
            writes,
            records,
            alone,
            done,
        });
        loop {
            let turn = tokio::select! {
                biased;
                r = &mut outcome => {
                    return r.unwrap_or_else(|_| Err(NotCommitted::Failed("the batch committing it stopped".into())));
                }
                turn = self.committing.lock() => turn,
            };
            let jobs = std::mem::take(&mut *self.pending.lock());
            let (alone, together): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(|j| j.alone);
            if !together.is_empty() {
                self.run(together).await;
            }
            for job in alone {
                self.run(vec![job]).await;
            }
            drop(turn);
        }
    }

    /// One transaction for `jobs`: begin, write everything, check every lock, commit; each job
    /// is told how it ended.
    async fn run(&self, jobs: Vec<Job>) {
        // A batch whose locks are nearly out does not start a transaction (its writes and the
        // confirmation must fit in what is left): it renews them and tries again.
        let (jobs, short): (Vec<Job>, Vec<Job>) = jobs
            .into_iter()
            .partition(|j| self.lock_left(&j.records) > LOCK_MARGIN * 2);
        for j in short {
            let _ = j.done.send(Err(NotCommitted::LocksShort));
        }
        if jobs.is_empty() {
            return;
        }
        let result = self.one_transaction(&jobs).await;
        if result.is_err() {
            // A limit lowered since it was read fails transactions until it is read again.
            self.limits.lock().clear();
        }
        for (i, j) in jobs.into_iter().enumerate() {
            let r = match &result {
                Ok(()) => Ok(()),
                Err((own, e)) => Err(own
                    .iter()
                    .find(|(k, _)| *k == i)
                    .map_or_else(|| e.clone(), |(_, mine)| mine.clone())),
            };
            let _ = j.done.send(r);
        }
    }

    /// The transaction itself; on failure, what some jobs (by index) are told of their own,
    /// and what the others are told.
    #[allow(clippy::type_complexity)]
    async fn one_transaction(
        &self,
        jobs: &[Job],
    ) -> Result<(), (Vec<(usize, NotCommitted)>, NotCommitted)> {
        let failed = |e: String| (Vec::new(), NotCommitted::Failed(e));
        // Each write's partition, as the plain write path places it.
        let mut placed: BTreeMap<(String, i32), Vec<ProduceRecord>> = BTreeMap::new();
        for (topic, by, record) in jobs.iter().flat_map(|j| j.writes.iter()) {
            let n = match self.client.topic(topic) {
                Some(t) if !t.partitions.is_empty() => t.partitions.len(),
                _ => {
                    let _ = self
                        .client
                        .refresh_metadata(std::slice::from_ref(topic))
                        .await;
                    self.client.topic(topic).map_or(0, |t| t.partitions.len())
                }
            };
            if n == 0 {
                return Err(failed(format!(
                    "topic {topic} is not in the cluster's metadata"
                )));
            }
            let p = by.partition(record.key.as_deref(), n);
            placed
                .entry((topic.clone(), p))
                .or_default()
                .push(record.clone());
        }
        // Batches under the byte bound the plain writes keep and the topic's own limit (a
        // record checked to fit alone but not under the budget goes alone).
        let mut batches: Vec<(String, i32, Vec<ProduceRecord>)> = Vec::new();
        for ((topic, partition), records) in placed {
            let budget = batch_budget(self.limit(&topic).await);
            let mut batch: Vec<ProduceRecord> = Vec::new();
            let mut bytes = 0;
            for r in records {
                let size = record_bytes(&r) + record_framing(&r);
                if !batch.is_empty() && bytes + size > budget {
                    batches.push((topic.clone(), partition, std::mem::take(&mut batch)));
                    bytes = 0;
                }
                bytes += size;
                batch.push(r);
            }
            batches.push((topic, partition, batch));
        }
        self.land_earlier()
            .await
            .map_err(|e| failed(format!("an earlier commit is not in the log yet: {e}")))?;
        let mut txn = self
            .producer
            .begin()
            .await
            .map_err(|e| failed(e.to_string()))?;
        if let Err(e) = txn.send_all(&batches, WRITE_COMPRESSION).await {
            // What landed before the failure, and as whom: the next transaction aborts it
            // (`TransactionalProducer::begin`), and a record written twice is traced to these
            // batches.
            tracing::debug!(
                transactional_id = self.producer.id(),
                producer = ?txn.identity(),
                landed = ?txn.written(),
                "writing failed: {}: {e}",
                spans(jobs.iter().flat_map(|j| &j.records))
            );
            return Err(failed(e.to_string()));
        }
        // Every write has landed: the commit goes out only once the broker itself says every
        // record is still this member's (the local clock cannot see a session the broker
        // ended, a connection cut on its side only, after which another member may take the
        // records before this host notices), within what is left of each lock. Each batch is
        // asked on its own, so that one whose records were lost aborts the transaction
        // without sending the others back: they are held and tried again.
        let held = futures::future::join_all(jobs.iter().map(|j| {
            let records: Vec<&ShareRecord> = j.records.iter().collect();
            let wait = self.lock_left(records.iter().copied());
            async move {
                self.consumer
                    .confirm_held(&records, wait.saturating_sub(LOCK_MARGIN))
                    .await
            }
        }))
        .await;
        let lost: Vec<(usize, NotCommitted)> = held
            .into_iter()
            .enumerate()
            .filter_map(|(i, h)| {
                let why = match h {
                    Ok(true) => return None,
                    Ok(false) => "the broker did not confirm, within their locks, that the records are still this host's: aborted".to_owned(),
                    Err(e) => format!("the broker cannot confirm the records are still held: {e}"),
                };
                Some((i, NotCommitted::NotHeld(why)))
            })
            .collect();
        if !lost.is_empty() {
            if let Err(e) = txn.abort().await {
                tracing::debug!(
                    transactional_id = self.producer.id(),
                    "abort after an unconfirmed hold: {e}"
                );
            }
            return Err((
                lost,
                NotCommitted::Failed(
                    "aborted with a batch whose records are no longer this host's".into(),
                ),
            ));
        }
        let identity = txn.identity();
        let settled_at = txn.written_at(&self.topic, 0);
        let partitions = txn.partitions();
        // What each commit settles, for tracing a record written twice to the transaction
        // that wrote it (with `SHAREHOST_LOG=...,sharehost::pipeline::transact=debug`).
        tracing::debug!(transactional_id = self.producer.id(), producer = ?identity, settled_at = ?settled_at, "committing: {}", spans(jobs.iter().flat_map(|j| &j.records)));
        let committed = txn.commit().await;
        if committed.is_ok() {
            tracing::debug!(transactional_id = self.producer.id(), settled_at = ?settled_at, "committed");
        }
        match committed {
            Ok(()) => match settled_at {
                Some(offset) => self
                    .in_the_log(Unlanded {
                        identity,
                        offset,
                        partitions,
                    })
                    .await
                    .map_err(|e| (Vec::new(), e)),
                None => Ok(()),
            },
            Err(e @ TxnError::CommitUnknown { .. }) => {
                Err((Vec::new(), NotCommitted::Unknown(e.to_string())))
            }
            Err(e) => Err(failed(e.to_string())),
        }
    }
}

impl Pipeline {
    /// Looks up the records of `batch` delivered before (delivery count above 1, or a first
    /// delivery an earlier stint of its partition may have handed out: see
    /// [`ExactlyOnce::suspects`]) in the settled log: each one a committed transaction settled
    /// is acknowledged as it was then, without judging or writing; returns the others. Records
    /// whose lookup fails go back to the broker (judging them might write twice), unless
    /// `at_cap`: records at the delivery cap are returned all the same (they are dead-lettered
    /// next, at least once; given back, they would spend the group's last deliveries and be
    /// archived without a dead letter).
    pub(super) async fn settled_earlier(
        &self,
        ctx: &BatchContext,
        eo: &ExactlyOnce,
        batch: Vec<ShareRecord>,
        at_cap: bool,
    ) -> Vec<ShareRecord> {
        let suspects = eo.suspects(&batch).await;
        // First deliveries of a cleared stint are answered by what the index holds; the others
        // (and every record delivered before) are looked up in the log.
        let known: Vec<usize> = suspects
            .iter()
            .filter(|(_, cleared)| *cleared)
            .map(|&(i, _)| i)
            .collect();
        let mut again: Vec<usize> = (0..batch.len())
            .filter(|&i| batch[i].delivery_count > 1)
            .chain(suspects.iter().filter(|(_, c)| !*c).map(|&(i, _)| i))
            .collect();
        again.sort_unstable();
        let keys_of = |indices: &[usize]| -> Vec<(&str, i32, i64)> {
            indices
                .iter()
                .map(|&i| {
                    let r = &batch[i];
                    (&*r.topic, r.partition.partition, r.record.offset)
                })
                .collect()
        };
        let known_found = if known.is_empty() {
            Vec::new()
        } else {
            eo.index.known(&keys_of(&known)).await
        };
        if again.is_empty() && known_found.iter().all(Option::is_none) {
            return batch;
        }
        let keys = keys_of(&again);
        // A lookup waits for every open transaction to be decided, longer than a lock when a
        // broker is down: the records' locks are renewed meanwhile, so that the wait does not
        // cost them a delivery, nor their judging a proof of the hold.
        let asked: Vec<&ShareRecord> = again.iter().map(|&i| &batch[i]).collect();
        let (found, held) = if again.is_empty() {
            (Ok(Vec::new()), true)
        } else {
            eo.while_held(&asked, eo.index.lookup(&ctx.client, &keys))
                .await
        };
        if !held && !at_cap {
            // Their locks could not be renewed: the records are no longer this member's (or
            // cannot be proven to be), and judging them would be for nothing. (At the cap the
            // dead letter is written all the same: at least once.)
            tracing::warn!(pipeline = %self.spec.name, records = again.len(), "records delivered again could not be held through their lookup: they go back unjudged");
            release_all(&ctx.consumer, asked);
            return without(batch, &again);
        }
        let found = match found {
            Ok(found) => {
                // The lookup began after every stint it asked for: their first deliveries
                // are answered by the index from now on.
                eo.cleared(
                    suspects
                        .iter()
                        .filter(|(_, c)| !*c)
                        .map(|&(i, _)| batch[i].stint),
                );
                found
            }
            Err(e) if at_cap => {
                tracing::warn!(pipeline = %self.spec.name, records = again.len(), "records at the delivery cap are dead-lettered without knowing whether a transaction settled them: {e}");
                return batch;
            }
            Err(e) => {
                tracing::warn!(pipeline = %self.spec.name, records = again.len(), "records delivered again go back unjudged: {e}");
                let back: Vec<&ShareRecord> = again.iter().map(|&i| &batch[i]).collect();
                release_all(&ctx.consumer, back);
                return without(batch, &again);
            }
        };
        // The answers of both, in batch order.
        let mut answers: Vec<(usize, Option<AckKind>)> = again
            .iter()
            .copied()
            .zip(found)
            .chain(known.iter().copied().zip(known_found))
            .collect();
        answers.sort_unstable_by_key(|&(i, _)| i);
        let settled: Vec<(usize, AckKind)> = answers
            .into_iter()
            .filter_map(|(i, kind)| Some((i, kind?)))
            .collect();
        tracing::debug!(pipeline = %self.spec.name, settled = settled.len(), "looked up: {}", spans(again.iter().chain(&known).map(|&i| &batch[i])));
        if settled.is_empty() {
            return batch;
        }
        tracing::info!(pipeline = %self.spec.name, records = settled.len(), "records delivered again were settled by a committed transaction: acknowledged as then, not judged or written again");
        // Straight to the engine: the verdicts were counted when they were made. A reject the
        // host dead-lettered goes to a broker that dead-letters rejects itself as done, as it
        // did then.
        let broker_dlq = self.broker_dlq.load(std::sync::atomic::Ordering::Relaxed)
            && self.spec.dead_letter_topic.is_some();
        let decisions: Vec<(&ShareRecord, Settle)> = settled
            .iter()
            .map(|&(i, kind)| {
                let kind = match kind {
                    AckKind::Reject if broker_dlq => AckKind::Accept,
                    other => other,
                };
                (&batch[i], Settle::Final(kind))
            })
            .collect();
        ctx.consumer.settle(&decisions);
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
    /// allow, split by the topics its records write to, so that a topic that refuses writes
    /// holds only the records that owe it one (as a plain pipeline's separate writes do);
    /// what cannot be committed in time goes back to the broker.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn transact<'r>(
        &self,
        ctx: &BatchContext,
        eo: &ExactlyOnce,
        now: Vec<Decision<'r>>,
        producing: Vec<(&'r ShareRecord, Vec<Emit>)>,
        rejects: Vec<(&'r ShareRecord, String)>,
        hash: &str,
        permit: Option<OwnedSemaphorePermit>,
    ) {
        self.settle(&ctx.consumer, &now, hash);
        let parts = self.parts(eo, producing, rejects, hash).await;
        // The batch waits for its commit without its permit: the batches judged meanwhile join
        // the next transaction (the engine's in-flight bound holds them all the same).
        drop(permit);
        // A part with a write its topic cannot take now is never sent (see `Part::attempt`):
        // it waits on its own from the start.
        let mut fit: Vec<&Part<'r>> = Vec::new();
        // Each with why it waits, and whether that was a failed transaction (counted).
        let mut waiting: Vec<(&Part<'r>, String, bool)> = Vec::new();
        let mut writes = Vec::new();
        for part in &parts {
            match part.attempt(eo).await {
                Ok(w) => {
                    writes.extend(w);
                    fit.push(part);
                }
                Err(why) => waiting.push((part, why, true)),
            }
        }
        if !fit.is_empty() {
            let records = eo.settled_writes(&fit, &mut writes);
            // A batch judged late in its locks (a backlog, a busy machine) would not be let
            // into a transaction (it needs more than two margins left): it renews them first,
            // and a confirmed renewal restarts them. Refused, the records are no longer this
            // member's, and go back now.
            let left = eo.lock_left(&records);
            if left <= LOCK_MARGIN * 2 + LOCK_MARGIN / 2 {
                let held: Vec<&ShareRecord> = records.iter().collect();
                let renewed = ctx
                    .consumer
                    .confirm_held(&held, left.saturating_sub(LOCK_MARGIN))
                    .await;
                if !matches!(renewed, Ok(true)) {
                    let why = format!(
                        "a batch judged late in its locks could not have them renewed (too little left to ask, or the broker refused): {renewed:?}"
                    );
                    for part in parts.iter() {
                        self.settle_part(ctx, part, Err(why.clone()), hash);
                    }
                    return;
                }
            }
            match eo.commit(writes, records, false).await {
                Ok(()) => {
                    // The usual batch: acknowledged in one crossing.
                    let mut all = Vec::new();
                    for part in &fit {
                        self.count_committed(part, hash);
                        all.extend(
                            part.decisions
                                .iter()
                                .map(|d| Decision::new(d.record, d.settle, d.cause)),
                        );
                    }
                    self.settle(&ctx.consumer, &all, hash);
                }
                Err(NotCommitted::Failed(e)) => {
                    waiting.extend(fit.iter().map(|p| (*p, e.clone(), true)));
                }
                // Its turn came late (transactions queued ahead of it, a write outage's retries
                // among them): held and tried again, its locks renewed first.
                Err(NotCommitted::LocksShort) => {
                    waiting.extend(fit.iter().map(|p| (*p, SHORT_IN_QUEUE.to_owned(), false)));
                }
                Err(NotCommitted::Unknown(why) | NotCommitted::NotHeld(why)) => {
                    for part in parts.iter() {
                        self.settle_part(ctx, part, Err(why.clone()), hash);
                    }
                    return;
                }
            }
        }
        if waiting.is_empty() {
            return;
        }
        let labels = vec![("pipeline", self.spec.name.clone())];
        self.counters
            .writes
            .waiting
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.metrics.writes_waiting.get_or_create(&labels).inc();
        // Each part settles as soon as its own transaction ends.
        let tries = waiting.into_iter().map(|(part, e, failed)| async move {
            if failed {
                self.count_failed_transaction(eo, &e);
            }
            let outcome = self.commit_held(ctx, eo, part, e).await;
            self.settle_part(ctx, part, outcome, hash);
        });
        futures::future::join_all(tries).await;
        self.counters
            .writes
            .waiting
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.metrics.writes_waiting.get_or_create(&labels).dec();
    }

    /// A batch's records grouped by the topics they write to, each with what it writes and how
    /// it is settled once that committed. An output its topic cannot take even alone rejects
    /// its record now, as a plain pipeline's does once the broker refused it (see
    /// `ExactlyOnce::limit`).
    async fn parts<'r>(
        &self,
        eo: &ExactlyOnce,
        producing: Vec<(&'r ShareRecord, Vec<Emit>)>,
        rejects: Vec<(&'r ShareRecord, String)>,
        hash: &str,
    ) -> Vec<Part<'r>> {
        let (plugin, signer) = self.identity(hash);
        let outputs: Vec<String> = self.spec.outputs.values().cloned().collect();
        let limits = eo.limits(&outputs).await;
        let mut parts: BTreeMap<Vec<String>, Part<'r>> = BTreeMap::new();
        let mut rejects = rejects;
        let mut unwritable = 0u64;
        'records: for (r, emits) in &producing {
            let mut mine = Vec::with_capacity(emits.len());
            for e in emits {
                if let Some(topic) = self.spec.outputs.get(&*e.output) {
                    let record = output_record(r, e);
                    let limit = limits.get(topic).copied().flatten();
                    if let Some(limit) = limit.filter(|&l| !fits_alone(&record, l)) {
                        let why = format!(
                            "output not writable: a record larger than topic {topic} accepts (max.message.bytes {limit})"
                        );
                        tracing::error!(pipeline = %self.spec.name, topic = %r.topic, partition = r.partition.partition, offset = r.record.offset, "an output of an accepted record can never be written; the record is rejected: {why}");
                        unwritable += emits.len() as u64;
                        rejects.push((r, why));
                        continue 'records;
                    }
                    mine.push(PartWrite {
                        topic: topic.clone(),
                        by: PartitionBy::KeyOrSource(r.partition.partition),
                        record,
                        smaller: None,
                    });
                }
            }
            let emitted = mine.len() as u64;
            Part::add(
                &mut parts,
                Decision::new(r, Settle::Final(AckKind::Accept), Cause::Verdict),
                mine,
            )
            .emitted += emitted;
        }
        if unwritable > 0 {
            self.counters.count_emits(hash, "failed", unwritable);
        }
        for (r, reason) in rejects {
            let Some(dlq) = &self.spec.dead_letter_topic else {
                Part::add(
                    &mut parts,
                    Decision::new(r, Settle::Final(AckKind::Reject), Cause::Verdict),
                    Vec::new(),
                );
                continue;
            };
            let write = PartWrite {
                topic: dlq.clone(),
                by: PartitionBy::Source(r.partition.partition),
                record: self.dead_letter(r, &reason, &plugin, hash, signer.as_deref(), true),
                smaller: Some(self.dead_letter(
                    r,
                    &reason,
                    &plugin,
                    hash,
                    signer.as_deref(),
                    false,
                )),
            };
            Part::add(
                &mut parts,
                Decision::new(r, Settle::Final(AckKind::Reject), Cause::DeadLettered),
                vec![write],
            )
            .dead_lettered += 1;
        }
        parts.into_values().collect()
    }

    /// Counts a failed transaction of the pipeline's, as a failed write.
    fn count_failed_transaction(&self, eo: &ExactlyOnce, e: &str) {
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
        tracing::warn!(pipeline = %self.spec.name, "a transaction failed and is tried again while its records' locks allow: {e}");
    }

    /// Tries `part`'s transaction again, alone, after its first try failed with `error`:
    /// with backoff, holding its records through the outage (a renewal the broker confirms
    /// restarts their locks, and proves no other member took them meanwhile), until it commits,
    /// the locks cannot be held, or the pipeline stops.
    async fn commit_held(
        &self,
        ctx: &BatchContext,
        eo: &ExactlyOnce,
        part: &Part<'_>,
        error: String,
    ) -> Result<(), String> {
        let records: Vec<&ShareRecord> = part.decisions.iter().map(|d| d.record).collect();
        let lock_left = || {
            records
                .iter()
                .map(|r| ctx.consumer.lock_left(r))
                .min()
                .unwrap_or_default()
        };
        let renew_below = renew_below(eo.lock);
        let mut backoff = Backoff::new(WRITE_BACKOFF);
        let mut e = error;
        loop {
            let mut pause = backoff.next_delay().unwrap_or(WRITE_BACKOFF.max);
            let left = lock_left();
            if left <= pause + renew_below {
                let renewed = ctx
                    .consumer
                    .confirm_held(&records, left.saturating_sub(LOCK_MARGIN))
                    .await;
                if !matches!(renewed, Ok(true)) {
                    return Err(format!(
                        "the records' locks could not be renewed in time (the broker refused, or did not answer within them: {renewed:?}): {e}"
                    ));
                }
                // The next renewal is due when the lock is down to `renew_below` again.
                pause = pause.min(lock_left().saturating_sub(renew_below));
            }
            tokio::select! {
                _ = ctx.stop.cancelled() => return Err(format!("the pipeline stops: {e}")),
                _ = tokio::time::sleep(pause) => {}
            }
            let mut writes = match part.attempt(eo).await {
                Ok(writes) => writes,
                Err(why) => {
                    self.count_failed_transaction(eo, &why);
                    e = why;
                    continue;
                }
            };
            let owned = eo.settled_writes(&[part], &mut writes);
            match eo.commit(writes, owned, true).await {
                Ok(()) => return Ok(()),
                Err(NotCommitted::Failed(again)) => {
                    self.count_failed_transaction(eo, &again);
                    e = again;
                }
                // Renewed at the top of the loop, if there is still time to ask.
                Err(NotCommitted::LocksShort) => e = SHORT_IN_QUEUE.to_owned(),
                Err(NotCommitted::Unknown(e) | NotCommitted::NotHeld(e)) => return Err(e),
            }
        }
    }

    /// Counts what `part`'s committed transaction wrote.
    fn count_committed(&self, part: &Part<'_>, hash: &str) {
        if part.emitted > 0 {
            self.counters.count_emits(hash, "produced", part.emitted);
        }
        let shrunk = part.shrunk.load(std::sync::atomic::Ordering::Relaxed);
        if shrunk > 0
            && let Some(dlq) = &self.spec.dead_letter_topic
        {
            self.count_shrunk(dlq, shrunk);
        }
        if part.dead_lettered > 0 {
            self.counters
                .dead_lettered
                .fetch_add(part.dead_lettered, std::sync::atomic::Ordering::Relaxed);
            self.metrics
                .dead_lettered
                .get_or_create(&self.counters.labels(hash))
                .inc_by(part.dead_lettered);
        }
    }

    /// Acknowledges `part`'s records once its transaction committed (counting what it wrote),
    /// or gives them back to the broker (a record delivered again is looked up first).
    fn settle_part(
        &self,
        ctx: &BatchContext,
        part: &Part<'_>,
        outcome: Result<(), String>,
        hash: &str,
    ) {
        match outcome {
            Ok(()) => {
                self.count_committed(part, hash);
                self.settle(&ctx.consumer, &part.decisions, hash);
            }
            Err(why) => {
                tracing::warn!(pipeline = %self.spec.name, records = part.decisions.len(), "a transaction did not commit; its records go back to the broker (a record delivered again is looked up in the settled log first): {why}");
                if part.emitted > 0 {
                    self.counters.count_emits(hash, "failed", part.emitted);
                }
                let back: Vec<Decision<'_>> = part
                    .decisions
                    .iter()
                    .map(|d| {
                        Decision::new(d.record, Settle::Final(AckKind::Release), Cause::Unwritten)
                    })
                    .collect();
                self.settle(&ctx.consumer, &back, hash);
            }
        }
    }
}

/// One write of a part: the record, and a smaller form to write instead when the topic takes
/// only that (a dead letter without the record's key, value and headers).
struct PartWrite {
    topic: String,
    by: PartitionBy,
    record: ProduceRecord,
    smaller: Option<ProduceRecord>,
}

/// A write as a transaction sends it: topic, how its partition is chosen, the record.
type TxnWrite = (String, PartitionBy, ProduceRecord);

/// Records of a batch that write to the same topics: what they write, how they are settled,
/// and what to count once that committed.
#[derive(Default)]
struct Part<'r> {
    decisions: Vec<Decision<'r>>,
    writes: Vec<PartWrite>,
    emitted: u64,
    dead_lettered: u64,
    /// Dead letters its last attempt wrote in their smaller form.
    shrunk: std::sync::atomic::AtomicU64,
}

impl<'r> Part<'r> {
    /// Adds a record's `decision` and `writes` to the part of the topics it writes to.
    fn add<'p>(
        parts: &'p mut BTreeMap<Vec<String>, Part<'r>>,
        decision: Decision<'r>,
        writes: Vec<PartWrite>,
    ) -> &'p mut Part<'r> {
        let mut topics: Vec<String> = writes.iter().map(|w| w.topic.clone()).collect();
        topics.sort();
        topics.dedup();
        let part = parts.entry(topics).or_default();
        part.decisions.push(decision);
        part.writes.extend(writes);
        part
    }

    /// What an attempt to commit the part writes, each write in the form its topic takes by its
    /// limit now; an error when a topic takes neither form. Never sent then: a transaction
    /// holding a write its topic refuses cannot commit, and the coordinator cannot end it either
    /// while the topic refuses its abort marker too (a limit below a control batch), which
    /// blocks every later transaction of the id until the limit is lifted.
    async fn attempt(&self, eo: &ExactlyOnce) -> Result<Vec<TxnWrite>, String> {
        let mut out = Vec::with_capacity(self.writes.len());
        let mut shrunk = 0;
        for w in &self.writes {
            let Some(limit) = eo.limit(&w.topic).await else {
                out.push((w.topic.clone(), w.by, w.record.clone()));
                continue;
            };
            if fits_alone(&w.record, limit) {
                out.push((w.topic.clone(), w.by, w.record.clone()));
            } else if let Some(smaller) = w.smaller.as_ref().filter(|s| fits_alone(s, limit)) {
                shrunk += 1;
                out.push((w.topic.clone(), w.by, smaller.clone()));
            } else {
                // Read again before the next try: the limit may be lifted meanwhile.
                eo.limits.lock().remove(&w.topic);
                return Err(format!(
                    "topic {} takes no record this large now (max.message.bytes {limit}): the write waits",
                    w.topic
                ));
            }
        }
        self.shrunk
            .store(shrunk, std::sync::atomic::Ordering::Relaxed);
        Ok(out)
    }
}

impl ExactlyOnce {
    /// The records of `batch` delivered for the first time (delivery count 1) that an earlier
    /// stint of their partition may have handed out, and so a transaction may have settled:
    /// their indices, each with whether its stint is cleared (see [`StintMark`]).
    ///
    /// The broker persists no acquisition: a share partition rebuilt on a new leader (or after
    /// it was fenced) starts from the persisted state, and a record a member held unacknowledged
    /// then comes again with delivery count 1. Such a record was acquired below the partition's
    /// end before the stint began, and the transaction that settled it wrote its settled record
    /// before the broker confirmed the hold (the order of [`ExactlyOnce::commit`]), so before
    /// the stint too. A record at or above the stint's mark was never handed out before.
    async fn suspects(&self, batch: &[ShareRecord]) -> Vec<(usize, bool)> {
        let firsts = || {
            batch
                .iter()
                .enumerate()
                .filter(|(_, r)| r.delivery_count <= 1)
        };
        let new: Vec<(u64, &str, i32)> = {
            let marks = self.stints.lock();
            let mut new: Vec<(u64, &str, i32)> = Vec::new();
            for (_, r) in firsts() {
                if !marks.contains_key(&r.stint) && !new.iter().any(|n| n.0 == r.stint) {
                    new.push((r.stint, &r.topic, r.partition.partition));
                }
            }
            new
        };
        // A stint whose mark cannot be read now has every first delivery of the batch looked
        // up (it stays unmarked); the next batch tries again.
        for (stint, topic, partition) in new {
            match self
                .client
                .list_offset(topic, partition, crate::kafka::OffsetSpec::Latest)
                .await
            {
                Ok(end) => {
                    let mut marks = self.stints.lock();
                    if marks.len() >= MAX_STINT_MARKS {
                        let mut stints: Vec<u64> = marks.keys().copied().collect();
                        stints.sort_unstable();
                        let keep_from = stints[stints.len() / 2];
                        marks.retain(|&s, _| s >= keep_from);
                    }
                    marks.entry(stint).or_insert(StintMark {
                        below: end,
                        cleared: false,
                    });
                }
                Err(e) => {
                    tracing::debug!(
                        topic,
                        partition,
                        "the end of a source partition could not be read for a new stint; its first deliveries are looked up: {e}"
                    );
                }
            }
        }
        let marks = self.stints.lock();
        firsts()
            .filter_map(|(i, r)| match marks.get(&r.stint) {
                Some(m) => (r.record.offset < m.below).then_some((i, m.cleared)),
                None => Some((i, false)),
            })
            .collect()
    }

    /// Marks `stints` cleared: a lookup that began after each of them has answered.
    fn cleared(&self, stints: impl IntoIterator<Item = u64>) {
        let mut marks = self.stints.lock();
        for s in stints {
            if let Some(m) = marks.get_mut(&s) {
                m.cleared = true;
            }
        }
    }

    /// Adds to `writes` the settled log's record of every record `parts` settle, and returns
    /// the records the transaction must hold.
    fn settled_writes(&self, parts: &[&Part<'_>], writes: &mut Vec<TxnWrite>) -> Vec<ShareRecord> {
        let decisions = parts.iter().flat_map(|p| p.decisions.iter());
        let settles: Vec<(&str, i32, i64, AckKind)> = decisions
            .clone()
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
            writes.push((self.topic.clone(), PartitionBy::Source(0), s.produce()));
        }
        decisions.map(|d| d.record.clone()).collect()
    }
}

/// `batch` without the records at `gone` (indices, ascending).
fn without(mut batch: Vec<ShareRecord>, gone: &[usize]) -> Vec<ShareRecord> {
    let mut i = 0;
    batch.retain(|_| {
        i += 1;
        gone.binary_search(&(i - 1)).is_err()
    });
    batch
}

/// `records` as their exact offsets per partition, in runs, with their delivery counts, for
/// the log: "topic:partition:a-b,c,d-e(deliveries lo-hi)". Exact, so that two commits that
/// settled the same record can be told from two whose first and last offsets merely interleave.
fn spans<'a>(records: impl IntoIterator<Item = &'a ShareRecord>) -> String {
    offset_runs(records.into_iter().map(|r| {
        (
            &*r.topic,
            r.partition.partition,
            r.record.offset,
            r.delivery_count,
        )
    }))
}

/// [`spans`] of (topic, partition, offset, delivery count).
fn offset_runs<'a>(records: impl IntoIterator<Item = (&'a str, i32, i64, i16)>) -> String {
    let mut by: BTreeMap<(&str, i32), (Vec<i64>, i16, i16)> = BTreeMap::new();
    for (topic, partition, o, d) in records {
        let e = by.entry((topic, partition)).or_insert((Vec::new(), d, d));
        e.0.push(o);
        (e.1, e.2) = (e.1.min(d), e.2.max(d));
    }
    by.into_iter()
        .map(|((t, p), (mut offsets, lo, hi))| {
            offsets.sort_unstable();
            // An offset twice in one commit (two batches holding one record) is named: its
            // writes would be in the transaction twice.
            let mut twice: Vec<i64> = offsets
                .windows(2)
                .filter(|w| w[0] == w[1])
                .map(|w| w[0])
                .collect();
            twice.dedup();
            offsets.dedup();
            let mut runs: Vec<(i64, i64)> = Vec::new();
            for o in offsets {
                match runs.last_mut() {
                    Some(run) if run.1 + 1 == o => run.1 = o,
                    _ => runs.push((o, o)),
                }
            }
            let runs: Vec<String> = runs
                .into_iter()
                .map(|(a, b)| {
                    if a == b {
                        a.to_string()
                    } else {
                        format!("{a}-{b}")
                    }
                })
                .collect();
            let twice = if twice.is_empty() {
                String::new()
            } else {
                let twice: Vec<String> = twice.iter().map(i64::to_string).collect();
                format!("; twice {}", twice.join(","))
            };
            format!("{t}:{p}:{}(deliveries {lo}-{hi}{twice})", runs.join(","))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// When a record held through a wait is renewed: once its lock is down to this. Early, at a
/// quarter of the lock gone, so that the broker's answer has most of the lock to come in (a
/// renewal proves the hold only when answered within it): a busy broker or machine that
/// answers in seconds does not cost the records a delivery.
fn renew_below(lock: Duration) -> Duration {
    (lock * 3 / 4).max(LOCK_MARGIN * 2)
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
    client: &Arc<KafkaClient>,
    consumer: &Arc<ShareConsumer>,
    group: &str,
    sources: &[String],
    member: &str,
    topic: &str,
    transaction_timeout: Duration,
) -> ExactlyOnce {
    ExactlyOnce {
        consumer: consumer.clone(),
        client: client.clone(),
        pending: parking_lot::Mutex::new(Vec::new()),
        committing: tokio::sync::Mutex::new(()),
        unlanded: parking_lot::Mutex::new(None),
        limits: parking_lot::Mutex::new(HashMap::new()),
        producer: TransactionalProducer::new(
            client.clone(),
            &transactional_id(group, member),
            transaction_timeout,
        ),
        index: SettledIndex::new(topic, group, sources, lookup_patience(transaction_timeout)),
        topic: topic.to_owned(),
        lock: transaction_timeout,
        stints: parking_lot::Mutex::new(HashMap::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::offset_runs;

    #[test]
    fn the_log_names_each_commits_exact_offsets_in_runs() {
        let records = [
            ("t", 1, 7, 1),
            ("t", 0, 12, 2),
            ("t", 0, 10, 1),
            ("t", 0, 11, 1),
            ("t", 0, 14, 3),
            ("t", 0, 11, 1),
        ];
        assert_eq!(
            offset_runs(records),
            "t:0:10-12,14(deliveries 1-3; twice 11) t:1:7(deliveries 1-1)"
        );
        assert_eq!(offset_runs([]), "");
    }
}

//! A transactional producer: records written to many partitions become visible to
//! `read_committed` readers together, or not at all.
//!
//! The protocol, as Kafka's own producer speaks it with a coordinator on either transaction
//! version (the explicit form: the client adds each partition before its first batch):
//!
//! 1. FindCoordinator (key type TRANSACTION) for the transactional id, then InitProducerId with
//!    it. The coordinator aborts whatever transaction the id's previous holder left open and
//!    bumps the epoch, so that holder is fenced: none of its requests is accepted any more.
//! 2. Per transaction: AddPartitionsToTxn for each partition before its first batch; Produce
//!    with the transactional flag and the id's sequence numbers; EndTxn to commit or abort. The
//!    coordinator writes the markers that make the batches visible (or drop them).
//!
//! A transaction whose outcome a failure leaves unknown is aborted, and the next one starts
//! from a new InitProducerId (a new epoch: every partition's sequence starts again), which is
//! also what Kafka's producer does after an abortable error. Before it writes anything, the next
//! transaction also ends the failed one in every partition it wrote to (an empty transaction
//! over them, aborted): a partition leader ends whatever a producer has open there at the next
//! marker for that producer, whichever transaction the marker is for, so records of a failed
//! transaction that the coordinator's abort did not reach would otherwise be committed by the
//! producer's next commit there.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, ApiKey, EndTxnRequest, InitProducerIdRequest, ProducerId, TopicName,
    TransactionalId,
};
use kafka_protocol::protocol::{StrBytes, VersionRange};
use tokio::time::Instant;

use crate::backoff::{Backoff, BackoffConfig};
use crate::client::KafkaClient;
use crate::error::{ErrorClass, KafkaError};
use crate::idempotence::{PartitionSequence, Plan, ProducerIdentity};
use crate::records::{Compression, ProduceRecord, RecordsError, encode_transactional_batch};

/// InitProducerId: every version takes a transactional id.
const INIT_VERSIONS: VersionRange = VersionRange { min: 0, max: 5 };
/// AddPartitionsToTxn as a client sends it (v4 and up are the brokers' own form).
const ADD_VERSIONS: VersionRange = VersionRange { min: 0, max: 3 };
/// EndTxn up to v4: v5 belongs to transaction version 2, where every commit bumps the epoch.
const END_VERSIONS: VersionRange = VersionRange { min: 0, max: 4 };
/// How long the partitions of a transaction that did not commit are searched for its abort
/// marker (for the log only: they are ended either way).
const UNENDED_PATIENCE: Duration = Duration::from_millis(500);

/// What can go wrong with a transaction.
#[derive(Debug, thiserror::Error)]
pub enum TxnError {
    /// Another producer took the transactional id (a newer epoch), or the coordinator ended
    /// this transaction itself (it ran past its timeout): nothing of it commits, and this
    /// producer must start again with a new InitProducerId.
    #[error("transactional id {id}: fenced or ended by the coordinator: {source}")]
    Fenced {
        /// The transactional id.
        id: String,
        /// What the coordinator or a partition leader said.
        source: KafkaError,
    },
    /// A request failed; the transaction is not committed (and is aborted, or will be by the
    /// coordinator's timeout).
    #[error("transactional id {id}: {source}")]
    Kafka {
        /// The transactional id.
        id: String,
        /// The failure.
        source: KafkaError,
    },
    /// A batch could not be encoded.
    #[error("transactional id {id}: {source}")]
    Encode {
        /// The transactional id.
        id: String,
        /// Why.
        source: RecordsError,
    },
    /// The commit was sent but its answer never came: the transaction may be committed or
    /// not. A reader finds out once the coordinator decided (the last stable offset moves past
    /// it).
    #[error("transactional id {id}: the commit's outcome is unknown: {source}")]
    CommitUnknown {
        /// The transactional id.
        id: String,
        /// The last failure.
        source: KafkaError,
    },
}

/// Whether an error means this producer's epoch is no longer the id's (or its transaction was
/// ended for it).
fn fenced(e: &KafkaError) -> bool {
    matches!(
        e.code(),
        Some(
            ResponseError::ProducerFenced
                | ResponseError::InvalidProducerEpoch
                | ResponseError::InvalidTxnState
                | ResponseError::TransactionalIdAuthorizationFailed
                | ResponseError::InvalidProducerIdMapping
        )
    )
}

/// A producer with a transactional id; one transaction at a time (a caller's transactions
/// queue on [`TransactionalProducer::begin`]).
pub struct TransactionalProducer {
    client: Arc<KafkaClient>,
    id: String,
    timeout: Duration,
    state: tokio::sync::Mutex<State>,
}

impl std::fmt::Debug for TransactionalProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionalProducer")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    /// The id and epoch InitProducerId gave; `None` until the first transaction, and again
    /// after one failed (the next InitProducerId bumps the epoch).
    identity: Option<ProducerIdentity>,
    coordinator: Option<i32>,
    sequences: HashMap<(String, i32), PartitionSequence>,
    /// The partitions of transactions that did not commit, each with where the last of their
    /// batches there began (when one landed): the next transaction aborts them first.
    unended: BTreeMap<(String, i32), Option<i64>>,
    /// The producer id those transactions wrote as.
    unended_by: Option<i64>,
}

/// One open transaction; ends with [`Transaction::commit`] or [`Transaction::abort`]. Dropped
/// without either, it is left to the next [`TransactionalProducer::begin`], which starts over
/// with a new epoch (the coordinator aborts what was left open).
pub struct Transaction<'a> {
    producer: &'a TransactionalProducer,
    state: tokio::sync::MutexGuard<'a, State>,
    identity: ProducerIdentity,
    added: BTreeSet<(String, i32)>,
    /// Per partition, the base offset of the last batch written (for [`TransactionalProducer::landed`]).
    written: BTreeMap<(String, i32), i64>,
    ended: bool,
    /// Whether its partitions are ended by the next transaction when it fails (not for
    /// [`TransactionalProducer::recommit`], whose partitions hold a confirmed commit).
    end_on_failure: bool,
}

/// How a committed transaction shows in a partition's log ([`TransactionalProducer::landed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Landed {
    /// Its COMMIT marker is there: `read_committed` readers see what it wrote.
    Committed,
    /// An ABORT marker ended it instead.
    Aborted,
    /// No marker of this producer after its records yet.
    Open,
}

impl TransactionalProducer {
    /// A producer for `transactional_id`; `timeout` is the transaction timeout the coordinator
    /// enforces (it aborts a transaction open longer, and fences its producer).
    pub fn new(
        client: Arc<KafkaClient>,
        transactional_id: &str,
        timeout: Duration,
    ) -> TransactionalProducer {
        TransactionalProducer {
            client,
            id: transactional_id.to_owned(),
            timeout,
            state: tokio::sync::Mutex::new(State::default()),
        }
    }

    /// The transactional id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Starts a transaction once the one before it has ended; the first (and the first after a
    /// failure) asks the coordinator for the id's producer id and epoch first, fencing any
    /// earlier holder of the id and aborting what it left open.
    pub async fn begin(&self) -> Result<Transaction<'_>, TxnError> {
        self.open(true).await
    }

    /// A new transaction; `end_on_failure`: see [`Transaction::forget`]. The partitions of
    /// transactions that did not commit are ended first, unless this one is a
    /// [`TransactionalProducer::recommit`].
    async fn open(&self, end_on_failure: bool) -> Result<Transaction<'_>, TxnError> {
        let mut state = self.state.lock().await;
        let identity = self.identity(&mut state).await?;
        if end_on_failure && !state.unended.is_empty() {
            self.end_unended(&mut state, identity).await?;
        }
        Ok(Transaction {
            producer: self,
            state,
            identity,
            added: BTreeSet::new(),
            written: BTreeMap::new(),
            ended: false,
            end_on_failure,
        })
    }

    /// The id and epoch to write as: InitProducerId's answer, asked for when there is none.
    async fn identity(&self, state: &mut State) -> Result<ProducerIdentity, TxnError> {
        match state.identity {
            Some(i) => Ok(i),
            None => {
                let i = self.init(state).await?;
                state.identity = Some(i);
                state.sequences.clear();
                Ok(i)
            }
        }
    }

    /// Aborts an empty transaction over the partitions of transactions that did not commit.
    /// The InitProducerId before it had the coordinator abort what it knew of them; a partition
    /// the coordinator did not know as theirs (its records landed all the same) would keep them
    /// open, and this producer's next COMMIT marker there would commit them. Its ABORT markers
    /// end them in every partition. A partition found still open first is logged.
    async fn end_unended(
        &self,
        state: &mut State,
        identity: ProducerIdentity,
    ) -> Result<(), TxnError> {
        if let Some(by) = state.unended_by {
            // Read after the InitProducerId, which answers once the coordinator's abort is
            // complete: a partition with no marker after the transaction's records then is one
            // the coordinator did not abort.
            let writer = ProducerIdentity {
                id: by,
                epoch: identity.epoch,
            };
            let checks = state
                .unended
                .iter()
                .filter_map(|((topic, partition), at)| Some((topic, *partition, (*at)?)))
                .map(|(topic, partition, offset)| async move {
                    let landed = self
                        .landed(writer, topic, partition, offset, UNENDED_PATIENCE)
                        .await;
                    matches!(landed, Ok(Landed::Open))
                        .then(|| format!("{topic}-{partition} from offset {offset}"))
                });
            let open: Vec<String> = futures::future::join_all(checks)
                .await
                .into_iter()
                .flatten()
                .collect();
            if !open.is_empty() {
                tracing::warn!(
                    transactional_id = %self.id,
                    "a transaction that did not commit had no marker after its records once the coordinator aborted it, in {}: ended now",
                    open.join(", ")
                );
            }
        }
        let partitions: Vec<(String, i32)> = state.unended.keys().cloned().collect();
        let ended = match self.add_partitions(state, identity, &partitions).await {
            Ok(()) => self.end_txn(state, identity, false).await,
            // A partition of a topic since deleted (nothing of it can be committed any more):
            // none was added, so no transaction is open.
            Err(TxnError::Kafka { source, .. })
                if source.code() == Some(ResponseError::UnknownTopicOrPartition) =>
            {
                tracing::warn!(transactional_id = %self.id, "the partitions of a transaction that did not commit are not all known any more: {source}");
                Ok(())
            }
            Err(e) => Err(e),
        };
        if let Err(e) = ended {
            // Whatever this left open, the next InitProducerId aborts, and the next try ends
            // the same partitions again.
            state.identity = None;
            state.sequences.clear();
            return Err(e);
        }
        state.unended.clear();
        state.unended_by = None;
        Ok(())
    }

    /// Looks, until `patience` has passed, for the marker that ended this producer's
    /// transaction (as `identity`) whose last batch in `topic`'s `partition` begins at `offset`.
    /// A commit the coordinator confirmed is normally there within milliseconds; until the
    /// coordinator has written it, a `read_committed` reader sees nothing of the transaction
    /// (and a broker that lost it, as a single-node Kafka 4.4 was seen to on a controlled
    /// shutdown, leaves the records to the producer's next marker: see
    /// [`TransactionalProducer::recommit`]).
    pub async fn landed(
        &self,
        identity: ProducerIdentity,
        topic: &str,
        partition: i32,
        offset: i64,
        patience: Duration,
    ) -> Result<Landed, TxnError> {
        let deadline = Instant::now() + patience;
        let mut backoff = Backoff::with_deadline(
            BackoffConfig {
                initial: Duration::from_millis(2),
                max: Duration::from_millis(200),
                factor: 2.0,
            },
            deadline,
        );
        let mut from = offset;
        loop {
            match self
                .client
                .transaction_end(topic, partition, from, identity.id, offset)
                .await
            {
                Ok((Some(m), _)) => {
                    return Ok(if m.commit {
                        Landed::Committed
                    } else {
                        Landed::Aborted
                    });
                }
                Ok((None, next)) => {
                    if next > from {
                        from = next;
                        continue;
                    }
                }
                Err(e) if e.class() == ErrorClass::Fatal => return Err(self.kafka(e)),
                Err(_) => {}
            }
            if !backoff.wait().await {
                return Ok(Landed::Open);
            }
        }
    }

    /// Commits an empty transaction over `partitions`: the coordinator writes a COMMIT marker
    /// to each, which ends what this producer left there without a marker. For a transaction the
    /// coordinator confirmed committed whose markers the log does not hold: its records become
    /// committed, as confirmed.
    pub async fn recommit(&self, partitions: &[(String, i32)]) -> Result<(), TxnError> {
        let mut txn = self.open(false).await?;
        txn.add(partitions).await?;
        txn.commit().await
    }

    fn kafka(&self, source: KafkaError) -> TxnError {
        if fenced(&source) {
            TxnError::Fenced {
                id: self.id.clone(),
                source,
            }
        } else {
            TxnError::Kafka {
                id: self.id.clone(),
                source,
            }
        }
    }

    /// Sends `op` to the id's coordinator until it succeeds, fails for good or the request
    /// timeout passes; a moved or loading coordinator is found again, a busy one (still ending
    /// the transaction before) asked again.
    async fn to_coordinator<T, F, Fut>(&self, state: &mut State, mut op: F) -> Result<T, TxnError>
    where
        F: FnMut(Arc<crate::BrokerConnection>) -> Fut,
        Fut: std::future::Future<Output = Result<T, KafkaError>>,
    {
        let client = &self.client;
        let deadline = Instant::now() + client.config().request_timeout;
        let mut backoff = Backoff::with_deadline(BackoffConfig::default(), deadline);
        loop {
            let coordinator = match state.coordinator {
                Some(c) => c,
                None => match client.find_transaction_coordinator(&self.id).await {
                    Ok(c) => {
                        state.coordinator = Some(c);
                        c
                    }
                    Err(e) if e.class() != ErrorClass::Fatal && backoff.wait().await => continue,
                    Err(e) => return Err(self.kafka(e)),
                },
            };
            let result = match client.connection(coordinator).await {
                Ok(conn) => op(conn).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(v) => return Ok(v),
                Err(e) if fenced(&e) => return Err(self.kafka(e)),
                // About a partition (a topic deleted), not the coordinator: asking again for the
                // rest of the request timeout would outlast the caller's record locks, and the
                // caller tries the whole transaction again on its own terms.
                Err(e) if e.code() == Some(ResponseError::UnknownTopicOrPartition) => {
                    return Err(self.kafka(e));
                }
                Err(e) if e.class() != ErrorClass::Fatal => {
                    if matches!(
                        e.code(),
                        Some(
                            ResponseError::NotCoordinator | ResponseError::CoordinatorNotAvailable
                        )
                    ) || e.code().is_none()
                    {
                        state.coordinator = None;
                    }
                    if !backoff.wait().await {
                        return Err(self.kafka(e));
                    }
                }
                Err(e) => return Err(self.kafka(e)),
            }
        }
    }

    /// AddPartitionsToTxn for `partitions` (they succeed or fail together).
    async fn add_partitions(
        &self,
        state: &mut State,
        identity: ProducerIdentity,
        partitions: &[(String, i32)],
    ) -> Result<(), TxnError> {
        let mut topics: Vec<AddPartitionsToTxnTopic> = Vec::new();
        for (topic, partition) in partitions {
            match topics.iter_mut().find(|t| t.name.0.as_str() == topic) {
                Some(t) => t.partitions.push(*partition),
                None => topics.push(
                    AddPartitionsToTxnTopic::default()
                        .with_name(TopicName(StrBytes::from_string(topic.clone())))
                        .with_partitions(vec![*partition]),
                ),
            }
        }
        let id = self.id.clone();
        let request_timeout = self.client.config().request_timeout;
        self.to_coordinator(state, |conn| {
            let req = AddPartitionsToTxnRequest::default()
                .with_v3_and_below_transactional_id(TransactionalId(StrBytes::from_string(
                    id.clone(),
                )))
                .with_v3_and_below_producer_id(ProducerId(identity.id))
                .with_v3_and_below_producer_epoch(identity.epoch)
                .with_v3_and_below_topics(topics.clone());
            async move {
                let version = conn.version_for(ApiKey::AddPartitionsToTxn, ADD_VERSIONS)?;
                let resp = conn.send_version(&req, version, request_timeout).await?;
                // The first error of any partition (they succeed or fail together; the
                // others then say OPERATION_NOT_ATTEMPTED).
                let worst = resp
                    .results_by_topic_v3_and_below
                    .iter()
                    .flat_map(|t| t.results_by_partition.iter())
                    .map(|p| p.partition_error_code)
                    .find(|c| *c != 0 && *c != ResponseError::OperationNotAttempted.code())
                    .unwrap_or(0);
                match KafkaError::from_code(
                    conn.broker(),
                    ApiKey::AddPartitionsToTxn,
                    version,
                    worst,
                    None,
                ) {
                    Some(e) => Err(e),
                    None => Ok(()),
                }
            }
        })
        .await
    }

    /// EndTxn: commits or aborts the open transaction of `identity`.
    async fn end_txn(
        &self,
        state: &mut State,
        identity: ProducerIdentity,
        commit: bool,
    ) -> Result<(), TxnError> {
        let id = self.id.clone();
        let request_timeout = self.client.config().request_timeout;
        self.to_coordinator(state, |conn| {
            let req = EndTxnRequest::default()
                .with_transactional_id(TransactionalId(StrBytes::from_string(id.clone())))
                .with_producer_id(ProducerId(identity.id))
                .with_producer_epoch(identity.epoch)
                .with_committed(commit);
            async move {
                let version = conn.version_for(ApiKey::EndTxn, END_VERSIONS)?;
                let resp = conn.send_version(&req, version, request_timeout).await?;
                match KafkaError::from_code(
                    conn.broker(),
                    ApiKey::EndTxn,
                    version,
                    resp.error_code,
                    None,
                ) {
                    Some(e) => Err(e),
                    None => Ok(()),
                }
            }
        })
        .await
    }

    async fn init(&self, state: &mut State) -> Result<ProducerIdentity, TxnError> {
        let timeout_ms = i32::try_from(self.timeout.as_millis()).unwrap_or(i32::MAX);
        let id = self.id.clone();
        let request_timeout = self.client.config().request_timeout;
        self.to_coordinator(state, |conn| {
            // As a new producer (id and epoch -1): the coordinator aborts what the id left
            // open (answering CONCURRENT_TRANSACTIONS until it has, which is retried) and
            // bumps its epoch, whoever held it before.
            let req = InitProducerIdRequest::default()
                .with_transactional_id(Some(TransactionalId(StrBytes::from_string(id.clone()))))
                .with_transaction_timeout_ms(timeout_ms)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1);
            async move {
                let version = conn.version_for(ApiKey::InitProducerId, INIT_VERSIONS)?;
                let resp = conn.send_version(&req, version, request_timeout).await?;
                if let Some(e) = KafkaError::from_code(
                    conn.broker(),
                    ApiKey::InitProducerId,
                    version,
                    resp.error_code,
                    None,
                ) {
                    return Err(e);
                }
                Ok(ProducerIdentity {
                    id: resp.producer_id.0,
                    epoch: resp.producer_epoch,
                })
            }
        })
        .await
    }
}

impl Transaction<'_> {
    /// The producer id and epoch this transaction writes as.
    pub fn identity(&self) -> ProducerIdentity {
        self.identity
    }

    /// The partitions added to it so far.
    pub fn partitions(&self) -> Vec<(String, i32)> {
        self.added.iter().cloned().collect()
    }

    /// Where its last batch in `topic`'s `partition` began (`None`: it wrote none there, or the
    /// broker had it already).
    pub fn written_at(&self, topic: &str, partition: i32) -> Option<i64> {
        self.written.get(&(topic.to_owned(), partition)).copied()
    }

    /// Every partition it wrote to and where its last batch there began (to trace what a
    /// failed transaction left in the log until its abort).
    pub fn written(&self) -> Vec<(String, i32, i64)> {
        self.written
            .iter()
            .map(|((t, p), o)| (t.clone(), *p, *o))
            .collect()
    }

    /// Writes `records` as one batch to a partition inside the transaction (adding the
    /// partition to it first when this is its first batch).
    pub async fn send(
        &mut self,
        topic: &str,
        partition: i32,
        records: &[ProduceRecord],
        compression: Compression,
    ) -> Result<(), TxnError> {
        self.send_all(
            &[(topic.to_owned(), partition, records.to_vec())],
            compression,
        )
        .await
    }

    /// Writes each `(topic, partition, records)` as one batch inside the transaction: the new
    /// partitions added in one AddPartitionsToTxn, then every batch sent at once (a partition's
    /// batches in order on its leader's connection, with consecutive sequences). Fails as a
    /// whole on the first failure (the transaction is then not to be committed).
    pub async fn send_all(
        &mut self,
        batches: &[(String, i32, Vec<ProduceRecord>)],
        compression: Compression,
    ) -> Result<(), TxnError> {
        let partitions: Vec<(String, i32)> = batches
            .iter()
            .filter(|(_, _, r)| !r.is_empty())
            .map(|(t, p, _)| (t.clone(), *p))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        self.add(&partitions).await?;
        let identity = self.identity;
        let mut planned = Vec::with_capacity(batches.len());
        for (topic, partition, records) in batches.iter().filter(|(_, _, r)| !r.is_empty()) {
            let count = i32::try_from(records.len()).unwrap_or(i32::MAX);
            let seq = self
                .state
                .sequences
                .entry((topic.clone(), *partition))
                .or_default();
            let base = match seq.plan(identity, count) {
                Plan::Send { base_sequence, .. } => base_sequence,
                Plan::Bump { .. } => {
                    return Err(self.failed(KafkaError::Encode {
                        api: ApiKey::Produce,
                        version: 0,
                        reason: format!("{topic}-{partition}: sequence in doubt"),
                    }));
                }
            };
            // Counted as sent now, so the partition's next batch takes the next sequence; a
            // failure below ends the transaction and the producer's sequences with it.
            seq.landed(identity, base, count);
            let batch = encode_transactional_batch(records, compression, identity, base).map_err(
                |source| TxnError::Encode {
                    id: self.producer.id.clone(),
                    source,
                },
            )?;
            planned.push((topic.as_str(), *partition, batch));
        }
        // Partitions side by side; one partition's batches one after another, so that the
        // broker sees its sequences in order (a batch that overtook the one before it would be
        // refused as out of order).
        let mut by_partition: BTreeMap<(&str, i32), Vec<bytes::Bytes>> = BTreeMap::new();
        for (topic, partition, batch) in planned {
            by_partition
                .entry((topic, partition))
                .or_default()
                .push(batch);
        }
        let client = &self.producer.client;
        let id = self.producer.id.as_str();
        let sent = futures::future::join_all(by_partition.into_iter().map(
            |((topic, partition), batches)| async move {
                let mut last = None;
                for batch in batches {
                    match client
                        .send_transactional_batch(id, topic, partition, batch)
                        .await
                    {
                        Ok(offset) => last = Some(offset),
                        Err(e) if e.code() == Some(ResponseError::DuplicateSequenceNumber) => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(((topic.to_owned(), partition), last))
            },
        ))
        .await;
        let mut failure = None;
        for r in sent {
            match r {
                Ok((key, Some(offset))) => {
                    let at = self.written.entry(key).or_insert(offset);
                    *at = (*at).max(offset);
                }
                Ok((_, None)) => {}
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        if let Some(e) = failure {
            return Err(self.failed(e));
        }
        Ok(())
    }

    /// Adds partitions to the transaction (AddPartitionsToTxn), each once.
    pub async fn add(&mut self, partitions: &[(String, i32)]) -> Result<(), TxnError> {
        let new: Vec<(String, i32)> = partitions
            .iter()
            .filter(|p| !self.added.contains(*p))
            .cloned()
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        match self
            .producer
            .add_partitions(&mut self.state, self.identity, &new)
            .await
        {
            Ok(()) => {
                self.added.extend(new);
                Ok(())
            }
            Err(e) => {
                self.forget();
                Err(e)
            }
        }
    }

    /// Commits: every batch sent becomes visible to `read_committed` readers. On an error the
    /// transaction is not committed, except [`TxnError::CommitUnknown`], whose outcome only the
    /// coordinator knows.
    pub async fn commit(mut self) -> Result<(), TxnError> {
        self.end(true).await
    }

    /// Aborts: nothing sent in the transaction becomes visible. The next transaction starts
    /// with a new epoch.
    pub async fn abort(mut self) -> Result<(), TxnError> {
        let result = self.end(false).await;
        // Sequences of an aborted transaction's partitions are the broker's to reset: start
        // the next one from InitProducerId.
        self.forget();
        result
    }

    async fn end(&mut self, commit: bool) -> Result<(), TxnError> {
        self.ended = true;
        if self.added.is_empty() {
            return Ok(());
        }
        match self
            .producer
            .end_txn(&mut self.state, self.identity, commit)
            .await
        {
            Ok(()) => Ok(()),
            Err(e) => {
                self.forget();
                Err(match e {
                    TxnError::Kafka { id, source } if commit => {
                        TxnError::CommitUnknown { id, source }
                    }
                    other => other,
                })
            }
        }
    }

    /// After a failure: the next transaction asks for a new epoch first, and ends this one's
    /// partitions before it writes (see [`TransactionalProducer::begin`]).
    fn forget(&mut self) {
        if self.end_on_failure && !self.added.is_empty() {
            for p in &self.added {
                let at = self.written.get(p).copied();
                let e = self.state.unended.entry(p.clone()).or_default();
                *e = (*e).max(at);
            }
            self.state.unended_by = Some(self.identity.id);
        }
        self.state.identity = None;
        self.state.sequences.clear();
    }

    fn failed(&mut self, source: KafkaError) -> TxnError {
        self.forget();
        self.producer.kafka(source)
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if !self.ended && !self.added.is_empty() {
            // Left open (a cancelled caller): the coordinator aborts it when the next
            // InitProducerId comes, or at its timeout.
            self.forget();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fencing_error_is_told_apart_from_a_retriable_one() {
        let broker = crate::BrokerAddr {
            host: "127.0.0.1".into(),
            port: 9092,
            id: Some(1),
        };
        let err = |code: ResponseError| {
            KafkaError::from_code(&broker, ApiKey::EndTxn, 3, code.code(), None).expect("an error")
        };
        assert!(fenced(&err(ResponseError::ProducerFenced)));
        assert!(fenced(&err(ResponseError::InvalidProducerEpoch)));
        assert!(fenced(&err(ResponseError::InvalidTxnState)));
        assert!(!fenced(&err(ResponseError::ConcurrentTransactions)));
        assert!(!fenced(&err(ResponseError::NotCoordinator)));
    }
}

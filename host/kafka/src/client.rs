//! The cluster client: bootstrap, metadata (topic names ↔ ids, partition leaders), one cached
//! connection per broker, coordinator lookup, and the few data and admin calls sharehost needs
//! besides the share protocol (Produce for dead letters, Fetch and admin calls for tests).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsRequest, DeleteTopicsRequest, DescribeConfigsRequest,
    FetchRequest, FindCoordinatorRequest, IncrementalAlterConfigsRequest, InitProducerIdRequest,
    ListOffsetsRequest, MetadataRequest, MetadataResponse, ProduceRequest, ProducerId, TopicName,
    TransactionalId,
};
use kafka_protocol::protocol::{Request, StrBytes, VersionRange};
use tokio::time::Instant;
use uuid::Uuid;

use super::addr::{BrokerAddr, parse_bootstrap};
use super::backoff::{Backoff, BackoffConfig};
use super::connection::{BrokerConnection, ConnectionConfig};
use super::error::{ErrorClass, KafkaError, Result};
use super::idempotence::{PartitionSequence, Plan, ProducerIdentity};
use super::records::{
    AbortedTransaction, Compression, ConsumedRecord, ProduceRecord, decode_committed,
    encode_batch_as,
};

/// Which of the client's connection caches a request uses.
#[derive(Debug, Clone, Copy)]
enum Pool {
    /// Metadata, fetches, admin calls: whatever is not a write.
    Shared,
    /// Produce requests alone, so that no long poll delays a write.
    Writes,
}

/// Whether a produce error says the broker refused this producer's identity or sequence (so the
/// batch was not appended and a new producer id may write it).
fn refuses_producer(e: &KafkaError) -> bool {
    matches!(
        e.code(),
        Some(
            ResponseError::UnknownProducerId
                | ResponseError::OutOfOrderSequenceNumber
                | ResponseError::InvalidProducerEpoch
                | ResponseError::InvalidProducerIdMapping
        )
    )
}

/// Produce up to v12 addresses topics by name; v13 switched to ids and gains us nothing here.
const PRODUCE_VERSIONS: VersionRange = VersionRange { min: 3, max: 12 };
/// A transaction's batches: v11 at most, see [`KafkaClient::send_transactional_batch`].
const TRANSACTIONAL_PRODUCE_VERSIONS: VersionRange = VersionRange { min: 3, max: 11 };
/// InitProducerId: v0 suffices without a transactional id; v3+ would carry an id to bump.
const INIT_PRODUCER_ID_VERSIONS: VersionRange = VersionRange { min: 0, max: 5 };
/// Fetch up to v12 addresses topics by name.
const FETCH_VERSIONS: VersionRange = VersionRange { min: 4, max: 12 };
/// FindCoordinator v4+ batches keys; share consumers use key type GROUP (0).
const FIND_COORDINATOR_VERSIONS: VersionRange = VersionRange { min: 4, max: 6 };
/// Metadata v10+ carries topic ids.
const METADATA_VERSIONS: VersionRange = VersionRange { min: 10, max: 13 };
/// Config resource type of groups (KIP-848/932 group configs).
pub const CONFIG_RESOURCE_GROUP: i8 = 32;
/// Config resource type of topics.
pub const CONFIG_RESOURCE_TOPIC: i8 = 2;
/// ConfigResource type BROKER (4), for DescribeConfigs.
pub const CONFIG_RESOURCE_BROKER: i8 = 4;

/// One partition's place in the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMeta {
    /// Partition index.
    pub index: i32,
    /// Leader node id, -1 while leaderless.
    pub leader: i32,
    /// Leader epoch, to ignore stale leader hints.
    pub leader_epoch: i32,
}

/// A topic as metadata describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMeta {
    /// Topic name.
    pub name: String,
    /// Topic id (ShareFetch and heartbeat assignments use ids).
    pub id: Uuid,
    /// Partitions sorted by index.
    pub partitions: Vec<PartitionMeta>,
}

#[derive(Debug, Default)]
struct ClusterView {
    brokers: HashMap<i32, BrokerAddr>,
    topics: HashMap<String, TopicMeta>,
    names_by_id: HashMap<Uuid, String>,
}

/// What Fetch returned for one partition.
#[derive(Debug, Clone)]
pub struct FetchedPartition {
    /// Records from the requested offset on, control records dropped.
    pub records: Vec<ConsumedRecord>,
    /// Where the next read starts: past every record and transaction marker seen.
    pub next_offset: i64,
    /// The partition's high watermark.
    pub high_watermark: i64,
}

/// What a `read_committed` Fetch returned for one partition.
#[derive(Debug, Clone)]
pub struct CommittedPartition {
    /// Committed records from the requested offset on.
    pub records: Vec<ConsumedRecord>,
    /// Where the next read starts: past every record, marker and aborted record seen.
    pub next_offset: i64,
    /// The partition's last stable offset: every transaction below it is decided.
    pub last_stable_offset: i64,
    /// The partition's high watermark.
    pub high_watermark: i64,
}

/// One partition's answer to a Fetch, before its records are decoded.
struct RawFetch {
    broker: BrokerAddr,
    version: i16,
    data: bytes::Bytes,
    high_watermark: i64,
    last_stable_offset: i64,
    aborted: Vec<AbortedTransaction>,
}

impl RawFetch {
    fn decode_error(&self, reason: String) -> KafkaError {
        KafkaError::Decode {
            broker: self.broker.clone(),
            api: ApiKey::Fetch,
            version: self.version,
            reason,
        }
    }
}

/// Which offset ListOffsets should return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    /// The first offset still in the log.
    Earliest,
    /// The offset the next produced record will get.
    Latest,
}

/// A client for one Kafka cluster. Cheap to share behind an `Arc`.
pub struct KafkaClient {
    config: ConnectionConfig,
    bootstrap: Vec<BrokerAddr>,
    view: Mutex<ClusterView>,
    conns: tokio::sync::Mutex<HashMap<i32, Arc<BrokerConnection>>>,
    /// Connections that carry produce requests and nothing else. A broker serves one connection's
    /// requests one after another, so a write sent behind a long-polling fetch (the fleet
    /// agent's, 500 ms) waited for it.
    write_conns: tokio::sync::Mutex<HashMap<i32, Arc<BrokerConnection>>>,
    backoff: BackoffConfig,
    /// Who the brokers know this client's writes as (InitProducerId, asked at the first produce).
    producer: tokio::sync::Mutex<Option<ProducerIdentity>>,
    /// Each partition's sequence, held for the whole of a produce call: one batch in flight per
    /// partition, so that a retry is never overtaken by the next batch.
    sequences: Mutex<HashMap<(String, i32), SequenceSlot>>,
}

/// One partition's sequence, locked for the length of a produce call.
type SequenceSlot = Arc<tokio::sync::Mutex<PartitionSequence>>;

impl std::fmt::Debug for KafkaClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaClient")
            .field("bootstrap", &self.bootstrap)
            .finish_non_exhaustive()
    }
}

impl KafkaClient {
    /// Parses the bootstrap list, connects to the first reachable broker and loads metadata.
    /// A bad address, TLS or SASL problem fails here, before any work starts.
    pub async fn connect(bootstrap: &str, config: ConnectionConfig) -> Result<KafkaClient> {
        let bootstrap = parse_bootstrap(bootstrap)?;
        let client = KafkaClient {
            config,
            bootstrap,
            view: Mutex::new(ClusterView::default()),
            conns: tokio::sync::Mutex::new(HashMap::new()),
            write_conns: tokio::sync::Mutex::new(HashMap::new()),
            backoff: BackoffConfig::default(),
            producer: tokio::sync::Mutex::new(None),
            sequences: Mutex::new(HashMap::new()),
        };
        client.refresh_metadata(&[]).await?;
        Ok(client)
    }

    /// The connection settings every broker connection uses.
    pub fn config(&self) -> &ConnectionConfig {
        &self.config
    }

    fn view(&self) -> std::sync::MutexGuard<'_, ClusterView> {
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The address of a broker known from metadata.
    pub fn broker(&self, id: i32) -> Option<BrokerAddr> {
        self.view().brokers.get(&id).cloned()
    }

    /// Node ids of every known broker.
    pub fn broker_ids(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self.view().brokers.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Metadata of a topic by name, from the cache.
    pub fn topic(&self, name: &str) -> Option<TopicMeta> {
        self.view().topics.get(name).cloned()
    }

    /// The name of a topic id, from the cache.
    pub fn topic_name(&self, id: Uuid) -> Option<String> {
        self.view().names_by_id.get(&id).cloned()
    }

    /// The current leader of a partition, from the cache.
    pub fn leader(&self, topic: &str, partition: i32) -> Option<i32> {
        let view = self.view();
        let t = view.topics.get(topic)?;
        t.partitions
            .iter()
            .find(|p| p.index == partition)
            .map(|p| p.leader)
            .filter(|l| *l >= 0)
    }

    /// Records a broker learned outside metadata (ShareFetch NodeEndpoints).
    pub fn learn_broker(&self, id: i32, host: &str, port: u16) {
        self.view()
            .brokers
            .insert(id, BrokerAddr::new(host, port).with_id(id));
    }

    /// The cached connection to broker `id`, connecting when there is none or it died.
    pub async fn connection(&self, id: i32) -> Result<Arc<BrokerConnection>> {
        self.connection_in(Pool::Shared, id).await
    }

    fn pool(&self, pool: Pool) -> &tokio::sync::Mutex<HashMap<i32, Arc<BrokerConnection>>> {
        match pool {
            Pool::Shared => &self.conns,
            Pool::Writes => &self.write_conns,
        }
    }

    async fn connection_in(&self, pool: Pool, id: i32) -> Result<Arc<BrokerConnection>> {
        let addr = self.broker(id).ok_or_else(|| {
            KafkaError::Config(format!("broker {id} is not in the cluster metadata"))
        })?;
        let mut conns = self.pool(pool).lock().await;
        if let Some(c) = conns.get(&id)
            && !c.is_dead()
        {
            return Ok(c.clone());
        }
        let c = BrokerConnection::connect(&addr, &self.config).await?;
        conns.insert(id, c.clone());
        Ok(c)
    }

    /// A fresh connection to broker `id` that is not shared with anything else. Share sessions
    /// are bound to their TCP connection, so each consumer owns its own.
    pub async fn dedicated_connection(&self, id: i32) -> Result<Arc<BrokerConnection>> {
        let addr = self.broker(id).ok_or_else(|| {
            KafkaError::Config(format!("broker {id} is not in the cluster metadata"))
        })?;
        BrokerConnection::connect(&addr, &self.config).await
    }

    /// Forgets a connection after a failure, unless another caller already replaced it.
    pub async fn invalidate(&self, id: i32, conn: &Arc<BrokerConnection>) {
        self.invalidate_in(Pool::Shared, id, conn).await
    }

    async fn invalidate_in(&self, pool: Pool, id: i32, conn: &Arc<BrokerConnection>) {
        let mut conns = self.pool(pool).lock().await;
        if conns.get(&id).is_some_and(|c| Arc::ptr_eq(c, conn)) {
            conns.remove(&id);
        }
    }

    /// Any working connection: a known broker first, then the bootstrap list.
    async fn any_connection(&self) -> Result<(Option<i32>, Arc<BrokerConnection>)> {
        self.any_connection_in(Pool::Shared).await
    }

    async fn any_connection_in(&self, pool: Pool) -> Result<(Option<i32>, Arc<BrokerConnection>)> {
        let mut errors = Vec::new();
        for id in self.broker_ids() {
            match self.connection_in(pool, id).await {
                Ok(c) => return Ok((Some(id), c)),
                Err(e) => errors.push(e),
            }
        }
        for addr in &self.bootstrap {
            match BrokerConnection::connect(addr, &self.config).await {
                Ok(c) => return Ok((None, c)),
                Err(
                    e @ (KafkaError::Tls { .. } | KafkaError::Auth { .. } | KafkaError::Config(_)),
                ) => {
                    // Wrong CA or password will not get better on the next broker.
                    return Err(e);
                }
                Err(e) => errors.push(e),
            }
        }
        Err(KafkaError::NoBroker(errors))
    }

    /// Sends `req` to any broker, retrying transport failures on another connection until the
    /// request timeout passes.
    pub async fn send_any<R: Request + Clone>(&self, req: &R) -> Result<R::Response> {
        let deadline = Instant::now() + self.config.request_timeout;
        let mut backoff = Backoff::with_deadline(self.backoff, deadline);
        loop {
            let (id, conn) = self.any_connection().await?;
            match conn.send(req).await {
                Ok(r) => return Ok(r),
                Err(e) if e.class() == ErrorClass::Retry => {
                    if let Some(id) = id {
                        self.invalidate(id, &conn).await;
                    }
                    if !backoff.wait().await {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Refreshes brokers and the given topics (all topics when empty).
    pub async fn refresh_metadata(&self, topics: &[String]) -> Result<()> {
        let req = MetadataRequest::default().with_topics(if topics.is_empty() {
            None
        } else {
            Some(
                topics
                    .iter()
                    .map(|t| {
                        MetadataRequestTopic::default()
                            .with_name(Some(TopicName(StrBytes::from_string(t.clone()))))
                    })
                    .collect(),
            )
        });
        let deadline = Instant::now() + self.config.request_timeout;
        let mut backoff = Backoff::with_deadline(self.backoff, deadline);
        loop {
            let (id, conn) = self.any_connection().await?;
            let version = conn.version_for(ApiKey::Metadata, METADATA_VERSIONS)?;
            match conn
                .send_version(&req, version, self.config.request_timeout)
                .await
            {
                Ok(resp) => {
                    self.apply_metadata(&resp);
                    return Ok(());
                }
                Err(e) if e.class() == ErrorClass::Retry => {
                    if let Some(id) = id {
                        self.invalidate(id, &conn).await;
                    }
                    if !backoff.wait().await {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn apply_metadata(&self, resp: &MetadataResponse) {
        let mut view = self.view();
        if !resp.brokers.is_empty() {
            view.brokers = resp
                .brokers
                .iter()
                .filter_map(|b| {
                    let port = u16::try_from(b.port).ok()?;
                    Some((
                        b.node_id.0,
                        BrokerAddr::new(b.host.as_str(), port).with_id(b.node_id.0),
                    ))
                })
                .collect();
        }
        for t in &resp.topics {
            let Some(name) = t.name.as_ref().map(|n| n.0.as_str().to_owned()) else {
                continue;
            };
            if t.error_code != 0 {
                if let Some(old) = view.topics.remove(&name) {
                    view.names_by_id.remove(&old.id);
                }
                continue;
            }
            let mut partitions: Vec<PartitionMeta> = t
                .partitions
                .iter()
                .map(|p| PartitionMeta {
                    index: p.partition_index,
                    leader: p.leader_id.0,
                    leader_epoch: p.leader_epoch,
                })
                .collect();
            partitions.sort_by_key(|p| p.index);
            view.names_by_id.insert(t.topic_id, name.clone());
            view.topics.insert(
                name.clone(),
                TopicMeta {
                    name,
                    id: t.topic_id,
                    partitions,
                },
            );
        }
    }

    /// Finds the group coordinator (key type GROUP, as the Java share consumer does), retrying
    /// while the coordinator is loading or unavailable.
    pub async fn find_coordinator(&self, group: &str) -> Result<i32> {
        self.find_coordinator_of(0, group).await
    }

    /// Finds the transaction coordinator of `transactional_id` (key type TRANSACTION), retrying
    /// while it is loading or unavailable.
    pub async fn find_transaction_coordinator(&self, transactional_id: &str) -> Result<i32> {
        self.find_coordinator_of(1, transactional_id).await
    }

    async fn find_coordinator_of(&self, key_type: i8, key: &str) -> Result<i32> {
        let req = FindCoordinatorRequest::default()
            .with_key_type(key_type)
            .with_coordinator_keys(vec![StrBytes::from_string(key.to_owned())]);
        let deadline = Instant::now() + self.config.request_timeout;
        let mut backoff = Backoff::with_deadline(self.backoff, deadline);
        loop {
            let (_, conn) = self.any_connection().await?;
            let version = conn.version_for(ApiKey::FindCoordinator, FIND_COORDINATOR_VERSIONS)?;
            let resp = conn
                .send_version(&req, version, self.config.request_timeout)
                .await?;
            let Some(c) = resp.coordinators.first() else {
                return Err(KafkaError::Decode {
                    broker: conn.broker().clone(),
                    api: ApiKey::FindCoordinator,
                    version,
                    reason: "response names no coordinator".into(),
                });
            };
            match KafkaError::from_code(
                conn.broker(),
                ApiKey::FindCoordinator,
                version,
                c.error_code,
                c.error_message.as_deref(),
            ) {
                None => {
                    let port = u16::try_from(c.port).map_err(|_| KafkaError::Decode {
                        broker: conn.broker().clone(),
                        api: ApiKey::FindCoordinator,
                        version,
                        reason: format!("port {} out of range", c.port),
                    })?;
                    self.learn_broker(c.node_id.0, c.host.as_str(), port);
                    return Ok(c.node_id.0);
                }
                Some(e) if e.class() != ErrorClass::Fatal => {
                    if !backoff.wait().await {
                        return Err(e);
                    }
                }
                Some(e) => return Err(e),
            }
        }
    }

    async fn leader_connection(
        &self,
        pool: Pool,
        topic: &str,
        partition: i32,
    ) -> Result<Arc<BrokerConnection>> {
        // A cached leader that the broker list no longer holds (a refresh for another topic
        // dropped a node that is down) is stale: refresh this topic instead of failing with
        // "not in the cluster metadata", which is fatal and cost dead letters in dev/chaos.
        let known = |l: &i32| self.broker(*l).is_some();
        let leader = match self.leader(topic, partition).filter(known) {
            Some(l) => l,
            None => {
                self.refresh_metadata(&[topic.to_owned()]).await?;
                self.leader(topic, partition)
                    .filter(known)
                    .ok_or_else(|| KafkaError::UnknownTopic(format!("{topic}-{partition}")))?
            }
        };
        self.connection_in(pool, leader).await
    }

    /// Runs `op` against the partition leader, refreshing metadata and reconnecting on
    /// retriable errors until the request timeout passes.
    async fn with_leader<T, F, Fut>(
        &self,
        pool: Pool,
        topic: &str,
        partition: i32,
        mut op: F,
    ) -> Result<T>
    where
        F: FnMut(Arc<BrokerConnection>) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let deadline = Instant::now() + self.config.request_timeout;
        let mut backoff = Backoff::with_deadline(self.backoff, deadline);
        loop {
            let conn = match self.leader_connection(pool, topic, partition).await {
                Ok(c) => c,
                Err(e) if e.class() != ErrorClass::Fatal => {
                    // The cached leader cannot be reached (killed, not yet fenced by the
                    // controller): ask again who leads, or every retry dials the dead node
                    // until the deadline (dev/chaos found `sharehost fleet` failing so).
                    let _ = self.refresh_metadata(&[topic.to_owned()]).await;
                    if !backoff.wait().await {
                        return Err(e);
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            match op(conn.clone()).await {
                Ok(v) => return Ok(v),
                Err(e) => match e.class() {
                    ErrorClass::Fatal => return Err(e),
                    class => {
                        if class == ErrorClass::RefreshMetadata || conn.is_dead() {
                            if let Some(id) = conn.broker().id {
                                self.invalidate_in(pool, id, &conn).await;
                            }
                            let _ = self.refresh_metadata(&[topic.to_owned()]).await;
                        }
                        if !backoff.wait().await {
                            return Err(e);
                        }
                    }
                },
            }
        }
    }

    /// Produces `records` as one batch to a partition (acks=all) and returns the base offset
    /// (-1 when the broker answered that it had the batch already).
    ///
    /// Idempotent: the batch carries this client's producer id and the partition's next sequence,
    /// and every retry the same, so a batch whose answer was lost lands once (see
    /// [`crate::idempotence`]). Calls for one partition run one at a time.
    pub async fn produce(
        &self,
        topic: &str,
        partition: i32,
        records: &[ProduceRecord],
        compression: Compression,
    ) -> Result<i64> {
        let encode_error = |reason: String| KafkaError::Encode {
            api: ApiKey::Produce,
            version: 0,
            reason,
        };
        let count = i32::try_from(records.len())
            .map_err(|_| encode_error(format!("{} records in one batch", records.len())))?;
        if count == 0 {
            return Ok(-1);
        }
        let slot = {
            let mut sequences = self.sequences.lock().unwrap_or_else(|p| p.into_inner());
            sequences
                .entry((topic.to_owned(), partition))
                .or_default()
                .clone()
        };
        let mut sequence = slot.lock().await;
        let mut renewed = 0;
        loop {
            let identity = self.producer_identity().await?;
            let base_sequence = match sequence.plan(identity, count) {
                Plan::Send { base_sequence, .. } => base_sequence,
                Plan::Bump { stale } => {
                    self.bump_identity(stale).await?;
                    continue;
                }
            };
            let batch = encode_batch_as(records, compression, Some((identity, base_sequence)))
                .map_err(|e| encode_error(e.to_string()))?;
            match self.send_batch(topic, partition, batch).await {
                Ok(offset) => {
                    sequence.landed(identity, base_sequence, count);
                    return Ok(offset);
                }
                Err(e) if e.code() == Some(ResponseError::DuplicateSequenceNumber) => {
                    sequence.landed(identity, base_sequence, count);
                    return Ok(-1);
                }
                // The broker has no state for this producer any more (its records expired), or
                // refuses its epoch or sequence: nothing of the batch was appended. A new id
                // starts every partition again; a few times, not forever.
                Err(e) if refuses_producer(&e) && renewed < 3 => {
                    renewed += 1;
                    self.renew_identity(identity).await?;
                }
                Err(e) => {
                    // Whether an attempt landed is unknown (a refusal on the last attempt may
                    // follow a timeout on an earlier one): the next batch starts a new epoch.
                    sequence.in_doubt(identity);
                    return Err(e);
                }
            }
        }
    }

    /// This client's producer identity, asked for once.
    async fn producer_identity(&self) -> Result<ProducerIdentity> {
        let mut producer = self.producer.lock().await;
        if let Some(identity) = *producer {
            return Ok(identity);
        }
        let identity = self.init_producer_id().await?;
        *producer = Some(identity);
        Ok(identity)
    }

    /// The next epoch of `stale`, unless another call moved on already; a new id when the epoch
    /// is exhausted.
    async fn bump_identity(&self, stale: ProducerIdentity) -> Result<()> {
        let mut producer = self.producer.lock().await;
        if *producer != Some(stale) {
            return Ok(());
        }
        *producer = Some(match stale.bumped() {
            Some(next) => next,
            None => self.init_producer_id().await?,
        });
        Ok(())
    }

    /// A new producer id instead of `stale`, unless another call got one already.
    async fn renew_identity(&self, stale: ProducerIdentity) -> Result<()> {
        let mut producer = self.producer.lock().await;
        if *producer != Some(stale) {
            return Ok(());
        }
        *producer = Some(self.init_producer_id().await?);
        Ok(())
    }

    /// InitProducerId without a transactional id: any broker gives an idempotent producer id.
    async fn init_producer_id(&self) -> Result<ProducerIdentity> {
        let req = InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(-1)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
        let deadline = Instant::now() + self.config.request_timeout;
        let mut backoff = Backoff::with_deadline(self.backoff, deadline);
        loop {
            // (over the writes' connections: the first write waits for this answer)
            let (id, conn) = self.any_connection_in(Pool::Writes).await?;
            let sent = match conn.version_for(ApiKey::InitProducerId, INIT_PRODUCER_ID_VERSIONS) {
                Ok(version) => conn
                    .send_version(&req, version, self.config.request_timeout)
                    .await
                    .map(|resp| (version, resp)),
                Err(e) => Err(e),
            };
            let (version, resp) = match sent {
                Ok(answer) => answer,
                Err(e) if e.class() != ErrorClass::Fatal => {
                    if let Some(id) = id {
                        self.invalidate_in(Pool::Writes, id, &conn).await;
                    }
                    if !backoff.wait().await {
                        return Err(e);
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            match KafkaError::from_code(
                conn.broker(),
                ApiKey::InitProducerId,
                version,
                resp.error_code,
                None,
            ) {
                None => {
                    return Ok(ProducerIdentity {
                        id: resp.producer_id.0,
                        epoch: resp.producer_epoch,
                    });
                }
                Some(e) if e.class() != ErrorClass::Fatal && backoff.wait().await => {}
                Some(e) => return Err(e),
            }
        }
    }

    /// Sends one encoded batch to the partition's leader (acks=all), retrying what is retriable
    /// with the same bytes until the request timeout passes.
    async fn send_batch(&self, topic: &str, partition: i32, batch: bytes::Bytes) -> Result<i64> {
        self.send_batch_within(topic, partition, batch, None, PRODUCE_VERSIONS)
            .await
    }

    /// [`KafkaClient::send_batch`] for a batch of `transactional_id`'s open transaction, at a
    /// version that leaves adding the partition to the transaction to the producer
    /// (AddPartitionsToTxn before the first batch; v12 would have the broker do it, which only
    /// a coordinator on transaction version 2 understands).
    pub(crate) async fn send_transactional_batch(
        &self,
        transactional_id: &str,
        topic: &str,
        partition: i32,
        batch: bytes::Bytes,
    ) -> Result<i64> {
        self.send_batch_within(
            topic,
            partition,
            batch,
            Some(transactional_id),
            TRANSACTIONAL_PRODUCE_VERSIONS,
        )
        .await
    }

    async fn send_batch_within(
        &self,
        topic: &str,
        partition: i32,
        batch: bytes::Bytes,
        transactional_id: Option<&str>,
        versions: VersionRange,
    ) -> Result<i64> {
        let req = ProduceRequest::default()
            .with_transactional_id(
                transactional_id.map(|t| TransactionalId(StrBytes::from_string(t.to_owned()))),
            )
            .with_acks(-1)
            .with_timeout_ms(30_000)
            .with_topic_data(vec![
                TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
                    .with_partition_data(vec![
                        PartitionProduceData::default()
                            .with_index(partition)
                            .with_records(Some(batch)),
                    ]),
            ]);
        let timeout = self.config.request_timeout;
        self.with_leader(Pool::Writes, topic, partition, |conn| {
            let req = req.clone();
            async move {
                let version = conn.version_for(ApiKey::Produce, versions)?;
                let resp = conn.send_version(&req, version, timeout).await?;
                let p = resp
                    .responses
                    .iter()
                    .flat_map(|t| t.partition_responses.iter())
                    .find(|p| p.index == partition)
                    .ok_or_else(|| KafkaError::Decode {
                        broker: conn.broker().clone(),
                        api: ApiKey::Produce,
                        version,
                        reason: format!("no result for {topic}-{partition}"),
                    })?;
                match KafkaError::from_code(
                    conn.broker(),
                    ApiKey::Produce,
                    version,
                    p.error_code,
                    p.error_message.as_deref(),
                ) {
                    Some(e) => Err(e),
                    None => Ok(p.base_offset),
                }
            }
        })
        .await
    }

    /// Reads records of one partition from `offset` (plain Fetch, read_uncommitted), waiting up
    /// to `max_wait` for data.
    pub async fn fetch(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_wait: Duration,
    ) -> Result<FetchedPartition> {
        let raw = self
            .fetch_raw(topic, partition, offset, max_wait, false)
            .await?;
        // Every record but the markers, aborted ones included (read_uncommitted).
        let read =
            decode_committed(raw.data.clone(), &[]).map_err(|e| raw.decode_error(e.to_string()))?;
        Ok(FetchedPartition {
            records: read
                .records
                .into_iter()
                .filter(|r| r.offset >= offset)
                .collect(),
            next_offset: read.next_offset.unwrap_or(offset).max(offset),
            high_watermark: raw.high_watermark,
        })
    }

    /// Reads the committed records of one partition from `offset` (Fetch, read_committed: up
    /// to the last stable offset, aborted transactions dropped), waiting up to `max_wait`.
    pub async fn fetch_committed(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_wait: Duration,
    ) -> Result<CommittedPartition> {
        let raw = self
            .fetch_raw(topic, partition, offset, max_wait, true)
            .await?;
        let mut read = decode_committed(raw.data.clone(), &raw.aborted)
            .map_err(|e| raw.decode_error(e.to_string()))?;
        read.records.retain(|r| r.offset >= offset);
        Ok(CommittedPartition {
            records: read.records,
            next_offset: read.next_offset.unwrap_or(offset).max(offset),
            last_stable_offset: raw.last_stable_offset,
            high_watermark: raw.high_watermark,
        })
    }

    /// Looks for the end of `producer_id`'s transaction above `after` in one partition (Fetch,
    /// read_uncommitted, from `from`): its marker if the data read holds it, and the offset to
    /// read from next. How a transactional producer checks that its commit reached the log.
    pub async fn transaction_end(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        producer_id: i64,
        after: i64,
    ) -> Result<(Option<crate::records::TxnMarker>, i64)> {
        let raw = self
            .fetch_raw(topic, partition, from, Duration::ZERO, false)
            .await?;
        let (marker, next) = crate::records::find_marker(raw.data.clone(), producer_id, after)
            .map_err(|e| raw.decode_error(e.to_string()))?;
        Ok((marker, next.unwrap_or(from).max(from)))
    }

    async fn fetch_raw(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_wait: Duration,
        committed: bool,
    ) -> Result<RawFetch> {
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(max_wait.as_millis().min(i32::MAX as u128) as i32)
            .with_min_bytes(1)
            .with_max_bytes(16 * 1024 * 1024)
            .with_isolation_level(i8::from(committed))
            .with_session_id(0)
            .with_session_epoch(-1)
            .with_topics(vec![
                FetchTopic::default()
                    .with_topic(TopicName(StrBytes::from_string(topic.to_owned())))
                    .with_partitions(vec![
                        FetchPartition::default()
                            .with_partition(partition)
                            .with_current_leader_epoch(-1)
                            .with_fetch_offset(offset)
                            .with_last_fetched_epoch(-1)
                            .with_log_start_offset(-1)
                            .with_partition_max_bytes(8 * 1024 * 1024),
                    ]),
            ]);
        let timeout = self.config.request_timeout + max_wait;
        self.with_leader(Pool::Shared, topic, partition, |conn| {
            let req = req.clone();
            async move {
                let version = conn.version_for(ApiKey::Fetch, FETCH_VERSIONS)?;
                let resp = conn.send_version(&req, version, timeout).await?;
                if let Some(e) = KafkaError::from_code(
                    conn.broker(),
                    ApiKey::Fetch,
                    version,
                    resp.error_code,
                    None,
                ) {
                    return Err(e);
                }
                let p = resp
                    .responses
                    .iter()
                    .flat_map(|t| t.partitions.iter())
                    .find(|p| p.partition_index == partition)
                    .ok_or_else(|| KafkaError::Decode {
                        broker: conn.broker().clone(),
                        api: ApiKey::Fetch,
                        version,
                        reason: format!("no data for {topic}-{partition}"),
                    })?;
                if let Some(e) =
                    KafkaError::from_code(conn.broker(), ApiKey::Fetch, version, p.error_code, None)
                {
                    return Err(e);
                }
                Ok(RawFetch {
                    broker: conn.broker().clone(),
                    version,
                    data: p.records.clone().unwrap_or_default(),
                    high_watermark: p.high_watermark,
                    last_stable_offset: p.last_stable_offset,
                    aborted: p
                        .aborted_transactions
                        .iter()
                        .flatten()
                        .map(|a| AbortedTransaction {
                            producer_id: a.producer_id.0,
                            first_offset: a.first_offset,
                        })
                        .collect(),
                })
            }
        })
        .await
    }

    /// The earliest or latest offset of a partition.
    pub async fn list_offset(&self, topic: &str, partition: i32, spec: OffsetSpec) -> Result<i64> {
        let ts = match spec {
            OffsetSpec::Earliest => -2,
            OffsetSpec::Latest => -1,
        };
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![
                ListOffsetsTopic::default()
                    .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
                    .with_partitions(vec![
                        ListOffsetsPartition::default()
                            .with_partition_index(partition)
                            .with_current_leader_epoch(-1)
                            .with_timestamp(ts),
                    ]),
            ]);
        self.with_leader(Pool::Shared, topic, partition, |conn| {
            let req = req.clone();
            async move {
                let resp = conn.send(&req).await?;
                let p = resp
                    .topics
                    .iter()
                    .flat_map(|t| t.partitions.iter())
                    .find(|p| p.partition_index == partition)
                    .ok_or_else(|| KafkaError::UnknownTopic(format!("{topic}-{partition}")))?;
                match KafkaError::from_code(
                    conn.broker(),
                    ApiKey::ListOffsets,
                    0,
                    p.error_code,
                    None,
                ) {
                    Some(e) => Err(e),
                    None => Ok(p.offset),
                }
            }
        })
        .await
    }

    /// The first error among an admin response's per-resource (code, message) pairs, named
    /// with a broker this client reaches (admin requests go to any broker).
    async fn admin_errors<'a>(
        &self,
        api: ApiKey,
        codes: impl Iterator<Item = (i16, Option<&'a str>)>,
    ) -> Result<()> {
        let (_, conn) = self.any_connection().await?;
        for (code, message) in codes {
            if let Some(e) = KafkaError::from_code(conn.broker(), api, 0, code, message) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Creates a topic (replication factor 1 unless given) and waits until metadata shows its
    /// leaders. An existing topic is an error with code TopicAlreadyExists.
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        configs: &[(&str, &str)],
    ) -> Result<Uuid> {
        let req = CreateTopicsRequest::default()
            .with_timeout_ms(30_000)
            .with_topics(vec![
                CreatableTopic::default()
                    .with_name(TopicName(StrBytes::from_string(name.to_owned())))
                    .with_num_partitions(partitions)
                    .with_replication_factor(replication_factor)
                    .with_configs(
                        configs
                            .iter()
                            .map(|(k, v)| {
                                CreatableTopicConfig::default()
                                    .with_name(StrBytes::from_string((*k).to_owned()))
                                    .with_value(Some(StrBytes::from_string((*v).to_owned())))
                            })
                            .collect(),
                    ),
            ]);
        let resp = self.send_any(&req).await?;
        self.admin_errors(
            ApiKey::CreateTopics,
            resp.topics
                .iter()
                .map(|t| (t.error_code, t.error_message.as_deref())),
        )
        .await?;
        // Leaders appear in metadata shortly after creation; wait for all of them.
        let deadline = Instant::now() + self.config.request_timeout;
        let mut backoff = Backoff::with_deadline(
            BackoffConfig {
                initial: Duration::from_millis(20),
                ..self.backoff
            },
            deadline,
        );
        loop {
            self.refresh_metadata(&[name.to_owned()]).await?;
            if let Some(t) = self.topic(name)
                && t.partitions.len() == partitions as usize
                && t.partitions.iter().all(|p| p.leader >= 0)
            {
                return Ok(t.id);
            }
            if !backoff.wait().await {
                return Err(KafkaError::UnknownTopic(format!(
                    "{name} (created, but no leaders appeared in time)"
                )));
            }
        }
    }

    /// Sets dynamic configs on a group (e.g. `share.auto.offset.reset=earliest` before the first
    /// member joins).
    pub async fn alter_group_configs(&self, group: &str, configs: &[(&str, &str)]) -> Result<()> {
        let set: Vec<(&str, Option<&str>)> = configs.iter().map(|(k, v)| (*k, Some(*v))).collect();
        self.alter_configs(CONFIG_RESOURCE_GROUP, group, &set).await
    }

    /// Sets (`Some`) or removes (`None`, back to the broker's default) dynamic configs of a
    /// topic, e.g. `max.message.bytes`.
    pub async fn alter_topic_configs(
        &self,
        topic: &str,
        configs: &[(&str, Option<&str>)],
    ) -> Result<()> {
        self.alter_configs(CONFIG_RESOURCE_TOPIC, topic, configs)
            .await
    }

    /// IncrementalAlterConfigs on one resource: SET for `Some(value)`, DELETE for `None`.
    async fn alter_configs(
        &self,
        resource_type: i8,
        name: &str,
        configs: &[(&str, Option<&str>)],
    ) -> Result<()> {
        let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
            AlterConfigsResource::default()
                .with_resource_type(resource_type)
                .with_resource_name(StrBytes::from_string(name.to_owned()))
                .with_configs(
                    configs
                        .iter()
                        .map(|(k, v)| {
                            AlterableConfig::default()
                                .with_name(StrBytes::from_string((*k).to_owned()))
                                .with_config_operation(if v.is_some() { 0 } else { 1 })
                                .with_value(v.map(|v| StrBytes::from_string(v.to_owned())))
                        })
                        .collect(),
                ),
        ]);
        let resp = self.send_any(&req).await?;
        self.admin_errors(
            ApiKey::IncrementalAlterConfigs,
            resp.responses
                .iter()
                .map(|r| (r.error_code, r.error_message.as_deref())),
        )
        .await?;
        Ok(())
    }

    /// The finalized level of cluster feature `name` (e.g. `share.version`), from any broker.
    pub async fn feature_level(&self, name: &str) -> Result<Option<i16>> {
        let (_, conn) = self.any_connection().await?;
        Ok(conn.feature(name))
    }

    /// The effective value of broker config `key` on one broker of the cluster (asked of that
    /// broker itself, as broker resources must be), `None` when the broker does not know it.
    pub async fn broker_config(&self, key: &str) -> Result<Option<String>> {
        let (id, conn) = self.any_connection().await?;
        let Some(id) = id else {
            return Ok(None);
        };
        let req = describe_request(CONFIG_RESOURCE_BROKER, &id.to_string(), key);
        let resp = conn.send(&req).await?;
        self.config_value(resp, key).await
    }

    /// The effective value of group config `key` for `group` (the group's own, else the
    /// broker's default the group inherits), `None` when the broker does not know the key.
    pub async fn group_config(&self, group: &str, key: &str) -> Result<Option<String>> {
        self.describe_config(CONFIG_RESOURCE_GROUP, group, key)
            .await
    }

    /// The effective value of topic config `key` for `topic` (its own, else the broker's
    /// default it inherits), `None` when the broker does not know the key.
    pub async fn topic_config(&self, topic: &str, key: &str) -> Result<Option<String>> {
        self.describe_config(CONFIG_RESOURCE_TOPIC, topic, key)
            .await
    }

    /// One config of one resource (DescribeConfigs).
    async fn describe_config(
        &self,
        resource_type: i8,
        name: &str,
        key: &str,
    ) -> Result<Option<String>> {
        let req = describe_request(resource_type, name, key);
        let resp = self.send_any(&req).await?;
        self.config_value(resp, key).await
    }

    /// The value of `key` in a DescribeConfigs answer, or the error it carries.
    async fn config_value(
        &self,
        resp: kafka_protocol::messages::DescribeConfigsResponse,
        key: &str,
    ) -> Result<Option<String>> {
        self.admin_errors(
            ApiKey::DescribeConfigs,
            resp.results
                .iter()
                .map(|r| (r.error_code, r.error_message.as_deref())),
        )
        .await?;
        Ok(resp
            .results
            .iter()
            .flat_map(|r| r.configs.iter())
            .find(|c| c.name.as_str() == key)
            .and_then(|c| c.value.as_ref().map(|v| v.to_string())))
    }

    /// Deletes a topic and forgets its metadata (fault tests take an output topic away).
    pub async fn delete_topic(&self, name: &str) -> Result<()> {
        // By name in the v6 form (every broker of 4.2 or newer speaks it).
        let req = DeleteTopicsRequest::default()
            .with_timeout_ms(30_000)
            .with_topics(vec![
                DeleteTopicState::default()
                    .with_name(Some(TopicName(StrBytes::from_string(name.to_owned())))),
            ]);
        let resp = self.send_any(&req).await?;
        self.admin_errors(
            ApiKey::DeleteTopics,
            resp.responses
                .iter()
                .map(|r| (r.error_code, r.error_message.as_deref())),
        )
        .await?;
        let _ = self.refresh_metadata(&[name.to_owned()]).await;
        Ok(())
    }
}

/// True when `e` says a topic already exists (tests create topics idempotently).
pub fn is_topic_exists(e: &KafkaError) -> bool {
    e.code() == Some(ResponseError::TopicAlreadyExists)
}

/// A DescribeConfigs request for one key of one resource.
fn describe_request(resource_type: i8, name: &str, key: &str) -> DescribeConfigsRequest {
    DescribeConfigsRequest::default().with_resources(vec![
        DescribeConfigsResource::default()
            .with_resource_type(resource_type)
            .with_resource_name(StrBytes::from_string(name.to_owned()))
            .with_configuration_keys(Some(vec![StrBytes::from_string(key.to_owned())])),
    ])
}

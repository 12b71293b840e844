//! The share consumer: the thin I/O loops around the pure state machines. One task heartbeats
//! (membership), one task per partition leader owns a dedicated connection and its share session
//! (ShareFetch with piggybacked acknowledgements), and the caller polls deliveries and records
//! verdicts.
//!
//! Delivery is at-least-once. Every acquired offset ends in exactly one of: handed to the caller
//! (who acknowledges it), acknowledged as Gap (no record), rejected by the delivery cap (reported
//! as poison), or released by the broker when its session or lock ends.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::VersionRange;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::kafka::backoff::{Backoff, BackoffConfig};
use crate::kafka::records::decode_batches;
use crate::kafka::{BrokerConnection, ConsumedRecord, KafkaClient, KafkaError};

use super::ledger::{AckKind, AckLedger, TopicIdPartition};
use super::membership::{HeartbeatAction, MemberState, Membership};
use super::session::{FINAL_EPOCH, SessionOutcome, ShareSession};
use super::wire::{SHARE_VERSIONS, ShareAcknowledgeRequest, ShareFetchRequest, ShareFetchResponse};

/// How the broker should count records against MaxRecords (ShareFetch v2, KIP-1206).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AcquireMode {
    /// Whole batches; MaxRecords is a soft limit (the only mode of v1 brokers).
    #[default]
    BatchOptimized,
    /// At most MaxRecords per request.
    RecordLimit,
}

/// Settings of a share consumer; the defaults mirror the Java client's.
#[derive(Debug, Clone)]
pub struct ShareConsumerConfig {
    /// The share group.
    pub group: String,
    /// Topics to subscribe to.
    pub topics: Vec<String>,
    /// ShareFetch long-poll time (`fetch.max.wait.ms`, 500).
    pub max_wait: Duration,
    /// ShareFetch MinBytes (`fetch.min.bytes`, 1).
    pub min_bytes: i32,
    /// ShareFetch MaxBytes (`fetch.max.bytes`, 50 MiB).
    pub max_bytes: i32,
    /// ShareFetch MaxRecords (`max.poll.records`, 500).
    pub max_records: i32,
    /// ShareFetch BatchSize (the Java client sends max.poll.records).
    pub batch_size: i32,
    /// Acquisition mode.
    pub acquire_mode: AcquireMode,
    /// Most records acquired and not yet acknowledged; fetching pauses at the bound.
    pub max_in_flight: usize,
    /// Records delivered this many times or more are rejected by the engine and reported as
    /// poison instead of being handed out. `None` leaves it to the broker's
    /// `group.share.delivery.count.limit` (which archives silently).
    pub delivery_count_limit: Option<i16>,
}

impl ShareConsumerConfig {
    /// Defaults for a group and its topics.
    pub fn new(group: impl Into<String>, topics: &[&str]) -> Self {
        ShareConsumerConfig {
            group: group.into(),
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
            max_wait: Duration::from_millis(500),
            min_bytes: 1,
            max_bytes: 52_428_800,
            max_records: 500,
            batch_size: 500,
            acquire_mode: AcquireMode::BatchOptimized,
            max_in_flight: 1000,
            delivery_count_limit: None,
        }
    }
}

/// A record this member acquired, with what is needed to acknowledge it.
#[derive(Debug, Clone)]
pub struct ShareRecord {
    /// Topic name.
    pub topic: Arc<str>,
    /// Topic id and partition.
    pub partition: TopicIdPartition,
    /// How many times it has been delivered, this time included.
    pub delivery_count: i16,
    /// The record.
    pub record: ConsumedRecord,
    /// Which session of its leader acquired it; a verdict for an older session is moot.
    session: u64,
    leader: i32,
}

/// What one poll returns.
#[derive(Debug, Default)]
pub struct Delivery {
    /// Records to judge.
    pub records: Vec<ShareRecord>,
    /// Records the delivery cap rejected (already acknowledged as Reject), for dead-lettering.
    pub poison: Vec<ShareRecord>,
}

/// Counters the host exports.
#[derive(Debug, Default)]
pub struct ConsumerStats {
    /// Records handed to the caller.
    pub delivered: AtomicU64,
    /// Offsets acknowledged as Gap.
    pub gaps: AtomicU64,
    /// Records rejected by the delivery cap.
    pub poison: AtomicU64,
    /// Verdicts dropped because their session ended (the broker released those records).
    pub released_by_broker: AtomicU64,
    /// Share sessions re-opened after errors or lost connections.
    pub session_resets: AtomicU64,
    /// Partitions whose acknowledgements the broker refused.
    pub ack_errors: AtomicU64,
}

/// Why the consumer stopped or refused.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    /// The wire layer failed in a way retries cannot fix.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// The group or the broker refused us for good.
    #[error("share consumer stopped: {0}")]
    Fatal(String),
    /// The consumer was closed.
    #[error("the share consumer is closed")]
    Closed,
}

struct Shared {
    client: Arc<KafkaClient>,
    config: ShareConsumerConfig,
    member_id: String,
    ledger: Mutex<AckLedger>,
    in_flight: AtomicUsize,
    wake: Notify,
    sessions: Mutex<HashMap<i32, u64>>,
    next_session: AtomicU64,
    fatal: Mutex<Option<String>>,
    stats: ConsumerStats,
    renew_warned: std::sync::Once,
}

impl Shared {
    fn ledger(&self) -> std::sync::MutexGuard<'_, AckLedger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_fatal(&self, why: String) {
        tracing::error!(group = %self.config.group, "{why}");
        let mut f = self.fatal.lock().unwrap_or_else(|p| p.into_inner());
        f.get_or_insert(why);
    }

    fn current_session(&self, leader: i32) -> Option<u64> {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&leader)
            .copied()
    }
}

/// A running share consumer. Cheap to share: `poll` from one task, `acknowledge` from any.
pub struct ShareConsumer {
    shared: Arc<Shared>,
    deliveries: tokio::sync::Mutex<mpsc::Receiver<Delivery>>,
    cancel: CancellationToken,
    leave: CancellationToken,
    tasks: tokio::sync::Mutex<JoinSet<()>>,
}

impl ShareConsumer {
    /// Joins the group and starts fetching.
    pub async fn start(
        client: Arc<KafkaClient>,
        config: ShareConsumerConfig,
    ) -> Result<ShareConsumer, ShareError> {
        if config.topics.is_empty() {
            return Err(ShareError::Fatal("subscribe to at least one topic".into()));
        }
        client.refresh_metadata(&config.topics).await?;
        let membership = Membership::new(&config.group, &config.topics);
        let shared = Arc::new(Shared {
            client,
            member_id: membership.member_id().to_owned(),
            config,
            ledger: Mutex::new(AckLedger::new()),
            in_flight: AtomicUsize::new(0),
            wake: Notify::new(),
            sessions: Mutex::new(HashMap::new()),
            next_session: AtomicU64::new(1),
            fatal: Mutex::new(None),
            stats: ConsumerStats::default(),
            renew_warned: std::sync::Once::new(),
        });
        let (tx, rx) = mpsc::channel(64);
        let (assign_tx, assign_rx) = watch::channel(BTreeSet::new());
        let cancel = CancellationToken::new();
        let leave = CancellationToken::new();
        let mut tasks = JoinSet::new();
        tasks.spawn(heartbeat_loop(
            shared.clone(),
            membership,
            assign_tx,
            leave.clone(),
        ));
        tasks.spawn(fetch_supervisor(
            shared.clone(),
            assign_rx,
            tx,
            cancel.clone(),
        ));
        Ok(ShareConsumer {
            shared,
            deliveries: tokio::sync::Mutex::new(rx),
            cancel,
            leave,
            tasks: tokio::sync::Mutex::new(tasks),
        })
    }

    /// The member id this consumer uses.
    pub fn member_id(&self) -> &str {
        &self.shared.member_id
    }

    /// Counters.
    pub fn stats(&self) -> &ConsumerStats {
        &self.shared.stats
    }

    /// Records acquired and not yet acknowledged.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// Waits for the next delivery, or `None` after `timeout` passes with nothing delivered.
    ///
    /// # Cancel safety
    /// Cancel safe: a delivery is either returned or stays queued.
    pub async fn poll(&self, timeout: Duration) -> Result<Option<Delivery>, ShareError> {
        if let Some(why) = self
            .shared
            .fatal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Err(ShareError::Fatal(why));
        }
        let mut rx = self.deliveries.lock().await;
        match tokio::time::timeout(timeout, rx.recv()).await {
            Ok(Some(d)) => Ok(Some(d)),
            Ok(None) => Err(ShareError::Closed),
            Err(_) => Ok(None),
        }
    }

    /// Records a verdict for a delivered record. It goes out with the next request to the
    /// record's leader. A verdict for a record whose session ended is dropped (the broker has
    /// already released it) and `false` is returned.
    pub fn acknowledge(&self, record: &ShareRecord, kind: AckKind) -> Result<bool, ShareError> {
        if kind == AckKind::Renew {
            return Err(ShareError::Fatal(
                "renew is not implemented yet in this engine".into(),
            ));
        }
        let current = self.shared.current_session(record.leader);
        let release = || {
            self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
            self.shared.wake.notify_waiters();
        };
        if current != Some(record.session) {
            self.shared
                .stats
                .released_by_broker
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                offset = record.record.offset,
                "verdict for a record of an ended session dropped"
            );
            release();
            return Ok(false);
        }
        self.shared
            .ledger()
            .record(record.partition, record.record.offset, kind)
            .map_err(|e| ShareError::Fatal(e.to_string()))?;
        release();
        Ok(true)
    }

    /// Stops fetching, sends pending verdicts, closes every share session (releasing what is
    /// unjudged at once) and leaves the group, all within `timeout`.
    pub async fn close(&self, timeout: Duration) {
        self.cancel.cancel();
        self.shared.wake.notify_waiters();
        let mut tasks = self.tasks.lock().await;
        let drain = async {
            // Fetch tasks close their sessions first; the heartbeat task leaves after them.
            while let Some(r) = tasks.join_next().await {
                if let Err(e) = r {
                    tracing::warn!("consumer task ended abnormally: {e}");
                }
                if tasks.len() == 1 {
                    self.leave.cancel();
                }
            }
        };
        if tokio::time::timeout(timeout, drain).await.is_err() {
            tracing::warn!(group = %self.shared.config.group, "close timed out; aborting the consumer tasks");
            tasks.abort_all();
        }
    }
}

impl Drop for ShareConsumer {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.leave.cancel();
    }
}

async fn heartbeat_loop(
    shared: Arc<Shared>,
    mut membership: Membership,
    assign_tx: watch::Sender<BTreeSet<TopicIdPartition>>,
    leave: CancellationToken,
) {
    let client = &shared.client;
    let mut backoff = Backoff::new(BackoffConfig::default());
    let mut coordinator: Option<Arc<BrokerConnection>> = None;
    loop {
        if leave.is_cancelled() {
            membership.leave();
        }
        let Some(req) = membership.heartbeat() else {
            break;
        };
        let conn = match &coordinator {
            Some(c) if !c.is_dead() => c.clone(),
            _ => match async {
                client
                    .connection(client.find_coordinator(membership.group()).await?)
                    .await
            }
            .await
            {
                Ok(c) => {
                    coordinator = Some(c.clone());
                    c
                }
                Err(e) => {
                    if e.class() == crate::kafka::ErrorClass::Fatal {
                        shared.set_fatal(format!(
                            "group {}: cannot reach the coordinator: {e}",
                            membership.group()
                        ));
                        break;
                    }
                    tracing::warn!(group = membership.group(), "finding the coordinator: {e}");
                    if leave.is_cancelled() {
                        break;
                    }
                    backoff.wait().await;
                    continue;
                }
            },
        };
        let action = match conn.send(&req).await {
            Ok(resp) => membership.on_response(&resp),
            Err(e) => {
                tracing::warn!(group = membership.group(), "heartbeat failed: {e}");
                membership.on_transport_error()
            }
        };
        // Publish the assignment (ids to names and leaders happen on the fetch side).
        if *assign_tx.borrow() != *membership.assignment() {
            let _ = assign_tx.send(membership.assignment().clone());
        }
        if let MemberState::Fatal(why) = membership.state() {
            shared.set_fatal(why.clone());
            shared.wake.notify_waiters();
            break;
        }
        match action {
            HeartbeatAction::Stop => break,
            HeartbeatAction::Now => backoff.reset(),
            HeartbeatAction::Wait(d) => {
                backoff.reset();
                tokio::select! {
                    _ = tokio::time::sleep(d) => {}
                    _ = leave.cancelled() => {}
                }
            }
            HeartbeatAction::Backoff => {
                backoff.wait().await;
            }
            HeartbeatAction::RefindCoordinator => {
                coordinator = None;
                backoff.wait().await;
            }
        }
    }
    let _ = assign_tx.send(BTreeSet::new());
}

/// Maps the assignment to leaders and keeps one fetch task per leader.
async fn fetch_supervisor(
    shared: Arc<Shared>,
    mut assign_rx: watch::Receiver<BTreeSet<TopicIdPartition>>,
    tx: mpsc::Sender<Delivery>,
    cancel: CancellationToken,
) {
    let mut leaders: HashMap<i32, watch::Sender<BTreeSet<TopicIdPartition>>> = HashMap::new();
    let mut tasks = JoinSet::new();
    let mut refresh_every = tokio::time::interval(Duration::from_secs(30));
    loop {
        let assignment = assign_rx.borrow_and_update().clone();
        let mut by_leader: BTreeMap<i32, BTreeSet<TopicIdPartition>> = BTreeMap::new();
        let mut unknown = false;
        for tp in &assignment {
            let leader = shared
                .client
                .topic_name(tp.topic_id)
                .and_then(|name| shared.client.leader(&name, tp.partition));
            match leader {
                Some(l) => {
                    by_leader.entry(l).or_default().insert(*tp);
                }
                None => unknown = true,
            }
        }
        if unknown {
            // A topic id we cannot name or a partition without a leader: refresh metadata.
            let _ = shared.client.refresh_metadata(&shared.config.topics).await;
        }
        for (leader, set) in &by_leader {
            match leaders.get(leader) {
                Some(w) => {
                    let _ = w.send(set.clone());
                }
                None => {
                    let (w, r) = watch::channel(set.clone());
                    leaders.insert(*leader, w);
                    tasks.spawn(leader_loop(
                        shared.clone(),
                        *leader,
                        r,
                        tx.clone(),
                        cancel.clone(),
                    ));
                }
            }
        }
        for (leader, w) in &leaders {
            if !by_leader.contains_key(leader) {
                let _ = w.send(BTreeSet::new());
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            r = assign_rx.changed() => if r.is_err() { break },
            _ = refresh_every.tick() => {
                let _ = shared.client.refresh_metadata(&shared.config.topics).await;
            }
            _ = tokio::time::sleep(Duration::from_millis(200)), if unknown => {}
        }
    }
    while tasks.join_next().await.is_some() {}
}

fn fetch_version(conn: &BrokerConnection) -> Result<i16, KafkaError> {
    conn.version_for(ApiKey::ShareFetch, SHARE_VERSIONS)
}

/// One leader: a dedicated connection, one share session, strictly one request at a time.
async fn leader_loop(
    shared: Arc<Shared>,
    leader: i32,
    mut wanted_rx: watch::Receiver<BTreeSet<TopicIdPartition>>,
    tx: mpsc::Sender<Delivery>,
    cancel: CancellationToken,
) {
    let cfg = &shared.config;
    let mut backoff = Backoff::new(BackoffConfig::default());
    'connect: loop {
        if cancel.is_cancelled() {
            return;
        }
        let conn = match shared.client.dedicated_connection(leader).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(leader, "share connection: {e}");
                if !backoff.wait().await || cancel.is_cancelled() {
                    return;
                }
                continue;
            }
        };
        let version = match fetch_version(&conn) {
            Ok(v) => v,
            Err(e) => {
                shared.set_fatal(e.to_string());
                return;
            }
        };
        if version < 2 {
            shared.renew_warned.call_once(|| {
                tracing::warn!(leader, "broker offers ShareFetch v1 only: renew and record-limit acquisition are unavailable");
            });
        }
        let mut session = ShareSession::new();
        let session_id = shared.next_session.fetch_add(1, Ordering::Relaxed);
        shared
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(leader, session_id);
        loop {
            let wanted = wanted_rx.borrow_and_update().clone();
            let serves =
                |tp: &TopicIdPartition| wanted.contains(tp) || session.partitions().contains(tp);
            if cancel.is_cancelled() {
                close_session(&shared, &conn, &mut session, version).await;
                return;
            }
            let acks = if session.is_opening() {
                Vec::new()
            } else {
                shared.ledger().take(serves, false)
            };
            if wanted.is_empty() && session.partitions().is_empty() && acks.is_empty() {
                // Nothing to serve: wait for an assignment or the end.
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    r = wanted_rx.changed() => if r.is_err() { return },
                }
                continue;
            }
            let in_flight = shared.in_flight.load(Ordering::Relaxed);
            let budget = cfg.max_in_flight.saturating_sub(in_flight);
            let fetching = budget > 0 && !wanted.is_empty();
            if !fetching && acks.is_empty() && !session.is_opening() {
                // At the in-flight bound with nothing to send: wait for verdicts.
                tokio::select! {
                    _ = shared.wake.notified() => {}
                    _ = cancel.cancelled() => {}
                    _ = wanted_rx.changed() => {}
                    _ = tokio::time::sleep(cfg.max_wait) => {}
                }
                continue;
            }
            let part = match session.fetch_request(&wanted, acks) {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(leader, "share session bug: {e}");
                    return;
                }
            };
            let limit = |v: i32| if fetching { v } else { 0 };
            let req = ShareFetchRequest {
                group_id: cfg.group.clone(),
                member_id: shared.member_id.clone(),
                share_session_epoch: part.epoch,
                max_wait_ms: limit(cfg.max_wait.as_millis() as i32),
                min_bytes: limit(cfg.min_bytes),
                max_bytes: limit(cfg.max_bytes),
                max_records: limit(cfg.max_records.min(budget.min(i32::MAX as usize) as i32)),
                batch_size: limit(cfg.batch_size),
                share_acquire_mode: if version >= 2 && cfg.acquire_mode == AcquireMode::RecordLimit
                {
                    1
                } else {
                    0
                },
                is_renew_ack: false,
                topics: part.topics,
                forgotten_topics: part.forgotten,
            };
            let timeout = conn.request_timeout() + cfg.max_wait;
            let resp = conn.send_version(&req, version, timeout).await;
            match resp {
                Err(e) => {
                    // No response: the session is gone with the connection, and so are our locks.
                    session.on_response(None, true, None);
                    on_session_lost(&shared, leader, &format!("{e}"));
                    conn.close("share session lost");
                    if !backoff.wait().await {
                        return;
                    }
                    continue 'connect;
                }
                Ok(resp) => {
                    backoff.reset();
                    let top = ResponseError::try_from_code(resp.error_code);
                    if session.on_response(top, false, Some(&part.wanted)) == SessionOutcome::Reset
                    {
                        on_session_lost(&shared, leader, &format!("{top:?}"));
                        let id = shared.next_session.fetch_add(1, Ordering::Relaxed);
                        shared
                            .sessions
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(leader, id);
                        continue 'connect;
                    }
                    if let Some(err) = top {
                        let msg = resp.error_message.clone().unwrap_or_default();
                        match crate::kafka::classify(err) {
                            crate::kafka::ErrorClass::Fatal => {
                                shared.set_fatal(format!(
                                    "ShareFetch to broker {leader} failed with {err:?}: {msg}"
                                ));
                                return;
                            }
                            _ => {
                                tracing::warn!(leader, "ShareFetch: {err:?} {msg}");
                                let _ = shared.client.refresh_metadata(&cfg.topics).await;
                                backoff.wait().await;
                                continue;
                            }
                        }
                    }
                    let delivery = process_response(&shared, leader, session_id, &resp);
                    if (!delivery.records.is_empty() || !delivery.poison.is_empty())
                        && tx.send(delivery).await.is_err()
                    {
                        return;
                    }
                }
            }
        }
    }
}

fn on_session_lost(shared: &Shared, leader: i32, why: &str) {
    shared.stats.session_resets.fetch_add(1, Ordering::Relaxed);
    // Everything acquired through this session was released by the broker; pending verdicts
    // for it can no longer be sent, and delivered-but-unjudged records are moot.
    let dropped = {
        let client = &shared.client;
        shared.ledger().drop_where(|tp| {
            client
                .topic_name(tp.topic_id)
                .and_then(|n| client.leader(&n, tp.partition))
                .is_some_and(|l| l == leader)
        })
    };
    shared
        .stats
        .released_by_broker
        .fetch_add(dropped as u64, Ordering::Relaxed);
    shared
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&leader);
    tracing::warn!(
        leader,
        dropped,
        "share session ended ({why}); the broker releases what it held"
    );
}

fn process_response(
    shared: &Shared,
    leader: i32,
    session: u64,
    resp: &ShareFetchResponse,
) -> Delivery {
    let mut delivery = Delivery::default();
    let limit = shared.config.delivery_count_limit;
    for t in &resp.responses {
        let topic: Arc<str> = match shared.client.topic_name(t.topic_id) {
            Some(n) => Arc::from(n.as_str()),
            None => Arc::from(t.topic_id.to_string().as_str()),
        };
        for p in &t.partitions {
            let tp = TopicIdPartition {
                topic_id: t.topic_id,
                partition: p.partition,
            };
            if p.acknowledge_error_code != 0 {
                shared.stats.ack_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    topic = %topic, partition = p.partition,
                    "acknowledgements refused: {} {}",
                    crate::kafka::error::CodeDisplay(p.acknowledge_error_code),
                    p.acknowledge_error_message.as_deref().unwrap_or("")
                );
            }
            if p.error_code != 0 {
                tracing::warn!(topic = %topic, partition = p.partition, "fetch error {}", crate::kafka::error::CodeDisplay(p.error_code));
                continue;
            }
            if p.acquired.is_empty() {
                continue;
            }
            let records = match decode_batches(p.records.clone()) {
                Ok(r) => r,
                Err(e) => {
                    // Undecodable data: release what we acquired so it is not stuck until the
                    // lock expires (the Java client rejects on CRC errors; we prefer a retry).
                    tracing::error!(topic = %topic, partition = p.partition, "cannot decode records: {e}");
                    let mut ledger = shared.ledger();
                    for a in &p.acquired {
                        for o in a.first_offset..=a.last_offset {
                            let _ = ledger.record(tp, o, AckKind::Release);
                        }
                    }
                    continue;
                }
            };
            let by_offset: HashMap<i64, &ConsumedRecord> =
                records.iter().map(|r| (r.offset, r)).collect();
            for a in &p.acquired {
                for o in a.first_offset..=a.last_offset {
                    let Some(rec) = by_offset.get(&o) else {
                        let _ = shared.ledger().record(tp, o, AckKind::Gap);
                        shared.stats.gaps.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let sr = ShareRecord {
                        topic: topic.clone(),
                        partition: tp,
                        delivery_count: a.delivery_count,
                        record: (*rec).clone(),
                        session,
                        leader,
                    };
                    if limit.is_some_and(|l| a.delivery_count >= l) {
                        let _ = shared.ledger().record(tp, o, AckKind::Reject);
                        shared.stats.poison.fetch_add(1, Ordering::Relaxed);
                        delivery.poison.push(sr);
                    } else {
                        shared.in_flight.fetch_add(1, Ordering::Relaxed);
                        shared.stats.delivered.fetch_add(1, Ordering::Relaxed);
                        delivery.records.push(sr);
                    }
                }
            }
        }
    }
    delivery
}

/// Sends pending verdicts and closes the session (epoch -1), which releases everything this
/// member still holds on that broker at once.
async fn close_session(
    shared: &Shared,
    conn: &BrokerConnection,
    session: &mut ShareSession,
    version: i16,
) {
    if session.is_opening() {
        return;
    }
    let acks = shared
        .ledger()
        .take(|tp| session.partitions().contains(tp), false);
    let timeout = conn.request_timeout();
    let result = if acks.is_empty() {
        let req = ShareFetchRequest {
            group_id: shared.config.group.clone(),
            member_id: shared.member_id.clone(),
            share_session_epoch: FINAL_EPOCH,
            ..Default::default()
        };
        conn.send_version(&req, version, timeout)
            .await
            .map(|r| r.error_code)
    } else {
        let topics = acks
            .into_iter()
            .fold(BTreeMap::<Uuid, Vec<_>>::new(), |mut m, (tp, b)| {
                m.entry(tp.topic_id)
                    .or_default()
                    .push(super::wire::PartitionAcks {
                        partition: tp.partition,
                        batches: b,
                    });
                m
            })
            .into_iter()
            .map(|(topic_id, partitions)| super::wire::TopicAcks {
                topic_id,
                partitions,
            })
            .collect();
        let req = ShareAcknowledgeRequest {
            group_id: shared.config.group.clone(),
            member_id: shared.member_id.clone(),
            share_session_epoch: FINAL_EPOCH,
            is_renew_ack: false,
            topics,
        };
        let v = conn
            .version_for(
                ApiKey::ShareAcknowledge,
                VersionRange {
                    min: 1,
                    max: version,
                },
            )
            .unwrap_or(version);
        conn.send_version(&req, v, timeout)
            .await
            .map(|r| r.error_code)
    };
    match result {
        Ok(0) => {}
        Ok(code) => tracing::warn!(
            "closing the share session: {}",
            crate::kafka::error::CodeDisplay(code)
        ),
        Err(e) => tracing::warn!("closing the share session: {e}"),
    }
    session.closed();
}

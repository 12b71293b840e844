//! The share consumer: thin I/O loops around the pure state machines. One task heartbeats
//! (membership), one task per partition leader owns a dedicated connection and its share session
//! (ShareFetch with piggybacked acknowledgements, renew requests, the closing request), and the
//! caller polls deliveries and records verdicts from any task.
//!
//! Delivery is at-least-once. Every acquired offset ends in exactly one of: handed to the caller
//! (who gives it a verdict), acknowledged as Gap (no record at that offset), rejected by the
//! delivery cap (and reported as poison), or released by the broker when its session or lock
//! ends (counted in [`ConsumerStats::released_by_broker`]).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::ApiKey;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use sharehost_kafka::backoff::{Backoff, BackoffConfig};
use sharehost_kafka::error::CodeDisplay;
use sharehost_kafka::records::{batch_spans, decode_batches};
use sharehost_kafka::{
    BrokerConnection, ConsumedRecord, ErrorClass, KafkaClient, KafkaError, classify,
};

use super::ledger::{AckKind, AckLedger, TopicIdPartition};
use super::membership::{HeartbeatAction, MemberState, Membership};
use super::session::{FINAL_EPOCH, SessionOutcome, ShareSession};
use sharehost_kafka::protocol::share::{
    AckBatch, PartitionAcks, SHARE_VERSIONS, ShareAcknowledgeRequest, ShareFetchRequest,
    ShareFetchResponse, TopicAcks,
};

/// How the broker counts records against MaxRecords (ShareFetch v2, KIP-1206).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AcquireMode {
    /// Whole batches; MaxRecords is a soft limit (the only mode of v1 brokers).
    #[default]
    BatchOptimized,
    /// At most MaxRecords per request, so `max_in_flight` is a hard bound. A producer batch
    /// the limit cuts is tracked by the broker offset by offset (a lock timer per record and
    /// an acquired range per record for the rest): on batches of thousands of records that
    /// costs the broker several times its batch-wise work.
    RecordLimit,
    /// Whole batches whenever the room left holds the largest batch this consumer has seen
    /// (MaxRecords lowered so that the last batch the broker adds still fits), record-limit
    /// otherwise (before the first batch is seen, and when batches are larger than the
    /// room). In flight stays within `max_in_flight` unless a partition brings a batch larger
    /// than any seen before; that fetch passes it by less than that batch, and later fetches
    /// allow for it. Needs ShareFetch v2 for the record-limit part (v1: whole batches).
    Fitted,
}

/// Whether the acquired range `first..=last` covers only part of the producer batch it starts
/// in (`spans`: the response's batches, in offset order).
fn cuts_a_batch(spans: &[(i64, i64)], first: i64, last: i64) -> bool {
    let at = spans.partition_point(|&(_, end)| end < first);
    spans
        .get(at)
        .is_some_and(|&(start, end)| start <= first && (start < first || end > last))
}

/// What one ShareFetch asks for: its acquire mode and MaxRecords, and how many records it
/// can bring at most (the room it reserves).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FetchAsk {
    record_limit: bool,
    max_records: usize,
    at_most: usize,
}

/// Chooses [`FetchAsk`] for `budget` records of room: `largest_batch` is the most records one
/// producer batch has spanned so far (0: none seen), `max_records` the configured cap and
/// `v2` whether the broker knows record-limit mode.
fn fetch_ask(
    mode: AcquireMode,
    budget: usize,
    largest_batch: usize,
    max_records: usize,
    v2: bool,
) -> FetchAsk {
    let max_records = max_records.max(1).min(budget.max(1));
    let whole = |max_records: usize| FetchAsk {
        record_limit: false,
        max_records,
        // A batch-optimized fetch stops once MaxRecords are reached, with the last batch whole.
        at_most: max_records.saturating_add(largest_batch.saturating_sub(1)),
    };
    let limited = FetchAsk {
        record_limit: true,
        max_records,
        at_most: max_records,
    };
    match mode {
        AcquireMode::BatchOptimized => whole(max_records),
        AcquireMode::RecordLimit if v2 => limited,
        AcquireMode::RecordLimit => whole(max_records),
        AcquireMode::Fitted if !v2 => whole(max_records),
        AcquireMode::Fitted => {
            if largest_batch == 0 || budget < largest_batch {
                return limited;
            }
            whole(max_records.min(budget - largest_batch + 1))
        }
    }
}

/// Settings of a share consumer; the fetch defaults mirror the Java client's.
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
    /// Most records acquired and not yet judged; fetching pauses at the bound and resumes as
    /// verdicts arrive. Batch-optimized acquisition may overshoot by part of one batch.
    pub max_in_flight: usize,
    /// Records delivered this many times or more are rejected by the engine and reported as
    /// poison instead of being handed out. Keep it below the broker's
    /// `group.share.delivery.count.limit` (default 5): at the broker's limit a released record
    /// is archived silently, so a cap at or above it would never see the record.
    /// `None` leaves poison handling to the broker alone.
    pub delivery_count_limit: Option<i16>,
    /// When true (the default) the engine acknowledges capped records as Reject itself. When
    /// false it hands them out in [`Delivery::poison`] still acquired, so the caller can first
    /// dead-letter them and then Reject (or Release when dead-lettering failed).
    pub reject_poison: bool,
    /// Renew records held longer than this fraction of the lock duration automatically (KIP-1222;
    /// needs ShareFetch v2). `None` renews only when the caller asks.
    pub auto_renew_after: Option<f64>,
    /// Acquire no more than the caller judges in this long at its measured rate (and in half
    /// the lock duration), but at least `min_in_flight`: what a stop or a crash hands back
    /// then stays small, whatever `max_in_flight` allows. `None`: up to `max_in_flight`.
    pub pace_within: Option<Duration>,
    /// The least a paced consumer keeps acquired (say a batch per concurrent handler), so a
    /// slow start or an idle spell never starves the caller.
    pub min_in_flight: usize,
    /// The member id to join with (one kept across restarts, so a restarted host rejoins as
    /// the same member); `None`: a fresh one.
    pub member_id: Option<String>,
    /// Told the time of every ShareFetch and ShareAcknowledge round trip (latency metrics).
    pub observer: Option<Arc<dyn RoundTrips>>,
    /// The group's delivery limit (`share.delivery.count.limit`) when known: a record released
    /// at that delivery is archived by the broker, and counted in
    /// [`ConsumerStats::released_at_limit`].
    pub archive_at: Option<i16>,
}

/// Which request a round trip was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundTrip {
    /// A ShareFetch (its long-poll wait included, as Kafka's own fetch latency counts it).
    Fetch,
    /// A standalone ShareAcknowledge (renewals included).
    Acknowledge,
}

/// Receives the time of each request the engine makes to a share leader, failed ones
/// included, so the caller can keep latency histograms without the engine knowing metrics.
pub trait RoundTrips: Send + Sync {
    /// One `kind` request took `took`.
    fn took(&self, kind: RoundTrip, took: Duration);
}

impl std::fmt::Debug for dyn RoundTrips {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RoundTrips")
    }
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
            reject_poison: true,
            auto_renew_after: None,
            pace_within: None,
            min_in_flight: 1,
            member_id: None,
            observer: None,
            archive_at: None,
        }
    }
}

/// A record this member acquired, with what is needed to judge it.
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
    /// Which session acquired it: a verdict for an ended session is moot.
    session: u64,
}

impl ShareRecord {
    fn key(&self) -> (TopicIdPartition, i64) {
        (self.partition, self.record.offset)
    }
}

/// How long before a record's lock runs out a record the caller holds back is released (on a
/// broker that cannot renew it), so the release lands while the record is still ours.
pub const LOCK_MARGIN: Duration = Duration::from_secs(1);

/// What the caller decided for a record it holds ([`ShareConsumer::settle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// A verdict for the broker (Accept, Release or Reject).
    Final(AckKind),
    /// Extend its lock and deliver it again to be judged; at most `max` times in all for this
    /// delivery, then (or on a broker without renew) it is released instead.
    Renew {
        /// Most renewals of one delivery.
        max: u32,
    },
    /// Keep it for this long (cut to the time its lock has left, when the engine does not
    /// renew it by itself), then release it for redelivery: the engine does the release.
    Hold(Duration),
}

/// What became of one decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// The verdict was recorded; it goes out with the next request to the record's leader.
    Taken,
    /// Renewed: [`ShareConsumer::poll`] delivers it again.
    Renewed,
    /// Out of renewals (or the broker cannot renew): released.
    RenewsSpent,
    /// Held back for this long before its release (zero: released now, its lock had no
    /// time left).
    Held(Duration),
    /// No longer this caller's (its session ended or it was settled already): nothing done.
    Moot,
    /// Refused as invalid (a Gap, or a verdict the ledger cannot take), with why.
    Refused(String),
}

/// What one poll returns.
#[derive(Debug, Default)]
pub struct Delivery {
    /// Records to judge.
    pub records: Vec<ShareRecord>,
    /// Records at the delivery cap, for dead-lettering: already rejected by the engine, or
    /// (with `reject_poison` off) still acquired and waiting for the caller's verdict.
    pub poison: Vec<ShareRecord>,
}

/// The broker's answer to the acknowledgements of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckOutcome {
    /// Topic name.
    pub topic: Arc<str>,
    /// Partition index.
    pub partition: i32,
    /// What was sent.
    pub batches: Vec<AckBatch>,
    /// `None` when the broker applied them; otherwise its error code and message. Acks are
    /// atomic per partition: an error means none of these batches took effect.
    pub error: Option<(ResponseError, String)>,
}

impl AckOutcome {
    /// Number of offsets covered.
    pub fn offsets(&self) -> u64 {
        self.batches
            .iter()
            .map(|b| (b.last_offset - b.first_offset + 1) as u64)
            .sum()
    }
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
    /// Records the broker released because their session ended before a verdict went out.
    pub released_by_broker: AtomicU64,
    /// Share sessions re-opened after errors or lost connections.
    pub session_resets: AtomicU64,
    /// Offsets whose acknowledgement the broker confirmed.
    pub acks_ok: AtomicU64,
    /// Offsets whose acknowledgement the broker refused.
    pub acks_failed: AtomicU64,
    /// Records renewed (lock extended).
    pub renewed: AtomicU64,
    /// Times the coordinator changed this member's assignment (share-group rebalances).
    pub assignment_changes: AtomicU64,
    /// ShareFetch requests sent.
    pub fetches: AtomicU64,
    /// Records those fetches acquired (with `fetches`: records per ShareFetch).
    pub acquired: AtomicU64,
    /// Acquired ranges that cover only part of their producer batch: the broker tracks such a
    /// batch offset by offset, with a lock timer per record (several times its batch-wise
    /// cost). Fitted acquisition keeps this near zero when batches fit the bound.
    pub acquired_split: AtomicU64,
    /// The most records ever held at once (never above `max_in_flight`).
    pub in_flight_peak: AtomicU64,
    /// Records released at their last delivery (the group's delivery limit, when known): the
    /// broker archives them instead of delivering them again.
    pub released_at_limit: AtomicU64,
}

/// Why the consumer stopped or refused a call.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    /// The wire layer failed in a way retries cannot fix.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// The group or the broker refused us for good.
    #[error("share consumer stopped: {0}")]
    Fatal(String),
    /// The caller asked for something this consumer cannot do.
    #[error("{0}")]
    Invalid(String),
    /// The consumer was closed.
    #[error("the share consumer is closed")]
    Closed,
}

/// Most outcomes kept for the caller; older ones are dropped (and counted) if nobody reads them.
const MAX_OUTCOMES: usize = 100_000;

/// Which leader serves each partition (looked up per record of every batch, hence the fast
/// hasher).
type Route = foldhash::HashMap<TopicIdPartition, i32>;

/// Per-leader bookkeeping shared between the caller and the leader's task.
#[derive(Default)]
struct LeaderState {
    /// Current session id; verdicts for records of other sessions are moot.
    session: u64,
    /// Delivered records without a final verdict, with what the engine keeps of each.
    outstanding: foldhash::HashMap<(TopicIdPartition, i64), Held>,
    /// Records the caller holds back (`Settle::Hold`), earliest release first; an entry whose
    /// record was settled otherwise meanwhile (or delivered again) is skipped when it is due.
    holds: BinaryHeap<Reverse<(Instant, TopicIdPartition, i64)>>,
    /// Lock duration the broker reported.
    lock_timeout: Option<Duration>,
    /// The task's connection, so a test can cut it.
    conn: Option<Arc<BrokerConnection>>,
    /// Whether the broker speaks ShareFetch v2.
    renew_supported: bool,
    /// When the next auto-renew scan can find a record due, and the threshold that was
    /// computed with: the scan walks every outstanding record, so it runs only then, not on
    /// every step of the leader's loop.
    next_renew_scan: Option<(Instant, Duration)>,
}

impl LeaderState {
    /// Holds a record the broker just acquired for this member, its lock started `now`;
    /// returns whether it was not held already. A record whose lock expired while the caller
    /// still held it comes back in the same session under the same key: it is one record held
    /// all the same (the first final verdict for either copy settles it, the other is moot),
    /// so the in-flight count takes it once.
    fn hold(&mut self, key: (TopicIdPartition, i64), now: Instant, deliveries: i16) -> bool {
        self.outstanding
            .insert(key, Held::new(now, deliveries))
            .is_none()
    }

    /// Forgets the outstanding records of `partitions` (their leadership moved away, so their
    /// locks went with it); returns how many there were.
    fn release(&mut self, partitions: &BTreeSet<TopicIdPartition>) -> usize {
        let before = self.outstanding.len();
        self.outstanding
            .retain(|(tp, _), _| !partitions.contains(tp));
        before - self.outstanding.len()
    }

    /// How much longer `held` can stay acquired without a verdict (see
    /// [`ShareConsumer::hold_limit`]).
    fn hold_limit(&self, held: &Held, auto_renew: bool) -> Option<Duration> {
        if self.renew_supported && auto_renew {
            return None;
        }
        Some(
            self.lock_timeout
                .map_or(Duration::ZERO, |t| t.saturating_sub(held.since.elapsed())),
        )
    }

    /// Takes the held-back records whose release is due by `now` (those still held back for
    /// that time); returns them and when the next one is due.
    fn due_holds(&mut self, now: Instant) -> (Vec<(RecordKey, Held)>, Option<Instant>) {
        let mut due = Vec::new();
        while let Some(Reverse((at, tp, offset))) = self.holds.peek().copied() {
            if at > now {
                return (due, Some(at));
            }
            self.holds.pop();
            let key = (tp, offset);
            if self
                .outstanding
                .get(&key)
                .is_some_and(|h| h.release_at == Some(at))
                && let Some(held) = self.outstanding.remove(&key)
            {
                due.push((key, held));
            }
        }
        (due, None)
    }
}

/// A record by partition and offset.
type RecordKey = (TopicIdPartition, i64);

/// What the engine keeps of a record it delivered and has no final verdict for: when its lock
/// (re)started, how often the caller renewed it, and when a record the caller holds back is
/// to be released. One place for all three, so no caller keeps maps of its own beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    since: Instant,
    /// Its delivery count (a release at the group's delivery limit archives it).
    deliveries: i16,
    renewals: u32,
    release_at: Option<Instant>,
}

impl Held {
    fn new(now: Instant, deliveries: i16) -> Self {
        Held {
            since: now,
            deliveries,
            renewals: 0,
            release_at: None,
        }
    }
}

struct Shared {
    client: Arc<KafkaClient>,
    config: ShareConsumerConfig,
    member_id: String,
    ledger: Mutex<AckLedger>,
    leaders: Mutex<HashMap<i32, LeaderState>>,
    /// Which leader serves a partition (for routing verdicts to sessions).
    route: Mutex<Route>,
    in_flight: AtomicUsize,
    /// Records asked for by fetches not answered yet: their room is taken until then, so
    /// leaders fetching at once never ask for more than the bound together.
    reserved: AtomicUsize,
    /// The most records one producer batch has spanned in any response (0: none yet), so a
    /// fitted fetch knows what a whole batch can add.
    largest_batch: AtomicUsize,
    /// Final verdicts recorded (the caller's judging rate, for pacing).
    finals: AtomicU64,
    /// Leaders serving assigned partitions now (each fetches within its share of the bound).
    active_leaders: AtomicUsize,
    /// Whether fetches may acquire more (off while a caller drains what it holds).
    acquiring: std::sync::atomic::AtomicBool,
    /// Whether the coordinator answered the last heartbeat as a member of the group.
    joined: std::sync::atomic::AtomicBool,
    pace: Mutex<Pace>,
    /// Requests carrying acknowledgements that have not been answered yet.
    acks_in_flight: AtomicUsize,
    /// Verdicts arrived or the in-flight count dropped: leader tasks may have work.
    wake: Notify,
    /// Acknowledgements answered: flush may be done.
    acked: Notify,
    /// Leadership may have moved: remap partitions to leaders.
    remap: Notify,
    next_session: AtomicU64,
    outcomes: Mutex<VecDeque<AckOutcome>>,
    /// Records the caller renewed, to be delivered to it again (ahead of newly fetched ones).
    again: Mutex<Vec<ShareRecord>>,
    /// Something was put in `again`: a waiting `poll` returns it.
    again_ready: Notify,
    fatal: Mutex<Option<String>>,
    stats: ConsumerStats,
    /// The "no v2 here" warning is said once per consumer, not once per reconnect.
    v1_warned: std::sync::Once,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means a task panicked mid-update of plain bookkeeping; keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Room a fetch in flight has taken from the in-flight bound, given back when the fetch is
/// answered or dropped (a leader task aborted mid-request must not shrink the bound for good).
struct Reservation {
    shared: Arc<Shared>,
    records: usize,
}

impl Reservation {
    fn take(shared: &Arc<Shared>, records: usize) -> Self {
        shared.reserved.fetch_add(records, Ordering::AcqRel);
        Reservation {
            shared: shared.clone(),
            records,
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.shared
            .reserved
            .fetch_sub(self.records, Ordering::AcqRel);
    }
}

/// The caller's judging rate, measured over windows of at least [`PACE_WINDOW`].
#[derive(Debug, Default)]
struct Pace {
    window: Option<(Instant, u64)>,
    /// Final verdicts per second (an average over the last windows; 0 before the first).
    rate: f64,
}

/// Shortest window over which the judging rate is measured.
const PACE_WINDOW: Duration = Duration::from_secs(1);

impl Pace {
    /// Folds in the verdict count `finals` seen at `now`; returns the rate.
    fn update(&mut self, now: Instant, finals: u64) -> f64 {
        match self.window {
            None => self.window = Some((now, finals)),
            Some((start, at_start)) => {
                let elapsed = now.duration_since(start);
                if elapsed >= PACE_WINDOW {
                    let rate = finals.saturating_sub(at_start) as f64 / elapsed.as_secs_f64();
                    // Half the weight on the newest window: a slowing handler is followed
                    // within a few seconds, a burst does not swing the bound at once.
                    self.rate = if self.rate == 0.0 {
                        rate
                    } else {
                        (self.rate + rate) / 2.0
                    };
                    self.window = Some((now, finals));
                }
            }
        }
        self.rate
    }
}

/// How many records a paced consumer keeps acquired: what it judges within `horizon` at
/// `rate` per second, between `floor` and `max`.
fn paced_limit(rate: f64, horizon: Duration, floor: usize, max: usize) -> usize {
    let judged = (rate * horizon.as_secs_f64()).ceil();
    let judged = if judged.is_finite() && judged < max as f64 {
        judged as usize
    } else {
        max
    };
    judged.max(floor).min(max)
}

impl Shared {
    /// Counts `finals` verdicts out of the in-flight bound (and into the pacing rate), and
    /// `at_limit` releases at the group's delivery limit.
    fn counted_finals(&self, finals: usize, at_limit: u64) {
        if finals > 0 {
            self.in_flight.fetch_sub(
                finals.min(self.in_flight.load(Ordering::Relaxed)),
                Ordering::Relaxed,
            );
            self.finals.fetch_add(finals as u64, Ordering::Relaxed);
        }
        if at_limit > 0 {
            self.stats
                .released_at_limit
                .fetch_add(at_limit, Ordering::Relaxed);
        }
    }

    /// How many records this consumer may hold now: 0 while it does not acquire, else
    /// `max_in_flight`, or with pacing what the caller judges within the pace horizon.
    fn in_flight_limit(&self) -> usize {
        if !self.acquiring.load(Ordering::Relaxed) {
            return 0;
        }
        let cfg = &self.config;
        let Some(within) = cfg.pace_within else {
            return cfg.max_in_flight;
        };
        let lock_timeout = lock(&self.leaders)
            .values()
            .filter_map(|l| l.lock_timeout)
            .min();
        let horizon = lock_timeout.map_or(within, |t| within.min(t / 2));
        let rate = lock(&self.pace).update(Instant::now(), self.finals.load(Ordering::Relaxed));
        paced_limit(rate, horizon, cfg.min_in_flight.max(1), cfg.max_in_flight)
    }

    fn set_fatal(&self, why: String) {
        tracing::error!(group = %self.config.group, "{why}");
        lock(&self.fatal).get_or_insert(why);
        self.wake.notify_waiters();
        self.acked.notify_waiters();
    }

    fn fatal(&self) -> Option<String> {
        lock(&self.fatal).clone()
    }

    fn push_outcome(&self, o: AckOutcome) {
        let n = o.offsets();
        match &o.error {
            None => self.stats.acks_ok.fetch_add(n, Ordering::Relaxed),
            Some((e, msg)) => {
                tracing::warn!(group = %self.config.group, topic = %o.topic, partition = o.partition, offsets = n, "acknowledgement refused: {e:?} {msg}");
                self.stats.acks_failed.fetch_add(n, Ordering::Relaxed)
            }
        };
        let mut q = lock(&self.outcomes);
        if q.len() >= MAX_OUTCOMES {
            q.pop_front();
        }
        q.push_back(o);
    }

    fn topic_name(&self, tp: &TopicIdPartition) -> Arc<str> {
        match self.client.topic_name(tp.topic_id) {
            Some(n) => Arc::from(n.as_str()),
            None => Arc::from(tp.topic_id.to_string().as_str()),
        }
    }

    /// Ends a leader's session: pending verdicts and outstanding records of it are released by
    /// the broker, so they are dropped here and counted.
    fn session_lost(&self, leader: i32, why: &str) {
        self.stats.session_resets.fetch_add(1, Ordering::Relaxed);
        let partitions: BTreeSet<TopicIdPartition> = lock(&self.route)
            .iter()
            .filter(|(_, l)| **l == leader)
            .map(|(tp, _)| *tp)
            .collect();
        // Verdicts not sent yet cannot be any more: report each as not applied (the Java client
        // completes them with NETWORK_EXCEPTION); the broker redelivers those records.
        let dropped = lock(&self.ledger).take(|tp| partitions.contains(tp), true);
        let dropped_verdicts: usize = dropped
            .iter()
            .flat_map(|(_, b)| b.iter())
            .map(|b| (b.last_offset - b.first_offset + 1) as usize)
            .sum();
        for (tp, batches) in dropped {
            self.push_outcome(AckOutcome {
                topic: self.topic_name(&tp),
                partition: tp.partition,
                batches,
                error: Some((
                    ResponseError::NetworkException,
                    format!("share session ended before the acknowledgement was sent ({why})"),
                )),
            });
        }
        let outstanding = {
            let mut leaders = lock(&self.leaders);
            let st = leaders.entry(leader).or_default();
            st.session = self.next_session.fetch_add(1, Ordering::Relaxed);
            st.holds.clear();
            std::mem::take(&mut st.outstanding).len()
        };
        // Outstanding records leave the in-flight count now; their verdicts will be refused.
        self.in_flight.fetch_sub(
            outstanding.min(self.in_flight.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
        let released = (dropped_verdicts + outstanding) as u64;
        self.stats
            .released_by_broker
            .fetch_add(released, Ordering::Relaxed);
        tracing::warn!(
            leader,
            released,
            "share session ended ({why}); the broker releases what it held"
        );
        self.wake.notify_waiters();
        self.acked.notify_waiters();
    }

    /// The leadership of `partitions` moved away from `leader` while its session lives on: the
    /// old leader can take no verdict for them any more, so the records held from there leave
    /// the in-flight count, and verdicts not sent yet are reported as not applied. The new
    /// leader delivers those records again.
    fn partitions_moved(&self, leader: i32, partitions: &BTreeSet<TopicIdPartition>) {
        // Outstanding records first: a concurrent `acknowledge` either finished (its verdict is
        // in the ledger, taken below) or finds its record gone and reports it moot.
        let outstanding = lock(&self.leaders)
            .get_mut(&leader)
            .map_or(0, |st| st.release(partitions));
        self.in_flight.fetch_sub(
            outstanding.min(self.in_flight.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
        let dropped = lock(&self.ledger).take(|tp| partitions.contains(tp), true);
        let mut dropped_verdicts = 0;
        for (tp, batches) in dropped {
            dropped_verdicts += batches
                .iter()
                .map(|b| (b.last_offset - b.first_offset + 1) as usize)
                .sum::<usize>();
            self.push_outcome(AckOutcome {
                topic: self.topic_name(&tp),
                partition: tp.partition,
                batches,
                error: Some((
                    ResponseError::NotLeaderOrFollower,
                    format!(
                        "the partition's leadership moved away from broker {leader} before the acknowledgement was sent"
                    ),
                )),
            });
        }
        let released = (dropped_verdicts + outstanding) as u64;
        self.stats
            .released_by_broker
            .fetch_add(released, Ordering::Relaxed);
        if released > 0 {
            tracing::warn!(
                leader,
                released,
                partitions = partitions.len(),
                "partition leadership moved; records held from the old leader come back from the new one"
            );
        }
        self.wake.notify_waiters();
        self.acked.notify_waiters();
    }
}

/// A running share consumer. `poll` from one task; `acknowledge` from any.
pub struct ShareConsumer {
    shared: Arc<Shared>,
    deliveries: tokio::sync::Mutex<mpsc::Receiver<Delivery>>,
    stop_fetching: CancellationToken,
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
            return Err(ShareError::Invalid(
                "subscribe to at least one topic".into(),
            ));
        }
        if config.max_in_flight == 0 {
            return Err(ShareError::Invalid(
                "max_in_flight must be at least 1".into(),
            ));
        }
        if let Some(f) = config.auto_renew_after
            && !(0.05..=0.95).contains(&f)
        {
            return Err(ShareError::Invalid(format!(
                "auto_renew_after must be within 0.05..=0.95, got {f}"
            )));
        }
        client.refresh_metadata(&config.topics).await?;
        for t in &config.topics {
            if client.topic(t).is_none() {
                return Err(ShareError::Kafka(KafkaError::UnknownTopic(t.clone())));
            }
        }
        let membership = match &config.member_id {
            Some(id) => Membership::with_member_id(&config.group, &config.topics, id),
            None => Membership::new(&config.group, &config.topics),
        };
        let shared = Arc::new(Shared {
            client,
            member_id: membership.member_id().to_owned(),
            config,
            ledger: Mutex::new(AckLedger::new()),
            leaders: Mutex::new(HashMap::new()),
            route: Mutex::new(foldhash::HashMap::default()),
            in_flight: AtomicUsize::new(0),
            reserved: AtomicUsize::new(0),
            largest_batch: AtomicUsize::new(0),
            finals: AtomicU64::new(0),
            active_leaders: AtomicUsize::new(1),
            acquiring: std::sync::atomic::AtomicBool::new(true),
            joined: std::sync::atomic::AtomicBool::new(false),
            pace: Mutex::new(Pace::default()),
            acks_in_flight: AtomicUsize::new(0),
            wake: Notify::new(),
            acked: Notify::new(),
            remap: Notify::new(),
            next_session: AtomicU64::new(1),
            outcomes: Mutex::new(VecDeque::new()),
            again: Mutex::new(Vec::new()),
            again_ready: Notify::new(),
            fatal: Mutex::new(None),
            stats: ConsumerStats::default(),
            v1_warned: std::sync::Once::new(),
        });
        let (tx, rx) = mpsc::channel(16);
        let (assign_tx, assign_rx) = watch::channel(BTreeSet::new());
        let stop_fetching = CancellationToken::new();
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
            stop_fetching.clone(),
        ));
        Ok(ShareConsumer {
            shared,
            deliveries: tokio::sync::Mutex::new(rx),
            stop_fetching,
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

    /// Records acquired and not yet judged.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// Whether this member is in its group now: the coordinator answered its last heartbeat
    /// (false before the join, while the coordinator cannot be reached, and after leaving).
    pub fn joined(&self) -> bool {
        self.shared.joined.load(Ordering::Relaxed)
    }

    /// How many records this consumer may hold now (see [`ShareConsumerConfig::pace_within`]).
    pub fn in_flight_limit(&self) -> usize {
        self.shared.in_flight_limit()
    }

    /// Stops acquiring records while keeping the sessions open: verdicts and renewals still go
    /// out, so a caller that drains can judge what it holds before [`ShareConsumer::close`]
    /// releases the rest.
    pub fn stop_acquiring(&self) {
        self.shared.acquiring.store(false, Ordering::Relaxed);
        self.shared.wake.notify_waiters();
    }

    /// The lock duration the broker reported (AcquisitionLockTimeoutMs), once known.
    pub fn lock_timeout(&self) -> Option<Duration> {
        lock(&self.shared.leaders)
            .values()
            .filter_map(|l| l.lock_timeout)
            .min()
    }

    /// How much longer `record` can stay acquired without a verdict: `None` when the engine
    /// renews its lock by itself (auto-renew on, and its leader speaks renew), otherwise the
    /// time left on the lock the broker granted (zero when the lock time is unknown or the
    /// record is no longer held). A caller holding records back (a plugin's `retry`) stays
    /// within it, so the broker never releases a held record behind its back.
    pub fn hold_limit(&self, record: &ShareRecord) -> Option<Duration> {
        let leader = lock(&self.shared.route).get(&record.partition).copied();
        let leaders = lock(&self.shared.leaders);
        let Some(st) = leader.and_then(|l| leaders.get(&l)) else {
            return Some(Duration::ZERO);
        };
        let Some(held) = st
            .outstanding
            .get(&record.key())
            .filter(|_| st.session == record.session)
        else {
            return Some(Duration::ZERO);
        };
        st.hold_limit(held, self.shared.config.auto_renew_after.is_some())
    }

    /// Waits up to `timeout` for the next delivery; `None` when nothing arrived.
    ///
    /// # Cancel safety
    /// Cancel safe: a delivery is either returned or stays queued.
    pub async fn poll(&self, timeout: Duration) -> Result<Option<Delivery>, ShareError> {
        if let Some(why) = self.shared.fatal() {
            return Err(ShareError::Fatal(why));
        }
        let deadline = Instant::now() + timeout;
        let mut rx = self.deliveries.lock().await;
        loop {
            let again = self.shared.again_ready.notified();
            tokio::pin!(again);
            again.as_mut().enable();
            let renewed = std::mem::take(&mut *lock(&self.shared.again));
            if !renewed.is_empty() {
                return Ok(Some(Delivery {
                    records: renewed,
                    poison: Vec::new(),
                }));
            }
            tokio::select! {
                d = rx.recv() => return match d {
                    Some(d) => Ok(Some(d)),
                    None => Err(self
                        .shared
                        .fatal()
                        .map(ShareError::Fatal)
                        .unwrap_or(ShareError::Closed)),
                },
                _ = &mut again => {}
                _ = tokio::time::sleep_until(deadline) => return Ok(None),
            }
        }
    }

    /// Drops the records whose share session has ended since they were delivered (the broker
    /// released them and will deliver them again), so a caller about to hand a batch to slow or
    /// costly work does not judge records whose verdicts could no longer land. Returns how many
    /// were dropped. One pass under the engine's locks for the whole batch.
    pub fn retain_held(&self, records: &mut Vec<ShareRecord>) -> usize {
        let before = records.len();
        // Never both locks at once: every other path takes them one at a time.
        let owners: Vec<Option<i32>> = {
            let route = lock(&self.shared.route);
            records
                .iter()
                .map(|r| route.get(&r.partition).copied())
                .collect()
        };
        let leaders = lock(&self.shared.leaders);
        let mut owner = owners.into_iter();
        records.retain(|r| {
            owner
                .next()
                .flatten()
                .and_then(|l| leaders.get(&l))
                .is_some_and(|st| st.session == r.session && st.outstanding.contains_key(&r.key()))
        });
        before - records.len()
    }

    /// Records a verdict for a delivered record; it goes out with the next request to the
    /// record's leader. Renew extends the lock and leaves the record with the caller, who must
    /// still give it a final verdict. Returns `false` when the record's session has ended (the
    /// broker released it already and will redeliver it), so the verdict is moot.
    pub fn acknowledge(&self, record: &ShareRecord, kind: AckKind) -> Result<bool, ShareError> {
        self.acknowledge_all(&[(record, kind)])
            .pop()
            .unwrap_or(Ok(false))
    }

    /// Records verdicts for many records at once, as [`ShareConsumer::acknowledge`] does for
    /// one: the same result per record, in order. Cheaper per record (the bookkeeping locks are
    /// taken once, and the leader tasks are woken once), so a handler that judges batches
    /// should hand its verdicts over this way.
    pub fn acknowledge_all(
        &self,
        verdicts: &[(&ShareRecord, AckKind)],
    ) -> Vec<Result<bool, ShareError>> {
        let leaders_of: Vec<Option<i32>> = {
            let route = lock(&self.shared.route);
            verdicts
                .iter()
                .map(|(r, _)| route.get(&r.partition).copied())
                .collect()
        };
        let (mut recorded, mut finals, mut at_limit) = (false, 0, 0u64);
        let archive_at = self.shared.config.archive_at;
        let results = {
            let mut leaders = lock(&self.shared.leaders);
            let mut ledger = lock(&self.shared.ledger);
            verdicts
                .iter()
                .zip(leaders_of)
                .map(|((record, kind), leader)| {
                    let kind = *kind;
                    if kind == AckKind::Gap {
                        return Err(ShareError::Invalid(
                            "Gap is for offsets without a record; the engine sends it itself"
                                .into(),
                        ));
                    }
                    let Some(st) = leader.and_then(|l| leaders.get_mut(&l)) else {
                        return Ok(false);
                    };
                    if st.session != record.session {
                        return Ok(false);
                    }
                    if kind == AckKind::Renew {
                        if !st.outstanding.contains_key(&record.key()) {
                            return Ok(false);
                        }
                        if !st.renew_supported {
                            return Err(ShareError::Invalid(
                                "the broker offers ShareFetch v1 only (Kafka < 4.2): renew is unavailable"
                                    .into(),
                            ));
                        }
                    } else if st.outstanding.remove(&record.key()).is_none() {
                        return Ok(false);
                    }
                    ledger
                        .record(record.partition, record.record.offset, kind)
                        .map_err(|e| ShareError::Invalid(e.to_string()))?;
                    recorded = true;
                    if kind != AckKind::Renew {
                        finals += 1;
                    }
                    if kind == AckKind::Release
                        && archive_at.is_some_and(|limit| record.delivery_count >= limit)
                    {
                        at_limit += 1;
                    }
                    Ok(true)
                })
                .collect()
        };
        self.shared.counted_finals(finals, at_limit);
        if recorded {
            self.shared.wake.notify_waiters();
        }
        results
    }

    /// Settles records the caller judged, in one pass under the engine's locks: final
    /// verdicts are recorded, renewals counted against `max` with the record (a record out of
    /// renewals, or on a broker that cannot renew, is released instead) and delivered again by
    /// [`ShareConsumer::poll`], and held-back records kept until their time, then released by
    /// the engine. One result per decision, in order.
    pub fn settle(&self, decisions: &[(&ShareRecord, Settle)]) -> Vec<Settled> {
        let leaders_of: Vec<Option<i32>> = {
            let route = lock(&self.shared.route);
            decisions
                .iter()
                .map(|(r, _)| route.get(&r.partition).copied())
                .collect()
        };
        let auto_renew = self.shared.config.auto_renew_after.is_some();
        let archive_at = self.shared.config.archive_at;
        let now = Instant::now();
        let (mut recorded, mut finals, mut at_limit, mut holds) = (false, 0usize, 0u64, false);
        let mut again = Vec::new();
        let results = {
            let mut leaders = lock(&self.shared.leaders);
            let mut ledger = lock(&self.shared.ledger);
            decisions
                .iter()
                .zip(leaders_of)
                .map(|((record, decision), leader)| {
                    let Some(st) = leader.and_then(|l| leaders.get_mut(&l)) else {
                        return Settled::Moot;
                    };
                    if st.session != record.session {
                        return Settled::Moot;
                    }
                    let key = record.key();
                    let Some(held) = st.outstanding.get(&key).copied() else {
                        return Settled::Moot;
                    };
                    let (kind, result) = match decision {
                        Settle::Final(AckKind::Gap) => {
                            return Settled::Refused(
                                "Gap is for offsets without a record; the engine sends it itself"
                                    .into(),
                            );
                        }
                        Settle::Final(kind) => (*kind, Settled::Taken),
                        Settle::Renew { max } if held.renewals < *max && st.renew_supported => {
                            if let Err(e) = ledger.record(
                                record.partition,
                                record.record.offset,
                                AckKind::Renew,
                            ) {
                                return Settled::Refused(e.to_string());
                            }
                            if let Some(h) = st.outstanding.get_mut(&key) {
                                h.renewals += 1;
                                h.release_at = None;
                            }
                            recorded = true;
                            again.push((*record).clone());
                            return Settled::Renewed;
                        }
                        Settle::Renew { .. } => (AckKind::Release, Settled::RenewsSpent),
                        Settle::Hold(wish) => {
                            let mut keep = *wish;
                            if let Some(left) = st.hold_limit(&held, auto_renew) {
                                keep = keep.min(left.saturating_sub(LOCK_MARGIN));
                            }
                            if !keep.is_zero() {
                                let at = now + keep;
                                if let Some(h) = st.outstanding.get_mut(&key) {
                                    h.release_at = Some(at);
                                }
                                st.holds.push(Reverse((
                                    at,
                                    record.partition,
                                    record.record.offset,
                                )));
                                holds = true;
                                return Settled::Held(keep);
                            }
                            // No time left on its lock: released now, like a due hold.
                            (AckKind::Release, Settled::Held(Duration::ZERO))
                        }
                    };
                    if let Err(e) = ledger.record(record.partition, record.record.offset, kind) {
                        return Settled::Refused(e.to_string());
                    }
                    st.outstanding.remove(&key);
                    recorded = true;
                    finals += 1;
                    if kind == AckKind::Release
                        && archive_at.is_some_and(|limit| record.delivery_count >= limit)
                    {
                        at_limit += 1;
                    }
                    result
                })
                .collect()
        };
        self.shared.counted_finals(finals, at_limit);
        if !again.is_empty() {
            lock(&self.shared.again).extend(again);
            self.shared.again_ready.notify_waiters();
        }
        if recorded || holds {
            self.shared.wake.notify_waiters();
        }
        results
    }

    /// Releases every record the caller holds back now, not at its time (a caller that drains
    /// gives them back at once: the next member honours the delay no less than a redelivery
    /// does). Returns how many were released.
    pub fn release_holds(&self) -> usize {
        let (mut released, mut at_limit) = (0, 0u64);
        let archive_at = self.shared.config.archive_at;
        {
            let mut leaders = lock(&self.shared.leaders);
            let mut ledger = lock(&self.shared.ledger);
            for st in leaders.values_mut() {
                st.holds.clear();
                let due: Vec<(TopicIdPartition, i64)> = st
                    .outstanding
                    .iter()
                    .filter(|(_, h)| h.release_at.is_some())
                    .map(|(k, _)| *k)
                    .collect();
                for key in due {
                    let Some(held) = st.outstanding.remove(&key) else {
                        continue;
                    };
                    if ledger.record(key.0, key.1, AckKind::Release).is_ok() {
                        released += 1;
                        if archive_at.is_some_and(|limit| held.deliveries >= limit) {
                            at_limit += 1;
                        }
                    }
                }
            }
        }
        self.shared.counted_finals(released, at_limit);
        if released > 0 {
            self.shared.wake.notify_waiters();
        }
        released
    }

    /// Acknowledgement outcomes received since the last call (piggybacked, standalone and on
    /// close). Nothing the broker says about acknowledgements is swallowed: every refusal shows
    /// up here and in the stats.
    pub fn take_outcomes(&self) -> Vec<AckOutcome> {
        lock(&self.shared.outcomes).drain(..).collect()
    }

    /// Waits until every verdict recorded so far has been sent and answered, or `timeout`.
    /// Returns whether it got there.
    pub async fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let acked = self.shared.acked.notified();
            tokio::pin!(acked);
            acked.as_mut().enable();
            let done = lock(&self.shared.ledger).is_empty()
                && self.shared.acks_in_flight.load(Ordering::Acquire) == 0;
            if done {
                return true;
            }
            if self.shared.fatal().is_some() {
                return false;
            }
            // Nothing waits for the rest of its range now: everything recorded goes out.
            lock(&self.shared.ledger).release_ranges();
            self.shared.wake.notify_waiters();
            if tokio::time::timeout_at(deadline, acked).await.is_err() {
                return false;
            }
        }
    }

    /// Cuts every share connection as a network failure would (fault-injection tests): the
    /// broker drops the sessions and releases their records; the engine re-opens them.
    pub fn disconnect_for_testing(&self) {
        for st in lock(&self.shared.leaders).values() {
            if let Some(c) = &st.conn {
                c.close("disconnected for testing");
            }
        }
    }

    /// Stops fetching, sends pending verdicts, closes every share session (the broker releases
    /// everything unjudged at once) and leaves the group, all within `timeout`.
    pub async fn close(&self, timeout: Duration) {
        self.stop_fetching.cancel();
        self.shared.wake.notify_waiters();
        let mut tasks = self.tasks.lock().await;
        let drain = async {
            // The supervisor returns after its leader tasks closed their sessions; only then
            // does the member leave, so no records are handed out to a member that is leaving.
            while let Some(r) = tasks.join_next().await {
                if let Err(e) = r {
                    tracing::warn!("consumer task ended abnormally: {e}");
                }
                self.leave.cancel();
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
        self.stop_fetching.cancel();
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
                Err(e) if e.class() == ErrorClass::Fatal => {
                    shared.set_fatal(format!(
                        "group {}: cannot reach the coordinator: {e}",
                        membership.group()
                    ));
                    break;
                }
                Err(e) => {
                    tracing::warn!(group = membership.group(), "finding the coordinator: {e}");
                    if leave.is_cancelled() || !backoff.wait().await {
                        break;
                    }
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
        if *assign_tx.borrow() != *membership.assignment() {
            shared
                .stats
                .assignment_changes
                .fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                group = membership.group(),
                partitions = membership.assignment().len(),
                "assignment changed"
            );
            let _ = assign_tx.send(membership.assignment().clone());
        }
        shared.joined.store(
            matches!(action, HeartbeatAction::Wait(_)) && membership.epoch() > 0,
            Ordering::Relaxed,
        );
        if let MemberState::Fatal(why) = membership.state() {
            shared.set_fatal(why.clone());
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
    shared.joined.store(false, Ordering::Relaxed);
    let _ = assign_tx.send(BTreeSet::new());
}

/// Maps the assignment to partition leaders and keeps one task per leader.
async fn fetch_supervisor(
    shared: Arc<Shared>,
    mut assign_rx: watch::Receiver<BTreeSet<TopicIdPartition>>,
    tx: mpsc::Sender<Delivery>,
    stop: CancellationToken,
) {
    let mut leaders: HashMap<i32, watch::Sender<BTreeSet<TopicIdPartition>>> = HashMap::new();
    let mut tasks = JoinSet::new();
    let mut periodic = tokio::time::interval(Duration::from_secs(30));
    periodic.tick().await;
    loop {
        let assignment = assign_rx.borrow_and_update().clone();
        let mut by_leader: BTreeMap<i32, BTreeSet<TopicIdPartition>> = BTreeMap::new();
        let mut unresolved = false;
        for tp in &assignment {
            let leader = shared
                .client
                .topic_name(tp.topic_id)
                .and_then(|n| shared.client.leader(&n, tp.partition));
            match leader {
                Some(l) => {
                    by_leader.entry(l).or_default().insert(*tp);
                }
                None => unresolved = true,
            }
        }
        shared
            .active_leaders
            .store(by_leader.len().max(1), Ordering::Relaxed);
        if unresolved {
            // An id we cannot name (a topic created after our metadata) or a leaderless
            // partition: refresh, and look again shortly.
            let _ = shared.client.refresh_metadata(&shared.config.topics).await;
        }
        let moved = {
            let mut route = lock(&shared.route);
            let moved = moved_away(&route, &by_leader);
            for (l, set) in &by_leader {
                for tp in set {
                    route.insert(*tp, *l);
                }
            }
            moved
        };
        for (old, partitions) in &moved {
            shared.partitions_moved(*old, partitions);
        }
        for (leader, set) in &by_leader {
            match leaders.get(leader) {
                Some(w) => {
                    w.send_replace(set.clone());
                }
                None => {
                    let (w, r) = watch::channel(set.clone());
                    leaders.insert(*leader, w);
                    tasks.spawn(leader_loop(
                        shared.clone(),
                        *leader,
                        r,
                        tx.clone(),
                        stop.clone(),
                    ));
                }
            }
        }
        for (leader, w) in &leaders {
            if !by_leader.contains_key(leader) {
                w.send_replace(BTreeSet::new());
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            r = assign_rx.changed() => if r.is_err() { break },
            _ = shared.remap.notified() => {
                let _ = shared.client.refresh_metadata(&shared.config.topics).await;
            }
            _ = periodic.tick() => {
                let _ = shared.client.refresh_metadata(&shared.config.topics).await;
            }
            _ = tokio::time::sleep(Duration::from_millis(250)), if unresolved => {}
        }
    }
    while tasks.join_next().await.is_some() {}
}

/// One leader: a dedicated connection (share sessions live and die with it), one session, and
/// strictly one request at a time.
async fn leader_loop(
    shared: Arc<Shared>,
    leader: i32,
    wanted_rx: watch::Receiver<BTreeSet<TopicIdPartition>>,
    tx: mpsc::Sender<Delivery>,
    stop: CancellationToken,
) {
    let mut worker = LeaderWorker {
        shared,
        leader,
        wanted_rx,
        tx,
        stop,
        backoff: Backoff::new(BackoffConfig::default()),
        acks_waiting_since: None,
        dry_since: None,
    };
    worker.run().await;
    lock(&worker.shared.leaders).remove(&leader);
}

struct LeaderWorker {
    shared: Arc<Shared>,
    leader: i32,
    wanted_rx: watch::Receiver<BTreeSet<TopicIdPartition>>,
    tx: mpsc::Sender<Delivery>,
    stop: CancellationToken,
    backoff: Backoff,
    /// Since when verdicts have been waiting at the in-flight bound for the next fetch.
    acks_waiting_since: Option<Instant>,
    /// When a fetch that went out while records were in flight brought nothing: the next one
    /// waits until there are verdicts to carry, nothing is in flight any more, or `max_wait`
    /// has passed since.
    dry_since: Option<Instant>,
}

/// How long verdicts wait at the in-flight bound for the next fetch to carry them before they
/// go out in a ShareAcknowledge of their own.
///
/// Over the bound (a batch-optimized delivery overshoots it), each trickle of verdicts used to
/// go out at once in its own ShareAcknowledge: a round trip during which the next fetch cannot
/// leave, and one more share-state write on the broker. Verdicts bring the in-flight count back
/// under the bound, and then they ride on the fetch that goes out; only a handler slow enough
/// to hold them this long gets them sent alone.
const ACK_LINGER: Duration = Duration::from_millis(50);

/// Where one request left the session.
enum Step {
    /// Carry on with the same session.
    Continue,
    /// The session (and connection) are gone; reconnect.
    Reconnect,
    /// Stop this leader's task.
    Exit,
}

impl LeaderWorker {
    async fn run(&mut self) {
        loop {
            if self.stop.is_cancelled() {
                return;
            }
            if self.wanted_rx.borrow_and_update().is_empty() {
                // Nothing to serve here (its partitions moved, perhaps because this broker is
                // down) and no session to keep: wait for work instead of reconnecting.
                tokio::select! {
                    _ = self.stop.cancelled() => return,
                    r = self.wanted_rx.changed() => if r.is_err() { return },
                }
                continue;
            }
            let conn = match self.shared.client.dedicated_connection(self.leader).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(leader = self.leader, "share connection: {e}");
                    self.shared.remap.notify_one();
                    if !self.backoff.wait().await {
                        return;
                    }
                    continue;
                }
            };
            let version = match conn.version_for(ApiKey::ShareFetch, SHARE_VERSIONS) {
                Ok(v) => v,
                Err(e) => {
                    self.shared.set_fatal(e.to_string());
                    return;
                }
            };
            if version < 2 {
                self.shared.v1_warned.call_once(|| {
                    tracing::warn!(
                        leader = self.leader,
                        "broker offers ShareFetch v1 only (Kafka < 4.2): renew and record-limit acquisition are unavailable"
                    );
                });
            }
            {
                let mut leaders = lock(&self.shared.leaders);
                let st = leaders.entry(self.leader).or_default();
                if st.session == 0 {
                    st.session = self.shared.next_session.fetch_add(1, Ordering::Relaxed);
                }
                st.conn = Some(conn.clone());
                st.renew_supported = version >= 2;
            }
            let mut session = ShareSession::new();
            loop {
                let step = self.step(&conn, &mut session, version).await;
                match step {
                    Step::Continue => {}
                    Step::Reconnect => {
                        conn.close("share session ended");
                        if !self.backoff.wait().await {
                            return;
                        }
                        break;
                    }
                    Step::Exit => return,
                }
            }
        }
    }

    /// The partitions whose verdicts this leader's requests carry: see [`served`].
    fn serves(&self, session: &ShareSession) -> BTreeSet<TopicIdPartition> {
        let wanted = self.wanted_rx.borrow().clone();
        served(
            self.leader,
            &wanted,
            session.partitions(),
            &lock(&self.shared.route),
        )
    }

    /// Releases the records the caller held back whose time has come; returns when the next
    /// one is due, so the loop wakes for it.
    fn release_due_holds(&self) -> Option<Instant> {
        let now = Instant::now();
        let archive_at = self.shared.config.archive_at;
        let (due, next) = {
            let mut leaders = lock(&self.shared.leaders);
            let st = leaders.get_mut(&self.leader)?;
            st.due_holds(now)
        };
        if !due.is_empty() {
            let mut ledger = lock(&self.shared.ledger);
            let (mut released, mut at_limit) = (0, 0u64);
            for ((tp, offset), held) in due {
                if ledger.record(tp, offset, AckKind::Release).is_ok() {
                    released += 1;
                    if archive_at.is_some_and(|limit| held.deliveries >= limit) {
                        at_limit += 1;
                    }
                }
            }
            drop(ledger);
            self.shared.counted_finals(released, at_limit);
        }
        next
    }

    /// Queues Renew for records held past the auto-renew threshold.
    fn schedule_auto_renew(&self) {
        let Some(fraction) = self.shared.config.auto_renew_after else {
            return;
        };
        let now = Instant::now();
        let mut leaders = lock(&self.shared.leaders);
        let Some(st) = leaders.get_mut(&self.leader) else {
            return;
        };
        let (Some(lock_timeout), true) = (st.lock_timeout, st.renew_supported) else {
            return;
        };
        let due = lock_timeout.mul_f64(fraction);
        if st
            .next_renew_scan
            .is_some_and(|(next, at_due)| at_due == due && now < next)
        {
            return;
        }
        let mut ledger = lock(&self.shared.ledger);
        // Records delivered after this scan are held since `now` or later, so none is due
        // before the earliest `since` left here plus `due`.
        let mut earliest = now;
        for ((tp, offset), held) in st.outstanding.iter_mut() {
            if now.duration_since(held.since) >= due
                && ledger.record(*tp, *offset, AckKind::Renew).is_ok()
            {
                held.since = now;
            }
            earliest = earliest.min(held.since);
        }
        st.next_renew_scan = Some((earliest + due, due));
    }

    async fn step(
        &mut self,
        conn: &Arc<BrokerConnection>,
        session: &mut ShareSession,
        version: i16,
    ) -> Step {
        let cfg = &self.shared.config;
        if self.stop.is_cancelled() {
            self.close_session(conn, session, version).await;
            return Step::Exit;
        }
        // Register for wake-ups before looking at the state: a verdict recorded between the
        // checks below and the wait would otherwise be missed until the fallback timer fires.
        let shared = self.shared.clone();
        let wake = shared.wake.notified();
        tokio::pin!(wake);
        wake.as_mut().enable();
        let next_hold = self.release_due_holds();
        self.schedule_auto_renew();
        let wanted = self.wanted_rx.borrow_and_update().clone();
        let serves = self.serves(session);
        let (has_renew, has_acks) = {
            let ledger = lock(&self.shared.ledger);
            // Verdicts waiting for the rest of their acquired range do not count yet (unless
            // nothing is assigned here any more: then no fetch will carry them).
            let ready = if wanted.is_empty() {
                ledger.has_where(|tp| serves.contains(tp))
            } else {
                ledger.has_ready_where(|tp| serves.contains(tp), Instant::now())
            };
            (ledger.has_renew_where(|tp| serves.contains(tp)), ready)
        };
        if !session.is_opening() && has_renew {
            return self.send_acks(conn, session, version, true).await;
        }
        let limit = self.shared.in_flight_limit();
        // Each leader may hold (and ask for) its share of the bound: a leader whose partitions
        // are empty long-polls with its request's room reserved, and took all of a small
        // bound from a leader that still had records to give.
        let leaders = self.shared.active_leaders.load(Ordering::Relaxed).max(1);
        let share = limit.div_ceil(leaders);
        let own = lock(&self.shared.leaders)
            .get(&self.leader)
            .map_or(0, |st| st.outstanding.len());
        let budget = limit
            .saturating_sub(self.shared.in_flight.load(Ordering::Relaxed))
            .saturating_sub(self.shared.reserved.load(Ordering::Relaxed))
            .min(share.saturating_sub(own));
        // Fetch in large steps: at least half the share (or all of a small one) per ShareFetch,
        // whatever the caller's speed. A trickle of verdicts does not send a trickle of small
        // fetches (each costs the broker as much as a large one); it rides on a standalone
        // acknowledgement instead.
        let step = (share / 2).max(1).min(cfg.max_records.max(1) as usize);
        // A fitted fetch waits for room for a whole batch when its share can hold one at all:
        // asking for less would make the broker split the batch offset by offset.
        let largest = self.shared.largest_batch.load(Ordering::Relaxed);
        let step = if cfg.acquire_mode == AcquireMode::Fitted && largest <= share {
            step.max(largest)
        } else {
            step
        };
        let budget = if budget >= step { budget } else { 0 };
        // While the caller still holds records of this leader, a fetch does not long-poll:
        // the verdicts it makes meanwhile would wait behind it, and when this member holds the
        // broker's per-partition lock limit the broker has nothing to give until it gets them
        // (a MaxWait-long stall). When such a fetch brings nothing, the wait happens here
        // instead, where a verdict cuts it short: the next fetch goes out with the first
        // verdicts, or after `max_wait` (records whose lock expired come back, other partitions
        // fill up).
        let prefetch = lock(&self.shared.leaders)
            .get(&self.leader)
            .is_some_and(|st| !st.outstanding.is_empty());
        if !prefetch {
            self.dry_since = None;
        }
        let dry_until = self
            .dry_since
            .map(|t| t + cfg.max_wait)
            .filter(|until| *until > Instant::now());
        if budget > 0 && !wanted.is_empty() && (dry_until.is_none() || has_acks) {
            self.acks_waiting_since = None;
            return self
                .fetch(conn, session, version, &wanted, budget, prefetch)
                .await;
        }
        if has_acks && !session.is_opening() {
            let now = Instant::now();
            let since = *self.acks_waiting_since.get_or_insert(now);
            // Nothing assigned here any more: no fetch will carry them.
            if wanted.is_empty() || now.duration_since(since) >= ACK_LINGER {
                self.acks_waiting_since = None;
                return self.send_acks(conn, session, version, false).await;
            }
            let until = next_hold.map_or(since + ACK_LINGER, |h| h.min(since + ACK_LINGER));
            tokio::select! {
                _ = &mut wake => {}
                _ = self.stop.cancelled() => {}
                _ = tokio::time::sleep_until(until) => {}
            }
            return Step::Continue;
        }
        self.acks_waiting_since = None;
        if wanted.is_empty() {
            let holding = lock(&self.shared.leaders)
                .get(&self.leader)
                .is_some_and(|st| !st.outstanding.is_empty());
            if !session.is_opening() && !holding {
                // Nothing assigned here any more and nothing held: close the session politely.
                self.close_session(conn, session, version).await;
            }
            let mut rx = self.wanted_rx.clone();
            tokio::select! {
                _ = self.stop.cancelled() => {}
                _ = rx.changed() => {}
                _ = &mut wake => {}
            }
            return Step::Continue;
        }
        // At the in-flight bound, or dry, with nothing to send: wait for a verdict, waking in
        // time for auto-renew (and for the end of the dry wait).
        let until = dry_until.unwrap_or_else(|| Instant::now() + cfg.max_wait);
        let until = next_hold.map_or(until, |h| h.min(until));
        tokio::select! {
            _ = &mut wake => {}
            _ = self.stop.cancelled() => {}
            _ = tokio::time::sleep_until(until) => {}
        }
        Step::Continue
    }

    async fn fetch(
        &mut self,
        conn: &Arc<BrokerConnection>,
        session: &mut ShareSession,
        version: i16,
        wanted: &BTreeSet<TopicIdPartition>,
        budget: usize,
        prefetch: bool,
    ) -> Step {
        let cfg = &self.shared.config;
        let max_wait = if prefetch {
            Duration::ZERO
        } else {
            cfg.max_wait
        };
        let acks = if session.is_opening() {
            Vec::new()
        } else {
            let serves = self.serves(session);
            lock(&self.shared.ledger).take_ready(|tp| serves.contains(tp), Instant::now())
        };
        let part = match session.fetch_request(wanted, acks.clone()) {
            Ok(p) => p,
            Err(e) => {
                self.shared.set_fatal(format!("share session state: {e}"));
                return Step::Exit;
            }
        };
        let ask = fetch_ask(
            cfg.acquire_mode,
            budget,
            self.shared.largest_batch.load(Ordering::Relaxed),
            usize::try_from(cfg.max_records).unwrap_or(1),
            version >= 2,
        );
        let max_records = i32::try_from(ask.max_records).unwrap_or(i32::MAX);
        // The room is taken until the answer is in, so other leaders fetching meanwhile ask
        // only for what is left.
        let _reserved = Reservation::take(&self.shared, ask.at_most);
        self.shared.stats.fetches.fetch_add(1, Ordering::Relaxed);
        let req = ShareFetchRequest {
            group_id: cfg.group.clone(),
            member_id: self.shared.member_id.clone(),
            share_session_epoch: part.epoch,
            max_wait_ms: i32::try_from(max_wait.as_millis()).unwrap_or(i32::MAX),
            min_bytes: cfg.min_bytes,
            max_bytes: cfg.max_bytes,
            max_records,
            batch_size: cfg.batch_size.min(max_records),
            share_acquire_mode: i8::from(ask.record_limit),
            is_renew_ack: false,
            topics: part.topics,
            forgotten_topics: part.forgotten,
        };
        let carried_acks = !acks.is_empty();
        if carried_acks {
            self.shared.acks_in_flight.fetch_add(1, Ordering::AcqRel);
        }
        let started = Instant::now();
        let resp = conn
            .send_version(&req, version, conn.request_timeout() + max_wait)
            .await;
        self.round_trip(RoundTrip::Fetch, started);
        let step = match resp {
            Err(e) => {
                self.dry_since = None;
                self.request_failed(session, &acks, &e)
            }
            Ok(resp) => {
                let nothing = resp
                    .responses
                    .iter()
                    .flat_map(|t| t.partitions.iter())
                    .all(|p| p.acquired.is_empty());
                self.dry_since = (prefetch && nothing).then(Instant::now);
                self.on_fetch_response(session, &part.wanted, &acks, resp)
                    .await
            }
        };
        drop(_reserved);
        let held = self.shared.in_flight.load(Ordering::Relaxed) as u64;
        self.shared
            .stats
            .in_flight_peak
            .fetch_max(held, Ordering::Relaxed);
        if carried_acks {
            self.shared.acks_in_flight.fetch_sub(1, Ordering::AcqRel);
            self.shared.acked.notify_waiters();
        }
        step
    }

    async fn on_fetch_response(
        &mut self,
        session: &mut ShareSession,
        wanted: &BTreeSet<TopicIdPartition>,
        acks: &[(TopicIdPartition, Vec<AckBatch>)],
        resp: ShareFetchResponse,
    ) -> Step {
        let top = ResponseError::try_from_code(resp.error_code);
        if session.on_response(top, false, Some(wanted)) == SessionOutcome::Reset {
            self.report_acks(acks, top, resp.error_message.as_deref());
            self.shared.session_lost(self.leader, &format!("{top:?}"));
            return Step::Reconnect;
        }
        if let Some(err) = top {
            let msg = resp.error_message.clone().unwrap_or_default();
            self.report_acks(acks, top, Some(&msg));
            return match classify(err) {
                ErrorClass::Fatal => {
                    self.shared.set_fatal(format!(
                        "ShareFetch to broker {} failed with {err:?}: {msg}",
                        self.leader
                    ));
                    Step::Exit
                }
                _ => {
                    tracing::warn!(leader = self.leader, "ShareFetch: {err:?} {msg}");
                    self.shared.remap.notify_one();
                    self.backoff.wait().await;
                    Step::Continue
                }
            };
        }
        self.backoff.reset();
        if resp.acquisition_lock_timeout_ms > 0
            && let Some(st) = lock(&self.shared.leaders).get_mut(&self.leader)
        {
            st.lock_timeout = Some(Duration::from_millis(
                resp.acquisition_lock_timeout_ms as u64,
            ));
        }
        // Per-partition acknowledgement results.
        let results = by_partition(
            resp.responses
                .iter()
                .map(|t| (t.topic_id, t.partitions.as_slice())),
            |p| {
                (
                    p.partition,
                    p.acknowledge_error_code,
                    p.acknowledge_error_message.clone(),
                )
            },
        );
        self.report_results(acks, None, None, &results);
        let delivery = self.collect(&resp);
        if (!delivery.records.is_empty() || !delivery.poison.is_empty())
            && self.tx.send(delivery).await.is_err()
        {
            return Step::Exit;
        }
        Step::Continue
    }

    /// A request got no response: the session died with the connection, so the verdicts it
    /// carried are reported as failed and everything the session held is released by the broker.
    fn round_trip(&self, kind: RoundTrip, started: Instant) {
        if let Some(o) = &self.shared.config.observer {
            o.took(kind, started.elapsed());
        }
    }

    fn request_failed(
        &self,
        session: &mut ShareSession,
        acks: &[(TopicIdPartition, Vec<AckBatch>)],
        e: &KafkaError,
    ) -> Step {
        session.on_response(None, true, None);
        let why = e.to_string();
        self.report_acks(acks, None, Some(&why));
        self.shared.session_lost(self.leader, &why);
        Step::Reconnect
    }

    /// Reports acknowledgements that a whole request failed with.
    fn report_acks(
        &self,
        acks: &[(TopicIdPartition, Vec<AckBatch>)],
        err: Option<ResponseError>,
        msg: Option<&str>,
    ) {
        let e = err.unwrap_or(ResponseError::NetworkException);
        for (tp, batches) in acks {
            self.shared.push_outcome(AckOutcome {
                topic: self.shared.topic_name(tp),
                partition: tp.partition,
                batches: batches.clone(),
                error: Some((e, msg.unwrap_or("").to_owned())),
            });
        }
    }

    /// Turns acquired ranges into deliveries, Gap acknowledgements and poison.
    fn collect(&self, resp: &ShareFetchResponse) -> Delivery {
        let mut delivery = Delivery::default();
        let cap = self.shared.config.delivery_count_limit;
        let now = Instant::now();
        for t in &resp.responses {
            for p in &t.partitions {
                let tp = TopicIdPartition {
                    topic_id: t.topic_id,
                    partition: p.partition,
                };
                if p.error_code != 0 {
                    tracing::warn!(partition = ?tp, "fetch error {}", CodeDisplay(p.error_code));
                    if ResponseError::try_from_code(p.error_code)
                        .is_some_and(|e| classify(e) == ErrorClass::RefreshMetadata)
                    {
                        // Leadership moved: the old leader's locks are gone; remap.
                        self.shared.remap.notify_one();
                    }
                    continue;
                }
                if p.acquired.is_empty() {
                    continue;
                }
                let topic = self.shared.topic_name(&tp);
                let ranges: Vec<(i64, i64)> = p
                    .acquired
                    .iter()
                    .map(|a| (a.first_offset, a.last_offset))
                    .collect();
                let records = match decode_batches(p.records.clone()) {
                    Ok(r) => r,
                    Err(e) => {
                        // Undecodable data: release what we acquired so it is not stuck until
                        // the lock expires, and say so (within the same bound as below: a
                        // huge claimed range is not walked, the lock timeout returns the rest).
                        tracing::error!(topic = %topic, partition = p.partition, "cannot decode records, releasing them: {e}");
                        let plan = plan_unrecorded(&ranges, &[], &[], MAX_UNRECORDED_OFFSETS);
                        let mut ledger = lock(&self.shared.ledger);
                        for o in plan.release {
                            let _ = ledger.record(tp, o, AckKind::Release);
                        }
                        continue;
                    }
                };
                // Batches come in offset order and so do their records: a broker that sends
                // them otherwise costs a sort, and a duplicate offset keeps its first record.
                let mut records = records;
                if !records.is_sorted_by_key(|r| r.offset) {
                    records.sort_by_key(|r| r.offset);
                }
                records.dedup_by_key(|r| r.offset);
                let offsets: Vec<i64> = records.iter().map(|r| r.offset).collect();
                let spans = batch_spans(&p.records);
                let widest = spans
                    .iter()
                    .map(|&(first, last)| usize::try_from(last - first + 1).unwrap_or(usize::MAX))
                    .max()
                    .unwrap_or(0);
                self.shared
                    .largest_batch
                    .fetch_max(widest, Ordering::Relaxed);
                let plan = plan_unrecorded(&ranges, &spans, &offsets, MAX_UNRECORDED_OFFSETS);
                let mut slots: Vec<Option<ConsumedRecord>> =
                    records.into_iter().map(Some).collect();
                if !plan.release.is_empty() || plan.left_alone > 0 {
                    tracing::warn!(
                        topic = %topic,
                        partition = p.partition,
                        released = plan.release.len(),
                        left_to_lock_timeout = plan.left_alone,
                        "the broker acquired offsets its response has no batches for: releasing them"
                    );
                }
                let mut leaders = lock(&self.shared.leaders);
                let Some(st) = leaders.get_mut(&self.leader) else {
                    continue;
                };
                let split = p
                    .acquired
                    .iter()
                    .filter(|a| cuts_a_batch(&spans, a.first_offset, a.last_offset))
                    .count();
                self.shared
                    .stats
                    .acquired_split
                    .fetch_add(split as u64, Ordering::Relaxed);
                let mut ledger = lock(&self.shared.ledger);
                for a in &p.acquired {
                    ledger.acquired(tp, a.first_offset, a.last_offset);
                }
                for o in plan.gaps {
                    let _ = ledger.record(tp, o, AckKind::Gap);
                    self.shared.stats.gaps.fetch_add(1, Ordering::Relaxed);
                }
                for o in plan.release {
                    let _ = ledger.record(tp, o, AckKind::Release);
                }
                for a in &p.acquired {
                    if a.first_offset > a.last_offset {
                        continue;
                    }
                    // Only the records the response carries are walked, not the range itself;
                    // a record in two overlapping ranges is delivered once.
                    let from = offsets.partition_point(|&o| o < a.first_offset);
                    let to = offsets.partition_point(|&o| o <= a.last_offset);
                    for (slot, &o) in slots[from..to].iter_mut().zip(&offsets[from..to]) {
                        let Some(rec) = slot.take() else {
                            continue;
                        };
                        let sr = ShareRecord {
                            topic: topic.clone(),
                            partition: tp,
                            delivery_count: a.delivery_count,
                            record: rec,
                            session: st.session,
                        };
                        let poison = cap.is_some_and(|c| a.delivery_count >= c);
                        if poison {
                            self.shared.stats.poison.fetch_add(1, Ordering::Relaxed);
                        }
                        if poison && self.shared.config.reject_poison {
                            let _ = ledger.record(tp, o, AckKind::Reject);
                            delivery.poison.push(sr);
                        } else {
                            if st.hold((tp, o), now, a.delivery_count) {
                                self.shared.in_flight.fetch_add(1, Ordering::Relaxed);
                            }
                            self.shared.stats.acquired.fetch_add(1, Ordering::Relaxed);
                            if poison {
                                delivery.poison.push(sr);
                            } else {
                                self.shared.stats.delivered.fetch_add(1, Ordering::Relaxed);
                                delivery.records.push(sr);
                            }
                        }
                    }
                }
            }
        }
        delivery
    }

    /// Sends pending verdicts in a standalone ShareAcknowledge: used for renewals (which cannot
    /// ride on a fetch) and while fetching is paused at the in-flight bound.
    async fn send_acks(
        &mut self,
        conn: &Arc<BrokerConnection>,
        session: &mut ShareSession,
        version: i16,
        renew: bool,
    ) -> Step {
        let serves = self.serves(session);
        let acks = lock(&self.shared.ledger).take(|tp| serves.contains(tp), renew);
        if acks.is_empty() {
            return Step::Continue;
        }
        let renews = count_type(&acks, AckKind::Renew);
        let (epoch, topics) = match session.ack_request(acks.clone()) {
            Ok(p) => p,
            Err(e) => {
                self.shared.set_fatal(format!("share session state: {e}"));
                return Step::Exit;
            }
        };
        let req = ShareAcknowledgeRequest {
            group_id: self.shared.config.group.clone(),
            member_id: self.shared.member_id.clone(),
            share_session_epoch: epoch,
            is_renew_ack: renews > 0,
            topics,
        };
        let ack_version = conn
            .version_for(ApiKey::ShareAcknowledge, SHARE_VERSIONS)
            .unwrap_or(version);
        self.shared.acks_in_flight.fetch_add(1, Ordering::AcqRel);
        let started = Instant::now();
        let resp = conn
            .send_version(&req, ack_version, conn.request_timeout())
            .await;
        self.round_trip(RoundTrip::Acknowledge, started);
        let step = match resp {
            Err(e) => self.request_failed(session, &acks, &e),
            Ok(resp) => {
                let top = ResponseError::try_from_code(resp.error_code);
                let outcome = session.on_response(top, false, None);
                self.report_ack_response(
                    &acks,
                    top,
                    resp.error_message.as_deref(),
                    &resp.responses,
                );
                if resp.acquisition_lock_timeout_ms > 0
                    && let Some(st) = lock(&self.shared.leaders).get_mut(&self.leader)
                {
                    st.lock_timeout = Some(Duration::from_millis(
                        resp.acquisition_lock_timeout_ms as u64,
                    ));
                }
                if top.is_none() && renews > 0 {
                    self.shared
                        .stats
                        .renewed
                        .fetch_add(renews, Ordering::Relaxed);
                }
                match (outcome, top) {
                    (SessionOutcome::Reset, _) => {
                        self.shared.session_lost(self.leader, &format!("{top:?}"));
                        Step::Reconnect
                    }
                    (_, Some(e)) if classify(e) == ErrorClass::Fatal => {
                        self.shared.set_fatal(format!(
                            "ShareAcknowledge to broker {} failed with {e:?}: {}",
                            self.leader,
                            resp.error_message.as_deref().unwrap_or("")
                        ));
                        Step::Exit
                    }
                    _ => Step::Continue,
                }
            }
        };
        self.shared.acks_in_flight.fetch_sub(1, Ordering::AcqRel);
        self.shared.acked.notify_waiters();
        step
    }

    /// Turns a ShareAcknowledge response into one outcome per partition sent.
    fn report_ack_response(
        &self,
        acks: &[(TopicIdPartition, Vec<AckBatch>)],
        top: Option<ResponseError>,
        top_message: Option<&str>,
        responses: &[sharehost_kafka::protocol::share::AckTopicResult],
    ) {
        let results = by_partition(
            responses
                .iter()
                .map(|t| (t.topic_id, t.partitions.as_slice())),
            |p| (p.partition, p.error_code, p.error_message.clone()),
        );
        self.report_results(acks, top, top_message, &results);
    }

    /// One outcome per partition sent: the top-level error when there is one, else the
    /// partition's own result; a partition missing from the answer did not take effect (as the
    /// Java client treats it).
    fn report_results(
        &self,
        acks: &[(TopicIdPartition, Vec<AckBatch>)],
        top: Option<ResponseError>,
        top_message: Option<&str>,
        results: &HashMap<TopicIdPartition, (i16, Option<String>)>,
    ) {
        for (tp, batches) in acks {
            let error = match top {
                Some(e) => Some((e, top_message.unwrap_or("").to_owned())),
                None => match results.get(tp) {
                    Some((c, m)) => {
                        let e = ResponseError::try_from_code(*c);
                        if e.is_some_and(|e| classify(e) == ErrorClass::RefreshMetadata) {
                            // The partition moved (a leader that only acknowledges never sees
                            // a fetch error): find its leader.
                            self.shared.remap.notify_one();
                        }
                        e.map(|e| (e, m.clone().unwrap_or_default()))
                    }
                    // A partition missing from the answer did not take effect (as Java treats it).
                    None => Some((
                        ResponseError::InvalidRecordState,
                        "partition missing from the response".to_owned(),
                    )),
                },
            };
            self.shared.push_outcome(AckOutcome {
                topic: self.shared.topic_name(tp),
                partition: tp.partition,
                batches: batches.clone(),
                error,
            });
        }
    }

    /// Sends what is pending and closes the session (epoch -1): the broker then releases every
    /// record this member still holds there, at once.
    async fn close_session(
        &mut self,
        conn: &Arc<BrokerConnection>,
        session: &mut ShareSession,
        version: i16,
    ) {
        if session.is_opening() {
            return;
        }
        let partitions = self.serves(session);
        let acks = lock(&self.shared.ledger).take(|tp| partitions.contains(tp), false);
        let timeout = conn.request_timeout();
        self.shared.acks_in_flight.fetch_add(1, Ordering::AcqRel);
        if acks.is_empty() {
            let req = ShareFetchRequest {
                group_id: self.shared.config.group.clone(),
                member_id: self.shared.member_id.clone(),
                share_session_epoch: FINAL_EPOCH,
                ..Default::default()
            };
            match conn.send_version(&req, version, timeout).await {
                Ok(r) if r.error_code != 0 => {
                    tracing::warn!("closing the share session: {}", CodeDisplay(r.error_code))
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("closing the share session: {e}"),
            }
        } else {
            let mut topics: Vec<TopicAcks> = Vec::new();
            for (tp, batches) in &acks {
                let p = PartitionAcks {
                    partition: tp.partition,
                    batches: batches.clone(),
                };
                match topics.last_mut() {
                    Some(t) if t.topic_id == tp.topic_id => t.partitions.push(p),
                    _ => topics.push(TopicAcks {
                        topic_id: tp.topic_id,
                        partitions: vec![p],
                    }),
                }
            }
            let req = ShareAcknowledgeRequest {
                group_id: self.shared.config.group.clone(),
                member_id: self.shared.member_id.clone(),
                share_session_epoch: FINAL_EPOCH,
                is_renew_ack: false,
                topics,
            };
            let v = conn
                .version_for(ApiKey::ShareAcknowledge, SHARE_VERSIONS)
                .unwrap_or(version);
            match conn.send_version(&req, v, timeout).await {
                Ok(resp) => {
                    let top = ResponseError::try_from_code(resp.error_code);
                    self.report_ack_response(
                        &acks,
                        top,
                        resp.error_message.as_deref(),
                        &resp.responses,
                    );
                }
                Err(e) => self.report_acks(&acks, None, Some(&e.to_string())),
            }
        }
        self.shared.acks_in_flight.fetch_sub(1, Ordering::AcqRel);
        self.shared.acked.notify_waiters();
        // Whatever was delivered and not judged is released by the broker now.
        let released = lock(&self.shared.leaders)
            .get_mut(&self.leader)
            .map(|st| std::mem::take(&mut st.outstanding).len())
            .unwrap_or(0);
        self.shared.in_flight.fetch_sub(
            released.min(self.shared.in_flight.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
        session.closed();
    }
}

/// Per-partition (error code, message) of a response, keyed by partition.
fn by_partition<'a, P: 'a>(
    topics: impl Iterator<Item = (uuid::Uuid, &'a [P])>,
    field: impl Fn(&P) -> (i32, i16, Option<String>),
) -> HashMap<TopicIdPartition, (i16, Option<String>)> {
    topics
        .flat_map(|(topic_id, parts)| parts.iter().map(move |p| (topic_id, p)))
        .map(|(topic_id, p)| {
            let (partition, code, message) = field(p);
            (
                TopicIdPartition {
                    topic_id,
                    partition,
                },
                (code, message),
            )
        })
        .collect()
}

/// Offsets of `kind` among the batches.
fn count_type(acks: &[(TopicIdPartition, Vec<AckBatch>)], kind: AckKind) -> u64 {
    acks.iter()
        .flat_map(|(_, b)| b.iter())
        .map(|b| {
            if b.types.len() == 1 {
                if b.types[0] == kind.code() {
                    (b.last_offset - b.first_offset + 1) as u64
                } else {
                    0
                }
            } else {
                b.types.iter().filter(|t| **t == kind.code()).count() as u64
            }
        })
        .sum()
}

/// The partitions whose verdicts `leader`'s requests carry: those it should serve now, plus
/// those still in its session (their verdicts ride on the request that forgets them), but never
/// one routed to another leader: its leadership moved, the old leader would refuse the verdicts
/// and the new leader's session owns the partition now.
fn served(
    leader: i32,
    wanted: &BTreeSet<TopicIdPartition>,
    in_session: &BTreeSet<TopicIdPartition>,
    route: &Route,
) -> BTreeSet<TopicIdPartition> {
    wanted
        .iter()
        .chain(in_session)
        .filter(|tp| route.get(tp).is_none_or(|l| *l == leader))
        .copied()
        .collect()
}

/// Partitions a new mapping gives to another leader than `route` does, grouped by the leader
/// they leave.
fn moved_away(
    route: &Route,
    by_leader: &BTreeMap<i32, BTreeSet<TopicIdPartition>>,
) -> BTreeMap<i32, BTreeSet<TopicIdPartition>> {
    let mut moved: BTreeMap<i32, BTreeSet<TopicIdPartition>> = BTreeMap::new();
    for (leader, partitions) in by_leader {
        for tp in partitions {
            if let Some(old) = route.get(tp)
                && old != leader
            {
                moved.entry(*old).or_default().insert(*tp);
            }
        }
    }
    moved
}

/// Most offsets without a record (Gaps, and offsets released because the response has no batch
/// for them) the engine records for one partition of one response. An honest broker acquires
/// only offsets its response covers, mostly with records; a hostile one can claim
/// `first..=i64::MAX`, and walking that offset by offset would stall the engine and fill the
/// ledger. Offsets beyond the bound are left alone: the broker's acquisition lock returns them
/// after its timeout, and the next fetch acquires them again, so nothing is lost; a compacted
/// partition with more gaps than this in one response is acknowledged over several fetches.
pub const MAX_UNRECORDED_OFFSETS: usize = 1 << 16;

/// What the engine does with the acquired offsets of one partition's response that have no
/// record (records themselves are delivered separately).
#[derive(Debug, Default, PartialEq, Eq)]
struct Unrecorded {
    /// Up to the last offset the response's complete batches cover, without a record
    /// (compaction, a transaction marker, a batch removed whole): acknowledged as Gap, as the
    /// Java client does. The broker read the log there and found nothing.
    gaps: Vec<i64>,
    /// Past the last offset the response covers (a batch cut short at the byte limit, or a
    /// lying broker): released, so they are delivered again; never Gap-acked, which would
    /// archive records nobody saw.
    release: Vec<i64>,
    /// Offsets past the budget: not walked, left to the acquisition lock timeout.
    left_alone: u64,
}

/// Splits acquired `ranges` (first, last) at the last offset the `spans` of the response's
/// complete batches cover, recording at most `budget` offsets without a record (see
/// [`MAX_UNRECORDED_OFFSETS`]). `present` holds the offsets that have a record, ascending.
/// Work is bounded by the budget plus the records present, whatever the ranges claim; a
/// range whose every offset has a record (the common case) costs two binary searches.
fn plan_unrecorded(
    ranges: &[(i64, i64)],
    spans: &[(i64, i64)],
    present: &[i64],
    budget: usize,
) -> Unrecorded {
    let covered_to = spans.iter().map(|&(_, end)| end).max();
    let mut out = Unrecorded::default();
    let mut left = budget;
    // Walks `from..=to`, sending each offset without a record to the gaps or the releases.
    let mut walk = |from: i64, to: i64, gap: bool, out: &mut Unrecorded| {
        let mut at = present.partition_point(|&p| p < from);
        let end = present.partition_point(|&p| p <= to);
        if u128::from(to.abs_diff(from)) + 1 == (end - at) as u128 {
            return; // every offset has its record
        }
        let mut o = from;
        loop {
            // `present` is ascending: step past what lies before `o`, then look.
            while at < end && present[at] < o {
                at += 1;
            }
            if at == end || present[at] != o {
                if left == 0 {
                    out.left_alone = out
                        .left_alone
                        .saturating_add(to.abs_diff(o).saturating_add(1));
                    return;
                }
                left -= 1;
                if gap {
                    out.gaps.push(o);
                } else {
                    out.release.push(o);
                }
            }
            match o.checked_add(1) {
                Some(next) if next <= to => o = next,
                _ => return,
            }
        }
    };
    for &(first, last) in ranges {
        if first > last {
            continue;
        }
        match covered_to {
            Some(end) if end >= last => walk(first, last, true, &mut out),
            Some(end) if end >= first => {
                walk(first, end, true, &mut out);
                walk(end + 1, last, false, &mut out);
            }
            _ => walk(first, last, false, &mut out),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_cuts_a_batch_when_it_covers_only_part_of_it() {
        let spans = [(0, 99), (100, 199), (200, 200)];
        assert!(!cuts_a_batch(&spans, 0, 99));
        assert!(!cuts_a_batch(&spans, 0, 199));
        assert!(!cuts_a_batch(&spans, 200, 200));
        assert!(cuts_a_batch(&spans, 0, 49));
        assert!(cuts_a_batch(&spans, 150, 150));
        assert!(cuts_a_batch(&spans, 50, 120));
        // A range the response has no batch for is not counted here (plan_unrecorded's job).
        assert!(!cuts_a_batch(&spans, 500, 600));
    }

    #[test]
    fn a_fitted_fetch_asks_for_whole_batches_only_when_the_largest_fits_the_room() {
        let ask = |budget, largest| fetch_ask(AcquireMode::Fitted, budget, largest, 10_000, true);
        // Nothing seen yet: record-limit, exactly the room.
        assert_eq!(
            ask(2500, 0),
            FetchAsk {
                record_limit: true,
                max_records: 2500,
                at_most: 2500
            }
        );
        // Batches of 2,380: whole batches, MaxRecords lowered so the last one still fits.
        let whole = ask(5000, 2380);
        assert!(!whole.record_limit);
        assert_eq!(whole.max_records, 5000 - 2380 + 1);
        assert_eq!(whole.at_most, 5000);
        // A room smaller than one batch: record-limit again (the bound is kept).
        assert!(ask(2000, 2380).record_limit);
        assert_eq!(ask(2000, 2380).at_most, 2000);
        // The configured cap still applies, and what it can bring is reserved.
        let capped = fetch_ask(AcquireMode::Fitted, 50_000, 100, 500, true);
        assert_eq!(
            (capped.record_limit, capped.max_records, capped.at_most),
            (false, 500, 599)
        );
        // v1 brokers know whole batches only.
        assert!(!fetch_ask(AcquireMode::Fitted, 2000, 2380, 10_000, false).record_limit);
        assert!(!fetch_ask(AcquireMode::RecordLimit, 2000, 0, 10_000, false).record_limit);
        assert!(fetch_ask(AcquireMode::RecordLimit, 5000, 100, 10_000, true).record_limit);
    }

    #[test]
    fn a_huge_acquired_range_is_not_walked_offset_by_offset() {
        // A broker claims 0..=i64::MAX with one 10-offset batch holding records 0-4: the batch's
        // other offsets are Gaps, a bounded number of the rest is released, the rest left to
        // the lock timeout. The old loop walked all 2^63 offsets into the ledger.
        let plan = plan_unrecorded(&[(0, i64::MAX)], &[(0, 9)], &[0, 1, 2, 3, 4], 100);
        assert_eq!(plan.gaps, (5..=9).collect::<Vec<_>>());
        assert_eq!(plan.release, (10..105).collect::<Vec<_>>());
        assert_eq!(plan.left_alone, (i64::MAX - 105 + 1) as u64);
    }

    #[test]
    fn a_range_whose_every_offset_has_its_record_plans_nothing() {
        let present: Vec<i64> = (100..600).collect();
        assert_eq!(
            plan_unrecorded(&[(100, 349), (350, 599)], &[(100, 599)], &present, 64),
            Unrecorded::default()
        );
        // One offset short of full: the walk finds exactly that one.
        let holed: Vec<i64> = present.iter().copied().filter(|&o| o != 420).collect();
        assert_eq!(
            plan_unrecorded(&[(100, 599)], &[(100, 599)], &holed, 64).gaps,
            vec![420]
        );
    }

    #[test]
    fn honest_acquired_ranges_gap_only_offsets_their_batches_cover() {
        // Compaction left offset 3 without a record; a transaction marker batch covers 10.
        let plan = plan_unrecorded(
            &[(0, 10)],
            &[(0, 9), (10, 10)],
            &[0, 1, 2, 4, 5, 6, 7, 8, 9],
            64,
        );
        assert_eq!(
            plan,
            Unrecorded {
                gaps: vec![3, 10],
                release: vec![],
                left_alone: 0
            }
        );
        // A batch removed whole by compaction (10-19), and offsets before the first batch the
        // log returned (5-7): no records there, so Gaps, as before.
        let plan = plan_unrecorded(
            &[(5, 29)],
            &[(8, 9), (20, 29)],
            &[8, 9, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29],
            64,
        );
        assert_eq!(
            plan.gaps,
            vec![5, 6, 7, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
        );
        assert!(plan.release.is_empty());
        // A batch cut short at the byte limit (11-14 acquired, no complete batch): released,
        // never Gap-acked, so those records are delivered again.
        let plan = plan_unrecorded(&[(0, 14)], &[(0, 9)], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 64);
        assert_eq!(plan.gaps, Vec::<i64>::new());
        assert_eq!(plan.release, vec![10, 11, 12, 13, 14]);
        // At the very top of the offset space nothing overflows.
        let top = plan_unrecorded(
            &[(i64::MAX - 1, i64::MAX)],
            &[(i64::MAX - 1, i64::MAX)],
            &[],
            64,
        );
        assert_eq!(top.gaps, vec![i64::MAX - 1, i64::MAX]);
        // Reversed and empty ranges are nothing.
        assert_eq!(
            plan_unrecorded(&[(5, 4)], &[(0, 9)], &[], 64),
            Unrecorded::default()
        );
    }

    fn tp(partition: i32) -> TopicIdPartition {
        TopicIdPartition {
            topic_id: uuid::Uuid::from_u128(7),
            partition,
        }
    }

    fn set(ps: &[i32]) -> BTreeSet<TopicIdPartition> {
        ps.iter().map(|p| tp(*p)).collect()
    }

    #[test]
    fn a_moved_partition_is_served_by_its_new_leader_only() {
        // Partition 0 moved from leader 1 to leader 2; leader 1's session still lists it
        // until its next fetch forgets it. Partition 1 was unassigned but still leads on 1.
        let route: Route = [(tp(0), 2), (tp(1), 1), (tp(2), 1)].into_iter().collect();
        let old = served(1, &set(&[2]), &set(&[0, 1, 2]), &route);
        assert_eq!(
            old,
            set(&[1, 2]),
            "the old leader keeps only what it still leads"
        );
        let new = served(2, &set(&[0]), &BTreeSet::new(), &route);
        assert_eq!(new, set(&[0]));
        // A partition nobody routed yet (first assignment) is served by whoever wants it.
        assert_eq!(served(3, &set(&[9]), &BTreeSet::new(), &route), set(&[9]));
    }

    #[test]
    fn moves_are_found_per_old_leader() {
        let route: Route = [(tp(0), 1), (tp(1), 1), (tp(2), 3)].into_iter().collect();
        let by_leader: BTreeMap<i32, BTreeSet<TopicIdPartition>> =
            [(2, set(&[0, 1])), (3, set(&[2, 4]))].into();
        let moved = moved_away(&route, &by_leader);
        assert_eq!(
            moved,
            [(1, set(&[0, 1]))].into(),
            "new partitions and stayers are no moves"
        );
    }

    #[test]
    fn a_record_delivered_again_while_still_held_is_held_once() {
        let (first, again) = (Instant::now(), Instant::now() + Duration::from_secs(30));
        let mut st = LeaderState::default();
        assert!(st.hold((tp(0), 5), first, 1), "a new record");
        assert!(st.hold((tp(0), 6), first, 1));
        // Offset 5's lock expired and the broker acquired it for this member again.
        assert!(!st.hold((tp(0), 5), again, 2), "still the same record held");
        assert_eq!(st.outstanding.len(), 2);
        assert_eq!(
            st.outstanding.get(&(tp(0), 5)),
            Some(&Held::new(again, 2)),
            "its lock restarted with the redelivery, its renewals and hold with it"
        );
    }

    #[test]
    fn a_held_back_record_is_released_once_at_its_time_and_never_after_another_verdict() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut st = LeaderState::default();
        for o in 1..=3 {
            st.hold((tp(0), o), t0, 1);
        }
        for (o, at) in [(1, ms(10)), (2, ms(20)), (3, ms(30))] {
            if let Some(h) = st.outstanding.get_mut(&(tp(0), o)) {
                h.release_at = Some(at);
            }
            st.holds.push(Reverse((at, tp(0), o)));
        }
        // Offset 2 got a final verdict meanwhile; offset 3 was delivered again (a new lock,
        // no hold).
        st.outstanding.remove(&(tp(0), 2));
        st.hold((tp(0), 3), ms(5), 2);
        let (due, next) = st.due_holds(ms(5));
        assert!(due.is_empty());
        assert_eq!(next, Some(ms(10)));
        let (due, next) = st.due_holds(ms(40));
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].0, (tp(0), 1));
        assert_eq!(next, None);
        assert!(
            !st.outstanding.contains_key(&(tp(0), 1)),
            "released: no longer held"
        );
        assert!(
            st.outstanding.contains_key(&(tp(0), 3)),
            "its new delivery stays held"
        );
        assert!(st.due_holds(ms(50)).0.is_empty(), "once only");
    }

    #[test]
    fn releasing_moved_partitions_forgets_only_their_records() {
        let now = Instant::now();
        let mut st = LeaderState::default();
        for (p, o) in [(0, 5), (0, 6), (1, 5)] {
            st.outstanding.insert((tp(p), o), Held::new(now, 1));
        }
        assert_eq!(st.release(&set(&[0])), 2);
        assert_eq!(st.outstanding.len(), 1);
        assert!(st.outstanding.contains_key(&(tp(1), 5)));
    }
}

//! The engine's public values: its configuration, the records it hands out and the
//! deliveries that carry them, what a caller decides for a record it holds ([`Settle`]) and
//! what became of it ([`Settled`]), acknowledgement outcomes, counters and errors. Plain data
//! the caller's API, the leader tasks and the host all speak; no behaviour beyond small helpers.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use kafka_protocol::ResponseError;
use sharehost_kafka::protocol::share::AckBatch;
use sharehost_kafka::{ConsumedRecord, KafkaError};

use crate::ledger::{AckKind, TopicIdPartition};

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
    /// How long the group keeps a member whose heartbeats stop (the group's
    /// `share.session.timeout.ms`). With it, [`ShareConsumer::confirm_held`](super::ShareConsumer::confirm_held)
    /// also requires the membership to be provably alive: a fenced member's records are
    /// released by the broker, and its renewal of them may still be answered without an error.
    pub member_session_timeout: Option<Duration>,
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
            member_session_timeout: None,
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
    pub(super) session: u64,
    /// Which stint of its partition with a leader's share session delivered it (unique in the
    /// process). A new stint (a new session, the partition moved to another leader and maybe
    /// back, a fetch error for it) may face a share partition the broker rebuilt from what it
    /// had persisted, and the broker persists no acquisition: a record an earlier stint's
    /// member was handed comes again with a delivery count that does not show it (measured:
    /// delivery count 1 twice across a leader's SIGKILL). Whoever must know whether a record
    /// was judged before looks at the stint, not only at the delivery count.
    pub stint: u64,
}

impl ShareRecord {
    /// A record without key, value or headers, of topic `t` and stint 1: what the engine's
    /// unit tests hold, settle and check.
    #[cfg(test)]
    pub(super) fn bare(
        partition: TopicIdPartition,
        offset: i64,
        session: u64,
        delivery_count: i16,
    ) -> Self {
        ShareRecord {
            topic: Arc::from("t"),
            partition,
            delivery_count,
            record: ConsumedRecord {
                offset,
                timestamp: 0,
                key: None,
                value: None,
                headers: Vec::new(),
            },
            session,
            stint: 1,
        }
    }

    /// Where the engine keeps it: its partition and offset.
    pub(super) fn key(&self) -> (TopicIdPartition, i64) {
        (self.partition, self.record.offset)
    }
}

/// How long before a record's lock runs out a record the caller holds back is released (on a
/// broker that cannot renew it), so the release lands while the record is still ours.
pub const LOCK_MARGIN: Duration = Duration::from_secs(1);

/// What the caller decided for a record it holds ([`ShareConsumer::settle`](super::ShareConsumer::settle)).
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
    /// Renewed: [`ShareConsumer::poll`](super::ShareConsumer::poll) delivers it again.
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
    /// When the request that carried them took them from the ledger (so it was sent after);
    /// `None` when no request carried them (a session ended first). A renewal's answer proves
    /// a lock only from then: an answer to an older request must not confirm a newer ask.
    pub sent: Option<tokio::time::Instant>,
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
    /// Accepts and rejects the broker never got: their session ended, or their partition's
    /// leadership moved, while they waited for a request to carry them. Their records come
    /// again and are judged again, so these are the duplicates the engine's own waiting made.
    pub verdicts_unsent: AtomicU64,
    /// Records delivered again after their accept or reject was lost (unsent, unanswered, or
    /// made after their session ended), settled with that verdict instead of being handed to
    /// the caller: the duplicates the engine spared.
    pub verdicts_replayed: AtomicU64,
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

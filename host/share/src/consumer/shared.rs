//! What the caller's API and the engine's tasks share ([`Shared`]), and what the engine keeps
//! per leader ([`LeaderState`]) and per record it handed out and has no final verdict for
//! ([`Held`]: when its lock started, its delivery count, how often it was renewed, when a record
//! held back is to be released). Every count and map here is changed under one of its locks or
//! atomically, by the room that owns the change: the API records verdicts, the leader tasks
//! hold and release records, the supervisor routes partitions.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

// parking_lot's lock does not poison: a task that panicked mid-update of plain bookkeeping
// leaves it to the others as it was.
use parking_lot::Mutex;
use std::time::Duration;

use kafka_protocol::ResponseError;
use tokio::sync::Notify;
use tokio::time::Instant;

use sharehost_kafka::protocol::share::{AckBatch, ack_type};
use sharehost_kafka::{BrokerConnection, KafkaClient};

use super::decisions::{Route, paced_limit};
pub(super) use super::outstanding::{Held, Outstanding, RecordKey};
use super::remembered::{Remembered, remembered_capacity};
use super::types::{AckOutcome, ConsumerStats, ShareConsumerConfig, ShareRecord};
use crate::ledger::{AckKind, AckLedger, TopicIdPartition};

/// Most outcomes kept for the caller; older ones are dropped (and counted) if nobody reads them.
const MAX_OUTCOMES: usize = 100_000;

/// Per-leader bookkeeping shared between the caller and the leader's task.
#[derive(Default)]
pub(super) struct LeaderState {
    /// Current session id; verdicts for records of other sessions are moot.
    pub(super) session: u64,
    /// Delivered records without a final verdict, with what the engine keeps of each.
    pub(super) outstanding: Outstanding,
    /// Records the caller holds back (`Settle::Hold`), earliest release first; an entry whose
    /// record was settled otherwise meanwhile (or delivered again) is skipped when it is due.
    pub(super) holds: BinaryHeap<Reverse<(Instant, TopicIdPartition, i64)>>,
    /// Lock duration the broker reported.
    pub(super) lock_timeout: Option<Duration>,
    /// The task's connection, so a test can cut it.
    pub(super) conn: Option<Arc<BrokerConnection>>,
    /// Whether the broker speaks ShareFetch v2.
    pub(super) renew_supported: bool,
    /// When the next auto-renew scan can find a record due, and the threshold that was
    /// computed with: the scan walks every outstanding record, so it runs only then, not on
    /// every step of the leader's loop.
    pub(super) next_renew_scan: Option<(Instant, Duration)>,
    /// What of a settle wakes the leader's task: any verdict (`None`), or, while the task
    /// waits for room to fetch or is in a request, a plain final verdict only once the records
    /// in flight are down to this many (`Some`). A batch's verdicts free too little room for
    /// a fetch step, and waking the task for each cost a thread hand-off per plugin call.
    pub(super) wake_at_in_flight: Option<usize>,
}

impl LeaderState {
    /// Holds one record as [`LeaderState::hold_all`] does; returns whether it was not held
    /// already.
    #[cfg(test)]
    pub(super) fn hold(
        &mut self,
        key: (TopicIdPartition, i64),
        now: Instant,
        deliveries: i16,
    ) -> bool {
        self.hold_all(key.0, [(key.1, deliveries)], now) == 1
    }

    /// Holds the records of `tp` the broker just acquired for this member (offset and delivery
    /// count, ascending), their locks started `now`, with one look-up of the partition for
    /// all; returns how many were not held already. A record whose lock expired while the
    /// caller still held it comes back in the same session under the same key: it is one
    /// record held all the same (the first final verdict for either copy settles it, the other
    /// is moot), so the in-flight count takes it once.
    pub(super) fn hold_all(
        &mut self,
        tp: TopicIdPartition,
        records: impl IntoIterator<Item = (i64, i16)>,
        now: Instant,
    ) -> usize {
        self.outstanding.hold_all(
            tp,
            records
                .into_iter()
                .map(|(offset, deliveries)| (offset, Held::new(now, deliveries))),
        )
    }

    /// The entry of `record` while this member holds that very delivery of it: `None` once
    /// its session ended, it was settled, or the broker delivered it again (its lock lapsed and
    /// a fetch of this member's acquired it anew, so other members may have held it between).
    pub(super) fn holding(&self, record: &ShareRecord) -> Option<&Held> {
        self.outstanding
            .get(&record.key())
            .filter(|h| self.session == record.session && h.deliveries == record.delivery_count)
    }

    /// Forgets the outstanding records of `partitions` (their leadership moved away, so their
    /// locks went with it); returns how many there were.
    pub(super) fn release(&mut self, partitions: &BTreeSet<TopicIdPartition>) -> usize {
        let before = self.outstanding.len();
        self.outstanding
            .retain(|(tp, _), _| !partitions.contains(tp));
        before - self.outstanding.len()
    }

    /// How much longer `held` can stay acquired without a verdict (see
    /// [`ShareConsumer::hold_limit`]).
    pub(super) fn hold_limit(&self, held: &Held, auto_renew: bool) -> Option<Duration> {
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
    pub(super) fn due_holds(&mut self, now: Instant) -> (Vec<(RecordKey, Held)>, Option<Instant>) {
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

/// What the heartbeats prove of this member's place in the group. The broker releases a
/// member's records when the group removes it (heartbeats missing for the session timeout),
/// which this member learns only at its next heartbeat that gets through; meanwhile its renewal
/// of a record another member has since acquired and acknowledged may be answered without an
/// error. So a renewal proves a hold only while the membership provably lasts.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Liveness {
    /// When the last heartbeat answered as a member was sent: the group keeps this member at
    /// least a session timeout from then.
    pub(super) ok_sent: Option<Instant>,
    /// When this member last learnt it had been fenced (its records then were released).
    pub(super) fenced_at: Option<Instant>,
}

impl Liveness {
    /// Whether a record whose provable lock started at `acquired` is still this member's as
    /// far as the membership goes, at `now`: acquired after the last fencing, and the last
    /// good heartbeat recent enough that the group certainly keeps the member (a margin to
    /// spare). Always true without a session timeout to count with.
    pub(super) fn keeps(
        &self,
        acquired: Instant,
        session_timeout: Option<Duration>,
        now: Instant,
    ) -> bool {
        if self.fenced_at.is_some_and(|f| f >= acquired) {
            return false;
        }
        match session_timeout {
            None => true,
            Some(t) => self
                .ok_sent
                .is_some_and(|sent| now + super::types::LOCK_MARGIN < sent + t),
        }
    }
}

/// Per partition, the session it is delivered under and the stint that began with it; a
/// partition without an entry starts a new stint.
#[derive(Default)]
pub(super) struct Stints(foldhash::HashMap<TopicIdPartition, (u64, u64)>);

impl Stints {
    /// The stint of `tp` under `session`: the current one, or a new one when the partition's
    /// session changed or its stint was ended.
    pub(super) fn stint(&mut self, tp: TopicIdPartition, session: u64) -> u64 {
        // Unique across every consumer of the process, so a pipeline that replaced its consumer
        // never mistakes a new stint for an old one.
        static NEXT_STINT: AtomicU64 = AtomicU64::new(1);
        match self.0.get(&tp) {
            Some(&(s, stint)) if s == session => stint,
            _ => {
                let stint = NEXT_STINT.fetch_add(1, Ordering::Relaxed);
                self.0.insert(tp, (session, stint));
                stint
            }
        }
    }

    /// Ends `tp`'s stint.
    pub(super) fn end(&mut self, tp: &TopicIdPartition) {
        self.0.remove(tp);
    }
}

/// Everything the caller's API and the tasks of one consumer share, behind one `Arc`.
pub(super) struct Shared {
    pub(super) client: Arc<KafkaClient>,
    pub(super) config: ShareConsumerConfig,
    pub(super) member_id: String,
    pub(super) ledger: Mutex<AckLedger>,
    pub(super) leaders: Mutex<foldhash::HashMap<i32, LeaderState>>,
    /// Which leader serves a partition (for routing verdicts to sessions).
    pub(super) route: Mutex<Route>,
    pub(super) in_flight: AtomicUsize,
    /// Records asked for by fetches not answered yet: their room is taken until then, so
    /// leaders fetching at once never ask for more than the bound together.
    pub(super) reserved: AtomicUsize,
    /// The most records one producer batch has spanned in any response (0: none yet), so a
    /// fitted fetch knows what a whole batch can add.
    pub(super) largest_batch: AtomicUsize,
    /// Final verdicts recorded (the caller's judging rate, for pacing).
    finals: AtomicU64,
    /// Leaders serving assigned partitions now (each fetches within its share of the bound).
    pub(super) active_leaders: AtomicUsize,
    /// Whether fetches may acquire more (off while a caller drains what it holds).
    pub(super) acquiring: AtomicBool,
    /// Whether the coordinator answered the last heartbeat as a member of the group.
    pub(super) joined: AtomicBool,
    /// What the heartbeats prove of the membership (see [`Liveness`]).
    pub(super) liveness: Mutex<Liveness>,
    pace: Mutex<Pace>,
    /// Requests carrying acknowledgements that have not been answered yet.
    pub(super) acks_in_flight: AtomicUsize,
    /// Verdicts arrived or the in-flight count dropped: leader tasks may have work.
    pub(super) wake: Notify,
    /// Acknowledgements answered: flush may be done.
    pub(super) acked: Notify,
    /// Leadership may have moved: remap partitions to leaders.
    pub(super) remap: Notify,
    pub(super) next_session: AtomicU64,
    /// Each partition's current stint (see [`ShareRecord::stint`]).
    stints: Mutex<Stints>,
    pub(super) outcomes: Mutex<VecDeque<AckOutcome>>,
    /// Records the caller renewed, to be delivered to it again (ahead of newly fetched ones).
    pub(super) again: Mutex<Vec<ShareRecord>>,
    /// Something was put in `again`: a waiting `poll` returns it.
    pub(super) again_ready: Notify,
    pub(super) fatal: Mutex<Option<String>>,
    pub(super) stats: ConsumerStats,
    /// Final verdicts the broker never applied, for the records' next delivery here.
    pub(super) remembered: Mutex<Remembered>,
    /// The "no v2 here" warning is said once per consumer, not once per reconnect.
    pub(super) v1_warned: std::sync::Once,
    /// Callers waiting for the broker to confirm renewals, by id.
    pub(super) confirmations: Mutex<Vec<(u64, Confirmation)>>,
    pub(super) next_confirmation: AtomicU64,
}

/// Renewals a caller waits to see applied ([`ShareConsumer::confirm_held`](super::ShareConsumer::confirm_held)).
#[derive(Debug)]
pub(super) struct Confirmation {
    /// When it was asked for: only a request that took its renewals from the ledger since
    /// can confirm them.
    pub(super) asked: Instant,
    /// The records whose renewal has not been answered yet.
    pub(super) wants: std::collections::HashSet<(TopicIdPartition, i64)>,
    /// Told `true` once every renewal was applied, `false` at the first one refused or lost.
    pub(super) done: Option<tokio::sync::oneshot::Sender<bool>>,
}

impl Confirmation {
    /// Whether it is settled after `o` (a renewal of one of its records answered).
    fn answered(&mut self, tp: TopicIdPartition, o: &AckOutcome) -> bool {
        // An older request's answer (an automatic renewal sent before the ask, answered after
        // it) cannot confirm: its renewal may predate what the caller must prove. Its refusal
        // still counts: the record may not be this member's any more.
        let fresh = o.sent.is_some_and(|sent| sent >= self.asked);
        for (offset, kind) in o.batches.iter().flat_map(batch_verdicts) {
            if kind != AckKind::Renew || !self.wants.contains(&(tp, offset)) {
                continue;
            }
            if o.error.is_some() {
                self.finish(false);
                return true;
            }
            if fresh {
                self.wants.remove(&(tp, offset));
            }
        }
        if self.wants.is_empty() {
            self.finish(true);
            return true;
        }
        false
    }

    fn finish(&mut self, held: bool) {
        if let Some(done) = self.done.take() {
            let _ = done.send(held);
        }
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

/// Most records one [`AtLimit`] names (the rest are counted): one log line per batch.
const AT_LIMIT_NAMED: usize = 16;

/// The records one settle released at the group's delivery limit: counted, and the first few
/// named for the log ([`Shared::counted_finals`]).
#[derive(Debug, Default)]
pub(super) struct AtLimit {
    count: u64,
    some: Vec<(TopicIdPartition, i64)>,
}

impl AtLimit {
    /// Notes a release of `offset` of `tp` when `deliveries` reached `limit`.
    pub(super) fn note(
        &mut self,
        limit: Option<i16>,
        deliveries: i16,
        tp: TopicIdPartition,
        offset: i64,
    ) {
        if limit.is_some_and(|l| deliveries >= l) {
            self.count += 1;
            if self.some.len() < AT_LIMIT_NAMED {
                self.some.push((tp, offset));
            }
        }
    }

    /// How many were released at the limit.
    #[cfg(test)]
    pub(super) fn count(&self) -> u64 {
        self.count
    }

    /// Adds what `other` noted.
    pub(super) fn merge(&mut self, other: AtLimit) {
        self.count += other.count;
        let room = AT_LIMIT_NAMED.saturating_sub(self.some.len());
        self.some.extend(other.some.into_iter().take(room));
    }
}

impl Shared {
    /// The leader serving each of `partitions` now, in order. A batch's records come in runs of
    /// one partition, so the route is asked once per run, not once per record.
    pub(super) fn leaders_of<'a>(
        &self,
        partitions: impl Iterator<Item = &'a TopicIdPartition>,
    ) -> Vec<Option<i32>> {
        let route = self.route.lock();
        let mut last: Option<(TopicIdPartition, Option<i32>)> = None;
        partitions
            .map(|tp| match last {
                Some((p, leader)) if p == *tp => leader,
                _ => {
                    let leader = route.get(tp).copied();
                    last = Some((*tp, leader));
                    leader
                }
            })
            .collect()
    }

    /// The state of a consumer not joined yet: nothing held, acquiring, one leader assumed.
    pub(super) fn new(
        client: Arc<KafkaClient>,
        config: ShareConsumerConfig,
        member_id: String,
    ) -> Self {
        let remembered = Mutex::new(Remembered::with_capacity(remembered_capacity(
            config.max_in_flight,
        )));
        Shared {
            client,
            member_id,
            config,
            ledger: Mutex::new(AckLedger::new()),
            leaders: Mutex::new(foldhash::HashMap::default()),
            route: Mutex::new(foldhash::HashMap::default()),
            in_flight: AtomicUsize::new(0),
            reserved: AtomicUsize::new(0),
            largest_batch: AtomicUsize::new(0),
            finals: AtomicU64::new(0),
            active_leaders: AtomicUsize::new(1),
            acquiring: AtomicBool::new(true),
            joined: AtomicBool::new(false),
            liveness: Mutex::new(Liveness::default()),
            pace: Mutex::new(Pace::default()),
            acks_in_flight: AtomicUsize::new(0),
            wake: Notify::new(),
            acked: Notify::new(),
            remap: Notify::new(),
            next_session: AtomicU64::new(1),
            stints: Mutex::new(Stints::default()),
            outcomes: Mutex::new(VecDeque::new()),
            again: Mutex::new(Vec::new()),
            again_ready: Notify::new(),
            fatal: Mutex::new(None),
            stats: ConsumerStats::default(),
            remembered,
            v1_warned: std::sync::Once::new(),
            confirmations: Mutex::new(Vec::new()),
            next_confirmation: AtomicU64::new(0),
        }
    }

    /// Takes `records` out of the in-flight count (never below zero): they were judged, or
    /// the broker released them with their session or leadership.
    pub(super) fn out_of_flight(&self, records: usize) {
        self.in_flight.fetch_sub(
            records.min(self.in_flight.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
    }

    /// Counts `finals` verdicts out of the in-flight bound (and into the pacing rate), and the
    /// releases at the group's delivery limit, which it also logs in one line: the broker
    /// archives each of those records, so the log says which (a counter alone left an
    /// operator no way to find them).
    pub(super) fn counted_finals(&self, finals: usize, at_limit: AtLimit) {
        if finals > 0 {
            self.out_of_flight(finals);
            self.finals.fetch_add(finals as u64, Ordering::Relaxed);
        }
        if at_limit.count == 0 {
            return;
        }
        self.stats
            .released_at_limit
            .fetch_add(at_limit.count, Ordering::Relaxed);
        let mut offsets = at_limit
            .some
            .iter()
            .map(|(tp, o)| format!("{}-{}@{o}", self.topic_name(tp), tp.partition))
            .collect::<Vec<_>>()
            .join(", ");
        if at_limit.count > at_limit.some.len() as u64 {
            offsets.push_str(&format!(
                " and {} more",
                at_limit.count - at_limit.some.len() as u64
            ));
        }
        tracing::warn!(
            group = %self.config.group,
            released = at_limit.count,
            delivery_limit = self.config.archive_at,
            records = %offsets,
            "records released at their last delivery: the broker archives them now (a copy is kept only where the group has a broker-side dead-letter topic; a pipeline's dead_letter_topic with a delivery_cap under the limit dead-letters such records itself)"
        );
    }

    /// How many records this consumer may hold now: 0 while it does not acquire, else
    /// `max_in_flight`, or with pacing what the caller judges within the pace horizon.
    pub(super) fn in_flight_limit(&self) -> usize {
        if !self.acquiring.load(Ordering::Relaxed) {
            return 0;
        }
        let cfg = &self.config;
        let Some(within) = cfg.pace_within else {
            return cfg.max_in_flight;
        };
        let lock_timeout = self
            .leaders
            .lock()
            .values()
            .filter_map(|l| l.lock_timeout)
            .min();
        let horizon = lock_timeout.map_or(within, |t| within.min(t / 2));
        let rate = self
            .pace
            .lock()
            .update(Instant::now(), self.finals.load(Ordering::Relaxed));
        paced_limit(rate, horizon, cfg.min_in_flight.max(1), cfg.max_in_flight)
    }

    pub(super) fn set_fatal(&self, why: String) {
        tracing::error!(group = %self.config.group, "{why}");
        self.fatal.lock().get_or_insert(why);
        self.wake.notify_waiters();
        self.acked.notify_waiters();
    }

    pub(super) fn fatal(&self) -> Option<String> {
        self.fatal.lock().clone()
    }

    pub(super) fn push_outcome(&self, tp: TopicIdPartition, o: AckOutcome) {
        let n = o.offsets();
        match &o.error {
            None => self.stats.acks_ok.fetch_add(n, Ordering::Relaxed),
            Some((e, msg)) => {
                tracing::warn!(group = %self.config.group, topic = %o.topic, partition = o.partition, offsets = n, "acknowledgement refused: {e:?} {msg}");
                // Not applied (or, with no answer, not known to be): the records may come back,
                // and then they are settled with these verdicts, not judged again.
                let mut remembered = self.remembered.lock();
                for b in &o.batches {
                    for (offset, kind) in batch_verdicts(b) {
                        remembered.keep(tp, offset, kind);
                    }
                }
                drop(remembered);
                self.stats.acks_failed.fetch_add(n, Ordering::Relaxed)
            }
        };
        {
            let mut waiting = self.confirmations.lock();
            if !waiting.is_empty() {
                waiting.retain_mut(|(_, c)| !c.answered(tp, &o));
            }
        }
        let mut q = self.outcomes.lock();
        if q.len() >= MAX_OUTCOMES {
            q.pop_front();
        }
        q.push_back(o);
    }

    pub(super) fn topic_name(&self, tp: &TopicIdPartition) -> Arc<str> {
        match self.client.topic_name(tp.topic_id) {
            Some(n) => Arc::from(n.as_str()),
            None => Arc::from(tp.topic_id.to_string().as_str()),
        }
    }

    /// The stint of `tp` under `session` (see [`Stints::stint`]).
    pub(super) fn stint(&self, tp: TopicIdPartition, session: u64) -> u64 {
        self.stints.lock().stint(tp, session)
    }

    /// Ends the stints of `partitions`: what is delivered of them next starts new ones.
    pub(super) fn end_stints<'a>(
        &self,
        partitions: impl IntoIterator<Item = &'a TopicIdPartition>,
    ) {
        let mut stints = self.stints.lock();
        for tp in partitions {
            stints.end(tp);
        }
    }

    /// Ends a leader's session: pending verdicts and outstanding records of it are released by
    /// the broker, so they are dropped here and counted.
    pub(super) fn session_lost(&self, leader: i32, why: &str) {
        self.stats.session_resets.fetch_add(1, Ordering::Relaxed);
        let partitions: BTreeSet<TopicIdPartition> = self
            .route
            .lock()
            .iter()
            .filter(|(_, l)| **l == leader)
            .map(|(tp, _)| *tp)
            .collect();
        // Verdicts not sent yet cannot be any more: report each as not applied (the Java client
        // completes them with NETWORK_EXCEPTION); the broker redelivers those records.
        let dropped = self.ledger.lock().take(|tp| partitions.contains(tp), true);
        let dropped_verdicts: usize = dropped
            .iter()
            .flat_map(|(_, b)| b.iter())
            .map(|b| (b.last_offset - b.first_offset + 1) as usize)
            .sum();
        let unsent = final_effects(&dropped);
        self.stats
            .verdicts_unsent
            .fetch_add(unsent, Ordering::Relaxed);
        for (tp, batches) in dropped {
            self.push_outcome(
                tp,
                AckOutcome {
                    topic: self.topic_name(&tp),
                    partition: tp.partition,
                    batches,
                    error: Some((
                        ResponseError::NetworkException,
                        format!("share session ended before the acknowledgement was sent ({why})"),
                    )),
                    sent: None,
                },
            );
        }
        let outstanding = {
            let mut leaders = self.leaders.lock();
            let st = leaders.entry(leader).or_default();
            st.session = self.next_session.fetch_add(1, Ordering::Relaxed);
            st.holds.clear();
            std::mem::take(&mut st.outstanding).len()
        };
        // Outstanding records leave the in-flight count now; their verdicts will be refused.
        self.out_of_flight(outstanding);
        let released = (dropped_verdicts + outstanding) as u64;
        self.stats
            .released_by_broker
            .fetch_add(released, Ordering::Relaxed);
        tracing::warn!(
            leader,
            released,
            unsent_verdicts = unsent,
            "share session ended ({why}); the broker releases what it held"
        );
        self.wake.notify_waiters();
        self.acked.notify_waiters();
    }

    /// The leadership of `partitions` moved away from `leader` while its session lives on: the
    /// old leader can take no verdict for them any more, so the records held from there leave
    /// the in-flight count, and verdicts not sent yet are reported as not applied. The new
    /// leader delivers those records again.
    pub(super) fn partitions_moved(&self, leader: i32, partitions: &BTreeSet<TopicIdPartition>) {
        self.end_stints(partitions);
        // Outstanding records first: a concurrent `acknowledge` either finished (its verdict is
        // in the ledger, taken below) or finds its record gone and reports it moot.
        let outstanding = self
            .leaders
            .lock()
            .get_mut(&leader)
            .map_or(0, |st| st.release(partitions));
        self.out_of_flight(outstanding);
        let dropped = self.ledger.lock().take(|tp| partitions.contains(tp), true);
        self.stats
            .verdicts_unsent
            .fetch_add(final_effects(&dropped), Ordering::Relaxed);
        let mut dropped_verdicts = 0;
        for (tp, batches) in dropped {
            dropped_verdicts += batches
                .iter()
                .map(|b| (b.last_offset - b.first_offset + 1) as usize)
                .sum::<usize>();
            self.push_outcome(tp, AckOutcome {
                topic: self.topic_name(&tp),
                partition: tp.partition,
                batches,
                error: Some((
                    ResponseError::NotLeaderOrFollower,
                    format!(
                        "the partition's leadership moved away from broker {leader} before the acknowledgement was sent"
                    ),
                )),
                sent: None,
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

/// Each offset of an acknowledgement batch with its verdict (a batch carries one type for the
/// whole range or one per offset); a type the ledger does not know is left out.
fn batch_verdicts(b: &AckBatch) -> impl Iterator<Item = (i64, AckKind)> + '_ {
    (b.first_offset..=b.last_offset)
        .enumerate()
        .filter_map(|(i, offset)| {
            let code = match b.types.as_slice() {
                [one] => *one,
                many => *many.get(i)?,
            };
            AckKind::from_code(code).map(|kind| (offset, kind))
        })
}

/// How many of these acknowledgements are accepts or rejects: a verdict with an effect that the
/// record's next delivery makes again (a release or a renew that never arrives changes nothing).
fn final_effects(acks: &[(TopicIdPartition, Vec<AckBatch>)]) -> u64 {
    let is_final = |t: i8| t == ack_type::ACCEPT || t == ack_type::REJECT;
    let mut n = 0u64;
    for batch in acks.iter().flat_map(|(_, b)| b) {
        let span = u64::try_from(batch.last_offset - batch.first_offset + 1).unwrap_or(0);
        n += match batch.types.as_slice() {
            [one] => {
                if is_final(*one) {
                    span
                } else {
                    0
                }
            }
            many => many.iter().filter(|t| is_final(**t)).count() as u64,
        };
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_renewal_is_confirmed_only_by_a_request_sent_since_the_ask_and_refused_by_any() {
        let asked = Instant::now();
        let (before, after) = (
            asked - Duration::from_secs(3),
            asked + Duration::from_millis(5),
        );
        let outcome = |sent: Option<Instant>, error: bool| AckOutcome {
            topic: Arc::from("t"),
            partition: 0,
            batches: vec![AckBatch {
                first_offset: 5,
                last_offset: 6,
                types: vec![ack_type::RENEW],
            }],
            error: error.then(|| (ResponseError::InvalidRecordState, String::new())),
            sent,
        };
        let waiter = |rx: &mut Option<tokio::sync::oneshot::Receiver<bool>>| {
            let (done, answer) = tokio::sync::oneshot::channel();
            *rx = Some(answer);
            Confirmation {
                asked,
                wants: [(tp(0), 5), (tp(0), 6)].into_iter().collect(),
                done: Some(done),
            }
        };
        let mut rx = None;
        // An automatic renewal sent before the ask, answered after it: no confirmation.
        let mut c = waiter(&mut rx);
        assert!(!c.answered(tp(0), &outcome(Some(before), false)));
        assert!(!c.answered(tp(0), &outcome(None, false)));
        assert_eq!(c.wants.len(), 2, "still waiting for its own renewal");
        assert!(c.answered(tp(0), &outcome(Some(after), false)));
        assert_eq!(rx.take().and_then(|mut r| r.try_recv().ok()), Some(true));
        // A refusal counts whenever its request was sent.
        let mut c = waiter(&mut rx);
        assert!(c.answered(tp(0), &outcome(Some(before), true)));
        assert_eq!(rx.take().and_then(|mut r| r.try_recv().ok()), Some(false));
        // Another partition's answer is not this one's.
        let mut c = waiter(&mut rx);
        assert!(!c.answered(tp(1), &outcome(Some(after), false)));
    }

    #[test]
    fn a_partitions_stint_lasts_while_its_session_does_and_nothing_ended_it() {
        let mut stints = Stints::default();
        let first = stints.stint(tp(0), 7);
        assert_eq!(
            stints.stint(tp(0), 7),
            first,
            "the same session, nothing ended"
        );
        let other = stints.stint(tp(1), 7);
        assert_ne!(other, first, "another partition has its own");
        let moved = stints.stint(tp(0), 8);
        assert_ne!(
            moved, first,
            "another session (a reconnect, another leader)"
        );
        // Back under the first session (moved to another leader and back): the share
        // partition there may have been rebuilt meanwhile.
        let back = stints.stint(tp(0), 7);
        assert!(back != first && back != moved);
        stints.end(&tp(0));
        let after_error = stints.stint(tp(0), 7);
        assert!(after_error != back, "a fetch error or a move ended it");
        assert_eq!(
            stints.stint(tp(1), 7),
            other,
            "ending one leaves the others"
        );
        // Another consumer's stints never repeat these.
        let mut elsewhere = Stints::default();
        assert!(elsewhere.stint(tp(0), 7) > after_error);
    }

    #[test]
    fn a_record_is_held_under_the_delivery_and_session_it_came_with_only() {
        let record =
            |session: u64, deliveries: i16| ShareRecord::bare(tp(0), 5, session, deliveries);
        let mut st = LeaderState {
            session: 3,
            ..LeaderState::default()
        };
        assert!(st.hold((tp(0), 5), Instant::now(), 2));
        assert!(st.holding(&record(3, 2)).is_some());
        // Its lock lapsed and a fetch of this member's took it again: the older copy's
        // renewal would speak for the newer one.
        assert!(st.holding(&record(3, 1)).is_none(), "an older delivery");
        assert!(st.holding(&record(2, 2)).is_none(), "an ended session");
        st.outstanding.clear();
        assert!(st.holding(&record(3, 2)).is_none(), "settled");
    }

    #[test]
    fn the_membership_keeps_a_record_only_after_the_last_fencing_and_within_a_session_of_a_good_heartbeat()
     {
        let t0 = Instant::now();
        let session = Some(Duration::from_secs(6));
        let mut l = Liveness::default();
        assert!(l.keeps(t0, None, t0), "nothing to count with: kept");
        assert!(!l.keeps(t0, session, t0), "no heartbeat answered yet");
        l.ok_sent = Some(t0);
        assert!(l.keeps(t0, session, t0 + Duration::from_secs(4)));
        // The group may have removed the member a session after its last good heartbeat was
        // sent; a margin to spare.
        assert!(!l.keeps(t0, session, t0 + Duration::from_secs(5)));
        // Fenced: what was acquired before is gone, what came after is kept.
        l.fenced_at = Some(t0 + Duration::from_secs(1));
        l.ok_sent = Some(t0 + Duration::from_secs(2));
        assert!(!l.keeps(t0, session, t0 + Duration::from_secs(3)));
        assert!(l.keeps(
            t0 + Duration::from_secs(2),
            session,
            t0 + Duration::from_secs(3)
        ));
    }

    #[test]
    fn only_accepts_and_rejects_count_as_unsent_effects() {
        let batch = |first, last, types: &[i8]| AckBatch {
            first_offset: first,
            last_offset: last,
            types: types.to_vec(),
        };
        let acks = vec![
            (
                tp(0),
                vec![
                    batch(0, 9, &[ack_type::ACCEPT]),
                    batch(10, 14, &[ack_type::RELEASE]),
                ],
            ),
            (
                tp(1),
                vec![batch(
                    3,
                    6,
                    &[
                        ack_type::REJECT,
                        ack_type::RENEW,
                        ack_type::ACCEPT,
                        ack_type::GAP,
                    ],
                )],
            ),
        ];
        assert_eq!(final_effects(&acks), 10 + 2);
        assert_eq!(final_effects(&[]), 0);
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

//! The caller's API: [`ShareConsumer`] starts the heartbeat and the supervisor, hands out
//! what the leader tasks fetched, and records what the caller decides for each record
//! (`acknowledge`, `settle`, `release_holds`) in the shared state, where the leader tasks pick
//! it up. Nothing here talks to a broker; no other room of the engine uses this one.

use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use sharehost_kafka::{KafkaClient, KafkaError};

use super::heartbeat::heartbeat_loop;
use super::shared::{AtLimit, Confirmation, LeaderState, Shared};
use super::supervisor::fetch_supervisor;
use super::types::{
    AckOutcome, ConsumerStats, Delivery, LOCK_MARGIN, Settle, Settled, ShareConsumerConfig,
    ShareError, ShareRecord,
};
use crate::ledger::{AckKind, AckLedger, TopicIdPartition};
use crate::membership::Membership;

/// A running share consumer. `poll` from one task; `acknowledge` from any.
pub struct ShareConsumer {
    shared: Arc<Shared>,
    deliveries: tokio::sync::Mutex<mpsc::Receiver<Delivery>>,
    stop_fetching: CancellationToken,
    leave: CancellationToken,
    tasks: tokio::sync::Mutex<JoinSet<()>>,
    assignment: watch::Receiver<BTreeSet<TopicIdPartition>>,
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
        let member_id = membership.member_id().to_owned();
        let shared = Arc::new(Shared::new(client, config, member_id));
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
        let assignment = assign_rx.clone();
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
            assignment,
        })
    }

    /// The member id this consumer uses.
    pub fn member_id(&self) -> &str {
        &self.shared.member_id
    }

    /// The partitions the group coordinator assigns this member, as a watch: an operator's view
    /// of where the work is, and something to await when the assignment changes (another
    /// member joins or leaves). Records acquired before a partition left stay this member's
    /// to judge.
    pub fn assignment(&self) -> watch::Receiver<BTreeSet<TopicIdPartition>> {
        self.assignment.clone()
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
        self.shared
            .leaders
            .lock()
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
        let leader = self.shared.route.lock().get(&record.partition).copied();
        let leaders = self.shared.leaders.lock();
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

    /// The time left on `record`'s lock as this member can prove it: counted from when the
    /// request that acquired it was sent, or from when a renewal the broker confirmed was asked
    /// for ([`ShareConsumer::confirm_held`]), so never more than the broker granted; other
    /// renewals do not count (one is counted when recorded, before the broker confirms it, and
    /// a host resumed after a pause past its lock would record one for a record already gone); zero
    /// when the lock time is unknown or this delivery of the record is no longer held (one
    /// since restarts the lock of the newer copy, not of this one, and other members may have
    /// held the record in between). Work that must finish while the record is certainly this
    /// member's (a transaction's commit) checks it last.
    pub fn lock_left(&self, record: &ShareRecord) -> Duration {
        let leader = self.shared.route.lock().get(&record.partition).copied();
        let leaders = self.shared.leaders.lock();
        let Some(st) = leader.and_then(|l| leaders.get(&l)) else {
            return Duration::ZERO;
        };
        match (st.lock_timeout, st.holding(record)) {
            (Some(lock), Some(held))
                if self.shared.liveness.lock().keeps(
                    held.acquired,
                    self.shared.config.member_session_timeout,
                    Instant::now(),
                ) =>
            {
                lock.saturating_sub(held.acquired.elapsed())
            }
            _ => Duration::ZERO,
        }
    }

    /// Renews `records`' locks now and waits (at most `timeout`) for the broker's answer:
    /// `Ok(true)` only when the broker applied every renewal, so each record was still this
    /// member's when the broker read the request (no other member held it in between: a record
    /// it held, or settled, is not this member's to renew) and its lock runs a full duration
    /// from then. Work that may only be done while the records are certainly this member's (a
    /// transaction's commit) asks this last: a session the broker ended unseen (a connection
    /// cut on its side only) answers `Ok(false)` here, where the local clock of
    /// [`ShareConsumer::lock_left`] still shows time left. An error when the broker cannot
    /// renew (Kafka before 4.2).
    ///
    /// Only an answer within the lock proves anything: Kafka 4.4 answers a renewal of a record
    /// another member has since acquired and acknowledged without an error (seen with a host
    /// resumed after a pause past its lock), so the renewal must reach the broker while the
    /// lock certainly holds, and `timeout` is at most what is left of it. For the same
    /// reason the group must certainly keep this member until the answer (see
    /// `ShareConsumerConfig::member_session_timeout`).
    pub async fn confirm_held(
        &self,
        records: &[&ShareRecord],
        timeout: Duration,
    ) -> Result<bool, ShareError> {
        if records.is_empty() {
            return Ok(true);
        }
        // A record whose lock may have run out is not asked about: a renewal the broker
        // applies now says the record is this member's now, not that it was all along (another
        // member may have held it in between, and the broker may even have given it back to
        // this member under the same key). One margin covers the request's way to the broker.
        if records.iter().any(|r| self.lock_left(r) <= LOCK_MARGIN) {
            return Ok(false);
        }
        // The broker renews after it reads the request, and only a request that takes the
        // renewals from the ledger from now on can confirm them, so a lock it confirms runs
        // at least from here.
        let asked = Instant::now();
        let (done, answer) = tokio::sync::oneshot::channel();
        let id = self
            .shared
            .next_confirmation
            .fetch_add(1, Ordering::Relaxed);
        let wants = records.iter().map(|r| r.key()).collect();
        // Registered before the renewals are recorded: an answer cannot come before it.
        self.shared.confirmations.lock().push((
            id,
            Confirmation {
                asked,
                wants,
                done: Some(done),
            },
        ));
        let forget = || self.shared.confirmations.lock().retain(|(i, _)| *i != id);
        let renewals: Vec<(&ShareRecord, AckKind)> =
            records.iter().map(|r| (*r, AckKind::Renew)).collect();
        for recorded in self.acknowledge_all(&renewals) {
            match recorded {
                Ok(true) => {}
                Ok(false) => {
                    forget();
                    return Ok(false);
                }
                Err(e) => {
                    forget();
                    return Err(e);
                }
            }
        }
        let held = tokio::time::timeout(timeout, answer)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(false);
        forget();
        // The membership must hold until the answer, too (a fenced member's renewal of a
        // record released with it may be answered without an error).
        let held = held && records.iter().all(|r| !self.lock_left(r).is_zero());
        if held {
            // Proven: their locks restart from when the renewal was asked for. (The route and
            // the leaders are locked one after the other, never together, as everywhere.)
            let leaders_of = self.shared.leaders_of(records.iter().map(|r| &r.partition));
            let mut leaders = self.shared.leaders.lock();
            for (r, leader) in records.iter().zip(leaders_of) {
                if let Some(st) = leader.and_then(|l| leaders.get_mut(&l))
                    && st.session == r.session
                    && let Some(h) = st.outstanding.get_mut(&r.key())
                    && h.deliveries == r.delivery_count
                {
                    h.acquired = h.acquired.max(asked);
                }
            }
        }
        Ok(held)
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
            let renewed = std::mem::take(&mut *self.shared.again.lock());
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
    /// costly work does not judge records whose verdicts could no longer land; and settles, with
    /// it, each record whose verdict was lost with an earlier session (made while the record was
    /// already back here). Returns how many were dropped either way. One pass under the
    /// engine's locks for the whole batch.
    pub fn retain_held(&self, records: &mut Vec<ShareRecord>) -> usize {
        let before = records.len();
        // Never both locks at once: every other path takes them one at a time.
        let owners = self.shared.leaders_of(records.iter().map(|r| &r.partition));
        let leaders = self.shared.leaders.lock();
        // Asked once per run of consecutive offsets of one partition and session (one look-up
        // for a batch's records of a partition); a run not held whole, record by record.
        let mut keep = Vec::with_capacity(records.len());
        let mut i = 0;
        while let Some(head) = records.get(i..).and_then(|r| r.first()) {
            let len = 1 + records[i..]
                .windows(2)
                .take_while(|w| same_run(&w[0], &w[1]))
                .count();
            let st = owners
                .get(i)
                .copied()
                .flatten()
                .and_then(|l| leaders.get(&l))
                .filter(|st| st.session == head.session);
            let last = records[i + len - 1].record.offset;
            if st.is_some_and(|st| {
                st.outstanding
                    .holds_run(&head.partition, head.record.offset, last)
            }) {
                keep.resize(keep.len() + len, true);
            } else {
                keep.extend(
                    records[i..i + len]
                        .iter()
                        .map(|r| st.is_some_and(|st| st.outstanding.contains_key(&r.key()))),
                );
            }
            i += len;
        }
        drop(leaders);
        let mut keep = keep.into_iter();
        records.retain(|_| keep.next().unwrap_or(false));
        let replay: Vec<(usize, AckKind)> = {
            let mut remembered = self.shared.remembered.lock();
            if remembered.is_empty() {
                Vec::new()
            } else {
                records
                    .iter()
                    .enumerate()
                    .filter_map(|(i, r)| {
                        remembered
                            .take(r.partition, r.record.offset)
                            .map(|k| (i, k))
                    })
                    .collect()
            }
        };
        if !replay.is_empty() {
            let decisions: Vec<(&ShareRecord, Settle)> = replay
                .iter()
                .map(|(i, kind)| (&records[*i], Settle::Final(*kind)))
                .collect();
            let taken = self
                .settle(&decisions)
                .iter()
                .filter(|r| matches!(r, Settled::Taken))
                .count();
            self.shared
                .stats
                .verdicts_replayed
                .fetch_add(taken as u64, Ordering::Relaxed);
            let mut settled = replay.iter().map(|(i, _)| *i).peekable();
            let mut i = 0;
            records.retain(|_| {
                let keep = settled.peek() != Some(&i);
                if !keep {
                    settled.next();
                }
                i += 1;
                keep
            });
        }
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
        let leaders_of = self
            .shared
            .leaders_of(verdicts.iter().map(|(r, _)| &r.partition));
        let (mut recorded, mut finals, mut at_limit) = (false, 0, AtLimit::default());
        let archive_at = self.shared.config.archive_at;
        let results = {
            let mut leaders = self.shared.leaders.lock();
            let mut ledger = self.shared.ledger.lock();
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
                    if kind == AckKind::Release {
                        at_limit.note(
                            archive_at,
                            record.delivery_count,
                            record.partition,
                            record.record.offset,
                        );
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
        let leaders_of = self
            .shared
            .leaders_of(decisions.iter().map(|(r, _)| &r.partition));
        let auto_renew = self.shared.config.auto_renew_after.is_some();
        let archive_at = self.shared.config.archive_at;
        let now = Instant::now();
        let (mut recorded, mut finals, mut holds) = (false, 0usize, false);
        let mut at_limit = AtLimit::default();
        let mut replayed = 0u64;
        let mut again = Vec::new();
        let (mut run_finals, mut run_at_limit) = (0usize, AtLimit::default());
        let wake_at: Vec<Option<usize>>;
        let results: Vec<Settled> = {
            let mut leaders = self.shared.leaders.lock();
            let mut ledger = self.shared.ledger.lock();
            wake_at = leaders.values().map(|st| st.wake_at_in_flight).collect();
            let mut one = |leaders: &mut foldhash::HashMap<i32, LeaderState>,
                           ledger: &mut AckLedger,
                           (record, decision): &(&ShareRecord, Settle),
                           leader: Option<i32>| {
                let Some(st) = leader.and_then(|l| leaders.get_mut(&l)) else {
                    return Settled::Moot;
                };
                let key = record.key();
                if st.session != record.session {
                    // The broker released the record with its session and this member has
                    // it again, not settled yet: the verdict, made and acted on, applies
                    // to that delivery (which then is never judged).
                    if let Settle::Final(kind @ (AckKind::Accept | AckKind::Reject)) = decision
                        && st.outstanding.contains_key(&key)
                        && ledger
                            .record(record.partition, record.record.offset, *kind)
                            .is_ok()
                    {
                        st.outstanding.remove(&key);
                        recorded = true;
                        finals += 1;
                        replayed += 1;
                        return Settled::Taken;
                    }
                    return Settled::Moot;
                }
                // A final verdict (most of them) costs one lookup: the record leaves
                // the outstanding map at once, and comes back should the ledger refuse it.
                if let Settle::Final(kind) = decision
                    && *kind != AckKind::Gap
                {
                    let Some(held) = st.outstanding.remove(&key) else {
                        return Settled::Moot;
                    };
                    if let Err(e) = ledger.record(record.partition, record.record.offset, *kind) {
                        st.outstanding.insert(key, held);
                        return Settled::Refused(e.to_string());
                    }
                    recorded = true;
                    finals += 1;
                    if *kind == AckKind::Release {
                        at_limit.note(archive_at, record.delivery_count, key.0, key.1);
                    }
                    return Settled::Taken;
                }
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
                        if let Err(e) =
                            ledger.record(record.partition, record.record.offset, AckKind::Renew)
                        {
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
                            st.holds
                                .push(Reverse((at, record.partition, record.record.offset)));
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
                if kind == AckKind::Release {
                    at_limit.note(archive_at, record.delivery_count, key.0, key.1);
                }
                result
            };
            let mut results = Vec::with_capacity(decisions.len());
            let mut i = 0;
            while let Some(head) = decisions.get(i..).filter(|d| !d.is_empty()) {
                let leader = leaders_of.get(i).copied().flatten();
                let len = run_len(head);
                if len > 1
                    && let Some(st) = leader.and_then(|l| leaders.get_mut(&l))
                    && let Some(at_limit) = settle_run(st, &mut ledger, &head[..len], archive_at)
                {
                    run_finals += len;
                    run_at_limit.merge(at_limit);
                    results.extend(std::iter::repeat_n(Settled::Taken, len));
                    i += len;
                    continue;
                }
                // One by one, the whole run: a run that could not be settled at once is not
                // looked at again from each of its records.
                for (d, leader) in head[..len].iter().zip(&leaders_of[i..]) {
                    results.push(one(&mut leaders, &mut ledger, d, *leader));
                }
                i += len;
            }
            results
        };
        recorded |= run_finals > 0;
        finals += run_finals;
        at_limit.merge(run_at_limit);
        self.shared.counted_finals(finals, at_limit);
        if replayed > 0 {
            self.shared
                .stats
                .verdicts_replayed
                .fetch_add(replayed, Ordering::Relaxed);
        }
        // A verdict for a record whose session ended (or that moved away) comes too late for
        // the broker, but its effects happened: kept for the record's next delivery here.
        let mut remembered = None;
        for ((record, decision), result) in decisions.iter().zip(&results) {
            if let (Settled::Moot, Settle::Final(kind)) = (result, decision) {
                remembered
                    .get_or_insert_with(|| self.shared.remembered.lock())
                    .keep(record.partition, record.record.offset, *kind);
            }
        }
        drop(remembered);
        let urgent = holds || !again.is_empty();
        if !again.is_empty() {
            self.shared.again.lock().extend(again);
            self.shared.again_ready.notify_waiters();
        }
        let in_flight = self.shared.in_flight.load(Ordering::Relaxed);
        if settle_wakes(&wake_at, in_flight, recorded, urgent) {
            self.shared.wake.notify_waiters();
        }
        results
    }

    /// Releases every record the caller holds back now, not at its time (a caller that drains
    /// gives them back at once: the next member honours the delay no less than a redelivery
    /// does). Returns how many were released.
    pub fn release_holds(&self) -> usize {
        let (mut released, mut at_limit) = (0, AtLimit::default());
        let archive_at = self.shared.config.archive_at;
        {
            let mut leaders = self.shared.leaders.lock();
            let mut ledger = self.shared.ledger.lock();
            for st in leaders.values_mut() {
                st.holds.clear();
                let due: Vec<(TopicIdPartition, i64)> = st
                    .outstanding
                    .iter()
                    .filter(|(_, h)| h.release_at.is_some())
                    .map(|(k, _)| k)
                    .collect();
                for key in due {
                    let Some(held) = st.outstanding.remove(&key) else {
                        continue;
                    };
                    if ledger.record(key.0, key.1, AckKind::Release).is_ok() {
                        released += 1;
                        at_limit.note(archive_at, held.deliveries, key.0, key.1);
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
        self.shared.outcomes.lock().drain(..).collect()
    }

    /// Waits until every verdict recorded so far has been sent and answered, or `timeout`.
    /// Returns whether it got there.
    pub async fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let acked = self.shared.acked.notified();
            tokio::pin!(acked);
            acked.as_mut().enable();
            let done = self.shared.ledger.lock().is_empty()
                && self.shared.acks_in_flight.load(Ordering::Acquire) == 0;
            if done {
                return true;
            }
            if self.shared.fatal().is_some() {
                return false;
            }
            // Nothing waits for the rest of its range now: everything recorded goes out.
            self.shared.ledger.lock().release_ranges();
            self.shared.wake.notify_waiters();
            if tokio::time::timeout_at(deadline, acked).await.is_err() {
                return false;
            }
        }
    }

    /// Cuts every share connection as a network failure would (fault-injection tests): the
    /// broker drops the sessions and releases their records; the engine re-opens them.
    pub fn disconnect_for_testing(&self) {
        for st in self.shared.leaders.lock().values() {
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

/// How many decisions at the head of `decisions` form a run: records of one partition and
/// one session at consecutive offsets with one final verdict (a plugin call's records judged
/// alike: nearly every batch). At least 1 (the head alone) when `decisions` is not empty.
fn run_len(decisions: &[(&ShareRecord, Settle)]) -> usize {
    let Some((_, head @ Settle::Final(kind))) = decisions.first() else {
        return usize::from(!decisions.is_empty());
    };
    if *kind == AckKind::Gap {
        return 1;
    }
    1 + decisions
        .windows(2)
        .take_while(|w| {
            let ((a, _), (b, d)) = (&w[0], &w[1]);
            d == head && same_run(a, b)
        })
        .count()
}

/// Whether `b` follows `a` in a run: the same partition and session, the next offset.
fn same_run(a: &ShareRecord, b: &ShareRecord) -> bool {
    b.partition == a.partition
        && b.session == a.session
        && a.record.offset.checked_add(1) == Some(b.record.offset)
}

/// Settles a run ([`run_len`]) at once when every record of it is held by `st` in its session
/// and none has a verdict pending: one look-up of the partition's records and one run of the
/// ledger for all, where each record cost a look-up in both. Returns the records it released at
/// the group's delivery limit; `None` (nothing changed) leaves the run to be
/// settled one by one, with the outcome that has.
fn settle_run(
    st: &mut LeaderState,
    ledger: &mut AckLedger,
    run: &[(&ShareRecord, Settle)],
    archive_at: Option<i16>,
) -> Option<AtLimit> {
    let ((head, Settle::Final(kind)), Some((tail, _))) = (run.first()?, run.last()) else {
        return None;
    };
    if head.session != st.session {
        return None;
    }
    let (tp, first, last) = (head.partition, head.record.offset, tail.record.offset);
    if !st.outstanding.holds_run(&tp, first, last) || !ledger.record_run(tp, first, last, *kind) {
        return None;
    }
    let taken = st.outstanding.remove_run(&tp, first, last);
    debug_assert_eq!(
        taken,
        Some(run.len()),
        "held a moment ago, under the same lock"
    );
    let mut at_limit = AtLimit::default();
    if *kind == AckKind::Release {
        for (r, _) in run {
            at_limit.note(archive_at, r.delivery_count, r.partition, r.record.offset);
        }
    }
    Some(at_limit)
}

/// Whether a settle wakes the leaders' tasks: a renewal or a hold (`urgent`) at once, since
/// the task acts on them; a recorded final verdict when some task wants to hear of any
/// (`None`) or the records in flight are down to the room a task waits for
/// (see `LeaderState::wake_at_in_flight`).
fn settle_wakes(wake_at: &[Option<usize>], in_flight: usize, recorded: bool, urgent: bool) -> bool {
    urgent || (recorded && wake_at.iter().any(|at| at.is_none_or(|at| in_flight <= at)))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tokio::time::Instant;
    use uuid::Uuid;

    use super::{LeaderState, Settle, ShareRecord, run_len, settle_run, settle_wakes};
    use crate::ledger::{AckKind, AckLedger, TopicIdPartition};

    fn tp(p: i32) -> TopicIdPartition {
        TopicIdPartition {
            topic_id: Uuid::from_u128(9),
            partition: p,
        }
    }

    fn record(p: i32, offset: i64, session: u64) -> ShareRecord {
        ShareRecord::bare(tp(p), offset, session, 1 + (offset % 3) as i16)
    }

    fn final_kind() -> impl Strategy<Value = AckKind> {
        prop_oneof![
            Just(AckKind::Accept),
            Just(AckKind::Release),
            Just(AckKind::Reject),
            Just(AckKind::Gap)
        ]
    }

    proptest! {
        /// A run settled at once changes the records held and the ledger exactly as settling
        /// its records one by one does (each taken out and its verdict recorded), and is left
        /// alone, nothing changed, when one of its records is not held in the session or
        /// already has a verdict pending.
        #[test]
        fn a_run_settles_as_its_records_one_by_one(
            held in proptest::collection::btree_set(0i64..60, 0..60),
            pending in proptest::collection::vec((0i64..60, final_kind()), 0..6),
            offsets in proptest::collection::vec((0i64..60, 0i32..2, 0u64..4), 1..40),
            kind in final_kind(),
            session in 1u64..3,
        ) {
            let now = Instant::now();
            let mut st = LeaderState { session: 1, ..LeaderState::default() };
            st.hold_all(tp(0), held.iter().map(|o| (*o, 1)), now);
            let mut ledger = AckLedger::new();
            ledger.acquired(tp(0), 0, 59);
            for (o, k) in &pending {
                let _ = ledger.record(tp(0), *o, *k);
            }
            // Mostly consecutive offsets of partition 0 in the session, now and then not.
            let start = offsets[0].0;
            let records: Vec<ShareRecord> = offsets.iter().enumerate().map(|(i, (jump, p, s))| {
                let o = start + i as i64 + i64::from(*jump == 7);
                record(if *s == 0 { *p } else { 0 }, o, if *s == 3 { session } else { 1 })
            }).collect();
            let decisions: Vec<(&ShareRecord, Settle)> = records.iter().map(|r| (r, Settle::Final(kind))).collect();
            let len = run_len(&decisions);
            prop_assert!(len >= 1 && len <= decisions.len());
            prop_assert!(kind != AckKind::Gap || len == 1);
            prop_assert!(decisions[..len].windows(2).all(|w| super::same_run(w[0].0, w[1].0)));
            let run = &decisions[..len];
            let keys: Vec<(TopicIdPartition, i64)> = run.iter().map(|(r, _)| r.key()).collect();
            let whole = len > 1
                && run.iter().all(|(r, _)| r.session == 1)
                && keys.iter().all(|k| st.outstanding.contains_key(k))
                && keys.iter().all(|(_, o)| !pending.iter().any(|(p, _)| p == o));
            let (mut one_st, mut one_ledger) = (LeaderState { session: 1, ..LeaderState::default() }, ledger.clone());
            one_st.hold_all(tp(0), held.iter().map(|o| (*o, 1)), now);
            let got = if len > 1 { settle_run(&mut st, &mut ledger, run, Some(2)) } else { None };
            prop_assert_eq!(got.is_some(), whole);
            if whole {
                for k in &keys {
                    prop_assert!(one_st.outstanding.remove(k).is_some());
                    prop_assert!(one_ledger.record(k.0, k.1, kind).is_ok());
                }
                let at_limit = if kind == AckKind::Release {
                    run.iter().filter(|(r, _)| r.delivery_count >= 2).count() as u64
                } else { 0 };
                prop_assert_eq!(got.map(|a| a.count()), Some(at_limit));
            }
            let held_now = |s: &LeaderState| s.outstanding.iter().map(|(k, _)| k).collect::<Vec<_>>();
            prop_assert_eq!(held_now(&st), held_now(&one_st));
            prop_assert_eq!(
                format!("{:?}", ledger.take(|_| true, true)),
                format!("{:?}", one_ledger.take(|_| true, true))
            );
        }
    }

    #[test]
    fn a_final_verdict_wakes_a_leader_waiting_for_room_only_once_the_room_is_there() {
        // One leader in a fetch, one waiting for in-flight to fall to 4000.
        let waiting = [Some(0), Some(4000)];
        assert!(!settle_wakes(&waiting, 4100, true, false));
        assert!(settle_wakes(&waiting, 4000, true, false));
        // A leader that wants any verdict (between requests, dry, revoked) hears of each.
        assert!(settle_wakes(&[Some(4000), None], 4100, true, false));
        // Renewals and holds always wake; nothing recorded, nothing to hear.
        assert!(settle_wakes(&waiting, 4100, false, true));
        assert!(!settle_wakes(&[None], 10, false, false));
        // No leader at all (all sessions gone): nobody to wake.
        assert!(!settle_wakes(&[], 0, true, false));
    }
}

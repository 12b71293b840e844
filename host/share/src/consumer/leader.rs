//! One task per partition leader: a dedicated connection (share sessions live and die with
//! it), one [`ShareSession`], strictly one request at a time. Each step it releases the
//! caller's due holds, queues auto-renewals, then fetches (carrying verdicts), acknowledges
//! alone (renewals, or verdicts that waited at the in-flight bound), closes the session when
//! nothing is left to serve, or waits for a verdict. What a response brings becomes
//! deliveries for the caller, Gaps, releases and poison.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::ApiKey;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use sharehost_kafka::backoff::{Backoff, BackoffConfig};
use sharehost_kafka::error::CodeDisplay;
use sharehost_kafka::protocol::share::{
    AckBatch, SHARE_VERSIONS, ShareAcknowledgeRequest, ShareFetchRequest, ShareFetchResponse,
};
use sharehost_kafka::records::{batch_spans, decode_batches};
use sharehost_kafka::{BrokerConnection, ErrorClass, KafkaError, classify};

use super::count_guard::Raised;
use super::decisions::{
    MAX_UNRECORDED_OFFSETS, by_partition, count_type, cuts_a_batch, fetch_ask, plan_unrecorded,
    served,
};
use super::shared::{AtLimit, Shared};
use super::types::{AckOutcome, AcquireMode, Delivery, RoundTrip, ShareRecord};
use crate::ledger::{AckKind, TopicIdPartition};
use crate::session::{SessionOutcome, ShareSession};

/// One leader: a dedicated connection (share sessions live and die with it), one session, and
/// strictly one request at a time.
pub(super) async fn leader_loop(
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
    worker.shared.leaders.lock().remove(&leader);
}

/// What one leader's task keeps between its steps.
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
                let mut leaders = self.shared.leaders.lock();
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
            &self.shared.route.lock(),
        )
    }

    /// Releases the records the caller held back whose time has come; returns when the next
    /// one is due, so the loop wakes for it.
    fn release_due_holds(&self) -> Option<Instant> {
        let now = Instant::now();
        let archive_at = self.shared.config.archive_at;
        let (due, next) = {
            let mut leaders = self.shared.leaders.lock();
            let st = leaders.get_mut(&self.leader)?;
            st.due_holds(now)
        };
        if !due.is_empty() {
            let mut ledger = self.shared.ledger.lock();
            let (mut released, mut at_limit) = (0, AtLimit::default());
            for ((tp, offset), held) in due {
                if ledger.record(tp, offset, AckKind::Release).is_ok() {
                    released += 1;
                    at_limit.note(archive_at, held.deliveries, tp, offset);
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
        let mut leaders = self.shared.leaders.lock();
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
        let mut ledger = self.shared.ledger.lock();
        // Records delivered after this scan are held since `now` or later, so none is due
        // before the earliest `since` left here plus `due`.
        let mut earliest = now;
        for ((tp, offset), held) in st.outstanding.iter_mut() {
            if now.duration_since(held.since) >= due
                && ledger.record(tp, offset, AckKind::Renew).is_ok()
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
        self.wake_at_in_flight(None);
        let next_hold = self.release_due_holds();
        self.schedule_auto_renew();
        let wanted = self.wanted_rx.borrow_and_update().clone();
        let serves = self.serves(session);
        let (has_renew, has_acks) = {
            let ledger = self.shared.ledger.lock();
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
        let own = self
            .shared
            .leaders
            .lock()
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
        let prefetch = self
            .shared
            .leaders
            .lock()
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
            // Nothing of a settle matters to a fetch under way but renewals and holds.
            self.wake_at_in_flight(Some(0));
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
            // Only room for a fetch step lets the verdicts go out before ACK_LINGER (they wait
            // for a fetch to ride on): a final verdict wakes this task once it makes that room.
            let room_at = limit
                .saturating_sub(self.shared.reserved.load(Ordering::Relaxed))
                .saturating_sub(step);
            self.wake_at_in_flight(Some(room_at));
            tokio::select! {
                _ = &mut wake => {}
                _ = self.stop.cancelled() => {}
                _ = tokio::time::sleep_until(until) => {}
            }
            return Step::Continue;
        }
        self.acks_waiting_since = None;
        if wanted.is_empty() {
            let holding = self
                .shared
                .leaders
                .lock()
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

    /// Sets what of a settle wakes this task (see `LeaderState::wake_at_in_flight`).
    fn wake_at_in_flight(&self, at: Option<usize>) {
        if let Some(st) = self.shared.leaders.lock().get_mut(&self.leader) {
            st.wake_at_in_flight = at;
        }
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
            self.shared
                .ledger
                .lock()
                .take_ready(|tp| serves.contains(tp), Instant::now())
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
        // only for what is left (and given back if this task is aborted mid-request).
        let shared = self.shared.clone();
        let reserved = Raised::by(&shared.reserved, ask.at_most);
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
        let carried_acks =
            (!acks.is_empty()).then(|| Raised::by(&shared.acks_in_flight, 1).waking(&shared.acked));
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
                self.on_fetch_response(session, &part.wanted, &acks, resp, started)
                    .await
            }
        };
        drop(reserved);
        let held = self.shared.in_flight.load(Ordering::Relaxed) as u64;
        self.shared
            .stats
            .in_flight_peak
            .fetch_max(held, Ordering::Relaxed);
        drop(carried_acks);
        step
    }

    async fn on_fetch_response(
        &mut self,
        session: &mut ShareSession,
        wanted: &BTreeSet<TopicIdPartition>,
        acks: &[(TopicIdPartition, Vec<AckBatch>)],
        resp: ShareFetchResponse,
        sent: Instant,
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
        if resp.acquisition_lock_timeout_ms > 0
            && let Some(st) = self.shared.leaders.lock().get_mut(&self.leader)
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
        // Renewals never ride on a fetch: no answer here confirms one.
        self.report_results(acks, None, None, &results, None);
        let delivery = self.collect(&resp, sent);
        let moved = resp
            .responses
            .iter()
            .flat_map(|t| t.partitions.iter())
            .any(|p| {
                ResponseError::try_from_code(p.error_code)
                    .is_some_and(|e| classify(e) == ErrorClass::RefreshMetadata)
            });
        if delivery.records.is_empty() && delivery.poison.is_empty() {
            if moved {
                // A partition that moved answers at once, without the long poll: until the
                // remap takes it off this leader, fetching again straight away is a busy loop
                // (800 requests a second were seen on a leader change). The backoff grows
                // while it lasts.
                self.backoff.wait().await;
            } else {
                self.backoff.reset();
            }
            return Step::Continue;
        }
        self.backoff.reset();
        if self.tx.send(delivery).await.is_err() {
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
            self.shared.push_outcome(
                *tp,
                AckOutcome {
                    topic: self.shared.topic_name(tp),
                    partition: tp.partition,
                    batches: batches.clone(),
                    error: Some((e, msg.unwrap_or("").to_owned())),
                    sent: None,
                },
            );
        }
    }

    /// Turns acquired ranges into deliveries, Gap acknowledgements and poison. Their locks are
    /// taken to start when the request was `sent`: the broker acquired them between then and
    /// its answer, so the time left on a lock is never overstated (a transaction that must
    /// commit within it relies on that).
    fn collect(&self, resp: &ShareFetchResponse, sent: Instant) -> Delivery {
        let mut delivery = Delivery::default();
        let cap = self.shared.config.delivery_count_limit;
        let now = sent;
        for t in &resp.responses {
            for p in &t.partitions {
                let tp = TopicIdPartition {
                    topic_id: t.topic_id,
                    partition: p.partition,
                };
                if p.error_code != 0 {
                    tracing::warn!(partition = ?tp, "fetch error {}", CodeDisplay(p.error_code));
                    // The broker may have dropped its share partition (a fenced or moved one is
                    // rebuilt from the persisted state): what comes next is a new stint.
                    self.shared.end_stints([&tp]);
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
                        let mut ledger = self.shared.ledger.lock();
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
                delivery.records.reserve(offsets.len());
                if !plan.release.is_empty() || plan.left_alone > 0 {
                    tracing::warn!(
                        topic = %topic,
                        partition = p.partition,
                        released = plan.release.len(),
                        left_to_lock_timeout = plan.left_alone,
                        "the broker acquired offsets its response has no batches for: releasing them"
                    );
                }
                let mut leaders = self.shared.leaders.lock();
                let Some(st) = leaders.get_mut(&self.leader) else {
                    continue;
                };
                let stint = self.shared.stint(tp, st.session);
                let split = p
                    .acquired
                    .iter()
                    .filter(|a| cuts_a_batch(&spans, a.first_offset, a.last_offset))
                    .count();
                self.shared
                    .stats
                    .acquired_split
                    .fetch_add(split as u64, Ordering::Relaxed);
                let mut ledger = self.shared.ledger.lock();
                let mut remembered = self.shared.remembered.lock();
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
                // Counted here and added once per partition: a fetch brings thousands.
                let (mut acquired, mut delivered, mut poisoned, mut replayed) =
                    (0u64, 0u64, 0u64, 0u64);
                // The acquired ranges by first offset; a record in two overlapping ranges
                // (a broker's mistake) is delivered once, with the first that holds it. Only
                // the records the response carries are walked, once, in offset order: not the
                // ranges' offsets, which a broker could claim by the billion.
                let mut ranges: Vec<_> = p
                    .acquired
                    .iter()
                    .filter(|a| a.first_offset <= a.last_offset)
                    .collect();
                ranges.sort_by_key(|a| a.first_offset);
                let mut ranges = ranges.into_iter().peekable();
                st.outstanding.reserve(tp, offsets.len());
                // Held after the walk, all with one look-up of the partition's records.
                let mut to_hold = Vec::with_capacity(offsets.len());
                for rec in records {
                    let o = rec.offset;
                    while ranges.next_if(|a| a.last_offset < o).is_some() {}
                    let Some(a) = ranges.peek().filter(|a| a.first_offset <= o) else {
                        continue;
                    };
                    let sr = ShareRecord {
                        topic: topic.clone(),
                        partition: tp,
                        delivery_count: a.delivery_count,
                        record: rec,
                        session: st.session,
                        stint,
                    };
                    // Delivered here again after its verdict was lost with a session:
                    // settled with that verdict, never handed to the caller twice (should
                    // the ledger refuse it, the record is handed over as any other).
                    if let Some(kind) = remembered.take(tp, o)
                        && ledger.record(tp, o, kind).is_ok()
                    {
                        replayed += 1;
                        continue;
                    }
                    let poison = cap.is_some_and(|c| a.delivery_count >= c);
                    if poison {
                        poisoned += 1;
                    }
                    if poison && self.shared.config.reject_poison {
                        let _ = ledger.record(tp, o, AckKind::Reject);
                        delivery.poison.push(sr);
                    } else {
                        to_hold.push((o, a.delivery_count));
                        acquired += 1;
                        if poison {
                            delivery.poison.push(sr);
                        } else {
                            delivered += 1;
                            delivery.records.push(sr);
                        }
                    }
                }
                let held = st.hold_all(tp, to_hold, now);
                let stats = &self.shared.stats;
                self.shared.in_flight.fetch_add(held, Ordering::Relaxed);
                stats.acquired.fetch_add(acquired, Ordering::Relaxed);
                stats.delivered.fetch_add(delivered, Ordering::Relaxed);
                stats.poison.fetch_add(poisoned, Ordering::Relaxed);
                stats
                    .verdicts_replayed
                    .fetch_add(replayed, Ordering::Relaxed);
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
        let taken = Instant::now();
        let acks = self
            .shared
            .ledger
            .lock()
            .take(|tp| serves.contains(tp), renew);
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
        let shared = self.shared.clone();
        let answered = Raised::by(&shared.acks_in_flight, 1).waking(&shared.acked);
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
                    Some(taken),
                );
                if resp.acquisition_lock_timeout_ms > 0
                    && let Some(st) = self.shared.leaders.lock().get_mut(&self.leader)
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
        drop(answered);
        step
    }

    /// Turns a ShareAcknowledge response into one outcome per partition sent.
    fn report_ack_response(
        &self,
        acks: &[(TopicIdPartition, Vec<AckBatch>)],
        top: Option<ResponseError>,
        top_message: Option<&str>,
        responses: &[sharehost_kafka::protocol::share::AckTopicResult],
        sent: Option<Instant>,
    ) {
        let results = by_partition(
            responses
                .iter()
                .map(|t| (t.topic_id, t.partitions.as_slice())),
            |p| (p.partition, p.error_code, p.error_message.clone()),
        );
        self.report_results(acks, top, top_message, &results, sent);
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
        sent: Option<Instant>,
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
            self.shared.push_outcome(
                *tp,
                AckOutcome {
                    topic: self.shared.topic_name(tp),
                    partition: tp.partition,
                    batches: batches.clone(),
                    error,
                    sent,
                },
            );
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
        let taken = Instant::now();
        let acks = self
            .shared
            .ledger
            .lock()
            .take(|tp| partitions.contains(tp), false);
        let (epoch, topics) = match session.close_request(acks.clone()) {
            Ok(p) => p,
            Err(e) => {
                self.report_acks(&acks, None, Some(&e.to_string()));
                self.shared.set_fatal(format!("share session state: {e}"));
                return;
            }
        };
        let timeout = conn.request_timeout();
        let shared = self.shared.clone();
        let answered = Raised::by(&shared.acks_in_flight, 1).waking(&shared.acked);
        if acks.is_empty() {
            let req = ShareFetchRequest {
                group_id: self.shared.config.group.clone(),
                member_id: self.shared.member_id.clone(),
                share_session_epoch: epoch,
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
            let req = ShareAcknowledgeRequest {
                group_id: self.shared.config.group.clone(),
                member_id: self.shared.member_id.clone(),
                share_session_epoch: epoch,
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
                        Some(taken),
                    );
                }
                Err(e) => self.report_acks(&acks, None, Some(&e.to_string())),
            }
        }
        drop(answered);
        // Whatever was delivered and not judged is released by the broker now.
        let released = self
            .shared
            .leaders
            .lock()
            .get_mut(&self.leader)
            .map(|st| std::mem::take(&mut st.outstanding).len())
            .unwrap_or(0);
        self.shared.out_of_flight(released);
        session.closed();
    }
}

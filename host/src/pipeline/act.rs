//! Acting on a [`Plan`]: outputs are written before their records are accepted and dead
//! letters before theirs are rejected (a write that fails is retried while its records stay
//! held, see `crate::writes`); outputs and dead letters are written side by side.
//!
//! A batch crosses into the engine once per moment its verdicts become final, each crossing one
//! `settle` call whose outcomes come back counted: with no writes, once; otherwise once per
//! kind of write as it lands, the verdicts owed no write riding along with the first. Only a
//! write that has to wait for a retry settles those at once, so records that owe nothing never
//! wait on an outage.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::handle::Pipeline;
use super::plan::Plan;
use crate::kafka::{Header, KafkaClient, KafkaError, ProduceRecord};
use crate::provenance as pv;
use crate::runtime::Emit;
use crate::share::consumer::{LOCK_MARGIN, Settle, Settled, ShareConsumer, ShareRecord};
use crate::share::ledger::AckKind;
use crate::writes::{Landing, PartitionBy, Write, WriteObserver, record_bytes, write_all};

/// What acting on a batch needs of the run loop: the engine, the client, and the stop that
/// ends write retries.
#[derive(Clone)]
pub(super) struct BatchContext {
    pub(super) consumer: Arc<ShareConsumer>,
    pub(super) client: Arc<KafkaClient>,
    /// The pipeline is stopping: writes stop retrying and release their records.
    pub(super) stop: CancellationToken,
    /// An exactly-once pipeline's transactional producer and settled log.
    pub(super) exactly_once: Option<Arc<super::transact::ExactlyOnce>>,
}

/// What a settled record is counted as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cause {
    /// The plugin's verdict (or the host's reject of what the plugin did wrong).
    Verdict,
    /// A reject whose dead letter landed. On a group whose broker dead-letters Rejects
    /// itself it is acknowledged as done (Accept), and still counted as a reject.
    DeadLettered,
    /// A release of a record whose writes did not land before the stop: the one delivery a
    /// stop spends, counted apart from the plugin's releases.
    Unwritten,
}

/// One record's settlement, as the pipeline hands it to the engine.
pub(super) struct Decision<'r> {
    pub(super) record: &'r ShareRecord,
    pub(super) settle: Settle,
    pub(super) cause: Cause,
}

impl<'r> Decision<'r> {
    pub(super) fn new(record: &'r ShareRecord, settle: Settle, cause: Cause) -> Self {
        Decision {
            record,
            settle,
            cause,
        }
    }
}

/// One batch being acted on: what its writes share (the engine, the version that judged it,
/// the permit it gives back at its first wait) and the verdicts that wait for the first of its
/// writes to land, or to wait.
struct Acting<'a, 'r> {
    pipeline: &'a Pipeline,
    consumer: &'a ShareConsumer,
    client: &'a KafkaClient,
    stop: &'a CancellationToken,
    hash: &'a str,
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    /// Verdicts that owe no write, settled with the first write's verdicts (one crossing) or
    /// at once when a write has to wait.
    owed_nothing: Mutex<Vec<Decision<'r>>>,
}

impl<'r> Acting<'_, 'r> {
    /// Settles `decisions` together with the verdicts still waiting to ride along.
    fn settle(&self, mut decisions: Vec<Decision<'r>>) {
        let waiting = std::mem::take(&mut *self.owed_nothing.lock());
        if decisions.is_empty() {
            decisions = waiting;
        } else {
            decisions.extend(waiting);
        }
        self.pipeline.settle(self.consumer, &decisions, self.hash);
    }
}

/// Watches one kind of a batch's writes: counts failures by topic, shows the pipeline degraded
/// while they wait, and at the first wait settles the verdicts that owe nothing and gives the
/// batch's permit back, so other batches are judged meanwhile (their records stay bounded by
/// `max_in_flight`).
struct WriteWatch<'a, 'b, 'r> {
    acting: &'b Acting<'a, 'r>,
    kind: &'static str,
}

impl WriteObserver for WriteWatch<'_, '_, '_> {
    fn failed(&self, topic: &str, _records: usize, error: &KafkaError) {
        let p = self.acting.pipeline;
        p.counters.writes.failures.fetch_add(1, Ordering::Relaxed);
        p.metrics
            .write_failures
            .get_or_create(&vec![
                ("pipeline", p.spec.name.clone()),
                ("kind", self.kind.to_owned()),
                ("topic", topic.to_owned()),
                ("error", error.kind()),
            ])
            .inc();
    }

    fn produced(&self, took: Duration) {
        let p = self.acting.pipeline;
        p.metrics
            .write_seconds
            .get_or_create(&vec![
                ("pipeline", p.spec.name.clone()),
                ("kind", self.kind.to_owned()),
            ])
            .observe(took.as_secs_f64());
    }

    fn shrunk(&self, topic: &str) {
        self.acting.pipeline.count_shrunk(topic, 1);
    }

    fn waiting(&self, waiting: bool) {
        let a = self.acting;
        let p = a.pipeline;
        let labels = vec![("pipeline", p.spec.name.clone())];
        if waiting {
            a.permit.lock().take();
            a.settle(Vec::new());
            p.counters.writes.waiting.fetch_add(1, Ordering::Relaxed);
            p.metrics.writes_waiting.get_or_create(&labels).inc();
        } else {
            p.counters.writes.waiting.fetch_sub(1, Ordering::Relaxed);
            p.metrics.writes_waiting.get_or_create(&labels).dec();
        }
    }
}

impl Pipeline {
    /// Counts `n` dead letters written to `topic` without their record's key, value and
    /// headers (too large for it whole).
    pub(super) fn count_shrunk(&self, topic: &str, n: u64) {
        self.counters.writes.shrunk.fetch_add(n, Ordering::Relaxed);
        tracing::warn!(pipeline = %self.spec.name, topic, dead_letters = n, "a record larger than the dead-letter topic accepts was dead-lettered without its key, value and headers");
        self.metrics
            .dead_letters_shrunk
            .get_or_create(&vec![("pipeline", self.spec.name.clone())])
            .inc_by(n);
    }

    /// Executes `plan` for `batch`, judged by version `hash`. `permit` (one of the pipeline's
    /// `concurrency`) is held until the writes are first tried; a batch whose writes wait for a
    /// retry gives it back, so the pipeline judges on meanwhile.
    pub(super) async fn act(
        &self,
        ctx: &BatchContext,
        batch: &[ShareRecord],
        plan: Plan,
        hash: &str,
        permit: OwnedSemaphorePermit,
    ) {
        for output in &plan.unmapped {
            if self.unmapped.lock().insert(output.clone()) {
                tracing::error!(pipeline = %self.spec.name, output, "the plugin emits to an output that [pipeline.outputs] does not map: every record with such an emit is rejected (dead-lettered where configured), whatever its verdict, and the pipeline is not ready until the manifest maps it");
            }
        }
        if plan.discarded > 0 {
            self.counters.count_emits(hash, "discarded", plan.discarded);
        }
        let now: Vec<Decision<'_>> = plan
            .now
            .iter()
            .filter_map(|&(i, s)| Some(Decision::new(batch.get(i)?, s, Cause::Verdict)))
            .collect();
        let rejects: Vec<(&ShareRecord, String)> = plan
            .dead_letters
            .into_iter()
            .filter_map(|(i, why)| Some((batch.get(i)?, why)))
            .collect();
        let producing: Vec<(&ShareRecord, Vec<Emit>)> = plan
            .outputs
            .into_iter()
            .filter_map(|(i, emits)| Some((batch.get(i)?, emits)))
            .collect();
        if producing.is_empty() && rejects.is_empty() {
            // The usual batch: nothing to write, one crossing.
            self.settle(&ctx.consumer, &now, hash);
            return;
        }
        if let Some(eo) = &ctx.exactly_once {
            self.transact(ctx, eo, now, producing, rejects, hash, Some(permit))
                .await;
            return;
        }
        let acting = Acting {
            pipeline: self,
            consumer: &ctx.consumer,
            client: &ctx.client,
            stop: &ctx.stop,
            hash,
            permit: Mutex::new(Some(permit)),
            owed_nothing: Mutex::new(now),
        };
        // Outputs and dead letters side by side: neither kind waits for the other to land.
        let (unwritable, ()) = tokio::join!(
            self.produce_outputs(&acting, &producing),
            self.reject(&acting, &rejects)
        );
        // An output that can never be written turns its record into a reject (rare: a record
        // larger than its output topic accepts).
        if !unwritable.is_empty() {
            self.reject(&acting, &unwritable).await;
        }
        // Nothing was written, or nothing waited: what owes nothing is settled now if no
        // write took it along.
        acting.settle(Vec::new());
    }

    /// Hands `decisions` to the engine in one call and counts what it took, once per kind (not
    /// once per record: each count costs label allocations and locks).
    pub(super) fn settle(&self, consumer: &ShareConsumer, decisions: &[Decision<'_>], hash: &str) {
        if decisions.is_empty() {
            return;
        }
        let broker_dlq = self.broker_dlq.load(Ordering::Relaxed);
        let to_engine: Vec<(&ShareRecord, Settle)> = decisions
            .iter()
            .map(|d| {
                let settle = match (d.cause, broker_dlq) {
                    // The host dead-lettered it (with its reason): a Reject would have the
                    // broker write it a second time.
                    (Cause::DeadLettered, true) => Settle::Final(AckKind::Accept),
                    _ => d.settle,
                };
                (d.record, settle)
            })
            .collect();
        let (mut accepted, mut released, mut rejected, mut renewed, mut retried) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        let mut unwritten = 0u64;
        let mut late = 0u64;
        for (d, result) in decisions.iter().zip(consumer.settle(&to_engine)) {
            match (result, d.cause, d.settle) {
                (Settled::Taken, Cause::Unwritten, _) => unwritten += 1,
                (Settled::Taken, Cause::DeadLettered, _)
                | (Settled::Taken, _, Settle::Final(AckKind::Reject)) => rejected += 1,
                (Settled::Taken, _, Settle::Final(AckKind::Accept)) => accepted += 1,
                (Settled::Taken, _, _) | (Settled::RenewsSpent, _, _) => released += 1,
                (Settled::Renewed, _, _) => renewed += 1,
                (Settled::Held(_), _, _) => retried += 1,
                (Settled::Moot, _, settle) => {
                    if matches!(settle, Settle::Final(AckKind::Accept | AckKind::Reject)) {
                        late += 1;
                    }
                    tracing::debug!(pipeline = %self.spec.name, offset = d.record.record.offset, "verdict for a released record dropped")
                }
                (Settled::Refused(e), _, _) => {
                    tracing::error!(pipeline = %self.spec.name, offset = d.record.record.offset, "verdict refused: {e}")
                }
            }
        }
        if late > 0 {
            let l: crate::metrics::Labels = vec![("pipeline", self.spec.name.clone())];
            self.metrics
                .verdicts_lost
                .get_or_create(&super::counters::lost_labels(&l, "late"))
                .inc_by(late);
        }
        if unwritten > 0 {
            self.counters
                .writes
                .released
                .fetch_add(unwritten, Ordering::Relaxed);
            self.metrics
                .released_unwritten
                .get_or_create(&vec![("pipeline", self.spec.name.clone())])
                .inc_by(unwritten);
        }
        let c = &self.counters;
        for (name, n) in [
            ("accept", accepted),
            ("release", released),
            ("reject", rejected),
            ("renew", renewed),
            ("retry", retried),
        ] {
            if n > 0 {
                c.record_n(hash, name, n);
            }
        }
        if renewed > 0 {
            self.metrics
                .renewals
                .get_or_create(&c.labels(hash))
                .inc_by(renewed);
        }
        if accepted + released + rejected + renewed + retried > 0 {
            c.count(hash, |v| {
                v.accepted += accepted;
                v.released += released;
                v.rejected += rejected;
                v.renewed += renewed;
                v.retried += retried;
            });
        }
    }

    /// Produces the emits of accepted records (see [`crate::writes`]) and accepts each record
    /// once all of its emits landed. A record whose emits are still unwritten when the pipeline
    /// stops is released, never accepted: its outputs may then appear twice (those that did
    /// land), but an accepted record never lacks one. Returns the records whose emit can never
    /// be written (larger than its topic accepts), with the reason to reject them by.
    async fn produce_outputs<'r>(
        &self,
        acting: &Acting<'_, 'r>,
        producing: &[(&'r ShareRecord, Vec<Emit>)],
    ) -> Vec<(&'r ShareRecord, String)> {
        if producing.is_empty() {
            return Vec::new();
        }
        let mut writes = Vec::new();
        for (owner, (r, emits)) in producing.iter().enumerate() {
            for e in emits {
                // A record with an emit to an unmapped output never gets here: `judge`
                // rejects it.
                if let Some(topic) = self.spec.outputs.get(&*e.output) {
                    writes.push(Write::new(
                        owner,
                        topic,
                        PartitionBy::KeyOrSource(r.partition.partition),
                        output_record(r, e),
                    ));
                }
            }
        }
        let per_owner: Vec<u64> = producing.iter().map(|(_, e)| e.len() as u64).collect();
        let records: Vec<&ShareRecord> = producing.iter().map(|(r, _)| *r).collect();
        let landings = self.write(acting, &records, writes, "output").await;
        let (mut decisions, mut unwritable) = (Vec::new(), Vec::new());
        let (mut produced, mut failed) = (0u64, 0u64);
        for ((r, _), (landing, n)) in producing.iter().zip(landings.into_iter().zip(per_owner)) {
            match landing {
                Landing::Landed => {
                    produced += n;
                    decisions.push(Decision::new(
                        r,
                        Settle::Final(AckKind::Accept),
                        Cause::Verdict,
                    ));
                }
                Landing::Stopped => {
                    failed += n;
                    decisions.push(Decision::new(
                        r,
                        Settle::Final(AckKind::Release),
                        Cause::Unwritten,
                    ));
                }
                Landing::Unwritable(why) => {
                    failed += n;
                    tracing::error!(pipeline = %self.spec.name, topic = %r.topic, partition = r.partition.partition, offset = r.record.offset, "an output of an accepted record can never be written; the record is rejected: {why}");
                    unwritable.push((*r, format!("output not writable: {why}")));
                }
            }
        }
        if produced > 0 {
            self.counters.count_emits(acting.hash, "produced", produced);
        }
        if failed > 0 {
            self.counters.count_emits(acting.hash, "failed", failed);
        }
        acting.settle(decisions);
        unwritable
    }

    /// Writes what `records` owe (see [`write_all`]): held until it lands or the pipeline
    /// stops, within the records' locks on a broker that cannot renew them. `kind` (output,
    /// dead_letter) labels the failures.
    async fn write(
        &self,
        acting: &Acting<'_, '_>,
        records: &[&ShareRecord],
        writes: Vec<Write>,
        kind: &'static str,
    ) -> Vec<Landing> {
        if writes.is_empty() {
            return vec![Landing::Landed; records.len()];
        }
        let now = Instant::now();
        let deadline = records
            .iter()
            .filter_map(|r| acting.consumer.hold_limit(r))
            .min()
            .map(|left| now + left.saturating_sub(LOCK_MARGIN));
        let observer = WriteWatch { acting, kind };
        write_all(
            acting.client,
            &self.spec.name,
            records.len(),
            writes,
            acting.stop,
            deadline,
            &observer,
        )
        .await
        .landings
    }

    /// Rejects records: dead-letters them first when a topic is configured (see
    /// [`crate::writes`]); a record whose dead letter is still unwritten when the pipeline stops
    /// is released instead, never rejected unwritten.
    async fn reject<'r>(&self, acting: &Acting<'_, 'r>, rejects: &[(&'r ShareRecord, String)]) {
        if rejects.is_empty() {
            return;
        }
        let Some(dlq) = &self.spec.dead_letter_topic else {
            let all = rejects
                .iter()
                .map(|(r, _)| Decision::new(r, Settle::Final(AckKind::Reject), Cause::Verdict))
                .collect();
            acting.settle(all);
            return;
        };
        let hash = acting.hash;
        let (plugin, signer) = self.identity(hash);
        let writes: Vec<Write> = rejects
            .iter()
            .enumerate()
            .map(|(owner, (r, reason))| {
                let full = self.dead_letter(r, reason, &plugin, hash, signer.as_deref(), true);
                let mut w =
                    Write::new(owner, dlq, PartitionBy::Source(r.partition.partition), full);
                w.smaller =
                    Some(self.dead_letter(r, reason, &plugin, hash, signer.as_deref(), false));
                w
            })
            .collect();
        let records: Vec<&ShareRecord> = rejects.iter().map(|(r, _)| *r).collect();
        let landings = self.write(acting, &records, writes, "dead_letter").await;
        let mut landed = 0u64;
        let decisions = rejects
            .iter()
            .zip(landings)
            .map(|((r, _), landing)| match landing {
                Landing::Landed => {
                    landed += 1;
                    Decision::new(r, Settle::Final(AckKind::Reject), Cause::DeadLettered)
                }
                // A dead letter always has a smaller form to fall back on; what cannot land
                // is released like what the stop cut short.
                Landing::Stopped | Landing::Unwritable(_) => {
                    Decision::new(r, Settle::Final(AckKind::Release), Cause::Unwritten)
                }
            })
            .collect();
        if landed > 0 {
            self.counters
                .dead_lettered
                .fetch_add(landed, Ordering::Relaxed);
            self.metrics
                .dead_lettered
                .get_or_create(&self.counters.labels(hash))
                .inc_by(landed);
        }
        acting.settle(decisions);
    }

    /// The component path and signer of the version with `hash` (active, canary or kept), for
    /// dead-letter provenance: a record the canary rejected names the canary.
    pub(super) fn identity(&self, hash: &str) -> (String, Option<String>) {
        if let Some(c) = self.rollouts.canary_version(hash) {
            return (c.path.display().to_string(), c.signer());
        }
        self.versions.identity(hash).unwrap_or_else(|| {
            let active = self.versions.active();
            (active.path.display().to_string(), active.signer())
        })
    }

    /// The dead letter of `r`: its key, value and headers (`whole`; without them when the whole
    /// record is larger than the dead-letter topic accepts, with their size instead), then
    /// its provenance and the reason it was rejected.
    pub(super) fn dead_letter(
        &self,
        r: &ShareRecord,
        reason: &str,
        plugin: &str,
        hash: &str,
        signer: Option<&str>,
        whole: bool,
    ) -> ProduceRecord {
        let h = |k: &str, v: String| Header {
            key: k.to_owned(),
            value: Some(Bytes::from(v)),
        };
        let original = ProduceRecord {
            key: r.record.key.clone(),
            value: r.record.value.clone(),
            headers: r.record.headers.clone(),
            timestamp: Some(r.record.timestamp),
        };
        let mut dl = if whole {
            original
        } else {
            ProduceRecord {
                headers: vec![h(pv::DROPPED_BYTES, record_bytes(&original).to_string())],
                timestamp: original.timestamp,
                ..Default::default()
            }
        };
        dl.headers.extend([
            h(pv::ORIGINAL_TOPIC, r.topic.to_string()),
            h(pv::ORIGINAL_PARTITION, r.partition.partition.to_string()),
            h(pv::ORIGINAL_OFFSET, r.record.offset.to_string()),
            h(pv::ORIGINAL_DELIVERY_COUNT, r.delivery_count.to_string()),
            h(pv::REASON, reason.to_owned()),
            h(pv::PIPELINE, self.spec.name.clone()),
            h(pv::PLUGIN, plugin.to_owned()),
            h(pv::PLUGIN_VERSION, hash.to_owned()),
        ]);
        if let Some(signer) = signer {
            dl.headers.push(h(pv::PLUGIN_SIGNER, signer.to_owned()));
        }
        dl
    }

    /// Records at the delivery cap: dead-letter (when configured) then Reject.
    pub(super) async fn handle_poison(&self, ctx: &BatchContext, poison: Vec<ShareRecord>) {
        let (consumer, client, stop) = (&*ctx.consumer, &*ctx.client, &ctx.stop);
        let hash = self.active_hash();
        if self.spec.dead_letter_topic.is_none() {
            // The engine already rejected them.
            let n = poison.len() as u64;
            self.counters.record_n(&hash, "reject", n);
            self.counters.count(&hash, |c| c.rejected += n);
            return;
        }
        // In an exactly-once pipeline a record at its cap may have been settled by a committed
        // transaction whose acknowledgement was lost: acknowledged as then, it gets no dead
        // letter beside its outputs.
        let poison = match &ctx.exactly_once {
            Some(eo) => self.settled_earlier(ctx, eo, poison, true).await,
            None => poison,
        };
        if poison.is_empty() {
            return;
        }
        let reasons: Vec<(&ShareRecord, String)> = {
            let mut last = self.counters.last_faults.lock();
            poison
                .iter()
                .map(|r| {
                    let key = (r.topic.clone(), r.partition.partition, r.record.offset);
                    let reason = match last.take(&key) {
                        Some(fault) => format!(
                            "delivery cap reached ({} deliveries); last plugin fault: {fault}",
                            r.delivery_count
                        ),
                        None => {
                            format!("delivery cap reached ({} deliveries)", r.delivery_count)
                        }
                    };
                    (r, reason)
                })
                .collect()
        };
        // Also in an exactly-once pipeline, through the plain write path, which holds the
        // records and tries again until the dead letter lands: a dead letter at the cap may be
        // written twice (its acknowledgement lost, the record comes again), never lost. In a
        // transaction it was lost under faults: a transaction that cannot commit gives its
        // records back, each time a delivery, and past the group's limit the broker archives
        // them without a dead letter.
        let acting = Acting {
            pipeline: self,
            consumer,
            client,
            stop,
            hash: &hash,
            permit: Mutex::new(None),
            owed_nothing: Mutex::new(Vec::new()),
        };
        self.reject(&acting, &reasons).await;
    }
}

/// Hands `records` back to the broker unjudged (or unwritten): a Release each, in one call into
/// the engine. Returns how many the engine took (a record its session already lost is not).
pub(super) fn release_all<'r>(
    consumer: &ShareConsumer,
    records: impl IntoIterator<Item = &'r ShareRecord>,
) -> u64 {
    let back: Vec<(&ShareRecord, Settle)> = records
        .into_iter()
        .map(|r| (r, Settle::Final(AckKind::Release)))
        .collect();
    if back.is_empty() {
        return 0;
    }
    consumer
        .settle(&back)
        .into_iter()
        .filter(|r| *r == Settled::Taken)
        .count() as u64
}

/// An emit as the record produced to its output topic: the plugin's key, value and headers,
/// then the provenance headers a downstream consumer de-duplicates by.
pub(super) fn output_record(source: &ShareRecord, e: &Emit) -> ProduceRecord {
    let h = |k: &str, v: String| Header {
        key: k.to_owned(),
        value: Some(Bytes::from(v)),
    };
    let mut headers: Vec<Header> = e
        .headers
        .iter()
        .map(|x| Header {
            key: x.key.clone(),
            value: x.value.clone(),
        })
        .collect();
    headers.extend([
        h(pv::SOURCE_TOPIC, source.topic.to_string()),
        h(pv::SOURCE_PARTITION, source.partition.partition.to_string()),
        h(pv::SOURCE_OFFSET, source.record.offset.to_string()),
        h(pv::SOURCE_DELIVERY_COUNT, source.delivery_count.to_string()),
    ]);
    ProduceRecord {
        key: e.key.clone(),
        value: e.value.clone(),
        headers,
        timestamp: None,
    }
}

//! Acting on a [`Plan`]: one call settles what the engine takes now; outputs are written before
//! their records are accepted and dead letters before theirs are rejected (a write that fails is
//! retried while its records stay held, see `crate::writes`), and the verdicts they owed follow
//! in one call each.

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
}

/// Watches one batch's writes: counts failures by topic, shows the pipeline degraded while
/// they wait, and gives the batch's permit back at the first wait, so other batches are judged
/// meanwhile (their records stay bounded by `max_in_flight`).
struct WriteWatch<'a> {
    pipeline: &'a Pipeline,
    kind: &'static str,
    permit: &'a Mutex<Option<OwnedSemaphorePermit>>,
}

impl WriteObserver for WriteWatch<'_> {
    fn failed(&self, topic: &str, _records: usize, error: &KafkaError) {
        let p = self.pipeline;
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
        let p = self.pipeline;
        p.metrics
            .write_seconds
            .get_or_create(&vec![
                ("pipeline", p.spec.name.clone()),
                ("kind", self.kind.to_owned()),
            ])
            .observe(took.as_secs_f64());
    }

    fn shrunk(&self, topic: &str) {
        let p = self.pipeline;
        p.counters.writes.shrunk.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(pipeline = %p.spec.name, topic, "a record larger than the dead-letter topic accepts was dead-lettered without its key, value and headers");
        p.metrics
            .dead_letters_shrunk
            .get_or_create(&vec![("pipeline", p.spec.name.clone())])
            .inc();
    }

    fn waiting(&self, waiting: bool) {
        let p = self.pipeline;
        let labels = vec![("pipeline", p.spec.name.clone())];
        if waiting {
            self.permit.lock().take();
            p.counters.writes.waiting.fetch_add(1, Ordering::Relaxed);
            p.metrics.writes_waiting.get_or_create(&labels).inc();
        } else {
            p.counters.writes.waiting.fetch_sub(1, Ordering::Relaxed);
            p.metrics.writes_waiting.get_or_create(&labels).dec();
        }
    }
}

impl Pipeline {
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
        let BatchContext {
            consumer,
            client,
            stop,
        } = ctx;
        for output in &plan.unmapped {
            if self.unmapped.lock().insert(output.clone()) {
                tracing::error!(pipeline = %self.spec.name, output, "the plugin emits to an output that [pipeline.outputs] does not map: every record with such an emit is rejected (dead-lettered where configured), whatever its verdict, and the pipeline is not ready until the manifest maps it");
            }
        }
        if plan.discarded > 0 {
            self.counters.count_emits(hash, "discarded", plan.discarded);
        }
        let now: Vec<(&ShareRecord, Settle)> = plan
            .now
            .iter()
            .filter_map(|&(i, s)| Some((batch.get(i)?, s)))
            .collect();
        self.settle(consumer, &now, hash, false);
        let permit = Mutex::new(Some(permit));
        let mut rejects: Vec<(&ShareRecord, String)> = plan
            .dead_letters
            .into_iter()
            .filter_map(|(i, why)| Some((batch.get(i)?, why)))
            .collect();
        let producing: Vec<(&ShareRecord, Vec<Emit>)> = plan
            .outputs
            .into_iter()
            .filter_map(|(i, emits)| Some((batch.get(i)?, emits)))
            .collect();
        if !producing.is_empty() {
            let unwritable = self
                .produce_outputs(client, consumer, &producing, hash, stop, &permit)
                .await;
            rejects.extend(unwritable);
        }
        if !rejects.is_empty() {
            self.reject(consumer, client, &rejects, hash, stop, &permit)
                .await;
        }
    }

    /// Hands `decisions` to the engine in one call and counts what it took, once per kind (not
    /// once per record: each count costs label allocations and locks). With
    /// `accepts_are_rejects`, the Accepts stand for records the host dead-lettered itself on a
    /// group whose broker dead-letters Rejects too (counted as rejects, acknowledged as done so
    /// the broker writes no second dead letter).
    fn settle(
        &self,
        consumer: &ShareConsumer,
        decisions: &[(&ShareRecord, Settle)],
        hash: &str,
        accepts_are_rejects: bool,
    ) {
        if decisions.is_empty() {
            return;
        }
        let (mut accepted, mut released, mut rejected, mut renewed, mut retried) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        for ((r, decision), result) in decisions.iter().zip(consumer.settle(decisions)) {
            match (result, decision) {
                (Settled::Taken, Settle::Final(AckKind::Accept)) => accepted += 1,
                (Settled::Taken, Settle::Final(AckKind::Reject)) => rejected += 1,
                (Settled::Taken, _) | (Settled::RenewsSpent, _) => released += 1,
                (Settled::Renewed, _) => renewed += 1,
                (Settled::Held(_), _) => retried += 1,
                (Settled::Moot, _) => {
                    tracing::debug!(pipeline = %self.spec.name, offset = r.record.offset, "verdict for a released record dropped")
                }
                (Settled::Refused(e), _) => {
                    tracing::error!(pipeline = %self.spec.name, offset = r.record.offset, "verdict refused: {e}")
                }
            }
        }
        if accepts_are_rejects {
            rejected += std::mem::take(&mut accepted);
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
        client: &KafkaClient,
        consumer: &ShareConsumer,
        producing: &[(&'r ShareRecord, Vec<Emit>)],
        hash: &str,
        stop: &CancellationToken,
        permit: &Mutex<Option<OwnedSemaphorePermit>>,
    ) -> Vec<(&'r ShareRecord, String)> {
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
        let landings = self
            .write(client, consumer, &records, writes, "output", stop, permit)
            .await;
        let (mut accepted, mut released, mut unwritable) = (Vec::new(), Vec::new(), Vec::new());
        let (mut produced, mut failed) = (0u64, 0u64);
        for ((r, _), (landing, n)) in producing.iter().zip(landings.into_iter().zip(per_owner)) {
            match landing {
                Landing::Landed => {
                    produced += n;
                    accepted.push((*r, Settle::Final(AckKind::Accept)));
                }
                Landing::Stopped => {
                    failed += n;
                    released.push(*r);
                }
                Landing::Unwritable(why) => {
                    failed += n;
                    tracing::error!(pipeline = %self.spec.name, topic = %r.topic, partition = r.partition.partition, offset = r.record.offset, "an output of an accepted record can never be written; the record is rejected: {why}");
                    unwritable.push((*r, format!("output not writable: {why}")));
                }
            }
        }
        if produced > 0 {
            self.counters.count_emits(hash, "produced", produced);
        }
        if failed > 0 {
            self.counters.count_emits(hash, "failed", failed);
        }
        self.settle(consumer, &accepted, hash, false);
        self.release_unwritten(consumer, &released);
        unwritable
    }

    /// Writes what `records` owe (see [`write_all`]): held until it lands or `stop`, within
    /// the records' locks on a broker that cannot renew them. `kind` (output, dead_letter)
    /// labels the failures.
    #[allow(clippy::too_many_arguments)]
    async fn write(
        &self,
        client: &KafkaClient,
        consumer: &ShareConsumer,
        records: &[&ShareRecord],
        writes: Vec<Write>,
        kind: &'static str,
        stop: &CancellationToken,
        permit: &Mutex<Option<OwnedSemaphorePermit>>,
    ) -> Vec<Landing> {
        if writes.is_empty() {
            return vec![Landing::Landed; records.len()];
        }
        let now = Instant::now();
        let deadline = records
            .iter()
            .filter_map(|r| consumer.hold_limit(r))
            .min()
            .map(|left| now + left.saturating_sub(LOCK_MARGIN));
        let observer = WriteWatch {
            pipeline: self,
            kind,
            permit,
        };
        write_all(
            client,
            &self.spec.name,
            records.len(),
            writes,
            stop,
            deadline,
            &observer,
        )
        .await
        .landings
    }

    /// Releases records whose writes did not land before the pipeline stopped (or their lock
    /// ran out): the one delivery a stop spends. Counted apart from the plugin's releases.
    fn release_unwritten(&self, consumer: &ShareConsumer, released: &[&ShareRecord]) {
        if released.is_empty() {
            return;
        }
        let taken = release_all(consumer, released.iter().copied());
        self.counters
            .writes
            .released
            .fetch_add(taken, Ordering::Relaxed);
        self.metrics
            .released_unwritten
            .get_or_create(&vec![("pipeline", self.spec.name.clone())])
            .inc_by(taken);
    }

    /// Rejects records: dead-letters them first when a topic is configured (see
    /// [`crate::writes`]); a record whose dead letter is still unwritten when the pipeline stops
    /// is released instead, never rejected unwritten.
    async fn reject(
        &self,
        consumer: &ShareConsumer,
        client: &KafkaClient,
        rejects: &[(&ShareRecord, String)],
        hash: &str,
        stop: &CancellationToken,
        permit: &Mutex<Option<OwnedSemaphorePermit>>,
    ) {
        let Some(dlq) = &self.spec.dead_letter_topic else {
            let all: Vec<_> = rejects
                .iter()
                .map(|(r, _)| (*r, Settle::Final(AckKind::Reject)))
                .collect();
            self.settle(consumer, &all, hash, false);
            return;
        };
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
        let landings = self
            .write(
                client,
                consumer,
                &records,
                writes,
                "dead_letter",
                stop,
                permit,
            )
            .await;
        // On a group whose broker dead-letters Rejects itself, a record the host dead-lettered
        // (with its reason) is acknowledged as done: a Reject would write it a second time.
        let broker_dlq = self.broker_dlq.load(Ordering::Relaxed);
        let done = if broker_dlq {
            AckKind::Accept
        } else {
            AckKind::Reject
        };
        let (mut rejected, mut released) = (Vec::new(), Vec::new());
        for ((r, _), landing) in rejects.iter().zip(landings) {
            match landing {
                Landing::Landed => rejected.push((*r, Settle::Final(done))),
                // A dead letter always has a smaller form to fall back on; what cannot land
                // is released like what the stop cut short.
                Landing::Stopped | Landing::Unwritable(_) => released.push(*r),
            }
        }
        if !rejected.is_empty() {
            let n = rejected.len() as u64;
            self.counters.dead_lettered.fetch_add(n, Ordering::Relaxed);
            self.metrics
                .dead_lettered
                .get_or_create(&self.counters.labels(hash))
                .inc_by(n);
            self.settle(consumer, &rejected, hash, broker_dlq);
        }
        self.release_unwritten(consumer, &released);
    }

    /// The component path and signer of the version with `hash` (active, canary or kept), for
    /// dead-letter provenance: a record the canary rejected names the canary.
    fn identity(&self, hash: &str) -> (String, Option<String>) {
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
    fn dead_letter(
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
    pub(super) async fn handle_poison(
        &self,
        consumer: &ShareConsumer,
        client: &KafkaClient,
        poison: Vec<ShareRecord>,
        stop: &CancellationToken,
    ) {
        let hash = self.active_hash();
        if self.spec.dead_letter_topic.is_none() {
            // The engine already rejected them.
            let n = poison.len() as u64;
            self.counters.record_n(&hash, "reject", n);
            self.counters.count(&hash, |c| c.rejected += n);
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
        self.reject(consumer, client, &reasons, &hash, stop, &Mutex::new(None))
            .await;
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
fn output_record(source: &ShareRecord, e: &Emit) -> ProduceRecord {
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

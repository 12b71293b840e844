//! One batch to the version that judges it: a canary takes its share (its verdicts used only
//! when it judged the whole batch without a fault), the active version the rest; then what the
//! judging tells the counters, the logs, the shadow and the swap-stall watch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::handle::Pipeline;
use super::handler::OnFault;
use super::versions::{Version, short};
use crate::manifest::FaultPolicy;
use crate::recent_faults::{FaultRole, RecentFault};
use crate::runtime::{Judged, Record, Verdict};
use crate::share::consumer::ShareRecord;

/// A batch as judged: by which version, what it answered, and how long it took.
pub(super) struct Judgement {
    /// The version whose verdicts are used (the active one, or a canary that judged cleanly).
    pub(super) version: Arc<Version>,
    /// Its verdicts, emits and faults.
    pub(super) judged: Judged,
    /// Whether a canary judged it (a shadow compares only the active version's batches).
    pub(super) by_canary: bool,
    /// How long the call took.
    pub(super) elapsed: Duration,
}

impl Pipeline {
    /// What a faulting batch's records get under the manifest's `fault_policy`.
    pub(super) fn fault_verdict(&self) -> Verdict {
        match self.spec.fault_policy {
            FaultPolicy::Release => Verdict::Release,
            FaultPolicy::Reject => Verdict::Reject(None),
        }
    }

    /// Judges `batch` (its plugin records `records`): a canary takes its share of batches;
    /// a batch it faults on (or finds no instance for) is judged by the active version, so every
    /// record is judged for real exactly once, by one version. `None` only when the active
    /// version had no free instance (cannot happen: one permit per instance).
    pub(super) async fn judge(
        &self,
        batch: &[ShareRecord],
        records: &Arc<[Record]>,
        traceparent: Option<&str>,
    ) -> Option<Judgement> {
        let policy = self.fault_verdict();
        if let Some(run) = self.rollouts.canary_for_next() {
            let candidate = run.version();
            match self
                .judge_on(
                    candidate,
                    records,
                    &policy,
                    OnFault::WholeBatch,
                    traceparent,
                )
                .await
            {
                Some((judged, elapsed)) if judged.faults.is_empty() => {
                    if let Some(decision) =
                        self.rollouts.candidate_judged(&run, Some(&judged.verdicts))
                    {
                        self.decide_canary(&run, decision);
                    }
                    return Some(Judgement {
                        version: candidate.clone(),
                        judged,
                        by_canary: true,
                        elapsed,
                    });
                }
                other => {
                    let message = other
                        .as_ref()
                        .and_then(|(j, _)| j.faults.first())
                        .map_or_else(
                            || "no free instance".to_owned(),
                            |f| format!("{}: {}", f.kind, f.message),
                        );
                    tracing::warn!(pipeline = %self.spec.name, candidate = %short(&candidate.hash), records = batch.len(), "canary fault, the active version judges the batch: {message}");
                    let kind = other.as_ref().and_then(|(j, _)| j.faults.first());
                    self.counters.recent_faults.note(
                        RecentFault::now(
                            &self.spec.name,
                            FaultRole::Canary,
                            kind.map_or("no_free_instance", |f| f.kind.as_str()),
                            &kind.map_or(message.clone(), |f| f.message.clone()),
                        )
                        .on_batch(
                            &candidate.hash,
                            batch.len(),
                            batch.first().map(|r| r.record.offset),
                            batch.last().map(|r| r.record.offset),
                        ),
                    );
                    if let Some((j, _)) = &other {
                        self.counters.count(&candidate.hash, |c| {
                            c.faults += j.faults.len() as u64;
                            c.batches += 1;
                        });
                    }
                    if let Some(decision) = self.rollouts.candidate_judged(&run, None) {
                        self.decide_canary(&run, decision);
                    }
                }
            }
        }
        let version = self.versions.active();
        let Some((judged, elapsed)) = self
            .judge_on(&version, records, &policy, OnFault::Isolate, traceparent)
            .await
        else {
            tracing::error!(pipeline = %self.spec.name, version = %short(&version.hash), records = batch.len(), "no free instance of the active version: batch released");
            return None;
        };
        self.rollouts
            .active_judged(&judged.verdicts, !judged.faults.is_empty());
        Some(Judgement {
            version,
            judged,
            by_canary: false,
            elapsed,
        })
    }

    /// Judges `records` on one instance of `version` (taken and given back); `None` when the
    /// version has no free instance.
    async fn judge_on(
        &self,
        version: &Version,
        records: &Arc<[Record]>,
        policy: &Verdict,
        on_fault: OnFault,
        traceparent: Option<&str>,
    ) -> Option<(Judged, Duration)> {
        let handler = version.instances.lock().pop()?;
        let started = Instant::now();
        let (handler, judged) = handler
            .judge(records.clone(), policy, on_fault, traceparent)
            .await;
        let elapsed = started.elapsed();
        if let Some(handler) = handler {
            version.instances.lock().push(handler);
        }
        Some((judged, elapsed))
    }

    /// What a judgement tells the rest of the pipeline: the swap-stall watch, the faults (logged
    /// once per batch, counted per kind, remembered per record for a dead letter at the cap),
    /// the shadow (a copy of an active version's batch), the call's time, the delivery counts
    /// and the batch counters.
    pub(super) fn note(&self, batch: &[ShareRecord], records: &Arc<[Record]>, j: &Judgement) {
        let version = &j.version;
        let judged = &j.judged;
        let c = &self.counters;
        if let Some(stall) = c.stall.lock().judged(&version.hash, Instant::now()) {
            tracing::info!(pipeline = %self.spec.name, version = %short(&version.hash), stall_ms = stall.as_secs_f64() * 1e3, "first batch judged by the swapped-in version");
        }
        let policy = self.fault_verdict();
        if matches!(policy, Verdict::Release) && !judged.faulted.is_empty() {
            let mut last = c.last_faults.lock();
            for &(i, f) in &judged.faulted {
                if let (Some(r), Some(fault)) = (batch.get(i), judged.faults.get(f)) {
                    last.note(
                        (r.topic.clone(), r.partition.partition, r.record.offset),
                        fault,
                    );
                }
            }
        }
        if let Some(first) = judged.faults.first() {
            let (lo, hi) = (
                batch.first().map(|r| r.record.offset),
                batch.last().map(|r| r.record.offset),
            );
            tracing::warn!(
                pipeline = %self.spec.name, version = %short(&version.hash), kind = %first.kind,
                records = batch.len(), first_offset = ?lo, last_offset = ?hi, faults = judged.faults.len(),
                "plugin fault: {}", first.message
            );
            c.recent_faults.note(
                RecentFault::now(
                    &self.spec.name,
                    FaultRole::Active,
                    first.kind.as_str(),
                    &first.message,
                )
                .on_batch(&version.hash, batch.len(), lo, hi),
            );
            c.count(&version.hash, |v| v.faults += judged.faults.len() as u64);
            for f in &judged.faults {
                let mut l = c.labels(&version.hash);
                l.push(("kind", f.kind.as_str().into()));
                self.metrics.faults.get_or_create(&l).inc();
            }
        }
        if !j.by_canary
            && let Some(run) = self.rollouts.shadow()
        {
            run.offer(
                || {
                    batch
                        .iter()
                        .map(|r| (r.topic.to_string(), r.partition.partition, r.record.offset))
                        .collect()
                },
                records,
                &judged.verdicts,
                &policy,
                c,
            );
        }
        let series = c.series(&version.hash);
        series.guest_seconds.observe(j.elapsed.as_secs_f64());
        c.delivery_count()
            .observe_all(batch.iter().map(|r| r.delivery_count));
        series.batches.inc();
        c.count(&version.hash, |v| v.batches += 1);
    }
}

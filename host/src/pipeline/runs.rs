//! Rollout runs beside the active version: a shadow judges copies of a sample of batches on
//! its own instance and is only compared; a canary judges a share of batches for real and is
//! promoted or rolled back by [`CanaryPlan`]'s rules. The rules are `crate::rollout`'s; here is
//! what a run holds while it goes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Semaphore;

use super::counters::Counters;
use super::guard::lock;
use super::handler::OnFault;
use super::versions::Version;
use crate::recent_faults::{FaultRole, RecentFault};
use crate::rollout::{CanaryPlan, ShadowComparison};
use crate::runtime::{Record, Verdict};
use sharehost_api::{CanaryState, CanaryStatus};

/// A running shadow: the candidate's one instance, what it has seen, and a bound on the
/// batches waiting for it.
pub(super) struct ShadowRun {
    pub(super) version: Version,
    pub(super) sample: f64,
    /// Batches offered so far, to spread the sample evenly.
    pub(super) offered: AtomicU64,
    /// Free places in its queue ([`SHADOW_QUEUE`]); none free: the batch is dropped.
    pub(super) queue: Arc<Semaphore>,
    /// Its one instance judges one batch at a time.
    pub(super) turn: tokio::sync::Mutex<()>,
    pub(super) status: Mutex<ShadowComparison>,
}

/// A running canary: the candidate's instances (as many as the active version's) and its plan.
pub(super) struct CanaryRun {
    pub(super) version: Arc<Version>,
    pub(super) plan: Mutex<CanaryPlan>,
    /// The fleet canary this host runs its share of (the fleet action's number): its rules are
    /// applied to the fleet's sums, not to this host's tallies alone, so it never decides here.
    pub(super) fleet_seq: Option<u64>,
}

/// A canary's status from its run.
pub(super) fn canary_status(
    run: &CanaryRun,
    state: CanaryState,
    reason: Option<String>,
) -> CanaryStatus {
    let plan = lock(&run.plan);
    CanaryStatus {
        candidate: run.version.hash.clone(),
        path: run.version.path.display().to_string(),
        percent: plan.request.percent,
        state,
        reason,
        candidate_tally: plan.candidate.into(),
        active_tally: plan.active.into(),
        seconds: plan.started.elapsed().as_secs(),
        promote_after: plan.request.promote_after.clone(),
        rollback_if: plan.request.rollback_if.clone(),
    }
}

impl ShadowRun {
    /// Hands a copy of a batch (`records`, at `coordinates`) and the active version's verdicts
    /// to the shadow when the batch is in its sample; dropped (and counted) when the shadow is
    /// behind. The shadow judges on a task of its own and is compared, never acted on.
    pub(super) fn offer(
        self: &Arc<Self>,
        coordinates: impl FnOnce() -> Vec<(String, i32, i64)>,
        records: &Arc<[Record]>,
        verdicts: &[Verdict],
        policy: &Verdict,
        counters: &Counters,
    ) {
        let run = self.clone();
        let n = run.offered.fetch_add(1, Ordering::Relaxed);
        let sampled = ((n + 1) as f64 * run.sample).floor() > (n as f64 * run.sample).floor();
        if !sampled {
            return;
        }
        let Ok(place) = run.queue.clone().try_acquire_owned() else {
            lock(&run.status).dropped(records.len());
            return;
        };
        let coordinates = coordinates();
        let (records, active, policy) = (records.clone(), verdicts.to_vec(), policy.clone());
        let (metrics, pipeline) = (counters.metrics.clone(), counters.name().to_owned());
        let recent_faults = counters.recent_faults.clone();
        let (first, last) = (
            coordinates.first().map(|c| c.2),
            coordinates.last().map(|c| c.2),
        );
        tokio::spawn(async move {
            let _place = place;
            let _turn = run.turn.lock().await;
            let Some(handler) = lock(&run.version.instances).pop() else {
                return;
            };
            let started = Instant::now();
            // Its emits are dropped with `judged`: a shadow never produces anything.
            let (handler, judged) = handler.judge(records, &policy, OnFault::Isolate).await;
            let elapsed = started.elapsed();
            if let Some(handler) = handler {
                lock(&run.version.instances).push(handler);
            }
            if let Some(f) = judged.faults.first() {
                lock(&run.status).faulted(judged.faults.len());
                recent_faults.note(
                    RecentFault::now(&pipeline, FaultRole::Shadow, f.kind.as_str(), &f.message)
                        .on_batch(&run.version.hash, coordinates.len(), first, last),
                );
                return;
            }
            lock(&run.status).compare(&coordinates, &active, &judged.verdicts, elapsed);
            let mut pairs: BTreeMap<(&str, &str), u64> = BTreeMap::new();
            for (a, c) in active.iter().zip(&judged.verdicts) {
                *pairs.entry((a.kind(), c.kind())).or_default() += 1;
            }
            for ((a, c), n) in pairs {
                metrics
                    .shadow_verdicts
                    .get_or_create(&vec![
                        ("pipeline", pipeline.clone()),
                        ("active", a.to_owned()),
                        ("candidate", c.to_owned()),
                    ])
                    .inc_by(n);
            }
        });
    }
}

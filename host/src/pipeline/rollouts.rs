//! The rollout room, [`Rollouts`]: the runs beside the active version. A shadow judges copies of
//! a sample of batches on its own instance and is only compared; a canary judges a share of
//! batches for real and is promoted or rolled back by [`CanaryPlan`]'s rules. The rules are
//! `crate::rollout`'s; here is what a run holds while it goes, and the room that owns the runs.
//! Loading a candidate and making a promoted one active are the pipeline's, which composes this
//! room with the versions room.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use std::time::Instant;

use tokio::sync::Semaphore;

use super::counters::Counters;
use super::handler::OnFault;
use super::versions::{Version, short};
use crate::metrics::Metrics;
use crate::recent_faults::{FaultRole, RecentFault};
use crate::rollout::{
    CanaryDecision, CanaryNote, CanaryPlan, CanaryRequest, SHADOW_QUEUE, ShadowComparison,
    VerdictTally,
};
use crate::runtime::{Record, Verdict};
use sharehost_api::{CanaryState, CanaryStatus, ShadowStatus};

/// The rollout room: the running shadow and canary of one pipeline, and how its last canary
/// ended. Each run is shared (`Arc`) with the batches it is judging, which finish on it even
/// when it ends meanwhile.
pub(super) struct Rollouts {
    /// The pipeline's name, for logs and metric labels.
    pipeline: String,
    metrics: Arc<Metrics>,
    /// A candidate judging copies of batches, compared and never acted on.
    shadow: Mutex<Option<Arc<ShadowRun>>>,
    /// A candidate judging a share of batches for real.
    canary: Mutex<Option<Arc<CanaryRun>>>,
    /// How the last canary ended (kept after it is gone, for `GET /pipelines`).
    last_canary: Mutex<Option<CanaryStatus>>,
}

/// How a canary ended: what the pipeline does next with its versions.
pub(super) enum CanaryEnd {
    /// Promoted: this version (the canary's own, with its instances) becomes the active one.
    Promoted(Arc<Version>),
    /// Rolled back: dropped; the active version stays.
    RolledBack,
}

impl Rollouts {
    /// No shadow and no canary yet.
    pub(super) fn new(pipeline: &str, metrics: Arc<Metrics>) -> Rollouts {
        Rollouts {
            pipeline: pipeline.to_owned(),
            metrics,
            shadow: Mutex::new(None),
            canary: Mutex::new(None),
            last_canary: Mutex::new(None),
        }
    }

    /// Starts shadowing `version` (loaded from `path` on its own single instance) for a
    /// `sample` of the batches; replaces a running shadow. Returns its hash.
    pub(super) fn start_shadow(&self, version: Version, path: &Path, sample: f64) -> String {
        let hash = version.hash.clone();
        let status = ShadowStatus {
            candidate: hash.clone(),
            path: path.display().to_string(),
            sample,
            ..ShadowStatus::default()
        }
        .into();
        *self.shadow.lock() = Some(Arc::new(ShadowRun {
            version,
            sample,
            offered: AtomicU64::new(0),
            queue: Arc::new(Semaphore::new(SHADOW_QUEUE)),
            turn: tokio::sync::Mutex::new(()),
            status: Mutex::new(status),
        }));
        tracing::info!(pipeline = %self.pipeline, candidate = %short(&hash), sample, "shadow started");
        hash
    }

    /// Stops the shadow; returns what it saw.
    pub(super) fn stop_shadow(&self) -> Option<ShadowStatus> {
        let run = self.shadow.lock().take()?;
        let status = run.status.lock().status();
        tracing::info!(pipeline = %self.pipeline, candidate = %short(&status.candidate), records = status.records, disagreed = ?status.disagreed, "shadow stopped");
        Some(status)
    }

    /// The running shadow's candidate hash.
    pub(super) fn shadow_candidate(&self) -> Option<String> {
        self.shadow.lock().as_ref().map(|s| s.version.hash.clone())
    }

    /// The running shadow, to offer it a copy of an active version's batch.
    pub(super) fn shadow(&self) -> Option<Arc<ShadowRun>> {
        self.shadow.lock().clone()
    }

    /// What the running shadow has seen so far.
    pub(super) fn shadow_status(&self) -> Option<ShadowStatus> {
        self.shadow
            .lock()
            .as_ref()
            .map(|s| s.status.lock().status())
    }

    /// Refuses a second canary while one runs (with the reason).
    pub(super) fn no_canary(&self) -> Result<(), String> {
        match self.canary.lock().as_ref() {
            Some(c) => Err(format!(
                "a canary of {} is already running: promote it or roll it back first",
                short(&c.version.hash)
            )),
            None => Ok(()),
        }
    }

    /// Starts a canary of `version` by `req` (`fleet_seq`: this host's share of that fleet
    /// canary, decided by the fleet). The caller checked [`Rollouts::no_canary`] under the
    /// pipeline's one-change-at-a-time lock. Returns its hash.
    pub(super) fn start_canary(
        &self,
        version: Version,
        req: CanaryRequest,
        fleet_seq: Option<u64>,
    ) -> String {
        let hash = version.hash.clone();
        tracing::info!(pipeline = %self.pipeline, candidate = %short(&hash), percent = req.percent, "canary started");
        self.count_canary("started");
        *self.canary.lock() = Some(Arc::new(CanaryRun {
            version: Arc::new(version),
            plan: Mutex::new(CanaryPlan::new(req)),
            fleet_seq,
        }));
        hash
    }

    /// The running canary as the fleet reads it: its fleet action's number (`None`: a canary
    /// of this host alone), the candidate's hash and both sides' tallies.
    pub(super) fn canary_tallies(
        &self,
    ) -> Option<(Option<u64>, String, VerdictTally, VerdictTally)> {
        let run = self.canary.lock().clone()?;
        let plan = run.plan.lock();
        Some((
            run.fleet_seq,
            run.version.hash.clone(),
            plan.candidate,
            plan.active,
        ))
    }

    /// Whether the running canary is this host's share of fleet canary `seq`.
    pub(super) fn runs_fleet_canary(&self, seq: u64) -> bool {
        self.canary
            .lock()
            .as_ref()
            .is_some_and(|c| c.fleet_seq == Some(seq))
    }

    /// The running canary as the state file notes it (a restart ends it, and says so).
    pub(super) fn canary_note(&self) -> Option<CanaryNote> {
        self.canary.lock().as_ref().map(|c| CanaryNote {
            candidate: c.version.hash.clone(),
            path: c.version.path.clone(),
            percent: c.plan.lock().request.percent,
        })
    }

    /// The running canary's status, or how the last one ended.
    pub(super) fn canary_status(&self) -> Option<CanaryStatus> {
        match self.canary.lock().as_ref() {
            Some(c) => Some(canary_status(c, CanaryState::Running, None)),
            None => self.last_canary.lock().clone(),
        }
    }

    /// The running canary's version when its hash is `hash` (a dead letter names the version
    /// that rejected its record).
    pub(super) fn canary_version(&self, hash: &str) -> Option<Arc<Version>> {
        self.canary
            .lock()
            .as_ref()
            .filter(|c| c.version.hash == hash)
            .map(|c| c.version.clone())
    }

    /// The running canary when it takes the next batch (its share of them).
    pub(super) fn canary_for_next(&self) -> Option<Arc<CanaryRun>> {
        self.canary
            .lock()
            .clone()
            .filter(|c| c.plan.lock().takes_next())
    }

    /// Tallies a batch the canary `run` judged (`verdicts`; `None`: it faulted or had no free
    /// instance) and returns what its rules decide, for a canary of this host alone (a fleet
    /// canary is decided by the fleet on every host's sums).
    pub(super) fn candidate_judged(
        &self,
        run: &CanaryRun,
        verdicts: Option<&[Verdict]>,
    ) -> Option<CanaryDecision> {
        let decision = {
            let mut plan = run.plan.lock();
            match verdicts {
                Some(v) => plan.candidate.add(v, false),
                None => plan.candidate.add_faulted(),
            }
            plan.after_candidate_batch()
        };
        run.fleet_seq.is_none().then_some(decision)
    }

    /// Tallies a batch the active version judged while a canary runs (its side of the
    /// comparison).
    pub(super) fn active_judged(&self, verdicts: &[Verdict], faulted: bool) {
        if let Some(run) = self.canary.lock().as_ref() {
            run.plan.lock().active.add(verdicts, faulted);
        }
    }

    /// Ends the running canary (when `only` is given, only if that run is still the one
    /// running): logged, counted and kept for `GET /pipelines` with `reason`. `None` when no
    /// such canary runs.
    pub(super) fn end_canary(
        &self,
        only: Option<&Arc<CanaryRun>>,
        promote: bool,
        reason: String,
    ) -> Option<CanaryEnd> {
        let run = {
            let mut canary = self.canary.lock();
            if let Some(only) = only
                && !canary.as_ref().is_some_and(|c| Arc::ptr_eq(c, only))
            {
                return None;
            }
            canary.take()?
        };
        let state = if promote {
            CanaryState::Promoted
        } else {
            CanaryState::RolledBack
        };
        *self.last_canary.lock() = Some(canary_status(&run, state, Some(reason.clone())));
        self.count_canary(if promote { "promoted" } else { "rolled_back" });
        if promote {
            tracing::info!(pipeline = %self.pipeline, candidate = %short(&run.version.hash), %reason, "canary promoted");
            Some(CanaryEnd::Promoted(run.version.clone()))
        } else {
            tracing::warn!(pipeline = %self.pipeline, candidate = %short(&run.version.hash), %reason, "canary rolled back");
            Some(CanaryEnd::RolledBack)
        }
    }

    fn count_canary(&self, result: &str) {
        self.metrics
            .canary_transitions
            .get_or_create(&vec![
                ("pipeline", self.pipeline.clone()),
                ("result", result.to_owned()),
            ])
            .inc();
    }
}

/// A running shadow: the candidate's one instance, what it has seen, and a bound on the
/// batches waiting for it.
pub(super) struct ShadowRun {
    version: Version,
    sample: f64,
    /// Batches offered so far, to spread the sample evenly.
    offered: AtomicU64,
    /// Free places in its queue ([`SHADOW_QUEUE`]); none free: the batch is dropped.
    queue: Arc<Semaphore>,
    /// Its one instance judges one batch at a time.
    turn: tokio::sync::Mutex<()>,
    status: Mutex<ShadowComparison>,
}

/// A running canary: the candidate's instances (as many as the active version's) and its plan.
pub(super) struct CanaryRun {
    version: Arc<Version>,
    plan: Mutex<CanaryPlan>,
    /// The fleet canary this host runs its share of (the fleet action's number): its rules are
    /// applied to the fleet's sums, not to this host's tallies alone, so it never decides here.
    fleet_seq: Option<u64>,
}

impl CanaryRun {
    /// The candidate version judging the canary's batches.
    pub(super) fn version(&self) -> &Arc<Version> {
        &self.version
    }
}

/// A canary's status from its run.
fn canary_status(run: &CanaryRun, state: CanaryState, reason: Option<String>) -> CanaryStatus {
    let plan = run.plan.lock();
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
            run.status.lock().dropped(records.len());
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
            let Some(handler) = run.version.instances.lock().pop() else {
                return;
            };
            let started = Instant::now();
            // Its emits are dropped with `judged`: a shadow never produces anything.
            let (handler, judged) = handler
                .judge(records, &policy, OnFault::Isolate, None)
                .await;
            let elapsed = started.elapsed();
            if let Some(handler) = handler {
                run.version.instances.lock().push(handler);
            }
            if let Some(f) = judged.faults.first() {
                run.status.lock().faulted(judged.faults.len());
                recent_faults.note(
                    RecentFault::now(&pipeline, FaultRole::Shadow, f.kind.as_str(), &f.message)
                        .on_batch(&run.version.hash, coordinates.len(), first, last),
                );
                return;
            }
            run.status
                .lock()
                .compare(&coordinates, &active, &judged.verdicts, elapsed);
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

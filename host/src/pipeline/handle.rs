//! [`Pipeline`]: the handle the host, the tenants and the admin API hold. It owns the spec and
//! grants and composes the rooms: the versions room ([`Versions`]: active, kept for rollback,
//! remembered across restarts), the rollout room ([`Rollouts`]: shadow and canary) and the
//! counts. A change that touches two rooms (a promoted canary becomes the active version) is
//! made here; the run loop, judging and acting are its impl blocks in files of their own
//! (`run_loop`, `judge`, `act`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use parking_lot::Mutex;

use tokio_util::sync::CancellationToken;

use super::counters::Counters;
use super::handler::NativeHandler;
use super::rollouts::{CanaryEnd, CanaryRun, Rollouts};
use super::versions::{
    Grants, Kept, SwapError, Version, Versions, compile_version, instantiate_version, limits,
    load_version, short,
};
use crate::kafka::{KafkaClient, now_ms};
use crate::manifest::PipelineSpec;
use crate::metrics::{Labels, Metrics};
use crate::recent_faults::{FaultRole, RecentFault};
use crate::rollout::{ActiveState, CanaryDecision, CanaryRequest, ShadowRequest, VerdictTally};
use crate::runtime::{PluginLimits, PluginRuntime};
use sharehost_api::ShadowStatus;

/// A running pipeline as the admin endpoints see it.
pub struct Pipeline {
    pub(super) spec: PipelineSpec,
    pub(super) grants: Grants,
    pub(super) runtime: PluginRuntime,
    pub(super) metrics: Arc<Metrics>,
    /// The versions room: the active version, the kept ones, the state file.
    pub(super) versions: Versions,
    /// The rollout room: the shadow and the canary.
    pub(super) rollouts: Rollouts,
    /// One change of versions at a time (swap, rollback, shadow, canary, promotion).
    pub(super) swapping: tokio::sync::Mutex<()>,
    pub(super) state: Mutex<String>,
    /// What the pipeline counts, and the registry it publishes to.
    pub(super) counters: Counters,
    /// Whether the group's broker dead-letters Rejects and archived records itself (KIP-1191):
    /// the host's own dead letters are then acknowledged as done.
    pub(super) broker_dlq: AtomicBool,
    pub(super) last_swap_error: Mutex<Option<String>>,
    pub(super) last_error: Mutex<Option<String>>,
    /// The group's `share.auto.offset.reset` as last set or read before a join.
    pub(super) start: Mutex<Option<String>>,
    /// Output names the plugin emitted to that the manifest does not map.
    pub(super) unmapped: Mutex<BTreeSet<String>>,
}

impl Pipeline {
    /// Loads the pipeline's component (validated and initialised) without touching Kafka.
    pub async fn load(
        spec: PipelineSpec,
        runtime: PluginRuntime,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Pipeline>, SwapError> {
        let grants = Grants::build(&spec)?;
        let version = load_version(&runtime, &spec, &grants, &spec.component).await?;
        tracing::info!(pipeline = %spec.name, version = %short(&version.hash), "plugin loaded");
        let versions = Versions::new(&spec, metrics.clone(), version);
        Self::with_versions(spec, grants, runtime, metrics, versions)
            .start_manifest_shadow()
            .await
    }

    /// Starts the shadow the manifest names, if any: a candidate that cannot be shadowed stops
    /// the load with the reason, as a bad component would.
    async fn start_manifest_shadow(self: Arc<Self>) -> Result<Arc<Self>, SwapError> {
        if let Some(sh) = self.spec.shadow.clone() {
            self.start_shadow(ShadowRequest {
                path: sh.path,
                sample: sh.sample,
            })
            .await?;
        }
        Ok(self)
    }

    /// Loads the pipeline like [`Pipeline::load`], remembering its active version in
    /// `state_dir` across restarts. The rule at start: if the state file names another
    /// version than the manifest's component, and the manifest's component is the one the
    /// file was written against (unchanged since), the host comes back on the remembered
    /// version (when its file still has that content) with the manifest's kept for rollback;
    /// otherwise it starts on the manifest's component. Either way the log says which, and why.
    pub async fn load_remembering(
        spec: PipelineSpec,
        runtime: PluginRuntime,
        metrics: Arc<Metrics>,
        state_dir: &Path,
    ) -> Result<Arc<Pipeline>, SwapError> {
        let grants = Grants::build(&spec)?;
        let file = ActiveState::file_moving_older(state_dir, &spec.name, &spec.group);
        let manifest = compile_version(&runtime, &spec, &grants, &spec.component).await?;
        let remembered = match ActiveState::read(&file) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(pipeline = %spec.name, "ignoring an unreadable state file: {e}");
                None
            }
        };
        let canary_ended = remembered.as_ref().is_some_and(|r| r.canary.is_some());
        if let Some(c) = remembered.as_ref().and_then(|r| r.canary.as_ref()) {
            tracing::warn!(pipeline = %spec.name, candidate = %short(&c.candidate), path = %c.path.display(), percent = c.percent, "a canary was running when the host stopped; the restart ended it (not resumed): the active version judges every batch, start the canary again to go on");
        }
        let restore = match remembered {
            Some(st) if st.active_hash == manifest.hash => {
                tracing::info!(pipeline = %spec.name, version = %short(&manifest.hash), state = %file.display(), "the version active before the restart is the manifest's component: starting on it");
                None
            }
            Some(st) if st.manifest_hash != manifest.hash => {
                tracing::info!(pipeline = %spec.name, remembered = %short(&st.active_hash), manifest = %short(&manifest.hash), "the manifest's component changed since the last run: starting on it, not on the version active before");
                None
            }
            Some(st) => match compile_version(&runtime, &spec, &grants, &st.active_path).await {
                Ok(c) if c.hash == st.active_hash => Some((st.active_path, c)),
                Ok(c) => {
                    tracing::warn!(pipeline = %spec.name, path = %st.active_path.display(), expected = %short(&st.active_hash), found = %short(&c.hash), "the version active before the restart has changed on disk: starting on the manifest's component");
                    None
                }
                Err(e) => {
                    tracing::warn!(pipeline = %spec.name, "the version active before the restart cannot be loaded, starting on the manifest's component: {e}");
                    None
                }
            },
            None => {
                tracing::info!(pipeline = %spec.name, state = %file.display(), "no version remembered for this pipeline and group: starting on the manifest's component");
                None
            }
        };
        let manifest_hash = manifest.hash.clone();
        let (start, kept) = match restore {
            Some((path, c)) => {
                tracing::info!(pipeline = %spec.name, version = %short(&c.hash), manifest = %short(&manifest_hash), "coming back on the version active before the restart (the manifest's component is unchanged; it is kept for rollback)");
                let kept = Kept {
                    hash: manifest.hash.clone(),
                    path: spec.component.clone(),
                    compiled: manifest,
                    loaded_at_ms: now_ms(),
                };
                ((path, c), Some(kept))
            }
            None => ((spec.component.clone(), manifest), None),
        };
        let version = instantiate_version(
            &runtime,
            &spec,
            &grants,
            &start.0,
            start.1,
            limits(&spec, &grants),
            spec.concurrency,
        )
        .await?;
        tracing::info!(pipeline = %spec.name, version = %short(&version.hash), "plugin loaded");
        let versions =
            Versions::new(&spec, metrics.clone(), version).remembering(file, manifest_hash, kept);
        let pipeline = Self::with_versions(spec, grants, runtime, metrics, versions);
        if canary_ended {
            pipeline.remember_active();
        }
        pipeline.start_manifest_shadow().await
    }

    /// A pipeline whose batches go to a trusted native handler instead of `spec.component`
    /// (which is not loaded). A hot-swap still loads a Wasm component in its place.
    pub fn native(
        spec: PipelineSpec,
        runtime: PluginRuntime,
        metrics: Arc<Metrics>,
        handler: Arc<dyn NativeHandler>,
    ) -> Arc<Pipeline> {
        let version = Version::native(handler, spec.concurrency);
        tracing::info!(pipeline = %spec.name, version = %version.hash, "native handler in place of a plugin");
        // A native handler uses no grant; a later hot-swap to a component gets the
        // manifest's, or none when they cannot be built (say, a secret that is not set).
        let grants = Grants::build(&spec).unwrap_or_else(|e| {
            tracing::warn!(pipeline = %spec.name, "grants for a later hot-swap unavailable: {e}");
            Grants::default()
        });
        let versions = Versions::new(&spec, metrics.clone(), version);
        Self::with_versions(spec, grants, runtime, metrics, versions)
    }

    fn with_versions(
        spec: PipelineSpec,
        grants: Grants,
        runtime: PluginRuntime,
        metrics: Arc<Metrics>,
        versions: Versions,
    ) -> Arc<Pipeline> {
        let counters = Counters::new(&spec.name, metrics.clone());
        let active = versions.active();
        let pipeline = Arc::new(Pipeline {
            rollouts: Rollouts::new(&spec.name, metrics.clone()),
            spec,
            grants,
            runtime,
            metrics,
            counters,
            versions,
            swapping: tokio::sync::Mutex::new(()),
            state: Mutex::new("starting".into()),
            broker_dlq: AtomicBool::new(false),
            last_swap_error: Mutex::new(None),
            last_error: Mutex::new(None),
            start: Mutex::new(None),
            unmapped: Mutex::new(BTreeSet::new()),
        });
        pipeline.counters.init_series(&active.hash);
        pipeline
    }

    /// The pipeline's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The component path of the active version.
    pub fn component(&self) -> PathBuf {
        self.versions.active().path.clone()
    }

    /// Content hash of the active version.
    pub fn active_hash(&self) -> String {
        self.versions.active().hash.clone()
    }

    /// The last faults this pipeline met (plugin faults of every role, refused swaps), newest
    /// first.
    pub fn recent_faults(&self) -> Vec<RecentFault> {
        self.counters.recent_faults.newest_first()
    }

    /// Loads `path` as the new version; it takes the next batch. A version that fails to load
    /// or initialise leaves the old one running, and the failure is returned and remembered.
    pub async fn swap(&self, path: &Path) -> Result<String, SwapError> {
        let _one_at_a_time = self.swapping.lock().await;
        let labels: Labels = vec![("pipeline", self.spec.name.clone())];
        self.counters.stall.lock().swap_requested();
        match load_version(&self.runtime, &self.spec, &self.grants, path).await {
            Ok(v) => {
                let hash = v.hash.clone();
                self.counters.stall.lock().swap_ready(&hash);
                self.activate(v, "hot-swapped");
                *self.last_swap_error.lock() = None;
                let mut l = labels;
                l.push(("result", "ok".into()));
                self.metrics.swaps.get_or_create(&l).inc();
                Ok(hash)
            }
            Err(e) => {
                self.counters.stall.lock().swap_refused();
                tracing::error!(pipeline = %self.spec.name, "hot-swap refused, the old version keeps running: {e}");
                self.counters.recent_faults.note(RecentFault::now(
                    &self.spec.name,
                    FaultRole::Swap,
                    "refused",
                    &e.to_string(),
                ));
                *self.last_swap_error.lock() = Some(e.to_string());
                let mut l = labels;
                l.push(("result", "failed".into()));
                self.metrics.swaps.get_or_create(&l).inc();
                Err(e)
            }
        }
    }

    /// Makes `v` the active version (see [`Versions::activate`]) and remembers it for a
    /// restart.
    fn activate(&self, v: impl Into<Arc<Version>>, how: &str) {
        self.versions.activate(v.into(), how);
        self.remember_active();
    }

    /// Writes the state file (when this pipeline keeps one), with the running canary noted.
    fn remember_active(&self) {
        self.versions.remember(self.rollouts.canary_note());
    }

    /// Switches back to a kept version (the newest one, or the one whose hash starts with
    /// `hash`), without compiling: its code was kept. Returns the now active hash.
    pub async fn rollback(&self, hash: Option<&str>) -> Result<String, SwapError> {
        let _one_at_a_time = self.swapping.lock().await;
        let err = |message: String| SwapError {
            pipeline: self.spec.name.clone(),
            path: PathBuf::new(),
            message,
        };
        let kept = self.versions.kept(hash).map_err(err)?;
        let v = instantiate_version(
            &self.runtime,
            &self.spec,
            &self.grants,
            &kept.path,
            kept.compiled.clone(),
            limits(&self.spec, &self.grants),
            self.spec.concurrency,
        )
        .await?;
        // The same version as before, loaded when it first was.
        let v = Version {
            loaded_at_ms: kept.loaded_at_ms,
            ..v
        };
        let hash = v.hash.clone();
        self.activate(v, "rolled back");
        self.metrics
            .swaps
            .get_or_create(&vec![
                ("pipeline", self.spec.name.clone()),
                ("result", "rollback".into()),
            ])
            .inc();
        Ok(hash)
    }

    /// Starts shadowing `req.path`: it judges copies of (a sample of) the batches the active
    /// version judged, on its own single instance, and is compared, never acted on. It gets
    /// the pipeline's output names but its emits are discarded, and no HTTP: a candidate that
    /// imports `wasi:http` is refused as a shadow (its answers would depend on calls that a
    /// shadow must not make). Replaces a running shadow.
    pub async fn start_shadow(&self, req: ShadowRequest) -> Result<String, SwapError> {
        let err = |message: String| SwapError {
            pipeline: self.spec.name.clone(),
            path: req.path.clone(),
            message,
        };
        req.validate().map_err(err)?;
        let _one_at_a_time = self.swapping.lock().await;
        let shadow_limits = PluginLimits {
            http: None,
            ..limits(&self.spec, &self.grants)
        };
        let compiled = self
            .runtime
            .compile(&req.path, &shadow_limits)
            .await
            .map_err(|e| err(format!("as a shadow: {e}")))?;
        let version = instantiate_version(
            &self.runtime,
            &self.spec,
            &self.grants,
            &req.path,
            compiled,
            shadow_limits,
            1,
        )
        .await?;
        Ok(self.rollouts.start_shadow(version, &req.path, req.sample))
    }

    /// Stops the shadow; returns what it saw.
    pub fn stop_shadow(&self) -> Option<ShadowStatus> {
        self.rollouts.stop_shadow()
    }

    /// Starts a canary: the candidate judges `percent` of the batches for real, and is
    /// promoted or rolled back by [`CanaryPlan`]'s rules. Replaces nothing: a second canary
    /// while one runs is refused.
    pub async fn start_canary(&self, req: CanaryRequest) -> Result<String, SwapError> {
        self.start_canary_for(req, None).await
    }

    /// Starts this host's share of fleet canary `seq`: the candidate judges `req.percent` of
    /// the batches here and its tallies are read by the fleet, which decides on every host's
    /// sums; this host never promotes or rolls it back on its own.
    pub async fn start_fleet_canary(
        &self,
        req: CanaryRequest,
        seq: u64,
    ) -> Result<String, SwapError> {
        self.start_canary_for(req, Some(seq)).await
    }

    /// The running canary as the fleet reads it: its fleet action's number (`None`: a canary
    /// of this host alone), the candidate's hash and both sides' tallies.
    pub fn canary_tallies(&self) -> Option<(Option<u64>, String, VerdictTally, VerdictTally)> {
        self.rollouts.canary_tallies()
    }

    /// The running shadow's candidate hash.
    pub fn shadow_candidate(&self) -> Option<String> {
        self.rollouts.shadow_candidate()
    }

    /// The manifest's own component's content hash, as loaded at start.
    pub fn manifest_hash(&self) -> &str {
        self.versions.manifest_hash()
    }

    /// The pipeline's spec (as the manifest gives it).
    pub fn spec(&self) -> &PipelineSpec {
        &self.spec
    }

    async fn start_canary_for(
        &self,
        req: CanaryRequest,
        fleet_seq: Option<u64>,
    ) -> Result<String, SwapError> {
        let err = |message: String| SwapError {
            pipeline: self.spec.name.clone(),
            path: req.path.clone(),
            message,
        };
        req.validate().map_err(err)?;
        let _one_at_a_time = self.swapping.lock().await;
        self.rollouts.no_canary().map_err(err)?;
        let version = load_version(&self.runtime, &self.spec, &self.grants, &req.path).await?;
        if version.hash == self.active_hash() {
            return Err(err("the candidate is the active version".into()));
        }
        let hash = self.rollouts.start_canary(version, req, fleet_seq);
        self.remember_active();
        Ok(hash)
    }

    /// Ends the running canary now, an operator's decision: promoted (`promote`) or rolled
    /// back. Returns the active hash.
    pub async fn end_canary_now(&self, promote: bool) -> Result<String, SwapError> {
        let _one_at_a_time = self.swapping.lock().await;
        let reason = if promote {
            "promoted by the operator"
        } else {
            "rolled back by the operator"
        };
        self.end_canary(None, promote, reason.into())
            .ok_or_else(|| SwapError {
                pipeline: self.spec.name.clone(),
                path: PathBuf::new(),
                message: "no canary is running".into(),
            })
    }

    /// Ends fleet canary `seq` as the fleet decided it (`reason` names the deciding host and
    /// the fleet's numbers); a canary that is not that one is left alone. Returns the active
    /// hash, or `None` when no such canary runs here.
    pub async fn end_fleet_canary(
        &self,
        seq: u64,
        promote: bool,
        reason: String,
    ) -> Option<String> {
        let _one_at_a_time = self.swapping.lock().await;
        if !self.rollouts.runs_fleet_canary(seq) {
            return None;
        }
        self.end_canary(None, promote, reason)
    }

    /// Ends the running canary, whoever started it, with `reason` (the fleet replacing this
    /// host's own canary with one of its own). Returns the active hash, or `None` when no
    /// canary runs.
    pub async fn end_canary_because(&self, promote: bool, reason: String) -> Option<String> {
        let _one_at_a_time = self.swapping.lock().await;
        self.end_canary(None, promote, reason)
    }

    /// Ends the running canary (if any; with `only`, if that run is still the one running):
    /// promoted, its version becomes the active one; rolled back, it is dropped. Logged,
    /// counted and kept for `GET /pipelines` with `reason`. Returns the active hash.
    fn end_canary(
        &self,
        only: Option<&Arc<CanaryRun>>,
        promote: bool,
        reason: String,
    ) -> Option<String> {
        match self.rollouts.end_canary(only, promote, reason)? {
            // The canary's version (the same one: batches it is judging now give their
            // instance back to it) becomes the active one.
            CanaryEnd::Promoted(version) => self.activate(version, "promoted from canary"),
            CanaryEnd::RolledBack => self.remember_active(),
        }
        Some(self.active_hash())
    }

    pub(super) fn set_state(&self, s: &str) {
        *self.state.lock() = s.to_owned();
        if s != "running" {
            self.metrics
                .pipeline_up
                .get_or_create(&vec![("pipeline", self.spec.name.clone())])
                .set(0);
        }
    }

    /// Acts on a canary's decision after one of its batches (if it is still the running one).
    pub(super) fn decide_canary(&self, run: &Arc<CanaryRun>, decision: CanaryDecision) {
        match decision {
            CanaryDecision::Continue => {}
            CanaryDecision::Promote(reason) => {
                self.end_canary(Some(run), true, reason);
            }
            CanaryDecision::RollBack(reason) => {
                self.end_canary(Some(run), false, reason);
            }
        }
    }

    /// Runs the pipeline until `shutdown`: consume, judge, acknowledge, dead-letter; then drain:
    /// stop fetching, let running batches finish (bounded), flush verdicts, release the rest,
    /// close the sessions and leave the group.
    pub async fn run(
        self: Arc<Self>,
        client: Arc<KafkaClient>,
        shutdown: CancellationToken,
    ) -> Result<(), String> {
        let result = self.clone().serve(client, shutdown).await;
        if let Err(e) = &result {
            *self.last_error.lock() = Some(e.clone());
            self.set_state("failed");
        }
        result
    }
}

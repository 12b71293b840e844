//! What `GET /pipelines` and `GET /pipelines/NAME/versions` show of a pipeline.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::core::Pipeline;
use super::counters::VersionCounters;
use super::guard::lock;
use super::runs::canary_status;
use crate::rollout::{CanaryState, CanaryStatus, ShadowStatus};

/// One version as `GET /pipelines/NAME/versions` lists it.
#[derive(Debug, Serialize, Deserialize, Clone)]
pub struct VersionInfo {
    /// Content hash (sha256).
    pub hash: String,
    /// Component path it was loaded from.
    pub path: String,
    /// When it was loaded, ms since the Unix epoch.
    pub loaded_at_ms: u64,
    /// The key id that signed it (`[trust]`), `None` when unsigned.
    pub signer: Option<String>,
    /// Whether it is the active version.
    pub active: bool,
    /// Its counters since this host started.
    pub counters: VersionCounters,
}

/// `GET /pipelines/NAME/versions`: the active version first, then the kept ones, newest first.
#[derive(Debug, Serialize, Deserialize, Clone)]
pub struct VersionsStatus {
    /// The active version's hash.
    pub active: String,
    /// Active first, then kept for rollback.
    pub versions: Vec<VersionInfo>,
}

/// What `GET /pipelines` shows for one pipeline.
#[derive(Debug, Default, Serialize, Deserialize, Clone)]
// Read back by `sharehost ctl`: what an answer leaves out (another host version) is a default.
#[serde(default)]
pub struct PipelineStatus {
    /// Pipeline name.
    pub name: String,
    /// starting, joining (not in its group: before the join, or while the coordinator cannot
    /// be reached), running, degraded (writes wait for a retry), draining, stopped or failed.
    pub state: String,
    /// Content hash (sha256) of the active plugin version.
    pub active_version: String,
    /// Component path of the active version.
    pub component: String,
    /// Counters per plugin version hash.
    pub versions: HashMap<String, VersionCounters>,
    /// Records dead-lettered.
    pub dead_lettered: u64,
    /// Records acquired and not yet judged.
    pub in_flight: u64,
    /// The most records held at once since the pipeline started (never above `max_in_flight`).
    pub in_flight_peak: u64,
    /// How many records the engine may hold now: what the plugin judges within 10 s at its
    /// measured rate, between a batch per concurrent call and `max_in_flight`.
    pub in_flight_limit: u64,
    /// ShareFetch requests sent, and the records they acquired (records per fetch: the
    /// broker's cost per record falls as it grows).
    pub fetches: u64,
    /// Records acquired by those fetches.
    pub acquired: u64,
    /// Acquired ranges that cover only part of a producer batch (the broker then tracks the
    /// batch record by record): near zero while producer batches fit `max_in_flight`.
    pub acquired_split: u64,
    /// Batches whose outputs or dead letters wait for a retry of their produce (their records
    /// stay acquired); the state is `degraded` meanwhile.
    pub writes_waiting: u64,
    /// Failed produce requests of outputs and dead letters, retried (not plugin verdicts).
    pub write_failures: u64,
    /// Records released because the pipeline stopped before their writes landed.
    pub released_unwritten: u64,
    /// Dead letters written without the record's key, value and headers, because the whole
    /// record was larger than the dead-letter topic accepts.
    pub dead_letters_shrunk: u64,
    /// Output names the plugin emitted to that `[pipeline.outputs]` does not map: a
    /// misconfiguration (the records accepted with such an emit are rejected, and the
    /// pipeline is not ready) until the manifest maps them.
    pub unmapped_outputs: Vec<String>,
    /// Why the last run failed (a topic it writes to missing, the group refusing it, ...),
    /// while the host runs it again; `None` once it runs.
    pub last_error: Option<String>,
    /// Where the group starts on partitions it has not read yet: its `share.auto.offset.reset`
    /// (`earliest`, `latest`, `by_duration:PT1H`) as the host set it from the manifest's
    /// `start`, or read it before the last join; `None` before that, or when the broker would
    /// not say.
    pub start: Option<String>,
    /// Last hot-swap failure, if the last swap failed.
    pub last_swap_error: Option<String>,
    /// How long judging paused around the last hot swap: the longest gap between two judged
    /// batches from the last one before the swap was asked for to the first one the new
    /// version judged (ms, fractional). Meaningful while records flow: an idle pipeline
    /// reports its idle time. `None` before the first swap completes a batch.
    pub last_swap_stall_ms: Option<f64>,
    /// What the pipeline grants its plugin beyond computing.
    pub grants: GrantsStatus,
    /// The key id that signed the active version (`[trust]`), `None` when unsigned.
    pub signer: Option<String>,
    /// Which instance allocator the active version's instances come from: `pooling` (or
    /// `pooling-compact`), or `on-demand` for a component too big for a pool slot (most
    /// Python components), with the reason; `native` for a native handler.
    pub allocator: String,
    /// Why the active version runs on-demand although the host has a pool.
    pub allocator_reason: Option<String>,
    /// The running shadow, if any: agreement per verdict kind, faults, time per record, the
    /// first disagreements.
    pub shadow: Option<ShadowStatus>,
    /// The running canary, or how the last one ended.
    pub canary: Option<CanaryStatus>,
}

/// The grants of a pipeline as `GET /pipelines` shows them: names and hosts, never a secret's
/// value.
#[derive(Debug, Default, Serialize, Deserialize, Clone)]
// Read back by `sharehost ctl`: what an answer leaves out (another host version) is a default.
#[serde(default)]
pub struct GrantsStatus {
    /// Output name to topic.
    pub outputs: BTreeMap<String, String>,
    /// Hosts the plugin may call over HTTP.
    pub allowed_outbound_hosts: Vec<String>,
    /// The names of the secrets handed to `init` (values are never shown).
    pub secrets: Vec<String>,
}

impl Pipeline {
    /// Status for `GET /pipelines`.
    pub fn status(&self) -> PipelineStatus {
        let active = lock(&self.active).clone();
        let c = &self.counters;
        let waiting = c.writes.waiting.load(Ordering::Relaxed);
        let state = lock(&self.state).clone();
        PipelineStatus {
            name: self.spec.name.clone(),
            state: match state.as_str() {
                "running" if !c.joined.load(Ordering::Relaxed) => "joining".to_owned(),
                "running" if waiting > 0 => "degraded".to_owned(),
                _ => state,
            },
            writes_waiting: waiting as u64,
            in_flight_peak: c.engine.peak.load(Ordering::Relaxed),
            in_flight_limit: c.engine.limit.load(Ordering::Relaxed),
            fetches: c.engine.fetches.load(Ordering::Relaxed),
            acquired: c.engine.acquired.load(Ordering::Relaxed),
            acquired_split: c.engine.acquired_split.load(Ordering::Relaxed),
            write_failures: c.writes.failures.load(Ordering::Relaxed),
            released_unwritten: c.writes.released.load(Ordering::Relaxed),
            dead_letters_shrunk: c.writes.shrunk.load(Ordering::Relaxed),
            active_version: active.hash.clone(),
            component: active.path.display().to_string(),
            versions: c.per_version(),
            dead_lettered: c.dead_lettered.load(Ordering::Relaxed),
            in_flight: c.in_flight.load(Ordering::Relaxed),
            last_error: lock(&self.last_error).clone(),
            start: lock(&self.start).clone(),
            unmapped_outputs: lock(&self.unmapped).iter().cloned().collect(),
            last_swap_error: lock(&self.last_swap_error).clone(),
            last_swap_stall_ms: lock(&c.stall).last.map(|d| d.as_secs_f64() * 1e3),
            signer: active.signer(),
            allocator: active
                .placement
                .as_ref()
                .map_or("native", |p| p.allocator.name())
                .to_owned(),
            allocator_reason: active.placement.as_ref().and_then(|p| p.reason.clone()),
            shadow: lock(&self.shadow).as_ref().map(|s| lock(&s.status).clone()),
            canary: match lock(&self.canary).as_ref() {
                Some(c) => Some(canary_status(c, CanaryState::Running, None)),
                None => lock(&self.last_canary).clone(),
            },
            grants: GrantsStatus {
                outputs: self.spec.outputs.clone(),
                allowed_outbound_hosts: self
                    .spec
                    .http
                    .as_ref()
                    .map(|h| h.allowed_outbound_hosts.clone())
                    .unwrap_or_default(),
                secrets: self.grants.secrets.names().map(str::to_owned).collect(),
            },
        }
    }

    /// The active version and the kept ones, for `GET /pipelines/NAME/versions`.
    pub fn versions(&self) -> VersionsStatus {
        let active = lock(&self.active).clone();
        let mut versions = vec![VersionInfo {
            hash: active.hash.clone(),
            path: active.path.display().to_string(),
            loaded_at_ms: active.loaded_at_ms,
            signer: active.signer(),
            active: true,
            counters: self.counters.of(&active.hash),
        }];
        for k in lock(&self.history).iter() {
            versions.push(VersionInfo {
                hash: k.hash.clone(),
                path: k.path.display().to_string(),
                loaded_at_ms: k.loaded_at_ms,
                signer: k.compiled.signer.clone(),
                active: false,
                counters: self.counters.of(&k.hash),
            });
        }
        VersionsStatus {
            active: active.hash.clone(),
            versions,
        }
    }
}

//! What `GET /pipelines` and `GET /pipelines/NAME/versions` show of a pipeline.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::rollout::{CanaryStatus, ShadowStatus};

/// Per-version counters shown by `GET /pipelines`.
#[derive(Debug, Default, Serialize, Deserialize, Clone)]
// Read back by `sharehost ctl`: a counter an answer leaves out is zero.
#[serde(default)]
pub struct VersionCounters {
    /// Records accepted.
    pub accepted: u64,
    /// Records released (by the plugin, the fault policy or renew exhaustion).
    pub released: u64,
    /// Records rejected.
    pub rejected: u64,
    /// Renewals granted.
    pub renewed: u64,
    /// Plugin faults.
    pub faults: u64,
    /// Plugin calls.
    pub batches: u64,
    /// Records held back at the plugin's `retry`, then released.
    pub retried: u64,
    /// Emitted records produced before their source's Accept.
    pub emits_produced: u64,
    /// Emitted records discarded (their source was released, rejected, renewed or retried).
    pub emits_discarded: u64,
    /// Emitted records never produced: the pipeline stopped while their produce was being
    /// retried (their source was released), or the record is larger than its topic accepts
    /// (its source was rejected).
    pub emits_failed: u64,
}

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

//! The fleet as `GET /fleet` and `sharehost fleet status` show it, and the parts of the fleet's
//! records that view is made of: what the fleet wants of each pipeline (its components, canary
//! and shadow) and what each host last said of itself. The fleet's topics carry these same
//! types (a host's status record is a [`HostStatus`], an action names the [`Desired`] state it
//! leads to), decoded strictly: unknown fields are refused.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::rollout::{PromoteAfter, RollbackIf, Tally};

/// A component as the fleet carries it: its content and signature, and where its chunks are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentRef {
    /// SHA-256 of its bytes, hex (the runtime's content hash).
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its file name where it was deployed from (for logs and the file a host writes).
    pub name: String,
    /// Its detached minisign signature (the `.minisig` text): each host verifies it with the
    /// pipeline's own trusted keys before it compiles anything.
    pub signature: String,
    /// The offset of each of its chunks in the components topic (partition 0), in order.
    pub chunks: Vec<i64>,
}

/// A canary's rules as a fleet deploys them (the candidate comes with the action).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CanaryRules {
    /// Share of batches the candidate judges on every host.
    pub percent: f64,
    /// When the fleet promotes it (counted over every host).
    #[serde(default)]
    pub promote_after: PromoteAfter,
    /// When the fleet rolls it back (on the sum of every host's tallies).
    #[serde(default)]
    pub rollback_if: RollbackIf,
}

/// What one host says of one pipeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineReport {
    /// The pipeline.
    pub name: String,
    /// Its state (running, joining, degraded, failed, ...).
    pub state: String,
    /// Its active version's digest.
    pub active: String,
    /// The last fleet action it applied (0: none).
    pub applied_seq: u64,
    /// Why the last fleet action could not be applied here, if it could not.
    pub refused: Option<String>,
    /// The running canary: its action's number and both sides' tallies on this host.
    pub canary: Option<CanaryReport>,
    /// The running shadow's candidate digest.
    pub shadow: Option<String>,
    /// Records judged per second over the last status interval.
    pub records_per_second: f64,
    /// Plugin faults since the host started.
    pub faults: u64,
    /// Records judged since the host started.
    pub judged: u64,
}

/// A host's share of a fleet canary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CanaryReport {
    /// The canary action's number.
    pub seq: u64,
    /// The candidate's digest.
    pub candidate: String,
    /// The candidate's tally on this host.
    pub candidate_tally: Tally,
    /// The active version's tally on this host over the same time.
    pub active_tally: Tally,
}

/// A host's status (keyed by its id in the status topic: compaction keeps the latest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostStatus {
    /// The host's id.
    pub host: String,
    /// This process (made up at start): two live processes with one host id tell each other
    /// apart by it.
    pub instance: String,
    /// When it was written, ms since the Unix epoch.
    pub at_ms: u64,
    /// sharehost's version.
    pub version: String,
    /// Its pipelines.
    pub pipelines: Vec<PipelineReport>,
}

/// A canary the fleet runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetCanary {
    /// The canary action's number: hosts report their tallies under it, decisions name it.
    pub seq: u64,
    /// The candidate.
    pub component: ComponentRef,
    /// Its rules.
    pub rules: CanaryRules,
    /// When the operator started it (ms since the Unix epoch).
    pub issued_at_ms: u64,
}

/// How the last fleet canary of a pipeline ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CanaryOutcome {
    /// The canary action's number.
    pub seq: u64,
    /// The candidate's digest.
    pub candidate: String,
    /// Promoted (true) or rolled back.
    pub promoted: bool,
    /// Why, and by whom (a host's decision, or an operator's action).
    pub reason: String,
}

/// What the fleet wants of one pipeline.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Desired {
    /// The last action applied (0: none yet).
    pub seq: u64,
    /// The active version; `None`: each host's manifest component (no deploy yet, or rolled
    /// back past the first deploy).
    pub active: Option<ComponentRef>,
    /// Versions active before, newest first (a bounded few).
    pub history: Vec<ComponentRef>,
    /// The running canary.
    pub canary: Option<FleetCanary>,
    /// How the last canary ended.
    pub last_canary: Option<CanaryOutcome>,
    /// The running shadow: its candidate and sample.
    pub shadow: Option<(ComponentRef, f64)>,
}

/// Why a host's status was flagged as written by two writers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conflict {
    /// What was seen, in a line.
    pub reason: String,
    /// When it was last seen (the reader's ms since the Unix epoch).
    pub at_ms: u64,
}

/// A host's status as `GET /fleet` and `sharehost fleet status` show it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostView {
    /// What it last published.
    #[serde(flatten)]
    pub status: HostStatus,
    /// Milliseconds since it published it.
    pub age_ms: u64,
    /// Not heard from for longer than `fleet.stale_after_ms`.
    pub stale: bool,
    /// Two writers were seen taking turns under this host's id lately (a status forged under
    /// its id, or two hosts given one `fleet.host_id`): what it shows may not be its own.
    #[serde(default)]
    pub conflict: Option<Conflict>,
}

/// The fleet as one host sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetView {
    /// The fleet's name.
    pub fleet: String,
    /// The host answering.
    pub host: String,
    /// What the fleet wants of each pipeline (versions, canary, shadow, last canary).
    pub pipelines: BTreeMap<String, Desired>,
    /// Every host heard from, stale ones marked.
    pub hosts: Vec<HostView>,
    /// The last action refused before it could be read (unsigned, tampered, by an unknown
    /// key, for another fleet).
    pub last_refused: Option<String>,
}

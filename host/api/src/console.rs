//! What the console's read endpoints answer beyond `GET /pipelines`: `GET /host` and
//! `GET /faults`.

use serde::{Deserialize, Serialize};

/// `GET /host`: the host as the console's header shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostInfo {
    /// The host's version.
    pub version: String,
    /// Whether POST and DELETE need `Authorization: Bearer TOKEN` (`[admin] token_env`).
    pub actions_need_token: bool,
    /// What `/readyz` would answer.
    pub ready: bool,
    /// Why not, one line per pipeline, as `/readyz` says.
    pub not_ready: Vec<String>,
}

/// `GET /faults`: the newest faults kept (of one pipeline with `?pipeline=NAME`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultsView {
    /// The newest kept faults, newest first, at most a bound the host sets.
    pub faults: Vec<RecentFault>,
    /// How many faults are kept in all (of that pipeline).
    pub kept: usize,
    /// How many each pipeline keeps.
    pub kept_per_pipeline: usize,
}

/// Who met a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultRole {
    /// The active version judging a batch (its records got the fault policy).
    Active,
    /// A canary candidate (the active version judged the batch instead).
    Canary,
    /// A shadow candidate (nothing was acted on).
    Shadow,
    /// A version change (swap, rollback, shadow or canary start) refused: the old version
    /// keeps running.
    Swap,
}

/// One fault as `GET /faults` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecentFault {
    /// When, in ms since the Unix epoch.
    pub at_ms: u64,
    /// The pipeline.
    pub pipeline: String,
    /// Who met it.
    pub role: FaultRole,
    /// The version's content hash (first 12 characters), when one was judging.
    pub version: Option<String>,
    /// The fault's kind (`trap`, `deadline`, `wrong_verdict_count`, ..., `refused` for a
    /// version change).
    pub kind: String,
    /// What went wrong, cut to a bound the host sets.
    pub message: String,
    /// Records in the batch (0 for a version change).
    pub records: u64,
    /// Lowest offset of the batch's first record, when there was a batch.
    pub first_offset: Option<i64>,
    /// Offset of the batch's last record.
    pub last_offset: Option<i64>,
}

//! How a shadow and a canary show in `GET /pipelines`, and the bounds a canary is decided by
//! (sent in a canary's body, carried in a fleet's canary rules).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One record on which the candidate and the active version disagreed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Disagreement {
    /// Topic of the record.
    pub topic: String,
    /// Partition of the record.
    pub partition: i32,
    /// Offset of the record.
    pub offset: i64,
    /// What the active version decided.
    pub active: String,
    /// What the candidate decided (with its reason for a reject).
    pub candidate: String,
}

/// What a shadow has seen so far, as `GET /pipelines` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
// Read back by `sharehost ctl`: what an answer leaves out is a default.
#[serde(default)]
pub struct ShadowStatus {
    /// The candidate's content hash.
    pub candidate: String,
    /// The candidate's component path.
    pub path: String,
    /// Fraction of batches copied to it.
    pub sample: f64,
    /// Batches and records the candidate judged and compared.
    pub batches: u64,
    /// Records compared.
    pub records: u64,
    /// Records on which both decided alike, by the active version's verdict kind.
    pub agreed: BTreeMap<String, u64>,
    /// Records on which they differed, by "active→candidate" verdict kinds.
    pub disagreed: BTreeMap<String, u64>,
    /// The candidate's faults (its batch is then not compared).
    pub faults: u64,
    /// Batches not copied because the candidate was behind (never held for it).
    pub dropped_batches: u64,
    /// Records in those batches.
    pub dropped_records: u64,
    /// The candidate's time per compared record, in microseconds.
    pub us_per_record: f64,
    /// The first disagreements, with their record coordinates.
    pub first_disagreements: Vec<Disagreement>,
}

/// When a canary is promoted: after this many of its batches, or this long, whichever first.
#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
pub struct PromoteAfter {
    /// Canary batches judged.
    pub batches: Option<u64>,
    /// Seconds since the canary started.
    pub seconds: Option<u64>,
}

/// When a canary is rolled back at once (every bound optional).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct RollbackIf {
    /// Largest share of the canary's batches that may fault (default 0: any fault).
    #[serde(default)]
    pub max_fault_rate: f64,
    /// Largest increase of the canary's reject rate over the active version's in the same
    /// period, in rate points (0.05 = five percentage points; default 0.05).
    #[serde(default = "five_points")]
    pub max_reject_rate_increase: f64,
    /// The same for releases (default 0.05).
    #[serde(default = "five_points")]
    pub max_release_rate_increase: f64,
}

fn five_points() -> f64 {
    0.05
}

impl Default for RollbackIf {
    fn default() -> Self {
        Self {
            max_fault_rate: 0.0,
            max_reject_rate_increase: five_points(),
            max_release_rate_increase: five_points(),
        }
    }
}

/// Verdict counts of one side of a canary over the same period, as shown and as a fleet's
/// hosts report them.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, Default, PartialEq)]
pub struct Tally {
    /// Batches judged.
    pub batches: u64,
    /// Batches that faulted.
    pub faulted_batches: u64,
    /// Records judged.
    pub records: u64,
    /// Records rejected.
    pub rejected: u64,
    /// Records released.
    pub released: u64,
}

/// What became of a canary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CanaryState {
    /// Judging its share of batches.
    Running,
    /// Made the active version.
    Promoted,
    /// Removed; the active version judges everything again.
    RolledBack,
}

/// A canary as `GET /pipelines` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CanaryStatus {
    /// The candidate's content hash.
    pub candidate: String,
    /// The candidate's component path.
    pub path: String,
    /// Share of batches it judges.
    pub percent: f64,
    /// Running, promoted or rolled back.
    pub state: CanaryState,
    /// Why it was promoted or rolled back.
    pub reason: Option<String>,
    /// The candidate's verdicts since it started.
    pub candidate_tally: Tally,
    /// The active version's verdicts over the same period.
    pub active_tally: Tally,
    /// Seconds since it started.
    pub seconds: u64,
    /// Its bounds.
    pub promote_after: PromoteAfter,
    /// Its rollback bounds.
    pub rollback_if: RollbackIf,
}

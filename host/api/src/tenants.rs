//! The pipelines of one host as tenants, as `GET /pipelines` and `GET /manifest` show them.

use serde::{Deserialize, Serialize};

use crate::pipeline::PipelineStatus;

/// Why a tenant is not running, as `GET /pipelines` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// Pipeline name.
    pub name: String,
    /// Always `failed`.
    pub state: String,
    /// What went wrong the last time.
    pub error: String,
    /// Attempts so far (to load, or to run once loaded).
    #[serde(default)]
    pub attempts: u32,
    /// Seconds since the first failure in a row.
    #[serde(default)]
    pub failing_for_s: u64,
}

/// A tenant's entry in `GET /pipelines`: a pipeline's full status, or why it is not running.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TenantStatus {
    /// A pipeline that failed to load or run (first: read back, only it has an `error`, while
    /// a pipeline's status takes defaults for what an answer leaves out).
    Failed(Failure),
    /// A loaded pipeline.
    Pipeline(Box<PipelineStatus>),
}

/// How the host's manifest was last read, as `GET /manifest` shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ManifestStatus {
    /// The manifest file.
    pub path: Option<String>,
    /// When the manifest the host runs was read (ms since the Unix epoch).
    pub applied_at_ms: u64,
    /// Re-reads applied since start.
    pub applied: u64,
    /// Re-reads refused since start (the host kept running on the manifest before).
    pub refused: u64,
    /// Why the last refused re-read was refused, kept after later re-reads are applied (an
    /// operator sees a bad manifest was written even when a good one followed).
    pub last_refused: Option<String>,
    /// When that re-read was refused (ms since the Unix epoch): set with `last_refused`, to
    /// compare with `applied_at_ms`.
    pub last_refused_at_ms: Option<u64>,
}

//! The last faults of one pipeline, for the console and `GET /faults`: what an operator looks
//! at first when a pipeline misbehaves, without searching the log. The metrics count faults;
//! this keeps their words (kind, message, which version, which records), bounded.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

pub use sharehost_api::FaultRole;

/// Faults kept per pipeline, newest last: enough to see a pattern on one screen, and a bound
/// on what a plugin that faults on every batch makes the host hold (about 1 KiB each).
pub const KEPT_FAULTS: usize = 64;

/// Longest message kept per fault; a trap's backtrace says what it must in its first lines.
pub const MAX_FAULT_MESSAGE: usize = 512;

/// One fault as the pipeline notes it; `GET /faults` shows it as a
/// [`sharehost_api::RecentFault`].
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// What went wrong, cut at [`MAX_FAULT_MESSAGE`] bytes.
    pub message: String,
    /// Records in the batch (0 for a version change).
    pub records: u64,
    /// Lowest offset of the batch's first record, when there was a batch.
    pub first_offset: Option<i64>,
    /// Offset of the batch's last record.
    pub last_offset: Option<i64>,
}

impl RecentFault {
    /// A fault of `pipeline` now, its message cut to [`MAX_FAULT_MESSAGE`].
    pub fn now(pipeline: &str, role: FaultRole, kind: &str, message: &str) -> RecentFault {
        RecentFault {
            at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            pipeline: pipeline.to_owned(),
            role,
            version: None,
            kind: kind.to_owned(),
            message: sharehost_text::cut(message, MAX_FAULT_MESSAGE).to_owned(),
            records: 0,
            first_offset: None,
            last_offset: None,
        }
    }

    /// The same fault, met by `version` (its hash, shortened) on a batch of `records` from
    /// `first` to `last` offset.
    pub fn on_batch(
        mut self,
        version: &str,
        records: usize,
        first: Option<i64>,
        last: Option<i64>,
    ) -> RecentFault {
        self.version = Some(version.chars().take(12).collect());
        self.records = records as u64;
        self.first_offset = first;
        self.last_offset = last;
        self
    }
}

impl From<RecentFault> for sharehost_api::RecentFault {
    fn from(f: RecentFault) -> sharehost_api::RecentFault {
        sharehost_api::RecentFault {
            at_ms: f.at_ms,
            pipeline: f.pipeline,
            role: f.role,
            version: f.version,
            kind: f.kind,
            message: f.message,
            records: f.records,
            first_offset: f.first_offset,
            last_offset: f.last_offset,
        }
    }
}

/// A pipeline's last [`KEPT_FAULTS`] faults, oldest dropped first.
#[derive(Debug, Default)]
pub struct RecentFaults {
    kept: Mutex<VecDeque<RecentFault>>,
}

impl RecentFaults {
    /// Keeps `fault`, dropping the oldest beyond [`KEPT_FAULTS`].
    pub fn note(&self, fault: RecentFault) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() == KEPT_FAULTS {
            kept.pop_front();
        }
        kept.push_back(fault);
    }

    /// The kept faults, newest first.
    pub fn newest_first(&self) -> Vec<RecentFault> {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.iter().rev().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_newest_faults_are_kept_and_long_messages_are_cut_on_a_character() {
        let faults = RecentFaults::default();
        for n in 0..KEPT_FAULTS + 10 {
            faults.note(RecentFault::now(
                "p",
                FaultRole::Active,
                "trap",
                &n.to_string(),
            ));
        }
        let kept = faults.newest_first();
        assert_eq!(kept.len(), KEPT_FAULTS);
        assert_eq!(kept[0].message, (KEPT_FAULTS + 9).to_string());
        assert_eq!(kept[KEPT_FAULTS - 1].message, "10");

        let long = "é".repeat(MAX_FAULT_MESSAGE);
        let f = RecentFault::now("p", FaultRole::Canary, "trap", &long).on_batch(
            &"ab".repeat(32),
            7,
            Some(3),
            Some(9),
        );
        assert!(f.message.len() <= MAX_FAULT_MESSAGE && f.message.len() > MAX_FAULT_MESSAGE - 2);
        assert!(long.starts_with(&f.message));
        assert_eq!(f.version.as_deref(), Some("abababababab"));
        let json = serde_json::to_value(sharehost_api::RecentFault::from(f)).expect("json");
        assert_eq!(json["role"], "canary");
        assert_eq!(json["records"], 7);
    }
}

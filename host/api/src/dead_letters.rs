//! A pipeline's dead letters as the console's endpoints show them (grouped by reason shape),
//! and what a run of the dead-letter reader did (`sharehost dlq`, a replay through the API).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// What one run of the dead-letter reader did: printed last by `sharehost dlq` (as
/// `{"summary": ...}` with `--json`), and the body of [`crate::Replayed`].
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Summary {
    /// Dead-letter records read in the offsets asked for.
    pub read: u64,
    /// Dead letters that matched the selection.
    pub selected: u64,
    /// Produced to their original topic now (with `--dry-run`: would have been).
    pub replayed: u64,
    /// Selected but replayed by an earlier run, so skipped.
    pub already_replayed: u64,
    /// Dead letters of a produce an earlier run did not see answered (it stopped or failed),
    /// found in the original topic now and remembered as replayed.
    pub recovered: u64,
    /// Records from another pipeline sharing the topic.
    pub other_pipeline: u64,
    /// Records without the provenance headers (not written by sharehost).
    pub not_dead_letters: u64,
    /// Selected records whose original topic no longer exists (not replayed).
    pub original_topic_missing: u64,
    /// Whether nothing was produced or remembered.
    pub dry_run: bool,
}

/// Where a group's dead letters are in one partition of the dead-letter topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    /// Dead-letter topic partition.
    pub partition: i32,
    /// Lowest offset of the group there.
    pub first: i64,
    /// Highest offset of the group there.
    pub last: i64,
}

/// Dead letters of one reason shape (the reason with every run of digits standing for any).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    /// The shape (digits as `#`).
    pub shape: String,
    /// The reason of the first dead letter of the group, as written.
    pub example: String,
    /// A preview of that dead letter's value.
    pub example_value: Option<String>,
    /// The `reason` a replay of exactly this group sends.
    pub reason_regex: String,
    /// Dead letters in the group.
    pub count: u64,
    /// Of them, replayed already (by the console or `sharehost dlq`); `None` when the
    /// replay state could not be read.
    pub replayed: Option<u64>,
    /// Of them, what a replay would produce now.
    pub to_replay: Option<u64>,
    /// Of them, those whose original topic no longer exists (never replayed).
    pub original_topic_missing: Option<u64>,
    /// Where they are in the dead-letter topic.
    pub spans: Vec<Span>,
    /// The plugin versions that rejected them (first 12 characters), a bounded few.
    pub versions: BTreeSet<String>,
    /// Their original topics, a bounded few.
    pub original_topics: BTreeSet<String>,
}

/// What `GET /pipelines/NAME/dead-letters` answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterView {
    /// The pipeline.
    pub pipeline: String,
    /// Its dead-letter topic (`None`: it keeps no dead letters).
    pub topic: Option<String>,
    /// Records read from the topic.
    pub read: u64,
    /// Dead letters of this pipeline among them.
    pub dead_letters: u64,
    /// Records another pipeline sharing the topic wrote.
    pub other_pipeline: u64,
    /// Records without the provenance headers (not written by sharehost).
    pub not_dead_letters: u64,
    /// The groups, largest first, at most a bound the host sets.
    pub groups: Vec<Group>,
    /// Dead letters of shapes beyond that bound.
    pub ungrouped: u64,
    /// Why the replay counts are unknown (the replay state could not be read, or a replay of
    /// this topic is running), when they are.
    pub replay_state_error: Option<String>,
}

impl DeadLetterView {
    /// The answer for a pipeline without a dead-letter topic.
    pub fn none(pipeline: &str) -> DeadLetterView {
        DeadLetterView {
            pipeline: pipeline.to_owned(),
            topic: None,
            read: 0,
            dead_letters: 0,
            other_pipeline: 0,
            not_dead_letters: 0,
            groups: Vec::new(),
            ungrouped: 0,
            replay_state_error: None,
        }
    }
}

//! What the fleet's topics carry, as JSON: operator actions (signed), canary decisions and
//! host statuses, with their keys. Every record is self-contained: a host that reads a topic
//! from its start, compacted or not, reaches the state one that saw every record reached.
//! Decoding is bounded and strict (unknown fields refused), so a malformed, oversized or
//! unknown record is named and skipped, never trusted.

use serde::{Deserialize, Serialize};

use sharehost_api::Tally;
pub use sharehost_api::fleet::{
    CanaryOutcome, CanaryReport, CanaryRules, ComponentRef, Desired, FleetCanary, HostStatus,
    PipelineReport,
};

/// Largest record value the fleet reads from its deployments and status topics: an action or
/// a status is a few KiB; anything far larger is not one of ours.
pub const MAX_RECORD_BYTES: usize = 256 << 10;

/// Largest chunk of a component in the components topic, under Kafka's default
/// `max.message.bytes` (1 MiB) with room for the record's framing.
pub const CHUNK_BYTES: usize = 512 << 10;

/// What an operator asks of a pipeline across the fleet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Change {
    /// Make `component` the active version everywhere (ends a running shadow or canary).
    Deploy {
        /// The new version.
        component: ComponentRef,
    },
    /// Go back to a version the fleet ran before: the one whose digest starts with `to`, or
    /// the one before the active one.
    Rollback {
        /// A digest prefix, or none for the previous version.
        to: Option<String>,
    },
    /// Judge copies of a sample of batches with `component` on every host, never acted on.
    Shadow {
        /// The candidate.
        component: ComponentRef,
        /// Fraction of batches copied to it (0 < sample ≤ 1).
        sample: f64,
    },
    /// Stop the running shadow.
    StopShadow,
    /// Let `component` judge a share of batches for real on every host, promoted or rolled
    /// back on the fleet's sums.
    Canary {
        /// The candidate.
        component: ComponentRef,
        /// Its rules.
        rules: CanaryRules,
    },
    /// Promote the running canary now.
    Promote,
    /// Roll the running canary back now.
    AbortCanary,
}

impl Change {
    /// A short name of the change, for logs and status.
    pub fn name(&self) -> &'static str {
        match self {
            Change::Deploy { .. } => "deploy",
            Change::Rollback { .. } => "rollback",
            Change::Shadow { .. } => "shadow",
            Change::StopShadow => "stop-shadow",
            Change::Canary { .. } => "canary",
            Change::Promote => "promote",
            Change::AbortCanary => "abort-canary",
        }
    }
}

/// One operator action: a change of one pipeline, numbered. `seq` is one more than the
/// pipeline's last action the operator saw: a host applies an action only when its number is
/// above the last one it applied, so a replayed old action (or one written behind another
/// operator's back) changes nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    /// The fleet it is for (an action for another fleet is refused).
    pub fleet: String,
    /// The pipeline it changes.
    pub pipeline: String,
    /// Its number in the pipeline's history (from 1).
    pub seq: u64,
    /// When the operator issued it, ms since the Unix epoch (a canary's `promote_after.seconds`
    /// counts from here).
    pub issued_at_ms: u64,
    /// What it changes.
    pub change: Change,
    /// The pipeline's state once it is applied, as the operator computed it from the state
    /// it read: a host takes this state (signed with the action), so every action is
    /// self-contained and a compacted topic reads to the same state.
    pub then: Desired,
}

/// An action as the deployments topic carries it: the action's exact JSON bytes and a
/// minisign signature over them by a trusted key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedAction {
    /// The action, as JSON text (signed as it stands).
    pub action: String,
    /// A minisign signature of `action`'s bytes.
    pub signature: String,
}

/// A host's decision on a fleet canary, from the sum of every host's tallies. Every host
/// applies the first decision recorded for a canary and ignores later ones: no leader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    /// The pipeline.
    pub pipeline: String,
    /// The canary action it decides.
    pub seq: u64,
    /// Promote (true) or roll back (false).
    pub promote: bool,
    /// Why, in the canary rules' words.
    pub reason: String,
    /// The host that decided.
    pub host: String,
    /// The candidate's tally summed over the fleet when it decided.
    pub candidate: Tally,
    /// The active version's tally summed over the fleet.
    pub active: Tally,
}

/// The key of an action record: one per action, so compaction never drops an action and a
/// replayed one only rewrites itself.
pub fn action_key(pipeline: &str, seq: u64) -> String {
    format!("action/{pipeline}/{seq:020}")
}

/// The key of a decision record: one per canary and host, so compaction keeps every host's
/// first word and the first in the log stays first.
pub fn decision_key(pipeline: &str, seq: u64, host: &str) -> String {
    format!("decision/{pipeline}/{seq:020}/{host}")
}

/// The key of a component chunk.
pub fn chunk_key(digest: &str, index: usize) -> String {
    format!("{digest}/{index:06}")
}

/// Why a fleet record was skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// No key, or a key of no known kind.
    #[error("unknown key {0:?}")]
    UnknownKey(String),
    /// No value (a tombstone where none belongs).
    #[error("no value")]
    NoValue,
    /// Larger than any record of ours.
    #[error("{0} bytes, more than the {MAX_RECORD_BYTES} a fleet record may have")]
    TooLarge(usize),
    /// Not the JSON of its kind.
    #[error("malformed: {0}")]
    Malformed(String),
    /// Reading it panicked (a bug, caught so that the agent reads on): the panic's text.
    #[error("reading it panicked: {0}")]
    Panicked(String),
}

impl RecordError {
    /// A stable lower-case name of the reason, for metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            RecordError::UnknownKey(_) => "unknown_key",
            RecordError::NoValue => "no_value",
            RecordError::TooLarge(_) => "too_large",
            RecordError::Malformed(_) => "malformed",
            RecordError::Panicked(_) => "panicked",
        }
    }
}

/// A record of the deployments topic.
#[derive(Debug, Clone, PartialEq)]
pub enum DeploymentRecord {
    /// An operator action, still to be verified.
    Action(SignedAction),
    /// A host's canary decision.
    Decision(Decision),
}

/// Reads a deployments record from its key and value.
pub fn decode_deployment(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
) -> Result<DeploymentRecord, RecordError> {
    let key = key.map(String::from_utf8_lossy).unwrap_or_default();
    let value = bounded(value)?;
    if key.starts_with("action/") {
        return json(value).map(DeploymentRecord::Action);
    }
    if key.starts_with("decision/") {
        return json(value).map(DeploymentRecord::Decision);
    }
    Err(RecordError::UnknownKey(key.chars().take(80).collect()))
}

/// Reads a status record.
pub fn decode_status(value: Option<&[u8]>) -> Result<HostStatus, RecordError> {
    json(bounded(value)?)
}

fn bounded(value: Option<&[u8]>) -> Result<&[u8], RecordError> {
    let v = value.ok_or(RecordError::NoValue)?;
    if v.len() > MAX_RECORD_BYTES {
        return Err(RecordError::TooLarge(v.len()));
    }
    Ok(v)
}

/// Parses `bytes` as `T`, naming what is wrong in at most a line.
pub fn json<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, RecordError> {
    serde_json::from_slice(bytes).map_err(|e| {
        let mut m = e.to_string();
        sharehost_text::truncate_marked(&mut m, 200);
        RecordError::Malformed(m)
    })
}

#[cfg(test)]
mod tests {
    use sharehost_api::{PromoteAfter, RollbackIf};

    use super::*;

    fn component() -> ComponentRef {
        ComponentRef {
            digest: "ab".repeat(32),
            size: 10,
            name: "p.wasm".into(),
            signature: "sig".into(),
            chunks: vec![4],
        }
    }

    #[test]
    fn actions_and_decisions_round_trip_and_are_told_apart_by_key() {
        let a = Action {
            fleet: "f".into(),
            pipeline: "p".into(),
            seq: 3,
            issued_at_ms: 1,
            change: Change::Canary {
                component: component(),
                rules: CanaryRules {
                    percent: 50.0,
                    promote_after: PromoteAfter {
                        batches: Some(4),
                        seconds: None,
                    },
                    rollback_if: RollbackIf::default(),
                },
            },
            then: Default::default(),
        };
        let text = serde_json::to_string(&a).expect("json");
        assert_eq!(json::<Action>(text.as_bytes()), Ok(a));
        let signed = SignedAction {
            action: text,
            signature: "s".into(),
        };
        let bytes = serde_json::to_vec(&signed).expect("json");
        assert_eq!(
            decode_deployment(Some(action_key("p", 3).as_bytes()), Some(&bytes)),
            Ok(DeploymentRecord::Action(signed))
        );
        let key = decision_key("p", 3, "h1");
        assert!(matches!(
            decode_deployment(Some(key.as_bytes()), Some(&bytes)),
            Err(RecordError::Malformed(_))
        ));
    }

    #[test]
    fn an_error_text_cut_inside_a_character_is_cut_before_it() {
        // serde's message quotes the unknown field: 200 bytes fall inside a euro sign.
        let value = format!(r#"{{"{}": 1}}"#, "€".repeat(100));
        for key in [action_key("p", 1), decision_key("p", 1, "h")] {
            match decode_deployment(Some(key.as_bytes()), Some(value.as_bytes())) {
                Err(RecordError::Malformed(m)) => {
                    assert!(m.len() <= 200 && m.ends_with('…'), "{m}")
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(
            decode_status(Some(value.as_bytes())),
            Err(RecordError::Malformed(_))
        ));
    }

    #[test]
    fn malformed_oversized_and_unknown_records_are_named() {
        assert_eq!(
            decode_deployment(Some(b"what/ever"), Some(b"{}")),
            Err(RecordError::UnknownKey("what/ever".into()))
        );
        assert_eq!(
            decode_deployment(Some(b"action/p/1"), None),
            Err(RecordError::NoValue)
        );
        let big = vec![b' '; MAX_RECORD_BYTES + 1];
        assert_eq!(
            decode_status(Some(&big)),
            Err(RecordError::TooLarge(MAX_RECORD_BYTES + 1))
        );
        assert!(matches!(
            decode_status(Some(br#"{"host":"h","extra":1}"#)),
            Err(RecordError::Malformed(_))
        ));
    }
}

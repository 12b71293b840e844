//! What a judged batch asks for, as a plain value: the plugin's verdicts and emits become a
//! [`Plan`] that says what the engine settles now (final verdicts, renewals, records held back
//! for a retry), which records are accepted only once their outputs are written, and which are
//! rejected only once their dead letters are. Nothing here touches Kafka or the engine; `act`
//! executes a plan.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::runtime::{Emit, Verdict};
use crate::share::consumer::Settle;
use crate::share::ledger::AckKind;

/// The reason a dead letter carries when the plugin rejected without one.
pub(super) const NO_REASON: &str = "rejected by the plugin (no reason given)";

/// What a reject's dead letter says: the plugin's reason, or [`NO_REASON`] when it gave none
/// (or an empty one), so a dead letter always says why.
pub(super) fn reject_reason(reason: Option<String>) -> String {
    reason
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| NO_REASON.to_owned())
}

/// The reject reason of a record whose plugin emitted to `output`, which the manifest does not
/// map.
pub(super) fn misdirected(output: &str) -> String {
    format!("emitted to output {output:?}, which [pipeline.outputs] does not map")
}

/// The manifest's rules a plan follows.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rules<'a> {
    /// Output name to topic (`[pipeline.outputs]`).
    pub(super) outputs: &'a BTreeMap<String, String>,
    /// Most renewals of one delivery (`max_renewals`).
    pub(super) max_renewals: u32,
    /// The longest a `retry` may hold a record back (`max_retry_delay_ms`).
    pub(super) max_retry_delay: Duration,
}

/// What one judged batch asks for; every index is a record's place in the batch, and every
/// record is in exactly one of `now`, `outputs` and `dead_letters`.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Plan {
    /// Settled in the engine at once: Accepts without emits, Releases, renewals and holds.
    pub(super) now: Vec<(usize, Settle)>,
    /// Accepted records with emits: accepted once every emit of theirs is written.
    pub(super) outputs: Vec<(usize, Vec<Emit>)>,
    /// Rejected records with the reason for their dead letter: rejected once it is written
    /// (at once, where the pipeline has no dead-letter topic).
    pub(super) dead_letters: Vec<(usize, String)>,
    /// Emits dropped with a verdict other than Accept (or an Accept turned into a reject).
    pub(super) discarded: u64,
    /// Output names the plugin emitted to that the manifest does not map.
    pub(super) unmapped: BTreeSet<String>,
}

/// Plans a batch from its `verdicts` (one per record, in order) and `emits`. A record whose
/// plugin meant to write where the manifest maps nothing ends rejected with that reason,
/// whatever its verdict: accepted, it would lack an output; released, it would come back until
/// the broker archives it.
pub(super) fn plan(verdicts: Vec<Verdict>, emits: Vec<Emit>, rules: Rules<'_>) -> Plan {
    let mut emits_of: BTreeMap<usize, Vec<Emit>> = BTreeMap::new();
    for e in emits {
        emits_of.entry(e.record).or_default().push(e);
    }
    let mut plan = Plan::default();
    for (i, v) in verdicts.into_iter().enumerate() {
        let own = emits_of.remove(&i);
        let emitted = own.as_ref().map_or(0, |e| e.len() as u64);
        if let Some(e) = own
            .iter()
            .flatten()
            .find(|e| !rules.outputs.contains_key(&*e.output))
        {
            plan.unmapped.insert(e.output.to_string());
            plan.dead_letters.push((i, misdirected(&e.output)));
            plan.discarded += emitted;
            continue;
        }
        if !matches!(v, Verdict::Accept) {
            plan.discarded += emitted;
        }
        match v {
            Verdict::Accept => match own {
                Some(own) if !own.is_empty() => plan.outputs.push((i, own)),
                _ => plan.now.push((i, Settle::Final(AckKind::Accept))),
            },
            Verdict::Release => plan.now.push((i, Settle::Final(AckKind::Release))),
            Verdict::Reject(reason) => plan.dead_letters.push((i, reject_reason(reason))),
            Verdict::Renew => plan.now.push((
                i,
                Settle::Renew {
                    max: rules.max_renewals,
                },
            )),
            Verdict::Retry(after_ms) => {
                let after = Duration::from_millis(u64::from(after_ms)).min(rules.max_retry_delay);
                plan.now.push((i, Settle::Hold(after)));
            }
        }
    }
    // Emits of records past the end of the batch (a plugin cannot make them: the runtime
    // binds every emit to a record of the call) are dropped all the same.
    plan.discarded += emits_of.values().map(|e| e.len() as u64).sum::<u64>();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::sync::Arc;

    fn emit(record: usize, output: &str) -> Emit {
        Emit {
            record,
            output: Arc::from(output),
            key: None,
            value: Some(Bytes::from_static(b"x")),
            headers: Vec::new(),
        }
    }

    fn outputs() -> BTreeMap<String, String> {
        BTreeMap::from([("ok".to_owned(), "topic-ok".to_owned())])
    }

    fn rules(outputs: &BTreeMap<String, String>) -> Rules<'_> {
        Rules {
            outputs,
            max_renewals: 3,
            max_retry_delay: Duration::from_secs(60),
        }
    }

    #[test]
    fn every_verdict_lands_in_exactly_one_part_of_the_plan() {
        let o = outputs();
        let p = plan(
            vec![
                Verdict::Accept,
                Verdict::Accept,
                Verdict::Release,
                Verdict::Reject(Some("bad".into())),
                Verdict::Renew,
                Verdict::Retry(1_000),
            ],
            vec![emit(1, "ok"), emit(1, "ok")],
            rules(&o),
        );
        assert_eq!(
            p.now,
            vec![
                (0, Settle::Final(AckKind::Accept)),
                (2, Settle::Final(AckKind::Release)),
                (4, Settle::Renew { max: 3 }),
                (5, Settle::Hold(Duration::from_secs(1))),
            ]
        );
        assert_eq!(p.outputs.len(), 1);
        assert_eq!(
            p.outputs[0].0, 1,
            "an accepted record with emits waits for them"
        );
        assert_eq!(p.outputs[0].1.len(), 2);
        assert_eq!(p.dead_letters, vec![(3, "bad".to_owned())]);
        assert_eq!(p.discarded, 0);
        assert!(p.unmapped.is_empty());
    }

    #[test]
    fn emits_of_a_record_not_accepted_are_discarded() {
        let o = outputs();
        let p = plan(
            vec![Verdict::Release, Verdict::Reject(None), Verdict::Renew],
            vec![emit(0, "ok"), emit(1, "ok"), emit(2, "ok"), emit(2, "ok")],
            rules(&o),
        );
        assert_eq!(p.discarded, 4);
        assert!(p.outputs.is_empty());
        assert_eq!(
            p.dead_letters,
            vec![(1, NO_REASON.to_owned())],
            "a reject without a reason says so"
        );
    }

    #[test]
    fn an_emit_to_an_unmapped_output_rejects_its_record_whatever_its_verdict() {
        let o = outputs();
        let p = plan(
            vec![Verdict::Accept, Verdict::Release],
            vec![emit(0, "ok"), emit(0, "nowhere"), emit(1, "elsewhere")],
            rules(&o),
        );
        assert!(p.now.is_empty() && p.outputs.is_empty());
        assert_eq!(
            p.dead_letters,
            vec![(0, misdirected("nowhere")), (1, misdirected("elsewhere"))]
        );
        assert_eq!(p.discarded, 3, "every emit of both records is dropped");
        assert_eq!(
            p.unmapped,
            BTreeSet::from(["nowhere".to_owned(), "elsewhere".to_owned()])
        );
    }

    #[test]
    fn a_retry_is_held_no_longer_than_the_manifest_allows() {
        let o = outputs();
        let p = plan(vec![Verdict::Retry(u32::MAX)], Vec::new(), rules(&o));
        assert_eq!(p.now, vec![(0, Settle::Hold(Duration::from_secs(60)))]);
    }

    #[test]
    fn a_reject_without_a_reason_is_dead_lettered_saying_so() {
        assert_eq!(reject_reason(None), NO_REASON);
        assert_eq!(reject_reason(Some(String::new())), NO_REASON);
        assert_eq!(reject_reason(Some("not JSON".into())), "not JSON");
    }
}

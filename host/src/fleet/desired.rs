//! What the fleet wants, folded from the deployments topic in its one total order: per
//! pipeline, the active version, the ones before it (for rollback), a running shadow or canary,
//! and the number of the last action applied. Pure: every host that reads the same records
//! reaches the same state, so no host leads; an action is applied only when newer than the
//! last one, and a canary is decided by the first decision recorded for it.

use std::collections::BTreeMap;

use serde::Serialize;

use super::records::{Action, Change, ComponentRef, Decision};
pub use super::records::{CanaryOutcome, Desired, FleetCanary};
use crate::pipeline::short;

/// Versions kept for rollback per pipeline, newest first.
pub const KEPT: usize = 8;

/// Makes `c` the active version of `d`, the one before it first in its history.
fn activate(d: &mut Desired, c: Option<ComponentRef>) {
    let old = std::mem::replace(&mut d.active, c);
    if let Some(new) = &d.active {
        d.history.retain(|h| h.digest != new.digest);
    }
    if let Some(old) = old
        && d.active.as_ref().is_none_or(|a| a.digest != old.digest)
    {
        d.history.retain(|h| h.digest != old.digest);
        d.history.insert(0, old);
    }
    d.history.truncate(KEPT);
}

/// Every component the fleet knows of for a pipeline (for uploads: a digest once).
pub fn components(d: &Desired) -> impl Iterator<Item = &ComponentRef> {
    d.active
        .iter()
        .chain(&d.history)
        .chain(d.canary.iter().map(|c| &c.component))
        .chain(d.shadow.iter().map(|(c, _)| c))
}

/// The fleet's state: what it wants of each pipeline.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FleetState {
    /// Per pipeline.
    pub pipelines: BTreeMap<String, Desired>,
}

/// Why an action or decision changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Its number is not above the last one applied: a replay, or an action written without
    /// seeing the one before.
    #[error("action {seq} is not newer than action {applied}, already applied")]
    NotNewer {
        /// Its number.
        seq: u64,
        /// The last applied.
        applied: u64,
    },
    /// The change does not fit the state (a promote without a canary, a rollback to an
    /// unknown version, ...).
    #[error("{0}")]
    DoesNotApply(String),
    /// A decision for a canary that is not running (decided already, or replaced).
    #[error("decision for canary {seq}, which is not running (decided already or replaced)")]
    Stale {
        /// The canary it names.
        seq: u64,
    },
}

impl FleetState {
    /// What the fleet wants of `pipeline` (the default: nothing yet).
    pub fn desired(&self, pipeline: &str) -> Desired {
        self.pipelines.get(pipeline).cloned().unwrap_or_default()
    }

    /// Applies a verified action.
    pub fn apply_action(&mut self, a: &Action) -> Result<(), Refused> {
        let d = self.pipelines.entry(a.pipeline.clone()).or_default();
        if a.seq <= d.seq {
            return Err(Refused::NotNewer {
                seq: a.seq,
                applied: d.seq,
            });
        }
        let mut next = d.clone();
        next.seq = a.seq;
        match &a.change {
            Change::Deploy { component } => {
                next.canary = None;
                next.shadow = None;
                activate(&mut next, Some(component.clone()));
            }
            Change::Rollback { to } => {
                let target = match to {
                    None => next.history.first().cloned(),
                    Some(prefix) => next
                        .history
                        .iter()
                        .find(|h| h.digest.starts_with(prefix.as_str()))
                        .cloned(),
                };
                match (target, to) {
                    (Some(t), _) => activate(&mut next, Some(t)),
                    // Back past the first deploy: each host's manifest component.
                    (None, None) if next.active.is_some() => activate(&mut next, None),
                    (None, None) => {
                        return Err(Refused::DoesNotApply(
                            "nothing to roll back to: the fleet never deployed a version of this pipeline".into(),
                        ));
                    }
                    (None, Some(prefix)) => {
                        let known: Vec<&str> =
                            next.history.iter().map(|h| short(&h.digest)).collect();
                        return Err(Refused::DoesNotApply(format!(
                            "no version the fleet ran before starts with {prefix:?} (kept: {known:?})"
                        )));
                    }
                }
                if let Some(c) = next.canary.take() {
                    next.last_canary = Some(CanaryOutcome {
                        seq: c.seq,
                        candidate: c.component.digest,
                        promoted: false,
                        reason: format!("ended by operator rollback (action {})", a.seq),
                    });
                }
            }
            Change::Shadow { component, sample } => {
                next.shadow = Some((component.clone(), *sample));
            }
            Change::StopShadow => {
                if next.shadow.take().is_none() {
                    return Err(Refused::DoesNotApply("no shadow is running".into()));
                }
            }
            Change::Canary { component, rules } => {
                if let Some(c) = &next.canary {
                    return Err(Refused::DoesNotApply(format!(
                        "a canary of {} (action {}) is running: promote or abort it first",
                        short(&c.component.digest),
                        c.seq
                    )));
                }
                if next
                    .active
                    .as_ref()
                    .is_some_and(|x| x.digest == component.digest)
                {
                    return Err(Refused::DoesNotApply(
                        "the candidate is the active version".into(),
                    ));
                }
                next.canary = Some(FleetCanary {
                    seq: a.seq,
                    component: component.clone(),
                    rules: rules.clone(),
                    issued_at_ms: a.issued_at_ms,
                });
            }
            Change::Promote | Change::AbortCanary => {
                let promote = matches!(a.change, Change::Promote);
                let Some(c) = next.canary.take() else {
                    return Err(Refused::DoesNotApply("no canary is running".into()));
                };
                next.last_canary = Some(CanaryOutcome {
                    seq: c.seq,
                    candidate: c.component.digest.clone(),
                    promoted: promote,
                    reason: format!(
                        "{} by the operator (action {})",
                        if promote { "promoted" } else { "rolled back" },
                        a.seq
                    ),
                });
                if promote {
                    activate(&mut next, Some(c.component));
                }
            }
        }
        *d = next;
        Ok(())
    }

    /// Takes a verified action's resulting state: the state the operator computed with
    /// [`FleetState::apply_action`] and signed with it. A host reads the fleet this way, so
    /// the newest action alone says what the fleet wants (with the decisions of its canary):
    /// nothing depends on the records before it, which compaction may have reordered (a
    /// replayed old action kept at a later offset).
    pub fn take_action(&mut self, a: &Action) -> Result<(), Refused> {
        let d = self.pipelines.entry(a.pipeline.clone()).or_default();
        if a.seq <= d.seq {
            return Err(Refused::NotNewer {
                seq: a.seq,
                applied: d.seq,
            });
        }
        if a.then.seq != a.seq {
            return Err(Refused::DoesNotApply(format!(
                "its resulting state is numbered {}, not {}",
                a.then.seq, a.seq
            )));
        }
        *d = a.then.clone();
        Ok(())
    }

    /// Applies a host's canary decision: the first for a running canary decides it.
    pub fn apply_decision(&mut self, dec: &Decision) -> Result<(), Refused> {
        let d = self.pipelines.entry(dec.pipeline.clone()).or_default();
        let Some(c) = d.canary.take_if(|c| c.seq == dec.seq) else {
            return Err(Refused::Stale { seq: dec.seq });
        };
        d.last_canary = Some(CanaryOutcome {
            seq: c.seq,
            candidate: c.component.digest.clone(),
            promoted: dec.promote,
            reason: format!(
                "{} on the fleet's sums by host {}: {}",
                if dec.promote {
                    "promoted"
                } else {
                    "rolled back"
                },
                dec.host,
                dec.reason
            ),
        });
        if dec.promote {
            activate(d, Some(c.component));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::records::CanaryRules;
    use crate::rollout::{PromoteAfter, RollbackIf};
    use sharehost_api::Tally;

    fn comp(d: char) -> ComponentRef {
        ComponentRef {
            digest: d.to_string().repeat(64),
            size: 1,
            name: format!("{d}.wasm"),
            signature: String::new(),
            chunks: vec![0],
        }
    }

    fn action(seq: u64, change: Change) -> Action {
        Action {
            fleet: "f".into(),
            pipeline: "p".into(),
            seq,
            issued_at_ms: 0,
            change,
            then: Desired::default(),
        }
    }

    fn canary(c: char) -> Change {
        Change::Canary {
            component: comp(c),
            rules: CanaryRules {
                percent: 50.0,
                promote_after: PromoteAfter {
                    batches: Some(2),
                    seconds: None,
                },
                rollback_if: RollbackIf::default(),
            },
        }
    }

    fn decision(seq: u64, promote: bool, host: &str) -> Decision {
        Decision {
            pipeline: "p".into(),
            seq,
            promote,
            reason: "r".into(),
            host: host.into(),
            candidate: Tally::default(),
            active: Tally::default(),
        }
    }

    fn active(s: &FleetState) -> Option<char> {
        s.desired("p").active.and_then(|c| c.digest.chars().next())
    }

    #[test]
    fn deploys_and_rollbacks_move_the_active_version_and_keep_history() {
        let mut s = FleetState::default();
        s.apply_action(&action(
            1,
            Change::Deploy {
                component: comp('a'),
            },
        ))
        .expect("1");
        s.apply_action(&action(
            2,
            Change::Deploy {
                component: comp('b'),
            },
        ))
        .expect("2");
        assert_eq!(active(&s), Some('b'));
        s.apply_action(&action(3, Change::Rollback { to: None }))
            .expect("3");
        assert_eq!(active(&s), Some('a'));
        s.apply_action(&action(
            4,
            Change::Rollback {
                to: Some("bbbb".into()),
            },
        ))
        .expect("4: forward again by digest");
        assert_eq!(active(&s), Some('b'));
        assert!(matches!(
            s.apply_action(&action(
                5,
                Change::Rollback {
                    to: Some("zz".into())
                }
            )),
            Err(Refused::DoesNotApply(_))
        ));
        s.apply_action(&action(6, Change::Rollback { to: None }))
            .expect("6");
        assert_eq!(active(&s), Some('a'));
        s.apply_action(&action(7, Change::Rollback { to: None }))
            .expect("7");
        assert_eq!(active(&s), Some('b'), "rolling back twice alternates a/b");
    }

    #[test]
    fn an_old_or_replayed_action_changes_nothing() {
        let mut s = FleetState::default();
        let old = action(
            1,
            Change::Deploy {
                component: comp('a'),
            },
        );
        s.apply_action(&old).expect("1");
        s.apply_action(&action(
            2,
            Change::Deploy {
                component: comp('b'),
            },
        ))
        .expect("2");
        let before = s.clone();
        assert_eq!(
            s.apply_action(&old),
            Err(Refused::NotNewer { seq: 1, applied: 2 })
        );
        assert_eq!(s, before);
    }

    #[test]
    fn the_first_decision_for_a_canary_wins_and_later_ones_are_stale() {
        let mut s = FleetState::default();
        s.apply_action(&action(
            1,
            Change::Deploy {
                component: comp('a'),
            },
        ))
        .expect("1");
        s.apply_action(&action(2, canary('c'))).expect("2");
        assert!(
            matches!(
                s.apply_action(&action(3, canary('d'))),
                Err(Refused::DoesNotApply(_))
            ),
            "one canary at a time"
        );
        s.apply_decision(&decision(2, false, "h1"))
            .expect("first decides");
        assert_eq!(
            s.apply_decision(&decision(2, true, "h2")),
            Err(Refused::Stale { seq: 2 })
        );
        assert_eq!(
            active(&s),
            Some('a'),
            "rolled back: the active version stays"
        );
        let last = s.desired("p").last_canary.expect("outcome");
        assert!(!last.promoted && last.reason.contains("h1"));
        s.apply_action(&action(4, canary('c')))
            .expect("a new canary");
        s.apply_decision(&decision(4, true, "h2"))
            .expect("promoted");
        assert_eq!(active(&s), Some('c'));
        assert_eq!(s.desired("p").history[0].digest, comp('a').digest);
    }

    #[test]
    fn the_same_records_in_the_same_order_give_the_same_state() {
        let records: Vec<Result<Action, Decision>> = vec![
            Ok(action(
                1,
                Change::Deploy {
                    component: comp('a'),
                },
            )),
            Ok(action(2, canary('b'))),
            Err(decision(2, true, "h3")),
            Err(decision(2, false, "h1")),
            Ok(action(
                2,
                Change::Deploy {
                    component: comp('z'),
                },
            )),
            Ok(action(
                3,
                Change::Shadow {
                    component: comp('s'),
                    sample: 0.5,
                },
            )),
        ];
        let fold = || {
            let mut s = FleetState::default();
            for r in &records {
                let _ = match r {
                    Ok(a) => s.apply_action(a),
                    Err(d) => s.apply_decision(d),
                };
            }
            s
        };
        let (one, two) = (fold(), fold());
        assert_eq!(one, two);
        assert_eq!(active(&one), Some('b'));
        assert_eq!(one.desired("p").seq, 3);
        assert!(one.desired("p").shadow.is_some());
    }
}

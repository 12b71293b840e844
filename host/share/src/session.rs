//! One share session with one partition leader, as a pure state machine: which epoch the next
//! request carries, which partitions it adds and forgets, and how a response moves the state.
//!
//! Rules (KIP-932 reference §4.2, §9): epoch 0 opens a session and carries no acknowledgements;
//! each later request carries the next epoch, wrapping from i32::MAX to 1; -1 closes; the session
//! errors SHARE_SESSION_NOT_FOUND, INVALID_SHARE_SESSION_EPOCH and SHARE_SESSION_LIMIT_REACHED (or
//! a lost connection) start over at 0. Any other outcome advances the epoch.

use std::collections::BTreeSet;

use kafka_protocol::ResponseError;

use super::ledger::TopicIdPartition;
use sharehost_kafka::protocol::share::{ForgottenTopic, PartitionAcks, TopicAcks};

/// The epoch that opens a session.
pub const INITIAL_EPOCH: i32 = 0;
/// The epoch that closes a session.
pub const FINAL_EPOCH: i32 = -1;

/// The epoch after `epoch`: +1, wrapping to 1 (never 0 or -1, which would open or close).
pub fn next_epoch(epoch: i32) -> i32 {
    if epoch == i32::MAX { 1 } else { epoch + 1 }
}

/// What the session should do after a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionOutcome {
    /// Carry on with the next epoch.
    Continue,
    /// The session is gone: what this member held there was released by the broker; start over
    /// at epoch 0.
    Reset,
}

/// A request the session rules forbid; building it would only earn an error from the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// Requests to one broker are strictly serial (they share the epoch).
    #[error("a request is already in flight on this session")]
    Busy,
    /// Acknowledgements cannot ride on the request that opens a session.
    #[error("acknowledgements cannot ride on the request that opens a share session")]
    AcksWhileOpening,
    /// ShareAcknowledge cannot open a session.
    #[error("ShareAcknowledge cannot open a share session")]
    AcknowledgeCannotOpen,
    /// A session that was never opened (or is closed already) has nothing to close.
    #[error("a share session that is not open cannot be closed")]
    NotOpen,
}

/// The partition set and epoch of one session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareSession {
    epoch: i32,
    /// Partitions the broker has in the session (as of the last successful request).
    in_session: BTreeSet<TopicIdPartition>,
    /// Whether a request is in flight (requests per broker are strictly serial).
    in_flight: bool,
}

/// The session part of a request: epoch, partitions to list and partitions to forget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRequest {
    /// Epoch to send.
    pub epoch: i32,
    /// Partitions to add and/or acknowledge.
    pub topics: Vec<TopicAcks>,
    /// Partitions to drop from the session.
    pub forgotten: Vec<ForgottenTopic>,
    /// The partition set the session will hold if the request succeeds.
    pub wanted: BTreeSet<TopicIdPartition>,
}

impl ShareSession {
    /// A session not opened yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The epoch the next request will carry.
    pub fn epoch(&self) -> i32 {
        self.epoch
    }

    /// True while the next request opens the session (and so may carry no acknowledgements).
    pub fn is_opening(&self) -> bool {
        self.epoch == INITIAL_EPOCH
    }

    /// Partitions the broker holds in this session.
    pub fn partitions(&self) -> &BTreeSet<TopicIdPartition> {
        &self.in_session
    }

    /// Builds the session part of the next ShareFetch. `wanted` is the set of partitions this
    /// leader should serve now; `acks` the acknowledgements to piggyback, which must be empty
    /// when the session is opening (the broker would reject the whole request).
    pub fn fetch_request(
        &mut self,
        wanted: &BTreeSet<TopicIdPartition>,
        acks: Vec<(
            TopicIdPartition,
            Vec<sharehost_kafka::protocol::share::AckBatch>,
        )>,
    ) -> Result<SessionRequest, SessionError> {
        if self.in_flight {
            return Err(SessionError::Busy);
        }
        if self.is_opening() && !acks.is_empty() {
            return Err(SessionError::AcksWhileOpening);
        }
        let mut listed: BTreeSet<TopicIdPartition> = if self.is_opening() {
            wanted.clone()
        } else {
            wanted.difference(&self.in_session).copied().collect()
        };
        listed.extend(acks.iter().map(|(tp, _)| *tp));
        // Acks for a partition this leader no longer serves are listed and forgotten at once
        // (the broker adds Topics before removing Forgotten): they are processed, and nothing
        // is fetched from it. That holds for a partition still in the session and for one
        // forgotten earlier whose records this member still held and has judged since.
        let forgotten_set: BTreeSet<TopicIdPartition> = if self.is_opening() {
            BTreeSet::new()
        } else {
            self.in_session
                .iter()
                .chain(acks.iter().map(|(tp, _)| tp))
                .filter(|tp| !wanted.contains(tp))
                .copied()
                .collect()
        };
        let mut by_tp: std::collections::BTreeMap<TopicIdPartition, PartitionAcks> = listed
            .iter()
            .map(|tp| {
                (
                    *tp,
                    PartitionAcks {
                        partition: tp.partition,
                        batches: Vec::new(),
                    },
                )
            })
            .collect();
        for (tp, batches) in acks {
            if let Some(p) = by_tp.get_mut(&tp) {
                p.batches = batches;
            }
        }
        self.in_flight = true;
        Ok(SessionRequest {
            epoch: self.epoch,
            topics: group_topics(by_tp.into_iter()),
            forgotten: group_forgotten(forgotten_set.iter()),
            wanted: wanted.clone(),
        })
    }

    /// Builds a standalone ShareAcknowledge's session part (never at epoch 0).
    pub fn ack_request(
        &mut self,
        acks: Vec<(
            TopicIdPartition,
            Vec<sharehost_kafka::protocol::share::AckBatch>,
        )>,
    ) -> Result<(i32, Vec<TopicAcks>), SessionError> {
        if self.in_flight {
            return Err(SessionError::Busy);
        }
        if self.is_opening() {
            return Err(SessionError::AcknowledgeCannotOpen);
        }
        self.in_flight = true;
        let by_tp = acks.into_iter().map(|(tp, batches)| {
            (
                tp,
                PartitionAcks {
                    partition: tp.partition,
                    batches,
                },
            )
        });
        Ok((self.epoch, group_topics(by_tp)))
    }

    /// Feeds back the top-level error of the response to the last request (`None` when the
    /// connection failed before a response arrived). `wanted` is the set the request asked for.
    pub fn on_response(
        &mut self,
        outcome: Option<ResponseError>,
        transport_failed: bool,
        wanted: Option<&BTreeSet<TopicIdPartition>>,
    ) -> SessionOutcome {
        self.in_flight = false;
        let reset = transport_failed
            || matches!(
                outcome,
                Some(
                    ResponseError::ShareSessionNotFound
                        | ResponseError::InvalidShareSessionEpoch
                        | ResponseError::ShareSessionLimitReached
                )
            );
        if reset {
            self.epoch = INITIAL_EPOCH;
            self.in_session.clear();
            return SessionOutcome::Reset;
        }
        if outcome.is_none()
            && let Some(w) = wanted
        {
            self.in_session = w.clone();
        }
        self.epoch = next_epoch(self.epoch);
        SessionOutcome::Continue
    }

    /// Builds the session part of the request that closes the session (epoch -1), carrying
    /// `acks`, the last verdicts: a ShareAcknowledge when there are any, else an empty
    /// ShareFetch. The broker then releases everything this member still holds there. A
    /// session not opened has nothing to close. Call [`ShareSession::closed`] once it is
    /// answered (or failed).
    pub fn close_request(
        &mut self,
        acks: Vec<(
            TopicIdPartition,
            Vec<sharehost_kafka::protocol::share::AckBatch>,
        )>,
    ) -> Result<(i32, Vec<TopicAcks>), SessionError> {
        if self.in_flight {
            return Err(SessionError::Busy);
        }
        if self.is_opening() {
            return Err(SessionError::NotOpen);
        }
        self.in_flight = true;
        let by_tp = acks.into_iter().map(|(tp, batches)| {
            (
                tp,
                PartitionAcks {
                    partition: tp.partition,
                    batches,
                },
            )
        });
        Ok((FINAL_EPOCH, group_topics(by_tp)))
    }

    /// Marks the session closed (after an epoch -1 request): the next request opens anew.
    pub fn closed(&mut self) {
        self.in_flight = false;
        self.epoch = INITIAL_EPOCH;
        self.in_session.clear();
    }
}

fn group_topics(parts: impl Iterator<Item = (TopicIdPartition, PartitionAcks)>) -> Vec<TopicAcks> {
    let mut out: Vec<TopicAcks> = Vec::new();
    for (tp, p) in parts {
        match out.last_mut() {
            Some(t) if t.topic_id == tp.topic_id => t.partitions.push(p),
            _ => out.push(TopicAcks {
                topic_id: tp.topic_id,
                partitions: vec![p],
            }),
        }
    }
    out
}

fn group_forgotten<'a>(parts: impl Iterator<Item = &'a TopicIdPartition>) -> Vec<ForgottenTopic> {
    let mut out: Vec<ForgottenTopic> = Vec::new();
    for tp in parts {
        match out.last_mut() {
            Some(t) if t.topic_id == tp.topic_id => t.partitions.push(tp.partition),
            _ => out.push(ForgottenTopic {
                topic_id: tp.topic_id,
                partitions: vec![tp.partition],
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sharehost_kafka::protocol::share::AckBatch;
    use uuid::Uuid;

    fn tp(t: u128, p: i32) -> TopicIdPartition {
        TopicIdPartition {
            topic_id: Uuid::from_u128(t),
            partition: p,
        }
    }

    fn set(v: &[TopicIdPartition]) -> BTreeSet<TopicIdPartition> {
        v.iter().copied().collect()
    }

    fn acks(t: TopicIdPartition) -> Vec<(TopicIdPartition, Vec<AckBatch>)> {
        vec![(
            t,
            vec![AckBatch {
                first_offset: 0,
                last_offset: 0,
                types: vec![1],
            }],
        )]
    }

    #[test]
    fn epoch_wraps_to_one_never_zero_or_minus_one() {
        assert_eq!(next_epoch(0), 1);
        assert_eq!(next_epoch(41), 42);
        assert_eq!(next_epoch(i32::MAX), 1);
    }

    #[test]
    fn opening_lists_everything_and_refuses_acks() {
        let mut s = ShareSession::new();
        let wanted = set(&[tp(1, 0), tp(1, 1), tp(2, 0)]);
        assert_eq!(
            s.fetch_request(&wanted, acks(tp(1, 0))),
            Err(SessionError::AcksWhileOpening)
        );
        let r = s.fetch_request(&wanted, vec![]).expect("open");
        assert_eq!(r.epoch, 0);
        assert_eq!(r.topics.len(), 2);
        assert_eq!(r.topics[0].partitions.len(), 2);
        assert!(r.forgotten.is_empty());
        assert_eq!(
            s.ack_request(vec![]),
            Err(SessionError::Busy),
            "serialized: one in flight"
        );
        assert_eq!(
            s.on_response(None, false, Some(&r.wanted)),
            SessionOutcome::Continue
        );
        assert_eq!(s.epoch(), 1);
        assert_eq!(s.partitions(), &wanted);
    }

    #[test]
    fn later_requests_list_only_additions_and_acked_partitions_and_forget_the_rest() {
        let mut s = ShareSession::new();
        let first = set(&[tp(1, 0), tp(1, 1)]);
        let r = s.fetch_request(&first, vec![]).expect("open");
        s.on_response(None, false, Some(&r.wanted));
        // Partition 1 moves away, partition 2 arrives; partition 1 still has acks to send.
        let second = set(&[tp(1, 0), tp(1, 2)]);
        let r = s.fetch_request(&second, acks(tp(1, 1))).expect("continue");
        assert_eq!(r.epoch, 1);
        let listed: Vec<i32> = r.topics[0].partitions.iter().map(|p| p.partition).collect();
        assert_eq!(listed, vec![1, 2], "the acked partition and the new one");
        assert_eq!(r.topics[0].partitions[0].batches.len(), 1);
        assert_eq!(
            r.forgotten,
            vec![ForgottenTopic {
                topic_id: Uuid::from_u128(1),
                partitions: vec![1]
            }]
        );
        s.on_response(None, false, Some(&r.wanted));
        assert_eq!(s.partitions(), &second);
        assert_eq!(s.epoch(), 2);
        // Verdicts made later for records of partition 1 (held while it moved away) are
        // listed and forgotten again: the broker takes them and fetches nothing from it.
        let r = s.fetch_request(&second, acks(tp(1, 1))).expect("continue");
        let listed: Vec<i32> = r.topics[0].partitions.iter().map(|p| p.partition).collect();
        assert_eq!(listed, vec![1], "only the late verdicts' partition");
        assert_eq!(r.topics[0].partitions[0].batches.len(), 1);
        assert_eq!(
            r.forgotten,
            vec![ForgottenTopic {
                topic_id: Uuid::from_u128(1),
                partitions: vec![1]
            }]
        );
        s.on_response(None, false, Some(&r.wanted));
        assert_eq!(
            s.partitions(),
            &second,
            "partition 1 never rejoins the session"
        );
    }

    #[test]
    fn session_errors_and_lost_connections_reset_to_zero() {
        for (err, transport) in [
            (Some(ResponseError::ShareSessionNotFound), false),
            (Some(ResponseError::InvalidShareSessionEpoch), false),
            (Some(ResponseError::ShareSessionLimitReached), false),
            (None, true),
        ] {
            let mut s = ShareSession::new();
            let w = set(&[tp(1, 0)]);
            let r = s.fetch_request(&w, vec![]).expect("open");
            s.on_response(None, false, Some(&r.wanted));
            let r = s.fetch_request(&w, vec![]).expect("continue");
            assert_eq!(
                s.on_response(err, transport, Some(&r.wanted)),
                SessionOutcome::Reset,
                "{err:?}"
            );
            assert!(s.is_opening());
            assert!(s.partitions().is_empty());
        }
    }

    #[test]
    fn other_errors_still_advance_the_epoch() {
        let mut s = ShareSession::new();
        let w = set(&[tp(1, 0)]);
        let r = s.fetch_request(&w, vec![]).expect("open");
        assert_eq!(
            s.on_response(
                Some(ResponseError::GroupAuthorizationFailed),
                false,
                Some(&r.wanted)
            ),
            SessionOutcome::Continue
        );
        assert_eq!(s.epoch(), 1);
    }

    #[test]
    fn acknowledge_never_opens_and_closing_resets() {
        let mut s = ShareSession::new();
        assert_eq!(
            s.ack_request(acks(tp(1, 0))),
            Err(SessionError::AcknowledgeCannotOpen)
        );
        let w = set(&[tp(1, 0)]);
        let r = s.fetch_request(&w, vec![]).expect("open");
        s.on_response(None, false, Some(&r.wanted));
        let (epoch, topics) = s.ack_request(acks(tp(1, 0))).expect("ack");
        assert_eq!(epoch, 1);
        assert_eq!(topics[0].partitions[0].batches.len(), 1);
        s.on_response(None, false, None);
        assert_eq!(s.epoch(), 2);
        assert_eq!(
            s.partitions(),
            &w,
            "an ack does not change the partition set"
        );
        s.closed();
        assert!(s.is_opening());
    }

    #[test]
    fn closing_carries_the_final_epoch_and_the_last_verdicts_and_only_an_open_session_closes() {
        let mut s = ShareSession::new();
        assert_eq!(s.close_request(vec![]), Err(SessionError::NotOpen));
        let w = set(&[tp(1, 0), tp(2, 0)]);
        let r = s.fetch_request(&w, vec![]).expect("open");
        assert_eq!(
            s.close_request(vec![]),
            Err(SessionError::Busy),
            "serialized: not while the opening request is out"
        );
        s.on_response(None, false, Some(&r.wanted));
        let mut last = acks(tp(1, 0));
        last.extend(acks(tp(2, 0)));
        let (epoch, topics) = s.close_request(last).expect("close");
        assert_eq!(epoch, FINAL_EPOCH);
        assert_eq!(topics.len(), 2, "grouped by topic");
        assert_eq!(topics[0].partitions[0].batches.len(), 1);
        let (epoch, topics) = {
            let mut again = ShareSession::new();
            let r = again.fetch_request(&w, vec![]).expect("open");
            again.on_response(None, false, Some(&r.wanted));
            again
                .close_request(vec![])
                .expect("close with nothing to send")
        };
        assert_eq!((epoch, topics.len()), (FINAL_EPOCH, 0));
        s.closed();
        assert!(s.is_opening(), "the next request opens anew");
        assert!(s.partitions().is_empty());
        assert_eq!(s.close_request(vec![]), Err(SessionError::NotOpen));
    }
}

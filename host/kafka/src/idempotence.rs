//! The idempotent producer's bookkeeping: who the broker knows this client as, and the sequence
//! number each partition's next batch carries.
//!
//! A broker keeps, per producer id and partition, the sequence numbers of the last batches it
//! appended, and answers a batch it has already appended as a success without appending it again.
//! So a batch retried after a lost answer (a cut connection, a timeout) lands once, as long as
//! every retry carries the same producer id, epoch and base sequence. Kafka's own producer does
//! the same; the rules kept here are its rules:
//!
//! - one batch in flight per partition (the client holds the partition's slot across a call, so
//!   its retries cannot be overtaken by the next batch);
//! - the sequence advances only when the broker confirmed the batch;
//! - when a call ends without knowing whether its batch landed, the partition's next batch must
//!   not reuse that sequence: the broker would take new records for a duplicate of the old ones and
//!   drop them. The epoch is bumped first (a new epoch starts again at sequence 0, which the broker
//!   accepts from an idempotent producer), so that whatever the lost batch did, the next one is new.

/// Who the broker knows this producer as: InitProducerId's answer, and the epoch bumped since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerIdentity {
    /// The producer id the cluster gave.
    pub id: i64,
    /// Its epoch; bumped locally when a partition's sequence is in doubt.
    pub epoch: i16,
}

impl ProducerIdentity {
    /// The same id at the next epoch; None when the epoch is exhausted (a new id is needed then).
    pub fn bumped(self) -> Option<ProducerIdentity> {
        self.epoch
            .checked_add(1)
            .map(|epoch| ProducerIdentity { id: self.id, epoch })
    }
}

/// What the next batch of a partition is sent as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Send under this identity with this base sequence.
    Send {
        /// The identity the batch carries.
        identity: ProducerIdentity,
        /// The sequence of its first record.
        base_sequence: i32,
    },
    /// The identity `stale` must be bumped first (its sequence here is in doubt, or the batch
    /// would run past the largest sequence).
    Bump {
        /// The identity seen when the plan was made.
        stale: ProducerIdentity,
    },
}

/// One partition's sequence under the identity it was counted for.
#[derive(Debug, Default)]
pub struct PartitionSequence {
    identity: Option<ProducerIdentity>,
    next: i32,
    in_doubt: bool,
}

impl PartitionSequence {
    /// The plan for a batch of `count` records (1 or more) while the client's identity is
    /// `current`.
    pub fn plan(&mut self, current: ProducerIdentity, count: i32) -> Plan {
        if self.identity != Some(current) {
            // A new id or epoch starts every partition again at 0, doubts included.
            self.identity = Some(current);
            self.next = 0;
            self.in_doubt = false;
        }
        // Sequences wrap at i32::MAX; a batch that would cross it is sent at a new epoch instead
        // (a batch's records must have consecutive sequences, and this is rare enough: 2^31
        // records to one partition under one epoch).
        if self.in_doubt || count > i32::MAX - self.next {
            return Plan::Bump { stale: current };
        }
        Plan::Send {
            identity: current,
            base_sequence: self.next,
        }
    }

    /// The broker confirmed the batch planned as `base_sequence` with `count` records.
    pub fn landed(&mut self, identity: ProducerIdentity, base_sequence: i32, count: i32) {
        if self.identity == Some(identity) && self.next == base_sequence {
            self.next = base_sequence.saturating_add(count);
        }
    }

    /// The call ended without knowing whether its batch landed.
    pub fn in_doubt(&mut self, identity: ProducerIdentity) {
        if self.identity == Some(identity) {
            self.in_doubt = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: ProducerIdentity = ProducerIdentity { id: 7, epoch: 0 };

    fn sent(plan: Plan) -> (ProducerIdentity, i32) {
        match plan {
            Plan::Send {
                identity,
                base_sequence,
            } => (identity, base_sequence),
            Plan::Bump { .. } => panic!("expected a send, got {plan:?}"),
        }
    }

    #[test]
    fn sequences_advance_by_what_landed_and_a_retry_keeps_its_sequence() {
        let mut p = PartitionSequence::default();
        assert_eq!(sent(p.plan(A, 3)), (A, 0));
        p.landed(A, 0, 3);
        // A refused call (nothing landed, no doubt) plans the same sequence again.
        assert_eq!(sent(p.plan(A, 2)), (A, 3));
        assert_eq!(sent(p.plan(A, 2)), (A, 3));
        p.landed(A, 3, 2);
        assert_eq!(sent(p.plan(A, 1)), (A, 5));
    }

    #[test]
    fn a_batch_in_doubt_is_never_followed_by_the_same_sequence() {
        let mut p = PartitionSequence::default();
        sent(p.plan(A, 4));
        p.in_doubt(A);
        assert_eq!(p.plan(A, 4), Plan::Bump { stale: A });
        let b = A.bumped().expect("epoch 1");
        assert_eq!(sent(p.plan(b, 4)), (b, 0));
    }

    #[test]
    fn a_new_identity_starts_at_zero_and_forgets_old_confirmations() {
        let mut p = PartitionSequence::default();
        sent(p.plan(A, 2));
        p.landed(A, 0, 2);
        let b = ProducerIdentity { id: 8, epoch: 0 };
        assert_eq!(sent(p.plan(b, 1)), (b, 0));
        // A late confirmation under the old identity changes nothing.
        p.landed(A, 2, 5);
        assert_eq!(sent(p.plan(b, 1)), (b, 0));
    }

    #[test]
    fn a_batch_that_would_pass_the_largest_sequence_asks_for_a_new_epoch() {
        let mut p = PartitionSequence::default();
        sent(p.plan(A, 1));
        p.landed(A, 0, i32::MAX - 1);
        assert_eq!(sent(p.plan(A, 1)), (A, i32::MAX - 1));
        assert_eq!(p.plan(A, 2), Plan::Bump { stale: A });
    }

    #[test]
    fn the_epoch_runs_out_at_its_largest_value() {
        assert_eq!(
            ProducerIdentity {
                id: 1,
                epoch: i16::MAX
            }
            .bumped(),
            None
        );
    }
}

//! Final verdicts the broker never applied, kept so that a record delivered to this consumer
//! again is settled with the verdict it already had instead of being judged a second time.
//!
//! A share session lives on one connection: when the connection drops (a cut, a broker
//! restart), the broker releases what the session held, and verdicts not yet sent, in a request
//! that got no answer, or made after the session ended can no longer reach it. The records come
//! back, often to this same member. Their accept or reject was made and its effects (outputs,
//! dead letters) happened: judging them again would only repeat those effects. A record at a
//! partition and offset never changes, so the verdict stays right for its next delivery.
//!
//! Bounded: at most four times the consumer's in-flight bound (1,024 to 65,536), the oldest
//! forgotten first (a record that went to another member never comes back here; forgetting it
//! costs at most a second judging).

use std::collections::VecDeque;

use foldhash::HashMap;

use crate::ledger::{AckKind, TopicIdPartition};

/// The most lost verdicts one consumer keeps (about 6 MB with the queue), whatever its bound.
pub(super) const REMEMBERED_MAX: usize = 65_536;

/// The fewest kept, so a consumer with a small bound still covers a few lost sessions.
const REMEMBERED_MIN: usize = 1_024;

/// How many lost verdicts a consumer with `max_in_flight` keeps: a session takes at most what
/// the consumer holds with it (plus the verdicts in the request it had in flight), so four
/// times the bound covers several sessions lost before their records come back, and a host of
/// many pipelines keeps memory in proportion to what each may hold.
pub(super) fn remembered_capacity(max_in_flight: usize) -> usize {
    max_in_flight
        .saturating_mul(4)
        .clamp(REMEMBERED_MIN, REMEMBERED_MAX)
}

type Key = (TopicIdPartition, i64);

/// Lost final verdicts by record, oldest first out.
#[derive(Debug)]
pub(super) struct Remembered {
    capacity: usize,
    /// Each verdict with the sequence number it was kept under.
    verdicts: HashMap<Key, (AckKind, u64)>,
    /// Keys in the order they were kept; an entry whose sequence no longer matches the map's
    /// (taken, or kept again later) is skipped when the oldest is forgotten.
    order: VecDeque<(Key, u64)>,
    next: u64,
}

impl Remembered {
    /// An empty store for at most `capacity` verdicts (at least one).
    pub(super) fn with_capacity(capacity: usize) -> Self {
        Remembered {
            capacity: capacity.max(1),
            verdicts: HashMap::default(),
            order: VecDeque::new(),
            next: 0,
        }
    }

    /// Keeps the lost verdict `kind` of the record at `offset`. Only accepts and rejects are
    /// kept: a release or a renew that never arrived changes nothing the next delivery would
    /// not do again.
    pub(super) fn keep(&mut self, tp: TopicIdPartition, offset: i64, kind: AckKind) {
        if !matches!(kind, AckKind::Accept | AckKind::Reject) {
            return;
        }
        let seq = self.next;
        self.next += 1;
        self.verdicts.insert((tp, offset), (kind, seq));
        self.order.push_back(((tp, offset), seq));
        while self.verdicts.len() > self.capacity {
            self.forget_oldest();
        }
        // Stale entries (taken or kept again) are dropped once they are as many as the live
        // ones, so the queue stays within twice the capacity.
        if self.order.len() > 2 * self.capacity {
            let verdicts = &self.verdicts;
            self.order
                .retain(|(key, seq)| verdicts.get(key).is_some_and(|(_, s)| s == seq));
        }
    }

    /// The lost verdict of the record at `offset`, if one is kept: it is forgotten then (a
    /// verdict is applied once).
    pub(super) fn take(&mut self, tp: TopicIdPartition, offset: i64) -> Option<AckKind> {
        // Asked for every record delivered, and almost always empty: no hashing then.
        if self.verdicts.is_empty() {
            return None;
        }
        self.verdicts.remove(&(tp, offset)).map(|(kind, _)| kind)
    }

    /// How many verdicts are kept.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.verdicts.len()
    }

    /// Whether none is kept (the common case: a batch then costs no lookup).
    pub(super) fn is_empty(&self) -> bool {
        self.verdicts.is_empty()
    }

    fn forget_oldest(&mut self) {
        while let Some((key, seq)) = self.order.pop_front() {
            if self.verdicts.get(&key).is_some_and(|(_, s)| *s == seq) {
                self.verdicts.remove(&key);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(partition: i32) -> TopicIdPartition {
        TopicIdPartition {
            topic_id: uuid::Uuid::from_u128(9),
            partition,
        }
    }

    #[test]
    fn the_capacity_follows_the_in_flight_bound_within_limits() {
        assert_eq!(remembered_capacity(0), REMEMBERED_MIN);
        assert_eq!(remembered_capacity(1000), 4000);
        assert_eq!(remembered_capacity(usize::MAX), REMEMBERED_MAX);
    }

    #[test]
    fn a_kept_verdict_is_given_once() {
        let mut r = Remembered::with_capacity(10);
        r.keep(tp(0), 5, AckKind::Accept);
        r.keep(tp(1), 5, AckKind::Reject);
        assert_eq!(r.take(tp(0), 5), Some(AckKind::Accept));
        assert_eq!(r.take(tp(0), 5), None, "once");
        assert_eq!(r.take(tp(1), 5), Some(AckKind::Reject));
        assert_eq!(r.take(tp(2), 5), None);
    }

    #[test]
    fn releases_and_renewals_are_not_kept() {
        let mut r = Remembered::with_capacity(10);
        for kind in [AckKind::Release, AckKind::Renew, AckKind::Gap] {
            r.keep(tp(0), 1, kind);
        }
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn the_oldest_is_forgotten_at_the_bound() {
        let mut r = Remembered::with_capacity(3);
        for o in 0..5 {
            r.keep(tp(0), o, AckKind::Accept);
        }
        assert_eq!(r.len(), 3);
        assert_eq!(r.take(tp(0), 0), None);
        assert_eq!(r.take(tp(0), 1), None);
        assert_eq!(r.take(tp(0), 4), Some(AckKind::Accept));
    }

    #[test]
    fn a_verdict_kept_again_is_the_newest() {
        let mut r = Remembered::with_capacity(2);
        r.keep(tp(0), 1, AckKind::Accept);
        r.keep(tp(0), 2, AckKind::Accept);
        r.keep(tp(0), 1, AckKind::Reject);
        r.keep(tp(0), 3, AckKind::Accept);
        assert_eq!(r.take(tp(0), 2), None, "the oldest went first");
        assert_eq!(r.take(tp(0), 1), Some(AckKind::Reject));
    }

    #[test]
    fn memory_stays_bounded_under_a_flood_of_keeps_and_takes() {
        // A hostile pattern: every verdict kept is taken at once and kept again, so the queue
        // would fill with stale entries if nothing dropped them.
        let mut r = Remembered::with_capacity(100);
        for o in 0..1_000_000i64 {
            r.keep(tp((o % 7) as i32), o, AckKind::Accept);
            if o % 2 == 0 {
                let _ = r.take(tp((o % 7) as i32), o);
            }
            assert!(r.len() <= 100);
            assert!(r.order.len() <= 200 + 1, "queue {}", r.order.len());
        }
    }
}

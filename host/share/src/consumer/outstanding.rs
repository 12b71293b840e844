//! The records a leader delivered and has no final verdict for ([`Outstanding`]), each with
//! what the engine keeps of it ([`Held`]).
//!
//! Every record passes through here twice (held when delivered, taken when judged), so the
//! layout is chosen for that: per partition, the records in offset order in one contiguous
//! queue. The broker acquires a partition's records in ascending offsets and most verdicts
//! come in the same order, so a record is appended at the back and settled at or near the
//! front, found by a binary search over memory read in sequence. A hash map of every record
//! (as before) cost a cache miss per lookup once thousands were held: about 6 % of the host's
//! CPU at 100-byte records.

use std::collections::VecDeque;

use tokio::time::Instant;

use crate::ledger::TopicIdPartition;

/// A record of a partition, by offset.
pub(super) type RecordKey = (TopicIdPartition, i64);

/// What the engine keeps of a record it delivered and has no final verdict for: when its lock
/// (re)started, how often the caller renewed it, and when a record the caller holds back is
/// to be released. One place for all three, so no caller keeps maps of its own beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Held {
    /// When its lock last (re)started as far as this member knows: a renewal moves it when
    /// recorded, before the broker confirmed it.
    pub(super) since: Instant,
    /// When the request that acquired it was sent, or, after a renewal the broker confirmed
    /// ([`ShareConsumer::confirm_held`](super::ShareConsumer::confirm_held)), when that renewal
    /// was asked for: the start of the one lock this member can prove it holds (renewals not
    /// confirmed leave it alone).
    pub(super) acquired: Instant,
    /// Its delivery count (a release at the group's delivery limit archives it).
    pub(super) deliveries: i16,
    pub(super) renewals: u32,
    pub(super) release_at: Option<Instant>,
}

impl Held {
    pub(super) fn new(now: Instant, deliveries: i16) -> Self {
        Held {
            since: now,
            acquired: now,
            deliveries,
            renewals: 0,
            release_at: None,
        }
    }
}

/// Room an empty lane keeps, in records: enough for a fetch's share of most partitions, not
/// so much that thousands of idle partitions hold megabytes.
const KEPT_SLOTS: usize = 256;

/// Below this many entries a lane is never compacted (the tombstones cost less than a pass).
const COMPACT_ABOVE: usize = 64;

/// One partition's records, ascending by offset. A record settled away from the front leaves
/// a tombstone (`None`) until the records before it go, or until tombstones outnumber the
/// records, when the lane is compacted: so a record held back for an hour while millions pass
/// costs a bounded lane, not one slot per record passed.
#[derive(Debug, Default)]
struct Lane {
    slots: VecDeque<(i64, Option<Held>)>,
    live: usize,
}

impl Lane {
    fn find(&self, offset: i64) -> Result<usize, usize> {
        // A partition's offsets are mostly consecutive: the distance from the front is then
        // the place itself, one read instead of a search over thousands of slots.
        if let Some((front, _)) = self.slots.front()
            && let Ok(guess) = usize::try_from(offset.wrapping_sub(*front))
            && self.slots.get(guess).is_some_and(|(o, _)| *o == offset)
        {
            return Ok(guess);
        }
        self.slots.binary_search_by_key(&offset, |(o, _)| *o)
    }

    fn insert(&mut self, offset: i64, held: Held) -> Option<Held> {
        if self.slots.back().is_none_or(|(last, _)| *last < offset) {
            self.slots.push_back((offset, Some(held)));
            self.live += 1;
            return None;
        }
        match self.find(offset) {
            Ok(i) => {
                let old = self.slots[i].1.replace(held);
                if old.is_none() {
                    self.live += 1;
                }
                old
            }
            Err(i) => {
                self.slots.insert(i, (offset, Some(held)));
                self.live += 1;
                None
            }
        }
    }

    fn get(&self, offset: i64) -> Option<&Held> {
        self.find(offset)
            .ok()
            .and_then(|i| self.slots[i].1.as_ref())
    }

    fn get_mut(&mut self, offset: i64) -> Option<&mut Held> {
        let i = self.find(offset).ok()?;
        self.slots[i].1.as_mut()
    }

    /// The slots of `first..=last` when every one of them is held: offsets in a lane are
    /// strictly ascending, so the run's first and last slot `last - first` apart prove the
    /// ones between.
    fn run(&self, first: i64, last: i64) -> Option<std::ops::Range<usize>> {
        let n = usize::try_from(last.checked_sub(first)?)
            .ok()?
            .checked_add(1)?;
        let i = self.find(first).ok()?;
        let end = i.checked_add(n)?;
        if self.slots.get(end - 1).is_none_or(|(o, _)| *o != last) {
            return None;
        }
        self.slots
            .range(i..end)
            .all(|(_, h)| h.is_some())
            .then_some(i..end)
    }

    fn remove_run(&mut self, first: i64, last: i64) -> Option<usize> {
        let slots = self.run(first, last)?;
        let n = slots.len();
        for (_, h) in self.slots.range_mut(slots) {
            *h = None;
        }
        self.live -= n;
        self.tidy();
        Some(n)
    }

    fn remove(&mut self, offset: i64) -> Option<Held> {
        let i = self.find(offset).ok()?;
        let held = self.slots[i].1.take()?;
        self.live -= 1;
        self.tidy();
        Some(held)
    }

    /// Drops the tombstones at either end, and all of them once they outnumber the records.
    fn tidy(&mut self) {
        if self.live == 0 {
            self.slots.clear();
            self.slots.shrink_to(KEPT_SLOTS);
            return;
        }
        while self.slots.front().is_some_and(|(_, h)| h.is_none()) {
            self.slots.pop_front();
        }
        while self.slots.back().is_some_and(|(_, h)| h.is_none()) {
            self.slots.pop_back();
        }
        if self.slots.len() > COMPACT_ABOVE && self.slots.len() > 2 * self.live {
            self.slots.retain(|(_, h)| h.is_some());
        }
    }
}

/// The records delivered by one leader and not settled, by partition and offset.
#[derive(Debug, Default)]
pub(super) struct Outstanding {
    lanes: foldhash::HashMap<TopicIdPartition, Lane>,
    len: usize,
}

impl Outstanding {
    /// Holds `key`; returns what was held under it before (a record delivered again).
    pub(super) fn insert(&mut self, key: RecordKey, held: Held) -> Option<Held> {
        let old = self.lanes.entry(key.0).or_default().insert(key.1, held);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// Makes room in `tp`'s lane for `additional` records about to be held: a fetch's records
    /// of one partition then cost one allocation, where growing the lane by doubling moved
    /// each record about twice (an emptied lane keeps only [`KEPT_SLOTS`]).
    pub(super) fn reserve(&mut self, tp: TopicIdPartition, additional: usize) {
        self.lanes.entry(tp).or_default().slots.reserve(additional);
    }

    /// What is held of `key`.
    pub(super) fn get(&self, key: &RecordKey) -> Option<&Held> {
        self.lanes.get(&key.0)?.get(key.1)
    }

    /// What is held of `key`, to change.
    pub(super) fn get_mut(&mut self, key: &RecordKey) -> Option<&mut Held> {
        self.lanes.get_mut(&key.0)?.get_mut(key.1)
    }

    /// Whether `key` is held.
    pub(super) fn contains_key(&self, key: &RecordKey) -> bool {
        self.get(key).is_some()
    }

    /// Takes `key` out.
    pub(super) fn remove(&mut self, key: &RecordKey) -> Option<Held> {
        // A lane that empties stays, with a little room (see `reserve`).
        let held = self.lanes.get_mut(&key.0)?.remove(key.1)?;
        self.len -= 1;
        Some(held)
    }

    /// Holds the records of `tp` at `offsets` (ascending, as a fetch delivers them), each
    /// `held`, with one look-up of the partition for all; returns how many were not held
    /// before.
    pub(super) fn hold_all(
        &mut self,
        tp: TopicIdPartition,
        offsets: impl IntoIterator<Item = (i64, Held)>,
    ) -> usize {
        let lane = self.lanes.entry(tp).or_default();
        let mut new = 0;
        for (offset, held) in offsets {
            if lane.insert(offset, held).is_none() {
                new += 1;
            }
        }
        self.len += new;
        new
    }

    /// Whether every record of `tp` from `first` to `last` is held: one look-up for a run of
    /// a batch, where each record cost one.
    pub(super) fn holds_run(&self, tp: &TopicIdPartition, first: i64, last: i64) -> bool {
        self.lanes
            .get(tp)
            .is_some_and(|lane| lane.run(first, last).is_some())
    }

    /// Takes out every record of `tp` from `first` to `last` when all of them are held, and
    /// says how many; takes nothing (`None`) when one of them is not.
    pub(super) fn remove_run(
        &mut self,
        tp: &TopicIdPartition,
        first: i64,
        last: i64,
    ) -> Option<usize> {
        let n = self.lanes.get_mut(tp)?.remove_run(first, last)?;
        self.len -= n;
        Some(n)
    }

    /// How many records are held.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Whether none is.
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every record.
    #[cfg(test)]
    pub(super) fn clear(&mut self) {
        self.lanes.clear();
        self.len = 0;
    }

    /// Every record held, partition by partition, each in offset order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (RecordKey, &Held)> {
        self.lanes.iter().flat_map(|(tp, lane)| {
            lane.slots
                .iter()
                .filter_map(move |(o, h)| h.as_ref().map(|h| ((*tp, *o), h)))
        })
    }

    /// Every record held, to change.
    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (RecordKey, &mut Held)> {
        self.lanes.iter_mut().flat_map(|(tp, lane)| {
            let tp = *tp;
            lane.slots
                .iter_mut()
                .filter_map(move |(o, h)| h.as_mut().map(|h| ((tp, *o), h)))
        })
    }

    /// Keeps the records `keep` says yes to.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&RecordKey, &mut Held) -> bool) {
        let mut len = 0;
        self.lanes.retain(|tp, lane| {
            lane.slots
                .retain_mut(|(o, h)| h.as_mut().is_some_and(|h| keep(&(*tp, *o), h)));
            lane.live = lane.slots.len();
            len += lane.live;
            lane.live > 0
        });
        self.len = len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use uuid::Uuid;

    fn tp(p: i32) -> TopicIdPartition {
        TopicIdPartition {
            topic_id: Uuid::from_u128(7),
            partition: p,
        }
    }

    proptest! {
        /// Through any mix of holds (in order and out of it, again and anew), removals,
        /// changes and partition drops, the lanes answer as a map of every record would, and a
        /// lane never holds more than twice its records plus the compaction floor.
        #[test]
        fn it_answers_as_a_map_of_every_record(
            ops in proptest::collection::vec((0u8..9, 0i32..3, 0i64..200), 0..400),
        ) {
            let now = Instant::now();
            let mut out = Outstanding::default();
            let mut model: BTreeMap<RecordKey, i16> = BTreeMap::new();
            let mut next = 0i64;
            for (op, p, o) in ops {
                let key = (tp(p), o);
                match op {
                    0 => {
                        // The common case: the next offset, at the back.
                        next += 1 + o % 3;
                        let k = (tp(p), 200 + next);
                        prop_assert_eq!(out.insert(k, Held::new(now, 1)).is_none(), !model.contains_key(&k));
                        model.insert(k, 1);
                    }
                    1 => {
                        let d = (o % 5) as i16 + 1;
                        let old = out.insert(key, Held::new(now, d)).map(|h| h.deliveries);
                        prop_assert_eq!(old, model.insert(key, d));
                    }
                    2 | 3 => {
                        let got = out.remove(&key).map(|h| h.deliveries);
                        prop_assert_eq!(got, model.remove(&key));
                    }
                    4 => {
                        if let Some(h) = out.get_mut(&key) {
                            h.renewals += 1;
                        }
                        prop_assert_eq!(out.contains_key(&key), model.contains_key(&key));
                    }
                    5 => {
                        out.retain(|(t, _), _| t.partition != p);
                        model.retain(|(t, _), _| t.partition != p);
                    }
                    6 | 7 => {
                        // A run of up to 4 records, held whole or not.
                        let last = o + o % 4;
                        let whole = (o..=last).all(|x| model.contains_key(&(tp(p), x)));
                        prop_assert_eq!(out.holds_run(&tp(p), o, last), whole);
                        if op == 7 {
                            let got = out.remove_run(&tp(p), o, last);
                            prop_assert_eq!(got, whole.then(|| (last - o + 1) as usize));
                            if whole {
                                for x in o..=last {
                                    model.remove(&(tp(p), x));
                                }
                            }
                        }
                    }
                    _ => {
                        // Several held at once, some of them held already.
                        let items: Vec<(i64, Held)> = (o..o + 1 + o % 5).map(|x| (x, Held::new(now, 2))).collect();
                        let fresh = items.iter().filter(|(x, _)| !model.contains_key(&(tp(p), *x))).count();
                        prop_assert_eq!(out.hold_all(tp(p), items.iter().copied()), fresh);
                        for (x, _) in items {
                            model.insert((tp(p), x), 2);
                        }
                    }
                }
                prop_assert_eq!(out.len(), model.len());
                prop_assert_eq!(out.is_empty(), model.is_empty());
                let mut seen: Vec<(RecordKey, i16)> = out.iter().map(|(k, h)| (k, h.deliveries)).collect();
                seen.sort();
                let want: Vec<(RecordKey, i16)> = model.iter().map(|(k, d)| (*k, *d)).collect();
                prop_assert_eq!(seen, want);
                for lane in out.lanes.values() {
                    prop_assert!(lane.slots.len() <= 2 * lane.live + COMPACT_ABOVE);
                    prop_assert!(lane.slots.iter().zip(lane.slots.iter().skip(1)).all(|(a, b)| a.0 < b.0));
                }
            }
        }
    }

    #[test]
    fn a_record_held_long_at_the_front_leaves_a_bounded_lane() {
        let now = Instant::now();
        let mut out = Outstanding::default();
        // Offset 0 is held back while 100,000 records after it are delivered and settled in
        // order: each leaves a tombstone behind the live front.
        for o in 0..100_000 {
            out.insert((tp(0), o), Held::new(now, 1));
        }
        for o in 1..100_000 {
            out.remove(&(tp(0), o));
            let lane = &out.lanes[&tp(0)];
            assert!(lane.slots.len() <= 2 * lane.live + COMPACT_ABOVE);
        }
        assert_eq!(out.len(), 1);
        assert!(out.lanes[&tp(0)].slots.len() <= COMPACT_ABOVE + 2);
        assert!(out.contains_key(&(tp(0), 0)));
    }
}

//! The acknowledgement ledger: per-record verdicts in, valid acknowledgement batches out.
//!
//! Pure data. The broker rejects a whole partition's acknowledgements when batches overlap, are
//! out of order, or carry a type list of the wrong length (KIP-932 reference §4.4), so this is
//! the one place that builds them, and its property tests check every rule.
//!
//! It also keeps the verdicts of an acquired range together. The broker tracks a range it
//! acquired as one batch until an acknowledgement covers only part of it; then it splits the
//! range into one state and one lock timer per offset, which for producer batches of
//! thousands of records costs it several times its batch-wise work. So verdicts of a range
//! ride on fetches only once the whole range is judged, or once the first of them has waited
//! [`RANGE_LINGER`] (a slow handler's verdicts are not held back for long: until they are
//! sent, their records' locks are not renewed).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::time::Duration;

use tokio::time::Instant;

use uuid::Uuid;

use sharehost_kafka::protocol::share::{AckBatch, ack_type};

/// A partition of a topic, by id (what the share protocol speaks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicIdPartition {
    /// Topic id.
    pub topic_id: Uuid,
    /// Partition index.
    pub partition: i32,
}

/// What happens to one acquired record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AckKind {
    /// The offset has no record (compaction, transaction marker): archive it.
    Gap,
    /// Processed: done.
    Accept,
    /// Give it back for redelivery.
    Release,
    /// Unprocessable: archive it, never redeliver.
    Reject,
    /// Still working on it: extend the lock (ShareFetch/ShareAcknowledge v2).
    Renew,
}

impl AckKind {
    /// The wire code.
    pub fn code(self) -> i8 {
        match self {
            AckKind::Gap => ack_type::GAP,
            AckKind::Accept => ack_type::ACCEPT,
            AckKind::Release => ack_type::RELEASE,
            AckKind::Reject => ack_type::REJECT,
            AckKind::Renew => ack_type::RENEW,
        }
    }

    /// The verdict of a wire code, or `None` for a code this engine never sends.
    pub fn from_code(code: i8) -> Option<AckKind> {
        match code {
            ack_type::GAP => Some(AckKind::Gap),
            ack_type::ACCEPT => Some(AckKind::Accept),
            ack_type::RELEASE => Some(AckKind::Release),
            ack_type::REJECT => Some(AckKind::Reject),
            ack_type::RENEW => Some(AckKind::Renew),
            _ => None,
        }
    }
}

/// Why a verdict could not be recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// The record already has a final verdict that has not been sent yet.
    #[error("offset {offset} of {partition:?} already has verdict {existing:?}; refusing {new:?}")]
    AlreadyJudged {
        /// The partition.
        partition: TopicIdPartition,
        /// The offset.
        offset: i64,
        /// The verdict already recorded.
        existing: AckKind,
        /// The verdict refused.
        new: AckKind,
    },
}

/// Longest a final verdict waits for the rest of its acquired range before it may go out
/// alone.
pub const RANGE_LINGER: Duration = Duration::from_millis(500);

/// An acquired range whose verdicts wait to go out together.
#[derive(Debug, Clone, Copy)]
struct HeldRange {
    last: i64,
    /// Final verdicts pending in the range.
    judged: u64,
    /// When its first final verdict was recorded.
    since: Option<Instant>,
}

impl HeldRange {
    fn ready(&self, first: i64, now: Instant) -> bool {
        let span = u64::try_from(self.last - first)
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        self.judged >= span
            || self
                .since
                .is_some_and(|t| now.duration_since(t) >= RANGE_LINGER)
    }
}

/// A run of consecutive offsets with one verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    last: i64,
    kind: AckKind,
}

impl Run {
    fn len(&self, first: i64) -> usize {
        usize::try_from(self.last - first)
            .unwrap_or(usize::MAX)
            .saturating_add(1)
    }
}

/// One partition's pending verdicts as runs of consecutive offsets with one verdict each (the
/// verdicts of a producer batch are mostly one run: recording one extends it, and a fetch
/// takes it whole, where a map of offsets cost a tree insert and a move per record), with how
/// many offsets are pending and how many of them are Renew: the questions asked on every fetch
/// step (is a final verdict or a Renew waiting?) are then answered without walking them.
#[derive(Debug, Default, Clone)]
struct Offsets {
    /// First offset → the run; runs never overlap.
    runs: BTreeMap<i64, Run>,
    len: usize,
    renews: usize,
}

impl Offsets {
    fn finals(&self) -> usize {
        self.len - self.renews
    }

    fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The run holding `offset`, by its first offset.
    fn run_of(&self, offset: i64) -> Option<(i64, Run)> {
        self.runs
            .range(..=offset)
            .next_back()
            .filter(|(_, r)| r.last >= offset)
            .map(|(f, r)| (*f, *r))
    }

    /// The verdict pending for `offset`.
    fn get(&self, offset: i64) -> Option<AckKind> {
        self.run_of(offset).map(|(_, r)| r.kind)
    }

    /// Sets `offset`'s verdict, merging it with the runs beside it; returns the verdict it
    /// replaced.
    fn set(&mut self, offset: i64, kind: AckKind) -> Option<AckKind> {
        let old = self.run_of(offset);
        if let Some((first, run)) = old {
            if run.kind == kind {
                return Some(kind);
            }
            // Split the run around the offset.
            self.runs.remove(&first);
            if first < offset {
                self.runs.insert(
                    first,
                    Run {
                        last: offset - 1,
                        kind: run.kind,
                    },
                );
            }
            if offset < run.last {
                self.runs.insert(
                    offset + 1,
                    Run {
                        last: run.last,
                        kind: run.kind,
                    },
                );
            }
        } else {
            self.len += 1;
        }
        let old_kind = old.map(|(_, r)| r.kind);
        if old_kind == Some(AckKind::Renew) {
            self.renews -= 1;
        }
        if kind == AckKind::Renew {
            self.renews += 1;
        }
        self.insert_joined(offset, offset, kind);
        old_kind
    }

    /// Inserts the run `first..=last` of `kind` (its offsets hold no run), joined with the run
    /// ending just before it (the common case: verdicts in offset order) and the one starting
    /// just after, when they have the same verdict.
    fn insert_joined(&mut self, first: i64, last: i64, kind: AckKind) {
        let mut from = first;
        let mut to = last;
        if let Some((f, r)) = self.runs.range(..first).next_back()
            && first.checked_sub(1) == Some(r.last)
            && r.kind == kind
        {
            from = *f;
        }
        if let Some(next) = last.checked_add(1)
            && let Some(r) = self.runs.get(&next).copied()
            && r.kind == kind
        {
            self.runs.remove(&next);
            to = r.last;
        }
        self.runs.insert(from, Run { last: to, kind });
    }

    /// Sets `kind` (final) for every offset of `first..=last` when none of them has a
    /// verdict, merging with the runs beside it; changes nothing and says `false` otherwise.
    fn set_run(&mut self, first: i64, last: i64, kind: AckKind) -> bool {
        if self
            .runs
            .range(..=last)
            .next_back()
            .is_some_and(|(_, r)| r.last >= first)
        {
            return false;
        }
        let Some(n) = usize::try_from(last - first)
            .ok()
            .and_then(|n| n.checked_add(1))
        else {
            return false;
        };
        self.len += n;
        self.insert_joined(first, last, kind);
        true
    }

    /// Removes and returns every run outside the ranges `kept` (sorted, apart), splitting
    /// the runs that cross a kept range's edge, and leaving the Renews when `keep_renews`.
    /// Only the runs between kept ranges are visited, so a fetch step costs what it takes, not
    /// what is pending.
    fn take_outside(&mut self, kept: &[(i64, i64)], keep_renews: bool) -> Vec<(i64, Run)> {
        if kept.is_empty() && (!keep_renews || self.renews == 0) {
            self.len = 0;
            self.renews = 0;
            return std::mem::take(&mut self.runs).into_iter().collect();
        }
        let mut taken = Vec::new();
        let mut lower: Option<i64> = None;
        for &(first, last) in kept {
            if let Some(upper) = first.checked_sub(1)
                && lower.is_none_or(|l| l <= upper)
            {
                self.move_between(lower, Some(upper), keep_renews, &mut taken);
            }
            match last.checked_add(1) {
                Some(next) => lower = Some(next),
                None => return taken,
            }
        }
        self.move_between(lower, None, keep_renews, &mut taken);
        taken
    }

    /// Moves the runs from `lower` to `upper` (inclusive; `None`: unbounded) into `out`, in
    /// offset order, but for the Renews when `keep_renews`.
    fn move_between(
        &mut self,
        lower: Option<i64>,
        upper: Option<i64>,
        keep_renews: bool,
        out: &mut Vec<(i64, Run)>,
    ) {
        // A run that starts before `lower` and reaches into it is split at `lower`.
        if let Some(l) = lower
            && let Some((f, r)) = self.run_of(l)
            && f < l
        {
            self.runs.insert(f, Run { last: l - 1, ..r });
            self.runs.insert(l, r);
        }
        // A run that reaches past `upper` is split after it.
        if let Some(u) = upper
            && let Some((f, r)) = self.run_of(u)
            && r.last > u
        {
            self.runs.insert(f, Run { last: u, ..r });
            self.runs.insert(u + 1, r);
        }
        let range = (
            lower.map_or(Bound::Unbounded, Bound::Included),
            upper.map_or(Bound::Unbounded, Bound::Included),
        );
        let firsts: Vec<i64> = self
            .runs
            .range(range)
            .filter(|(_, r)| !(keep_renews && r.kind == AckKind::Renew))
            .map(|(f, _)| *f)
            .collect();
        for f in firsts {
            if let Some(r) = self.runs.remove(&f) {
                self.len -= r.len(f);
                if r.kind == AckKind::Renew {
                    self.renews -= r.len(f);
                }
                out.push((f, r));
            }
        }
    }

    /// How many offsets of `first..=last` have a final verdict.
    fn finals_in(&self, first: i64, last: i64) -> u64 {
        let start = self.run_of(first).map_or(first, |(f, _)| f);
        self.runs
            .range(start..=last)
            .filter(|(_, r)| r.kind != AckKind::Renew)
            .map(|(f, r)| {
                let (from, to) = ((*f).max(first), r.last.min(last));
                u64::try_from(to - from).map_or(0, |n| n + 1)
            })
            .sum()
    }

    /// Every pending offset and its verdict, in order (tests compare against a plain map).
    #[cfg(test)]
    fn to_map(&self) -> BTreeMap<i64, AckKind> {
        self.runs
            .iter()
            .flat_map(|(f, r)| (*f..=r.last).map(move |o| (o, r.kind)))
            .collect()
    }
}

/// Pending acknowledgements, per partition, in offset order.
#[derive(Debug, Default, Clone)]
pub struct AckLedger {
    pending: BTreeMap<TopicIdPartition, Offsets>,
    /// Acquired ranges of more than one offset, by first offset.
    held: BTreeMap<TopicIdPartition, BTreeMap<i64, HeldRange>>,
}

impl AckLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a verdict. Verdicts may arrive in any order. A final verdict (anything but
    /// Renew) replaces a pending Renew of the same offset; a second final verdict is refused.
    pub fn record(
        &mut self,
        tp: TopicIdPartition,
        offset: i64,
        kind: AckKind,
    ) -> Result<(), LedgerError> {
        let entry = self.pending.entry(tp).or_default();
        let newly_final = kind != AckKind::Renew;
        match entry.get(offset) {
            // The same verdict twice is harmless; another one is refused.
            Some(existing) if existing != AckKind::Renew => {
                return if kind == existing {
                    Ok(())
                } else {
                    Err(LedgerError::AlreadyJudged {
                        partition: tp,
                        offset,
                        existing,
                        new: kind,
                    })
                };
            }
            Some(_) if !newly_final => return Ok(()),
            _ => {
                entry.set(offset, kind);
            }
        }
        if newly_final && let Some(range) = self.range_of(tp, offset) {
            range.judged += 1;
            range.since.get_or_insert_with(Instant::now);
        }
        Ok(())
    }

    /// Records one final verdict for every offset from `first` to `last` when none of them
    /// has a verdict pending (the common case: a plugin call's records, judged alike): one
    /// look-up of the partition and one run, where recording each cost a tree search and a
    /// merge. Records nothing and says `false` otherwise (a Renew, or a pending verdict in
    /// the range): the caller records those one by one with [`AckLedger::record`].
    pub fn record_run(
        &mut self,
        tp: TopicIdPartition,
        first: i64,
        last: i64,
        kind: AckKind,
    ) -> bool {
        if kind == AckKind::Renew || last < first {
            return false;
        }
        let entry = self.pending.entry(tp).or_default();
        if !entry.set_run(first, last, kind) {
            return false;
        }
        if let Some(ranges) = self.held.get_mut(&tp) {
            let start = ranges
                .range(..=first)
                .next_back()
                .filter(|(_, r)| r.last >= first)
                .map_or(first, |(f, _)| *f);
            let mut now = None;
            for (f, r) in ranges.range_mut(start..=last) {
                let (from, to) = ((*f).max(first), r.last.min(last));
                if let Ok(n) = u64::try_from(to - from) {
                    r.judged += n + 1;
                    r.since
                        .get_or_insert_with(|| *now.get_or_insert_with(Instant::now));
                }
            }
        }
        true
    }

    /// Notes that `first..=last` of `tp` was acquired as one range, so that its verdicts go
    /// out together ([`AckLedger::take_ready`]). A range of one offset needs nothing.
    pub fn acquired(&mut self, tp: TopicIdPartition, first: i64, last: i64) {
        if last <= first {
            return;
        }
        let judged = self
            .pending
            .get(&tp)
            .map_or(0, |m| m.finals_in(first, last));
        let since = (judged > 0).then(Instant::now);
        let ranges = self.held.entry(tp).or_default();
        // Overlapping older ranges (records redelivered after their lock expired) no longer
        // describe what the broker holds.
        let stale: Vec<i64> = ranges
            .range(..=last)
            .filter(|(f, r)| r.last >= first && **f <= last)
            .map(|(f, _)| *f)
            .collect();
        for f in stale {
            ranges.remove(&f);
        }
        ranges.insert(
            first,
            HeldRange {
                last,
                judged,
                since,
            },
        );
    }

    fn range_of(&mut self, tp: TopicIdPartition, offset: i64) -> Option<&mut HeldRange> {
        self.held
            .get_mut(&tp)?
            .range_mut(..=offset)
            .next_back()
            .map(|(_, r)| r)
            .filter(|r| r.last >= offset)
    }

    /// Lets every held range go: what is pending may all be sent now (a flush).
    pub fn release_ranges(&mut self) {
        self.held.clear();
    }

    /// Whether anything of the partitions `filter` accepts may ride on a fetch now: a final
    /// verdict outside a held range, or a held range whole or waiting past [`RANGE_LINGER`].
    pub fn has_ready_where<F: Fn(&TopicIdPartition) -> bool>(
        &self,
        filter: F,
        now: Instant,
    ) -> bool {
        self.pending.iter().any(|(tp, m)| {
            if !filter(tp) {
                return false;
            }
            let Some(ranges) = self.held.get(tp).filter(|r| !r.is_empty()) else {
                return m.finals() > 0;
            };
            if ranges.iter().any(|(f, r)| r.judged > 0 && r.ready(*f, now)) {
                return true;
            }
            let judged_in_ranges: u64 = ranges.values().map(|r| r.judged).sum();
            m.finals() as u64 > judged_in_ranges
        })
    }

    /// Removes and returns what [`AckLedger::has_ready_where`] calls ready (never Renew):
    /// the final verdicts outside held ranges and those of ranges that are whole or have
    /// waited long enough; the rest stays for a later fetch.
    pub fn take_ready<F>(
        &mut self,
        mut filter: F,
        now: Instant,
    ) -> Vec<(TopicIdPartition, Vec<AckBatch>)>
    where
        F: FnMut(&TopicIdPartition) -> bool,
    {
        let mut out = Vec::new();
        for (tp, offsets) in self.pending.iter_mut() {
            if offsets.is_empty() || !filter(tp) {
                continue;
            }
            // The ranges that stay held: their offsets stay too.
            let mut kept: Vec<(i64, i64)> = Vec::new();
            if let Some(ranges) = self.held.get_mut(tp) {
                ranges.retain(|first, r| {
                    if r.ready(*first, now) {
                        false
                    } else {
                        kept.push((*first, r.last));
                        true
                    }
                });
            }
            // Only final verdicts are taken: the Renews stay.
            let taken = offsets.take_outside(&kept, true);
            if !taken.is_empty() {
                out.push((*tp, runs_to_batches(&taken)));
            }
        }
        self.pending.retain(|_, m| !m.is_empty());
        self.held.retain(|_, r| !r.is_empty());
        out
    }

    /// Number of offsets waiting to be sent.
    pub fn len(&self) -> usize {
        self.pending.values().map(|m| m.len).sum()
    }

    /// True when nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.pending.values().all(Offsets::is_empty)
    }

    /// Whether any pending verdict is a Renew (such acks need a renew request).
    pub fn has_renew(&self) -> bool {
        self.has_renew_where(|_| true)
    }

    /// Whether a pending verdict of the partitions `filter` accepts is a Renew.
    pub fn has_renew_where<F: Fn(&TopicIdPartition) -> bool>(&self, filter: F) -> bool {
        self.pending
            .iter()
            .any(|(tp, m)| filter(tp) && m.renews > 0)
    }

    /// Whether anything is pending for the partitions `filter` accepts.
    pub fn has_where<F: Fn(&TopicIdPartition) -> bool>(&self, filter: F) -> bool {
        self.pending
            .iter()
            .any(|(tp, m)| filter(tp) && !m.is_empty())
    }

    /// Removes and returns the batches of the given partitions (all when `filter` accepts all).
    /// With `include_renew` false, Renew verdicts stay in the ledger: they cannot ride on a
    /// normal fetch.
    pub fn take<F>(
        &mut self,
        mut filter: F,
        include_renew: bool,
    ) -> Vec<(TopicIdPartition, Vec<AckBatch>)>
    where
        F: FnMut(&TopicIdPartition) -> bool,
    {
        let mut out = Vec::new();
        for (tp, offsets) in self.pending.iter_mut() {
            if offsets.is_empty() || !filter(tp) {
                continue;
            }
            let taken = offsets.take_outside(&[], !include_renew);
            if !taken.is_empty() {
                out.push((*tp, runs_to_batches(&taken)));
            }
            // What was held of these ranges has gone out: nothing of them waits any more.
            self.held.remove(tp);
        }
        self.pending.retain(|_, m| !m.is_empty());
        out
    }

    /// Drops everything pending for the partitions `filter` accepts, returning how many
    /// verdicts were dropped (their session is gone, so the broker has released the records).
    pub fn drop_where<F>(&mut self, mut filter: F) -> usize
    where
        F: FnMut(&TopicIdPartition) -> bool,
    {
        let mut dropped = 0;
        self.pending.retain(|tp, m| {
            if filter(tp) {
                dropped += m.len;
                false
            } else {
                true
            }
        });
        self.held.retain(|tp, _| !filter(tp));
        dropped
    }
}

/// Turns offset → verdict into batches (see [`runs_to_batches`]).
pub fn to_batches(acks: &BTreeMap<i64, AckKind>) -> Vec<AckBatch> {
    let mut runs: Vec<(i64, Run)> = Vec::new();
    for (&offset, &kind) in acks {
        match runs.last_mut() {
            Some((_, run)) if run.kind == kind && offset.checked_sub(1) == Some(run.last) => {
                run.last = offset;
            }
            _ => runs.push((offset, Run { last: offset, kind })),
        }
    }
    runs_to_batches(&runs)
}

/// Turns runs (ascending, apart) into batches: one per stretch of consecutive offsets, with a
/// single type when the stretch is one verdict and one type per offset otherwise. Output is
/// ascending and non-overlapping by construction.
fn runs_to_batches(runs: &[(i64, Run)]) -> Vec<AckBatch> {
    let mut out: Vec<AckBatch> = Vec::new();
    // The stretch being built: its first offset and its runs.
    let mut stretch: Vec<(i64, Run)> = Vec::new();
    for &(first, run) in runs {
        if stretch
            .last()
            .is_some_and(|(_, prev)| prev.last.checked_add(1) != Some(first))
        {
            out.push(finish(&stretch));
            stretch.clear();
        }
        stretch.push((first, run));
    }
    if !stretch.is_empty() {
        out.push(finish(&stretch));
    }
    out
}

/// One batch of a stretch of consecutive runs (not empty).
fn finish(stretch: &[(i64, Run)]) -> AckBatch {
    let first_offset = stretch.first().map_or(0, |(f, _)| *f);
    let last_offset = stretch.last().map_or(0, |(_, r)| r.last);
    let kind = stretch.first().map(|(_, r)| r.kind);
    let types = if stretch.iter().all(|(_, r)| Some(r.kind) == kind) {
        kind.map(|k| vec![k.code()]).unwrap_or_default()
    } else {
        stretch
            .iter()
            .flat_map(|(f, r)| std::iter::repeat_n(r.kind.code(), r.len(*f)))
            .collect()
    };
    AckBatch {
        first_offset,
        last_offset,
        types,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tp(p: i32) -> TopicIdPartition {
        TopicIdPartition {
            topic_id: Uuid::from_u128(1),
            partition: p,
        }
    }

    #[test]
    fn uniform_runs_collapse_and_mixed_runs_list_each_offset() {
        let acks: BTreeMap<i64, AckKind> = [
            (10, AckKind::Accept),
            (11, AckKind::Accept),
            (12, AckKind::Accept),
            (20, AckKind::Accept),
            (21, AckKind::Reject),
            (22, AckKind::Gap),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            to_batches(&acks),
            vec![
                AckBatch {
                    first_offset: 10,
                    last_offset: 12,
                    types: vec![1]
                },
                AckBatch {
                    first_offset: 20,
                    last_offset: 22,
                    types: vec![1, 3, 0]
                },
            ]
        );
    }

    #[test]
    fn verdicts_in_any_order_give_ascending_batches() {
        let mut l = AckLedger::new();
        for o in [5, 3, 4, 9, 1] {
            l.record(tp(0), o, AckKind::Accept).expect("fresh");
        }
        let taken = l.take(|_| true, true);
        assert_eq!(taken.len(), 1);
        assert_eq!(
            taken[0].1,
            vec![
                AckBatch {
                    first_offset: 1,
                    last_offset: 1,
                    types: vec![1]
                },
                AckBatch {
                    first_offset: 3,
                    last_offset: 5,
                    types: vec![1]
                },
                AckBatch {
                    first_offset: 9,
                    last_offset: 9,
                    types: vec![1]
                },
            ]
        );
        assert!(l.is_empty());
    }

    #[test]
    fn a_second_final_verdict_is_refused_but_renew_can_be_overridden() {
        let mut l = AckLedger::new();
        l.record(tp(0), 1, AckKind::Renew).expect("renew");
        l.record(tp(0), 1, AckKind::Accept)
            .expect("final after renew");
        l.record(tp(0), 1, AckKind::Accept)
            .expect("same verdict twice is harmless");
        let e = l.record(tp(0), 1, AckKind::Reject).expect_err("conflict");
        assert!(matches!(
            e,
            LedgerError::AlreadyJudged {
                existing: AckKind::Accept,
                new: AckKind::Reject,
                ..
            }
        ));
    }

    #[test]
    fn renews_stay_behind_when_a_normal_fetch_takes_acks() {
        let mut l = AckLedger::new();
        l.record(tp(0), 1, AckKind::Accept).expect("ok");
        l.record(tp(0), 2, AckKind::Renew).expect("ok");
        let normal = l.take(|_| true, false);
        assert_eq!(
            normal[0].1,
            vec![AckBatch {
                first_offset: 1,
                last_offset: 1,
                types: vec![1]
            }]
        );
        assert!(l.has_renew());
        let renew = l.take(|_| true, true);
        assert_eq!(
            renew[0].1,
            vec![AckBatch {
                first_offset: 2,
                last_offset: 2,
                types: vec![4]
            }]
        );
        assert!(l.is_empty());
    }

    #[test]
    fn verdicts_of_an_acquired_range_go_out_together() {
        let now = Instant::now();
        let mut l = AckLedger::new();
        l.acquired(tp(0), 0, 9);
        l.acquired(tp(0), 10, 19);
        for o in 0..15 {
            l.record(tp(0), o, AckKind::Accept).expect("fresh");
        }
        // A verdict outside any range is ready at once.
        l.record(tp(1), 7, AckKind::Reject).expect("fresh");
        assert!(l.has_ready_where(|_| true, now));
        let taken = l.take_ready(|_| true, now);
        // 0-9 is whole; 10-14 wait for 15-19.
        assert_eq!(
            taken,
            vec![
                (
                    tp(0),
                    vec![AckBatch {
                        first_offset: 0,
                        last_offset: 9,
                        types: vec![1]
                    }]
                ),
                (
                    tp(1),
                    vec![AckBatch {
                        first_offset: 7,
                        last_offset: 7,
                        types: vec![3]
                    }]
                ),
            ]
        );
        assert_eq!(l.len(), 5);
        assert!(!l.has_ready_where(|_| true, now));
        assert!(l.take_ready(|_| true, now).is_empty());
        // A Renew does not complete a range; the final verdicts do.
        l.record(tp(0), 15, AckKind::Renew).expect("renew");
        assert!(!l.has_ready_where(|_| true, now));
        for o in 15..20 {
            l.record(tp(0), o, AckKind::Release).expect("final");
        }
        assert!(l.has_ready_where(|_| true, now));
        let taken = l.take_ready(|_| true, now);
        assert_eq!(taken[0].1.len(), 1);
        assert_eq!(
            (taken[0].1[0].first_offset, taken[0].1[0].last_offset),
            (10, 19)
        );
        assert!(l.is_empty());
    }

    #[test]
    fn a_partly_judged_range_waits_no_longer_than_the_linger() {
        let mut l = AckLedger::new();
        l.acquired(tp(0), 100, 1099);
        l.record(tp(0), 100, AckKind::Accept).expect("fresh");
        let now = Instant::now();
        assert!(!l.has_ready_where(|_| true, now));
        let later = now + RANGE_LINGER + Duration::from_millis(1);
        assert!(l.has_ready_where(|_| true, later));
        let taken = l.take_ready(|_| true, later);
        assert_eq!(taken[0].1[0].first_offset, 100);
        // Later verdicts of the same range are no longer held.
        l.record(tp(0), 101, AckKind::Accept).expect("fresh");
        assert!(l.has_ready_where(|_| true, now));
        // A flush lets every range go.
        l.acquired(tp(0), 2000, 2999);
        l.record(tp(0), 2000, AckKind::Accept).expect("fresh");
        assert_eq!(
            l.take_ready(|_| true, now)
                .iter()
                .map(|(_, b)| b.len())
                .sum::<usize>(),
            1
        );
        l.release_ranges();
        assert!(l.has_ready_where(|_| true, now));
        assert_eq!(l.take_ready(|_| true, now)[0].1[0].first_offset, 2000);
    }

    #[test]
    fn a_range_acquired_again_replaces_the_one_it_overlaps() {
        let now = Instant::now();
        let mut l = AckLedger::new();
        l.acquired(tp(0), 0, 9);
        l.record(tp(0), 3, AckKind::Accept).expect("fresh");
        // The lock expired and 2-5 came back as a range of their own: 3 is judged in it.
        l.acquired(tp(0), 2, 5);
        for o in [2, 4, 5] {
            l.record(tp(0), o, AckKind::Accept).expect("fresh");
        }
        let taken = l.take_ready(|_| true, now);
        assert_eq!(
            (taken[0].1[0].first_offset, taken[0].1[0].last_offset),
            (2, 5)
        );
        // A full take and a drop forget the partition's ranges.
        l.acquired(tp(0), 10, 19);
        l.record(tp(0), 10, AckKind::Accept).expect("fresh");
        assert_eq!(l.take(|_| true, false).len(), 1);
        l.record(tp(0), 11, AckKind::Accept).expect("fresh");
        assert!(l.has_ready_where(|_| true, now));
        l.acquired(tp(1), 0, 9);
        l.record(tp(1), 0, AckKind::Accept).expect("fresh");
        assert_eq!(l.drop_where(|t| *t == tp(1)), 1);
        l.record(tp(1), 1, AckKind::Accept).expect("fresh");
        assert!(l.has_ready_where(|t| *t == tp(1), now));
    }

    #[test]
    fn filter_takes_only_some_partitions_and_drop_counts() {
        let mut l = AckLedger::new();
        l.record(tp(0), 1, AckKind::Accept).expect("ok");
        l.record(tp(1), 1, AckKind::Release).expect("ok");
        l.record(tp(1), 2, AckKind::Release).expect("ok");
        let t = l.take(|p| p.partition == 0, true);
        assert_eq!(t.len(), 1);
        assert_eq!(l.len(), 2);
        assert_eq!(l.drop_where(|p| p.partition == 1), 2);
        assert!(l.is_empty());
    }

    fn kind() -> impl Strategy<Value = AckKind> {
        prop_oneof![
            Just(AckKind::Gap),
            Just(AckKind::Accept),
            Just(AckKind::Release),
            Just(AckKind::Reject),
            Just(AckKind::Renew)
        ]
    }

    proptest! {
        /// Any verdicts over any acquired offsets give batches the broker accepts (ascending,
        /// non-overlapping, type lists of length 1 or the range length) that cover exactly the
        /// judged offsets with exactly their verdicts.
        #[test]
        fn batches_are_valid_and_cover_exactly_the_judged_offsets(
            verdicts in proptest::collection::vec((0i64..200, kind()), 0..120),
            base in 0i64..1_000_000_000,
        ) {
            let mut ledger = AckLedger::new();
            let mut expected = BTreeMap::new();
            for (o, k) in &verdicts {
                if ledger.record(tp(0), base + o, *k).is_ok() {
                    let e = expected.entry(base + o).or_insert(*k);
                    if *e == AckKind::Renew { *e = *k; }
                }
            }
            let taken = ledger.take(|_| true, true);
            let batches: Vec<AckBatch> = taken.into_iter().flat_map(|(_, b)| b).collect();
            let mut covered = BTreeMap::new();
            let mut prev_last: Option<i64> = None;
            for b in &batches {
                prop_assert!(b.first_offset <= b.last_offset);
                if let Some(p) = prev_last { prop_assert!(b.first_offset > p, "ascending, no overlap"); }
                prev_last = Some(b.last_offset);
                let len = (b.last_offset - b.first_offset + 1) as usize;
                prop_assert!(b.types.len() == 1 || b.types.len() == len);
                prop_assert!(!b.types.is_empty());
                for (i, o) in (b.first_offset..=b.last_offset).enumerate() {
                    let t = if b.types.len() == 1 { b.types[0] } else { b.types[i] };
                    prop_assert!(covered.insert(o, t).is_none());
                }
            }
            let want: BTreeMap<i64, i8> = expected.iter().map(|(o, k)| (*o, k.code())).collect();
            prop_assert_eq!(covered, want);
            prop_assert!(ledger.is_empty());
        }

        /// A fetch step takes exactly the final verdicts outside the ranges still held (a
        /// range is held until every offset in it has a final verdict, within the linger),
        /// and leaves everything else: the Renews and the held ranges' verdicts.
        #[test]
        fn a_fetch_step_takes_exactly_what_no_held_range_keeps(
            ranges in proptest::collection::vec((0i64..300, 1i64..40), 0..12),
            verdicts in proptest::collection::vec((0i64..340, kind()), 0..400),
        ) {
            let mut ledger = AckLedger::new();
            for (first, len) in &ranges {
                ledger.acquired(tp(0), *first, first + len);
            }
            let mut pending: BTreeMap<i64, AckKind> = BTreeMap::new();
            for (o, k) in &verdicts {
                if ledger.record(tp(0), *o, *k).is_ok() {
                    let e = pending.entry(*o).or_insert(*k);
                    if *e == AckKind::Renew { *e = *k; }
                }
            }
            let held: Vec<(i64, i64)> = ledger.held.get(&tp(0)).map_or_else(Vec::new, |r| {
                r.iter().map(|(f, r)| (*f, r.last)).collect()
            });
            let whole = |f: i64, l: i64| (f..=l).all(|o| pending.get(&o).is_some_and(|k| *k != AckKind::Renew));
            let kept: Vec<(i64, i64)> = held.into_iter().filter(|(f, l)| !whole(*f, *l)).collect();
            let inside = |o: i64| kept.iter().any(|(f, l)| (*f..=*l).contains(&o));
            let want_taken: BTreeMap<i64, AckKind> = pending.iter()
                .filter(|(o, k)| **k != AckKind::Renew && !inside(**o))
                .map(|(o, k)| (*o, *k)).collect();
            let want_left: BTreeMap<i64, AckKind> = pending.iter()
                .filter(|(o, _)| !want_taken.contains_key(o))
                .map(|(o, k)| (*o, *k)).collect();
            let taken = ledger.take_ready(|_| true, Instant::now());
            let mut got = BTreeMap::new();
            for b in taken.into_iter().flat_map(|(_, b)| b) {
                for (i, o) in (b.first_offset..=b.last_offset).enumerate() {
                    got.insert(o, if b.types.len() == 1 { b.types[0] } else { b.types[i] });
                }
            }
            let want_codes: BTreeMap<i64, i8> = want_taken.iter().map(|(o, k)| (*o, k.code())).collect();
            prop_assert_eq!(got, want_codes);
            let left = ledger.pending.get(&tp(0)).map_or_else(BTreeMap::new, |m| m.to_map());
            prop_assert_eq!(left, want_left);
        }

        /// A run recorded at once leaves the ledger as recording its offsets one by one would
        /// (the same pending verdicts, the same held ranges with the same counts), and is
        /// refused, changing nothing, when any offset of it has a verdict pending.
        #[test]
        fn a_run_records_as_its_offsets_one_by_one(
            ranges in proptest::collection::vec((0i64..120, 1i64..30), 0..6),
            before in proptest::collection::vec((0i64..150, kind()), 0..40),
            runs in proptest::collection::vec((0i64..150, 0i64..20, kind()), 1..20),
        ) {
            let mut bulk = AckLedger::new();
            for (first, len) in &ranges {
                bulk.acquired(tp(0), *first, first + len);
            }
            for (o, k) in &before {
                let _ = bulk.record(tp(0), *o, *k);
            }
            let mut single = bulk.clone();
            for (first, len, k) in &runs {
                let last = first + len;
                let free = bulk.pending.get(&tp(0)).is_none_or(|m| (*first..=last).all(|o| m.get(o).is_none()));
                let was = bulk.pending.get(&tp(0)).map(Offsets::to_map);
                let recorded = bulk.record_run(tp(0), *first, last, *k);
                prop_assert_eq!(recorded, free && *k != AckKind::Renew);
                if recorded {
                    for o in *first..=last {
                        prop_assert!(single.record(tp(0), o, *k).is_ok());
                    }
                } else {
                    prop_assert_eq!(bulk.pending.get(&tp(0)).map(Offsets::to_map), was);
                }
                let counts = |l: &AckLedger| l.held.get(&tp(0)).map(|r| {
                    r.iter().map(|(f, r)| (*f, r.last, r.judged, r.since.is_some())).collect::<Vec<_>>()
                });
                prop_assert_eq!(counts(&bulk), counts(&single));
                let (b, s) = (bulk.pending.get(&tp(0)), single.pending.get(&tp(0)));
                prop_assert_eq!(b.map(Offsets::to_map), s.map(Offsets::to_map));
                prop_assert_eq!(b.map(|m| (m.len, m.renews, m.runs.len())), s.map(|m| (m.len, m.renews, m.runs.len())));
            }
        }

        /// The runs hold exactly what a plain map of offset → verdict would, through any mix of
        /// verdicts, fetch-time takes around held ranges and full takes: nothing overlaps,
        /// the counts agree, and what is taken is what the map would give.
        #[test]
        fn runs_agree_with_a_map_of_offsets(
            ops in proptest::collection::vec((0u8..6, -3i64..80, 0i64..12, kind()), 0..300),
        ) {
            let mut ledger = AckLedger::new();
            let mut model: BTreeMap<i64, AckKind> = BTreeMap::new();
            let start = Instant::now();
            for (i, (op, o, len, k)) in ops.iter().enumerate() {
                let now = start + Duration::from_millis(10 * i as u64);
                match op {
                    0..=2 => {
                        let want = !model.get(o).is_some_and(|e| *e != AckKind::Renew && *e != *k);
                        prop_assert_eq!(ledger.record(tp(0), *o, *k).is_ok(), want);
                        if want && !(model.contains_key(o) && *k == AckKind::Renew) {
                            model.insert(*o, *k);
                        }
                    }
                    3 => ledger.acquired(tp(0), *o, *o + *len),
                    4 => {
                        let kept: Vec<(i64, i64)> = ledger.held.get(&tp(0)).map_or_else(Vec::new, |r| {
                            r.iter().filter(|(f, r)| !r.ready(**f, now)).map(|(f, r)| (*f, r.last)).collect()
                        });
                        let taken = ledger.take_ready(|_| true, now);
                        let mut got = BTreeMap::new();
                        for b in taken.into_iter().flat_map(|(_, b)| b) {
                            for (i, o) in (b.first_offset..=b.last_offset).enumerate() {
                                got.insert(o, if b.types.len() == 1 { b.types[0] } else { b.types[i] });
                            }
                        }
                        let inside = |o: i64| kept.iter().any(|(f, l)| (*f..=*l).contains(&o));
                        let want: BTreeMap<i64, i8> = model.iter()
                            .filter(|(o, k)| **k != AckKind::Renew && !inside(**o))
                            .map(|(o, k)| (*o, k.code())).collect();
                        model.retain(|o, k| *k == AckKind::Renew || inside(*o));
                        prop_assert_eq!(got, want);
                    }
                    _ => {
                        let all = *len % 2 == 0;
                        let taken = ledger.take(|_| true, all);
                        let n: usize = taken.iter().flat_map(|(_, b)| b).map(|b| (b.last_offset - b.first_offset + 1) as usize).sum();
                        let want = model.values().filter(|k| all || **k != AckKind::Renew).count();
                        prop_assert_eq!(n, want);
                        model.retain(|_, k| !all && *k == AckKind::Renew);
                    }
                }
                let m = ledger.pending.get(&tp(0)).cloned().unwrap_or_default();
                prop_assert_eq!(m.to_map(), model.clone());
                prop_assert_eq!(m.len, model.len());
                prop_assert_eq!(m.renews, model.values().filter(|k| **k == AckKind::Renew).count());
                let mut prev: Option<i64> = None;
                for (f, r) in &m.runs {
                    prop_assert!(*f <= r.last);
                    prop_assert!(prev.is_none_or(|p| p < *f), "runs overlap");
                    prev = Some(r.last);
                }
            }
        }

        /// The kept counts of Renew verdicts agree with the verdicts themselves through any
        /// mix of records, ranges, fetch-time takes, renew takes and drops.
        #[test]
        fn renew_counts_agree_with_the_verdicts(
            ops in proptest::collection::vec((0u8..5, 0i32..2, 0i64..60, kind()), 0..200),
        ) {
            let mut ledger = AckLedger::new();
            let start = Instant::now();
            for (i, (op, p, o, k)) in ops.iter().enumerate() {
                let now = start + Duration::from_millis(100 * i as u64);
                match op {
                    0 | 1 => { let _ = ledger.record(tp(*p), *o, *k); }
                    2 => ledger.acquired(tp(*p), *o, *o + 7),
                    3 => { ledger.take_ready(|t| t.partition == *p, now); }
                    _ => { ledger.take(|t| t.partition == *p, *o % 2 == 0); }
                }
                for (t, m) in &ledger.pending {
                    let renews = m.to_map().values().filter(|k| **k == AckKind::Renew).count();
                    prop_assert_eq!(m.renews, renews, "partition {:?}", t);
                }
                prop_assert_eq!(
                    ledger.has_renew(),
                    ledger.pending.values().any(|m| m.to_map().values().any(|k| *k == AckKind::Renew))
                );
            }
        }
    }
}

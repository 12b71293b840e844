//! Pure decisions of the engine, with their tests beside them: what a ShareFetch asks for
//! ([`fetch_ask`]), how many records a paced consumer keeps ([`paced_limit`]), which acquired
//! offsets without a record are Gap or released ([`plan_unrecorded`]), which partitions a
//! leader's requests serve ([`served`]) and which moved to another leader ([`moved_away`]), and
//! how a response's per-partition results and acknowledgement batches are read. No I/O, no
//! locks: the tasks act on what these return.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use sharehost_kafka::protocol::share::AckBatch;

use super::types::AcquireMode;
use crate::ledger::{AckKind, TopicIdPartition};

/// Whether the acquired range `first..=last` covers only part of the producer batch it starts
/// in (`spans`: the response's batches, in offset order).
pub(super) fn cuts_a_batch(spans: &[(i64, i64)], first: i64, last: i64) -> bool {
    let at = spans.partition_point(|&(_, end)| end < first);
    spans
        .get(at)
        .is_some_and(|&(start, end)| start <= first && (start < first || end > last))
}

/// What one ShareFetch asks for: its acquire mode and MaxRecords, and how many records it
/// can bring at most (the room it reserves).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FetchAsk {
    /// Record-limit acquisition (ShareFetch v2) rather than whole batches.
    pub(super) record_limit: bool,
    /// The MaxRecords to send.
    pub(super) max_records: usize,
    /// The most records the answer can bring: the room the fetch reserves.
    pub(super) at_most: usize,
}

/// Chooses [`FetchAsk`] for `budget` records of room: `largest_batch` is the most records one
/// producer batch has spanned so far (0: none seen), `max_records` the configured cap and
/// `v2` whether the broker knows record-limit mode.
pub(super) fn fetch_ask(
    mode: AcquireMode,
    budget: usize,
    largest_batch: usize,
    max_records: usize,
    v2: bool,
) -> FetchAsk {
    let max_records = max_records.max(1).min(budget.max(1));
    let whole = |max_records: usize| FetchAsk {
        record_limit: false,
        max_records,
        // A batch-optimized fetch stops once MaxRecords are reached, with the last batch whole.
        at_most: max_records.saturating_add(largest_batch.saturating_sub(1)),
    };
    let limited = FetchAsk {
        record_limit: true,
        max_records,
        at_most: max_records,
    };
    match mode {
        AcquireMode::BatchOptimized => whole(max_records),
        AcquireMode::RecordLimit if v2 => limited,
        AcquireMode::RecordLimit => whole(max_records),
        AcquireMode::Fitted if !v2 => whole(max_records),
        AcquireMode::Fitted => {
            if largest_batch == 0 || budget < largest_batch {
                return limited;
            }
            whole(max_records.min(budget - largest_batch + 1))
        }
    }
}

/// Which leader serves each partition (looked up per record of every batch, hence the fast
/// hasher).
pub(super) type Route = foldhash::HashMap<TopicIdPartition, i32>;

/// How many records a paced consumer keeps acquired: what it judges within `horizon` at
/// `rate` per second, between `floor` and `max`.
pub(super) fn paced_limit(rate: f64, horizon: Duration, floor: usize, max: usize) -> usize {
    let judged = (rate * horizon.as_secs_f64()).ceil();
    let judged = if judged.is_finite() && judged < max as f64 {
        judged as usize
    } else {
        max
    };
    judged.max(floor).min(max)
}

/// Per-partition (error code, message) of a response, keyed by partition.
pub(super) fn by_partition<'a, P: 'a>(
    topics: impl Iterator<Item = (uuid::Uuid, &'a [P])>,
    field: impl Fn(&P) -> (i32, i16, Option<String>),
) -> HashMap<TopicIdPartition, (i16, Option<String>)> {
    topics
        .flat_map(|(topic_id, parts)| parts.iter().map(move |p| (topic_id, p)))
        .map(|(topic_id, p)| {
            let (partition, code, message) = field(p);
            (
                TopicIdPartition {
                    topic_id,
                    partition,
                },
                (code, message),
            )
        })
        .collect()
}

/// Offsets of `kind` among the batches.
pub(super) fn count_type(acks: &[(TopicIdPartition, Vec<AckBatch>)], kind: AckKind) -> u64 {
    acks.iter()
        .flat_map(|(_, b)| b.iter())
        .map(|b| {
            if b.types.len() == 1 {
                if b.types[0] == kind.code() {
                    (b.last_offset - b.first_offset + 1) as u64
                } else {
                    0
                }
            } else {
                b.types.iter().filter(|t| **t == kind.code()).count() as u64
            }
        })
        .sum()
}

/// The partitions whose verdicts `leader`'s requests carry: those it should serve now, those
/// still in its session (their verdicts ride on the request that forgets them), and those last
/// routed to it and no longer assigned to this member (the records it still held when the
/// partition moved to another member stay acquired by this one until judged: their verdicts go
/// to this leader, or they would wait out their lock and be judged again elsewhere). Never one
/// routed to another leader: its leadership moved, the old leader would refuse the verdicts
/// and the new leader's session owns the partition now.
pub(super) fn served(
    leader: i32,
    wanted: &BTreeSet<TopicIdPartition>,
    in_session: &BTreeSet<TopicIdPartition>,
    route: &Route,
) -> BTreeSet<TopicIdPartition> {
    let routed_here = route
        .iter()
        .filter(|(_, l)| **l == leader)
        .map(|(tp, _)| tp);
    wanted
        .iter()
        .chain(in_session)
        .filter(|tp| route.get(tp).is_none_or(|l| *l == leader))
        .chain(routed_here)
        .copied()
        .collect()
}

/// Partitions a new mapping gives to another leader than `route` does, grouped by the leader
/// they leave.
pub(super) fn moved_away(
    route: &Route,
    by_leader: &BTreeMap<i32, BTreeSet<TopicIdPartition>>,
) -> BTreeMap<i32, BTreeSet<TopicIdPartition>> {
    let mut moved: BTreeMap<i32, BTreeSet<TopicIdPartition>> = BTreeMap::new();
    for (leader, partitions) in by_leader {
        for tp in partitions {
            if let Some(old) = route.get(tp)
                && old != leader
            {
                moved.entry(*old).or_default().insert(*tp);
            }
        }
    }
    moved
}

/// Most offsets without a record (Gaps, and offsets released because the response has no batch
/// for them) the engine records for one partition of one response. An honest broker acquires
/// only offsets its response covers, mostly with records; a hostile one can claim
/// `first..=i64::MAX`, and walking that offset by offset would stall the engine and fill the
/// ledger. Offsets beyond the bound are left alone: the broker's acquisition lock returns them
/// after its timeout, and the next fetch acquires them again, so nothing is lost; a compacted
/// partition with more gaps than this in one response is acknowledged over several fetches.
pub const MAX_UNRECORDED_OFFSETS: usize = 1 << 16;

/// What the engine does with the acquired offsets of one partition's response that have no
/// record (records themselves are delivered separately).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Unrecorded {
    /// Up to the last offset the response's complete batches cover, without a record
    /// (compaction, a transaction marker, a batch removed whole): acknowledged as Gap, as the
    /// Java client does. The broker read the log there and found nothing.
    pub(super) gaps: Vec<i64>,
    /// Past the last offset the response covers (a batch cut short at the byte limit, or a
    /// lying broker): released, so they are delivered again; never Gap-acked, which would
    /// archive records nobody saw.
    pub(super) release: Vec<i64>,
    /// Offsets past the budget: not walked, left to the acquisition lock timeout.
    pub(super) left_alone: u64,
}

/// Splits acquired `ranges` (first, last) at the last offset the `spans` of the response's
/// complete batches cover, recording at most `budget` offsets without a record (see
/// [`MAX_UNRECORDED_OFFSETS`]). `present` holds the offsets that have a record, ascending.
/// Work is bounded by the budget plus the records present, whatever the ranges claim; a
/// range whose every offset has a record (the common case) costs two binary searches.
pub(super) fn plan_unrecorded(
    ranges: &[(i64, i64)],
    spans: &[(i64, i64)],
    present: &[i64],
    budget: usize,
) -> Unrecorded {
    let covered_to = spans.iter().map(|&(_, end)| end).max();
    let mut out = Unrecorded::default();
    let mut left = budget;
    // Walks `from..=to`, sending each offset without a record to the gaps or the releases.
    let mut walk = |from: i64, to: i64, gap: bool, out: &mut Unrecorded| {
        let mut at = present.partition_point(|&p| p < from);
        let end = present.partition_point(|&p| p <= to);
        if u128::from(to.abs_diff(from)) + 1 == (end - at) as u128 {
            return; // every offset has its record
        }
        let mut o = from;
        loop {
            // `present` is ascending: step past what lies before `o`, then look.
            while at < end && present[at] < o {
                at += 1;
            }
            if at == end || present[at] != o {
                if left == 0 {
                    out.left_alone = out
                        .left_alone
                        .saturating_add(to.abs_diff(o).saturating_add(1));
                    return;
                }
                left -= 1;
                if gap {
                    out.gaps.push(o);
                } else {
                    out.release.push(o);
                }
            }
            match o.checked_add(1) {
                Some(next) if next <= to => o = next,
                _ => return,
            }
        }
    };
    for &(first, last) in ranges {
        if first > last {
            continue;
        }
        match covered_to {
            Some(end) if end >= last => walk(first, last, true, &mut out),
            Some(end) if end >= first => {
                walk(first, end, true, &mut out);
                walk(end + 1, last, false, &mut out);
            }
            _ => walk(first, last, false, &mut out),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_cuts_a_batch_when_it_covers_only_part_of_it() {
        let spans = [(0, 99), (100, 199), (200, 200)];
        assert!(!cuts_a_batch(&spans, 0, 99));
        assert!(!cuts_a_batch(&spans, 0, 199));
        assert!(!cuts_a_batch(&spans, 200, 200));
        assert!(cuts_a_batch(&spans, 0, 49));
        assert!(cuts_a_batch(&spans, 150, 150));
        assert!(cuts_a_batch(&spans, 50, 120));
        // A range the response has no batch for is not counted here (plan_unrecorded's job).
        assert!(!cuts_a_batch(&spans, 500, 600));
    }

    #[test]
    fn a_fitted_fetch_asks_for_whole_batches_only_when_the_largest_fits_the_room() {
        let ask = |budget, largest| fetch_ask(AcquireMode::Fitted, budget, largest, 10_000, true);
        // Nothing seen yet: record-limit, exactly the room.
        assert_eq!(
            ask(2500, 0),
            FetchAsk {
                record_limit: true,
                max_records: 2500,
                at_most: 2500
            }
        );
        // Batches of 2,380: whole batches, MaxRecords lowered so the last one still fits.
        let whole = ask(5000, 2380);
        assert!(!whole.record_limit);
        assert_eq!(whole.max_records, 5000 - 2380 + 1);
        assert_eq!(whole.at_most, 5000);
        // A room smaller than one batch: record-limit again (the bound is kept).
        assert!(ask(2000, 2380).record_limit);
        assert_eq!(ask(2000, 2380).at_most, 2000);
        // The configured cap still applies, and what it can bring is reserved.
        let capped = fetch_ask(AcquireMode::Fitted, 50_000, 100, 500, true);
        assert_eq!(
            (capped.record_limit, capped.max_records, capped.at_most),
            (false, 500, 599)
        );
        // v1 brokers know whole batches only.
        assert!(!fetch_ask(AcquireMode::Fitted, 2000, 2380, 10_000, false).record_limit);
        assert!(!fetch_ask(AcquireMode::RecordLimit, 2000, 0, 10_000, false).record_limit);
        assert!(fetch_ask(AcquireMode::RecordLimit, 5000, 100, 10_000, true).record_limit);
    }

    #[test]
    fn a_huge_acquired_range_is_not_walked_offset_by_offset() {
        // A broker claims 0..=i64::MAX with one 10-offset batch holding records 0-4: the batch's
        // other offsets are Gaps, a bounded number of the rest is released, the rest left to
        // the lock timeout. The old loop walked all 2^63 offsets into the ledger.
        let plan = plan_unrecorded(&[(0, i64::MAX)], &[(0, 9)], &[0, 1, 2, 3, 4], 100);
        assert_eq!(plan.gaps, (5..=9).collect::<Vec<_>>());
        assert_eq!(plan.release, (10..105).collect::<Vec<_>>());
        assert_eq!(plan.left_alone, (i64::MAX - 105 + 1) as u64);
    }

    #[test]
    fn a_range_whose_every_offset_has_its_record_plans_nothing() {
        let present: Vec<i64> = (100..600).collect();
        assert_eq!(
            plan_unrecorded(&[(100, 349), (350, 599)], &[(100, 599)], &present, 64),
            Unrecorded::default()
        );
        // One offset short of full: the walk finds exactly that one.
        let holed: Vec<i64> = present.iter().copied().filter(|&o| o != 420).collect();
        assert_eq!(
            plan_unrecorded(&[(100, 599)], &[(100, 599)], &holed, 64).gaps,
            vec![420]
        );
    }

    #[test]
    fn honest_acquired_ranges_gap_only_offsets_their_batches_cover() {
        // Compaction left offset 3 without a record; a transaction marker batch covers 10.
        let plan = plan_unrecorded(
            &[(0, 10)],
            &[(0, 9), (10, 10)],
            &[0, 1, 2, 4, 5, 6, 7, 8, 9],
            64,
        );
        assert_eq!(
            plan,
            Unrecorded {
                gaps: vec![3, 10],
                release: vec![],
                left_alone: 0
            }
        );
        // A batch removed whole by compaction (10-19), and offsets before the first batch the
        // log returned (5-7): no records there, so Gaps, as before.
        let plan = plan_unrecorded(
            &[(5, 29)],
            &[(8, 9), (20, 29)],
            &[8, 9, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29],
            64,
        );
        assert_eq!(
            plan.gaps,
            vec![5, 6, 7, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
        );
        assert!(plan.release.is_empty());
        // A batch cut short at the byte limit (11-14 acquired, no complete batch): released,
        // never Gap-acked, so those records are delivered again.
        let plan = plan_unrecorded(&[(0, 14)], &[(0, 9)], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 64);
        assert_eq!(plan.gaps, Vec::<i64>::new());
        assert_eq!(plan.release, vec![10, 11, 12, 13, 14]);
        // At the very top of the offset space nothing overflows.
        let top = plan_unrecorded(
            &[(i64::MAX - 1, i64::MAX)],
            &[(i64::MAX - 1, i64::MAX)],
            &[],
            64,
        );
        assert_eq!(top.gaps, vec![i64::MAX - 1, i64::MAX]);
        // Reversed and empty ranges are nothing.
        assert_eq!(
            plan_unrecorded(&[(5, 4)], &[(0, 9)], &[], 64),
            Unrecorded::default()
        );
    }

    fn tp(partition: i32) -> TopicIdPartition {
        TopicIdPartition {
            topic_id: uuid::Uuid::from_u128(7),
            partition,
        }
    }

    fn set(ps: &[i32]) -> BTreeSet<TopicIdPartition> {
        ps.iter().map(|p| tp(*p)).collect()
    }

    #[test]
    fn a_moved_partition_is_served_by_its_new_leader_only() {
        // Partition 0 moved from leader 1 to leader 2; leader 1's session still lists it
        // until its next fetch forgets it. Partition 1 was unassigned but still leads on 1.
        let route: Route = [(tp(0), 2), (tp(1), 1), (tp(2), 1)].into_iter().collect();
        let old = served(1, &set(&[2]), &set(&[0, 1, 2]), &route);
        assert_eq!(
            old,
            set(&[1, 2]),
            "the old leader keeps only what it still leads"
        );
        let new = served(2, &set(&[0]), &BTreeSet::new(), &route);
        assert_eq!(new, set(&[0]));
        // A partition nobody routed yet (first assignment) is served by whoever wants it.
        assert_eq!(served(3, &set(&[9]), &BTreeSet::new(), &route), set(&[9]));
        // Partition 1 left this member and leader 1's session forgot it, but records this
        // member held of it are judged later: leader 1 still carries their verdicts.
        assert_eq!(served(1, &set(&[2]), &set(&[2]), &route), set(&[1, 2]));
    }

    #[test]
    fn moves_are_found_per_old_leader() {
        let route: Route = [(tp(0), 1), (tp(1), 1), (tp(2), 3)].into_iter().collect();
        let by_leader: BTreeMap<i32, BTreeSet<TopicIdPartition>> =
            [(2, set(&[0, 1])), (3, set(&[2, 4]))].into();
        let moved = moved_away(&route, &by_leader);
        assert_eq!(
            moved,
            [(1, set(&[0, 1]))].into(),
            "new partitions and stayers are no moves"
        );
    }
}

//! The independent record ledger of the fault-injection suite: the ids a test produced, against
//! the ids that ended accepted, rejected or dead-lettered as seen by an observer outside the
//! engine (a plugin logging what it judged, the dead-letter topic, the broker's confirmed
//! acknowledgements). It proves nothing was lost and counts the duplicates at-least-once allows.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::Write as _;

/// What happened to every produced record in one fault scenario.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    name: String,
    produced: BTreeSet<String>,
    accepted: BTreeMap<String, u32>,
    rejected: BTreeMap<String, u32>,
    dead_lettered: BTreeMap<String, u32>,
}

impl Ledger {
    /// A ledger for scenario `name` over the ids the test produced.
    pub fn new(name: &str, produced: impl IntoIterator<Item = String>) -> Ledger {
        Ledger {
            name: name.to_owned(),
            produced: produced.into_iter().collect(),
            ..Ledger::default()
        }
    }

    /// Records that `id` was accepted once more.
    pub fn accepted(&mut self, id: impl Into<String>) {
        *self.accepted.entry(id.into()).or_default() += 1;
    }

    /// Records that `id` was rejected once more (a final verdict, dead-lettered or not).
    pub fn rejected(&mut self, id: impl Into<String>) {
        *self.rejected.entry(id.into()).or_default() += 1;
    }

    /// Records that `id` was found in the dead-letter topic once more.
    pub fn dead_lettered(&mut self, id: impl Into<String>) {
        *self.dead_lettered.entry(id.into()).or_default() += 1;
    }

    /// How many distinct ids were produced.
    pub fn produced(&self) -> usize {
        self.produced.len()
    }

    /// Produced ids with no final fate: neither accepted, rejected nor dead-lettered.
    pub fn lost(&self) -> Vec<&str> {
        self.produced
            .iter()
            .filter(|id| {
                !self.accepted.contains_key(*id)
                    && !self.rejected.contains_key(*id)
                    && !self.dead_lettered.contains_key(*id)
            })
            .map(String::as_str)
            .collect()
    }

    /// Ids that were judged or dead-lettered but never produced (a decoding or test bug).
    pub fn unknown(&self) -> Vec<&str> {
        self.accepted
            .keys()
            .chain(self.rejected.keys())
            .chain(self.dead_lettered.keys())
            .filter(|id| !self.produced.contains(*id))
            .map(String::as_str)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// Final verdicts beyond the first for the same id (accepted or rejected again after a
    /// redelivery), plus dead-letter copies beyond the first.
    pub fn duplicates(&self) -> u64 {
        let judged: BTreeSet<&String> = self.accepted.keys().chain(self.rejected.keys()).collect();
        let verdicts = judged
            .into_iter()
            .map(|id| {
                let n = self.accepted.get(id).copied().unwrap_or(0)
                    + self.rejected.get(id).copied().unwrap_or(0);
                u64::from(n.saturating_sub(1))
            })
            .sum::<u64>();
        let copies = self
            .dead_lettered
            .values()
            .map(|n| u64::from(n.saturating_sub(1)))
            .sum::<u64>();
        verdicts + copies
    }

    /// The first `n` ids judged more than once (accepted or rejected), with how often: what a
    /// failing duplicates check prints so that a run on another machine says which records.
    pub fn duplicated_ids(&self, n: usize) -> Vec<(&str, u32)> {
        let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
        for (id, k) in self.accepted.iter().chain(&self.rejected) {
            *counts.entry(id.as_str()).or_default() += k;
        }
        counts.into_iter().filter(|&(_, k)| k > 1).take(n).collect()
    }

    /// Distinct ids accepted.
    pub fn accepted_ids(&self) -> usize {
        self.accepted.len()
    }

    /// Distinct ids rejected.
    pub fn rejected_ids(&self) -> usize {
        self.rejected.len()
    }

    /// Distinct ids in the dead-letter topic.
    pub fn dead_lettered_ids(&self) -> usize {
        self.dead_lettered.len()
    }

    /// Prints the ledger line and fails the test when a record was lost or an unknown id showed
    /// up; a passing ledger is also appended to `target/ledgers.txt`. Every fault test ends here.
    pub fn check(&self) {
        println!("{self}");
        let lost = self.lost();
        assert!(
            lost.is_empty(),
            "{}: {} records lost, first: {:?}",
            self.name,
            lost.len(),
            &lost[..lost.len().min(10)]
        );
        let unknown = self.unknown();
        assert!(
            unknown.is_empty(),
            "{}: ids never produced: {:?}",
            self.name,
            &unknown[..unknown.len().min(10)]
        );
        keep(&self.to_string());
    }
}

/// What an exactly-once pipeline reads and where it writes: its source, output and
/// dead-letter topics, with their partition counts.
#[derive(Debug, Clone)]
pub struct Written<'a> {
    /// The source topic and its partitions: an id a producer's retry put there twice is two
    /// records, each owed its own output.
    pub source: (&'a str, i32),
    /// The output topic and its partitions.
    pub output: (&'a str, i32),
    /// The dead-letter topic and its partitions.
    pub dead_letters: (&'a str, i32),
}

/// The exactly-once ledger: reads the output and dead-letter topics `read_committed` (as a
/// downstream consumer does: aborted transactions' records are not there), prints a line
/// `exactly-once NAME: ...` (kept in `target/ledgers.txt`) and fails unless every produced id
/// is in exactly one of them as many times as the source holds it (once, unless a producer's
/// retry wrote it twice). `judged` (what the plugins logged) says how many
/// judgings never committed. The caller first waits until the broker has nothing left for the
/// group.
pub async fn check_exactly_once(
    name: &str,
    client: &sharehost::kafka::KafkaClient,
    ids: &[String],
    written: Written<'_>,
    judged: usize,
) {
    let mut count: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    // Where each copy came from (its provenance headers), to tell a record written twice from
    // two records with one id when the ledger fails.
    let mut whence: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let (output, out_partitions) = written.output;
    for (p, r) in crate::committed_records(client, output, out_partitions).await {
        let id = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned();
        count.entry(id.clone()).or_default().0 += 1;
        whence
            .entry(id)
            .or_default()
            .push(format!("output {p}@{} {}", r.offset, provenance(&r)));
    }
    let (dlq, dlq_partitions) = written.dead_letters;
    // Dead letters the host writes at the delivery cap go through the plain write path, at
    // least once (docs/reliability.md): an id whose every copy is one may be there twice.
    let mut at_cap: BTreeMap<String, u32> = BTreeMap::new();
    for (_, r) in crate::committed_records(client, dlq, dlq_partitions).await {
        let id = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned();
        let cap = r.headers.iter().any(|h| {
            h.key == "sharehost.reason"
                && h.value
                    .as_deref()
                    .is_some_and(|v| v.starts_with(b"delivery cap reached"))
        });
        if cap {
            *at_cap.entry(id.clone()).or_default() += 1;
        }
        count.entry(id.clone()).or_default().1 += 1;
        whence
            .entry(id)
            .or_default()
            .push(format!("dead letter {} {}", r.offset, provenance(&r)));
    }
    let (source, source_partitions) = written.source;
    let mut copies: BTreeMap<String, u32> = BTreeMap::new();
    for (_, r) in crate::committed_records(client, source, source_partitions).await {
        let id = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned();
        *copies.entry(id).or_default() += 1;
    }
    let copies_of = |id: &String| copies.get(id).copied().unwrap_or(1).max(1);
    let in_source_twice = copies.values().filter(|&&c| c > 1).count();
    let produced: BTreeSet<&String> = ids.iter().collect();
    // Lost: an id written fewer times than the source holds it (never, as a rule).
    let lost: Vec<&String> = ids
        .iter()
        .filter(|id| count.get(*id).map_or(0, |(o, d)| o + d) < copies_of(id))
        .collect();
    let only_at_cap = |id: &String, o: u32, d: u32| o == 0 && at_cap.get(id) == Some(&d);
    let cap_twice = count
        .iter()
        .filter(|(id, (o, d))| *d > 1 && only_at_cap(id, *o, *d))
        .count();
    let twice: Vec<(&String, &(u32, u32))> = count
        .iter()
        .filter(|(id, (o, d))| o + d > copies_of(id) && !only_at_cap(id, *o, *d))
        .collect();
    let unknown: Vec<&String> = count.keys().filter(|id| !produced.contains(id)).collect();
    let outputs: u32 = count.values().map(|c| c.0).sum();
    let dead: u32 = count.values().map(|c| c.1).sum();
    report(&format!(
        "exactly-once {name}: produced {}, outputs {outputs}, dead letters {dead}, lost {}, written twice {}, judged {judged} ({} more than once, their transactions aborted), dead-lettered twice at the delivery cap {cap_twice}, in the source twice {in_source_twice}",
        ids.len(),
        lost.len(),
        twice.len(),
        judged.saturating_sub(ids.len()),
    ));
    assert!(lost.is_empty(), "{name}: ids lost: {lost:?}");
    let twice_whence: Vec<(&String, Option<&Vec<String>>)> = twice
        .iter()
        .take(10)
        .map(|(id, _)| (*id, whence.get(*id)))
        .collect();
    assert!(
        twice.is_empty(),
        "{name}: ids written more than once (outputs, dead letters): {twice:?}; where the first copies came from: {twice_whence:#?}"
    );
    assert!(unknown.is_empty(), "{name}: unknown ids: {unknown:?}");
}

/// A written record's provenance headers (`sharehost.source.*` on outputs,
/// `sharehost.original.*` on dead letters), as `key=value` pairs.
fn provenance(r: &sharehost::kafka::ConsumedRecord) -> String {
    r.headers
        .iter()
        .filter(|h| {
            h.key.starts_with("sharehost.source.") || h.key.starts_with("sharehost.original.")
        })
        .filter(|h| !h.key.ends_with(".topic"))
        .map(|h| {
            format!(
                "{}={}",
                h.key.rsplit('.').next().unwrap_or_default(),
                String::from_utf8_lossy(h.value.as_deref().unwrap_or_default())
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Appends a passing ledger line to `target/ledgers.txt`: the test harness hides a passing
/// test's output, and dev/test prints that file at the end.
fn keep(line: &str) {
    let file = crate::repo_root().join("target/ledgers.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&file)
    {
        let _ = writeln!(f, "{line}");
    }
}

/// Prints a ledger line of a test's own (say, the outputs found beside the records judged)
/// and keeps it with the fault ledgers in `target/ledgers.txt`.
pub fn report(line: &str) {
    println!("{line}");
    keep(line);
}

impl fmt::Display for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ledger {}: produced {}, accepted {}, rejected {}, dead-lettered {}, duplicates {}, lost {}",
            self.name,
            self.produced.len(),
            self.accepted.len(),
            self.rejected.len(),
            self.dead_lettered.len(),
            self.duplicates(),
            self.lost().len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: u32) -> Vec<String> {
        (0..n).map(|i| i.to_string()).collect()
    }

    #[test]
    fn counts_lost_duplicates_and_unknown_ids() {
        let mut l = Ledger::new("t", ids(4));
        l.accepted("0");
        l.accepted("0");
        l.rejected("1");
        l.dead_lettered("1");
        l.dead_lettered("2");
        l.accepted("9");
        assert_eq!(l.lost(), vec!["3"]);
        assert_eq!(l.duplicates(), 1);
        assert_eq!(l.unknown(), vec!["9"]);
        assert_eq!(
            l.to_string(),
            "ledger t: produced 4, accepted 2, rejected 1, dead-lettered 2, duplicates 1, lost 1"
        );
    }

    #[test]
    #[should_panic(expected = "1 records lost")]
    fn check_fails_on_a_lost_record() {
        let mut l = Ledger::new("t", ids(2));
        l.accepted("0");
        l.check();
    }
}

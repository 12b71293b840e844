//! A pipeline's dead letters grouped by reason, for the console: what `sharehost dlq` reads,
//! summed up so an operator sees at a glance why records were rejected and replays one group
//! with one click.
//!
//! Reasons often carry numbers (an id, an amount, an offset: `ledger: 14 is divisible by 7`),
//! which would make every dead letter a group of its own. A group is a reason's *shape*: the
//! reason with every run of ASCII digits standing for any such run. Its `reason_regex` (the
//! shape, escaped, anchored, digits as `[0-9]+`) is the `--reason` that selects exactly that
//! group, in the API and in `sharehost dlq` alike.

use std::collections::{BTreeSet, HashMap};

use sharehost_api::{DeadLetterView, Group, Span, Summary};

use crate::dlq::{Outcome, Seen, preview};

/// Most groups listed: beyond it, dead letters of further shapes are only counted
/// (`ungrouped`), so a plugin whose every reason differs cannot make the answer unbounded.
pub const MAX_GROUPS: usize = 100;

/// Characters of a reason that make its shape; a longer reason's shape matches by this
/// prefix (its regex is not anchored at the end).
pub const MAX_SHAPE_CHARS: usize = 300;

/// Plugin versions and original topics listed per group.
const MAX_LISTED: usize = 8;

/// A reason's shape: how a group is shown and selected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// The reason with each run of digits as `#` (and `…` when cut).
    pub text: String,
    /// The regular expression selecting every reason of this shape.
    pub regex: String,
}

/// The shape of `reason`.
pub fn shape(reason: &str) -> Shape {
    let mut text = String::new();
    let mut regex = String::from("^");
    let mut literal = String::new();
    let mut in_digits = false;
    let mut chars = reason.chars();
    for c in chars.by_ref().take(MAX_SHAPE_CHARS) {
        if c.is_ascii_digit() {
            if !in_digits {
                regex.push_str(&regex_syntax::escape(&literal));
                literal.clear();
                regex.push_str("[0-9]+");
                text.push('#');
                in_digits = true;
            }
        } else {
            in_digits = false;
            literal.push(c);
            text.push(c);
        }
    }
    regex.push_str(&regex_syntax::escape(&literal));
    if chars.next().is_some() {
        text.push('…');
    } else {
        regex.push('$');
    }
    Shape { text, regex }
}

/// Sums up the dead letters a run of the reader hands over ([`crate::dlq::list`], or a
/// dry-run [`crate::dlq::replay`], which says what would become of each), one at a time as
/// they are read: memory holds the groups, never the dead letters.
#[derive(Debug, Default)]
pub struct Collector {
    groups: Vec<Group>,
    by_regex: HashMap<String, usize>,
    /// Dead letters of shapes beyond [`MAX_GROUPS`].
    pub ungrouped: u64,
    /// Characters of a group's example value shown.
    preview: usize,
    /// Whether the dead letters came with what a replay does with them (a dry-run replay).
    with_status: bool,
}

impl Collector {
    /// A collector previewing `preview` characters of a group's example value.
    pub fn new(preview: usize) -> Collector {
        Collector {
            preview,
            ..Collector::default()
        }
    }

    /// Takes one dead letter.
    pub fn absorb(&mut self, seen: &Seen<'_>) {
        let d = seen.dead_letter;
        let shape = shape(&d.reason);
        let at = match self.by_regex.get(&shape.regex) {
            Some(&i) => i,
            None if self.groups.len() >= MAX_GROUPS => {
                self.ungrouped += 1;
                return;
            }
            None => {
                self.groups.push(Group {
                    shape: shape.text,
                    example: d.reason.clone(),
                    example_value: d.value().map(|v| preview(Some(v.as_ref()), self.preview)),
                    reason_regex: shape.regex.clone(),
                    count: 0,
                    replayed: None,
                    to_replay: None,
                    original_topic_missing: None,
                    spans: Vec::new(),
                    versions: BTreeSet::new(),
                    original_topics: BTreeSet::new(),
                });
                self.by_regex.insert(shape.regex, self.groups.len() - 1);
                self.groups.len() - 1
            }
        };
        let g = &mut self.groups[at];
        g.count += 1;
        let slot = match seen.outcome {
            Outcome::Listed => None,
            Outcome::AlreadyReplayed => Some(&mut g.replayed),
            Outcome::TopicMissing(_) => Some(&mut g.original_topic_missing),
            Outcome::WouldReplay { .. } | Outcome::Replayed { .. } => Some(&mut g.to_replay),
        };
        if let Some(slot) = slot {
            self.with_status = true;
            *slot.get_or_insert(0) += 1;
        }
        let (p, o) = (d.partition, d.offset);
        match g.spans.iter_mut().find(|s| s.partition == p) {
            Some(s) => {
                s.first = s.first.min(o);
                s.last = s.last.max(o);
            }
            None => g.spans.push(Span {
                partition: p,
                first: o,
                last: o,
            }),
        }
        if let Some(v) = &d.plugin_version
            && g.versions.len() < MAX_LISTED
        {
            g.versions.insert(v.chars().take(12).collect());
        }
        if let Some(t) = &d.original_topic
            && g.original_topics.len() < MAX_LISTED
        {
            g.original_topics.insert(t.clone());
        }
    }

    /// The groups, largest first. With replay statuses, a group's three counts are numbers
    /// (0 where none was seen); without, they stay `None` (unknown).
    pub fn groups(&self) -> Vec<Group> {
        let mut groups = self.groups.clone();
        if self.with_status {
            for g in &mut groups {
                for slot in [
                    &mut g.replayed,
                    &mut g.to_replay,
                    &mut g.original_topic_missing,
                ] {
                    slot.get_or_insert(0);
                }
            }
        }
        groups.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.shape.cmp(&b.shape)));
        for g in &mut groups {
            g.spans.sort_by_key(|s| s.partition);
        }
        groups
    }
}

/// The answer of `GET /pipelines/NAME/dead-letters` for what `collector` summed up from
/// `topic`, in a run that ended with `summary`.
pub fn view(
    pipeline: &str,
    topic: &str,
    collector: &Collector,
    summary: &Summary,
) -> DeadLetterView {
    DeadLetterView {
        pipeline: pipeline.to_owned(),
        topic: Some(topic.to_owned()),
        read: summary.read,
        dead_letters: summary.selected,
        other_pipeline: summary.other_pipeline,
        not_dead_letters: summary.not_dead_letters,
        groups: collector.groups(),
        ungrouped: collector.ungrouped,
        replay_state_error: None,
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::dlq::DeadLetter;
    use crate::kafka::{ConsumedRecord, Header};
    use crate::provenance as pv;

    fn matches(regex: &str, text: &str) -> bool {
        regex_automata::meta::Regex::new(regex)
            .expect("a valid regex")
            .is_match(text)
    }

    #[test]
    fn a_shape_stands_for_every_reason_that_differs_only_in_its_numbers() {
        let s = shape("ledger: 14 is divisible by 7");
        assert_eq!(s.text, "ledger: # is divisible by #");
        assert_eq!(s.regex, "^ledger: [0-9]+ is divisible by [0-9]+$");
        assert!(matches(&s.regex, "ledger: 14 is divisible by 7"));
        assert!(matches(&s.regex, "ledger: 1400 is divisible by 70"));
        assert!(!matches(&s.regex, "ledger: x is divisible by 7"));
        assert!(!matches(&s.regex, "ledger: 14 is divisible by 7 (again)"));
        assert!(!matches(&s.regex, "not ledger: 14 is divisible by 7"));
    }

    #[test]
    fn a_shape_escapes_what_a_regular_expression_would_read_as_syntax() {
        for reason in [
            "price (EUR) must be > 0.00 [got -3.5]",
            "a.b*c+d?e|f^g$h{2}\\ #1",
            "",
            "🙂 é 42",
        ] {
            let s = shape(reason);
            assert!(matches(&s.regex, reason), "{reason:?} by {}", s.regex);
        }
        let s = shape("a.b 1");
        assert!(!matches(&s.regex, "axb 1"), "a dot is a dot");
        assert_ne!(
            shape("total # 5").regex,
            shape("total 7 5").regex,
            "a literal # is not a number"
        );
    }

    #[test]
    fn a_long_reason_is_grouped_and_selected_by_its_beginning() {
        let long = format!("{} tail {}", "x".repeat(MAX_SHAPE_CHARS), "y");
        let s = shape(&long);
        assert!(s.text.ends_with('…'));
        assert!(!s.regex.ends_with('$'));
        assert!(matches(&s.regex, &long));
        assert!(matches(
            &s.regex,
            &format!("{} other tail", "x".repeat(MAX_SHAPE_CHARS))
        ));
    }

    /// A dead letter of `orders` with `reason` at `partition`/`offset` of the dead-letter topic.
    fn letter(reason: &str, partition: i32, offset: i64) -> DeadLetter {
        let h = |key: &str, value: &str| Header {
            key: key.to_owned(),
            value: Some(Bytes::from(value.to_owned())),
        };
        DeadLetter::from_record(
            partition,
            ConsumedRecord {
                offset,
                timestamp: 0,
                key: None,
                value: Some(Bytes::from_static(b"v")),
                headers: vec![
                    h(pv::ORIGINAL_TOPIC, "orders"),
                    h(pv::REASON, reason),
                    h(pv::PLUGIN_VERSION, "0123456789abcdef"),
                ],
            },
        )
    }

    /// Hands the dead letter to `c` as the reader would, with what a replay does with it.
    fn absorb(c: &mut Collector, reason: &str, partition: i32, offset: i64, outcome: Outcome) {
        let d = letter(reason, partition, offset);
        c.absorb(&Seen {
            topic: "orders-dlq",
            dead_letter: &d,
            outcome,
        });
    }

    fn would_replay() -> Outcome {
        Outcome::WouldReplay {
            topic: "orders".into(),
            partition: 0,
        }
    }

    #[test]
    fn the_collector_groups_dead_letters_and_counts_their_replay_status() {
        let mut c = Collector::new(80);
        absorb(&mut c, "ledger: 14 is divisible by 7", 0, 5, would_replay());
        absorb(
            &mut c,
            "ledger: 21 is divisible by 7",
            1,
            2,
            Outcome::AlreadyReplayed,
        );
        absorb(
            &mut c,
            "ledger: value is not a decimal id",
            0,
            9,
            Outcome::TopicMissing("orders".into()),
        );
        absorb(
            &mut c,
            "ledger: 28 is divisible by 7",
            0,
            11,
            would_replay(),
        );
        let summary = Summary {
            read: 5,
            selected: 4,
            not_dead_letters: 1,
            ..Summary::default()
        };
        let groups = c.groups();
        assert_eq!(groups.len(), 2);
        let g = &groups[0];
        assert_eq!(g.shape, "ledger: # is divisible by #");
        assert_eq!(g.example, "ledger: 14 is divisible by 7");
        assert_eq!(
            (g.count, g.replayed, g.to_replay, g.original_topic_missing),
            (3, Some(1), Some(2), Some(0))
        );
        assert_eq!(
            g.spans,
            [
                Span {
                    partition: 0,
                    first: 5,
                    last: 11
                },
                Span {
                    partition: 1,
                    first: 2,
                    last: 2
                }
            ]
        );
        assert_eq!(
            g.versions.iter().collect::<Vec<_>>(),
            ["0123456789ab"],
            "versions are shortened"
        );
        assert_eq!(g.example_value.as_deref(), Some("v"));
        assert_eq!(groups[1].original_topic_missing, Some(1));
        let view = view("ledger", "orders-dlq", &c, &summary);
        assert_eq!(
            (view.read, view.dead_letters, view.not_dead_letters),
            (5, 4, 1)
        );
    }

    #[test]
    fn without_replay_statuses_the_replay_counts_are_unknown_and_groups_are_bounded() {
        let mut c = Collector::new(80);
        for n in 0..MAX_GROUPS + 5 {
            // Letters, not digits, so every reason is a shape of its own.
            let reason = format!("reason {}", "z".repeat(n + 1));
            absorb(&mut c, &reason, 0, n as i64, Outcome::Listed);
        }
        let groups = c.groups();
        assert_eq!(groups.len(), MAX_GROUPS);
        assert_eq!(c.ungrouped, 5);
        assert!(
            groups
                .iter()
                .all(|g| g.replayed.is_none() && g.to_replay.is_none())
        );
        assert_eq!(
            groups.iter().map(|g| g.count).sum::<u64>(),
            MAX_GROUPS as u64
        );
    }
}

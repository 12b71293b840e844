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

use serde_json::Value;
use sharehost_api::{DeadLetterView, Group, Span};

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

/// Sums up the JSON lines of a `sharehost dlq --json` run (`list`, or a dry-run `replay`,
/// which adds each dead letter's replay status), one line at a time as they are written:
/// memory holds the groups, never the dead letters.
#[derive(Debug, Default)]
pub struct Collector {
    line: Vec<u8>,
    groups: Vec<Group>,
    by_regex: HashMap<String, usize>,
    /// Dead letters of shapes beyond [`MAX_GROUPS`].
    pub ungrouped: u64,
    /// The run's closing summary.
    pub summary: Option<Value>,
    /// Whether the lines carried replay statuses (a dry-run replay).
    with_status: bool,
}

impl std::io::Write for Collector {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for &b in buf {
            if b == b'\n' {
                let line = std::mem::take(&mut self.line);
                if let Ok(v) = serde_json::from_slice::<Value>(&line) {
                    self.absorb(v);
                }
            } else {
                self.line.push(b);
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Collector {
    /// Takes one line: a dead letter, or the summary.
    pub fn absorb(&mut self, line: Value) {
        if let Some(summary) = line.get("summary") {
            self.summary = Some(summary.clone());
            return;
        }
        let text = |k: &str| line.get(k).and_then(Value::as_str);
        let reason = text("reason").unwrap_or_default();
        let shape = shape(reason);
        let at = match self.by_regex.get(&shape.regex) {
            Some(&i) => i,
            None if self.groups.len() >= MAX_GROUPS => {
                self.ungrouped += 1;
                return;
            }
            None => {
                self.groups.push(Group {
                    shape: shape.text,
                    example: reason.to_owned(),
                    example_value: text("value").map(str::to_owned),
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
        if let Some(status) = line.pointer("/replay/status").and_then(Value::as_str) {
            self.with_status = true;
            let slot = match status {
                "already-replayed" => &mut g.replayed,
                "topic-missing" => &mut g.original_topic_missing,
                _ => &mut g.to_replay,
            };
            *slot.get_or_insert(0) += 1;
        }
        if let (Some(p), Some(o)) = (
            line.get("partition")
                .and_then(Value::as_i64)
                .and_then(|p| i32::try_from(p).ok()),
            line.get("offset").and_then(Value::as_i64),
        ) {
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
        }
        if let Some(v) = text("plugin_version")
            && g.versions.len() < MAX_LISTED
        {
            g.versions.insert(v.chars().take(12).collect());
        }
        if let Some(t) = text("original_topic")
            && g.original_topics.len() < MAX_LISTED
        {
            g.original_topics.insert(t.to_owned());
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

    /// Counts from the summary (0 when the run ended without one).
    pub fn summary_count(&self, key: &str) -> u64 {
        self.summary
            .as_ref()
            .and_then(|s| s.get(key))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    }
}

/// The answer of `GET /pipelines/NAME/dead-letters` for what `collector` summed up from
/// `topic`.
pub fn view(pipeline: &str, topic: &str, collector: &Collector) -> DeadLetterView {
    DeadLetterView {
        pipeline: pipeline.to_owned(),
        topic: Some(topic.to_owned()),
        read: collector.summary_count("read"),
        dead_letters: collector.summary_count("selected"),
        other_pipeline: collector.summary_count("other_pipeline"),
        not_dead_letters: collector.summary_count("not_dead_letters"),
        groups: collector.groups(),
        ungrouped: collector.ungrouped,
        replay_state_error: None,
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

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

    fn line(reason: &str, partition: i32, offset: i64, status: Option<&str>) -> String {
        let mut v = serde_json::json!({
            "partition": partition, "offset": offset, "reason": reason,
            "original_topic": "orders", "plugin_version": "0123456789abcdef", "value": "v",
        });
        if let Some(s) = status {
            v["replay"] = serde_json::json!({ "status": s, "to": null });
        }
        format!("{v}\n")
    }

    #[test]
    fn the_collector_groups_lines_written_in_pieces_and_counts_their_replay_status() {
        let mut c = Collector::default();
        let mut text = String::new();
        text += &line("ledger: 14 is divisible by 7", 0, 5, Some("would-replay"));
        text += &line(
            "ledger: 21 is divisible by 7",
            1,
            2,
            Some("already-replayed"),
        );
        text += &line(
            "ledger: value is not a decimal id",
            0,
            9,
            Some("topic-missing"),
        );
        text += &line("ledger: 28 is divisible by 7", 0, 11, Some("would-replay"));
        text += "{\"summary\":{\"read\":5,\"selected\":4,\"not_dead_letters\":1}}\n";
        // Written in pieces that cut lines (and a character) anywhere.
        for piece in text.as_bytes().chunks(7) {
            c.write_all(piece).expect("write");
        }
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
        assert_eq!(groups[1].original_topic_missing, Some(1));
        let view = view("ledger", "orders-dlq", &c);
        assert_eq!(
            (view.read, view.dead_letters, view.not_dead_letters),
            (5, 4, 1)
        );
    }

    #[test]
    fn without_replay_statuses_the_replay_counts_are_unknown_and_groups_are_bounded() {
        let mut c = Collector::default();
        for n in 0..MAX_GROUPS + 5 {
            // Letters, not digits, so every reason is a shape of its own.
            let reason = format!("reason {}", "z".repeat(n + 1));
            c.write_all(line(&reason, 0, n as i64, None).as_bytes())
                .expect("write");
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

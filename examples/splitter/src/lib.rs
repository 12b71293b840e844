//! Routes every record to one of two outputs by its content, and accepts it.
//!
//! A JSON object with `"priority": "high"` goes to the output `urgent`; everything else (other
//! priorities, no priority, JSON that is not an object, not JSON at all, a null value) goes to
//! `normal`. The key, the value and the headers are forwarded unchanged, except headers with
//! the reserved `sharehost.` prefix (provenance of an upstream pipeline, which the host adds
//! again for this hop). Each emit is bound to its record, so the record is accepted only once
//! its copy is produced; an emit the host refuses (a spent budget) releases the record to try
//! again later. Nothing else: no configuration.

use serde_json::Value;
use sharehost_guest::{Config, Header, Plugin, RESERVED_HEADER_PREFIX, Record, Verdict, log};

/// The splitter.
pub struct Splitter;

impl Splitter {
    /// The output a value belongs to.
    pub fn output(value: Option<&[u8]>) -> &'static str {
        let high = value
            .and_then(|v| serde_json::from_slice::<Value>(v).ok())
            .is_some_and(|v| v.get("priority").and_then(Value::as_str) == Some("high"));
        if high { "urgent" } else { "normal" }
    }
}

impl Plugin for Splitter {
    fn init(_config: &Config) -> Result<Self, String> {
        Ok(Splitter)
    }

    fn handle(&mut self, record: &Record<'_>) -> Verdict {
        let headers: Vec<Header<'_>> = record
            .headers
            .iter()
            .filter(|h| !h.key.starts_with(RESERVED_HEADER_PREFIX))
            .copied()
            .collect();
        let output = Self::output(record.value);
        match record.emit(output, record.key, record.value, &headers) {
            Ok(()) => Verdict::Accept,
            Err(e) => {
                log::warn(&format!(
                    "offset {}: {output}: {e}; released",
                    record.offset
                ));
                Verdict::Release
            }
        }
    }
}

sharehost_guest::export!(Splitter);

#[cfg(test)]
mod tests {
    use super::*;
    use sharehost_guest::{EmitError, testing};

    fn split(values: &[Option<&[u8]>]) -> (Vec<Verdict>, Vec<testing::Emit>) {
        let mut s = Splitter::init(&Config::default()).expect("no config needed");
        let verdicts = values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let mut r = Record::with_value(b"").at_index(i as u32);
                r.value = *v;
                s.handle(&r)
            })
            .collect();
        (verdicts, testing::take_emits())
    }

    #[test]
    fn high_priority_goes_to_urgent_and_the_rest_to_normal_all_accepted() {
        testing::reset();
        let (verdicts, emits) = split(&[
            Some(br#"{"id":1,"priority":"high"}"#),
            Some(br#"{"id":2,"priority":"low"}"#),
            Some(br#"{"id":3}"#),
            Some(b"not json"),
            Some(br#"["high"]"#),
            Some(br#"{"priority":true}"#),
            None,
        ]);
        assert!(
            verdicts.iter().all(|v| *v == Verdict::Accept),
            "{verdicts:?}"
        );
        let routed: Vec<(u32, &str)> = emits
            .iter()
            .map(|e| (e.record_index, e.output.as_str()))
            .collect();
        assert_eq!(
            routed,
            [
                (0, "urgent"),
                (1, "normal"),
                (2, "normal"),
                (3, "normal"),
                (4, "normal"),
                (5, "normal"),
                (6, "normal")
            ]
        );
        assert_eq!(emits[0].value_str(), Some(r#"{"id":1,"priority":"high"}"#));
        assert_eq!(emits[6].value, None, "a null value stays null");
    }

    #[test]
    fn key_and_headers_are_forwarded_without_reserved_ones() {
        testing::reset();
        let headers = [
            Header {
                key: "trace-id",
                value: Some(b"abc"),
            },
            Header {
                key: "sharehost.source.offset",
                value: Some(b"7"),
            },
            Header {
                key: "empty",
                value: None,
            },
        ];
        let mut s = Splitter;
        let r = Record::with_value(br#"{"priority":"high"}"#)
            .key(b"order-1")
            .headers(&headers);
        assert_eq!(s.handle(&r), Verdict::Accept);
        let emits = testing::take_emits();
        assert_eq!(emits[0].key.as_deref(), Some(&b"order-1"[..]));
        assert_eq!(
            emits[0].headers,
            vec![
                ("trace-id".to_owned(), Some(b"abc".to_vec())),
                ("empty".to_owned(), None)
            ]
        );
    }

    #[test]
    fn a_refused_emit_releases_the_record() {
        testing::reset();
        testing::refuse_emits(|e| match e.output.as_str() {
            "urgent" => Err(EmitError::TooManyBytes(1 << 20)),
            _ => Ok(()),
        });
        let (verdicts, emits) = split(&[Some(br#"{"priority":"high"}"#), Some(b"x")]);
        assert_eq!(verdicts, [Verdict::Release, Verdict::Accept]);
        assert_eq!(emits.len(), 1);
        assert_eq!(emits[0].output, "normal");
    }
}

//! Offline runs of a plugin (`sharehost test-plugin`): records from JSON lines, verdicts as
//! JSON lines. Lives in the library so its parsing is unit-tested and reusable.
//!
//! Input, one JSON object per line (blank lines ignored), every field optional:
//! `{"topic": "orders", "partition": 0, "offset": 7, "timestamp": 0, "delivery_count": 1,
//!   "key": "k1", "value": {"base64": "eyJ9"}, "headers": [["type", "order"]]}`.
//! Keys, values and header values are UTF-8 text, `{"base64": "..."}` for binary, or `null`.
//! Headers are `[[key, value], ...]` (order and duplicates kept) or `{"key": value}`.
//! `offset` defaults to the record's index in the file, `delivery_count` to 1.
//!
//! The input is read a line at a time, each line at most [`MAX_INPUT_LINE_BYTES`]: a file of
//! one endless line is refused after that many bytes, never read whole.
//!
//! Emits are shown with the pipeline's secrets redacted (`[secret NAME]`), as everywhere else
//! the host shows a plugin's text.

use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use serde_json::{Map, Value, json};
use sharehost_bounded_lift::Verdict;

use crate::fault::Fault;
use crate::outputs::Emit;
use crate::record::{Header, Record};
use crate::secrets::Secrets;

/// A bad input line: names the line (1-based) and what is wrong with it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("line {line}: {message}")]
pub struct InputError {
    /// 1-based line number in the input.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

const FIELDS: &[&str] = &[
    "topic",
    "partition",
    "offset",
    "timestamp",
    "delivery_count",
    "key",
    "value",
    "headers",
];

/// The longest input line read, in bytes: a record of the broker's default largest message
/// (1 MiB), base64-encoded in its value with headers beside it, is under 2 MiB; 16 MiB leaves
/// room for raised broker maxima while a hostile or mistaken input (a 2 GB line once took
/// 6 GB of memory) is refused after 16 MiB.
pub const MAX_INPUT_LINE_BYTES: usize = 16 << 20;

/// Parses JSON-lines input text into records. The first bad line stops parsing with an error
/// naming it.
pub fn parse_jsonl(text: &str) -> Result<Vec<Record>, InputError> {
    read_jsonl(&mut text.as_bytes(), usize::MAX)
}

/// Reads JSON-lines input into records a line at a time, each line at most `max_line` bytes
/// ([`MAX_INPUT_LINE_BYTES`] for `test-plugin`). The first bad or overlong line stops reading
/// with an error naming it.
pub fn read_jsonl(
    reader: &mut impl std::io::BufRead,
    max_line: usize,
) -> Result<Vec<Record>, InputError> {
    let mut records = Vec::new();
    let mut topics: Vec<Arc<str>> = Vec::new();
    let mut bytes = Vec::new();
    for i in 0.. {
        let err = |message: String| InputError {
            line: i + 1,
            message,
        };
        if !crate::fs::read_line(reader, &mut bytes, max_line).map_err(|e| err(e.to_string()))? {
            break;
        }
        let line = std::str::from_utf8(&bytes)
            .map_err(|_| err("is not UTF-8 text".into()))?
            .trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let value: Value =
            serde_json::from_str(line).map_err(|e| err(format!("not valid JSON: {e}")))?;
        let obj = value
            .as_object()
            .ok_or_else(|| err("expected a JSON object".into()))?;
        if let Some(unknown) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(err(format!(
                "unknown field `{unknown}` (expected one of: {})",
                FIELDS.join(", ")
            )));
        }
        let topic_name = match obj.get("topic") {
            None | Some(Value::Null) => "test",
            Some(Value::String(s)) => s.as_str(),
            Some(_) => return Err(err("`topic` must be a string".into())),
        };
        let topic = match topics.iter().find(|t| ***t == *topic_name) {
            Some(t) => t.clone(),
            None => {
                let t: Arc<str> = Arc::from(topic_name);
                topics.push(t.clone());
                t
            }
        };
        let int = |name: &str, default: i64| -> Result<i64, InputError> {
            match obj.get(name) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v
                    .as_i64()
                    .ok_or_else(|| err(format!("`{name}` must be an integer"))),
            }
        };
        let partition = i32::try_from(int("partition", 0)?)
            .map_err(|_| err("`partition` out of range".into()))?;
        let delivery_count = u16::try_from(int("delivery_count", 1)?)
            .map_err(|_| err("`delivery_count` must be in 0..=65535".into()))?;
        let headers = match obj.get("headers") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(j, item)| match item.as_array().map(Vec::as_slice) {
                    Some([Value::String(k), v]) => Ok(Header {
                        key: k.clone(),
                        value: payload(v).map_err(|m| err(format!("headers[{j}]: {m}")))?,
                    }),
                    _ => Err(err(format!("headers[{j}] must be [key, value]"))),
                })
                .collect::<Result<_, _>>()?,
            Some(Value::Object(map)) => header_map(map).map_err(err)?,
            Some(_) => {
                return Err(err(
                    "`headers` must be an array of pairs or an object".into()
                ));
            }
        };
        records.push(Record {
            topic,
            partition,
            offset: int("offset", records.len() as i64)?,
            timestamp: int("timestamp", 0)?,
            delivery_count,
            key: payload(obj.get("key").unwrap_or(&Value::Null))
                .map_err(|m| err(format!("key: {m}")))?,
            value: payload(obj.get("value").unwrap_or(&Value::Null))
                .map_err(|m| err(format!("value: {m}")))?,
            headers,
        });
    }
    Ok(records)
}

fn header_map(map: &Map<String, Value>) -> Result<Vec<Header>, String> {
    map.iter()
        .map(|(k, v)| {
            Ok(Header {
                key: k.clone(),
                value: payload(v).map_err(|m| format!("headers.{k}: {m}"))?,
            })
        })
        .collect()
}

/// Text, `{"base64": ...}` or null.
fn payload(v: &Value) -> Result<Option<Bytes>, String> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(Bytes::copy_from_slice(s.as_bytes()))),
        Value::Object(o) if o.len() == 1 => match o.get("base64") {
            Some(Value::String(b)) => base64::engine::general_purpose::STANDARD
                .decode(b)
                .map(|d| Some(Bytes::from(d)))
                .map_err(|e| format!("invalid base64: {e}")),
            _ => Err("expected a string, null or {\"base64\": \"...\"}".into()),
        },
        _ => Err("expected a string, null or {\"base64\": \"...\"}".into()),
    }
}

/// One output line for a judged record, with what it emitted (contract 0.2), as a pipeline
/// would act on it: a `retry` delay cut to `max_retry_delay_ms` (the delay asked for beside it
/// when cut), and the emits of a record that did not end accepted marked discarded (a
/// pipeline never produces them).
pub fn verdict_line(
    record: &Record,
    verdict: &Verdict,
    fault: Option<&Fault>,
    emits: &[&Emit],
    max_retry_delay_ms: u64,
    secrets: &Secrets,
) -> String {
    let reason = match verdict {
        Verdict::Reject(r) => r.as_deref(),
        _ => None,
    };
    let mut line = json!({
        "topic": &*record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "verdict": verdict.kind(),
        "reason": reason,
    });
    if let Some(o) = line.as_object_mut() {
        if let Verdict::Retry(ms) = verdict {
            let kept = u64::from(*ms).min(max_retry_delay_ms);
            o.insert("retry_after_ms".into(), json!(kept));
            if kept < u64::from(*ms) {
                o.insert("retry_after_ms_asked".into(), json!(ms));
            }
        }
        if !emits.is_empty() {
            o.insert(
                "emits".into(),
                emits
                    .iter()
                    .map(|e| emit_json(e, secrets))
                    .collect::<Value>(),
            );
            if !matches!(verdict, Verdict::Accept) {
                o.insert("emits_discarded".into(), json!(true));
            }
        }
        if let Some(f) = fault {
            o.insert("fault".into(), json!(f.kind.as_str()));
            o.insert("fault_message".into(), json!(f.message));
        }
    }
    line.to_string()
}

/// An emit as `test-plugin` shows it: bytes as text when they are UTF-8, else
/// `{"base64": ...}` (the input format's convention); every secret value in a key, value or
/// header (text or bytes) shown as `[secret NAME]`, as the host's log shows it.
fn emit_json(e: &Emit, secrets: &Secrets) -> Value {
    let bytes = |b: &Option<Bytes>| match b {
        None => Value::Null,
        Some(b) => {
            let b = secrets.redact_bytes(b);
            match std::str::from_utf8(&b) {
                Ok(s) => json!(s),
                Err(_) => {
                    json!({ "base64": base64::engine::general_purpose::STANDARD.encode(&b) })
                }
            }
        }
    };
    json!({
        "output": &*e.output,
        "key": bytes(&e.key),
        "value": bytes(&e.value),
        "headers": e
            .headers
            .iter()
            .map(|h| json!([secrets.redact(&h.key), bytes(&h.value)]))
            .collect::<Value>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_text_base64_null_and_headers_with_defaults() {
        let input = r#"{"key":"k","value":"hello","headers":[["a","1"],["a",null]]}

{"topic":"t2","partition":2,"offset":9,"delivery_count":3,"value":{"base64":"AAEC"},"headers":{"h":"v"}}
{"value":null}"#;
        let r = parse_jsonl(input).expect("valid");
        assert_eq!(r.len(), 3);
        assert_eq!(&*r[0].topic, "test");
        assert_eq!(r[0].offset, 0);
        assert_eq!(r[0].delivery_count, 1);
        assert_eq!(r[0].value.as_deref(), Some(&b"hello"[..]));
        assert_eq!(r[0].headers.len(), 2);
        assert_eq!(r[0].headers[1].value, None);
        assert_eq!(&*r[1].topic, "t2");
        assert_eq!(
            (r[1].partition, r[1].offset, r[1].delivery_count),
            (2, 9, 3)
        );
        assert_eq!(r[1].value.as_deref(), Some(&[0u8, 1, 2][..]));
        assert_eq!(r[2].offset, 2);
        assert_eq!(r[2].value, None);
    }

    #[test]
    fn bad_lines_are_named() {
        let e = parse_jsonl("{\"value\":\"a\"}\n{oops").expect_err("bad json");
        assert_eq!(e.line, 2);
        assert!(e.message.starts_with("not valid JSON"), "{e}");
        let e = parse_jsonl("{\"valeu\":\"a\"}").expect_err("typo");
        assert!(e.message.contains("unknown field `valeu`"), "{e}");
        let e = parse_jsonl("{\"value\":{\"base64\":\"!!\"}}").expect_err("b64");
        assert!(
            e.to_string().starts_with("line 1: value: invalid base64"),
            "{e}"
        );
        let e = parse_jsonl("{\"headers\":[[1,2]]}").expect_err("header");
        assert_eq!(e.message, "headers[0] must be [key, value]");
        let e = parse_jsonl("[1]").expect_err("not an object");
        assert_eq!(e.message, "expected a JSON object");
    }

    #[test]
    fn verdict_lines_carry_reason_and_fault() {
        let r = &parse_jsonl("{\"offset\":5}").expect("valid")[0];
        assert_eq!(
            verdict_line(
                r,
                &Verdict::Reject(Some("why".into())),
                None,
                &[],
                60_000,
                &Secrets::default()
            ),
            r#"{"offset":5,"partition":0,"reason":"why","topic":"test","verdict":"reject"}"#
        );
    }

    #[test]
    fn a_retry_delay_is_shown_cut_as_a_pipeline_cuts_it() {
        let r = &parse_jsonl("{\"offset\":5}").expect("valid")[0];
        let line = verdict_line(
            r,
            &Verdict::Retry(3_600_000),
            None,
            &[],
            60_000,
            &Secrets::default(),
        );
        assert!(line.contains(r#""retry_after_ms":60000"#), "{line}");
        assert!(line.contains(r#""retry_after_ms_asked":3600000"#), "{line}");
        let line = verdict_line(
            r,
            &Verdict::Retry(500),
            None,
            &[],
            60_000,
            &Secrets::default(),
        );
        assert!(line.contains(r#""retry_after_ms":500"#), "{line}");
        assert!(!line.contains("asked"), "{line}");
    }

    #[test]
    fn emits_of_a_record_not_accepted_are_marked_discarded() {
        let r = &parse_jsonl("{\"offset\":5}").expect("valid")[0];
        let emit = Emit {
            record: 0,
            output: "valid".into(),
            key: None,
            value: Some(Bytes::from_static(b"x")),
            headers: Vec::new(),
        };
        let released = verdict_line(
            r,
            &Verdict::Release,
            None,
            &[&emit],
            60_000,
            &Secrets::default(),
        );
        assert!(released.contains(r#""emits_discarded":true"#), "{released}");
        let accepted = verdict_line(
            r,
            &Verdict::Accept,
            None,
            &[&emit],
            60_000,
            &Secrets::default(),
        );
        assert!(!accepted.contains("discarded"), "{accepted}");
    }

    #[test]
    fn emits_show_secret_values_redacted_and_marked() {
        let r = &parse_jsonl("{\"offset\":5}").expect("valid")[0];
        let secrets = Secrets::new(vec![("api-token".into(), "s3cr3t-value".into())]);
        let emit = Emit {
            record: 0,
            output: "valid".into(),
            key: Some(Bytes::from_static(b"k-s3cr3t-value")),
            value: Some(Bytes::from_static(b"\xff binary s3cr3t-value")),
            headers: vec![crate::outputs::EmitHeader {
                key: "s3cr3t-value".into(),
                value: Some(Bytes::from_static(b"s3cr3t-value")),
            }],
        };
        let line = verdict_line(r, &Verdict::Accept, None, &[&emit], 60_000, &secrets);
        assert!(!line.contains("s3cr3t"), "{line}");
        assert!(line.contains(r#""key":"k-[secret api-token]""#), "{line}");
        assert!(
            line.contains(r#"["[secret api-token]","[secret api-token]"]"#),
            "{line}"
        );
        let b64 =
            base64::engine::general_purpose::STANDARD.encode(b"\xff binary [secret api-token]");
        assert!(line.contains(&b64), "{line}");
    }

    #[test]
    fn an_input_line_over_the_bound_is_refused_naming_it() {
        let input = format!(
            "{{\"value\":\"a\"}}\n{{\"value\":\"{}\"}}\n",
            "x".repeat(100)
        );
        let e = read_jsonl(&mut input.as_bytes(), 50).expect_err("long line");
        assert_eq!(e.line, 2);
        assert_eq!(e.message, "a line is longer than the 50-byte maximum");
        assert_eq!(
            read_jsonl(&mut input.as_bytes(), 200).expect("fits").len(),
            2
        );
    }
}

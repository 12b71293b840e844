//! Checks each order with a fraud-scoring service: the plugin guide's worked example of a plugin
//! that acts (docs/plugin-guide.md, section 5). The same plugin in Python and JavaScript:
//! `examples/python/fraud-check`, `examples/js/fraud-check`.
//!
//! Each record's value is a JSON order, `{"id": "o-1", "amount": 120.5, "customer": "c-7"}`.
//! The plugin POSTs it as it is to `score-url` with `Authorization: Bearer TOKEN` and reads
//! `{"score": N}` back:
//!
//! | the service answers | verdict |
//! |---|---|
//! | 200, `score` ≤ `max-score` | emit the order with `"score": N` to the output `scored`, keyed by its id; **accept** |
//! | 200, `score` > `max-score` | **reject** `score 95 > 80` |
//! | 5xx, or nothing (refused, reset, timed out) | **retry** after 1000 ms |
//! | any other status | **reject** `scoring service answered 404` |
//!
//! A tombstone, a value that is not JSON and an order without a string `id` are rejected with
//! the reason, never sent.
//!
//! Configuration: `score-url` (required), `max-score` (a whole number, default 80). Secret:
//! `scoring-token` (required).

use serde_json::Value;
use sharehost_guest::http::{self, Request};
use sharehost_guest::{Config, Plugin, Record, Verdict, log};

/// How long a record waits before it comes back when the service did not answer (or failed):
/// long enough for a restarting service, short enough to catch up soon after.
const RETRY_MS: u32 = 1000;

/// The fraud check, with what `init` read from the pipeline.
pub struct FraudCheck {
    score_url: String,
    max_score: i64,
    token: String,
}

impl Plugin for FraudCheck {
    fn init(config: &Config) -> Result<Self, String> {
        let score_url = config
            .get("score-url")
            .ok_or("set `score-url` (e.g. http://127.0.0.1:8088/score)")?;
        // A URL that cannot be sent would fail every record: refuse it at load instead.
        Request::post(score_url)
            .validate()
            .map_err(|e| format!("score-url `{score_url}`: {e}"))?;
        let raw = config.get("max-score").unwrap_or("80");
        let max_score = raw
            .parse()
            .ok()
            .filter(|_| raw.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| format!("max-score `{raw}` is not a whole number"))?;
        // Without it every call would be refused, and every order rejected.
        let token = config
            .secret("scoring-token")
            .ok_or("set the secret `scoring-token` ([pipeline.secrets])")?;
        Ok(Self {
            score_url: score_url.to_owned(),
            max_score,
            token: token.to_owned(),
        })
    }

    fn handle(&mut self, record: &Record<'_>) -> Verdict {
        let Some(value) = record.value else {
            return Verdict::reject("tombstone");
        };
        let Ok(mut order) = serde_json::from_slice::<Value>(value) else {
            return Verdict::reject("not JSON");
        };
        let Some(id) = order.get("id").and_then(Value::as_str).map(str::to_owned) else {
            return Verdict::reject("`id` missing or not a string");
        };
        let request = Request::post(&self.score_url)
            .header("content-type", "application/json")
            .bearer_auth(&self.token)
            .body(value);
        let response = match http::send(request) {
            Ok(response) => response,
            // No answer: the service may be restarting, so the order comes back later.
            Err(e) => {
                log::warn(&format!("order {id}: {e}; again in {RETRY_MS} ms"));
                return Verdict::retry(RETRY_MS);
            }
        };
        match response.status {
            200 => {}
            500..=599 => {
                log::warn(&format!(
                    "order {id}: scoring service answered {}; again in {RETRY_MS} ms",
                    response.status
                ));
                return Verdict::retry(RETRY_MS);
            }
            status => return Verdict::reject(format!("scoring service answered {status}")),
        }
        let score = serde_json::from_slice::<Value>(&response.body)
            .ok()
            .and_then(|answer| answer.get("score")?.as_i64());
        let Some(score) = score else {
            return Verdict::reject("scoring service answered without an integer `score`");
        };
        if score > self.max_score {
            return Verdict::reject(format!("score {score} > {}", self.max_score));
        }
        // `order` is an object (it has an `id`), so this adds a field.
        order["score"] = score.into();
        // Produced only if this record ends accepted, and before its Accept reaches the broker.
        let scored = order.to_string();
        match record.emit("scored", Some(id.as_bytes()), Some(scored.as_bytes()), &[]) {
            Ok(()) => Verdict::Accept,
            // The batch's emit budget is spent: the order comes back in a later batch.
            Err(e) => {
                log::warn(&format!("order {id}: {e}"));
                Verdict::Release
            }
        }
    }
}

sharehost_guest::export!(FraudCheck);

#[cfg(test)]
mod tests {
    use super::*;
    use sharehost_guest::EmitError;
    use sharehost_guest::http::{HttpError, Response};
    use sharehost_guest::testing;

    const URL: &str = "http://127.0.0.1:8088/score";
    const ORDER: &[u8] = br#"{"id":"o-1","amount":120.5,"customer":"c-7"}"#;

    fn fraud_check(config: &[(&str, &str)]) -> FraudCheck {
        let mut pairs = vec![("score-url", URL)];
        pairs.extend_from_slice(config);
        let config = Config::from_pairs(pairs).with_secret("scoring-token", "t0ken");
        FraudCheck::init(&config).expect("a valid configuration")
    }

    /// A clean fake host whose scoring service answers every call with `status` and `body`.
    fn service(status: u16, body: &'static str) {
        testing::reset();
        testing::http::mock(move |_| Ok(Response::new(status).with_body(body)));
    }

    fn judge(value: &[u8]) -> Verdict {
        fraud_check(&[]).handle(&Record::with_value(value))
    }

    #[test]
    fn a_low_score_emits_the_scored_order_keyed_by_its_id_and_accepts() {
        service(200, r#"{"score":12}"#);
        assert_eq!(judge(ORDER), Verdict::Accept);
        let sent = testing::http::take_requests();
        assert_eq!(sent.len(), 1);
        assert_eq!(
            (sent[0].method.as_str(), sent[0].url.as_str()),
            ("POST", URL)
        );
        assert_eq!(sent[0].body, ORDER, "the order as it came");
        assert_eq!(
            sent[0].header_value("content-type"),
            Some(&b"application/json"[..])
        );
        assert_eq!(
            sent[0].header_value("authorization"),
            Some(&b"Bearer t0ken"[..])
        );
        let emits = testing::take_emits();
        assert_eq!(emits.len(), 1);
        assert_eq!(emits[0].output, "scored");
        assert_eq!(emits[0].key.as_deref(), Some(&b"o-1"[..]));
        let scored: Value = serde_json::from_str(emits[0].value_str().unwrap_or_default())
            .expect("the emit is JSON");
        assert_eq!(
            scored,
            serde_json::json!({"id": "o-1", "amount": 120.5, "customer": "c-7", "score": 12})
        );
    }

    #[test]
    fn a_score_over_the_max_is_rejected_naming_both_and_emits_nothing() {
        service(200, r#"{"score":95}"#);
        assert_eq!(judge(ORDER), Verdict::reject("score 95 > 80"));
        assert!(testing::take_emits().is_empty());
        let mut lenient = fraud_check(&[("max-score", "95")]);
        assert_eq!(lenient.handle(&Record::with_value(ORDER)), Verdict::Accept);
    }

    #[test]
    fn a_5xx_is_retried_after_a_second_and_emits_nothing() {
        for status in [500, 503] {
            service(status, "");
            assert_eq!(judge(ORDER), Verdict::retry(1000), "{status}");
            assert!(testing::take_emits().is_empty());
        }
    }

    #[test]
    fn a_refused_connection_is_retried_after_a_second() {
        testing::reset();
        testing::http::mock(|_| Err(HttpError::Connect("connection refused".into())));
        assert_eq!(judge(ORDER), Verdict::retry(1000));
    }

    #[test]
    fn any_other_status_or_an_answer_without_a_score_is_rejected_naming_it() {
        service(404, "");
        assert_eq!(
            judge(ORDER),
            Verdict::reject("scoring service answered 404")
        );
        service(200, r#"{"score":"low"}"#);
        assert_eq!(
            judge(ORDER),
            Verdict::reject("scoring service answered without an integer `score`")
        );
    }

    #[test]
    fn a_tombstone_non_json_or_an_order_without_an_id_is_rejected_and_never_sent() {
        service(200, r#"{"score":1}"#);
        let tombstone = Record {
            value: None,
            ..Record::with_value(b"")
        };
        assert_eq!(
            fraud_check(&[]).handle(&tombstone),
            Verdict::reject("tombstone")
        );
        assert_eq!(judge(b"{oops"), Verdict::reject("not JSON"));
        for no_id in [&br#"{"amount":5}"#[..], br#"{"id":7}"#, b"[1]"] {
            assert_eq!(
                judge(no_id),
                Verdict::reject("`id` missing or not a string")
            );
        }
        assert!(testing::http::take_requests().is_empty());
    }

    #[test]
    fn a_refused_emit_releases_the_order() {
        service(200, r#"{"score":1}"#);
        testing::refuse_emits(|_| Err(EmitError::TooManyEmits(1)));
        assert_eq!(judge(ORDER), Verdict::Release);
    }

    #[test]
    fn init_refuses_a_configuration_without_score_url_a_token_or_a_whole_max_score() {
        let refusal = |config: Config| FraudCheck::init(&config).err().unwrap_or_default();
        let token = |c: Config| c.with_secret("scoring-token", "t0ken");
        assert!(refusal(token(Config::default())).starts_with("set `score-url`"));
        assert!(
            refusal(token(Config::from_pairs([("score-url", "/score")])))
                .starts_with("score-url `/score`")
        );
        for bad in ["lots", "-1", "8.5", ""] {
            let config = Config::from_pairs([("score-url", URL), ("max-score", bad)]);
            assert_eq!(
                refusal(token(config)),
                format!("max-score `{bad}` is not a whole number")
            );
        }
        assert!(
            refusal(Config::from_pairs([("score-url", URL)]))
                .starts_with("set the secret `scoring-token`")
        );
    }
}

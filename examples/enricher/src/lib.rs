//! Prices JSON orders over HTTP and emits the enriched order to the `enriched` output.
//!
//! For a batch, every distinct SKU is asked once, all at the same time
//! ([`http::send_all`]): `GET {pricing-url}/price/{sku}`, with `Authorization: Bearer TOKEN`
//! when the pipeline has the secret `api-token`. The service answers `{"unit_price": X}`.
//!
//! | the order | the price lookup | verdict |
//! |---|---|---|
//! | JSON object with a string `sku` and a positive integer `quantity` | 2xx with a `unit_price` | emit `{..order, "unit_price": X, "total": X × quantity}` to `enriched`, **accept** |
//! | same | 404 | **reject**: ``unknown sku `Z-9` `` |
//! | same | 429, 5xx, any other status, an unreadable price, or no answer (timeout, refused, not granted) | **retry** after `retry-after-ms` (or the 429/503's `Retry-After`, if longer) |
//! | anything else | none sent | **reject** with what is wrong (`not JSON` for bytes that are not JSON) |
//!
//! An emit the host refuses (the batch's emit budget is spent) releases the order instead of
//! accepting it, so an accepted order always has its enriched copy.
//!
//! Configuration: `pricing-url` (required, `http://` or `https://`), `retry-after-ms`
//! (default 2000), `output` (default `enriched`). Secret: `api-token` (optional).

use std::collections::HashMap;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::{Map, Value};
use sharehost_guest::http::{self, HttpError, Request, Response};
use sharehost_guest::{Config, EmitError, Plugin, Record, Verdict, log};

/// Characters of a SKU sent as they are in the URL path (RFC 3986 unreserved); everything
/// else, `/` included, is percent-encoded.
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// The enricher.
pub struct Enricher {
    pricing_url: String,
    token: Option<String>,
    retry_after_ms: u32,
    output: String,
}

/// An order that parsed: the JSON object, its SKU and quantity.
struct Order {
    object: Map<String, Value>,
    sku: String,
    quantity: u64,
}

/// What the pricing service said about one SKU.
#[derive(Debug, Clone, PartialEq)]
enum Price {
    Known(f64),
    Unknown,
    /// Ask again later, after this many milliseconds; the text says why (logged).
    Later(u32, String),
}

impl Enricher {
    /// Parses one order; `Err` is the rejection reason.
    fn parse(value: Option<&[u8]>) -> Result<Order, String> {
        let value = value.ok_or("null value (tombstone)")?;
        // The reason is the same in every language (the Python and JavaScript twins read JSON
        // with other parsers); the parser's own words go to the log.
        let order: Value = serde_json::from_slice(value).map_err(|e| {
            log::debug(&format!("not JSON: {e}"));
            "not JSON".to_owned()
        })?;
        let Value::Object(object) = order else {
            return Err("not a JSON object".into());
        };
        let sku = match object.get("sku") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => return Err("`sku` missing, empty or not a string".into()),
        };
        let quantity = match object.get("quantity").and_then(Value::as_u64) {
            Some(q) if q > 0 => q,
            _ => return Err("`quantity` missing or not a positive integer".into()),
        };
        Ok(Order {
            object,
            sku,
            quantity,
        })
    }

    /// The lookup request for `sku`.
    fn request(&self, sku: &str) -> Request {
        let url = format!(
            "{}/price/{}",
            self.pricing_url,
            utf8_percent_encode(sku, PATH_SEGMENT)
        );
        match &self.token {
            Some(token) => Request::get(url).bearer_auth(token),
            None => Request::get(url),
        }
    }

    /// Reads one answer of the pricing service.
    fn price(&self, answer: Result<Response, HttpError>) -> Price {
        let response = match answer {
            Ok(r) => r,
            Err(e) => return Price::Later(self.retry_after_ms, e.to_string()),
        };
        match response.status {
            200..=299 => {
                let unit_price = serde_json::from_slice::<Value>(&response.body)
                    .ok()
                    .and_then(|v| v.get("unit_price").and_then(Value::as_f64));
                match unit_price {
                    Some(p) if p.is_finite() => Price::Known(p),
                    _ => Price::Later(
                        self.retry_after_ms,
                        "pricing service answered without a numeric `unit_price`".into(),
                    ),
                }
            }
            404 => Price::Unknown,
            status => {
                // A `Retry-After` in seconds (429, 503) is honoured when it asks for longer.
                let asked = response
                    .header("retry-after")
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .and_then(|s| s.trim().parse::<u32>().ok())
                    .map_or(0, |secs| secs.saturating_mul(1000));
                Price::Later(
                    self.retry_after_ms.max(asked),
                    format!("pricing service answered {status}"),
                )
            }
        }
    }

    /// The enriched order, emitted; the verdict for its record.
    fn emit(&self, record: &Record<'_>, mut order: Order, unit_price: f64) -> Verdict {
        // Cents: a total is money, and 0.1 × 3 should read 0.3.
        let total = (unit_price * order.quantity as f64 * 100.0).round() / 100.0;
        order.object.insert("unit_price".into(), unit_price.into());
        order.object.insert("total".into(), total.into());
        let value = Value::Object(order.object).to_string();
        match record.emit(&self.output, record.key, Some(value.as_bytes()), &[]) {
            Ok(()) => Verdict::Accept,
            // The batch's budget is spent: the order comes back in a later batch.
            Err(e @ (EmitError::TooManyEmits(_) | EmitError::TooManyBytes(_))) => {
                log::debug(&format!("offset {}: {e}; released", record.offset));
                Verdict::Release
            }
            // A manifest without our output: wait for the operator rather than lose orders.
            Err(e) => {
                log::error(&format!("offset {}: emit refused: {e}", record.offset));
                Verdict::retry(self.retry_after_ms)
            }
        }
    }
}

impl Plugin for Enricher {
    fn init(config: &Config) -> Result<Self, String> {
        let pricing_url = config
            .get("pricing-url")
            .ok_or("set `pricing-url` (e.g. http://127.0.0.1:8088)")?
            .trim_end_matches('/')
            .to_owned();
        Request::get(format!("{pricing_url}/price/x"))
            .validate()
            .map_err(|e| format!("pricing-url `{pricing_url}`: {e}"))?;
        let retry_after_ms = match config.get("retry-after-ms") {
            Some(s) => s
                .parse()
                .map_err(|e| format!("retry-after-ms `{s}`: {e}"))?,
            None => 2000,
        };
        Ok(Self {
            pricing_url,
            token: config.secret("api-token").map(str::to_owned),
            retry_after_ms,
            output: config.get("output").unwrap_or("enriched").to_owned(),
        })
    }

    fn handle(&mut self, record: &Record<'_>) -> Verdict {
        let mut verdicts = Vec::with_capacity(1);
        self.handle_batch(std::slice::from_ref(record), &mut verdicts);
        verdicts.pop().unwrap_or(Verdict::Release)
    }

    fn handle_batch(&mut self, records: &[Record<'_>], verdicts: &mut Vec<Verdict>) {
        let orders: Vec<Result<Order, String>> =
            records.iter().map(|r| Self::parse(r.value)).collect();
        // One lookup per distinct SKU of the batch, all in flight at once.
        let mut requests: Vec<Request> = Vec::new();
        let mut position: HashMap<String, usize> = HashMap::new();
        for order in orders.iter().flatten() {
            if !position.contains_key(&order.sku) {
                position.insert(order.sku.clone(), requests.len());
                requests.push(self.request(&order.sku));
            }
        }
        let answers = http::send_all(requests);
        let prices: Vec<Price> = answers.into_iter().map(|a| self.price(a)).collect();
        if let Some(Price::Later(ms, why)) = prices.iter().find(|p| matches!(p, Price::Later(..))) {
            log::warn(&format!(
                "pricing lookups will be retried in {ms} ms: {why}"
            ));
        }
        for (record, order) in records.iter().zip(orders) {
            let verdict = match order {
                Err(reason) => Verdict::reject(reason),
                Ok(order) => match position
                    .get(order.sku.as_str())
                    .and_then(|&i| prices.get(i))
                {
                    Some(Price::Known(p)) => self.emit(record, order, *p),
                    Some(Price::Unknown) => Verdict::reject(format!("unknown sku `{}`", order.sku)),
                    Some(Price::Later(ms, _)) => Verdict::retry(*ms),
                    None => Verdict::Release,
                },
            };
            verdicts.push(verdict);
        }
    }
}

sharehost_guest::export!(Enricher);

#[cfg(test)]
mod tests {
    use super::*;
    use sharehost_guest::testing;

    const URL: &str = "http://127.0.0.1:8088";

    fn enricher(config: &[(&str, &str)]) -> Enricher {
        let mut pairs = vec![("pricing-url", URL)];
        pairs.extend_from_slice(config);
        Enricher::init(&Config::from_pairs(pairs)).expect("valid config")
    }

    /// A pricing service: A-1 costs 2.5, B-2 costs 0.1, anything else is unknown.
    fn prices() {
        testing::http::mock(|req| {
            let price = match req.url.rsplit('/').next() {
                Some("A-1") => "2.5",
                Some("B-2") => "0.1",
                _ => return Ok(Response::new(404)),
            };
            Ok(Response::new(200).with_body(format!(r#"{{"unit_price":{price}}}"#)))
        });
    }

    fn judge(e: &mut Enricher, values: &[&[u8]]) -> Vec<Verdict> {
        let records: Vec<Record<'_>> = values
            .iter()
            .enumerate()
            .map(|(i, v)| Record::with_value(v).at_index(i as u32).key(b"k"))
            .collect();
        let mut verdicts = Vec::new();
        e.handle_batch(&records, &mut verdicts);
        verdicts
    }

    #[test]
    fn a_priced_order_is_emitted_enriched_to_the_output_and_accepted() {
        testing::reset();
        prices();
        let mut e = enricher(&[]);
        let verdicts = judge(
            &mut e,
            &[
                br#"{"id":"o1","sku":"A-1","quantity":3}"#,
                br#"{"id":"o2","sku":"B-2","quantity":3,"note":"x"}"#,
            ],
        );
        assert_eq!(verdicts, vec![Verdict::Accept, Verdict::Accept]);
        let emits = testing::take_emits();
        assert_eq!(emits.len(), 2);
        assert_eq!(
            (emits[0].record_index, emits[0].output.as_str()),
            (0, "enriched")
        );
        assert_eq!(emits[0].key.as_deref(), Some(&b"k"[..]));
        let first: Value = serde_json::from_slice(emits[0].value.as_deref().unwrap_or_default())
            .expect("the emit is JSON");
        assert_eq!(
            first,
            serde_json::json!({"id":"o1","sku":"A-1","quantity":3,"unit_price":2.5,"total":7.5})
        );
        let second: Value = serde_json::from_slice(emits[1].value.as_deref().unwrap_or_default())
            .expect("the emit is JSON");
        assert_eq!(
            second["total"],
            serde_json::json!(0.3),
            "totals are rounded to cents"
        );
        assert_eq!(second["note"], "x", "the order's other fields are kept");
    }

    #[test]
    fn an_unknown_sku_is_rejected_with_a_reason_and_emits_nothing() {
        testing::reset();
        prices();
        let mut e = enricher(&[]);
        let verdicts = judge(&mut e, &[br#"{"id":"o1","sku":"Z-9","quantity":1}"#]);
        assert_eq!(verdicts, vec![Verdict::reject("unknown sku `Z-9`")]);
        assert!(testing::take_emits().is_empty());
    }

    #[test]
    fn malformed_orders_are_rejected_with_what_is_wrong_and_never_looked_up() {
        testing::reset();
        prices();
        let mut e = enricher(&[]);
        let verdicts = judge(
            &mut e,
            &[
                b"{oops",
                b"[1]",
                br#"{"sku":"A-1"}"#,
                br#"{"sku":"","quantity":1}"#,
                br#"{"sku":"A-1","quantity":0}"#,
            ],
        );
        assert!(
            matches!(&verdicts[0], Verdict::Reject(Some(r)) if r == "not JSON"),
            "{verdicts:?}"
        );
        assert_eq!(verdicts[1], Verdict::reject("not a JSON object"));
        assert_eq!(
            verdicts[2],
            Verdict::reject("`quantity` missing or not a positive integer")
        );
        assert_eq!(
            verdicts[3],
            Verdict::reject("`sku` missing, empty or not a string")
        );
        assert_eq!(
            verdicts[4],
            Verdict::reject("`quantity` missing or not a positive integer")
        );
        assert!(testing::http::take_requests().is_empty());
        assert!(testing::take_emits().is_empty());
    }

    #[test]
    fn a_batch_asks_once_per_distinct_sku_with_the_bearer_token() {
        testing::reset();
        prices();
        let config = Config::from_pairs([("pricing-url", "http://127.0.0.1:8088/")])
            .with_secret("api-token", "t0ken");
        let mut e = Enricher::init(&config).expect("valid config");
        let verdicts = judge(
            &mut e,
            &[
                br#"{"sku":"A-1","quantity":1}"#,
                br#"{"sku":"B-2","quantity":1}"#,
                br#"{"sku":"A-1","quantity":2}"#,
                br#"{"sku":"a b/c","quantity":2}"#,
            ],
        );
        assert_eq!(
            verdicts[..3],
            [Verdict::Accept, Verdict::Accept, Verdict::Accept]
        );
        let sent = testing::http::take_requests();
        let urls: Vec<&str> = sent.iter().map(|r| r.url.as_str()).collect();
        assert_eq!(
            urls,
            [
                "http://127.0.0.1:8088/price/A-1",
                "http://127.0.0.1:8088/price/B-2",
                "http://127.0.0.1:8088/price/a%20b%2Fc"
            ]
        );
        assert!(
            sent.iter()
                .all(|r| r.header_value("authorization") == Some(b"Bearer t0ken"))
        );
        assert_eq!(testing::take_emits().len(), 3);
    }

    #[test]
    fn without_the_secret_no_authorization_header_is_sent() {
        testing::reset();
        prices();
        let mut e = enricher(&[]);
        judge(&mut e, &[br#"{"sku":"A-1","quantity":1}"#]);
        let sent = testing::http::take_requests();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].header_value("authorization"), None);
    }

    #[test]
    fn a_429_a_5xx_or_no_answer_is_retried_after_the_configured_delay() {
        testing::reset();
        testing::http::mock(|req| match req.url.rsplit('/').next() {
            Some("busy") => Ok(Response::new(429)),
            Some("down") => Ok(Response::new(503)),
            Some("slow") => Ok(Response::new(429).with_header("Retry-After", "7")),
            _ => Err(HttpError::Connect("connection refused".into())),
        });
        let mut e = enricher(&[("retry-after-ms", "1500")]);
        let verdicts = judge(
            &mut e,
            &[
                br#"{"sku":"busy","quantity":1}"#,
                br#"{"sku":"down","quantity":1}"#,
                br#"{"sku":"gone","quantity":1}"#,
                br#"{"sku":"slow","quantity":1}"#,
            ],
        );
        assert_eq!(
            verdicts,
            [
                Verdict::retry(1500),
                Verdict::retry(1500),
                Verdict::retry(1500),
                Verdict::retry(7000)
            ]
        );
        assert!(
            testing::take_emits().is_empty(),
            "a retried order emits nothing"
        );
    }

    #[test]
    fn a_refused_emit_releases_the_order_instead_of_accepting_it() {
        testing::reset();
        prices();
        testing::refuse_emits(|emit| match emit.record_index {
            0 => Ok(()),
            _ => Err(EmitError::TooManyEmits(1)),
        });
        let mut e = enricher(&[]);
        let verdicts = judge(
            &mut e,
            &[
                br#"{"sku":"A-1","quantity":1}"#,
                br#"{"sku":"A-1","quantity":2}"#,
            ],
        );
        assert_eq!(verdicts, [Verdict::Accept, Verdict::Release]);
        assert_eq!(testing::take_emits().len(), 1);
    }

    #[test]
    fn init_refuses_a_missing_or_unusable_pricing_url() {
        assert!(Enricher::init(&Config::default()).is_err());
        for url in ["127.0.0.1:8088", "ftp://host", "/relative"] {
            let err = Enricher::init(&Config::from_pairs([("pricing-url", url)]))
                .err()
                .unwrap_or_default();
            assert!(
                err.starts_with(&format!("pricing-url `{url}`")),
                "{url}: {err}"
            );
        }
        let err = Enricher::init(&Config::from_pairs([
            ("pricing-url", URL),
            ("retry-after-ms", "soon"),
        ]))
        .err()
        .unwrap_or_default();
        assert!(err.starts_with("retry-after-ms `soon`"), "{err}");
    }

    #[test]
    fn handle_alone_prices_one_order() {
        testing::reset();
        prices();
        let mut e = enricher(&[("output", "priced")]);
        let v = e.handle(&Record::with_value(br#"{"sku":"B-2","quantity":10}"#));
        assert_eq!(v, Verdict::Accept);
        assert_eq!(testing::take_emits()[0].output, "priced");
    }
}

//! A slow processor: each record costs some work units (header `cost`, default 1) and a batch
//! may spend at most `budget` units (default 10). Records that do not fit are **renewed**:
//! the broker keeps them locked for this consumer and delivers them again, instead of
//! handing them to someone else or counting them as failed. A record that has been delivered
//! more than `max-deliveries` times (default 5) is rejected so it cannot circulate forever.

use sharehost_guest::{Config, Plugin, Record, Verdict};

/// The slow processor.
pub struct SlowRenew {
    budget: u64,
    max_deliveries: u16,
}

fn parse<T: std::str::FromStr>(config: &Config, key: &str, default: T) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    match config.get(key) {
        Some(s) => s.parse().map_err(|e| format!("{key} `{s}`: {e}")),
        None => Ok(default),
    }
}

fn cost(record: &Record<'_>) -> u64 {
    record
        .header("cost")
        .flatten()
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

impl Plugin for SlowRenew {
    fn init(config: &Config) -> Result<Self, String> {
        Ok(Self {
            budget: parse(config, "budget", 10)?,
            max_deliveries: parse(config, "max-deliveries", 5)?,
        })
    }

    fn handle(&mut self, record: &Record<'_>) -> Verdict {
        let mut out = Vec::with_capacity(1);
        self.handle_batch(std::slice::from_ref(record), &mut out);
        out.pop().unwrap_or(Verdict::Release)
    }

    fn handle_batch(&mut self, records: &[Record<'_>], verdicts: &mut Vec<Verdict>) {
        let mut left = self.budget;
        for r in records {
            let c = cost(r);
            let v = if r.delivery_count > self.max_deliveries {
                Verdict::reject(format!(
                    "not processed after {} deliveries",
                    self.max_deliveries
                ))
            } else if c <= left {
                left -= c; // "do the work"
                Verdict::Accept
            } else {
                Verdict::Renew
            };
            verdicts.push(v);
        }
    }
}

sharehost_guest::export!(SlowRenew);

#[cfg(test)]
mod tests {
    use super::*;
    use sharehost_guest::Header;

    #[test]
    fn renews_what_does_not_fit_the_budget() {
        let mut p = SlowRenew::init(&Config::from_pairs([("budget", "3")])).expect("config");
        let heavy = [Header {
            key: "cost",
            value: Some(b"2"),
        }];
        let batch = [
            Record::with_value(b"a").headers(&heavy),
            Record::with_value(b"b").headers(&heavy),
            Record::with_value(b"c"),
        ];
        let mut out = Vec::new();
        p.handle_batch(&batch, &mut out);
        assert_eq!(out, vec![Verdict::Accept, Verdict::Renew, Verdict::Accept]);
    }

    #[test]
    fn rejects_after_too_many_deliveries() {
        let mut p = SlowRenew::init(&Config::default()).expect("config");
        let v = p.handle(&Record::with_value(b"a").delivery_count(6));
        assert_eq!(v, Verdict::reject("not processed after 5 deliveries"));
    }
}

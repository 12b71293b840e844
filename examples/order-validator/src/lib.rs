//! Validates JSON orders and rejects malformed ones with a reason.
//!
//! An order is a JSON object `{"id": "...", "sku": "...", "quantity": N, "price": X}` with a
//! non-empty `id` and `sku`, `quantity` an integer in `1..=max-quantity`, and `price` a
//! non-negative number. Anything else is rejected (so it never comes back, and lands in the
//! dead-letter topic when one is configured) with a reason saying what is wrong.
//!
//! Configuration: `max-quantity` (default 1000).

pub mod check;

use sharehost_guest::{Config, Plugin, Record, Verdict, log};

/// The order validator.
pub struct OrderValidator {
    max_quantity: u64,
}

impl OrderValidator {
    /// Checks one value; `Err` is the rejection reason.
    pub fn check(&self, value: Option<&[u8]>) -> Result<(), String> {
        check::check(value, self.max_quantity, |e| {
            log::debug(&format!("not JSON: {e}"))
        })
    }
}

impl Plugin for OrderValidator {
    fn init(config: &Config) -> Result<Self, String> {
        let max_quantity = match config.get("max-quantity") {
            Some(s) => s.parse().map_err(|e| format!("max-quantity `{s}`: {e}"))?,
            None => 1000,
        };
        Ok(Self { max_quantity })
    }

    fn handle(&mut self, record: &Record<'_>) -> Verdict {
        match self.check(record.value) {
            Ok(()) => Verdict::Accept,
            Err(reason) => {
                log::debug(&format!("offset {}: {reason}", record.offset));
                Verdict::Reject(Some(reason))
            }
        }
    }
}

sharehost_guest::export!(OrderValidator);

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(v: &[u8]) -> Verdict {
        let mut p = OrderValidator::init(&Config::from_pairs([("max-quantity", "10")]))
            .expect("valid config");
        p.handle(&Record::with_value(v))
    }

    #[test]
    fn accepts_a_valid_order() {
        assert_eq!(
            judge(br#"{"id":"o1","sku":"A-1","quantity":2,"price":9.5}"#),
            Verdict::Accept
        );
    }

    #[test]
    fn rejects_malformed_orders_with_a_reason() {
        let reason = |v: &[u8]| match judge(v) {
            Verdict::Reject(Some(r)) => r,
            other => panic!("expected a rejection, got {other:?}"),
        };
        assert_eq!(reason(b"{oops"), "not JSON");
        assert_eq!(reason(b"[1]"), "not a JSON object");
        assert_eq!(
            reason(br#"{"sku":"A","quantity":1,"price":1}"#),
            "`id` missing or not a string"
        );
        assert_eq!(
            reason(br#"{"id":"o","sku":"A","quantity":11,"price":1}"#),
            "`quantity` 11 outside 1..=10"
        );
        assert_eq!(
            reason(br#"{"id":"o","sku":"A","quantity":1,"price":-1}"#),
            "`price` -1 is negative"
        );
    }

    #[test]
    fn refuses_a_bad_configuration() {
        assert!(OrderValidator::init(&Config::from_pairs([("max-quantity", "x")])).is_err());
    }
}

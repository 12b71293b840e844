//! Accepts every record without looking at it: measures the runtime's own cost per record.

use sharehost_guest::{Config, Plugin, Record, Verdict};

/// The accept-all plugin.
pub struct AcceptAll;

impl Plugin for AcceptAll {
    fn init(_config: &Config) -> Result<Self, String> {
        Ok(AcceptAll)
    }

    fn handle(&mut self, _record: &Record<'_>) -> Verdict {
        Verdict::Accept
    }

    fn handle_batch(&mut self, records: &[Record<'_>], verdicts: &mut Vec<Verdict>) {
        verdicts.resize(records.len(), Verdict::Accept);
    }
}

sharehost_guest::export!(AcceptAll);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_everything() {
        let mut p = AcceptAll::init(&Config::default()).expect("init");
        let mut out = Vec::new();
        p.handle_batch(
            &[Record::with_value(b"a"), Record::with_value(b"")],
            &mut out,
        );
        assert_eq!(out, vec![Verdict::Accept, Verdict::Accept]);
    }
}

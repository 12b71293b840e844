//! Filters (routes) records by a header, or by key prefix when no header is configured.
//!
//! Records whose header `header` (default `type`) has one of the values in `accept`
//! (comma-separated) are accepted; records with another value are rejected with the reason
//! `filtered: type=VALUE`; records without the header get the `missing` verdict (`release`
//! by default: let another consumer with a different filter have it). With `key-prefix`
//! set, the key must start with it instead.

use sharehost_guest::{Config, Plugin, Record, Verdict};

/// The router.
pub struct Router {
    header: String,
    accept: Vec<String>,
    key_prefix: Option<String>,
    missing: Verdict,
}

impl Plugin for Router {
    fn init(config: &Config) -> Result<Self, String> {
        let missing = match config.get("missing").unwrap_or("release") {
            "release" => Verdict::Release,
            "accept" => Verdict::Accept,
            "reject" => Verdict::reject("missing routing header"),
            other => return Err(format!("missing: `{other}` is not accept|release|reject")),
        };
        let accept: Vec<String> = config
            .get("accept")
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let key_prefix = config.get("key-prefix").map(str::to_owned);
        if accept.is_empty() && key_prefix.is_none() {
            return Err("set `accept` (header values) or `key-prefix`".into());
        }
        Ok(Self {
            header: config.get("header").unwrap_or("type").to_owned(),
            accept,
            key_prefix,
            missing,
        })
    }

    fn handle(&mut self, record: &Record<'_>) -> Verdict {
        if let Some(prefix) = &self.key_prefix {
            return match record.key {
                Some(k) if k.starts_with(prefix.as_bytes()) => Verdict::Accept,
                Some(_) => Verdict::reject("filtered: key prefix"),
                None => self.missing.clone(),
            };
        }
        match record.header(&self.header) {
            Some(Some(v)) if self.accept.iter().any(|a| a.as_bytes() == v) => Verdict::Accept,
            Some(Some(v)) => Verdict::reject(format!(
                "filtered: {}={}",
                self.header,
                String::from_utf8_lossy(v)
            )),
            Some(None) | None => self.missing.clone(),
        }
    }
}

sharehost_guest::export!(Router);

#[cfg(test)]
mod tests {
    use super::*;
    use sharehost_guest::Header;

    #[test]
    fn routes_by_header_value() {
        let mut r =
            Router::init(&Config::from_pairs([("accept", "order, refund")])).expect("valid config");
        let order = [Header {
            key: "type",
            value: Some(b"order"),
        }];
        let spam = [Header {
            key: "type",
            value: Some(b"spam"),
        }];
        assert_eq!(
            r.handle(&Record::with_value(b"").headers(&order)),
            Verdict::Accept
        );
        assert_eq!(
            r.handle(&Record::with_value(b"").headers(&spam)),
            Verdict::reject("filtered: type=spam")
        );
        assert_eq!(r.handle(&Record::with_value(b"")), Verdict::Release);
    }

    #[test]
    fn routes_by_key_prefix() {
        let mut r = Router::init(&Config::from_pairs([
            ("key-prefix", "eu-"),
            ("missing", "reject"),
        ]))
        .expect("valid config");
        assert_eq!(
            r.handle(&Record::with_value(b"").key(b"eu-1")),
            Verdict::Accept
        );
        assert_eq!(
            r.handle(&Record::with_value(b"").key(b"us-1")),
            Verdict::reject("filtered: key prefix")
        );
        assert_eq!(
            r.handle(&Record::with_value(b"")),
            Verdict::reject("missing routing header")
        );
    }

    #[test]
    fn needs_a_rule() {
        assert!(Router::init(&Config::default()).is_err());
    }
}

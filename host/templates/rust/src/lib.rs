//! {{name}}: a sharehost plugin. It rejects tombstones and values larger than `max-bytes`
//! (plugin config, default 1024) and accepts the rest. Change `handle` to judge your records.

use sharehost_guest::{Config, Plugin, Record, Verdict, log};

pub struct {{type}} {
    max: usize,
}

impl Plugin for {{type}} {
    // Called on every fresh instance with the pipeline's configuration; Err refuses it.
    fn init(config: &Config) -> Result<Self, String> {
        let max = config.get("max-bytes").unwrap_or("1024");
        let max = max.parse().map_err(|e| format!("max-bytes `{max}`: {e}"))?;
        Ok(Self { max })
    }

    // One verdict per record.
    fn handle(&mut self, record: &Record<'_>) -> Verdict {
        match record.value {
            None => Verdict::reject("tombstone"),
            Some(v) if v.len() > self.max => {
                log::info(&format!("offset {}: {} B", record.offset, v.len()));
                Verdict::reject(format!("{} bytes > {}", v.len(), self.max))
            }
            Some(_) => Verdict::Accept,
        }
    }
}

sharehost_guest::export!({{type}});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_tombstones_and_large_values() {
        let mut p = {{type}}::init(&Config::from_pairs([("max-bytes", "3")])).unwrap();
        assert_eq!(p.handle(&Record::with_value(b"abc")), Verdict::Accept);
        assert_eq!(
            p.handle(&Record::with_value(b"abcd")),
            Verdict::reject("4 bytes > 3")
        );
    }
}

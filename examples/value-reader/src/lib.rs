//! Reads every byte of every value: the benchmark's "inspect" guest.
//!
//! Rejects a record when its value does not start with `{` or when the wrapping sum of its
//! bytes is divisible by 16 (about 11% of random text), so the work cannot be optimised away.
//! `host/benches/runtime.rs` and `host/examples/pipeline_bench.rs` run the same source
//! (`judge.rs`) natively for comparison.

pub mod judge;

use sharehost_guest::{Config, Plugin, Record, Verdict};

/// The value-reading plugin.
pub struct ValueReader;

/// The judgement, shared by the plugin and its tests.
pub fn judge(value: Option<&[u8]>) -> Verdict {
    if judge::accepts(value) {
        Verdict::Accept
    } else {
        Verdict::Reject(None)
    }
}

impl Plugin for ValueReader {
    fn init(_config: &Config) -> Result<Self, String> {
        Ok(ValueReader)
    }

    fn handle(&mut self, record: &Record<'_>) -> Verdict {
        judge(record.value)
    }
}

sharehost_guest::export!(ValueReader);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_non_objects_and_sums_divisible_by_16() {
        assert_eq!(judge(Some(b"{a")), Verdict::Accept); // 123 + 97 = 220
        assert_eq!(judge(Some(b"a")), Verdict::Reject(None));
        assert_eq!(judge(Some(b"{\x05")), Verdict::Reject(None)); // 128
        assert_eq!(judge(None), Verdict::Reject(None));
    }
}

//! The value reader's judgement, free of the plugin SDK, so the host's benchmarks run the very
//! same source natively (`host/benches/runtime.rs`, `host/examples/pipeline_bench.rs`).

/// Whether a value is accepted: it starts with `{` and the wrapping sum of its bytes is not
/// divisible by 16 (about 11% of random text is not), so reading every byte cannot be skipped.
pub fn accepts(value: Option<&[u8]>) -> bool {
    let v = value.unwrap_or(&[]);
    let sum = v
        .iter()
        .fold(0u32, |acc, b| acc.wrapping_add(u32::from(*b)));
    v.first() == Some(&b'{') && sum % 16 != 0
}

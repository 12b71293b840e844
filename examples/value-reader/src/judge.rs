//! The value reader's judgement, free of the plugin SDK, so the host's benchmarks run the very
//! same source natively (`host/benches/runtime.rs`, `host/examples/pipeline_bench.rs`).

/// Whether a value is accepted: it starts with `{` and the wrapping sum of its bytes is not
/// divisible by 16 (about 11% of random text is not), so reading every byte cannot be skipped.
pub fn accepts(value: Option<&[u8]>) -> bool {
    let v = value.unwrap_or(&[]);
    v.first() == Some(&b'{') && !byte_sum(v).is_multiple_of(16)
}

/// The wrapping sum of the bytes, eight at a time: each u64 word's bytes are added pairwise
/// into four 16-bit lanes (SWAR), flushed before a lane can overflow. Byte-at-a-time code is
/// what wasm32 compilers emit for a plain fold (LLVM vectorizes it for x86, not for wasm32),
/// and it cost the Wasm plugin 4x the native time at 1 KiB (docs/benchmarks.md).
fn byte_sum(v: &[u8]) -> u32 {
    const EVEN: u64 = 0x00ff_00ff_00ff_00ff;
    // A lane gains at most 2 x 255 per word: 128 words stay under 65,536.
    const WORDS_PER_FLUSH: usize = 128;
    let mut words = v.chunks_exact(8);
    let mut sum = 0u32;
    let mut lanes = 0u64;
    let mut pending = 0;
    for word in &mut words {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        let w = u64::from_le_bytes(bytes);
        lanes += (w & EVEN) + ((w >> 8) & EVEN);
        pending += 1;
        if pending == WORDS_PER_FLUSH {
            sum = sum.wrapping_add(lane_total(lanes));
            lanes = 0;
            pending = 0;
        }
    }
    sum = sum.wrapping_add(lane_total(lanes));
    words
        .remainder()
        .iter()
        .fold(sum, |acc, b| acc.wrapping_add(u32::from(*b)))
}

/// The sum of the four 16-bit lanes of `lanes`.
fn lane_total(lanes: u64) -> u32 {
    ((lanes & 0xffff) + ((lanes >> 16) & 0xffff) + ((lanes >> 32) & 0xffff) + (lanes >> 48)) as u32
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_word_sum_is_the_plain_byte_sum_at_every_length_and_byte() {
        let plain = |v: &[u8]| v.iter().fold(0u32, |a, b| a.wrapping_add(u32::from(*b)));
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        for len in (0..300).chain([1023, 1024, 1025, 8 * 128 * 3 + 5, 70_000]) {
            let v: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            assert_eq!(super::byte_sum(&v), plain(&v), "random bytes, length {len}");
            let full = vec![0xffu8; len];
            assert_eq!(
                super::byte_sum(&full),
                plain(&full),
                "0xff bytes, length {len}"
            );
        }
    }
}

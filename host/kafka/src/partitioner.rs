//! Which partition a record goes to, the way the Java client's default partitioner decides:
//! by the murmur2 hash of its key, and (sharehost's own rule for keyless records) by a
//! partition the caller names, modulo the topic's count. One place for every writer (outputs,
//! dead letters, replays), so a record rewritten after a crash lands beside the first copy.

/// The partition of a record with `key` in a topic of `partitions` partitions: by key like the
/// Java client, else `fallback` modulo the count. A topic that reports no partitions counts as
/// one (no division by zero).
pub fn by_key_or(key: Option<&[u8]>, fallback: i32, partitions: usize) -> i32 {
    let n = u32::try_from(partitions.max(1)).unwrap_or(u32::MAX);
    let p = match key {
        Some(k) => (murmur2(k) & 0x7fff_ffff) % n,
        None => fallback.unsigned_abs() % n,
    };
    // Below `n`, itself at most u32::MAX: always fits an i32 after the mask or for real counts.
    i32::try_from(p).unwrap_or(0)
}

/// Kafka's murmur2 (the Java client's `Utils.murmur2`, seed 0x9747b28c), written out because
/// the default partitioner's exact hash is a fact of the Java client no Rust crate we use
/// exposes.
pub fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_the_java_clients_default_partitioner() {
        // Values from the Java client's UtilsTest.testMurmur2.
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            (b"abc", 479470107),
        ];
        for (input, want) in cases {
            assert_eq!(murmur2(input) as i32, want, "{input:?}");
        }
    }

    #[test]
    fn keyless_records_go_to_their_fallback_modulo_the_count() {
        assert_eq!(by_key_or(None, 7, 3), 1);
        assert_eq!(by_key_or(None, -7, 3), 1);
        assert_eq!(by_key_or(None, 5, 0), 0, "no division by zero");
        assert_eq!(
            by_key_or(Some(b"foobar"), 0, 12),
            ((murmur2(b"foobar") & 0x7fff_ffff) % 12) as i32
        );
    }
}

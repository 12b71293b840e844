//! Record batches as a Fetch or ShareFetch response carries them, through `decode_batches`
//! (v2 batches in every codec kafka-protocol is built with: none, gzip, snappy, lz4, zstd).
//!
//! Input: `[codec, batches...]` (see `sharehost_fuzz::batch_layout`).
//!
//! Asserts, for whatever decodes: header keys are unique per record, and the records re-encoded
//! with `encode_batch` in the selected codec decode back to the same keys, values, headers and
//! timestamps. Anything else must be an error, not a panic, an abort or an unbounded allocation
//! (libFuzzer's RSS limit catches the latter).
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use sharehost::kafka::records::decode_batches;
use sharehost_fuzz::batch_layout::codec;
use sharehost_fuzz::{assert_records_round_trip, assert_unique_header_keys};

fuzz_target!(|data: &[u8]| {
    let [codec_b, batches @ ..] = data else {
        return;
    };
    let Ok(records) = decode_batches(Bytes::copy_from_slice(batches)) else {
        return;
    };
    records.iter().for_each(assert_unique_header_keys);
    assert_records_round_trip(&records, codec(*codec_b));
});

//! Produce response frames (header and body, versions 3..=13), decoded exactly as the host
//! decodes them: `kafka::frame::decode_response`, i.e. the bounded pre-pass of
//! `kafka::bounded`, then kafka-protocol.
//!
//! Input: `[version selector, frame...]` (see `sharehost_fuzz::response`).
//!
//! Asserts: no panic or abort; no single allocation out of proportion to the input (a lying
//! array length used to ask for gigabytes and abort); a refused frame is an error with a
//! message; what decodes re-encodes into a body the pre-pass accepts and decodes back equal.
#![no_main]

use kafka_protocol::messages::{ApiKey, ProduceResponse};
use libfuzzer_sys::fuzz_target;
use sharehost_fuzz::response::{CountingAlloc, check};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fuzz_target!(|data: &[u8]| check::<ProduceResponse>(ApiKey::Produce, 3..=13, data));

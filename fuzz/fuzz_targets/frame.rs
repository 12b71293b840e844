//! Response frames as a broker connection reads them: `read_frame` over a byte stream that
//! arrives in arbitrary chunks, then `peek_correlation_id` and `decode_response` (response
//! header, then a ShareFetch or ShareAcknowledge body) on each frame.
//!
//! Input: `[limit, pattern, api, stream...]` (see `sharehost_fuzz::frame_layout`).
//!
//! Asserts, against a model computed from the stream independently:
//! - each frame is exactly the bytes its length prefix announces, and the reader stops right
//!   after it (the next frame starts where the model says);
//! - a short or negative length is `BadLength`, one over the limit `TooLarge`, and an end of
//!   stream is `Closed` with `mid_frame` set exactly when part of a frame had arrived;
//! - a lying length prefix costs memory in proportion to the bytes that arrived, never to the
//!   length announced (checked by counting allocations while `read_frame` runs);
//! - the correlation id is the frame's first four bytes.
#![no_main]

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;
use libfuzzer_sys::fuzz_target;
use sharehost::kafka::frame::{FrameError, decode_response, peek_correlation_id, read_frame};
use sharehost::kafka::protocol::share::{ShareAcknowledgeResponse, ShareFetchResponse};
use sharehost_fuzz::alloc::{CountingAlloc, largest_allocation};
use sharehost_fuzz::frame_layout::{Api, api, limit};
use sharehost_fuzz::{ChunkedReader, block_on};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// What the reader must do with the stream from `at` on.
#[derive(Debug, PartialEq)]
enum Expect<'a> {
    Frame(&'a [u8]),
    Closed { mid_frame: bool },
    BadLength(i32),
    TooLarge(i64),
}

fn expect(stream: &[u8], at: usize, max: usize) -> Expect<'_> {
    let rest = &stream[at..];
    let Some(prefix) = rest.get(..4) else {
        return Expect::Closed {
            mid_frame: !rest.is_empty(),
        };
    };
    let len = i32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
    if len < 4 {
        return Expect::BadLength(len);
    }
    if len as usize > max {
        return Expect::TooLarge(i64::from(len));
    }
    match rest.get(4..4 + len as usize) {
        Some(frame) => Expect::Frame(frame),
        None => Expect::Closed { mid_frame: true },
    }
}

/// Largest single allocation `read_frame` may make after `arrived` bytes: its buffer grows in
/// chunks of at most 64 KiB ahead of the data, and a growing buffer may double.
fn allocation_bound(arrived: usize) -> usize {
    2 * arrived + 2 * 64 * 1024
}

fn decode_as(api: Api, frame: Bytes) {
    // Only "no panic, no abort" and "no trailing bytes accepted" (decode_response's own check)
    // here; the share_fetch_response target checks these decoders' round trips.
    let (key, version) = match api {
        Api::ShareFetchV1 => (ApiKey::ShareFetch, 1),
        Api::ShareFetchV2 => (ApiKey::ShareFetch, 2),
        Api::ShareAckV1 => (ApiKey::ShareAcknowledge, 1),
        Api::ShareAckV2 => (ApiKey::ShareAcknowledge, 2),
    };
    let _ = if key == ApiKey::ShareFetch {
        decode_response::<ShareFetchResponse>(frame, key, version).map(|_| ())
    } else {
        decode_response::<ShareAcknowledgeResponse>(frame, key, version).map(|_| ())
    };
}

fuzz_target!(|data: &[u8]| {
    let [limit_b, pattern, api_b, stream @ ..] = data else {
        return;
    };
    let max = limit(*limit_b);
    let api = api(*api_b);
    let mut reader = ChunkedReader::new(stream, *pattern);
    loop {
        let at = reader.position();
        let want = expect(stream, at, max);
        let (got, largest) = largest_allocation(|| block_on(read_frame(&mut reader, max)));
        let arrived = reader.position() - at;
        assert!(
            largest <= allocation_bound(arrived),
            "read_frame allocated {largest} bytes after {arrived} arrived (limit {max})"
        );
        match (got, want) {
            (Ok(frame), Expect::Frame(bytes)) => {
                assert_eq!(&frame[..], bytes, "frame content");
                assert_eq!(
                    reader.position(),
                    at + 4 + bytes.len(),
                    "read past the frame"
                );
                let id = i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                assert_eq!(peek_correlation_id(&frame), Some(id));
                decode_as(api, frame);
            }
            (Err(FrameError::Closed { mid_frame }), Expect::Closed { mid_frame: m }) => {
                assert_eq!(mid_frame, m, "mid_frame");
                return;
            }
            (Err(FrameError::BadLength(l)), Expect::BadLength(m)) => {
                assert_eq!(l, m);
                return;
            }
            (Err(FrameError::TooLarge { size, limit }), Expect::TooLarge(m)) => {
                assert_eq!((size, limit), (m, max));
                return;
            }
            (got, want) => panic!("read_frame gave {got:?}, the model {want:?}"),
        }
    }
});

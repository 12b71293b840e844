//! Shared pieces of sharehost's fuzz targets: each target's input layout (so the seed generator
//! and the target agree on it), an in-memory reader that hands out bytes in fuzzer-chosen chunks,
//! and the property checks more than one target makes.
//!
//! Every target takes raw bytes; where it needs a choice (a version, a codec, a size limit) the
//! first byte or two carry it and the rest is the input proper, so the seeds are real encoded
//! messages with a short prefix.

use std::future::Future;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};

use sharehost::kafka::records::{
    Compression, ConsumedRecord, ProduceRecord, decode_batches, encode_batch,
};
use tokio::io::{AsyncRead, ReadBuf};

/// Input layout of the `frame` target: `[limit, pattern, api, stream...]`.
pub mod frame_layout {
    use sharehost::kafka::frame::DEFAULT_MAX_FRAME_BYTES;

    /// The frame size limit the first byte selects (the production default most of the time,
    /// small ones so that `TooLarge` is reachable with short inputs).
    pub fn limit(b: u8) -> usize {
        match b % 4 {
            1 => 64,
            2 => 4096,
            3 => 1 << 20,
            _ => DEFAULT_MAX_FRAME_BYTES,
        }
    }

    /// The first byte that selects `limit`: the production default.
    pub const DEFAULT_LIMIT: u8 = 0;

    /// Which response body each frame is decoded as, after the reader hands it out: the share
    /// messages, whose decoders are ours. The responses decoded with kafka-protocol have
    /// targets of their own (see [`crate::response`]).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Api {
        /// ShareFetch v1.
        ShareFetchV1,
        /// ShareFetch v2.
        ShareFetchV2,
        /// ShareAcknowledge v1.
        ShareAckV1,
        /// ShareAcknowledge v2.
        ShareAckV2,
    }

    /// The API the third byte selects.
    pub fn api(b: u8) -> Api {
        match b % 4 {
            0 => Api::ShareFetchV1,
            1 => Api::ShareFetchV2,
            2 => Api::ShareAckV1,
            _ => Api::ShareAckV2,
        }
    }

    /// The byte that selects `api` (inverse of [`api`]).
    pub fn api_byte(api: Api) -> u8 {
        api as u8
    }
}

/// Input layout of the `share_fetch_response` target: `[selector, body...]`.
pub mod share_layout {
    /// What the selector byte asks for.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Selector {
        /// Wire version, 1 or 2.
        pub version: i16,
        /// Decode as ShareAcknowledgeResponse instead of ShareFetchResponse.
        pub acknowledge: bool,
        /// Where to cut the re-encoded message for the truncation check, in 64ths of its length.
        pub cut_64ths: usize,
    }

    /// Splits the selector byte.
    pub fn selector(b: u8) -> Selector {
        Selector {
            version: 1 + i16::from(b & 1),
            acknowledge: b & 2 != 0,
            cut_64ths: usize::from(b >> 2),
        }
    }

    /// The selector byte for a version and message (cut at half the length).
    pub fn selector_byte(version: i16, acknowledge: bool) -> u8 {
        (32 << 2) | (u8::from(acknowledge) << 1) | u8::from(version == 2)
    }
}

/// Input layout of the `record_batch` target: `[codec, batches...]`.
pub mod batch_layout {
    use super::Compression;

    /// Every codec the decoder accepts, in wire order.
    pub const CODECS: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    /// The codec the decoded records are re-encoded with.
    pub fn codec(b: u8) -> Compression {
        CODECS[usize::from(b) % CODECS.len()]
    }
}

/// Bytes handed out in chunks of a fuzzer-chosen size, with a `Pending` now and then, so a reader
/// sees the partial reads a socket produces.
pub struct ChunkedReader<'a> {
    data: &'a [u8],
    pos: usize,
    chunk: usize,
    pend_every: u32,
    calls: u32,
}

impl<'a> ChunkedReader<'a> {
    /// `pattern`'s low nibble is the chunk size (0 = as much as asked for), its high nibble how
    /// often a read is `Pending` first (0 = never, n = every (n+1)-th call, so at most every
    /// other call and the reader always makes progress).
    pub fn new(data: &'a [u8], pattern: u8) -> Self {
        ChunkedReader {
            data,
            pos: 0,
            chunk: match usize::from(pattern & 0x0f) {
                0 => usize::MAX,
                n => n,
            },
            pend_every: match u32::from(pattern >> 4) {
                0 => 0,
                n => n + 1,
            },
            calls: 0,
        }
    }

    /// How many bytes have been handed out.
    pub fn position(&self) -> usize {
        self.pos
    }
}

impl AsyncRead for ChunkedReader<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.calls = self.calls.wrapping_add(1);
        if self.pend_every != 0 && self.calls.is_multiple_of(self.pend_every) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let rest = &self.data[self.pos..];
        let n = rest.len().min(buf.remaining()).min(self.chunk);
        buf.put_slice(&rest[..n]);
        self.pos += n;
        Poll::Ready(Ok(()))
    }
}

/// Polls a future to completion on this thread. Only for futures that make progress whenever
/// polled (like reads from a [`ChunkedReader`], whose `Pending` is immediately ready again).
pub fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

/// Re-encodes records that decoded with `codec` and checks that they decode to the same records
/// (offsets renumbered from 0, as `encode_batch` numbers them).
///
/// # Panics
/// When encoding fails or the records do not come back the same: both are bugs.
pub fn assert_records_round_trip(records: &[ConsumedRecord], codec: Compression) {
    let produce: Vec<ProduceRecord> = records
        .iter()
        .map(|r| ProduceRecord {
            key: r.key.clone(),
            value: r.value.clone(),
            headers: r.headers.clone(),
            timestamp: Some(r.timestamp),
        })
        .collect();
    let encoded = match encode_batch(&produce, codec) {
        Ok(b) => b,
        Err(e) => panic!("records that decoded do not encode with {codec:?}: {e}"),
    };
    let back = match decode_batches(encoded) {
        Ok(r) => r,
        Err(e) => panic!("a batch we encoded with {codec:?} does not decode: {e}"),
    };
    assert_eq!(back.len(), records.len(), "record count after {codec:?}");
    for (i, (a, b)) in records.iter().zip(&back).enumerate() {
        assert_eq!(b.offset, i as i64, "offsets are renumbered from 0");
        assert_eq!(a.timestamp, b.timestamp, "timestamp of record {i}");
        assert_eq!(a.key, b.key, "key of record {i}");
        assert_eq!(a.value, b.value, "value of record {i}");
        assert_eq!(a.headers, b.headers, "headers of record {i}");
    }
}

/// Header keys of one record are unique: the batch codec keys headers by name.
pub fn assert_unique_header_keys(r: &ConsumedRecord) {
    for (i, h) in r.headers.iter().enumerate() {
        assert!(
            r.headers[..i].iter().all(|o| o.key != h.key),
            "header key {:?} repeated at offset {}",
            h.key,
            r.offset
        );
    }
}

/// A global allocator that notes the largest single allocation while a measured closure runs:
/// the targets assert that a decoder never allocates out of proportion to the bytes it was
/// given, whatever lengths those bytes claim. Each target installs it as its global allocator.
pub mod alloc {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    static ARMED: AtomicBool = AtomicBool::new(false);
    static LARGEST: AtomicUsize = AtomicUsize::new(0);

    /// The system allocator, noting the largest single allocation while
    /// [`largest_allocation`] runs.
    pub struct CountingAlloc;

    fn note(size: usize) {
        if ARMED.load(Ordering::Relaxed) {
            LARGEST.fetch_max(size, Ordering::Relaxed);
        }
    }

    /// Runs `f` and returns its result with the largest single allocation it made (a fuzz
    /// target is single-threaded, so nothing else allocates meanwhile).
    pub fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
        LARGEST.store(0, Ordering::Relaxed);
        ARMED.store(true, Ordering::Relaxed);
        let out = f();
        ARMED.store(false, Ordering::Relaxed);
        (out, LARGEST.load(Ordering::Relaxed))
    }

    // The one unsafe block of the fuzz crate: a GlobalAlloc must be an unsafe impl. It only
    // forwards to the system allocator after noting the requested size.
    #[allow(unsafe_code)]
    unsafe impl GlobalAlloc for CountingAlloc {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            // SAFETY: same layout contract as our caller's.
            unsafe { System.alloc(layout) }
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            // SAFETY: same layout contract as our caller's.
            unsafe { System.alloc_zeroed(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: `ptr` came from `System` through this allocator with this layout.
            unsafe { System.dealloc(ptr, layout) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            note(new_size);
            // SAFETY: `ptr` came from `System` through this allocator with this layout.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }
}

/// The response targets (`metadata_response`, `find_coordinator_response`,
/// `share_group_heartbeat_response`, `produce_response`, `fetch_response`): a response frame
/// (header and body, as the connection's reader hands it over) decoded exactly as the host
/// decodes it, through `kafka::frame::decode_response` (the bounded pre-pass, then
/// kafka-protocol). Input: `[version selector, frame...]`.
pub mod response {
    use std::fmt::Debug;
    use std::ops::RangeInclusive;

    pub use crate::alloc::CountingAlloc;

    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::{ApiKey, ResponseHeader};
    use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion};
    use sharehost::kafka::bounded::check_body;
    use sharehost::kafka::frame::decode_response;

    /// The version the selector byte picks within `versions`.
    pub fn version(versions: &RangeInclusive<i16>, b: u8) -> i16 {
        let span = versions.end() - versions.start() + 1;
        versions.start() + i16::from(b) % span
    }

    /// The selector byte for `v` (inverse of [`version`]).
    pub fn version_byte(versions: &RangeInclusive<i16>, v: i16) -> u8 {
        u8::try_from(v - versions.start()).unwrap_or(0)
    }

    /// Largest single allocation a decode of `len` input bytes may make: every decoded
    /// element takes at least one input byte and no decoded struct is near 512 bytes, plus
    /// slack for fixed-size buffers. A lying length used to ask for gigabytes.
    pub fn allocation_bound(len: usize) -> usize {
        512 * len + 64 * 1024
    }

    /// Decodes `data` (`[selector, frame...]`) as a response of `api` and checks:
    /// - no panic, no abort, and no single allocation beyond [`allocation_bound`];
    /// - an error is an error with a message (the connection layer drops the connection);
    /// - what decodes re-encodes into a body the bounded pre-pass accepts (so the pre-pass never
    ///   refuses what an honest broker's kafka-protocol-shaped encoding can be), and that body
    ///   decodes back to the same message.
    pub fn check<R>(api: ApiKey, versions: RangeInclusive<i16>, data: &[u8])
    where
        R: Decodable + Encodable + HeaderVersion + PartialEq + Debug,
    {
        let [sel, frame @ ..] = data else {
            return;
        };
        let v = version(&versions, *sel);
        let input = Bytes::copy_from_slice(frame);
        let (decoded, largest) =
            crate::alloc::largest_allocation(|| decode_response::<R>(input, api, v));
        assert!(
            largest <= allocation_bound(frame.len()),
            "{api:?} v{v}: a {}-byte frame made a {largest}-byte allocation",
            frame.len()
        );
        let msg = match decoded {
            Ok(msg) => msg,
            Err(e) => {
                assert!(!e.to_string().is_empty(), "an error without a message");
                return;
            }
        };
        let mut body = BytesMut::new();
        if msg.encode(&mut body, v).is_err() || msg.compute_size(v).ok() != Some(body.len()) {
            // kafka-protocol's encoder refuses some decoded values, and writes an inconsistent
            // encoding for others (unknown tags >= 2^31 are counted but not written): its own
            // properties, not ours.
            return;
        }
        if let Err(e) = check_body(api, v, &body) {
            panic!("{api:?} v{v}: the bounded pre-pass refuses kafka-protocol's own encoding: {e}");
        }
        let mut again = BytesMut::new();
        let header = ResponseHeader::default().with_correlation_id(7);
        if header
            .encode(&mut again, api.response_header_version(v))
            .is_err()
        {
            return;
        }
        again.extend_from_slice(&body);
        match decode_response::<R>(again.freeze(), api, v) {
            Ok(back) => assert_eq!(
                back, msg,
                "{api:?} v{v}: decode → encode → decode changed it"
            ),
            Err(e) => panic!("{api:?} v{v}: our re-encoding does not decode: {e:#}"),
        }
    }
}

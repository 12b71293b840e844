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

    /// Which response body each frame is decoded as, after the reader hands it out: only the
    /// share messages, whose decoders are ours. (kafka-protocol's decoders for the other
    /// responses abort the process on a lying array length, see docs/reliability.md; decoding
    /// them here would only find that again.)
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

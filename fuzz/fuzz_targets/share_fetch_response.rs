//! ShareFetch (and ShareAcknowledge) response bodies, versions 1 and 2, through sharehost's own
//! decoders (`kafka::protocol::share` on top of `kafka::protocol::codec`), then the record batches inside each
//! fetched partition, as the share consumer decodes them.
//!
//! Input: `[selector, body...]` (see `sharehost_fuzz::share_layout`).
//!
//! Asserts, for whatever decodes:
//! - encode(decoded) is exactly `compute_size` bytes, decodes to the same message with no byte
//!   left over, and re-encodes to the same bytes (decode → encode → decode is stable);
//! - a strict prefix of that encoding does not decode (no message silently cut short);
//! - records that decode are re-encoded in the codec the selector picks and come back equal,
//!   with unique header keys.
#![no_main]

use bytes::{Bytes, BytesMut};
use kafka_protocol::protocol::{Decodable, Encodable};
use libfuzzer_sys::fuzz_target;
use sharehost::kafka::records::decode_batches;
use sharehost::kafka::protocol::share::{ShareAcknowledgeResponse, ShareFetchResponse};
use sharehost_fuzz::batch_layout::codec;
use sharehost_fuzz::share_layout::selector;
use sharehost_fuzz::{assert_records_round_trip, assert_unique_header_keys};

/// Decodes `body` as `T` at `version` and checks the round-trip properties; returns what decoded.
fn round_trip<T>(body: &[u8], version: i16, cut_64ths: usize) -> Option<T>
where
    T: Decodable + Encodable + PartialEq + std::fmt::Debug,
{
    let msg = T::decode(&mut Bytes::copy_from_slice(body), version).ok()?;
    let mut buf = BytesMut::new();
    if let Err(e) = msg.encode(&mut buf, version) {
        panic!("a decoded message does not encode at v{version}: {e}");
    }
    let encoded = buf.freeze();
    let size = msg.compute_size(version).ok();
    assert_eq!(size, Some(encoded.len()), "compute_size");
    let mut rest = encoded.clone();
    let again = match T::decode(&mut rest, version) {
        Ok(m) => m,
        Err(e) => panic!("our own encoding does not decode at v{version}: {e}"),
    };
    assert!(
        rest.is_empty(),
        "{} bytes left after decoding our encoding",
        rest.len()
    );
    assert_eq!(again, msg, "decode → encode → decode changed the message");
    let mut buf2 = BytesMut::new();
    assert!(again.encode(&mut buf2, version).is_ok());
    assert_eq!(buf2.freeze(), encoded, "re-encoding is not stable");
    let cut = encoded.len() * cut_64ths / 64;
    assert!(
        T::decode(&mut encoded.slice(..cut), version).is_err(),
        "a {cut}-byte prefix of a {}-byte message decoded",
        encoded.len()
    );
    Some(msg)
}

fuzz_target!(|data: &[u8]| {
    let [sel, body @ ..] = data else {
        return;
    };
    let s = selector(*sel);
    if s.acknowledge {
        let _ = round_trip::<ShareAcknowledgeResponse>(body, s.version, s.cut_64ths);
        return;
    }
    let Some(resp) = round_trip::<ShareFetchResponse>(body, s.version, s.cut_64ths) else {
        return;
    };
    for p in resp.responses.iter().flat_map(|t| &t.partitions) {
        if let Ok(records) = decode_batches(p.records.clone()) {
            records.iter().for_each(assert_unique_header_keys);
            assert_records_round_trip(&records, codec(*sel));
        }
    }
});

//! The flexible-version primitives the share messages need (compact strings and arrays,
//! unsigned varints, uuids, empty tagged-field sections).
//!
//! Written by hand because kafka-protocol keeps its primitive encoders crate-private and its
//! share messages stop at v1; the format facts come from the Kafka message schemas.

use anyhow::{Result, bail};
use bytes::{Buf, BufMut, Bytes};
use uuid::Uuid;

/// Appends an unsigned varint.
pub fn put_uvarint<B: BufMut>(buf: &mut B, mut v: u32) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

/// Reads an unsigned varint (at most 5 bytes).
pub fn get_uvarint<B: Buf>(buf: &mut B) -> Result<u32> {
    let mut v: u32 = 0;
    for i in 0..5 {
        if !buf.has_remaining() {
            bail!("truncated varint");
        }
        let b = buf.get_u8();
        v |= u32::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    bail!("varint longer than 5 bytes")
}

/// Size of an unsigned varint.
pub fn uvarint_len(v: u32) -> usize {
    match v {
        0..=0x7f => 1,
        0x80..=0x3fff => 2,
        0x4000..=0x1f_ffff => 3,
        0x20_0000..=0xfff_ffff => 4,
        _ => 5,
    }
}

/// Appends a compact nullable string.
pub fn put_compact_str<B: BufMut>(buf: &mut B, s: Option<&str>) -> Result<()> {
    match s {
        None => put_uvarint(buf, 0),
        Some(s) => {
            let len = u32::try_from(s.len())?;
            put_uvarint(buf, len + 1);
            buf.put_slice(s.as_bytes());
        }
    }
    Ok(())
}

/// Size of a compact nullable string.
pub fn compact_str_len(s: Option<&str>) -> usize {
    match s {
        None => 1,
        Some(s) => uvarint_len(s.len() as u32 + 1) + s.len(),
    }
}

fn need<B: Buf>(buf: &B, n: usize, what: &str) -> Result<()> {
    if buf.remaining() < n {
        bail!("truncated {what}: need {n} bytes, have {}", buf.remaining());
    }
    Ok(())
}

/// Reads a compact nullable string.
pub fn get_compact_str<B: Buf>(buf: &mut B) -> Result<Option<String>> {
    let n = get_uvarint(buf)?;
    if n == 0 {
        return Ok(None);
    }
    let len = (n - 1) as usize;
    need(buf, len, "string")?;
    let bytes = buf.copy_to_bytes(len);
    Ok(Some(String::from_utf8(bytes.to_vec())?))
}

/// Appends a compact array length (`None` is a null array).
pub fn put_array_len<B: BufMut>(buf: &mut B, len: usize) -> Result<()> {
    put_uvarint(buf, u32::try_from(len)? + 1);
    Ok(())
}

/// Reads a compact array length; null arrays read as empty. The length is checked against the
/// bytes left (each element takes at least `min_elem` bytes) so a lying length cannot make us
/// allocate.
pub fn get_array_len<B: Buf>(buf: &mut B, min_elem: usize) -> Result<usize> {
    let n = get_uvarint(buf)?;
    if n == 0 {
        return Ok(0);
    }
    let len = (n - 1) as usize;
    if len.saturating_mul(min_elem.max(1)) > buf.remaining() {
        bail!(
            "array length {len} exceeds the remaining {} bytes",
            buf.remaining()
        );
    }
    Ok(len)
}

/// Appends a uuid as 16 raw bytes.
pub fn put_uuid<B: BufMut>(buf: &mut B, id: &Uuid) {
    buf.put_slice(id.as_bytes());
}

/// Reads a uuid.
pub fn get_uuid<B: Buf>(buf: &mut B) -> Result<Uuid> {
    need(buf, 16, "uuid")?;
    let mut b = [0u8; 16];
    buf.copy_to_slice(&mut b);
    Ok(Uuid::from_bytes(b))
}

/// Appends an empty tagged-field section (no share message declares tagged fields).
pub fn put_no_tags<B: BufMut>(buf: &mut B) {
    put_uvarint(buf, 0);
}

/// Skips a tagged-field section, whatever it holds (unknown tags must be ignored).
pub fn skip_tags<B: Buf>(buf: &mut B) -> Result<()> {
    let n = get_uvarint(buf)?;
    for _ in 0..n {
        let _tag = get_uvarint(buf)?;
        let size = get_uvarint(buf)? as usize;
        need(buf, size, "tagged field")?;
        buf.advance(size);
    }
    Ok(())
}

/// Appends compact bytes (records).
pub fn put_compact_bytes<B: BufMut>(buf: &mut B, b: &[u8]) -> Result<()> {
    put_uvarint(buf, u32::try_from(b.len())? + 1);
    buf.put_slice(b);
    Ok(())
}

/// Reads compact nullable bytes; null reads as empty.
pub fn get_compact_bytes<B: Buf>(buf: &mut B) -> Result<Bytes> {
    let n = get_uvarint(buf)?;
    if n == 0 {
        return Ok(Bytes::new());
    }
    let len = (n - 1) as usize;
    need(buf, len, "bytes")?;
    Ok(buf.copy_to_bytes(len))
}

macro_rules! fixed {
    ($put:ident, $get:ident, $t:ty, $bput:ident, $bget:ident, $n:expr) => {
        /// Appends a big-endian fixed-width integer.
        pub fn $put<B: BufMut>(buf: &mut B, v: $t) {
            buf.$bput(v);
        }
        /// Reads a big-endian fixed-width integer.
        pub fn $get<B: Buf>(buf: &mut B) -> Result<$t> {
            need(buf, $n, stringify!($t))?;
            Ok(buf.$bget())
        }
    };
}

fixed!(put_i8, get_i8, i8, put_i8, get_i8, 1);
fixed!(put_i16, get_i16, i16, put_i16, get_i16, 2);
fixed!(put_i32, get_i32, i32, put_i32, get_i32, 4);
fixed!(put_i64, get_i64, i64, put_i64, get_i64, 8);

/// Reads a boolean (any non-zero byte is true, as Kafka does).
pub fn get_bool<B: Buf>(buf: &mut B) -> Result<bool> {
    Ok(get_i8(buf)? != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    #[test]
    fn varints_round_trip_at_every_width() {
        for v in [
            0u32,
            1,
            127,
            128,
            16383,
            16384,
            2_097_151,
            2_097_152,
            u32::MAX,
        ] {
            let mut b = BytesMut::new();
            put_uvarint(&mut b, v);
            assert_eq!(b.len(), uvarint_len(v), "{v}");
            assert_eq!(get_uvarint(&mut b.freeze()).expect("decodes"), v);
        }
    }

    #[test]
    fn lying_array_length_is_refused() {
        let mut b = BytesMut::new();
        put_uvarint(&mut b, 1_000_001);
        b.put_slice(&[0u8; 10]);
        assert!(get_array_len(&mut b.freeze(), 4).is_err());
    }

    #[test]
    fn strings_null_empty_and_text() {
        for s in [None, Some(""), Some("group-1")] {
            let mut b = BytesMut::new();
            put_compact_str(&mut b, s).expect("encodes");
            assert_eq!(b.len(), compact_str_len(s));
            assert_eq!(
                get_compact_str(&mut b.freeze())
                    .expect("decodes")
                    .as_deref(),
                s
            );
        }
    }

    #[test]
    fn unknown_tagged_fields_are_skipped() {
        let mut b = BytesMut::new();
        put_uvarint(&mut b, 2);
        put_uvarint(&mut b, 7);
        put_uvarint(&mut b, 3);
        b.put_slice(b"abc");
        put_uvarint(&mut b, 9);
        put_uvarint(&mut b, 0);
        b.put_u8(0x42);
        let mut f = b.freeze();
        skip_tags(&mut f).expect("skips");
        assert_eq!(f.as_ref(), &[0x42]);
    }
}

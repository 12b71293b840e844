//! Bounded lifting of what a sharehost plugin hands the host: the verdict list `handle`
//! returns and the message of every `log` call.
//!
//! Why by hand. wasmtime runs a guest export's post-return (where the guest frees the list it
//! returned, and every reason string in it) before `call_async` returns, so the result must be
//! lifted into owned values during the call. wasmtime's own lifts (`Vec<T>`, `String`) copy
//! whatever length the guest claims, bounded only by its per-call "hostcall fuel": a verdict
//! list longer than the batch would be copied before the host could count it, and a reason or
//! log message is copied whole before it is cut to its bound. The lifts here read the
//! canonical ABI themselves, so that:
//! - the verdict count is compared with the record count before a single verdict is read
//!   (a guest returning millions of verdicts costs the host one comparison), and
//! - at most the kept prefix of each reason and log message is read (a plugin whose reasons
//!   all alias one large buffer costs the host `records x max_reason_bytes`, not the buffer
//!   size times the records).
//!
//! wasmtime offers no public hook for this, so [`VerdictList`] and [`LogMessage`] implement
//! its `ComponentType` and `Lift` traits, the ones `#[derive(Lift)]` implements. Their
//! type checks delegate to wasmtime's own (`list<W>` for the generated verdict type `W`, and
//! `string`), so a component whose types differ is refused at load exactly as before; only
//! the reading of memory is ours. The traits' hidden items are those of wasmtime 48 (the
//! workspace pins it); an upgrade that changes them fails to compile here, not at run time.
//!
//! The per-call bounds (records in the batch, longest reason kept) reach the lift through a
//! task-local set around the call ([`with_verdict_bounds`]): wasmtime lifts a result inside
//! the future that `call_async` returns, on the thread polling it, and offers no other way to
//! hand per-call data to a `Lift` implementation.

use std::borrow::Cow;
use std::marker::PhantomData;

use wasmtime::component::__internal::wasmtime_environ::component::StringEncoding;
use wasmtime::component::__internal::{
    CanonicalAbiInfo, ComponentVariant, InstanceType, InterfaceType, LiftContext,
};
use wasmtime::component::{ComponentType, Lift, WasmList};

/// A plugin's judgement of one record, as the host lifts it from the guest (the contract's
/// `verdict`, with the reason already cut to its bound). The host's runtime re-exports it as
/// `sharehost::runtime::Verdict`: one type from the guest's memory to the acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Processed: acknowledge (never delivered again).
    Accept,
    /// Give back for redelivery.
    Release,
    /// Never deliver again; the optional reason holds at most the call's `max_reason_bytes`.
    Reject(Option<String>),
    /// Extend the acquisition lock and deliver again to this consumer later.
    Renew,
    /// Keep the record acquired and release it for redelivery after this many milliseconds
    /// (contract 0.2.0; the host caps the delay).
    Retry(u32),
}

impl Verdict {
    /// The verdict's name as logs, metrics labels and `test-plugin` lines spell it.
    pub fn kind(&self) -> &'static str {
        match self {
            Verdict::Accept => "accept",
            Verdict::Release => "release",
            Verdict::Reject(_) => "reject",
            Verdict::Renew => "renew",
            Verdict::Retry(_) => "retry",
        }
    }
}

/// Per-call bounds of the verdict lift.
#[derive(Debug, Clone, Copy)]
pub struct VerdictBounds {
    /// Records in the batch: the only verdict count the host accepts.
    pub records: usize,
    /// Longest reason kept, in UTF-8 bytes; the rest of a reason is never read.
    pub max_reason_bytes: usize,
}

tokio::task_local! {
    static VERDICT_BOUNDS: VerdictBounds;
}

/// Runs `call` (a `handle` call) with `bounds` visible to the verdict lift. A
/// [`VerdictList`] lifted outside of it is refused.
pub async fn with_verdict_bounds<F: Future>(bounds: VerdictBounds, call: F) -> F::Output {
    VERDICT_BOUNDS.scope(bounds, call).await
}

/// Why a verdict list was refused. Carried through wasmtime's error so the fault classifier
/// can tell it from a trap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerdictLiftError {
    /// The guest returned a different number of verdicts than records (checked before any
    /// verdict is read).
    #[error(
        "{got} verdicts for {expected} records: return exactly one verdict per record, in the \
         records' order (a handle_batch that skips a record or adds one)"
    )]
    WrongCount {
        /// Verdicts the guest claims to return.
        got: u64,
        /// Records in the batch.
        expected: usize,
    },
    /// The list or one of its verdicts is malformed (out of bounds, bad discriminant,
    /// invalid text).
    #[error("unreadable verdicts: {0}")]
    Unreadable(String),
}

/// The verdicts of one `handle` call, lifted and owned before the guest's post-return frees
/// them. Reasons are already cut to the bound. `W` is the contract's `verdict` type as the
/// host's bindings generate it: the component's result type is checked against `list<W>`.
pub struct VerdictList<W> {
    /// One per record, in record order.
    pub verdicts: Vec<Verdict>,
    _wire: PhantomData<fn() -> W>,
}

// SAFETY: `Lower` and `ABI` are those of `list<W>` (a pointer/length pair), and `typecheck` is
// wasmtime's own check for `list<W>`, so wasmtime only ever hands this lift a pointer/length
// pair of a list whose elements have `W`'s layout, which `typecheck` also requires to be the
// one the lift reads (see `verdict_layout_is_the_one_read`).
#[allow(unsafe_code)]
unsafe impl<W: ComponentVariant> ComponentType for VerdictList<W> {
    type Lower = <WasmList<W> as ComponentType>::Lower;
    const ABI: CanonicalAbiInfo = CanonicalAbiInfo::POINTER_PAIR;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        verdict_layout_is_the_one_read::<W>()?;
        <WasmList<W> as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: reads only through the bounds-checked slice of guest memory wasmtime provides.
#[allow(unsafe_code)]
unsafe impl<W: ComponentVariant + Lift> Lift for VerdictList<W> {
    fn linear_lift_from_flat(
        cx: &mut LiftContext<'_>,
        _ty: InterfaceType,
        src: &Self::Lower,
    ) -> wasmtime::Result<Self> {
        let [ptr, len] = src;
        lift_verdicts(cx, ptr.get_u32(), len.get_u32())
    }

    fn linear_lift_from_memory(
        cx: &mut LiftContext<'_>,
        _ty: InterfaceType,
        bytes: &[u8],
    ) -> wasmtime::Result<Self> {
        let (ptr, len) = pointer_pair(bytes)?;
        lift_verdicts(cx, ptr, len)
    }
}

/// Canonical ABI layout of `verdict` (a variant of four cases in contract 0.1, `accept`,
/// `release`, `reject(option<string>)`, `renew`, plus `retry(u32)` in 0.2): discriminant byte
/// at 0, payload at `PAYLOAD`; inside `reject`'s payload, the option's discriminant byte, then
/// the string's pointer and length at `STRING`; `retry`'s payload is the u32 itself. 16 bytes,
/// aligned to 4, in both versions (the largest payload, `option<string>`, sets the size).
const VERDICT_SIZE: usize = 16;
const VERDICT_ALIGN: usize = 4;
const PAYLOAD: usize = 4;
const STRING: usize = PAYLOAD + 4;

/// Refuses a verdict type whose layout is not the one [`lift_verdicts`] reads (a contract
/// change that forgot this crate), before anything is read.
fn verdict_layout_is_the_one_read<W: ComponentVariant>() -> wasmtime::Result<()> {
    if W::SIZE32 != VERDICT_SIZE
        || W::ALIGN32 as usize != VERDICT_ALIGN
        || W::PAYLOAD_OFFSET32 != PAYLOAD
        || !matches!(W::CASES.len(), 4 | 5)
    {
        return Err(wasmtime::format_err!(
            "the verdict type's layout is not the one the host reads (host bug)"
        ));
    }
    Ok(())
}

fn lift_verdicts<W: ComponentVariant>(
    cx: &mut LiftContext<'_>,
    ptr: u32,
    len: u32,
) -> wasmtime::Result<VerdictList<W>> {
    let bounds = VERDICT_BOUNDS
        .try_with(|b| *b)
        .map_err(|_| wasmtime::format_err!("verdicts lifted outside a handle call (host bug)"))?;
    if len as usize != bounds.records {
        return Err(VerdictLiftError::WrongCount {
            got: len.into(),
            expected: bounds.records,
        }
        .into());
    }
    let unreadable = |m: String| wasmtime::Error::from(VerdictLiftError::Unreadable(m));
    let memory = cx.memory();
    let encoding = cx.options().string_encoding;
    let start = ptr as usize;
    if !start.is_multiple_of(VERDICT_ALIGN) {
        return Err(unreadable(format!("list pointer {ptr} is not aligned")));
    }
    let list = (len as usize)
        .checked_mul(VERDICT_SIZE)
        .and_then(|size| memory.get(start..start.checked_add(size)?))
        .ok_or_else(|| unreadable("list out of bounds of the plugin's memory".into()))?;
    // `retry` is a case of contract 0.2's verdict only: for a 0.1 component, discriminant 4 is
    // as unknown as 9.
    let has_retry = W::CASES.len() == 5;
    let mut verdicts = Vec::with_capacity(bounds.records);
    for (i, item) in list.chunks_exact(VERDICT_SIZE).enumerate() {
        let verdict = match item[0] {
            0 => Verdict::Accept,
            1 => Verdict::Release,
            2 => Verdict::Reject(match item[PAYLOAD] {
                0 => None,
                1 => {
                    let (sptr, slen) = pointer_pair(&item[STRING..])?;
                    let (text, _) =
                        read_prefix(memory, encoding, sptr, slen, bounds.max_reason_bytes)
                            .map_err(|e| unreadable(format!("reason of verdict {i}: {e}")))?;
                    Some(text.into_owned())
                }
                d => {
                    return Err(unreadable(format!("verdict {i}: option discriminant {d}")));
                }
            }),
            3 => Verdict::Renew,
            4 if has_retry => {
                let b = &item[PAYLOAD..PAYLOAD + 4];
                Verdict::Retry(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            d => return Err(unreadable(format!("verdict {i}: discriminant {d}"))),
        };
        verdicts.push(verdict);
    }
    Ok(VerdictList {
        verdicts,
        _wire: PhantomData,
    })
}

/// The longest log message kept, in UTF-8 bytes; the rest of a message is never read.
pub const MAX_LOG_MESSAGE: usize = 4 << 10;

/// A `log` message as the host keeps it: at most [`MAX_LOG_MESSAGE`] bytes read from the
/// guest, whatever length it claims, and whether it was cut.
pub struct LogMessage {
    /// The kept text.
    pub text: String,
    /// Whether the guest's message was longer than what was kept.
    pub truncated: bool,
}

// SAFETY: `Lower`, `ABI` and `typecheck` are wasmtime's own for `string`.
#[allow(unsafe_code)]
unsafe impl ComponentType for LogMessage {
    type Lower = <String as ComponentType>::Lower;
    const ABI: CanonicalAbiInfo = CanonicalAbiInfo::POINTER_PAIR;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        <String as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: reads only through the bounds-checked slice of guest memory wasmtime provides.
#[allow(unsafe_code)]
unsafe impl Lift for LogMessage {
    fn linear_lift_from_flat(
        cx: &mut LiftContext<'_>,
        _ty: InterfaceType,
        src: &Self::Lower,
    ) -> wasmtime::Result<Self> {
        let [ptr, len] = src;
        lift_log(cx, ptr.get_u32(), len.get_u32())
    }

    fn linear_lift_from_memory(
        cx: &mut LiftContext<'_>,
        _ty: InterfaceType,
        bytes: &[u8],
    ) -> wasmtime::Result<Self> {
        let (ptr, len) = pointer_pair(bytes)?;
        lift_log(cx, ptr, len)
    }
}

fn lift_log(cx: &mut LiftContext<'_>, ptr: u32, len: u32) -> wasmtime::Result<LogMessage> {
    let encoding = cx.options().string_encoding;
    let (text, truncated) = read_prefix(cx.memory(), encoding, ptr, len, MAX_LOG_MESSAGE)
        .map_err(|e| wasmtime::format_err!("log message: {e}"))?;
    Ok(LogMessage {
        text: text.into_owned(),
        truncated,
    })
}

/// The canonical ABI's "this latin1+utf16 string is UTF-16" bit of a string's length.
const UTF16_TAG: usize = 1 << 31;

fn pointer_pair(bytes: &[u8]) -> wasmtime::Result<(u32, u32)> {
    match (bytes.get(0..4), bytes.get(4..8)) {
        (Some(p), Some(l)) => Ok((
            u32::from_le_bytes([p[0], p[1], p[2], p[3]]),
            u32::from_le_bytes([l[0], l[1], l[2], l[3]]),
        )),
        _ => Err(wasmtime::format_err!("pointer/length pair cut short")),
    }
}

/// Decodes at most `max` UTF-8 bytes of the guest string at `ptr`/`len` (canonical ABI, in
/// the component's string encoding), cut on a character boundary, and says whether anything
/// was left unread. The whole string must lie
/// inside `memory`, but only the decoded prefix is read: the bytes past it are never looked
/// at (nor validated). Invalid text inside the prefix is an error, as in wasmtime's own lift.
fn read_prefix(
    memory: &[u8],
    encoding: StringEncoding,
    ptr: u32,
    len: u32,
    max: usize,
) -> Result<(Cow<'_, str>, bool), String> {
    let start = ptr as usize;
    let (units, utf16) = match encoding {
        StringEncoding::Utf8 => (len as usize, false),
        StringEncoding::Utf16 => (len as usize, true),
        StringEncoding::CompactUtf16 => {
            let len = len as usize;
            if len & UTF16_TAG != 0 {
                (len ^ UTF16_TAG, true)
            } else {
                (len, false)
            }
        }
    };
    let unit = if utf16 { 2 } else { 1 };
    if !start.is_multiple_of(unit) {
        return Err(format!("string pointer {ptr} is not aligned"));
    }
    let bytes = units
        .checked_mul(unit)
        .and_then(|size| memory.get(start..start.checked_add(size)?))
        .ok_or_else(|| "string out of bounds of the plugin's memory".to_owned())?;
    match encoding {
        StringEncoding::Utf8 => {
            let cut = bytes.len() > max;
            let prefix = &bytes[..bytes.len().min(max)];
            let kept = match std::str::from_utf8(prefix) {
                Ok(s) => s,
                // Cut inside a character: keep what precedes it (valid by construction).
                Err(e) if cut && e.error_len().is_none() => {
                    std::str::from_utf8(&prefix[..e.valid_up_to()]).unwrap_or_default()
                }
                Err(e) => return Err(format!("invalid UTF-8 at byte {}", e.valid_up_to())),
            };
            Ok((Cow::Borrowed(kept), cut))
        }
        _ if !utf16 => {
            // Latin-1: one byte per character, two UTF-8 bytes from 0x80 on.
            let mut out = String::new();
            for (i, &b) in bytes.iter().enumerate() {
                let c = char::from(b);
                if out.len() + c.len_utf8() > max {
                    return Ok((Cow::Owned(out), i < bytes.len()));
                }
                out.push(c);
            }
            Ok((Cow::Owned(out), false))
        }
        _ => {
            let code_units = bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]));
            let mut out = String::new();
            for (i, c) in char::decode_utf16(code_units).enumerate() {
                match c {
                    Ok(c) if out.len() + c.len_utf8() > max => return Ok((Cow::Owned(out), true)),
                    Ok(c) => out.push(c),
                    Err(e) => {
                        return Err(format!(
                            "invalid UTF-16 at code unit {i}: {:#x}",
                            e.unpaired_surrogate()
                        ));
                    }
                }
            }
            Ok((Cow::Owned(out), false))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utf16(s: &str) -> Vec<u8> {
        s.encode_utf16().flat_map(u16::to_le_bytes).collect()
    }

    #[test]
    fn utf8_prefix_is_cut_on_a_character_boundary_without_reading_the_rest() {
        // "é" is two bytes; a cut at 3 falls inside the second "é". The bytes after the
        // prefix are invalid UTF-8 and must not be looked at.
        let mut memory = "éé".as_bytes().to_vec();
        memory.extend_from_slice(&[0xff, 0xfe]);
        let s = read_prefix(&memory, StringEncoding::Utf8, 0, 6, 3).expect("read");
        assert_eq!(s, ("é".into(), true));
        let s = read_prefix(&memory, StringEncoding::Utf8, 0, 4, 100).expect("read");
        assert_eq!(s, ("éé".into(), false));
    }

    #[test]
    fn invalid_utf8_inside_the_prefix_is_an_error() {
        let memory = [b'a', 0xff, b'b'];
        let e = read_prefix(&memory, StringEncoding::Utf8, 0, 3, 100).expect_err("refused");
        assert!(e.contains("invalid UTF-8 at byte 1"), "{e}");
        // A string that ends inside a character is invalid, not cut.
        let memory = "é".as_bytes();
        assert!(read_prefix(&memory[..1], StringEncoding::Utf8, 0, 1, 100).is_err());
    }

    #[test]
    fn a_string_beyond_memory_is_an_error() {
        let memory = [0u8; 16];
        let e = read_prefix(&memory, StringEncoding::Utf8, 8, 9, 4).expect_err("refused");
        assert!(e.contains("out of bounds"), "{e}");
        let e =
            read_prefix(&memory, StringEncoding::Utf8, u32::MAX, u32::MAX, 4).expect_err("refused");
        assert!(e.contains("out of bounds"), "{e}");
    }

    #[test]
    fn utf16_and_latin1_are_decoded_up_to_the_bound() {
        let memory = utf16("añ😀z");
        // 5 code units; UTF-8: a(1) ñ(2) 😀(4) z(1).
        let s = read_prefix(&memory, StringEncoding::Utf16, 0, 5, 100).expect("read");
        assert_eq!(s, ("añ😀z".into(), false));
        let s = read_prefix(&memory, StringEncoding::Utf16, 0, 5, 5).expect("read");
        assert_eq!(s, ("añ".into(), true));
        let tagged = 5 | UTF16_TAG as u32;
        let s = read_prefix(&memory, StringEncoding::CompactUtf16, 0, tagged, 7).expect("read");
        assert_eq!(s, ("añ😀".into(), true));
        let latin1 = [b'a', 0xf1, b'b'];
        let s = read_prefix(&latin1, StringEncoding::CompactUtf16, 0, 3, 3).expect("read");
        assert_eq!(s, ("añ".into(), true));
        let s = read_prefix(&latin1, StringEncoding::CompactUtf16, 0, 3, 4).expect("read");
        assert_eq!(s, ("añb".into(), false));
        let bad = utf16("a")
            .into_iter()
            .chain([0x00, 0xdc, b'b', 0])
            .collect::<Vec<_>>();
        assert!(read_prefix(&bad, StringEncoding::Utf16, 0, 3, 100).is_err());
    }
}

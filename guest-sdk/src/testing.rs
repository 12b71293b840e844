//! A fake host for native unit tests: it collects what a plugin emits and answers its HTTP
//! requests from a mock, so a plugin that acts is tested with `cargo test`, no WebAssembly.
//!
//! Everything here is per thread (cargo runs each test on its own thread), so tests do not
//! see each other's emits or mocks. Only available in native builds.
//!
//! ```
//! use sharehost_guest::{EmitError, Record, testing};
//!
//! testing::reset(); // per thread: start clean
//! let record = Record::with_value(b"{}").at_index(2);
//! record.emit("valid", None, Some(b"{}"), &[]).unwrap();
//! let emits = testing::take_emits();
//! assert_eq!((emits[0].record_index, emits[0].output.as_str()), (2, "valid"));
//!
//! // Make the fake host refuse, to test how the plugin handles it.
//! testing::refuse_emits(|_emit| Err(EmitError::TooManyEmits(1000)));
//! assert_eq!(record.emit("valid", None, None, &[]), Err(EmitError::TooManyEmits(1000)));
//! assert!(testing::take_emits().is_empty());
//! testing::reset();
//! ```

use std::cell::RefCell;

use crate::{EmitError, Header, RESERVED_HEADER_PREFIX};

/// One record a plugin emitted, as the fake host collected it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emit {
    /// The index of the source record in its batch ([`Record::index`](crate::Record::index)).
    pub record_index: u32,
    /// The output name (a key of the manifest's `[pipeline.outputs]`).
    pub output: String,
    /// The key (`None`: null).
    pub key: Option<Vec<u8>>,
    /// The value (`None`: null).
    pub value: Option<Vec<u8>>,
    /// Headers in order (`None` value: null).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Emit {
    /// The value as UTF-8 text, if present and valid.
    pub fn value_str(&self) -> Option<&str> {
        self.value
            .as_deref()
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The value of the first header named `key`: `None` when absent, `Some(None)` when
    /// present with a null value.
    pub fn header(&self, key: &str) -> Option<Option<&[u8]>> {
        self.headers
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_deref())
    }
}

/// Decides whether the fake host takes an emit (`Ok`) or refuses it.
type EmitPolicy = Box<dyn FnMut(&Emit) -> Result<(), EmitError>>;

thread_local! {
    static EMITS: RefCell<Vec<Emit>> = const { RefCell::new(Vec::new()) };
    static EMIT_POLICY: RefCell<Option<EmitPolicy>> = const { RefCell::new(None) };
}

/// Takes (and clears) the emits the fake host accepted on this thread, in order.
pub fn take_emits() -> Vec<Emit> {
    EMITS.with_borrow_mut(std::mem::take)
}

/// Makes the fake host ask `policy` about every further emit on this thread: `Err` refuses
/// it (it is not collected) with that error, as the real host would (an unknown output, a
/// spent budget). Without a policy every emit is taken, except those with a reserved
/// (`sharehost.`) header, which the fake refuses like the host.
pub fn refuse_emits(policy: impl FnMut(&Emit) -> Result<(), EmitError> + 'static) {
    EMIT_POLICY.with_borrow_mut(|p| *p = Some(Box::new(policy)));
}

/// Forgets this thread's collected emits, emit policy, HTTP mock and recorded requests.
pub fn reset() {
    EMITS.with_borrow_mut(Vec::clear);
    EMIT_POLICY.with_borrow_mut(|p| *p = None);
    http::reset();
}

/// The native side of [`Record::emit`](crate::Record::emit).
pub(crate) fn emit(
    record_index: u32,
    output: &str,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[Header<'_>],
) -> Result<(), EmitError> {
    if let Some(h) = headers
        .iter()
        .find(|h| h.key.starts_with(RESERVED_HEADER_PREFIX))
    {
        return Err(EmitError::ReservedHeader(h.key.to_owned()));
    }
    let emit = Emit {
        record_index,
        output: output.to_owned(),
        key: key.map(<[u8]>::to_vec),
        value: value.map(<[u8]>::to_vec),
        headers: headers
            .iter()
            .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
            .collect(),
    };
    // The policy is taken out while it runs, so a policy that emits cannot borrow twice.
    let policy = EMIT_POLICY.with_borrow_mut(Option::take);
    let verdict = match policy {
        Some(mut policy) => {
            let verdict = policy(&emit);
            EMIT_POLICY.with_borrow_mut(|p| {
                if p.is_none() {
                    *p = Some(policy);
                }
            });
            verdict
        }
        None => Ok(()),
    };
    verdict?;
    EMITS.with_borrow_mut(|e| e.push(emit));
    Ok(())
}

/// A fake for [`crate::http`]: a mock answers every request, and the requests are recorded.
pub mod http {
    use std::cell::RefCell;

    use crate::http::{HttpError, Request, Response};

    /// Answers one request.
    type Mock = Box<dyn FnMut(&Request) -> Result<Response, HttpError>>;

    thread_local! {
        static MOCK: RefCell<Option<Mock>> = const { RefCell::new(None) };
        static REQUESTS: RefCell<Vec<Request>> = const { RefCell::new(Vec::new()) };
    }

    /// Answers every further request on this thread with `mock` (requests in a
    /// [`send_all`](crate::http::send_all) are asked in order). Without a mock, every request
    /// is [`HttpError::Denied`], as in a pipeline that grants no host.
    pub fn mock(mock: impl FnMut(&Request) -> Result<Response, HttpError> + 'static) {
        MOCK.with_borrow_mut(|m| *m = Some(Box::new(mock)));
    }

    /// Takes (and clears) the requests sent on this thread, in order (those refused as
    /// invalid before sending included).
    pub fn take_requests() -> Vec<Request> {
        REQUESTS.with_borrow_mut(std::mem::take)
    }

    pub(super) fn reset() {
        MOCK.with_borrow_mut(|m| *m = None);
        REQUESTS.with_borrow_mut(Vec::clear);
    }

    /// The native side of [`crate::http::send_all`].
    pub(crate) fn send_all(requests: Vec<Request>) -> Vec<Result<Response, HttpError>> {
        let mut mock = MOCK.with_borrow_mut(Option::take);
        let answers = requests
            .iter()
            .map(|req| {
                req.target()?;
                match mock.as_mut() {
                    Some(m) => m(req),
                    None => Err(HttpError::Denied(format!(
                        "{}: no mock installed (sharehost_guest::testing::http::mock)",
                        req.url
                    ))),
                }
            })
            .collect();
        MOCK.with_borrow_mut(|m| {
            if m.is_none() {
                *m = mock;
            }
        });
        REQUESTS.with_borrow_mut(|r| r.extend(requests));
        answers
    }
}

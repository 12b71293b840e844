//! The admin API's request bodies (`sharehost::api`) on arbitrary bytes, through the function
//! the admin server reads them with (`api::parse_body`), then what the server does next with
//! one that parses: fill in the host's defaults (`ShadowRequest::from`, `CanaryRequest::from`)
//! and check the numbers (`validate()`).
//!
//! Input: the body as sent, every byte of it, fed to every body type the server parses: swap,
//! rollback, shadow, canary and dead-letter replay.
//!
//! Asserts:
//! - nothing panics, whatever the bytes (not UTF-8, deep nesting, huge numbers, NaN-like
//!   text);
//! - a body that is only whitespace reads as `{}`, as an empty body does;
//! - a body that parses, written back as JSON (as `sharehost ctl` writes it), parses again.
//!   Not compared for equality: serde_json's default float reader may land one unit in the
//!   last place off, which is no fault of the admin API.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sharehost::api::{
    CanaryBody, ReplayRequest, RollbackRequest, ShadowBody, SwapRequest, parse_body,
};
use sharehost::rollout::{CanaryRequest, ShadowRequest};

/// Parses `data` as `T` the server's way; a parsed body survives a round trip.
fn read<T>(data: &[u8]) -> Option<T>
where
    T: DeserializeOwned + Serialize,
{
    let body: T = parse_body(data).ok()?;
    let again = serde_json::to_vec(&body).expect("a parsed body serializes");
    if let Err(e) = parse_body::<T>(&again) {
        panic!(
            "{} read, written as {}, does not read again: {e}",
            String::from_utf8_lossy(data),
            String::from_utf8_lossy(&again)
        );
    }
    Some(body)
}

fuzz_target!(|data: &[u8]| {
    let _ = read::<SwapRequest>(data);
    let rollback = read::<RollbackRequest>(data);
    if data.iter().all(u8::is_ascii_whitespace) {
        assert_eq!(rollback, Some(RollbackRequest::default()), "blank is {{}}");
    }
    if let Some(shadow) = read::<ShadowBody>(data) {
        let _ = ShadowRequest::from(&shadow).validate();
    }
    if let Some(canary) = read::<CanaryBody>(data) {
        let _ = CanaryRequest::from(&canary).validate();
    }
    let _ = read::<ReplayRequest>(data);
});

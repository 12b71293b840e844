//! The admin API's contract as the host uses it: every route, request body and answer is
//! [`sharehost_api`]'s (re-exported here, so `sharehost::api::X` and `sharehost_api::X` are one
//! type), plus how the admin server reads a request body.

pub use sharehost_api::*;

/// Reads a request body of type `T` as the admin server does: JSON, with an empty body (or one
/// of only whitespace) read as `{}`, since nothing and `{}` mean the same for optional fields.
/// Arbitrary bytes give an error, never a panic (fuzzed: fuzz/fuzz_targets/admin_body.rs).
pub fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> serde_json::Result<T> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return serde_json::from_slice(b"{}");
    }
    serde_json::from_slice(bytes)
}

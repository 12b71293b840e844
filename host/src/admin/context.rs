//! What the admin listener's handlers and the console's share: the host's state as they read
//! it, and the bearer-token check of the endpoints that change something.

use std::path::PathBuf;
use std::sync::Arc;

use axum::http::{HeaderMap, header};

use crate::metrics::Metrics;
use crate::tenants::Tenants;

/// What the admin handlers share.
pub struct AdminState {
    /// Every pipeline of the manifest, loaded or not.
    pub tenants: Arc<Tenants>,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// Bearer token for mutating endpoints, when configured.
    pub token: Option<String>,
    /// The manifest the host runs, where the console reads each pipeline's dead-letter topic
    /// and cluster settings from (`None`: no dead-letter view).
    pub manifest: Option<PathBuf>,
    /// The fleet this host is one of (`None`: a host on its own, `GET /fleet` answers 404).
    pub fleet: Option<Arc<crate::fleet::Fleet>>,
    /// Names besides IP addresses and `localhost` that a request's `Host` may give
    /// (`[admin] allowed_hosts`, for a proxy or a DNS name in front): any other is refused, so
    /// a page that rebinds its own name to this listener cannot reach it.
    pub allowed_hosts: Vec<String>,
}

/// Whether a request may change something: always without a token, else only with
/// `Authorization: Bearer TOKEN` (the scheme in any case, as RFC 9110 has it).
pub(crate) fn authorized(state: &AdminState, headers: &HeaderMap) -> bool {
    let Some(token) = &state.token else {
        return true;
    };
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| bearer(v.as_bytes()))
        .is_some_and(|t| same_token(t, token.as_bytes()))
}

/// The credentials of a `Bearer` authorization (`bearer`, `BEARER`, ... alike), after the
/// spaces that follow the scheme.
fn bearer(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer";
    let (scheme, rest) = value.split_at_checked(SCHEME.len())?;
    if !scheme.eq_ignore_ascii_case(SCHEME) || rest.first() != Some(&b' ') {
        return None;
    }
    Some(rest.trim_ascii_start())
}

/// Compares a presented token with the configured one in time that does not depend on where
/// they differ (`subtle`), so response timing cannot reveal the token byte by byte. The
/// length is not hidden; a token of 32 random bytes is not guessed by its length.
fn same_token(presented: &[u8], token: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    presented.len() == token.len() && bool::from(presented.ct_eq(token))
}

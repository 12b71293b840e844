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
}

pub(crate) fn authorized(state: &AdminState, headers: &HeaderMap) -> bool {
    let Some(token) = &state.token else {
        return true;
    };
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .is_some_and(|t| same_token(t, token.as_bytes()))
}

/// Compares a presented token with the configured one in time that does not depend on where
/// they differ (`subtle`), so response timing cannot reveal the token byte by byte. The
/// length is not hidden; a token of 32 random bytes is not guessed by its length.
fn same_token(presented: &[u8], token: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    presented.len() == token.len() && bool::from(presented.ct_eq(token))
}

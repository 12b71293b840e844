//! `[admin]`: the admin HTTP listener ([`AdminSpec`]), and its validator. A listener off
//! loopback must require a bearer token, or anyone who reaches the port could swap plugins.

use std::net::SocketAddr;

use super::context::Ctx;
use super::defaults;
use super::error::ManifestError;
use super::raw::RawAdmin;

/// The admin HTTP listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminSpec {
    /// Address to bind.
    pub listen: String,
    /// Environment variable with the bearer token mutating endpoints require.
    pub token_env: Option<String>,
}

/// Validates `[admin]` (absent: the loopback default, no token).
pub(super) fn validate(cx: &Ctx<'_>, raw: Option<&RawAdmin>) -> Result<AdminSpec, ManifestError> {
    let Some(a) = raw else {
        return Ok(AdminSpec {
            listen: defaults::ADMIN_LISTEN.to_owned(),
            token_env: None,
        });
    };
    let listen = match &a.listen {
        Some(l) => {
            l.get_ref().parse::<SocketAddr>().map_err(|e| {
                cx.err(
                    Some(l.span()),
                    "admin.listen",
                    format!("{:?} is not an address:port ({e})", l.get_ref()),
                )
            })?;
            l.get_ref().clone()
        }
        None => defaults::ADMIN_LISTEN.to_owned(),
    };
    let token_env = a.token_env.as_ref().map(|t| t.get_ref().clone());
    // Only a loopback listener may leave the rollout endpoints open: elsewhere anyone who
    // reaches the port could swap in their own plugin.
    let loopback = listen
        .parse::<SocketAddr>()
        .is_ok_and(|addr| addr.ip().is_loopback());
    if !loopback && token_env.is_none() {
        return Err(cx.err(
            a.listen.as_ref().map(|l| l.span()),
            "admin.listen",
            format!(
                "{listen} is not a loopback address: set admin.token_env, so that \
                 swaps and rollouts need a bearer token (or listen on 127.0.0.1)"
            ),
        ));
    }
    Ok(AdminSpec { listen, token_env })
}

//! `[admin]`: the admin HTTP listener ([`AdminSpec`]), and its validator. A listener off
//! loopback must require a bearer token, or anyone who reaches the port could swap plugins: a
//! token-less listener is for development on loopback only.

use std::net::SocketAddr;

use super::context::Ctx;
use super::defaults;
use super::error::ManifestError;
use super::raw::RawAdmin;

/// Most names `admin.allowed_hosts` may list: a proxy or two and their aliases, not a list
/// that grows without end.
pub const MAX_ALLOWED_HOSTS: usize = 64;

/// Longest DNS name (RFC 1035).
const MAX_NAME: usize = 253;

/// The admin HTTP listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminSpec {
    /// Address to bind.
    pub listen: String,
    /// Environment variable with the bearer token mutating endpoints require.
    pub token_env: Option<String>,
    /// Names a request's `Host` may give besides IP addresses and `localhost` (a proxy's, a
    /// Service's DNS name): every other name is refused, against DNS rebinding.
    pub allowed_hosts: Vec<String>,
}

/// Validates `[admin]` (absent: the loopback default, no token).
pub(super) fn validate(cx: &Ctx<'_>, raw: Option<&RawAdmin>) -> Result<AdminSpec, ManifestError> {
    let Some(a) = raw else {
        return Ok(AdminSpec {
            listen: defaults::ADMIN_LISTEN.to_owned(),
            token_env: None,
            allowed_hosts: Vec::new(),
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
    // reaches the port could swap in their own plugin. No key turns this off: every deployment
    // this project ships sets a token, and one that wants none can listen on loopback behind
    // its own proxy.
    let loopback = listen
        .parse::<SocketAddr>()
        .is_ok_and(|addr| addr.ip().is_loopback());
    if !loopback && token_env.is_none() {
        return Err(cx.err(
            a.listen.as_ref().map(|l| l.span()),
            "admin.listen",
            format!(
                "{listen} is not a loopback address, and a listener without a token is for \
                 development on loopback only: set [admin] token_env to an environment \
                 variable holding a bearer token (swaps and rollouts then need it), or listen \
                 on 127.0.0.1"
            ),
        ));
    }
    let allowed_hosts = allowed_hosts(cx, a)?;
    Ok(AdminSpec {
        listen,
        token_env,
        allowed_hosts,
    })
}

/// `admin.allowed_hosts`: DNS names (no port, no scheme, no wildcard), at most
/// [`MAX_ALLOWED_HOSTS`].
fn allowed_hosts(cx: &Ctx<'_>, a: &RawAdmin) -> Result<Vec<String>, ManifestError> {
    let Some(list) = &a.allowed_hosts else {
        return Ok(Vec::new());
    };
    if list.get_ref().len() > MAX_ALLOWED_HOSTS {
        return Err(cx.err(
            Some(list.span()),
            "admin.allowed_hosts",
            format!(
                "lists {} names; at most {MAX_ALLOWED_HOSTS} are allowed",
                list.get_ref().len()
            ),
        ));
    }
    list.get_ref()
        .iter()
        .map(|name| {
            let n = name.get_ref();
            let labels_ok = n.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
            if n.len() > MAX_NAME || !labels_ok {
                return Err(cx.err(
                    Some(name.span()),
                    "admin.allowed_hosts",
                    format!(
                        "{:?} is not a DNS name (letters, digits, '-' and '_' in labels of 1 \
                         to 63 between dots, at most {MAX_NAME} bytes; no port, scheme or \
                         wildcard: IP addresses and localhost are always allowed)",
                        sharehost_text::cut_marked(n, 100)
                    ),
                ));
            }
            Ok(n.to_ascii_lowercase())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::manifest::Manifest;

    fn manifest(admin: &str) -> String {
        format!(
            "[cluster]\nbootstrap = \"127.0.0.1:9092\"\n\n[admin]\n{admin}\n\n[[pipeline]]\n\
             name = \"p\"\ntopics = [\"t\"]\ngroup = \"g\"\ncomponent = \"Cargo.toml\"\n"
        )
    }

    fn parse(admin: &str) -> Result<Manifest, String> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("m.toml");
        Manifest::parse(&path, &manifest(admin)).map_err(|e| e.to_string())
    }

    #[test]
    fn allowed_hosts_are_dns_names_and_bounded() {
        let m = parse(r#"allowed_hosts = ["Sharehost.Internal", "sharehost-admin"]"#)
            .expect("valid names");
        assert_eq!(
            m.admin.allowed_hosts,
            ["sharehost.internal", "sharehost-admin"]
        );
        for bad in [
            "a.example:80",
            "http://a.example",
            "*.example",
            "",
            "a..b",
            "a b",
        ] {
            let e = parse(&format!("allowed_hosts = [{bad:?}]")).expect_err(bad);
            assert!(e.contains("admin.allowed_hosts"), "{e}");
        }
        let many: Vec<String> = (0..=super::MAX_ALLOWED_HOSTS)
            .map(|i| format!("\"h{i}\""))
            .collect();
        let e = parse(&format!("allowed_hosts = [{}]", many.join(", "))).expect_err("too many");
        assert!(e.contains("at most 64"), "{e}");
    }

    #[test]
    fn a_listener_off_loopback_without_a_token_is_refused_naming_the_key() {
        let e = parse(r#"listen = "0.0.0.0:9464""#).expect_err("no token");
        assert!(
            e.contains("[admin] token_env") && e.contains("127.0.0.1"),
            "{e}"
        );
        parse("listen = \"0.0.0.0:9464\"\ntoken_env = \"T\"").expect("with a token");
        parse(r#"listen = "[::1]:9464""#).expect("loopback");
    }
}

//! What every admin request passes before a handler sees it, so that a web page the operator
//! happens to open cannot use the browser as its way in:
//!
//! - **Host** (every route): one of the listener's own names, an IP address literal,
//!   `localhost`, or a name of `[admin] allowed_hosts`. A page that rebinds its own DNS name to
//!   the listener's address (DNS rebinding) is then same-origin in the browser's eyes but sends
//!   its own name as `Host`, and is refused (403). A request without `Host` (HTTP/1.0) is
//!   refused too: a browser always sends one, but nothing could tell a rebinding page's
//!   request from a legitimate one without it, and every client of this listener (probes,
//!   Prometheus, `sharehost ctl`, curl) sends one.
//! - **Origin** (every method but `GET` and `HEAD`): absent, or the listener's own origin, the
//!   one the `Host` names (403 otherwise). A browser sends `Origin` on every cross-origin
//!   `POST` and `DELETE`, forms and `no-cors` fetches included.
//! - **Content-Type** (every method but `GET` and `HEAD`): `application/json`, with or without
//!   a body (415 otherwise). A form or a `no-cors` fetch cannot send it, and a cross-origin
//!   `fetch` that does needs a CORS preflight, which this listener never grants.
//!
//! The bearer token (`[admin] token_env`) is checked after these, by the handlers.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::context::AdminState;
use sharehost_api::{Denied, JSON_CONTENT_TYPE};

/// Bytes of a refused `Host` or `Origin` repeated in the answer (they come from the request).
const SHOWN: usize = 100;

/// The middleware: refuses what a browser could forge, passes the rest to the handler.
pub(crate) async fn guard(
    State(state): State<Arc<AdminState>>,
    request: Request,
    next: Next,
) -> Response {
    match check(
        request.method(),
        request.uri().authority().map(|a| a.as_str()),
        request.headers(),
        &state.allowed_hosts,
    ) {
        Ok(()) => next.run(request).await,
        Err((status, error)) => (status, axum::Json(Denied { error })).into_response(),
    }
}

/// Whether a request with this method, URI authority (absolute-form requests carry one) and
/// headers may reach its handler; the status and reason when not.
pub(crate) fn check(
    method: &Method,
    uri_authority: Option<&str>,
    headers: &HeaderMap,
    allowed: &[String],
) -> Result<(), (StatusCode, String)> {
    let host = match headers.get(header::HOST) {
        Some(v) => Some(v.to_str().map_err(|_| {
            (
                StatusCode::FORBIDDEN,
                "the Host header is not ASCII".to_owned(),
            )
        })?),
        None => None,
    };
    let Some(authority) = host.or(uri_authority) else {
        return Err((
            StatusCode::FORBIDDEN,
            "a Host header is required (an IP address, localhost or a name of [admin] \
             allowed_hosts)"
                .to_owned(),
        ));
    };
    for a in [host, uri_authority].into_iter().flatten() {
        if !host_allowed(a, allowed) {
            return Err((
                StatusCode::FORBIDDEN,
                format!(
                    "Host {:?} is not a name of this listener: use its IP address or \
                     localhost, or add the name to [admin] allowed_hosts",
                    sharehost_text::cut(a, SHOWN)
                ),
            ));
        }
    }
    if method == Method::GET || method == Method::HEAD {
        return Ok(());
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !same_origin(origin, authority) {
            return Err((
                StatusCode::FORBIDDEN,
                format!(
                    "Origin {:?} is not this listener's own (http://{}): requests that change \
                     something are taken from the listener's own pages and from clients that \
                     send no Origin",
                    sharehost_text::cut(origin, SHOWN),
                    sharehost_text::cut(authority, SHOWN)
                ),
            ));
        }
    }
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_json);
    if !json {
        return Err((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "expected Content-Type: {JSON_CONTENT_TYPE} (every POST and DELETE, with or \
                 without a body)"
            ),
        ));
    }
    Ok(())
}

/// `application/json`, in any case, with or without parameters (`; charset=utf-8`).
pub(crate) fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case(JSON_CONTENT_TYPE)
}

/// A `Host` (`host[:port]`) split into its host and port; `None` when it is not one.
fn split_authority(authority: &str) -> Option<(&str, Option<&str>)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        // `[`, the address, `]`: ASCII brackets around it, so this is a character boundary.
        (authority.split_at(inside.len() + 2).0, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if port.is_some_and(|p| !p.is_empty() && p.parse::<u16>().is_err()) || host.is_empty() {
        return None;
    }
    Some((host, port.filter(|p| !p.is_empty())))
}

/// Whether `authority` names this listener: an IPv4 or bracketed IPv6 literal, `localhost`,
/// or one of `allowed` (names compared without case, a final dot ignored), with any port.
pub(crate) fn host_allowed(authority: &str, allowed: &[String]) -> bool {
    let Some((host, _)) = split_authority(authority) else {
        return false;
    };
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return v6.parse::<Ipv6Addr>().is_ok();
    }
    if host.parse::<Ipv4Addr>().is_ok() {
        return true;
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    name.eq_ignore_ascii_case("localhost") || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// Whether `origin` (`scheme://host[:port]`) is the origin whose authority the `Host` header
/// gives. `http` is the listener's own scheme; `https` is taken too, for a proxy in front that
/// ends TLS and passes the name on (the name decides who owns the page, and it passed the Host
/// check). A default port (80, 443) is the same as none.
pub(crate) fn same_origin(origin: &str, host: &str) -> bool {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    let default = match scheme.to_ascii_lowercase().as_str() {
        "http" => "80",
        "https" => "443",
        _ => return false,
    };
    let (Some((o_host, o_port)), Some((h_host, h_port))) =
        (split_authority(rest), split_authority(host))
    else {
        return false;
    };
    o_host.eq_ignore_ascii_case(h_host) && o_port.unwrap_or(default) == h_port.unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed() -> Vec<String> {
        vec!["sharehost.internal".to_owned()]
    }

    #[test]
    fn ip_literals_localhost_and_listed_names_are_the_listeners_names() {
        for ok in [
            "127.0.0.1",
            "127.0.0.1:9464",
            "10.1.2.3:9464",
            "[::1]",
            "[::1]:9464",
            "[fe80::1]:80",
            "localhost",
            "LocalHost:9464",
            "localhost.:9464",
            "sharehost.internal",
            "Sharehost.Internal:8080",
        ] {
            assert!(host_allowed(ok, &allowed()), "{ok}");
        }
        for refused in [
            "evil.example",
            "evil.example:9464",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "sharehost.internal.evil.example",
            "127.1",
            "[::1",
            "[evil]:80",
            "::1",
            "127.0.0.1:99999",
            "127.0.0.1:x",
            ":9464",
            "",
        ] {
            assert!(!host_allowed(refused, &allowed()), "{refused}");
        }
    }

    #[test]
    fn the_origin_must_be_the_hosts_own() {
        assert!(same_origin("http://127.0.0.1:9464", "127.0.0.1:9464"));
        assert!(same_origin("http://[::1]:9464", "[::1]:9464"));
        assert!(same_origin(
            "http://sharehost.internal",
            "sharehost.internal:80"
        ));
        assert!(same_origin(
            "https://sharehost.internal",
            "sharehost.internal"
        ));
        assert!(same_origin("HTTP://LOCALHOST:9464", "localhost:9464"));
        assert!(!same_origin("http://evil.example:9464", "127.0.0.1:9464"));
        assert!(!same_origin("http://127.0.0.1:8000", "127.0.0.1:9464"));
        assert!(!same_origin(
            "https://sharehost.internal",
            "sharehost.internal:80"
        ));
        assert!(!same_origin("null", "127.0.0.1:9464"));
        assert!(!same_origin("file://", "127.0.0.1:9464"));
        assert!(!same_origin("ftp://127.0.0.1:9464", "127.0.0.1:9464"));
    }

    #[test]
    fn only_json_is_taken() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(!is_json("text/plain"));
        assert!(!is_json("application/jsonp"));
        assert!(!is_json("application/x-www-form-urlencoded"));
        assert!(!is_json(""));
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().expect("header value"));
        }
        h
    }

    #[test]
    fn state_changing_requests_need_json_and_no_foreign_origin() {
        let json = ("content-type", "application/json");
        let host = ("host", "127.0.0.1:9464");
        let post = |h: &[(&'static str, &str)]| check(&Method::POST, None, &headers(h), &[]);
        assert_eq!(post(&[host, json]), Ok(()));
        assert_eq!(
            post(&[host, json, ("origin", "http://127.0.0.1:9464")]),
            Ok(())
        );
        let status = |r: Result<(), (StatusCode, String)>| r.err().map(|(s, _)| s);
        assert_eq!(
            status(post(&[host, ("content-type", "text/plain")])),
            Some(StatusCode::UNSUPPORTED_MEDIA_TYPE)
        );
        assert_eq!(
            status(post(&[host])),
            Some(StatusCode::UNSUPPORTED_MEDIA_TYPE)
        );
        assert_eq!(
            status(post(&[host, json, ("origin", "http://evil.example")])),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            status(post(&[("host", "evil.example"), json])),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            status(post(&[json])),
            Some(StatusCode::FORBIDDEN),
            "no Host"
        );
        let get = check(
            &Method::GET,
            None,
            &headers(&[host, ("origin", "http://evil.example")]),
            &[],
        );
        assert_eq!(get, Ok(()), "reading needs no JSON and no Origin check");
        assert_eq!(
            status(check(
                &Method::GET,
                Some("evil.example"),
                &headers(&[host]),
                &[]
            )),
            Some(StatusCode::FORBIDDEN),
            "an absolute URI's authority is checked as well"
        );
    }
}

//! Outbound HTTP from a plugin: a small blocking `fetch`, and [`send_all`] for the requests of
//! one batch at once.
//!
//! A pipeline grants hosts in its manifest (`allowed_outbound_hosts = ["http://127.0.0.1:8088"]`,
//! scheme + host + port); a request to any other host is refused inside the host and comes
//! back as [`HttpError::Denied`]. A component that uses this module imports
//! `wasi:http/outgoing-handler`, and a pipeline that grants no host refuses it at load; a
//! plugin that never calls it imports nothing and needs no grant. The host also bounds each
//! request (timeout, response size) and the requests in flight, follows no redirect, and
//! counts the time spent waiting against the batch's wall-clock deadline (not its CPU one).
//!
//! In a component the calls go through `wasi:http`. Natively (your unit tests) they go to the
//! mock installed with [`testing::http::mock`](crate::testing::http::mock).
//!
//! ```
//! use sharehost_guest::{http, testing};
//!
//! testing::reset();
//! testing::http::mock(|req| match req.url.as_str() {
//!     "http://127.0.0.1:8088/price/A-1" => Ok(http::Response::new(200).with_body(r#"{"unit_price":2.5}"#)),
//!     _ => Ok(http::Response::new(404)),
//! });
//! let answers = http::send_all(vec![
//!     http::Request::get("http://127.0.0.1:8088/price/A-1"),
//!     http::Request::get("http://127.0.0.1:8088/price/Z-9"),
//! ]);
//! assert_eq!(answers[0].as_ref().map(|r| r.status), Ok(200));
//! assert_eq!(answers[1].as_ref().map(|r| r.status), Ok(404));
//! ```

use std::fmt;

/// An HTTP method.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Method {
    /// `GET`
    Get,
    /// `HEAD`
    Head,
    /// `POST`
    Post,
    /// `PUT`
    Put,
    /// `DELETE`
    Delete,
    /// `PATCH`
    Patch,
    /// `OPTIONS`
    Options,
    /// Any other method, by name.
    Other(String),
}

impl Method {
    /// The method's name as sent on the wire.
    pub fn as_str(&self) -> &str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
            Method::Patch => "PATCH",
            Method::Options => "OPTIONS",
            Method::Other(name) => name,
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One outgoing request: built with [`Request::get`]/[`Request::post`] and the builder
/// methods, sent with [`send`] or [`send_all`]. The fields are public so that tests can
/// inspect what a plugin sent ([`testing::http::take_requests`](crate::testing::http::take_requests)).
#[derive(Clone, PartialEq, Eq)]
pub struct Request {
    /// The method.
    pub method: Method,
    /// The absolute URL (`http://host:port/path?query` or `https://...`).
    pub url: String,
    /// Headers in order (names may repeat).
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body (empty: none).
    pub body: Vec<u8>,
}

/// Header names whose values `{:?}` never prints (they carry credentials).
const REDACTED_HEADERS: [&str; 4] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "x-api-key",
];

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Headers<'a>(&'a [(String, Vec<u8>)]);
        impl fmt::Debug for Headers<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_list()
                    .entries(self.0.iter().map(|(k, v)| {
                        let secret = REDACTED_HEADERS.iter().any(|r| k.eq_ignore_ascii_case(r));
                        (
                            k,
                            if secret {
                                "<redacted>".to_owned()
                            } else {
                                String::from_utf8_lossy(v).into_owned()
                            },
                        )
                    }))
                    .finish()
            }
        }
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("url", &self.url)
            .field("headers", &Headers(&self.headers))
            .field("body_len", &self.body.len())
            .finish()
    }
}

impl Request {
    /// A request with this method and URL, no headers, no body.
    pub fn new(method: Method, url: impl Into<String>) -> Self {
        Self {
            method,
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// A `GET` request.
    pub fn get(url: impl Into<String>) -> Self {
        Self::new(Method::Get, url)
    }

    /// A `POST` request (add a body with [`Request::body`]).
    pub fn post(url: impl Into<String>) -> Self {
        Self::new(Method::Post, url)
    }

    /// A `PUT` request.
    pub fn put(url: impl Into<String>) -> Self {
        Self::new(Method::Put, url)
    }

    /// A `DELETE` request.
    pub fn delete(url: impl Into<String>) -> Self {
        Self::new(Method::Delete, url)
    }

    /// The same request with one more header.
    pub fn header(mut self, name: impl Into<String>, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((name.into(), value.as_ref().to_vec()));
        self
    }

    /// The same request with `Authorization: Bearer TOKEN` (its value is never printed by
    /// `{:?}`).
    pub fn bearer_auth(self, token: &str) -> Self {
        self.header("authorization", format!("Bearer {token}"))
    }

    /// The same request with this body (sent with its `content-length`, unless a header
    /// sets one).
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// The value of the first header named `name` (case-insensitive).
    pub fn header_value(&self, name: &str) -> Option<&[u8]> {
        find_header(&self.headers, name)
    }

    /// Checks that the request can be sent as built (an absolute `http`/`https` URL with a
    /// host), without sending it: lets `init` refuse a bad configured URL at load instead of
    /// failing every record later.
    pub fn validate(&self) -> Result<(), HttpError> {
        self.target().map(|_| ())
    }

    /// The URL split into what `wasi:http` wants; refuses anything but an absolute
    /// `http`/`https` URL, the same natively and in a component.
    pub(crate) fn target(&self) -> Result<Target, HttpError> {
        let uri: ::http::Uri = self
            .url
            .parse()
            .map_err(|e| HttpError::InvalidRequest(format!("url `{}`: {e}", self.url)))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(other) => {
                return Err(HttpError::InvalidRequest(format!(
                    "url `{}`: scheme `{other}` is not http or https",
                    self.url
                )));
            }
            None => {
                return Err(HttpError::InvalidRequest(format!(
                    "url `{}` is not absolute (http://host/...)",
                    self.url
                )));
            }
        };
        let authority = uri
            .authority()
            .map(|a| a.as_str().to_owned())
            .ok_or_else(|| HttpError::InvalidRequest(format!("url `{}` has no host", self.url)))?;
        let path_with_query = uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
        Ok(Target {
            https,
            authority,
            path_with_query,
        })
    }
}

/// Where a request goes, as `wasi:http` takes it.
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) https: bool,
    pub(crate) authority: String,
    pub(crate) path_with_query: String,
}

/// A response: status, headers and the whole body (read before [`send`] returns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Headers in order (names as the server sent them, lower-case in HTTP/2).
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// A response with this status, no headers, no body (for mocks).
    pub fn new(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// The same response with one more header (for mocks).
    pub fn with_header(mut self, name: impl Into<String>, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((name.into(), value.as_ref().to_vec()));
        self
    }

    /// The same response with this body (for mocks).
    pub fn with_body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// The value of the first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        find_header(&self.headers, name)
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body as UTF-8 text, if it is.
    pub fn text(&self) -> Option<&str> {
        std::str::from_utf8(&self.body).ok()
    }
}

fn find_header<'h>(headers: &'h [(String, Vec<u8>)], name: &str) -> Option<&'h [u8]> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

/// Why a request got no response. HTTP statuses (404, 429, 503 …) are not errors: they are
/// [`Response`]s.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum HttpError {
    /// The request cannot be sent as built (a URL that is not absolute `http`/`https`, a bad
    /// header name or value, a bad method).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The host refused to send it: the URL's scheme, host and port are not in the
    /// pipeline's `allowed_outbound_hosts` (or the name resolves to an address the list does
    /// not grant). Nothing left the host.
    #[error("refused by the host (not in allowed_outbound_hosts): {0}")]
    Denied(String),
    /// No answer in time: the host's per-request timeout (`http_timeout_ms`), or a connect,
    /// DNS or read timeout.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The server could not be reached or the connection broke (DNS, refused, reset, TLS).
    #[error("connection failed: {0}")]
    Connect(String),
    /// The response body is larger than the host allows (`http_max_response_bytes`).
    #[error("response too large: {0}")]
    TooLarge(String),
    /// Any other failure (a protocol error, too many requests in flight …).
    #[error("HTTP failure: {0}")]
    Other(String),
}

/// Sends one request and waits for the whole response.
pub fn send(request: Request) -> Result<Response, HttpError> {
    send_all(vec![request])
        .pop()
        .unwrap_or_else(|| Err(HttpError::Other("no response".to_owned())))
}

/// `GET url`, waiting for the whole response.
pub fn get(url: &str) -> Result<Response, HttpError> {
    send(Request::get(url))
}

/// Sends all `requests` at once and waits until every one has its answer, in the same order:
/// a batch of N records that each need a lookup waits about one round trip, not N.
///
/// In a component every request is started first (`wasi:http/outgoing-handler.handle`), then
/// their futures are polled together (`wasi:io/poll.poll`) and each body is read as its
/// response arrives. The host may still bound how many run at once (`http_max_concurrent`).
/// A request that cannot be built fails alone; the others go on.
pub fn send_all(requests: Vec<Request>) -> Vec<Result<Response, HttpError>> {
    // An import circle on purpose: this module is the facade a plugin calls, and its two
    // backends (the component's wasi:http, the native tests' fake) take its request and
    // response types; one backend is compiled in, chosen by the target.
    #[cfg(target_arch = "wasm32")]
    return crate::wasm::http::send_all(requests);
    #[cfg(not(target_arch = "wasm32"))]
    return crate::testing::http::send_all(requests);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_split_into_scheme_authority_and_path() {
        let t = Request::get("https://api.example.com:8443/price/A-1?x=1")
            .target()
            .expect("valid url");
        assert_eq!(
            t,
            Target {
                https: true,
                authority: "api.example.com:8443".into(),
                path_with_query: "/price/A-1?x=1".into()
            }
        );
        let t = Request::get("http://127.0.0.1:8088")
            .target()
            .expect("valid url");
        assert_eq!(t.path_with_query, "/");
        assert!(!t.https);
    }

    #[test]
    fn a_relative_or_non_http_url_is_an_invalid_request() {
        for url in ["/price/A-1", "ftp://example.com/x", "not a url", ""] {
            assert!(
                matches!(
                    Request::get(url).target(),
                    Err(HttpError::InvalidRequest(_))
                ),
                "{url}"
            );
        }
    }

    #[test]
    fn debug_of_a_request_never_shows_its_credentials() {
        let r = Request::post("http://127.0.0.1/")
            .bearer_auth("s3cret-token")
            .header("X-Api-Key", "k3y")
            .header("accept", "application/json")
            .body("payload");
        let shown = format!("{r:?}");
        assert!(!shown.contains("s3cret-token"), "{shown}");
        assert!(!shown.contains("k3y"), "{shown}");
        assert!(shown.contains("application/json"), "{shown}");
        assert_eq!(
            r.header_value("Authorization"),
            Some(&b"Bearer s3cret-token"[..])
        );
    }

    #[test]
    fn response_headers_are_found_whatever_their_case() {
        let r = Response::new(429).with_header("Retry-After", "3");
        assert_eq!(r.header("retry-after"), Some(&b"3"[..]));
        assert!(!r.is_success());
        assert!(Response::new(204).is_success());
    }
}

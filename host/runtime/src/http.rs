//! Outbound HTTP for plugins (`wasi:http/outgoing-handler`), granted per pipeline by an
//! allow-list.
//!
//! wasmtime-wasi-http implements the `wasi:http` types and hands every outgoing request to
//! [`WasiHttpHooks::send_request`]; the crate's own sender (which connects anywhere) is not
//! compiled in. This module is that hook, and it is where every promise of the grant is kept:
//!
//! - **Allow-list.** A request whose scheme, host and port match no `allowed_outbound_hosts`
//!   entry fails with `HTTP-request-denied` (a value the guest handles), is logged and
//!   counted, and never leaves the host: no DNS lookup, no connection.
//! - **Address check.** The host resolves the name itself and connects only to addresses it
//!   checked (never resolving again, so DNS rebinding cannot swap the address in between).
//!   Loopback, private, link-local, shared (CGNAT), documentation and other non-public
//!   addresses are dropped unless the same scheme, address and port are listed as an IP
//!   literal (`http://127.0.0.1:8080`); a name left with no address is refused
//!   (`destination-IP-prohibited`).
//! - **No redirects.** hyper's connection-level client follows none, and nothing here does:
//!   a 3xx is the guest's to read.
//! - **One timeout per request** (`request_timeout`) covers the whole exchange from the
//!   moment it has a permit: DNS, connect, TLS, sending, the response head and the whole body.
//!   One deadline bounds how long a request can hold a permit, whatever the server does (a
//!   server that drips one byte at a time cannot stretch it, a plugin that never reads the
//!   answer cannot either). Waiting for a permit has a timeout of the same length of its own.
//!   The guest's own `request-options` timeouts are ignored: the grant's deadline is the one
//!   the pipeline's operator chose, and a plugin can always give up earlier by dropping the
//!   response future.
//! - **Response-size cap.** A `Content-Length` over `max_response_bytes` is refused at the
//!   head; a body without one is cut when it passes the cap, and the guest's stream fails with
//!   `HTTP-response-body-size`. The body is read only as fast as the guest reads it, so the
//!   host holds at most hyper's read buffer per request, never the body.
//! - **Concurrency cap.** One semaphore per grant (every instance of the plugin version
//!   shares it); a request waits for a permit within its timeout and holds it until its
//!   connection is closed.
//! - **TLS** through rustls (ring) with the system roots plus the optional CA file, one
//!   client configuration per grant; HTTP/1.1 only.
//! - **Bounded request bodies.** A guest writes at most 64 KiB per call into an outgoing
//!   body, and one chunk is buffered per body.
//!
//! Refusals are logged at warn with the origin (`scheme://host:port`, never the path or
//! query, which may carry tokens) and the plugin's name when the grant was built with
//! [`HttpGrant::named`]; every outcome is counted in [`HttpGrant::stats`].

use std::fmt;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::{PathAndQuery, Scheme};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use rustls_pki_types::pem::PemObject;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep, timeout_at};
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::{
    Error as HttpError, RequestOptions, WasiBody, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks,
    WasiHttpView,
};

use super::host::{Charged, CpuMeter, StoreState};
use super::secrets::Secrets;

/// Largest write a guest may make to an outgoing request body in one call (wasmtime-wasi-http
/// defaults to 1 MiB). With one buffered chunk per body (the crate's default), an open request
/// body holds at most this much host memory; a guest that sends more writes more often, paced
/// by `check-write`.
const OUTGOING_BODY_CHUNK_SIZE: usize = 64 << 10;

/// Largest read buffer hyper keeps per connection (its default is about 400 KiB): what one
/// request can hold in the host however large the response.
const MAX_READ_BUFFER: usize = 64 << 10;

/// What a pipeline's manifest grants for outbound HTTP, before it is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSettings {
    /// `allowed_outbound_hosts`: scheme + host + port entries (`https://api.example.com`,
    /// `http://127.0.0.1:8080`, `https://*.example.com`).
    pub allowed_outbound_hosts: Vec<String>,
    /// Per-request timeout: the whole exchange, from when the request has its permit to the
    /// last byte of the response body (the wait for a permit has a timeout of its own, as
    /// long).
    pub request_timeout: Duration,
    /// Largest response body handed to the guest.
    pub max_response_bytes: u64,
    /// Requests in flight at once, across all instances of the pipeline.
    pub max_concurrent: usize,
    /// Extra CA certificates (PEM) trusted beside the system roots.
    pub ca_file: Option<PathBuf>,
}

/// The limits a grant gets when only hosts are given (`sharehost test-plugin
/// --allow-outbound-host`): the same as the manifest's defaults (5 s, 1 MiB, 32 at once), so a
/// plugin behaves offline as it will in a pipeline. A zero limit would refuse every request.
impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            allowed_outbound_hosts: Vec::new(),
            request_timeout: Duration::from_secs(5),
            max_response_bytes: 1 << 20,
            max_concurrent: 32,
            ca_file: None,
        }
    }
}

/// The scheme of an allow-list entry: an entry grants one scheme, so listing
/// `https://api.example.com` never lets a plugin talk to it in clear text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OriginScheme {
    /// `http://`, default port 80.
    Http,
    /// `https://`, default port 443.
    Https,
}

impl OriginScheme {
    fn default_port(self) -> u16 {
        match self {
            OriginScheme::Http => 80,
            OriginScheme::Https => 443,
        }
    }
}

impl fmt::Display for OriginScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OriginScheme::Http => "http",
            OriginScheme::Https => "https",
        })
    }
}

/// The host part of an allow-list entry; kept apart from names so that an IP literal can
/// also lift the address check for exactly that address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedHost {
    /// One DNS name (lower case), matched exactly.
    Name(String),
    /// `*.example.com`: any name with at least one more label in front of the suffix
    /// (`a.example.com`, `a.b.example.com`), never the suffix itself.
    Subdomains(String),
    /// An IP literal; requests to it, and names resolving to it on the same scheme and port,
    /// pass the address check even when it is loopback or private.
    Ip(IpAddr),
}

/// One checked `allowed_outbound_hosts` entry: what a plugin may reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedOrigin {
    /// The scheme the entry grants.
    pub scheme: OriginScheme,
    /// The host (name, subdomain wildcard or IP literal).
    pub host: AllowedHost,
    /// The port (the scheme's default when the entry names none).
    pub port: u16,
}

impl AllowedOrigin {
    /// Whether a request to `target` is within this entry.
    fn permits(&self, target: &Target) -> bool {
        if self.scheme != target.scheme || self.port != target.port {
            return false;
        }
        match (&self.host, &target.host) {
            (AllowedHost::Name(name), TargetHost::Name(host)) => name == host,
            (AllowedHost::Subdomains(suffix), TargetHost::Name(host)) => host
                .strip_suffix(suffix.as_str())
                .and_then(|front| front.strip_suffix('.'))
                .is_some_and(|front| !front.is_empty() && !front.ends_with('.')),
            (AllowedHost::Ip(listed), TargetHost::Ip(ip)) => {
                listed.to_canonical() == ip.to_canonical()
            }
            _ => false,
        }
    }
}

impl fmt::Display for AllowedOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", self.scheme)?;
        match &self.host {
            AllowedHost::Name(name) => f.write_str(name)?,
            AllowedHost::Subdomains(suffix) => write!(f, "*.{suffix}")?,
            AllowedHost::Ip(IpAddr::V4(ip)) => write!(f, "{ip}")?,
            AllowedHost::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]")?,
        }
        write!(f, ":{}", self.port)
    }
}

/// Why an `allowed_outbound_hosts` entry was refused; the manifest shows it at the entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("allowed_outbound_hosts entry {entry:?}: {problem}")]
pub struct OriginError {
    /// The entry as written.
    pub entry: String,
    /// What is wrong with it.
    pub problem: OriginProblem,
}

/// What is wrong with an allow-list entry, one case per rule so tests (and users) can tell.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OriginProblem {
    /// No `scheme://` in front.
    #[error("expected scheme://host[:port], e.g. https://api.example.com")]
    MissingScheme,
    /// A scheme other than http or https.
    #[error("scheme {0:?} is not supported (http or https)")]
    UnsupportedScheme(String),
    /// `user@host`: credentials belong in secrets, not in the grant.
    #[error("user information (user@host) is not allowed")]
    UserInfo,
    /// A path, query or fragment: the grant is per origin.
    #[error("a path, query or fragment is not allowed (the grant is scheme://host[:port])")]
    Path,
    /// Nothing between `://` and the port.
    #[error("no host")]
    MissingHost,
    /// A port that is not 1..=65535.
    #[error("port {0:?} is not a number from 1 to 65535")]
    BadPort(String),
    /// An unbracketed or malformed IPv6 literal.
    #[error("an IPv6 address must be written in brackets, e.g. http://[::1]:8080")]
    BadIpv6,
    /// A `*` anywhere but a leading `*.` label, or a wildcard over a top-level domain.
    #[error(
        "the only wildcard is a leading \"*.\" over a domain of two labels or more (https://*.example.com)"
    )]
    BadWildcard,
    /// Not a DNS name.
    #[error("{0:?} is not a valid host name")]
    BadHost(String),
    /// A name whose last label is numeric (`127.1`): resolvers read those as IPv4 addresses.
    #[error("{0:?} looks like an IPv4 address but is not one; write the address in full")]
    NumericHost(String),
}

/// Checks one `allowed_outbound_hosts` entry: `scheme://host[:port]`, scheme http or https,
/// host a DNS name, an IP literal (IPv6 in brackets) or `*.domain`; no path, no user
/// information, no other wildcard. Exposed so the manifest can point at the bad entry.
pub fn parse_allowed_origin(entry: &str) -> Result<AllowedOrigin, OriginError> {
    let fail = |problem| OriginError {
        entry: entry.to_owned(),
        problem,
    };
    let (scheme, rest) = entry
        .split_once("://")
        .ok_or_else(|| fail(OriginProblem::MissingScheme))?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "http" => OriginScheme::Http,
        "https" => OriginScheme::Https,
        _ => return Err(fail(OriginProblem::UnsupportedScheme(scheme.to_owned()))),
    };
    // A lone trailing slash is the empty path, which people write out of habit.
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('@') {
        return Err(fail(OriginProblem::UserInfo));
    }
    if rest.contains(['/', '?', '#']) {
        return Err(fail(OriginProblem::Path));
    }
    if rest.is_empty() {
        return Err(fail(OriginProblem::MissingHost));
    }
    let (host, port) = if let Some(bracketed) = rest.strip_prefix('[') {
        let (literal, tail) = bracketed
            .split_once(']')
            .ok_or_else(|| fail(OriginProblem::BadIpv6))?;
        let ip: Ipv6Addr = literal.parse().map_err(|_| fail(OriginProblem::BadIpv6))?;
        let port = match tail {
            "" => None,
            tail => Some(
                tail.strip_prefix(':')
                    .ok_or_else(|| fail(OriginProblem::BadPort(tail.to_owned())))?,
            ),
        };
        (AllowedHost::Ip(IpAddr::V6(ip)), port)
    } else {
        let (host, port) = match rest.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        };
        if host.contains(':') {
            return Err(fail(OriginProblem::BadIpv6));
        }
        (parse_host(host).map_err(fail)?, port)
    };
    let port = match port {
        None => scheme.default_port(),
        Some(text) => parse_port(text).ok_or_else(|| fail(OriginProblem::BadPort(text.into())))?,
    };
    Ok(AllowedOrigin { scheme, host, port })
}

fn parse_port(text: &str) -> Option<u16> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u16>().ok().filter(|p| *p != 0)
}

fn parse_host(host: &str) -> Result<AllowedHost, OriginProblem> {
    if host.is_empty() {
        return Err(OriginProblem::MissingHost);
    }
    if host.contains('*') {
        let suffix = host.strip_prefix("*.").ok_or(OriginProblem::BadWildcard)?;
        if suffix.contains('*') || !suffix.contains('.') {
            return Err(OriginProblem::BadWildcard);
        }
        return dns_name(suffix).map(AllowedHost::Subdomains);
    }
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return Ok(AllowedHost::Ip(IpAddr::V4(ip)));
    }
    dns_name(host).map(AllowedHost::Name)
}

/// A DNS name in lower case: labels of letters, digits and inner hyphens, 63 bytes at most,
/// 253 in all, and a last label that is not a number.
fn dns_name(name: &str) -> Result<String, OriginProblem> {
    let bad = || OriginProblem::BadHost(name.to_owned());
    if name.len() > 253 {
        return Err(bad());
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(bad());
        }
    }
    if name
        .rsplit('.')
        .next()
        .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(OriginProblem::NumericHost(name.to_owned()));
    }
    Ok(name.to_ascii_lowercase())
}

/// Whether an address may be reached without being listed: the public unicast internet.
///
/// Written by hand because `IpAddr::is_global` is still unstable and no maintained crate
/// offers the check with IPv4-mapped and embedded addresses handled the same way.
fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0 // "this network"
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT), RFC 6598
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (18..20).contains(&b)) // benchmarking, RFC 2544
        || a >= 240) // reserved
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    let s = ip.segments();
    // NAT64 (64:ff9b::/96) and 6to4 (2002::/16) carry an IPv4 address a gateway will reach.
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        return is_public_v4(Ipv4Addr::new(
            (s[6] >> 8) as u8,
            s[6] as u8,
            (s[7] >> 8) as u8,
            s[7] as u8,
        ));
    }
    if s[0] == 0x2002 {
        return is_public_v4(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || s[0..6] == [0, 0, 0, 0, 0, 0] // IPv4-compatible (deprecated) and the rest of ::/96
        || (s[0] & 0xfe00) == 0xfc00 // unique local, fc00::/7
        || (s[0] & 0xffc0) == 0xfe80 // link-local, fe80::/10
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated), fec0::/10
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation, 2001:db8::/32
        || (s[0] == 0x2001 && s[1] == 0) // Teredo, 2001::/32
        || s[0] == 0x0100 && s[1..4] == [0, 0, 0]) // discard-only, 100::/64
}

/// Why a grant was refused; the manifest shows it at `allowed_outbound_hosts` or the key it
/// names.
#[derive(Debug, thiserror::Error)]
pub enum HttpGrantError {
    /// One entry of the allow-list is malformed.
    #[error(transparent)]
    Origin(#[from] OriginError),
    /// The allow-list is empty: a grant with nothing in it would refuse every request.
    #[error(
        "allowed_outbound_hosts is empty: list at least one scheme://host[:port], or leave the key out"
    )]
    NoHosts,
    /// A limit that would make every request fail.
    #[error("{key} must be greater than zero")]
    ZeroLimit {
        /// The manifest key.
        key: &'static str,
    },
    /// The concurrency cap is above what a semaphore can count.
    #[error("http_max_concurrent {0} is too large (at most {max})", max = Semaphore::MAX_PERMITS)]
    TooManyConcurrent(usize),
    /// The CA file cannot be read or holds no usable certificate.
    #[error("http_ca_file {path}: {problem}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        problem: String,
    },
    /// An https entry is listed but there is nothing to verify servers against.
    #[error(
        "no system root certificates found and no http_ca_file given: https servers cannot be verified"
    )]
    NoRoots,
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Tls(String),
}

impl From<HttpGrantError> for String {
    fn from(e: HttpGrantError) -> String {
        e.to_string()
    }
}

/// Counters of one grant's requests, for the pipeline's metrics: they tell an operator
/// whether a plugin is being refused, throttled or failing, without reading logs.
#[derive(Debug, Default)]
pub struct HttpStats {
    sent: AtomicU64,
    refused_by_list: AtomicU64,
    refused_by_address: AtomicU64,
    failed: AtomicU64,
    timed_out: AtomicU64,
    too_large: AtomicU64,
    in_flight: AtomicU64,
    waiting: AtomicU64,
}

/// A copy of [`HttpStats`] at one moment, plain numbers for export.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HttpCounts {
    /// Requests that left the host (a connection was attempted).
    pub sent: u64,
    /// Requests refused because their origin is not in `allowed_outbound_hosts`.
    pub refused_by_list: u64,
    /// Requests refused because the name resolved only to addresses not permitted.
    pub refused_by_address: u64,
    /// Requests (or response bodies) that failed otherwise: DNS, connect, TLS, protocol.
    pub failed: u64,
    /// Requests (or response bodies) that ran out of `request_timeout`.
    pub timed_out: u64,
    /// Responses refused or cut at `max_response_bytes`, or refused for a head over 64 KiB.
    pub too_large: u64,
    /// Requests holding a permit now (gauge).
    pub in_flight: u64,
    /// Requests waiting for a permit now (gauge).
    pub waiting: u64,
}

impl HttpStats {
    /// Reads every counter (each atomically, not all at one instant).
    pub fn snapshot(&self) -> HttpCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        HttpCounts {
            sent: get(&self.sent),
            refused_by_list: get(&self.refused_by_list),
            refused_by_address: get(&self.refused_by_address),
            failed: get(&self.failed),
            timed_out: get(&self.timed_out),
            too_large: get(&self.too_large),
            in_flight: get(&self.in_flight),
            waiting: get(&self.waiting),
        }
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Holds a gauge up while it lives.
struct Gauge<'a>(&'a AtomicU64);

impl<'a> Gauge<'a> {
    fn enter(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Gauge(gauge)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A checked HTTP grant, shared by every instance of one plugin version: the allow-list,
/// the TLS configuration (built once) and the semaphore that caps requests in flight.
pub struct HttpGrant {
    settings: HttpSettings,
    origins: Vec<AllowedOrigin>,
    permits: Arc<Semaphore>,
    tls: tokio_rustls::TlsConnector,
    stats: HttpStats,
    pipeline: Arc<str>,
}

impl fmt::Debug for HttpGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpGrant")
            .field("pipeline", &self.pipeline)
            .field("origins", &self.origins)
            .field("settings", &self.settings)
            .field("stats", &self.stats.snapshot())
            .finish_non_exhaustive()
    }
}

impl HttpGrant {
    /// Checks `settings` (every allow-list entry, the limits, the CA file) and builds the TLS
    /// configuration, so that a bad grant stops the pipeline at load, not at its first request.
    pub fn new(settings: HttpSettings) -> Result<Arc<Self>, HttpGrantError> {
        Self::named("", settings)
    }

    /// [`HttpGrant::new`] with the name of the pipeline it is for, on its log lines.
    pub fn named(pipeline: &str, settings: HttpSettings) -> Result<Arc<Self>, HttpGrantError> {
        if settings.allowed_outbound_hosts.is_empty() {
            return Err(HttpGrantError::NoHosts);
        }
        let origins = settings
            .allowed_outbound_hosts
            .iter()
            .map(|entry| parse_allowed_origin(entry))
            .collect::<Result<Vec<_>, _>>()?;
        if settings.request_timeout.is_zero() {
            return Err(HttpGrantError::ZeroLimit {
                key: "http_timeout_ms",
            });
        }
        if settings.max_response_bytes == 0 {
            return Err(HttpGrantError::ZeroLimit {
                key: "http_max_response_bytes",
            });
        }
        if settings.max_concurrent == 0 {
            return Err(HttpGrantError::ZeroLimit {
                key: "http_max_concurrent",
            });
        }
        if settings.max_concurrent > Semaphore::MAX_PERMITS {
            return Err(HttpGrantError::TooManyConcurrent(settings.max_concurrent));
        }
        let needs_roots = origins.iter().any(|o| o.scheme == OriginScheme::Https);
        let tls = tls_connector(settings.ca_file.as_deref(), needs_roots)?;
        Ok(Arc::new(Self {
            permits: Arc::new(Semaphore::new(settings.max_concurrent)),
            origins,
            settings,
            tls,
            stats: HttpStats::default(),
            pipeline: Arc::from(pipeline),
        }))
    }

    /// The settings it was built from.
    pub fn settings(&self) -> &HttpSettings {
        &self.settings
    }

    /// The checked allow-list.
    pub fn origins(&self) -> &[AllowedOrigin] {
        &self.origins
    }

    /// What its requests did so far, for the pipeline's metrics.
    pub fn stats(&self) -> &HttpStats {
        &self.stats
    }

    /// Whether `ip` is listed as an IP literal for this scheme and port (which lifts the
    /// address check for it).
    fn ip_listed(&self, scheme: OriginScheme, ip: IpAddr, port: u16) -> bool {
        let ip = ip.to_canonical();
        self.origins.iter().any(|o| {
            o.scheme == scheme
                && o.port == port
                && matches!(o.host, AllowedHost::Ip(listed) if listed.to_canonical() == ip)
        })
    }

    /// The hook's entry point: the allow-list is checked before anything is awaited, so a
    /// refused request costs no task, no lookup and no connection.
    fn send(
        self: Arc<Self>,
        request: http::Request<WasiBody>,
        refusals: Arc<Refusals>,
        meter: Option<Arc<CpuMeter>>,
    ) -> Box<SendFuture> {
        let target = match Target::of(request.uri()) {
            Ok(target) => target,
            Err(e) => return Box::new(async move { Err(e) }),
        };
        if !self.origins.iter().any(|o| o.permits(&target)) {
            bump(&self.stats.refused_by_list);
            refusals.note(
                &target.to_string(),
                "outbound HTTP request refused: origin not in allowed_outbound_hosts",
            );
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        Box::new(async move { self.exchange(target, request, &refusals, meter).await })
    }

    /// One request, under one deadline, holding one permit.
    async fn exchange(
        self: Arc<Self>,
        target: Target,
        mut request: http::Request<WasiBody>,
        refusals: &Refusals,
        meter: Option<Arc<CpuMeter>>,
    ) -> Result<(http::Response<WasiBody>, Box<IoFuture>), HttpError> {
        // A permit is waited for within one timeout; the exchange's own timeout starts when
        // the request leaves, so requests queued behind the concurrency cap (a plugin's
        // `send_all` of thousands) are not timed out for the others' turns.
        let queued_until = Instant::now() + self.settings.request_timeout;
        let permit = {
            let _waiting = Gauge::enter(&self.stats.waiting);
            match timeout_at(queued_until, self.permits.clone().acquire_owned()).await {
                Ok(Ok(permit)) => permit,
                // The semaphore is never closed.
                Ok(Err(_)) => return Err(HttpError::InternalError(Some("permits closed".into()))),
                Err(_) => {
                    return Err(self.timed_out(
                        &target,
                        "waiting for a permit",
                        HttpError::ConnectionTimeout,
                    ));
                }
            }
        };
        let deadline = Instant::now() + self.settings.request_timeout;
        let flight = Arc::new(Flight {
            permit: std::sync::Mutex::new(Some(permit)),
            grant: self.clone(),
        });
        Flight::end_at(&flight, deadline, &target);
        bump(&self.stats.in_flight);

        let addrs = match timeout_at(deadline, self.resolve(&target, refusals)).await {
            Ok(result) => result?,
            Err(_) => {
                return Err(self.timed_out(&target, "resolving", HttpError::DnsTimeout));
            }
        };
        bump(&self.stats.sent);
        let io = match timeout_at(deadline, self.connect(&target, &addrs)).await {
            Ok(result) => result.map_err(|e| self.failed(&target, e))?,
            Err(_) => {
                return Err(self.timed_out(&target, "connecting", HttpError::ConnectionTimeout));
            }
        };
        let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
            .max_buf_size(MAX_READ_BUFFER)
            .handshake::<_, WasiBody>(TokioIo::new(io))
            .await
            .map_err(|e| self.failed(&target, HttpError::Hyper(e)))?;

        // The request line carries the path only (the origin is in the Host header, which
        // wasmtime-wasi-http sets from the authority).
        let path = request
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        *request.uri_mut() = http::Uri::builder()
            .path_and_query(path)
            .build()
            .map_err(|_| HttpError::HttpRequestUriInvalid)?;
        let is_head = request.method() == http::Method::HEAD;

        let mut conn = Box::pin(conn);
        let mut conn_done = false;
        let head = timeout_at(deadline, async {
            let send = sender.send_request(request);
            tokio::pin!(send);
            loop {
                tokio::select! {
                    biased;
                    res = &mut send => break res.map_err(HttpError::Hyper),
                    res = &mut conn, if !conn_done => {
                        conn_done = true;
                        if let Err(e) = res {
                            break Err(HttpError::Hyper(e));
                        }
                    }
                }
            }
        })
        .await;
        // Without a sender, the connection closes once the response body is done.
        drop(sender);
        let response = match head {
            // hyper stops reading a head at its buffer size: a server's headers may not make
            // the host buffer more for a plugin, and both sides are told why.
            Ok(Err(HttpError::Hyper(e))) if e.is_parse_too_large() => {
                bump(&self.stats.too_large);
                refusals.note(
                    &target.to_string(),
                    "outbound HTTP response refused: its head (status line and headers) is over 64 KiB",
                );
                return Err(HttpError::HttpResponseHeaderSectionSize(Some(
                    MAX_READ_BUFFER as u32,
                )));
            }
            Ok(result) => result.map_err(|e| self.failed(&target, e))?,
            Err(_) => {
                return Err(self.timed_out(
                    &target,
                    "waiting for the response head",
                    HttpError::HttpResponseTimeout,
                ));
            }
        };

        let (parts, incoming) = response.into_parts();
        let cap = self.settings.max_response_bytes;
        if let Some(length) = content_length(&parts.headers).filter(|_| !is_head)
            && length > cap
        {
            bump(&self.stats.too_large);
            tracing::warn!(
                pipeline = &*self.pipeline,
                origin = %target,
                content_length = length,
                max_response_bytes = cap,
                "outbound HTTP response refused: Content-Length over http_max_response_bytes"
            );
            return Err(HttpError::HttpResponseBodySize(Some(length)));
        }
        let body = CappedBody {
            inner: Some(incoming),
            cap,
            received: 0,
            deadline: Box::pin(tokio::time::sleep_until(deadline)),
            flight: Some(flight.clone()),
            origin: target.to_string(),
        };
        let io: Box<IoFuture> = Box::new(async move {
            let _flight = flight;
            if conn_done {
                return Ok(());
            }
            match timeout_at(deadline, conn).await {
                Ok(result) => result.map_err(HttpError::Hyper),
                Err(_) => Err(HttpError::HttpResponseTimeout),
            }
        });
        // The connection is driven on a task of its own (reading the response, decrypting
        // TLS): its work is the call's too.
        let io: Box<IoFuture> = match meter {
            Some(meter) => Box::new(Charged::new(Box::into_pin(io), meter)),
            None => io,
        };
        Ok((http::Response::from_parts(parts, body.boxed_unsync()), io))
    }

    /// The addresses a request may go to: an IP literal (already matched exactly by the
    /// list) as it is, a name through the host's resolver with every address not permitted
    /// dropped. A name left with no address is refused.
    async fn resolve(
        &self,
        target: &Target,
        refusals: &Refusals,
    ) -> Result<Vec<SocketAddr>, HttpError> {
        let name = match &target.host {
            TargetHost::Ip(ip) => return Ok(vec![SocketAddr::new(*ip, target.port)]),
            TargetHost::Name(name) => name,
        };
        let resolved: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), target.port))
            .await
            .map_err(|e| {
                self.failed(
                    target,
                    HttpError::DnsError {
                        rcode: Some(e.to_string()),
                        info_code: None,
                    },
                )
            })?
            .collect();
        if resolved.is_empty() {
            return Err(self.failed(target, HttpError::DestinationNotFound));
        }
        let (permitted, refused): (Vec<SocketAddr>, Vec<SocketAddr>) =
            resolved.into_iter().partition(|addr| {
                is_public(addr.ip()) || self.ip_listed(target.scheme, addr.ip(), target.port)
            });
        if permitted.is_empty() {
            bump(&self.stats.refused_by_address);
            let refused: Vec<String> = refused.iter().map(|a| a.ip().to_string()).collect();
            refusals.note(
                &format!("{target} ({})", refused.join(",")),
                "outbound HTTP request refused: the name resolves only to non-public addresses \
                 that allowed_outbound_hosts does not list as IP literals",
            );
            return Err(HttpError::DestinationIpProhibited);
        }
        if !refused.is_empty() {
            tracing::debug!(
                pipeline = &*self.pipeline,
                origin = %target,
                dropped = refused.len(),
                "non-public addresses of an allowed name were skipped"
            );
        }
        Ok(permitted)
    }

    /// Connects to the first checked address that answers (never resolving again), then TLS.
    async fn connect(
        &self,
        target: &Target,
        addrs: &[SocketAddr],
    ) -> Result<Box<dyn Io>, HttpError> {
        let mut last = None;
        let mut tcp = None;
        for addr in addrs {
            match TcpStream::connect(addr).await {
                Ok(stream) => {
                    tcp = Some(stream);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let tcp = match (tcp, last) {
            (Some(tcp), _) => tcp,
            (None, Some(e)) => return Err(connect_error(&e)),
            (None, None) => return Err(HttpError::DestinationNotFound),
        };
        // Small requests and responses: no reason to wait for Nagle.
        let _ = tcp.set_nodelay(true);
        if target.scheme == OriginScheme::Http {
            return Ok(Box::new(tcp));
        }
        let server_name = match &target.host {
            TargetHost::Ip(ip) => ServerName::IpAddress((*ip).into()),
            TargetHost::Name(name) => {
                ServerName::try_from(name.clone()).map_err(|_| HttpError::HttpRequestUriInvalid)?
            }
        };
        let tls = self
            .tls
            .connect(server_name, tcp)
            .await
            .map_err(|e| tls_error(&e))?;
        Ok(Box::new(tls))
    }

    fn failed(&self, target: &Target, e: HttpError) -> HttpError {
        bump(&self.stats.failed);
        tracing::debug!(pipeline = &*self.pipeline, origin = %target, error = %e, "outbound HTTP request failed");
        e
    }

    fn timed_out(&self, target: &Target, phase: &'static str, code: HttpError) -> HttpError {
        bump(&self.stats.timed_out);
        tracing::debug!(
            pipeline = &*self.pipeline,
            origin = %target,
            phase,
            "outbound HTTP request timed out (http_timeout_ms)"
        );
        code
    }
}

type SendFuture =
    dyn Future<Output = Result<(http::Response<WasiBody>, Box<IoFuture>), HttpError>> + Send;
type IoFuture = dyn Future<Output = Result<(), HttpError>> + Send;

/// A connected stream, plain or TLS.
trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// The permit of one request and its in-flight gauge, shared by the response body and the
/// connection task: released when both are done.
///
/// Also ended at the request's deadline by a timer, whatever the guest does: a plugin that
/// starts requests and never reads (or drops) their responses, keeping them in a static of a
/// reused instance, would otherwise hold every permit of the pipeline across batches.
struct Flight {
    permit: std::sync::Mutex<Option<OwnedSemaphorePermit>>,
    grant: Arc<HttpGrant>,
}

impl Flight {
    /// Gives the permit back (once); returns whether this call did.
    fn end(&self) -> bool {
        let permit = self.permit.lock().unwrap_or_else(|e| e.into_inner()).take();
        if permit.is_some() {
            self.grant.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
        permit.is_some()
    }

    /// Ends the flight at `deadline` if it is still under way then.
    fn end_at(flight: &Arc<Flight>, deadline: Instant, target: &Target) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak = Arc::downgrade(flight);
        let origin = target.to_string();
        runtime.spawn(async move {
            tokio::time::sleep_until(deadline).await;
            if let Some(flight) = weak.upgrade()
                && flight.end()
            {
                tracing::debug!(
                    pipeline = &*flight.grant.pipeline,
                    origin = %origin,
                    "outbound HTTP request still held at its deadline: its permit is given back"
                );
            }
        });
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        self.end();
    }
}

/// Where a request goes, read from its URI.
struct Target {
    scheme: OriginScheme,
    host: TargetHost,
    port: u16,
}

enum TargetHost {
    Name(String),
    Ip(IpAddr),
}

impl Target {
    fn of(uri: &http::Uri) -> Result<Self, HttpError> {
        let scheme = match uri.scheme() {
            Some(s) if *s == Scheme::HTTPS => OriginScheme::Https,
            Some(s) if *s == Scheme::HTTP => OriginScheme::Http,
            _ => return Err(HttpError::HttpProtocolError),
        };
        let host = uri.host().ok_or(HttpError::HttpRequestUriInvalid)?;
        let host = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            TargetHost::Ip(IpAddr::V6(
                v6.parse().map_err(|_| HttpError::HttpRequestUriInvalid)?,
            ))
        } else if let Ok(v4) = host.parse::<Ipv4Addr>() {
            TargetHost::Ip(IpAddr::V4(v4))
        } else if host.is_empty() {
            return Err(HttpError::HttpRequestUriInvalid);
        } else {
            TargetHost::Name(host.to_ascii_lowercase())
        };
        let port = uri.port_u16().unwrap_or(scheme.default_port());
        Ok(Target { scheme, host, port })
    }
}

/// `scheme://host:port`, what logs show of a request (never its path or query, which may
/// carry tokens).
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            TargetHost::Name(name) => write!(f, "{}://{name}:{}", self.scheme, self.port),
            TargetHost::Ip(IpAddr::V4(ip)) => write!(f, "{}://{ip}:{}", self.scheme, self.port),
            TargetHost::Ip(IpAddr::V6(ip)) => write!(f, "{}://[{ip}]:{}", self.scheme, self.port),
        }
    }
}

fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    let value = headers.get(http::header::CONTENT_LENGTH)?.to_str().ok()?;
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

fn connect_error(e: &std::io::Error) -> HttpError {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => HttpError::ConnectionRefused,
        std::io::ErrorKind::TimedOut => HttpError::ConnectionTimeout,
        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted => {
            HttpError::ConnectionTerminated
        }
        _ => HttpError::DestinationUnavailable,
    }
}

/// The guest learns whether the certificate, an alert or the protocol failed; the details
/// stay in the host's debug log.
fn tls_error(e: &std::io::Error) -> HttpError {
    tracing::debug!(error = %e, "outbound HTTP TLS handshake failed");
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(_)) => HttpError::TlsCertificateError,
        Some(rustls::Error::AlertReceived(alert)) => HttpError::TlsAlertReceived {
            alert_id: Some(u8::from(*alert)),
            alert_message: Some(format!("{alert:?}")),
        },
        Some(_) => HttpError::TlsProtocolError,
        None => connect_error(e),
    }
}

/// The grant's rustls client: the system roots plus the CA file, HTTP/1.1 by ALPN.
fn tls_connector(
    ca_file: Option<&std::path::Path>,
    needs_roots: bool,
) -> Result<tokio_rustls::TlsConnector, HttpGrantError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        // A system bundle may hold certificates rustls cannot use; the rest still count.
        let _ = roots.add(cert);
    }
    if let Some(path) = ca_file {
        let ca_error = |problem: String| HttpGrantError::CaFile {
            path: path.to_owned(),
            problem,
        };
        let certs = rustls_pki_types::CertificateDer::pem_file_iter(path)
            .map_err(|e| ca_error(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ca_error(e.to_string()))?;
        if certs.is_empty() {
            return Err(ca_error("no PEM certificate in it".into()));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| ca_error(format!("unusable certificate: {e}")))?;
        }
    }
    if needs_roots && roots.is_empty() {
        return Err(HttpGrantError::NoRoots);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| HttpGrantError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// A response body that fails past the size cap or the request's deadline, and releases the
/// request's permit as soon as it ends.
struct CappedBody {
    inner: Option<hyper::body::Incoming>,
    cap: u64,
    received: u64,
    deadline: Pin<Box<Sleep>>,
    flight: Option<Arc<Flight>>,
    origin: String,
}

impl CappedBody {
    fn end(&mut self, counter: Option<fn(&HttpStats) -> &AtomicU64>) {
        if let (Some(counter), Some(flight)) = (counter, &self.flight) {
            bump(counter(&flight.grant.stats));
        }
        self.inner = None;
        self.flight = None;
    }

    fn pipeline(&self) -> Arc<str> {
        self.flight
            .as_ref()
            .map(|f| f.grant.pipeline.clone())
            .unwrap_or_else(|| Arc::from(""))
    }
}

impl Body for CappedBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received = this.received.saturating_add(data.len() as u64);
                    if this.received > this.cap {
                        tracing::warn!(
                            pipeline = &*this.pipeline(),
                            origin = %this.origin,
                            max_response_bytes = this.cap,
                            "outbound HTTP response cut: body over http_max_response_bytes"
                        );
                        let received = this.received;
                        this.end(Some(|s| &s.too_large));
                        return Poll::Ready(Some(Err(HttpError::HttpResponseBodySize(Some(
                            received,
                        )))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.end(Some(|s| &s.failed));
                Poll::Ready(Some(Err(HttpError::Hyper(e))))
            }
            Poll::Ready(None) => {
                this.end(None);
                Poll::Ready(None)
            }
            Poll::Pending => {
                if this.deadline.as_mut().poll(cx).is_ready() {
                    tracing::debug!(
                        pipeline = &*this.pipeline(),
                        origin = %this.origin,
                        "outbound HTTP response body timed out (http_timeout_ms)"
                    );
                    this.end(Some(|s| &s.timed_out));
                    return Poll::Ready(Some(Err(HttpError::ConnectionReadTimeout)));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map(Body::size_hint)
            .unwrap_or_else(|| SizeHint::with_exact(0))
    }
}

/// Refused requests logged per call; the rest are counted and said in one line when the call
/// ends. A plugin asking for thousands of refused hosts a batch would otherwise write a line
/// for each, outside its log budget.
pub(crate) const MAX_REFUSALS_LOGGED_PER_CALL: u64 = 8;

/// Longest origin text a refusal line shows: a plugin chooses the name (60 KB names made
/// 120 MB of log in 15 s).
const MAX_LOGGED_ORIGIN: usize = 256;

/// The refusals of one instance's calls: logged with the plugin's name, within a per-call
/// budget, with the plugin's secrets redacted (the origin is lower-cased, so ignoring case)
/// and the origin cut.
pub(crate) struct Refusals {
    plugin: Arc<str>,
    pipeline: Option<Arc<str>>,
    secrets: Arc<Secrets>,
    logged: AtomicU64,
    dropped: AtomicU64,
}

impl Refusals {
    fn note(&self, origin: &str, what: &'static str) {
        if self.logged.fetch_add(1, Ordering::Relaxed) >= MAX_REFUSALS_LOGGED_PER_CALL {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut origin = self.secrets.redact_ignoring_case(origin);
        if origin.len() > MAX_LOGGED_ORIGIN {
            let mut cut = MAX_LOGGED_ORIGIN;
            while !origin.is_char_boundary(cut) {
                cut -= 1;
            }
            origin.truncate(cut);
            origin.push_str("…[truncated]");
        }
        tracing::warn!(plugin = &*self.plugin, pipeline = self.pipeline.as_deref(), origin = %origin, "{what}");
    }

    /// Starts a call's budget; returns how many refusals the last call did not log.
    pub(crate) fn reset(&self) -> u64 {
        self.logged.store(0, Ordering::Relaxed);
        self.dropped.swap(0, Ordering::Relaxed)
    }

    /// How many refusals of the current call were not logged.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Per-store HTTP state: wasmtime-wasi-http's context and the hook that holds the grant.
pub(crate) struct HttpState {
    ctx: WasiHttpCtx,
    hooks: Hooks,
}

impl HttpState {
    /// `grant: None` refuses every request in the host. Refusals are logged as `plugin`'s,
    /// with `secrets` redacted.
    pub(crate) fn new(
        grant: Option<Arc<HttpGrant>>,
        plugin: Arc<str>,
        pipeline: Option<Arc<str>>,
        secrets: Arc<Secrets>,
    ) -> Self {
        let mut ctx = WasiHttpCtx::new();
        ctx.set_field_size_limit(super::host::MAX_FIELDS_BYTES);
        Self {
            ctx,
            hooks: Hooks {
                grant,
                meter: None,
                refusals: Arc::new(Refusals {
                    plugin,
                    pipeline,
                    secrets,
                    logged: AtomicU64::new(0),
                    dropped: AtomicU64::new(0),
                }),
            },
        }
    }

    /// The refusal log of this store.
    pub(crate) fn refusals(&self) -> &Refusals {
        &self.hooks.refusals
    }

    /// Charges the host work of requests started from now on (the exchange, its connection,
    /// its body) to `meter`, the current call's: it counts against the call's CPU deadline.
    pub(crate) fn charge_to(&mut self, meter: Arc<CpuMeter>) {
        self.hooks.meter = Some(meter);
    }
}

struct Hooks {
    grant: Option<Arc<HttpGrant>>,
    refusals: Arc<Refusals>,
    meter: Option<Arc<CpuMeter>>,
}

impl WasiHttpHooks for Hooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        _options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<SendFuture> {
        match &self.grant {
            Some(grant) => {
                let send = grant
                    .clone()
                    .send(request, self.refusals.clone(), self.meter.clone());
                match self.meter.clone() {
                    Some(meter) => Box::new(Charged::new(Box::into_pin(send), meter)),
                    None => send,
                }
            }
            None => {
                let origin = Target::of(request.uri()).map(|t| t.to_string());
                self.refusals.note(
                    origin.as_deref().unwrap_or("(invalid)"),
                    "outbound HTTP request refused: the pipeline grants no host \
                     (allowed_outbound_hosts)",
                );
                Box::new(async { Err(HttpError::HttpRequestDenied) })
            }
        }
    }

    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        OUTGOING_BODY_CHUNK_SIZE
    }

    // hyper errors reach here only from a response body read by the guest (the exchange maps
    // its own); the default hook logs each one at warn.
    fn p2_error_from_hyper(&mut self, err: &hyper::Error) -> ErrorCode {
        tracing::debug!(error = %err, "outbound HTTP protocol error");
        if err.is_timeout() {
            ErrorCode::HttpResponseTimeout
        } else if err.is_incomplete_message() {
            ErrorCode::HttpResponseIncomplete
        } else if err.is_closed() || err.is_canceled() {
            ErrorCode::ConnectionTerminated
        } else {
            ErrorCode::HttpProtocolError
        }
    }
}

impl WasiHttpView for StoreState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http.ctx,
            table: &mut self.table,
            hooks: &mut self.http.hooks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(entry: &str) -> AllowedOrigin {
        parse_allowed_origin(entry).unwrap_or_else(|e| panic!("{entry}: {e}"))
    }

    fn problem(entry: &str) -> OriginProblem {
        match parse_allowed_origin(entry) {
            Ok(o) => panic!("{entry} was accepted as {o:?}"),
            Err(e) => {
                assert_eq!(e.entry, entry);
                assert!(e.to_string().contains(entry), "{e}");
                e.problem
            }
        }
    }

    fn target(url: &str) -> Target {
        Target::of(&url.parse().expect("uri")).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    fn permits(entry: &str, url: &str) -> bool {
        origin(entry).permits(&target(url))
    }

    #[test]
    fn allow_list_entries_take_scheme_host_and_default_or_given_port() {
        assert_eq!(
            origin("https://API.Example.com"),
            AllowedOrigin {
                scheme: OriginScheme::Https,
                host: AllowedHost::Name("api.example.com".into()),
                port: 443
            }
        );
        assert_eq!(origin("http://example.com").port, 80);
        assert_eq!(origin("http://example.com/").port, 80);
        assert_eq!(origin("HTTP://example.com:8080").port, 8080);
        assert_eq!(
            origin("http://127.0.0.1:8080").host,
            AllowedHost::Ip("127.0.0.1".parse().expect("ip"))
        );
        assert_eq!(
            origin("https://[::1]:8443"),
            AllowedOrigin {
                scheme: OriginScheme::Https,
                host: AllowedHost::Ip("::1".parse().expect("ip")),
                port: 8443
            }
        );
        assert_eq!(
            origin("https://*.example.com").host,
            AllowedHost::Subdomains("example.com".into())
        );
        assert_eq!(
            origin("https://*.example.com:8443").to_string(),
            "https://*.example.com:8443"
        );
    }

    #[test]
    fn malformed_allow_list_entries_are_refused_naming_the_entry_and_the_rule() {
        assert_eq!(problem("example.com"), OriginProblem::MissingScheme);
        assert_eq!(
            problem("ftp://example.com"),
            OriginProblem::UnsupportedScheme("ftp".into())
        );
        assert_eq!(
            problem("https://user:pw@example.com"),
            OriginProblem::UserInfo
        );
        assert_eq!(problem("https://example.com/api"), OriginProblem::Path);
        assert_eq!(problem("https://example.com?x=1"), OriginProblem::Path);
        assert_eq!(problem("https://"), OriginProblem::MissingHost);
        assert_eq!(problem("https://:443"), OriginProblem::MissingHost);
        assert_eq!(
            problem("https://example.com:0"),
            OriginProblem::BadPort("0".into())
        );
        assert_eq!(
            problem("https://example.com:65536"),
            OriginProblem::BadPort("65536".into())
        );
        assert_eq!(
            problem("https://example.com:+80"),
            OriginProblem::BadPort("+80".into())
        );
        assert_eq!(problem("http://::1"), OriginProblem::BadIpv6);
        assert_eq!(problem("http://[::1"), OriginProblem::BadIpv6);
        assert_eq!(problem("http://[nope]"), OriginProblem::BadIpv6);
        assert_eq!(problem("https://*"), OriginProblem::BadWildcard);
        assert_eq!(problem("https://*.com"), OriginProblem::BadWildcard);
        assert_eq!(
            problem("https://a.*.example.com"),
            OriginProblem::BadWildcard
        );
        assert_eq!(
            problem("https://api*.example.com"),
            OriginProblem::BadWildcard
        );
        assert_eq!(
            problem("https://*.*.example.com"),
            OriginProblem::BadWildcard
        );
        assert_eq!(
            problem("https://exa_mple.com"),
            OriginProblem::BadHost("exa_mple.com".into())
        );
        assert_eq!(
            problem("https://-a.example.com"),
            OriginProblem::BadHost("-a.example.com".into())
        );
        assert_eq!(
            problem("https://a..example.com"),
            OriginProblem::BadHost("a..example.com".into())
        );
        assert_eq!(
            problem("http://127.1"),
            OriginProblem::NumericHost("127.1".into())
        );
    }

    #[test]
    fn entries_match_scheme_host_and_port_exactly() {
        assert!(permits(
            "https://api.example.com",
            "https://api.example.com/x?y=1"
        ));
        assert!(permits(
            "https://api.example.com",
            "https://API.example.COM:443/"
        ));
        assert!(!permits(
            "https://api.example.com",
            "http://api.example.com/"
        ));
        assert!(!permits(
            "https://api.example.com",
            "https://api.example.com:8443/"
        ));
        assert!(!permits("https://api.example.com", "https://example.com/"));
        assert!(!permits(
            "https://api.example.com",
            "https://api.example.com.evil.org/"
        ));
        assert!(permits("http://127.0.0.1:8080", "http://127.0.0.1:8080/"));
        assert!(!permits("http://127.0.0.1:8080", "http://127.0.0.1:8081/"));
        assert!(!permits("http://127.0.0.1:8080", "http://localhost:8080/"));
        assert!(!permits("http://localhost:8080", "http://127.0.0.1:8080/"));
        assert!(permits("http://[::1]:8080", "http://[::1]:8080/"));
    }

    #[test]
    fn a_subdomain_wildcard_matches_subdomains_at_any_depth_but_not_the_domain() {
        assert!(permits("https://*.example.com", "https://a.example.com/"));
        assert!(permits("https://*.example.com", "https://a.b.example.com/"));
        assert!(!permits("https://*.example.com", "https://example.com/"));
        assert!(!permits("https://*.example.com", "https://aexample.com/"));
        assert!(!permits(
            "https://*.example.com",
            "https://a.example.com.evil.org/"
        ));
        assert!(!permits("https://*.example.com", "http://a.example.com/"));
        assert!(!permits("https://*.example.com", "https://1.2.3.4/"));
    }

    #[test]
    fn only_public_unicast_addresses_pass_the_address_check_unlisted() {
        for public in [
            "93.184.216.34",
            "8.8.8.8",
            "2606:4700::1111",
            "64:ff9b::808:808",
        ] {
            assert!(is_public(public.parse().expect("ip")), "{public}");
        }
        for private in [
            "127.0.0.1",
            "127.8.9.10",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "192.0.2.1",
            "198.51.100.1",
            "203.0.113.1",
            "198.18.0.1",
            "224.0.0.1",
            "240.0.0.1",
            "::",
            "::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a00:1",
            "2002:a00:1::1",
            "2001::1",
        ] {
            assert!(!is_public(private.parse().expect("ip")), "{private}");
        }
    }

    fn settings(hosts: &[&str]) -> HttpSettings {
        HttpSettings {
            allowed_outbound_hosts: hosts.iter().map(|h| h.to_string()).collect(),
            request_timeout: Duration::from_secs(5),
            max_response_bytes: 1 << 20,
            max_concurrent: 4,
            ca_file: None,
        }
    }

    #[test]
    fn a_listed_ip_literal_lifts_the_address_check_for_its_scheme_and_port_only() {
        let grant = HttpGrant::new(settings(&[
            "http://localhost:8080",
            "http://127.0.0.1:8080",
        ]))
        .expect("grant");
        let lo: IpAddr = "127.0.0.1".parse().expect("ip");
        assert!(grant.ip_listed(OriginScheme::Http, lo, 8080));
        assert!(grant.ip_listed(
            OriginScheme::Http,
            "::ffff:127.0.0.1".parse().expect("ip"),
            8080
        ));
        assert!(!grant.ip_listed(OriginScheme::Http, lo, 8081));
        assert!(!grant.ip_listed(OriginScheme::Https, lo, 8080));
        assert!(!grant.ip_listed(OriginScheme::Http, "::1".parse().expect("ip"), 8080));
    }

    #[test]
    fn a_grant_refuses_bad_entries_limits_and_ca_files_by_name() {
        let err = HttpGrant::new(settings(&["https://ok.example.com", "https://x.com/path"]))
            .expect_err("bad entry");
        assert!(err.to_string().contains("\"https://x.com/path\""), "{err}");
        assert!(matches!(
            HttpGrant::new(settings(&[])),
            Err(HttpGrantError::NoHosts)
        ));
        let mut zero = settings(&["https://a.example.com"]);
        zero.max_concurrent = 0;
        let err = HttpGrant::new(zero).expect_err("zero");
        assert!(err.to_string().contains("http_max_concurrent"), "{err}");
        let mut zero = settings(&["https://a.example.com"]);
        zero.request_timeout = Duration::ZERO;
        assert!(HttpGrant::new(zero).is_err());

        let dir = std::env::temp_dir().join(format!("sharehost-http-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let missing = dir.join("missing.pem");
        let mut with_ca = settings(&["https://a.example.com"]);
        with_ca.ca_file = Some(missing.clone());
        let err = HttpGrant::new(with_ca.clone()).expect_err("missing CA");
        assert!(
            err.to_string().contains(&*missing.to_string_lossy()),
            "{err}"
        );
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        with_ca.ca_file = Some(empty.clone());
        let err = HttpGrant::new(with_ca).expect_err("no certificate");
        assert!(err.to_string().contains(&*empty.to_string_lossy()), "{err}");
        assert!(err.to_string().contains("no PEM certificate"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn default_limits_with_a_host_make_a_working_grant() {
        let grant = HttpGrant::new(HttpSettings {
            allowed_outbound_hosts: vec!["http://127.0.0.1:8080".into()],
            ..HttpSettings::default()
        })
        .expect("the defaults are usable limits");
        assert_eq!(grant.settings().max_concurrent, 32);
    }

    fn refusals_of(secrets: &[(&str, &str)]) -> Refusals {
        Refusals {
            plugin: Arc::from("p"),
            pipeline: Some(Arc::from("orders")),
            secrets: Arc::new(Secrets::new(
                secrets
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                    .collect(),
            )),
            logged: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    #[test]
    fn refusals_are_logged_within_a_budget_redacted_and_cut() {
        #[derive(Clone, Default)]
        struct Buf(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let refusals = refusals_of(&[("token", "Sekret-Token-Value")]);
        let long = format!("http://{}.example.com:80", "a".repeat(60_000));
        tracing::subscriber::with_default(subscriber, || {
            refusals.note("http://sekret-token-value.example.com:80", "refused");
            for _ in 0..10_000 {
                refusals.note(&long, "refused");
            }
        });
        let text =
            String::from_utf8_lossy(&buf.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
        assert!(!text.to_ascii_lowercase().contains("sekret"), "{text}");
        assert!(text.contains("[secret token]"), "{text}");
        assert_eq!(
            text.matches("refused").count() as u64,
            MAX_REFUSALS_LOGGED_PER_CALL
        );
        assert!(text.len() < 8 * 1024, "{} bytes of log", text.len());
        assert_eq!(refusals.dropped(), 10_001 - MAX_REFUSALS_LOGGED_PER_CALL);
        assert_eq!(refusals.reset(), 10_001 - MAX_REFUSALS_LOGGED_PER_CALL);
        assert_eq!(refusals.dropped(), 0);
    }

    #[tokio::test]
    async fn an_unlisted_origin_is_refused_before_any_lookup() {
        let grant = HttpGrant::new(settings(&["http://127.0.0.1:9"])).expect("grant");
        let request = http::Request::builder()
            .uri("http://not-listed.invalid/")
            .body(
                http_body_util::Empty::new()
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
            .expect("request");
        let refusals = Arc::new(refusals_of(&[]));
        let result = Pin::from(grant.clone().send(request, refusals.clone(), None)).await;
        assert!(matches!(result, Err(HttpError::HttpRequestDenied)));
        let counts = grant.stats().snapshot();
        assert_eq!(counts.refused_by_list, 1);
        assert_eq!(counts.sent, 0);
        assert_eq!(counts.failed, 0, "no DNS lookup was attempted");
    }
}

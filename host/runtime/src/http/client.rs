//! The client: one request to an origin the allow-list permits, under the grant's limits. The
//! host resolves the name itself and connects only to addresses it checked (never resolving
//! again, so DNS rebinding cannot swap the address in between); hyper's connection-level
//! client follows no redirect; one timeout covers the whole exchange from the moment it has a
//! permit (DNS, connect, TLS, sending, the head, the body); a `Content-Length` over the cap is
//! refused at the head; TLS through rustls (ring) with the grant's roots, HTTP/1.1 only.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::uri::PathAndQuery;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::time::{Instant, timeout_at};
use wasmtime_wasi_http::{Error as HttpError, WasiBody};

use super::allow_list::{AllowList, OriginScheme, Target, TargetHost, is_public};
use super::body::{CappedBody, Flight};
use super::report::{Gauge, HttpStats, Refusals, bump};
use crate::meter::{Charged, CpuMeter};

/// Largest read buffer hyper keeps per connection (its default is about 400 KiB): what one
/// request can hold in the host however large the response.
pub(crate) const MAX_READ_BUFFER: usize = 64 << 10;

/// What the hook hands wasmtime-wasi-http for one request: the response head (its body read
/// as the guest reads it) and the future that drives the connection.
pub(crate) type SendFuture =
    dyn Future<Output = Result<(http::Response<WasiBody>, Box<IoFuture>), HttpError>> + Send;
/// The future that drives one request's connection.
pub(crate) type IoFuture = dyn Future<Output = Result<(), HttpError>> + Send;

/// A connected stream, plain or TLS.
trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// What every request of one grant shares: its limits, the semaphore that caps requests in
/// flight, the TLS configuration (built once) and the counters.
pub(crate) struct Client {
    /// The whole exchange's timeout; waiting for a permit has one as long of its own.
    timeout: Duration,
    max_response_bytes: u64,
    permits: Arc<Semaphore>,
    tls: tokio_rustls::TlsConnector,
    stats: Arc<HttpStats>,
    pipeline: Arc<str>,
}

impl Client {
    /// A client for the requests of `pipeline`, `max_concurrent` at once (at most
    /// [`Semaphore::MAX_PERMITS`], which the grant checks).
    pub(crate) fn new(
        timeout: Duration,
        max_response_bytes: u64,
        max_concurrent: usize,
        tls: tokio_rustls::TlsConnector,
        pipeline: Arc<str>,
    ) -> Self {
        Self {
            timeout,
            max_response_bytes,
            permits: Arc::new(Semaphore::new(max_concurrent)),
            tls,
            stats: Arc::default(),
            pipeline,
        }
    }

    /// What its requests did so far.
    pub(crate) fn stats(&self) -> &HttpStats {
        &self.stats
    }

    /// The pipeline it serves (empty outside one).
    pub(crate) fn pipeline(&self) -> &str {
        &self.pipeline
    }

    /// One request, under one deadline, holding one permit: resolved (only to addresses the
    /// address check or `allow` permits), connected, sent, its head read; the body and the
    /// connection are left to the guest's reads and the returned connection future.
    pub(crate) async fn exchange(
        &self,
        allow: &AllowList,
        target: Target,
        mut request: http::Request<WasiBody>,
        refusals: &Refusals,
        meter: Option<Arc<CpuMeter>>,
    ) -> Result<(http::Response<WasiBody>, Box<IoFuture>), HttpError> {
        // A permit is waited for within one timeout; the exchange's own timeout starts when
        // the request leaves, so requests queued behind the concurrency cap (a plugin's
        // `send_all` of thousands) are not timed out for the others' turns.
        let queued_until = Instant::now() + self.timeout;
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
        let deadline = Instant::now() + self.timeout;
        let flight = Flight::new(permit, self.stats.clone(), self.pipeline.clone());
        Flight::end_at(&flight, deadline, target.to_string());
        bump(&self.stats.in_flight);

        let addrs = match timeout_at(deadline, self.resolve(allow, &target, refusals)).await {
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
        let cap = self.max_response_bytes;
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
        let body = CappedBody::new(incoming, cap, deadline, flight.clone(), target.to_string());
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
        allow: &AllowList,
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
                is_public(addr.ip()) || allow.ip_listed(target.scheme, addr.ip(), target.port)
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

/// The `Content-Length` of a response head, when it is a plain number.
fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    let value = headers.get(http::header::CONTENT_LENGTH)?.to_str().ok()?;
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// The code the guest sees for a connection that failed.
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

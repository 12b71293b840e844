//! Outbound HTTP for plugins, end to end: the `fixture_http_fetch` guest (built by
//! `dev/build-guests`) fetches the URL in each record's value through
//! `wasi:http/outgoing-handler`, and real HTTP servers on 127.0.0.1 count what reaches them.
//!
//! The fixture answers `accept` on 2xx, `retry(1000)` on 429/5xx and `reject(reason)`
//! otherwise, the reason being `status NNN`, the host's `ErrorCode` (`Debug` form) or
//! `body: ...` when reading the body failed, so every test can see what the guest saw.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use futures::StreamExt;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sharehost::runtime::{
    BatchOutcome, FaultKind, HttpGrant, HttpSettings, Plugin, PluginLimits, PluginRuntime, Record,
    RuntimeConfig, Verdict,
};
use sharehost_tests::{guest, plugin_record as record};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// What the 100 MB endpoints would send in all.
const HUGE: u64 = 100 << 20;
/// One chunk of the streamed body, never allocated per chunk.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
/// How long a test may take before it is declared stuck (a failure guard, never a
/// synchronisation: every wait below is on an event).
const STUCK: Duration = Duration::from_secs(60);

/// What a test server saw.
#[derive(Default)]
struct Seen {
    /// Every request that reached it, whatever the path.
    requests: AtomicUsize,
    /// Requests to `/target` (where `/redirect` points).
    redirect_target: AtomicUsize,
    /// Body bytes handed to hyper by the 100 MB endpoints.
    streamed: AtomicU64,
    /// `/hold` requests in the handler now, and the most at once.
    holding: AtomicUsize,
    most_held: AtomicUsize,
    /// Published on every change of `holding`.
    held_tx: watch::Sender<usize>,
    /// `/hold` requests wait until this is true.
    gate: watch::Sender<bool>,
}

struct Server {
    addr: SocketAddr,
    seen: Arc<Seen>,
}

impl Server {
    async fn start() -> Server {
        let seen = Arc::new(Seen::default());
        let app = Self::app(&seen);
        let addr = sharehost_tests::serve_on_loopback(app).await;
        Server { addr, seen }
    }

    /// The same server behind TLS with `certs`' server certificate.
    async fn start_tls(certs: &TestCerts) -> Server {
        let seen = Arc::new(Seen::default());
        let app = Self::app(&seen);
        let chain = CertificateDer::pem_file_iter(&certs.server_cert)
            .expect("server cert")
            .collect::<Result<Vec<_>, _>>()
            .expect("server cert");
        let key = PrivateKeyDer::from_pem_file(&certs.server_key).expect("server key");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocols")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server config");
        let listener = TlsListener {
            tcp: TcpListener::bind("127.0.0.1:0").await.expect("bind"),
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        };
        let addr = listener.tcp.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Server { addr, seen }
    }

    fn app(seen: &Arc<Seen>) -> Router {
        Router::new()
            .route("/ok", get(|| async { "ok" }))
            .route(
                "/status/{code}",
                get(|Path(code): Path<u16>| async move {
                    StatusCode::from_u16(code).unwrap_or(StatusCode::IM_A_TEAPOT)
                }),
            )
            .route("/redirect", get(redirect))
            .route(
                "/target",
                get(|State(seen): State<Arc<Seen>>| async move {
                    seen.redirect_target.fetch_add(1, Ordering::SeqCst);
                    "you should not be here"
                }),
            )
            .route("/huge", get(|State(s): State<Arc<Seen>>| huge(s, false)))
            .route(
                "/huge-declared",
                get(|State(s): State<Arc<Seen>>| huge(s, true)),
            )
            .route("/hold", get(hold))
            .route("/huge-head", get(huge_head))
            .route("/drip", get(drip))
            .layer(axum::middleware::from_fn_with_state(
                seen.clone(),
                |State(seen): State<Arc<Seen>>,
                 request: axum::extract::Request,
                 next: axum::middleware::Next| async move {
                    seen.requests.fetch_add(1, Ordering::SeqCst);
                    next.run(request).await
                },
            ))
            .with_state(seen.clone())
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port())
    }

    fn requests(&self) -> usize {
        self.seen.requests.load(Ordering::SeqCst)
    }
}

async fn redirect(State(_): State<Arc<Seen>>, request: axum::extract::Request) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1")
        .to_owned();
    let mut response = StatusCode::FOUND.into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("http://{host}/target")) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

/// 100 MB of zeros, streamed 64 KiB at a time (chunked, or with a Content-Length when
/// `declared`); counts what it hands to hyper, which only asks for more as the socket drains.
async fn huge(seen: Arc<Seen>, declared: bool) -> Response {
    let chunks = futures::stream::unfold(0u64, move |sent| {
        let seen = seen.clone();
        async move {
            if sent >= HUGE {
                return None;
            }
            let n = (HUGE - sent).min(ZEROS.len() as u64);
            seen.streamed.fetch_add(n, Ordering::SeqCst);
            let chunk = Bytes::from_static(&ZEROS[..n as usize]);
            Some((Ok::<_, std::io::Error>(chunk), sent + n))
        }
    });
    let mut response = Body::from_stream(chunks).into_response();
    if declared {
        response
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(HUGE));
    }
    response
}

/// An answer whose head is about 200 KB: 2,000 headers of 100 bytes.
async fn huge_head() -> Response {
    let mut response = "ok".into_response();
    let value = HeaderValue::from_static(
        "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789",
    );
    for i in 0..2_000 {
        if let Ok(name) = header::HeaderName::try_from(format!("x-pad-{i}")) {
            response.headers_mut().insert(name, value.clone());
        }
    }
    response
}

/// Answers at once, sends one chunk of its body and then nothing more, never ending it.
async fn drip() -> Response {
    let first = futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from_static(b"x")) });
    Body::from_stream(first.chain(futures::stream::pending())).into_response()
}

/// Counts itself in, publishes the count, and waits for the test to open the gate.
async fn hold(State(seen): State<Arc<Seen>>) -> &'static str {
    let now = seen.holding.fetch_add(1, Ordering::SeqCst) + 1;
    seen.most_held.fetch_max(now, Ordering::SeqCst);
    seen.held_tx.send_replace(now);
    let mut gate = seen.gate.subscribe();
    let _ = gate.wait_for(|open| *open).await;
    let now = seen.holding.fetch_sub(1, Ordering::SeqCst) - 1;
    seen.held_tx.send_replace(now);
    "released"
}

/// Accepts TCP connections and completes the TLS handshake before axum sees them; a
/// connection whose handshake fails (the client refused the certificate) is dropped.
struct TlsListener {
    tcp: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(tcp).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// A throw-away CA and a server certificate it signed, valid for `IP:127.0.0.1` and
/// `DNS:localhost` (made with the openssl CLI, as `dev/kafka` makes the broker's).
struct TestCerts {
    dir: std::path::PathBuf,
    ca: std::path::PathBuf,
    server_cert: std::path::PathBuf,
    server_key: std::path::PathBuf,
}

impl TestCerts {
    fn make(name: &str) -> TestCerts {
        let dir =
            std::env::temp_dir().join(format!("sharehost-http-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("cert dir");
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .expect("openssl (needed for the TLS tests, as for dev/kafka --sasl-ssl)");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-sha256",
            "-days",
            "2",
            "-subj",
            "/CN=sharehost http test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-sha256",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ]);
        std::fs::write(
            dir.join("server.ext"),
            "basicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=serverAuth\n\
             subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )
        .expect("server.ext");
        run(&[
            "x509",
            "-req",
            "-sha256",
            "-days",
            "2",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-set_serial",
            "1",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ]);
        TestCerts {
            ca: dir.join("ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            dir,
        }
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A server that accepts connections and never answers.
async fn silent_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    addr
}

fn settings(hosts: &[String]) -> HttpSettings {
    HttpSettings {
        allowed_outbound_hosts: hosts.to_vec(),
        request_timeout: Duration::from_secs(30),
        max_response_bytes: 1 << 20,
        max_concurrent: 8,
        ca_file: None,
    }
}

async fn fetcher(settings: HttpSettings) -> (Plugin, Arc<HttpGrant>) {
    let grant = HttpGrant::new(settings).expect("grant");
    // The guest burns almost no CPU; the wall-clock budget only has to outlast the slowest
    // exchange of a test (30 s request timeout at most).
    let deadline = Duration::from_secs(60);
    let plugin = plugin_with("fixture_http_fetch", grant.clone(), deadline, deadline).await;
    (plugin, grant)
}

/// The `fixture` component under `grant`, with a CPU and a wall-clock deadline per batch.
async fn plugin_with(
    fixture: &str,
    grant: Arc<HttpGrant>,
    cpu: Duration,
    wall: Duration,
) -> Plugin {
    let rt = PluginRuntime::new(RuntimeConfig {
        max_plugin_memory: 64 << 20,
        max_instances: 4,
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    let limits = PluginLimits {
        max_memory: 32 << 20,
        batch_deadline: cpu,
        wall_deadline: Some(wall),
        http: Some(grant),
        ..PluginLimits::default()
    };
    rt.load(&guest(fixture), limits, Vec::new())
        .await
        .unwrap_or_else(|e| panic!("loading {fixture}: {e}"))
}

fn batch(urls: &[String]) -> Vec<Record> {
    urls.iter()
        .enumerate()
        .map(|(i, url)| record(i as i64, url, &[]))
        .collect()
}

async fn fetch(plugin: &mut Plugin, urls: &[String]) -> Vec<Verdict> {
    match tokio::time::timeout(STUCK, plugin.handle(&batch(urls))).await {
        Ok(BatchOutcome::Verdicts(verdicts)) => verdicts,
        Ok(other) => panic!("expected verdicts, got {other:?}"),
        Err(_) => panic!("the batch was stuck for {STUCK:?}"),
    }
}

fn reason(verdict: &Verdict) -> &str {
    match verdict {
        Verdict::Reject(Some(reason)) => reason,
        other => panic!("expected a reject with a reason, got {other:?}"),
    }
}

#[tokio::test]
async fn a_request_outside_the_allow_list_is_refused_in_the_host_and_never_reaches_the_server() {
    let server = Server::start().await;
    // The same address on another port, and a name: neither is the server's origin.
    let (mut plugin, grant) = fetcher(settings(&[
        format!("http://127.0.0.1:{}", server.port() ^ 1),
        "https://api.example.com".into(),
    ]))
    .await;
    let verdicts = fetch(
        &mut plugin,
        &[
            server.url("/ok"),
            format!("https://127.0.0.1:{}/ok", server.port()),
        ],
    )
    .await;
    for verdict in &verdicts {
        assert_eq!(reason(verdict), "ErrorCode::HttpRequestDenied");
    }
    assert_eq!(server.requests(), 0, "nothing reached the server");
    let counts = grant.stats().snapshot();
    assert_eq!(counts.refused_by_list, 2);
    assert_eq!(counts.sent, 0);
    println!("refused in the host: {counts:?}");
}

#[tokio::test]
async fn a_listed_name_resolving_to_loopback_is_refused_unless_the_address_is_listed_too() {
    let server = Server::start().await;
    let by_name = format!("http://localhost:{}/ok", server.port());

    let (mut plugin, grant) =
        fetcher(settings(&[format!("http://localhost:{}", server.port())])).await;
    let verdicts = fetch(&mut plugin, std::slice::from_ref(&by_name)).await;
    assert_eq!(reason(&verdicts[0]), "ErrorCode::DestinationIpProhibited");
    assert_eq!(
        server.requests(),
        0,
        "a refused address is never connected to"
    );
    assert_eq!(grant.stats().snapshot().refused_by_address, 1);

    let (mut plugin, grant) = fetcher(settings(&[
        format!("http://localhost:{}", server.port()),
        format!("http://127.0.0.1:{}", server.port()),
    ]))
    .await;
    let verdicts = fetch(&mut plugin, &[by_name, server.url("/ok")]).await;
    assert_eq!(verdicts, vec![Verdict::Accept, Verdict::Accept]);
    assert_eq!(server.requests(), 2);
    let counts = grant.stats().snapshot();
    assert_eq!((counts.sent, counts.refused_by_address), (2, 0));
}

#[tokio::test]
async fn a_redirect_is_handed_to_the_guest_and_never_followed() {
    let server = Server::start().await;
    let (mut plugin, _) = fetcher(settings(&[format!("http://127.0.0.1:{}", server.port())])).await;
    let verdicts = fetch(&mut plugin, &[server.url("/redirect")]).await;
    assert_eq!(reason(&verdicts[0]), "status 302");
    assert_eq!(server.requests(), 1);
    assert_eq!(
        server.seen.redirect_target.load(Ordering::SeqCst),
        0,
        "the redirect target was never requested"
    );
}

#[tokio::test]
async fn a_streamed_100_mb_response_is_cut_at_the_size_cap_and_never_read_whole() {
    let server = Server::start().await;
    // One request at a time: the request after the cut gets a permit only if the cut
    // released it.
    let mut one_at_a_time = settings(&[format!("http://127.0.0.1:{}", server.port())]);
    one_at_a_time.max_concurrent = 1;
    let (mut plugin, grant) = fetcher(one_at_a_time).await;
    let verdicts = fetch(&mut plugin, &[server.url("/huge")]).await;
    let why = reason(&verdicts[0]);
    assert!(
        why.starts_with("body: ") && why.contains("body size exceeds limit"),
        "{why}"
    );
    let streamed = server.seen.streamed.load(Ordering::SeqCst);
    println!("the server got to hand {streamed} of {HUGE} bytes to its socket before the cut");
    assert!(streamed < HUGE, "the host read the whole body");
    assert_eq!(grant.stats().snapshot().too_large, 1);
    let next = fetch(&mut plugin, &[server.url("/ok")]).await;
    assert_eq!(
        next,
        vec![Verdict::Accept],
        "the cut released the request's permit"
    );
}

#[tokio::test]
async fn the_rust_sdk_names_a_body_over_the_cap_too_large_and_a_stalled_body_a_timeout() {
    let server = Server::start().await;
    let deadline = Duration::from_secs(60);
    // Each with its own timeout: the stalled body's is short, so that it fires; the big body's
    // is long, so that only the size cap can end it (on a busy machine, 500 ms did first).
    let plugin_timing_out_after = |timeout: Duration| {
        let mut settings = settings(&[format!("http://127.0.0.1:{}", server.port())]);
        settings.request_timeout = timeout;
        let grant = HttpGrant::new(settings).expect("grant");
        plugin_with("fixture_sdk_http", grant, deadline, deadline)
    };
    // Both failures came to the author as `Connect`: the host's body errors carry no
    // error code through wasi:http's stream.
    let mut plugin = plugin_timing_out_after(Duration::from_secs(30)).await;
    let verdicts = fetch(&mut plugin, &[server.url("/huge")]).await;
    assert!(
        reason(&verdicts[0]).starts_with("TooLarge: "),
        "{verdicts:?}"
    );
    let mut plugin = plugin_timing_out_after(Duration::from_millis(500)).await;
    let verdicts = fetch(&mut plugin, &[server.url("/drip")]).await;
    assert!(
        reason(&verdicts[0]).starts_with("Timeout: "),
        "{verdicts:?}"
    );
}

#[tokio::test]
async fn the_rust_sdk_names_a_post_to_a_host_not_granted_denied_and_to_no_listener_connect() {
    // The SDK writes a request's body after handing the request over: the host refused it at
    // once (or its connection failed) and stopped reading, so the body's write failed and the
    // author got `Connect("stream closed")` instead of the request's own error.
    let idle = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let grant = HttpGrant::new(settings(&[format!("http://127.0.0.1:{idle}")])).expect("grant");
    let deadline = Duration::from_secs(60);
    let mut plugin = plugin_with("fixture_sdk_http", grant, deadline, deadline).await;
    let verdicts = fetch(
        &mut plugin,
        &[
            "POST http://127.0.0.1:9/x".to_owned(),
            format!("POST http://127.0.0.1:{idle}/x"),
        ],
    )
    .await;
    assert!(reason(&verdicts[0]).starts_with("Denied: "), "{verdicts:?}");
    assert!(
        reason(&verdicts[1]).starts_with("Connect: "),
        "{verdicts:?}"
    );
    assert!(
        !reason(&verdicts[1]).contains("stream closed"),
        "{verdicts:?}"
    );
}

/// The same through the Python SDK: what the guide promises a Python author, `Denied` for a
/// host the pipeline does not grant and `Connect` for a port nobody listens on, each before
/// the 3 MB body was read.
#[tokio::test]
async fn the_python_sdk_names_a_post_to_a_host_not_granted_denied_and_to_no_listener_connect() {
    let idle = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let grant = HttpGrant::new(settings(&[format!("http://127.0.0.1:{idle}")])).expect("grant");
    let deadline = Duration::from_secs(60);
    let mut plugin = plugin_with("http_errors_py", grant, deadline, deadline).await;
    let verdicts = fetch(
        &mut plugin,
        &[
            "POST http://127.0.0.1:9/x".to_owned(),
            format!("POST http://127.0.0.1:{idle}/x"),
            format!("GET http://127.0.0.1:{idle}/x"),
        ],
    )
    .await;
    assert!(reason(&verdicts[0]).starts_with("Denied: "), "{verdicts:?}");
    for v in &verdicts[1..] {
        assert!(reason(v).starts_with("Connect: "), "{verdicts:?}");
        assert!(!reason(v).contains("stream closed"), "{verdicts:?}");
    }
}

#[tokio::test]
async fn a_send_all_holding_more_than_the_resource_cap_faults_naming_the_bound() {
    // 4,000 requests at once with the Rust SDK: each holds a request, its future and a
    // pollable in the host, past the 2,048 host resources a 32 MiB plugin may hold.
    let server = Server::start().await;
    let grant =
        HttpGrant::new(settings(&[format!("http://127.0.0.1:{}", server.port())])).expect("grant");
    let deadline = Duration::from_secs(60);
    let mut plugin = plugin_with("fixture_sdk_http", grant, deadline, deadline).await;
    let outcome = tokio::time::timeout(
        STUCK,
        plugin.handle(&batch(&[format!("ALL 4000 {}", server.url("/ok"))])),
    )
    .await
    .expect("not stuck");
    let fault = outcome.fault().expect("the resource cap traps");
    assert!(
        fault.message.contains(
            "than its memory limit allows: 2048 for 32 MiB (64 per MiB of memory_limit_mib)"
        ),
        "the fault names the bound and what raises it: {}",
        fault.message
    );
    // A smaller group fits, on the fresh instance the fault left.
    let verdicts = fetch(&mut plugin, &[format!("ALL 200 {}", server.url("/ok"))]).await;
    assert_eq!(verdicts, vec![Verdict::Accept]);
}

#[tokio::test]
async fn a_content_length_over_the_size_cap_is_refused_at_the_head() {
    let server = Server::start().await;
    let (mut plugin, grant) =
        fetcher(settings(&[format!("http://127.0.0.1:{}", server.port())])).await;
    let verdicts = fetch(&mut plugin, &[server.url("/huge-declared")]).await;
    assert_eq!(
        reason(&verdicts[0]),
        format!("ErrorCode::HttpResponseBodySize(Some({HUGE}))")
    );
    assert!(server.seen.streamed.load(Ordering::SeqCst) < HUGE);
    assert_eq!(grant.stats().snapshot().too_large, 1);
}

#[tokio::test]
async fn a_response_head_over_the_read_buffer_is_named_to_the_guest_and_counted() {
    let server = Server::start().await;
    let (mut plugin, grant) =
        fetcher(settings(&[format!("http://127.0.0.1:{}", server.port())])).await;
    let verdicts = fetch(&mut plugin, &[server.url("/huge-head"), server.url("/ok")]).await;
    assert_eq!(
        reason(&verdicts[0]),
        "ErrorCode::HttpResponseHeaderSectionSize(Some(65536))",
        "the guest is told the head was too large, not a bare protocol error"
    );
    assert_eq!(verdicts[1], Verdict::Accept);
    let counts = grant.stats().snapshot();
    assert_eq!(counts.too_large, 1, "{counts:?}");
    assert_eq!(counts.failed, 0, "{counts:?}");
}

#[tokio::test]
async fn a_server_that_never_answers_hits_the_request_timeout() {
    let silent = silent_server().await;
    let mut settings = settings(&[format!("http://{silent}")]);
    settings.request_timeout = Duration::from_millis(300);
    let (mut plugin, grant) = fetcher(settings).await;
    let verdicts = fetch(&mut plugin, &[format!("http://{silent}/never")]).await;
    assert_eq!(reason(&verdicts[0]), "ErrorCode::HttpResponseTimeout");
    let counts = grant.stats().snapshot();
    assert_eq!((counts.sent, counts.timed_out), (1, 1));
}

/// Runs a batch of `n` `/hold` requests with `max_concurrent = cap`; opens the server's gate
/// once `ready` says so (given what the server holds and what the host queues); returns the
/// most requests the server held at once.
async fn held_at_once(
    cap: usize,
    n: usize,
    ready: impl Fn(usize, u64) -> bool,
) -> (usize, Vec<Verdict>) {
    let server = Server::start().await;
    let mut settings = settings(&[format!("http://127.0.0.1:{}", server.port())]);
    settings.max_concurrent = cap;
    let (mut plugin, grant) = fetcher(settings).await;
    let urls = vec![server.url("/hold"); n];
    let records = batch(&urls);
    let handle = plugin.handle(&records);
    tokio::pin!(handle);
    let mut held = server.seen.held_tx.subscribe();
    let opener = async {
        loop {
            let holding = *held.borrow_and_update();
            if ready(holding, grant.stats().snapshot().waiting) {
                break;
            }
            // The host's queue has no event of its own: look again when the server's count
            // changes, or shortly.
            tokio::select! {
                _ = held.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
        }
        server.seen.gate.send_replace(true);
    };
    let outcome = tokio::time::timeout(STUCK, async {
        tokio::select! {
            outcome = &mut handle => outcome,
            () = opener => handle.await,
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "cap {cap}: stuck (the server held {} at most)",
            server.seen.most_held.load(Ordering::SeqCst)
        )
    });
    let verdicts = match outcome {
        BatchOutcome::Verdicts(v) => v,
        other => panic!("expected verdicts, got {other:?}"),
    };
    (server.seen.most_held.load(Ordering::SeqCst), verdicts)
}

#[tokio::test]
async fn requests_a_plugin_never_reads_give_their_permits_back_at_their_timeout() {
    let server = Server::start().await;
    let mut settings = settings(&[format!("http://127.0.0.1:{}", server.port())]);
    settings.max_concurrent = 2;
    settings.request_timeout = Duration::from_millis(500);
    let (mut plugin, grant) = fetcher(settings).await;
    // Two requests answered at once, their responses kept in a static and never read: they
    // held both permits of the pipeline for as long as the instance lived.
    let keep = vec![format!("KEEP {}", server.url("/ok")); 2];
    assert_eq!(fetch(&mut plugin, &keep).await, vec![Verdict::Accept; 2]);
    // The batch returns before its requests are under way: first they reach the server (their
    // permits taken), then the permits must come back by themselves.
    tokio::time::timeout(STUCK, async {
        while server.requests() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the kept requests never went out: {:?}",
            grant.stats().snapshot()
        )
    });
    tokio::time::timeout(STUCK, async {
        while grant.stats().snapshot().in_flight > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "permits still held {STUCK:?} after their requests' timeout: {:?}",
            grant.stats().snapshot()
        )
    });
    // The next batch of the same instance gets a permit.
    let verdicts = fetch(&mut plugin, &[server.url("/ok")]).await;
    assert_eq!(verdicts, vec![Verdict::Accept]);
}

#[tokio::test]
async fn host_work_for_a_plugins_requests_counts_against_its_cpu_deadline() {
    let server = Server::start().await;
    let grant =
        HttpGrant::new(settings(&[format!("http://127.0.0.1:{}", server.port())])).expect("grant");
    let (cpu, wall) = (Duration::from_millis(200), Duration::from_secs(120));
    let mut plugin = plugin_with("fixture_http_fetch", grant, cpu, wall).await;
    // Requests one after another for as long as the host lets it: the host's side of each
    // (connection, request, response) was not counted, so the call ran on for several times
    // its CPU budget until the wall-clock deadline cut it.
    let outcome = tokio::time::timeout(
        STUCK,
        plugin.handle(&batch(&[format!("LOOP {}", server.url("/ok"))])),
    )
    .await
    .expect("the call was stopped");
    match outcome {
        BatchOutcome::Fault(f) => {
            assert_eq!(f.kind, FaultKind::Timeout, "{}", f.message);
            assert!(
                f.message.contains("CPU deadline")
                    && f.message
                        .contains("host work for the plugin's HTTP requests"),
                "{}",
                f.message
            );
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(server.requests() > 0);
}

#[tokio::test]
async fn header_maps_a_plugin_hoards_are_bounded_by_its_memory_limit() {
    let (mut plugin, _grant) = fetcher(settings(&["http://127.0.0.1:9".to_owned()])).await;
    // One map of 100 KiB (wasmtime-wasi-http takes up to 128 KiB): refused.
    match tokio::time::timeout(STUCK, plugin.handle(&batch(&["HOARD 1 100".to_owned()])))
        .await
        .expect("the batch was stuck")
    {
        BatchOutcome::Fault(f) => assert!(
            f.message.contains("total size of fields exceeds limit"),
            "{}",
            f.message
        ),
        other => panic!("a 100 KiB header map was taken: {other:?}"),
    }
    // Maps of 10 KiB, 1,500 a batch, kept across batches of a reused instance, in a table
    // of a million entries: the host grew by hundreds of MiB outside the plugin's cap.
    for _ in 0..3 {
        match tokio::time::timeout(STUCK, plugin.handle(&batch(&["HOARD 1500 10".to_owned()])))
            .await
            .expect("the batch was stuck")
        {
            BatchOutcome::Verdicts(v) => {
                let kept = reason(&v[0]);
                let bytes: u64 = kept
                    .rsplit(", ")
                    .next()
                    .and_then(|b| b.strip_suffix(" bytes"))
                    .and_then(|b| b.parse().ok())
                    .unwrap_or_else(|| panic!("no byte count in {kept:?}"));
                // The plugin's memory limit in this runtime is 32 MiB.
                assert!(
                    bytes <= 32 << 20,
                    "the host holds {bytes} bytes of header maps: {kept}"
                );
            }
            // A map past its size limit, or an instance whose resource table is full: the
            // hoard ends in a trap, and the instance (and all it held) is dropped.
            BatchOutcome::Fault(f) => assert!(
                f.message.contains("total size of fields exceeds limit")
                    || f.message.contains(
                        "host resources at once (HTTP requests and responses, header maps, \
                         streams, pollables) than its memory limit allows: 2048 for 32 MiB"
                    ),
                "{}",
                f.message
            ),
        }
    }
}

#[tokio::test]
async fn the_concurrency_cap_holds_requests_back_in_the_host() {
    // Open the gate once the server holds two and the host queues the other six, or as soon
    // as the server holds more than two (the cap failed).
    let (most, verdicts) = held_at_once(2, 8, |holding, waiting| {
        holding > 2 || (holding == 2 && waiting == 6)
    })
    .await;
    assert_eq!(most, 2, "the server saw more requests at once than the cap");
    assert_eq!(verdicts, vec![Verdict::Accept; 8]);
}

#[tokio::test]
async fn the_guest_issues_a_batchs_requests_concurrently() {
    let (most, verdicts) = held_at_once(8, 8, |holding, _| holding == 8).await;
    assert_eq!(most, 8);
    assert_eq!(verdicts, vec![Verdict::Accept; 8]);
}

#[tokio::test]
async fn a_429_or_5xx_answer_gives_retry_and_a_200_gives_accept() {
    let server = Server::start().await;
    let (mut plugin, grant) =
        fetcher(settings(&[format!("http://127.0.0.1:{}", server.port())])).await;
    let verdicts = fetch(
        &mut plugin,
        &[
            server.url("/ok"),
            server.url("/status/429"),
            server.url("/status/503"),
            server.url("/status/404"),
        ],
    )
    .await;
    assert_eq!(
        verdicts,
        vec![
            Verdict::Accept,
            Verdict::Retry(1000),
            Verdict::Retry(1000),
            Verdict::Reject(Some("status 404".into())),
        ]
    );
    assert_eq!(grant.stats().snapshot().sent, 4);
}

#[tokio::test]
async fn https_is_verified_against_the_ca_file_and_refused_without_it() {
    let certs = TestCerts::make("tls");
    let server = Server::start_tls(&certs).await;
    let origin = format!("https://127.0.0.1:{}", server.port());
    let url = format!("{origin}/ok");

    let (mut plugin, grant) = fetcher(settings(std::slice::from_ref(&origin))).await;
    let verdicts = fetch(&mut plugin, std::slice::from_ref(&url)).await;
    assert_eq!(reason(&verdicts[0]), "ErrorCode::TlsCertificateError");
    assert_eq!(
        server.requests(),
        0,
        "no request crossed an unverified connection"
    );
    assert_eq!(grant.stats().snapshot().sent, 1);

    let mut trusted = settings(std::slice::from_ref(&origin));
    trusted.ca_file = Some(certs.ca.clone());
    let (mut plugin, _) = fetcher(trusted).await;
    let verdicts = fetch(&mut plugin, &[url]).await;
    assert_eq!(verdicts, vec![Verdict::Accept]);
    assert_eq!(server.requests(), 1);
}

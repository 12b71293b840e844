//! The grant: what a pipeline's manifest allows for outbound HTTP ([`HttpSettings`]), checked
//! once at load into an [`HttpGrant`] (every allow-list entry, the limits, the CA file, the TLS
//! configuration) so a bad grant stops the pipeline at load, not at its first request, and
//! shared by every instance of the plugin version. Its [`HttpGrant::send`] is where every
//! request starts: the allow-list is checked before anything is awaited.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use tokio::sync::Semaphore;
use wasmtime_wasi_http::{Error as HttpError, WasiBody};

use super::allow_list::{AllowList, AllowedOrigin, OriginError, OriginScheme, Target};
use super::client::{Client, SendFuture};
use super::report::{HttpStats, Refusals, bump};
use crate::meter::CpuMeter;

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

/// A checked HTTP grant, shared by every instance of one plugin version: the allow-list,
/// the TLS configuration (built once) and the semaphore that caps requests in flight.
pub struct HttpGrant {
    settings: HttpSettings,
    allow: AllowList,
    client: Client,
}

impl fmt::Debug for HttpGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpGrant")
            .field("pipeline", &self.client.pipeline())
            .field("origins", &self.allow.origins())
            .field("settings", &self.settings)
            .field("stats", &self.stats().snapshot())
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
        let allow = AllowList::parse(&settings.allowed_outbound_hosts)?;
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
        let needs_roots = allow
            .origins()
            .iter()
            .any(|o| o.scheme == OriginScheme::Https);
        let tls = tls_connector(settings.ca_file.as_deref(), needs_roots)?;
        let client = Client::new(
            settings.request_timeout,
            settings.max_response_bytes,
            settings.max_concurrent,
            tls,
            Arc::from(pipeline),
        );
        Ok(Arc::new(Self {
            settings,
            allow,
            client,
        }))
    }

    /// The settings it was built from.
    pub fn settings(&self) -> &HttpSettings {
        &self.settings
    }

    /// The checked allow-list.
    pub fn origins(&self) -> &[AllowedOrigin] {
        self.allow.origins()
    }

    /// What its requests did so far, for the pipeline's metrics.
    pub fn stats(&self) -> &HttpStats {
        self.client.stats()
    }

    /// The hook's entry point: the allow-list is checked before anything is awaited, so a
    /// refused request costs no task, no lookup and no connection.
    pub(crate) fn send(
        self: Arc<Self>,
        request: http::Request<WasiBody>,
        refusals: Arc<Refusals>,
        meter: Option<Arc<CpuMeter>>,
    ) -> Box<SendFuture> {
        let target = match Target::of(request.uri()) {
            Ok(target) => target,
            Err(e) => return Box::new(async move { Err(e) }),
        };
        if !self.allow.permits(&target) {
            bump(&self.stats().refused_by_list);
            refusals.note(
                &target.to_string(),
                "outbound HTTP request refused: origin not in allowed_outbound_hosts",
            );
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        Box::new(async move {
            self.client
                .exchange(&self.allow, target, request, &refusals, meter)
                .await
        })
    }
}

/// The largest `http_ca_file` read, in bytes.
const MAX_CA_FILE_BYTES: u64 = 4 << 20;

/// The grant's rustls client: the system roots plus the CA file, HTTP/1.1 by ALPN. Other
/// clients of the host that speak HTTP/1.1 over TLS (the schema registry's) use it too, so
/// the host trusts one set of roots, read one way.
pub fn tls_connector(
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
        // Through the bounded reader: a regular file of at most 4 MiB (the system's whole
        // bundle of public roots is about 200 KiB), so a path to /dev/zero or a FIFO is
        // refused rather than read.
        let bytes = crate::fs::read_regular(path, MAX_CA_FILE_BYTES).map_err(|e| match e {
            crate::fs::FileError::TooLarge { maximum, .. } => {
                ca_error(format!("more than a CA file's {maximum}-byte maximum"))
            }
            crate::fs::FileError::NotAFile { what, .. } => ca_error(what.into()),
            crate::fs::FileError::Read { error, .. } => ca_error(error.to_string()),
        })?;
        let certs = rustls_pki_types::CertificateDer::pem_slice_iter(&bytes)
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

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use http_body_util::BodyExt;

    use super::*;
    use crate::http::report::tests::refusals_of;

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
        let listed = &grant.allow;
        assert!(listed.ip_listed(OriginScheme::Http, lo, 8080));
        assert!(listed.ip_listed(
            OriginScheme::Http,
            "::ffff:127.0.0.1".parse().expect("ip"),
            8080
        ));
        assert!(!listed.ip_listed(OriginScheme::Http, lo, 8081));
        assert!(!listed.ip_listed(OriginScheme::Https, lo, 8080));
        assert!(!listed.ip_listed(OriginScheme::Http, "::1".parse().expect("ip"), 8080));
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
        let err = HttpGrant::new(with_ca.clone()).expect_err("no certificate");
        assert!(err.to_string().contains(&*empty.to_string_lossy()), "{err}");
        assert!(err.to_string().contains("no PEM certificate"), "{err}");
        // A device is refused by type, never read.
        with_ca.ca_file = Some("/dev/zero".into());
        let err = HttpGrant::new(with_ca).expect_err("a device");
        assert_eq!(
            err.to_string(),
            "http_ca_file /dev/zero: is a character device, not a regular file"
        );
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
        let result = std::pin::Pin::from(grant.clone().send(request, refusals.clone(), None)).await;
        assert!(matches!(result, Err(HttpError::HttpRequestDenied)));
        let counts = grant.stats().snapshot();
        assert_eq!(counts.refused_by_list, 1);
        assert_eq!(counts.sent, 0);
        assert_eq!(counts.failed, 0, "no DNS lookup was attempted");
    }
}

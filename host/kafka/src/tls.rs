//! TLS client configuration (rustls with the ring provider): CA file or system roots, host name
//! verification always on, optional client certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::addr::BrokerAddr;
use super::error::KafkaError;

/// What the user configures for TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// PEM file of CA certificates to trust; the system roots when `None`.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain for mutual TLS.
    pub cert_file: Option<PathBuf>,
    /// PEM private key matching `cert_file`.
    pub key_file: Option<PathBuf>,
    /// Name to verify instead of the broker's advertised host (e.g. when connecting by IP).
    pub server_name: Option<String>,
}

/// A ready-to-use TLS connector plus the override name, built once per client.
#[derive(Clone)]
pub struct Tls {
    connector: TlsConnector,
    server_name: Option<String>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// The largest TLS file read (a CA bundle, a certificate chain, a key), in bytes: the
/// system's whole bundle of public roots is about 200 KiB.
const MAX_TLS_FILE_BYTES: u64 = 4 << 20;

/// Reads a TLS file bounded: examined first (a stat opens nothing, so a FIFO cannot block),
/// refused unless a regular file of at most [`MAX_TLS_FILE_BYTES`], then read through a
/// bound, so `/dev/zero` or a file that grows cannot fill memory. Errors name the file.
fn read_tls_file(path: &Path, what: &str) -> Result<Vec<u8>, KafkaError> {
    use std::io::Read;
    let fail =
        |why: String| KafkaError::Config(format!("cannot read {what} {}: {why}", path.display()));
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    if !meta.is_file() {
        return Err(fail("not a regular file".into()));
    }
    let too_large = || fail(format!("more than the {MAX_TLS_FILE_BYTES}-byte maximum"));
    if meta.len() > MAX_TLS_FILE_BYTES {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_TLS_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| fail(e.to_string()))?;
    if bytes.len() as u64 > MAX_TLS_FILE_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, KafkaError> {
    let bytes = read_tls_file(path, what)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| {
            KafkaError::Config(format!("{what} {} is not valid PEM: {e}", path.display()))
        })?;
    if certs.is_empty() {
        return Err(KafkaError::Config(format!(
            "{what} {} holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)",
            path.display()
        )));
    }
    Ok(certs)
}

impl Tls {
    /// Loads the CA and client files and builds the rustls configuration.
    pub fn new(settings: &TlsSettings) -> Result<Tls, KafkaError> {
        let mut roots = RootCertStore::empty();
        match &settings.ca_file {
            Some(path) => {
                for cert in read_certs(path, "CA file")? {
                    roots.add(cert).map_err(|e| {
                        KafkaError::Config(format!(
                            "CA file {} holds an unusable certificate: {e}",
                            path.display()
                        ))
                    })?;
                }
            }
            None => {
                let loaded = rustls_native_certs::load_native_certs();
                for cert in loaded.certs {
                    let _ = roots.add(cert);
                }
                if roots.is_empty() {
                    return Err(KafkaError::Config(
                        "TLS: no CA file given and no system root certificates found".into(),
                    ));
                }
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| KafkaError::Config(format!("TLS: {e}")))?
            .with_root_certificates(roots);
        let config = match (&settings.cert_file, &settings.key_file) {
            (Some(cert), Some(key)) => {
                let chain = read_certs(cert, "client certificate file")?;
                let key_bytes = read_tls_file(key, "client key file")?;
                let key_der = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| {
                    KafkaError::Config(format!(
                        "cannot read client key file {}: {e}",
                        key.display()
                    ))
                })?;
                builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                    KafkaError::Config(format!("client certificate {}: {e}", cert.display()))
                })?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => {
                return Err(KafkaError::Config(
                    "TLS: a client certificate needs both cert_file and key_file".into(),
                ));
            }
        };
        Ok(Tls {
            connector: TlsConnector::from(Arc::new(config)),
            server_name: settings.server_name.clone(),
        })
    }

    /// Runs the handshake on a connected socket, verifying the broker's name.
    pub async fn handshake(
        &self,
        tcp: TcpStream,
        broker: &BrokerAddr,
    ) -> Result<TlsStream<TcpStream>, KafkaError> {
        let name = self
            .server_name
            .clone()
            .unwrap_or_else(|| broker.host.clone());
        let server_name = ServerName::try_from(name.clone()).map_err(|e| KafkaError::Tls {
            broker: broker.clone(),
            reason: format!("{name:?} is not a valid TLS server name: {e}"),
        })?;
        self.connector
            .connect(server_name, tcp)
            .await
            .map_err(|e| KafkaError::Tls {
                broker: broker.clone(),
                reason: explain_tls_error(&e),
            })
    }
}

fn explain_tls_error(e: &std::io::Error) -> String {
    let base = e.to_string();
    let hint = if base.contains("UnknownIssuer") {
        " (the broker's certificate is not signed by a trusted CA: check the CA file)"
    } else if base.contains("NotValidForName") {
        " (the certificate does not name this host: set tls server_name or connect by the certified name)"
    } else if base.contains("InvalidContentType") || base.contains("corrupt message") {
        " (the port does not speak TLS?)"
    } else {
        ""
    };
    format!("{base}{hint}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_non_pem_ca_files_are_named() {
        let missing = TlsSettings {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..Default::default()
        };
        let e = Tls::new(&missing).expect_err("missing").to_string();
        assert!(e.contains("cannot read CA file /nonexistent/ca.pem"), "{e}");

        let dir = std::env::temp_dir().join(format!("sharehost-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "this is not a certificate\n").expect("write");
        let e = Tls::new(&TlsSettings {
            ca_file: Some(junk.clone()),
            ..Default::default()
        })
        .expect_err("junk")
        .to_string();
        assert!(e.contains("holds no PEM certificate"), "{e}");
        assert!(e.contains(&junk.display().to_string()), "{e}");
        // A device is refused by type, never read.
        let e = Tls::new(&TlsSettings {
            ca_file: Some("/dev/zero".into()),
            ..Default::default()
        })
        .expect_err("a device")
        .to_string();
        assert!(
            e.contains("cannot read CA file /dev/zero: not a regular file"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn half_a_client_identity_is_refused() {
        let dir = std::env::temp_dir();
        let s = TlsSettings {
            cert_file: Some(dir.join("c.pem")),
            ..Default::default()
        };
        // The CA lookup may fail first on machines without roots; both errors are config errors.
        assert!(matches!(Tls::new(&s), Err(KafkaError::Config(_))));
    }
}

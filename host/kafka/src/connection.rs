//! A connected, negotiated, authenticated broker connection: TCP (+TLS) → ApiVersions → SASL,
//! then typed requests with the version chosen per API.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, SaslAuthenticateRequest, SaslAuthenticateResponse,
    SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Request, StrBytes, VersionRange};
use tokio::net::TcpStream;

use super::addr::BrokerAddr;
use super::error::KafkaError;
use super::frame::{self, DEFAULT_MAX_FRAME_BYTES};
use super::messenger::{Messenger, MessengerConfig};
use super::sasl::{self, Mechanism, SaslSettings, ScramClient, ScramHash};
use super::tls::{Tls, TlsSettings};
use super::versions::ApiVersionTable;

/// Everything needed to open a connection to any broker of one cluster.
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    /// Sent in request headers.
    pub client_id: String,
    /// TLS, when the listener needs it.
    pub tls: Option<Tls>,
    /// SASL credentials, when the listener needs them.
    pub sasl: Option<SaslSettings>,
    /// TCP connect (and TLS handshake) timeout.
    pub connect_timeout: Duration,
    /// Default per-request timeout (Java's `request.timeout.ms` is 30 s).
    pub request_timeout: Duration,
    /// Largest response frame accepted.
    pub max_frame_bytes: usize,
}

impl ConnectionConfig {
    /// Plain-text defaults for a client id.
    pub fn new(client_id: impl Into<String>) -> Self {
        ConnectionConfig {
            client_id: client_id.into(),
            tls: None,
            sasl: None,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
        }
    }

    /// Adds TLS, loading the CA and client files now so a bad file fails before any connection.
    pub fn with_tls(mut self, settings: &TlsSettings) -> Result<Self, KafkaError> {
        self.tls = Some(Tls::new(settings)?);
        Ok(self)
    }

    /// Adds SASL credentials.
    pub fn with_sasl(mut self, sasl: SaslSettings) -> Self {
        self.sasl = Some(sasl);
        self
    }
}

/// A connection ready for typed requests.
#[derive(Debug)]
pub struct BrokerConnection {
    messenger: Messenger,
    versions: ApiVersionTable,
    request_timeout: Duration,
}

impl BrokerConnection {
    /// Connects, negotiates API versions and authenticates.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped attempt leaves nothing behind but a closed socket.
    pub async fn connect(
        broker: &BrokerAddr,
        config: &ConnectionConfig,
    ) -> Result<Arc<Self>, KafkaError> {
        let addr = broker.socket_addr_string();
        let tcp = tokio::time::timeout(config.connect_timeout, TcpStream::connect(&addr))
            .await
            .map_err(|_| KafkaError::Connect {
                broker: broker.clone(),
                reason: format!("timed out after {:?}", config.connect_timeout),
            })?
            .map_err(|e| KafkaError::Connect {
                broker: broker.clone(),
                reason: e.to_string(),
            })?;
        let _ = tcp.set_nodelay(true);
        let mcfg = MessengerConfig {
            client_id: config.client_id.clone(),
            max_frame_bytes: config.max_frame_bytes,
        };
        let messenger = match &config.tls {
            Some(tls) => {
                let stream =
                    tokio::time::timeout(config.connect_timeout, tls.handshake(tcp, broker))
                        .await
                        .map_err(|_| KafkaError::Tls {
                            broker: broker.clone(),
                            reason: format!(
                                "handshake timed out after {:?} (does the port speak TLS?)",
                                config.connect_timeout
                            ),
                        })??;
                Messenger::new(stream, broker.clone(), mcfg)
            }
            None => Messenger::new(tcp, broker.clone(), mcfg),
        };
        let mut conn = BrokerConnection {
            messenger,
            versions: ApiVersionTable::default(),
            request_timeout: config.request_timeout,
        };
        conn.negotiate().await?;
        if let Some(sasl) = &config.sasl {
            conn.authenticate(sasl).await?;
        }
        Ok(Arc::new(conn))
    }

    async fn negotiate(&mut self) -> Result<(), KafkaError> {
        // v3 is the first flexible version and every 2.4+ broker has it; we target 4.2+.
        const VERSION: i16 = 3;
        let req = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("sharehost"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        let frame = self
            .messenger
            .request(ApiKey::ApiVersions, VERSION, &req, self.request_timeout)
            .await?;
        let resp: kafka_protocol::messages::ApiVersionsResponse =
            self.decode(frame, ApiKey::ApiVersions, VERSION)?;
        if let Some(e) = KafkaError::from_code(
            self.broker(),
            ApiKey::ApiVersions,
            VERSION,
            resp.error_code,
            None,
        ) {
            return Err(e);
        }
        self.versions = ApiVersionTable::from_response(&resp);
        Ok(())
    }

    async fn authenticate(&self, sasl: &SaslSettings) -> Result<(), KafkaError> {
        let auth_err = |reason: String| KafkaError::Auth {
            broker: self.broker().clone(),
            mechanism: sasl.mechanism.name().to_owned(),
            reason,
        };
        let hs: SaslHandshakeResponse = self
            .send(
                &SaslHandshakeRequest::default()
                    .with_mechanism(StrBytes::from_static_str(sasl.mechanism.name())),
            )
            .await?;
        if hs.error_code != 0 {
            let offered: Vec<&str> = hs.mechanisms.iter().map(|m| m.as_str()).collect();
            return Err(auth_err(format!(
                "the listener does not enable {} (it offers: {})",
                sasl.mechanism,
                if offered.is_empty() {
                    "none".to_owned()
                } else {
                    offered.join(", ")
                }
            )));
        }
        let password = sasl.password.expose();
        match sasl.mechanism {
            Mechanism::Plain => {
                self.sasl_round(sasl::plain_message(&sasl.username, password), &auth_err)
                    .await?;
            }
            Mechanism::ScramSha256 | Mechanism::ScramSha512 => {
                let hash = if sasl.mechanism == Mechanism::ScramSha256 {
                    ScramHash::Sha256
                } else {
                    ScramHash::Sha512
                };
                let mut scram = ScramClient::new(hash, &sasl.username, password);
                let server_first = self
                    .sasl_round(scram.first_message().into_bytes(), &auth_err)
                    .await?;
                let server_first = String::from_utf8_lossy(&server_first);
                let fin = scram
                    .final_message(&server_first)
                    .map_err(|e| auth_err(e.to_string()))?;
                let server_final = self.sasl_round(fin.into_bytes(), &auth_err).await?;
                scram
                    .verify_server_final(&String::from_utf8_lossy(&server_final))
                    .map_err(|e| auth_err(e.to_string()))?;
            }
        }
        Ok(())
    }

    async fn sasl_round(
        &self,
        bytes: Vec<u8>,
        auth_err: &impl Fn(String) -> KafkaError,
    ) -> Result<Bytes, KafkaError> {
        let resp: SaslAuthenticateResponse = self
            .send(&SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(bytes)))
            .await?;
        if resp.error_code != 0 {
            let msg = resp
                .error_message
                .as_deref()
                .unwrap_or("no reason given")
                .to_owned();
            return Err(auth_err(format!("{msg} (wrong user name or password?)")));
        }
        Ok(resp.auth_bytes)
    }

    /// The broker this connection reaches.
    pub fn broker(&self) -> &BrokerAddr {
        self.messenger.broker()
    }

    /// The broker's advertised API ranges.
    pub fn versions(&self) -> &ApiVersionTable {
        &self.versions
    }

    /// Whether the connection died (it is then replaced, never reused).
    pub fn is_dead(&self) -> bool {
        self.messenger.dead_reason().is_some()
    }

    /// Requests still waiting for a response.
    pub fn pending_requests(&self) -> usize {
        self.messenger.pending_requests()
    }

    /// Closes the connection on purpose (see [`Messenger::close`]).
    pub fn close(&self, reason: &str) {
        self.messenger.close(reason);
    }

    /// The version we would use for `R`, within `ours`.
    pub fn version_for(&self, api: ApiKey, ours: VersionRange) -> Result<i16, KafkaError> {
        self.versions
            .choose(api, ours)
            .map_err(|theirs| KafkaError::UnsupportedVersion {
                broker: self.broker().clone(),
                api,
                ours,
                theirs,
            })
    }

    /// Sends `req` at the highest version both sides speak.
    ///
    /// # Cancel safety
    /// Cancel safe (see [`Messenger::request`]).
    pub async fn send<R: Request>(&self, req: &R) -> Result<R::Response, KafkaError> {
        self.send_within(req, R::VERSIONS, self.request_timeout)
            .await
    }

    /// Sends `req` at the highest version within `ours` both sides speak, waiting at most
    /// `timeout` (long polls pass their own).
    ///
    /// # Cancel safety
    /// Cancel safe (see [`Messenger::request`]).
    pub async fn send_within<R: Request>(
        &self,
        req: &R,
        ours: VersionRange,
        timeout: Duration,
    ) -> Result<R::Response, KafkaError> {
        let api = api_key::<R>()?;
        let version = self.version_for(api, ours)?;
        self.send_version(req, version, timeout).await
    }

    /// Sends `req` at exactly `version` (the caller negotiated it already).
    ///
    /// # Cancel safety
    /// Cancel safe (see [`Messenger::request`]).
    pub async fn send_version<R: Request>(
        &self,
        req: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<R::Response, KafkaError> {
        let api = api_key::<R>()?;
        let frame = self.messenger.request(api, version, req, timeout).await?;
        self.decode(frame, api, version)
    }

    /// The finalized level of cluster feature `name` as this broker reported it when the
    /// connection was made (e.g. `share.version`: 2 and up has group dead-letter topics).
    pub fn feature(&self, name: &str) -> Option<i16> {
        self.versions.feature(name)
    }

    /// The request timeout this connection was configured with.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    fn decode<T>(&self, frame: Bytes, api: ApiKey, version: i16) -> Result<T, KafkaError>
    where
        T: kafka_protocol::protocol::Decodable + kafka_protocol::protocol::HeaderVersion,
    {
        frame::decode_response(frame, api, version).map_err(|e| {
            // A response that does not decode means the stream cannot be trusted any more
            // (a corrupt or hostile peer): drop the connection, so that the next request opens
            // a new one, instead of reading more frames from it.
            let reason = format!("{e:#}");
            tracing::warn!(
                broker = %self.broker(),
                ?api,
                version,
                "dropping the connection: cannot decode the response: {reason}"
            );
            self.close(&format!(
                "undecodable {api:?} v{version} response: {reason}"
            ));
            KafkaError::Decode {
                broker: self.broker().clone(),
                api,
                version,
                reason,
            }
        })
    }
}

fn api_key<R: Request>() -> Result<ApiKey, KafkaError> {
    ApiKey::try_from(R::KEY).map_err(|_| KafkaError::Config(format!("unknown API key {}", R::KEY)))
}

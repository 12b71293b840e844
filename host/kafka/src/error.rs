//! Typed errors of the wire layer and the one place where broker error codes are classified.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::VersionRange;

use super::addr::{AddrError, BrokerAddr};

/// Every way talking to Kafka can fail, each variant carrying the broker and API it concerns so
/// one log line is enough to act on.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// The user's configuration cannot work (bad address, unreadable CA file, ...).
    #[error("{0}")]
    Config(String),

    /// TCP connect failed or timed out.
    #[error("cannot connect to {broker}: {reason}")]
    Connect {
        /// Where we tried to connect.
        broker: BrokerAddr,
        /// The OS or timeout reason.
        reason: String,
    },

    /// The TLS handshake failed (unknown CA, wrong host name, no TLS on the port, ...).
    #[error("TLS handshake with {broker} failed: {reason}")]
    Tls {
        /// The broker whose handshake failed.
        broker: BrokerAddr,
        /// What rustls reported.
        reason: String,
    },

    /// SASL authentication was refused or could not complete.
    #[error("SASL {mechanism} authentication to {broker} failed: {reason}")]
    Auth {
        /// The broker that refused us.
        broker: BrokerAddr,
        /// PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
        mechanism: String,
        /// The broker's message or our verification failure.
        reason: String,
    },

    /// The broker does not offer a version of an API we need.
    #[error("{broker} does not support {api:?} in versions {ours} (it offers {theirs})")]
    UnsupportedVersion {
        /// The broker in question.
        broker: BrokerAddr,
        /// The API we need.
        api: ApiKey,
        /// The versions this client can speak.
        ours: VersionRange,
        /// What the broker advertised, "none" if absent.
        theirs: String,
    },

    /// No response within the per-request timeout; the request may or may not have been
    /// processed by the broker.
    #[error("{api:?} v{version} to {broker} got no response within {timeout:?}")]
    Timeout {
        /// The broker we waited for.
        broker: BrokerAddr,
        /// The request's API.
        api: ApiKey,
        /// The request's version.
        version: i16,
        /// The timeout that elapsed.
        timeout: Duration,
    },

    /// The connection died (closed by the peer, I/O error, bad frame). Every request pending on
    /// it fails with this error; the connection is never reused.
    #[error("connection to {broker} lost: {reason}")]
    ConnectionLost {
        /// The broker whose connection died.
        broker: BrokerAddr,
        /// Why, shared by all requests that were pending.
        reason: Arc<str>,
    },

    /// A request could not be encoded (a bug or a value out of the protocol's range).
    #[error("cannot encode {api:?} v{version}: {reason}")]
    Encode {
        /// The request's API.
        api: ApiKey,
        /// The version we tried.
        version: i16,
        /// The codec's message.
        reason: String,
    },

    /// A response could not be decoded; the connection that carried it has been dropped.
    #[error("cannot decode {api:?} v{version} response from {broker}: {reason}")]
    Decode {
        /// The broker that sent it.
        broker: BrokerAddr,
        /// The response's API.
        api: ApiKey,
        /// The version we asked for.
        version: i16,
        /// The codec's message.
        reason: String,
    },

    /// The broker answered with an error code.
    #[error("{api:?} v{version} to {broker} failed with {code:?} ({code_num}){}", message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Broker {
        /// The broker that answered.
        broker: BrokerAddr,
        /// The request's API.
        api: ApiKey,
        /// The request's version.
        version: i16,
        /// The decoded error.
        code: ResponseError,
        /// The numeric code, for codes the crate does not know.
        code_num: i16,
        /// The broker's own explanation, if it gave one.
        message: Option<String>,
    },

    /// A topic or partition the caller named is not in the cluster metadata.
    #[error("unknown topic or partition: {0}")]
    UnknownTopic(String),

    /// Every bootstrap broker failed; carries each failure.
    #[error("no bootstrap broker reachable: {}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    NoBroker(Vec<KafkaError>),
}

/// What a caller should do about an error; one `match` decides it for the whole code base
/// (rskafka's lesson: classification scattered over call sites drifts apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Try the same thing again after a backoff.
    Retry,
    /// Our view of leaders or topic ids is stale: refresh metadata, then retry.
    RefreshMetadata,
    /// The group coordinator moved or is unavailable: find it again, then retry.
    RefindCoordinator,
    /// The share session is gone or out of step: re-open it at epoch 0.
    ResetSession,
    /// Retrying cannot help; surface the error to the caller.
    Fatal,
}

/// Classifies a broker error code as the Java client does (KIP-932 reference, §3).
pub fn classify(code: ResponseError) -> ErrorClass {
    use ResponseError as E;
    match code {
        E::UnknownTopicOrPartition
        | E::NotLeaderOrFollower
        | E::LeaderNotAvailable
        | E::FencedLeaderEpoch
        | E::UnknownLeaderEpoch
        | E::KafkaStorageError
        | E::UnknownTopicId
        | E::ReplicaNotAvailable => ErrorClass::RefreshMetadata,
        E::NotCoordinator | E::CoordinatorNotAvailable => ErrorClass::RefindCoordinator,
        E::ShareSessionNotFound | E::InvalidShareSessionEpoch | E::ShareSessionLimitReached => {
            ErrorClass::ResetSession
        }
        E::CoordinatorLoadInProgress
        | E::RequestTimedOut
        | E::NetworkException
        | E::NotEnoughReplicas
        | E::NotEnoughReplicasAfterAppend
        | E::ThrottlingQuotaExceeded
        | E::ConcurrentTransactions => ErrorClass::Retry,
        other if other.is_retriable() => ErrorClass::Retry,
        _ => ErrorClass::Fatal,
    }
}

impl KafkaError {
    /// The class of this error: transport failures are retried (on a new connection), broker
    /// codes go through [`classify`], everything else is fatal.
    pub fn class(&self) -> ErrorClass {
        match self {
            // A response we cannot decode is treated like a broken transport: the connection
            // that carried it is dropped (see `BrokerConnection`) and the request retried on a
            // new one, so a corrupt or hostile broker costs a reconnect, never the host.
            KafkaError::Connect { .. }
            | KafkaError::Timeout { .. }
            | KafkaError::ConnectionLost { .. }
            | KafkaError::Decode { .. }
            | KafkaError::NoBroker(_) => ErrorClass::Retry,
            KafkaError::Broker { code, .. } => classify(*code),
            KafkaError::UnknownTopic(_) => ErrorClass::RefreshMetadata,
            KafkaError::Config(_)
            | KafkaError::Tls { .. }
            | KafkaError::Auth { .. }
            | KafkaError::UnsupportedVersion { .. }
            | KafkaError::Encode { .. } => ErrorClass::Fatal,
        }
    }

    /// A short name of the error's variant, for metric labels (broker codes by their name).
    pub fn kind(&self) -> String {
        let name = match self {
            KafkaError::Broker { code, .. } => return format!("{code:?}"),
            KafkaError::Config(_) => "config",
            KafkaError::Connect { .. } => "connect",
            KafkaError::Tls { .. } => "tls",
            KafkaError::Auth { .. } => "auth",
            KafkaError::UnsupportedVersion { .. } => "unsupported_version",
            KafkaError::Timeout { .. } => "timeout",
            KafkaError::ConnectionLost { .. } => "connection_lost",
            KafkaError::Encode { .. } => "encode",
            KafkaError::Decode { .. } => "decode",
            KafkaError::UnknownTopic(_) => "unknown_topic",
            KafkaError::NoBroker(_) => "no_broker",
        };
        name.to_owned()
    }

    /// The broker error code, when the broker sent one.
    pub fn code(&self) -> Option<ResponseError> {
        match self {
            KafkaError::Broker { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Builds a [`KafkaError::Broker`] from a response's raw error code; `None` when the code is 0.
    pub fn from_code(
        broker: &BrokerAddr,
        api: ApiKey,
        version: i16,
        code: i16,
        message: Option<&str>,
    ) -> Option<KafkaError> {
        let err = ResponseError::try_from_code(code)?;
        Some(KafkaError::Broker {
            broker: broker.clone(),
            api,
            version,
            code: err,
            code_num: code,
            message: message.map(str::to_owned),
        })
    }
}

/// Shorthand for wire-layer results.
pub type Result<T, E = KafkaError> = std::result::Result<T, E>;

/// Wraps `ResponseError` for display in places that only have a code.
pub struct CodeDisplay(pub i16);

impl fmt::Display for CodeDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match ResponseError::try_from_code(self.0) {
            Some(e) => write!(f, "{e:?} ({})", self.0),
            None => write!(f, "NONE (0)"),
        }
    }
}

impl From<AddrError> for KafkaError {
    /// A bootstrap list that cannot be read is the user's configuration.
    fn from(e: AddrError) -> KafkaError {
        KafkaError::Config(e.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_session_errors_reset_the_session() {
        assert_eq!(
            classify(ResponseError::ShareSessionNotFound),
            ErrorClass::ResetSession
        );
        assert_eq!(
            classify(ResponseError::InvalidShareSessionEpoch),
            ErrorClass::ResetSession
        );
        assert_eq!(
            classify(ResponseError::ShareSessionLimitReached),
            ErrorClass::ResetSession
        );
    }

    #[test]
    fn leadership_errors_refresh_metadata() {
        for e in [
            ResponseError::NotLeaderOrFollower,
            ResponseError::FencedLeaderEpoch,
            ResponseError::UnknownTopicId,
            ResponseError::UnknownTopicOrPartition,
            ResponseError::KafkaStorageError,
        ] {
            assert_eq!(classify(e), ErrorClass::RefreshMetadata, "{e:?}");
        }
    }

    #[test]
    fn coordinator_errors_refind_or_retry() {
        assert_eq!(
            classify(ResponseError::NotCoordinator),
            ErrorClass::RefindCoordinator
        );
        assert_eq!(
            classify(ResponseError::CoordinatorNotAvailable),
            ErrorClass::RefindCoordinator
        );
        assert_eq!(
            classify(ResponseError::CoordinatorLoadInProgress),
            ErrorClass::Retry
        );
    }

    #[test]
    fn authorization_and_protocol_errors_are_fatal() {
        for e in [
            ResponseError::GroupAuthorizationFailed,
            ResponseError::TopicAuthorizationFailed,
            ResponseError::UnsupportedVersion,
            ResponseError::InvalidRequest,
            ResponseError::GroupMaxSizeReached,
            ResponseError::InvalidRecordState,
            ResponseError::SaslAuthenticationFailed,
        ] {
            assert_eq!(classify(e), ErrorClass::Fatal, "{e:?}");
        }
    }

    #[test]
    fn broker_error_message_names_api_broker_and_code() {
        let b = BrokerAddr::new("127.0.0.1", 9092).with_id(1);
        let e = KafkaError::from_code(&b, ApiKey::Metadata, 12, 3, Some("no such topic"))
            .expect("nonzero code");
        let s = e.to_string();
        assert!(s.contains("Metadata v12"), "{s}");
        assert!(s.contains("broker 1 (127.0.0.1:9092)"), "{s}");
        assert!(s.contains("UnknownTopicOrPartition (3)"), "{s}");
        assert!(s.contains("no such topic"), "{s}");
        assert!(KafkaError::from_code(&b, ApiKey::Metadata, 12, 0, None).is_none());
    }
}

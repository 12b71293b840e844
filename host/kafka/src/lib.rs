//! sharehost-kafka: the Kafka wire layer, bytes to and from brokers. It knows nothing of share
//! semantics: the share messages are encoded here, what they mean is `sharehost-share`'s.
//!
//! - [`addr`]: broker addresses and the bootstrap list.
//! - [`frame`]: length-prefixed frames with a size limit.
//! - [`bounded`]: the pre-pass that checks every length in a response before kafka-protocol
//!   allocates for it.
//! - [`messenger`]: one multiplexed, cancel-safe connection (correlation ids, reader/writer tasks).
//! - [`connection`]: TCP/TLS + ApiVersions + SASL, then typed requests at negotiated versions.
//! - [`versions`]: what a broker speaks and the version choice.
//! - [`tls`], [`sasl`]: transport security and authentication.
//! - [`client`]: the cluster: metadata, cached connections, coordinator lookup, produce/fetch/admin.
//! - [`records`]: record batches in every compression.
//! - [`idempotence`]: the idempotent producer's sequence numbers (a retried batch lands once).
//! - [`transaction`]: the transactional producer (writes to many partitions visible together).
//! - [`error`], [`backoff`]: typed errors with their one classification, and the one backoff.
//! - [`protocol`]: the messages kafka-protocol does not cover (ShareFetch and ShareAcknowledge
//!   v1-v2, DescribeShareGroupOffsets v0-1), on its public traits.
//! - [`partitioner`]: which partition a keyed record goes to, as the Java client decides.

pub mod addr;
pub mod backoff;
pub mod bounded;
pub mod client;
pub mod connection;
pub mod error;
pub mod frame;
pub mod idempotence;
pub mod messenger;
pub mod partitioner;
pub mod protocol;
pub mod records;
pub mod sasl;
pub mod tls;
pub mod transaction;
pub mod versions;

pub use addr::{AddrError, BrokerAddr, parse_bootstrap};
pub use client::{CommittedPartition, KafkaClient, OffsetSpec, TopicMeta};
pub use connection::{BrokerConnection, ConnectionConfig};
pub use error::{ErrorClass, KafkaError, classify};
pub use records::{Compression, ConsumedRecord, Header, ProduceRecord, now_ms};
pub use sasl::{Mechanism, SaslSettings, Secret};
pub use tls::TlsSettings;
pub use transaction::{Landed, Transaction, TransactionalProducer, TxnError};

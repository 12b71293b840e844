//! Many hosts operated as one, through Kafka. The manifest stays each host's boundary (cluster,
//! keys, every pipeline's grants); the fleet carries what must be the same on every host and
//! changes often: which component version each pipeline runs, its shadows and canaries, and the
//! component bytes. State lives in three topics of the cluster the hosts already use, so Kafka
//! is the only distributed engine: no host leads, every host folds the same records in the same
//! order to the same state.
//!
//! The rooms, from the bottom:
//! - [`records`]: what the topics carry (signed actions, decisions, statuses), bounded decoding;
//! - [`desired`]: the pure reducer from records to what the fleet wants of each pipeline;
//! - [`sign`]: operator actions signed and verified with minisign keys;
//! - [`topics`]: the three topics created with their configs, or refused naming the config;
//! - [`hosts`]: every host's latest status, bounded, aged and watched for two writers;
//! - [`components`]: component bytes through Kafka in chunks, checked against their digest;
//! - [`agent`]: a host's part: converge before the first batch, follow, report, decide canaries;
//! - [`operator`]: what `sharehost fleet` does (deploy, rollback, canary, status).

pub mod agent;
pub mod components;
pub mod desired;
pub mod hosts;
pub mod operator;
pub mod records;
pub mod sign;
pub mod topics;

pub use agent::{Fleet, FleetView};

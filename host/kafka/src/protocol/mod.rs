//! Messages encoded here because kafka-protocol does not cover them (or not at the versions
//! sharehost speaks), written on its public `Encodable`/`Decodable` traits and primitives.
//!
//! - [`codec`]: the primitive encoders kafka-protocol keeps crate-private, bounded on decode.
//! - [`share`]: ShareFetch and ShareAcknowledge v1-v2 (renew, acquisition modes).
//! - [`share_offsets`]: DescribeShareGroupOffsets v0-1, a share group's lag per partition.

pub mod codec;
pub mod share;
pub mod share_offsets;

//! The header names the host adds to what it writes, in one place: outputs name their source
//! record (`sharehost.source.*`), dead letters their original record and why it was rejected
//! (`sharehost.original.*` and the rest). Consumers de-duplicate and replay by these names, so
//! they are spelled once, here. Every name starts with the prefix a plugin may not emit
//! ([`crate::runtime::RESERVED_HEADER_PREFIX`]), so none can be forged by a guest.

/// An output's source topic.
pub const SOURCE_TOPIC: &str = "sharehost.source.topic";
/// An output's source partition.
pub const SOURCE_PARTITION: &str = "sharehost.source.partition";
/// An output's source offset.
pub const SOURCE_OFFSET: &str = "sharehost.source.offset";
/// The delivery count of an output's source when it was judged.
pub const SOURCE_DELIVERY_COUNT: &str = "sharehost.source.delivery-count";

/// A dead letter's original topic.
pub const ORIGINAL_TOPIC: &str = "sharehost.original.topic";
/// A dead letter's original partition.
pub const ORIGINAL_PARTITION: &str = "sharehost.original.partition";
/// A dead letter's original offset.
pub const ORIGINAL_OFFSET: &str = "sharehost.original.offset";
/// The delivery count of a dead letter's original record when it was rejected.
pub const ORIGINAL_DELIVERY_COUNT: &str = "sharehost.original.delivery-count";
/// How dead letters written before the names were unified spelled the delivery count; read,
/// never written.
pub const LEGACY_DELIVERY_COUNT: &str = "sharehost.delivery.count";
/// Why the record was rejected.
pub const REASON: &str = "sharehost.reason";
/// The pipeline that rejected it.
pub const PIPELINE: &str = "sharehost.pipeline";
/// The component that judged it.
pub const PLUGIN: &str = "sharehost.plugin";
/// The content hash of the version that judged it.
pub const PLUGIN_VERSION: &str = "sharehost.plugin.version";
/// The key id that signed that version, when signed.
pub const PLUGIN_SIGNER: &str = "sharehost.plugin.signer";
/// Set on a dead letter written without the record's key, value and headers because the
/// whole record was larger than the dead-letter topic accepts: the original size in bytes.
pub const DROPPED_BYTES: &str = "sharehost.dropped-bytes";

/// The header a replayed record carries: the dead letter it came from, `TOPIC/PARTITION/OFFSET`.
pub const REPLAYED_FROM: &str = "sharehost.replayed-from";

/// Every header a dead letter may carry; a replay removes them again.
pub const DEAD_LETTER_HEADERS: [&str; 11] = [
    ORIGINAL_TOPIC,
    ORIGINAL_PARTITION,
    ORIGINAL_OFFSET,
    ORIGINAL_DELIVERY_COUNT,
    LEGACY_DELIVERY_COUNT,
    REASON,
    PIPELINE,
    PLUGIN,
    PLUGIN_VERSION,
    PLUGIN_SIGNER,
    DROPPED_BYTES,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_one_a_plugin_may_not_emit() {
        let written = [
            SOURCE_TOPIC,
            SOURCE_PARTITION,
            SOURCE_OFFSET,
            SOURCE_DELIVERY_COUNT,
            REPLAYED_FROM,
        ];
        for name in written.iter().chain(&DEAD_LETTER_HEADERS) {
            assert!(
                name.starts_with(crate::runtime::RESERVED_HEADER_PREFIX),
                "{name}"
            );
        }
    }
}

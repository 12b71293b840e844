//! Component bytes through Kafka: uploaded once per digest in chunks keyed by digest and index,
//! fetched by a host from the offsets its deployment names (or, when those are gone, by a scan
//! for the digest), and checked against the digest before anything else looks at them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::records::{CHUNK_BYTES, ComponentRef, chunk_key};
use crate::kafka::{Compression, KafkaClient, KafkaError, OffsetSpec, ProduceRecord};
use crate::pipeline::short;
use crate::runtime::SIGNATURE_SUFFIX;

/// Why a component could not be moved through Kafka.
#[derive(Debug, thiserror::Error)]
pub enum ComponentError {
    /// The cluster failed.
    #[error("{0}")]
    Kafka(#[from] KafkaError),
    /// Its chunks were not found, or do not add up to its digest.
    #[error("component {digest}: {reason}")]
    Bad {
        /// Its digest.
        digest: String,
        /// What is wrong.
        reason: String,
    },
    /// The host cannot write it where it keeps fleet components.
    #[error("cannot keep component {digest} in {dir}: {error}")]
    Store {
        /// Its digest.
        digest: String,
        /// The folder.
        dir: String,
        /// What the file system said.
        error: std::io::Error,
    },
}

/// The SHA-256 of `bytes`, hex (the runtime's content hash of a component).
pub fn digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Uploads `bytes` (whose digest is `digest`) to partition 0 of `topic`, one record per chunk
/// of at most [`CHUNK_BYTES`]; returns each chunk's offset.
pub async fn upload(
    client: &KafkaClient,
    topic: &str,
    digest: &str,
    bytes: &[u8],
) -> Result<Vec<i64>, ComponentError> {
    let mut offsets = Vec::new();
    for (i, chunk) in bytes.chunks(CHUNK_BYTES).enumerate() {
        let record = ProduceRecord {
            key: Some(Bytes::from(chunk_key(digest, i))),
            value: Some(Bytes::copy_from_slice(chunk)),
            headers: Vec::new(),
            timestamp: None,
        };
        offsets.push(
            client
                .produce(topic, 0, &[record], Compression::None)
                .await?,
        );
    }
    Ok(offsets)
}

/// A record of the components topic read while fetching a component and found not to be one
/// of its chunks as the fleet writes them: the caller counts and logs it like the other
/// topics' bad records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Its offset.
    pub offset: i64,
    /// A short name for the metric's reason label.
    pub kind: &'static str,
    /// The whole reason.
    pub why: String,
}

/// How many chunks a component of `size` bytes has.
fn chunk_count(size: u64) -> u64 {
    size.div_ceil(CHUNK_BYTES as u64).max(1)
}

/// Reads `c`'s bytes from `topic`: from the offsets it names, and by a scan of the topic for
/// its digest when they do not hold its chunks (the topic was compacted after a second upload
/// of the same digest). The bytes are checked against the digest and size before they are
/// returned, so bytes that do not hash to it are never kept or compiled; records found not to
/// be chunks (foreign keys, no value, oversized, or chunks that do not add up to the digest)
/// are added to `skipped`.
pub async fn download(
    client: &KafkaClient,
    topic: &str,
    c: &ComponentRef,
    skipped: &mut Vec<Skipped>,
) -> Result<Vec<u8>, ComponentError> {
    let bad = |reason: String| ComponentError::Bad {
        digest: c.digest.clone(),
        reason,
    };
    let mut out = Vec::with_capacity(usize::try_from(c.size).unwrap_or(0).min(256 << 20));
    let mut by_offsets = true;
    for (i, &offset) in c.chunks.iter().enumerate() {
        let got = client.fetch(topic, 0, offset, Duration::ZERO).await?;
        let chunk = got
            .records
            .into_iter()
            .find(|r| r.offset == offset)
            .filter(|r| r.key.as_deref() == Some(chunk_key(&c.digest, i).as_bytes()));
        match chunk
            .and_then(|r| r.value)
            .filter(|v| v.len() <= CHUNK_BYTES)
        {
            Some(v) if out.len() as u64 + v.len() as u64 <= c.size => out.extend_from_slice(&v),
            _ => {
                by_offsets = false;
                break;
            }
        }
    }
    if by_offsets && digest(&out) != c.digest {
        skipped.push(Skipped {
            offset: c.chunks.first().copied().unwrap_or(-1),
            kind: "bad_chunk",
            why: format!(
                "the chunks at the offsets the deployment of {} names add up to digest {}, not its own: not kept",
                short(&c.digest),
                crate::pipeline::short(&digest(&out))
            ),
        });
    }
    if !by_offsets || digest(&out) != c.digest {
        tracing::info!(digest = %short(&c.digest), "the component's chunks are not at the offsets its deployment names: scanning the components topic");
        out = scan(client, topic, c, skipped).await?;
    }
    if out.len() as u64 != c.size || digest(&out) != c.digest {
        return Err(bad(format!(
            "its chunks in the components topic add up to {} bytes of digest {}, not the {} bytes of the digest its deployment names: a chunk was forged or damaged; not kept, the pipeline keeps its version",
            out.len(),
            crate::pipeline::short(&digest(&out)),
            c.size
        )));
    }
    Ok(out)
}

/// Finds `c`'s chunks anywhere in the topic (the last copy of each index wins, as compaction
/// would keep it).
async fn scan(
    client: &KafkaClient,
    topic: &str,
    c: &ComponentRef,
    skipped: &mut Vec<Skipped>,
) -> Result<Vec<u8>, ComponentError> {
    let count = chunk_count(c.size);
    let mut chunks: BTreeMap<usize, Bytes> = BTreeMap::new();
    let end = client.list_offset(topic, 0, OffsetSpec::Latest).await?;
    let mut at = client.list_offset(topic, 0, OffsetSpec::Earliest).await?;
    while at < end {
        let got = client.fetch(topic, 0, at, Duration::ZERO).await?;
        let Some(last) = got.records.last().map(|r| r.offset) else {
            break;
        };
        for r in got.records {
            let Some((d, i)) = r.key.as_deref().and_then(parse_chunk_key) else {
                skipped.push(Skipped {
                    offset: r.offset,
                    kind: "unknown_key",
                    why: format!(
                        "not a chunk: its key {:?} is not DIGEST/INDEX",
                        r.key.as_deref().map(|k| String::from_utf8_lossy(k)
                            .chars()
                            .take(80)
                            .collect::<String>())
                    ),
                });
                continue;
            };
            if d != c.digest {
                continue;
            }
            match r.value {
                None => skipped.push(Skipped {
                    offset: r.offset,
                    kind: "no_value",
                    why: format!("chunk {i} of {} has no value", short(&c.digest)),
                }),
                Some(v) if v.len() > CHUNK_BYTES => skipped.push(Skipped {
                    offset: r.offset,
                    kind: "too_large",
                    why: format!(
                        "chunk {i} of {} has {} bytes, more than the {CHUNK_BYTES} a chunk may have",
                        short(&c.digest),
                        v.len()
                    ),
                }),
                Some(_) if i as u64 >= count => skipped.push(Skipped {
                    offset: r.offset,
                    kind: "unknown_key",
                    why: format!(
                        "chunk {i} of {}, which has {count} chunks",
                        short(&c.digest)
                    ),
                }),
                Some(v) => {
                    chunks.insert(i, v);
                }
            }
        }
        at = last + 1;
    }
    let n = chunks.len();
    if n == 0 || n as u64 != count || chunks.keys().next_back() != Some(&(n - 1)) {
        return Err(ComponentError::Bad {
            digest: c.digest.clone(),
            reason: format!(
                "the components topic {topic} holds {n} of its chunks, not all of them"
            ),
        });
    }
    Ok(chunks.into_values().flat_map(|b| b.to_vec()).collect())
}

/// Reads a chunk's key: 64 lower-case hex digits of a digest, a slash, the chunk's index;
/// `None` for anything else (a record of the components topic that is not a chunk).
pub fn parse_chunk_key(key: &[u8]) -> Option<(&str, usize)> {
    let key = std::str::from_utf8(key).ok()?;
    let (d, i) = key.split_once('/')?;
    let hex = d.len() == 64 && d.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let index = (!i.is_empty() && i.len() <= 9 && i.bytes().all(|b| b.is_ascii_digit()))
        .then(|| i.parse::<usize>().ok())
        .flatten()?;
    hex.then_some((d, index))
}

/// Where a host keeps the fleet's components: `dir/DIGEST.wasm` beside its signature, so a
/// swap loads it like any component file (its signature checked against the pipeline's keys,
/// its compiled code cached by content).
pub fn store(dir: &Path, c: &ComponentRef, bytes: &[u8]) -> Result<PathBuf, ComponentError> {
    let fail = |error| ComponentError::Store {
        digest: c.digest.clone(),
        dir: dir.display().to_string(),
        error,
    };
    std::fs::create_dir_all(dir).map_err(fail)?;
    let path = dir.join(format!("{}.wasm", c.digest));
    crate::persisted::write_atomically(&path, bytes).map_err(fail)?;
    let mut sig = path.clone().into_os_string();
    sig.push(SIGNATURE_SUFFIX);
    crate::persisted::write_atomically(Path::new(&sig), c.signature.as_bytes()).map_err(fail)?;
    Ok(path)
}

/// Writes `c`'s signature beside its kept file `path` (the same bytes may come with another
/// signature in a later deployment).
pub fn store_signature(path: &Path, c: &ComponentRef) -> Result<(), ComponentError> {
    let mut sig = path.to_path_buf().into_os_string();
    sig.push(SIGNATURE_SUFFIX);
    let sig = PathBuf::from(sig);
    if std::fs::read_to_string(&sig).ok().as_deref() == Some(c.signature.as_str()) {
        return Ok(());
    }
    crate::persisted::write_atomically(&sig, c.signature.as_bytes()).map_err(|error| {
        ComponentError::Store {
            digest: c.digest.clone(),
            dir: path.display().to_string(),
            error,
        }
    })
}

/// The path of a component kept by [`store`] when its bytes are there and whole.
pub fn stored(dir: &Path, c: &ComponentRef) -> Option<PathBuf> {
    let path = dir.join(format!("{}.wasm", c.digest));
    let bytes = std::fs::read(&path).ok()?;
    (digest(&bytes) == c.digest).then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_digest_slash_index_is_a_chunk_key() {
        let d = "ab".repeat(32);
        assert_eq!(
            parse_chunk_key(chunk_key(&d, 7).as_bytes()),
            Some((d.as_str(), 7))
        );
        for bad in [
            "junk".to_owned(),
            format!("{d}/"),
            format!("{d}/-1"),
            format!("{d}/99999999999999999999"),
            format!("{}/000001", "AB".repeat(32)),
            format!("{}/000001", "ab".repeat(31)),
            "€/1".to_owned(),
        ] {
            assert_eq!(parse_chunk_key(bad.as_bytes()), None, "{bad}");
        }
        assert_eq!(parse_chunk_key(&[0xff, b'/', b'1']), None);
        assert_eq!(chunk_count(0), 1);
        assert_eq!(chunk_count(CHUNK_BYTES as u64 + 1), 2);
    }
}

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

/// Reads `c`'s bytes from `topic`: from the offsets it names, and by a scan of the topic for
/// its digest when they do not hold its chunks (the topic was compacted after a second upload
/// of the same digest). The bytes are checked against the digest and size.
pub async fn download(
    client: &KafkaClient,
    topic: &str,
    c: &ComponentRef,
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
        match chunk.and_then(|r| r.value) {
            Some(v) => out.extend_from_slice(&v),
            None => {
                by_offsets = false;
                break;
            }
        }
    }
    if !by_offsets || digest(&out) != c.digest {
        tracing::info!(digest = %c.short(), "the component's chunks are not at the offsets its deployment names: scanning the components topic");
        out = scan(client, topic, c).await?;
    }
    if out.len() as u64 != c.size || digest(&out) != c.digest {
        return Err(bad(format!(
            "its chunks add up to {} bytes of digest {}, not {} bytes of its digest",
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
) -> Result<Vec<u8>, ComponentError> {
    let prefix = format!("{}/", c.digest);
    let mut chunks: BTreeMap<usize, Bytes> = BTreeMap::new();
    let end = client.list_offset(topic, 0, OffsetSpec::Latest).await?;
    let mut at = client.list_offset(topic, 0, OffsetSpec::Earliest).await?;
    while at < end {
        let got = client.fetch(topic, 0, at, Duration::ZERO).await?;
        let Some(last) = got.records.last().map(|r| r.offset) else {
            break;
        };
        for r in got.records {
            let index = r
                .key
                .as_deref()
                .and_then(|k| k.strip_prefix(prefix.as_bytes()))
                .and_then(|i| std::str::from_utf8(i).ok())
                .and_then(|i| i.parse::<usize>().ok());
            if let (Some(i), Some(v)) = (index, r.value) {
                chunks.insert(i, v);
            }
        }
        at = last + 1;
    }
    let n = chunks.len();
    if n == 0 || chunks.keys().next_back() != Some(&(n - 1)) {
        return Err(ComponentError::Bad {
            digest: c.digest.clone(),
            reason: format!(
                "the components topic {topic} holds {n} of its chunks, not all of them"
            ),
        });
    }
    Ok(chunks.into_values().flat_map(|b| b.to_vec()).collect())
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
    crate::state::write_atomically(&path, bytes).map_err(fail)?;
    let mut sig = path.clone().into_os_string();
    sig.push(SIGNATURE_SUFFIX);
    crate::state::write_atomically(Path::new(&sig), c.signature.as_bytes()).map_err(fail)?;
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
    crate::state::write_atomically(&sig, c.signature.as_bytes()).map_err(|error| {
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

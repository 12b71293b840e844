//! `[trust]` and `[pipeline.trust]`: the minisign public keys a component must be signed by,
//! inline and/or in a keys file, read into the runtime's [`TrustPolicy`].

use std::path::Path;
use std::sync::Arc;

use toml::Spanned;

use super::context::Ctx;
use super::error::ManifestError;
use super::raw::RawTrust;
use crate::runtime::{TrustPolicy, TrustedKey, parse_keys_file};

/// The largest keys file read: a public key line is 56 bytes, so 64 KiB is hundreds of keys.
const MAX_KEYS_FILE_BYTES: u64 = 64 << 10;

/// Validates a trust table (`field` is `trust` or `pipeline[i].trust`): its inline keys and
/// its keys file together. A table that names no key is refused: it would either trust nobody
/// or, for a pipeline, silently drop the host's keys.
pub(super) fn validate(
    cx: &Ctx<'_>,
    raw: &Spanned<RawTrust>,
    field: &str,
) -> Result<Arc<TrustPolicy>, ManifestError> {
    let t = raw.get_ref();
    let mut keys = Vec::new();
    if let Some(list) = &t.keys {
        for (i, k) in list.get_ref().iter().enumerate() {
            keys.push(
                TrustedKey::parse(k.get_ref())
                    .map_err(|e| cx.err(Some(k.span()), format!("{field}.keys[{i}]"), e))?,
            );
        }
    }
    if let Some(file) = &t.keys_file {
        let path = cx.path(file);
        let text = read_keys_file(&path)
            .and_then(|text| parse_keys_file(&text).map_err(|e| format!("{}: {e}", path.display())))
            .map_err(|e| cx.err(Some(file.span()), format!("{field}.keys_file"), e))?;
        keys.extend(text);
    }
    TrustPolicy::new(keys).map(Arc::new).ok_or_else(|| {
        cx.err(
            Some(raw.span()),
            field,
            "names no key: list minisign public keys in `keys = [\"RW...\"]` or `keys_file` (a pipeline cannot opt out of the host's [trust])",
        )
    })
}

/// Reads a `keys_file`: a regular file of at most [`MAX_KEYS_FILE_BYTES`].
fn read_keys_file(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let cannot = |e: std::io::Error| format!("cannot read {}: {e}", path.display());
    let file = std::fs::File::open(path).map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    let mut text = String::new();
    file.take(MAX_KEYS_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(cannot)?;
    if text.len() as u64 > MAX_KEYS_FILE_BYTES {
        return Err(format!(
            "{} is larger than a keys file's {} KiB maximum",
            path.display(),
            MAX_KEYS_FILE_BYTES >> 10
        ));
    }
    Ok(text)
}

//! `[trust]` and `[pipeline.trust]`: the minisign public keys a component must be signed by,
//! inline and/or in a keys file, read into the runtime's [`TrustPolicy`].

use std::path::Path;
use std::sync::Arc;

use toml::Spanned;

use super::context::Ctx;
use super::error::ManifestError;
use super::raw::RawTrust;
use crate::runtime::fs::{FileError, read_regular_text};
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

/// Reads a `keys_file`: a regular file of at most [`MAX_KEYS_FILE_BYTES`], through the
/// bounded reader every file of the host goes through (a FIFO is refused without blocking).
fn read_keys_file(path: &Path) -> Result<String, String> {
    read_regular_text(path, MAX_KEYS_FILE_BYTES).map_err(|e| match e {
        FileError::TooLarge { .. } => format!(
            "{} is larger than a keys file's {} KiB maximum",
            path.display(),
            MAX_KEYS_FILE_BYTES >> 10
        ),
        e => format!("cannot read {e}"),
    })
}

#[cfg(test)]
mod tests {
    use crate::manifest::PipelineSpec;
    use crate::manifest::testing::{MINIMAL, dir, parse};

    /// Two minisign public keys (their secret halves were never kept) and their ids.
    const ALICE: &str = "RWRHs4BcChVSimkp37yexDX7kT2h9Qc3la9J7aDfSJlRObr3f7mo+D3W";
    const ALICE_ID: &str = "8A52150A5C80B347";
    const BOB: &str = "RWQBAgMEBQYHCAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    const BOB_ID: &str = "0807060504030201";

    #[test]
    fn trusted_keys_come_from_the_host_or_replace_it_per_pipeline() {
        // No [trust]: no signature needed.
        let m = parse(MINIMAL).expect("valid");
        assert!(m.trust.is_none() && m.pipelines[0].trust.is_none());
        // The host's keys apply to every pipeline without its own.
        let text = format!("[trust]\nkeys = [\"{ALICE}\"]\n{MINIMAL}");
        let m = parse(&text).expect("valid");
        let ids = |p: &PipelineSpec| p.trust.as_ref().map(|t| t.key_ids().join(","));
        assert_eq!(ids(&m.pipelines[0]).as_deref(), Some(ALICE_ID));
        // A pipeline's own list replaces the host's; a keys file adds to the inline keys.
        let keys = dir().join("trusted.pub");
        std::fs::write(
            &keys,
            format!("untrusted comment: minisign public key {BOB_ID}\n{BOB}\n"),
        )
        .expect("write");
        let own = format!("{text}[pipeline.trust]\nkeys_file = \"trusted.pub\"\n");
        let m = parse(&own).expect("valid");
        assert_eq!(ids(&m.pipelines[0]).as_deref(), Some(BOB_ID));
        assert_eq!(
            m.trust.as_ref().map(|t| t.key_ids().join(",")).as_deref(),
            Some(ALICE_ID)
        );
        let both = own.replace(
            "keys_file = ",
            &format!("keys = [\"{ALICE}\"]\nkeys_file = "),
        );
        let m = parse(&both).expect("valid");
        assert_eq!(
            ids(&m.pipelines[0]).as_deref(),
            Some(format!("{ALICE_ID},{BOB_ID}").as_str())
        );
    }

    #[test]
    fn a_bad_trusted_key_or_an_empty_trust_table_is_refused_naming_the_field() {
        std::fs::write(dir().join("not-keys.pub"), "not a key\n").expect("write");
        for (text, field, why) in [
            (
                format!("[trust]\nkeys = [\"{ALICE}\", \"RWQnope\"]\n{MINIMAL}"),
                "trust.keys[1]",
                "is not base64",
            ),
            (
                format!("{MINIMAL}[pipeline.trust]\nkeys = [\"aGVsbG8=\"]\n"),
                "pipeline[0].trust.keys[0]",
                "not a minisign public key",
            ),
            (
                format!("[trust]\nkeys = [\"{ALICE}\"]\n{MINIMAL}[pipeline.trust]\nkeys = []\n"),
                "pipeline[0].trust",
                "cannot opt out",
            ),
            (
                format!("[trust]\nkeys_file = \"absent.pub\"\n{MINIMAL}"),
                "trust.keys_file",
                "cannot read",
            ),
            (
                format!("[trust]\nkeys_file = \"not-keys.pub\"\n{MINIMAL}"),
                "trust.keys_file",
                "line 1: ",
            ),
        ] {
            let e = parse(&text).expect_err(field);
            assert_eq!(e.field.as_deref(), Some(field), "{e}");
            assert!(e.message.contains(why), "{e}");
            assert!(e.line.is_some(), "{e}");
        }
        let e = parse(&format!("[trust]\nkey = [\"{ALICE}\"]\n{MINIMAL}")).expect_err("typo");
        assert!(e.message.contains("unknown field `key`"), "{e}");
    }
}

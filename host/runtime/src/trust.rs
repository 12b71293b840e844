//! Signed components: which publishers a pipeline trusts, and the check every load makes
//! before a component's bytes reach a parser or the compiler.
//!
//! A [`TrustPolicy`] is a list of minisign public keys (the manifest's `[trust]`, see
//! `docs/manifest.md`). When a pipeline has one, every component it loads must come with a
//! detached minisign signature beside it, `NAME.wasm.minisig` (what `minisign -Sm NAME.wasm`
//! writes), made by one of those keys over exactly the bytes the runtime read. Anything else is
//! refused with a [`TrustRefusal`] saying which: no signature, a malformed one, a key not
//! trusted (its id shown), or a signature that does not match the bytes.
//!
//! Verification is `minisign-verify` (pure Rust, Ed25519 over the BLAKE2b-512 of the file, and
//! a second signature over the trusted comment). The key id is minisign's: the 8 bytes after
//! the algorithm, shown as minisign shows them (`minisign public key 8A52150A5C80B347`).

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;

use crate::fs::{FileError, read_regular};

/// The largest `.minisig` file read: a signature is about 300 bytes with its comments, so
/// anything much bigger is not one (and is not read into memory).
pub const MAX_SIGNATURE_BYTES: u64 = 64 << 10;

/// The suffix of a detached signature: `plugin.wasm` is signed by `plugin.wasm.minisig`.
pub const SIGNATURE_SUFFIX: &str = ".minisig";

/// One trusted minisign public key.
#[derive(Clone, PartialEq, Eq)]
pub struct TrustedKey {
    /// The key id as minisign shows it (16 upper-case hex digits).
    id: String,
    key: minisign_verify::PublicKey,
}

impl fmt::Debug for TrustedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TrustedKey({})", self.id)
    }
}

impl TrustedKey {
    /// Reads a public key as `minisign -G` prints it: the base64 line (`RW...`). Errors say
    /// what is wrong with it, without quoting more than its first characters.
    pub fn parse(base64_key: &str) -> Result<TrustedKey, String> {
        let text = base64_key.trim();
        let raw = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|_| format!("{} is not base64", preview(text)))?;
        // 2 bytes of algorithm ("Ed"), 8 of key id, 32 of Ed25519 key.
        if raw.len() != 42 || &raw[..2] != b"Ed" {
            return Err(format!(
                "{} is not a minisign public key (the base64 line of a .pub file, 56 characters starting RW)",
                preview(text)
            ));
        }
        let key = minisign_verify::PublicKey::from_base64(text)
            .map_err(|e| format!("{} is not a minisign public key: {e}", preview(text)))?;
        Ok(TrustedKey {
            id: key_id_hex(&raw[2..10]),
            key,
        })
    }

    /// The key id as minisign shows it, e.g. `8A52150A5C80B347`: what `/pipelines`, metrics
    /// and dead letters name the signer by.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// Reads every public key of a keys file: minisign `.pub` files put one after the other
/// (`cat alice.pub bob.pub > trusted.pub`). Blank lines, `untrusted comment:` lines and `#`
/// comments are skipped; every other line is a base64 key. Errors name the 1-based line.
pub fn parse_keys_file(text: &str) -> Result<Vec<TrustedKey>, String> {
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with("untrusted comment:") {
            continue;
        }
        keys.push(TrustedKey::parse(line).map_err(|e| format!("line {}: {e}", i + 1))?);
    }
    if keys.is_empty() {
        return Err("holds no public key".into());
    }
    Ok(keys)
}

/// The first characters of a value, for an error that must not print a long blob.
fn preview(s: &str) -> String {
    let head: String = s.chars().take(12).collect();
    if head.len() < s.len() {
        format!("{head:?}...")
    } else {
        format!("{head:?}")
    }
}

/// minisign's key id display: the 8 id bytes read as a little-endian number, in hex.
fn key_id_hex(id: &[u8]) -> String {
    id.iter().rev().map(|b| format!("{b:02X}")).collect()
}

/// The publishers a pipeline trusts: a component loads only with a valid signature by one of
/// them. Shared by every load of the pipeline (cheap to clone behind an `Arc`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustPolicy {
    keys: Vec<TrustedKey>,
}

impl TrustPolicy {
    /// A policy of these keys (duplicates by id kept once); `None` for no key, since a policy
    /// that trusts nobody would refuse everything.
    pub fn new(keys: impl IntoIterator<Item = TrustedKey>) -> Option<TrustPolicy> {
        let mut out: Vec<TrustedKey> = Vec::new();
        for k in keys {
            if !out.iter().any(|o| o.id == k.id) {
                out.push(k);
            }
        }
        (!out.is_empty()).then_some(TrustPolicy { keys: out })
    }

    /// The trusted key ids, in manifest order.
    pub fn key_ids(&self) -> Vec<&str> {
        self.keys.iter().map(|k| k.id.as_str()).collect()
    }

    /// Checks that `bytes`, read from `component`, carry a valid signature by a trusted key in
    /// `component` + `.minisig`; returns the signer's key id. Call it with the bytes that will
    /// be compiled (never a second read of the path, which could find other bytes).
    pub fn verify(&self, component: &Path, bytes: &[u8]) -> Result<String, TrustRefusal> {
        let sig_path = signature_path(component);
        let text = read_signature(&sig_path)?;
        self.verify_signed(&sig_path, bytes, &text)
    }

    /// Checks that `text` (a minisign signature, as a `.minisig` file holds it) signs `bytes`
    /// by a trusted key; returns the signer's key id. `named` names the signature in the
    /// refusal (a file, or where the signature came from: a record of a fleet topic).
    pub fn verify_signed(
        &self,
        named: &Path,
        bytes: &[u8],
        text: &str,
    ) -> Result<String, TrustRefusal> {
        if text.len() > MAX_SIGNATURE_BYTES as usize {
            return Err(TrustRefusal::MalformedSignature {
                signature: named.to_owned(),
                reason: format!(
                    "{} bytes, more than a signature's {MAX_SIGNATURE_BYTES}-byte maximum",
                    text.len()
                ),
            });
        }
        let malformed = |reason: &str| TrustRefusal::MalformedSignature {
            signature: named.to_owned(),
            reason: reason.to_owned(),
        };
        let signature = minisign_verify::Signature::decode(text)
            .map_err(|e| malformed(&format!("not a minisign signature ({e})")))?;
        // minisign-verify keeps the key id private; it is bytes 2..10 of the second line.
        let id = text
            .lines()
            .nth(1)
            .and_then(|l| {
                base64::engine::general_purpose::STANDARD
                    .decode(l.trim())
                    .ok()
            })
            .filter(|raw| raw.len() == 74)
            .map(|raw| key_id_hex(&raw[2..10]))
            .ok_or_else(|| malformed("its signature line is not 74 bytes of base64"))?;
        let Some(key) = self.keys.iter().find(|k| k.id == id) else {
            return Err(TrustRefusal::UnknownKey {
                key_id: id,
                trusted: self.keys.iter().map(|k| k.id.clone()).collect(),
            });
        };
        // Legacy (non-prehashed) signatures of minisign before 0.8 are accepted: they sign the
        // same bytes with the same key, only without hashing them first.
        key.key
            .verify(bytes, &signature, true)
            .map_err(|e| match e {
                minisign_verify::Error::InvalidSignature => {
                    TrustRefusal::BadSignature { key_id: id.clone() }
                }
                other => malformed(&other.to_string()),
            })?;
        Ok(id)
    }
}

/// Where the detached signature of `component` is expected: the same path plus `.minisig`.
pub fn signature_path(component: &Path) -> PathBuf {
    let mut s = component.as_os_str().to_owned();
    s.push(SIGNATURE_SUFFIX);
    PathBuf::from(s)
}

/// Reads a signature file: a regular file (a FIFO cannot hang the load, `/dev/zero` cannot
/// fill memory) of at most [`MAX_SIGNATURE_BYTES`], in UTF-8.
fn read_signature(path: &Path) -> Result<String, TrustRefusal> {
    let bytes = read_regular(path, MAX_SIGNATURE_BYTES).map_err(|e| match e {
        FileError::Read { error, .. } if error.kind() == std::io::ErrorKind::NotFound => {
            TrustRefusal::NoSignature {
                signature: path.to_owned(),
            }
        }
        FileError::TooLarge { size, .. } => TrustRefusal::MalformedSignature {
            signature: path.to_owned(),
            reason: format!(
                "{size} bytes, more than a signature's {MAX_SIGNATURE_BYTES}-byte maximum"
            ),
        },
        FileError::NotAFile { .. } => TrustRefusal::UnreadableSignature {
            signature: path.to_owned(),
            reason: "not a regular file".into(),
        },
        FileError::Read { error, .. } => TrustRefusal::UnreadableSignature {
            signature: path.to_owned(),
            reason: error.to_string(),
        },
    })?;
    String::from_utf8(bytes).map_err(|_| TrustRefusal::MalformedSignature {
        signature: path.to_owned(),
        reason: "not text (a minisign signature is four lines of text)".into(),
    })
}

/// Why a component was refused by its pipeline's trust policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrustRefusal {
    /// No signature file beside the component.
    NoSignature {
        /// Where it was expected (`COMPONENT.minisig`).
        signature: PathBuf,
    },
    /// The signature file exists but cannot be read (permissions, not a regular file).
    UnreadableSignature {
        /// The signature file.
        signature: PathBuf,
        /// What the file system said.
        reason: String,
    },
    /// The signature file is not a minisign signature (or is too large to be one).
    MalformedSignature {
        /// The signature file.
        signature: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A valid-looking signature by a key the pipeline does not trust.
    UnknownKey {
        /// The signer's key id.
        key_id: String,
        /// The ids the pipeline trusts.
        trusted: Vec<String>,
    },
    /// A trusted key's signature that does not match the component's bytes (or its trusted
    /// comment was altered): the file changed since it was signed, or it signs another file.
    BadSignature {
        /// The signer's key id.
        key_id: String,
    },
}

impl TrustRefusal {
    /// A stable lower-case name of the reason, for metrics labels and JSON.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::NoSignature { .. } => "no_signature",
            Self::UnreadableSignature { .. } => "unreadable_signature",
            Self::MalformedSignature { .. } => "malformed_signature",
            Self::UnknownKey { .. } => "unknown_key",
            Self::BadSignature { .. } => "bad_signature",
        }
    }
}

impl fmt::Display for TrustRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoSignature { signature } => write!(
                f,
                "no signature: expected {} beside it (sign it with `minisign -Sm FILE`; see docs/signing.md)",
                signature.display()
            ),
            Self::UnreadableSignature { signature, reason } => {
                write!(
                    f,
                    "cannot read the signature {}: {reason}",
                    signature.display()
                )
            }
            Self::MalformedSignature { signature, reason } => {
                write!(f, "malformed signature {}: {reason}", signature.display())
            }
            Self::UnknownKey { key_id, trusted } => write!(
                f,
                "signed by unknown key {key_id} (the pipeline trusts {})",
                trusted.join(", ")
            ),
            Self::BadSignature { key_id } => write!(
                f,
                "bad signature: the signature by trusted key {key_id} does not match the component's bytes (the file changed since it was signed, or the signature is another file's)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key pair and a signer made by the `minisign` crate, as `minisign -G` and `-S` would.
    struct Signer {
        pk: minisign::PublicKey,
        sk: minisign::SecretKey,
    }

    impl Signer {
        fn new() -> Signer {
            let kp = minisign::KeyPair::generate_unencrypted_keypair().expect("keypair");
            Signer {
                pk: kp.pk,
                sk: kp.sk,
            }
        }

        fn trusted(&self) -> TrustedKey {
            TrustedKey::parse(&self.pk.to_base64()).expect("a key")
        }

        fn sign(&self, bytes: &[u8]) -> String {
            minisign::sign(Some(&self.pk), &self.sk, bytes, None, None)
                .expect("sign")
                .to_string()
        }
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sharehost-trust-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        d
    }

    const BYTES: &[u8] = b"\0asm\x0d\0\x01\0 the component's bytes";

    #[test]
    fn a_signature_by_a_trusted_key_over_the_same_bytes_names_the_signer() {
        let d = scratch("good");
        let (alice, bob) = (Signer::new(), Signer::new());
        let policy = TrustPolicy::new([bob.trusted(), alice.trusted()]).expect("keys");
        let c = d.join("plugin.wasm");
        std::fs::write(signature_path(&c), alice.sign(BYTES)).expect("write");
        let signer = policy.verify(&c, BYTES).expect("verified");
        assert_eq!(signer, alice.trusted().id());
        // minisign's own display of the id: the key number read little-endian, in hex.
        let id = u64::from_le_bytes(alice.pk.keynum().try_into().expect("8 bytes"));
        assert_eq!(signer, format!("{id:016X}"));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_missing_signature_names_the_expected_path() {
        let d = scratch("missing");
        let policy = TrustPolicy::new([Signer::new().trusted()]).expect("keys");
        let c = d.join("plugin.wasm");
        let e = policy.verify(&c, BYTES).expect_err("unsigned");
        assert_eq!(
            e,
            TrustRefusal::NoSignature {
                signature: d.join("plugin.wasm.minisig")
            }
        );
        assert!(
            e.to_string().contains(&format!(
                "expected {}",
                d.join("plugin.wasm.minisig").display()
            )),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_signature_by_an_untrusted_key_shows_its_id_and_the_trusted_ones() {
        let d = scratch("unknown");
        let (trusted, stranger) = (Signer::new(), Signer::new());
        let policy = TrustPolicy::new([trusted.trusted()]).expect("keys");
        let c = d.join("plugin.wasm");
        std::fs::write(signature_path(&c), stranger.sign(BYTES)).expect("write");
        let e = policy.verify(&c, BYTES).expect_err("untrusted");
        assert_eq!(
            e,
            TrustRefusal::UnknownKey {
                key_id: stranger.trusted().id().to_owned(),
                trusted: vec![trusted.trusted().id().to_owned()],
            }
        );
        assert_eq!(e.as_str(), "unknown_key");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_signature_over_other_bytes_or_an_altered_comment_is_bad() {
        let d = scratch("bad");
        let alice = Signer::new();
        let policy = TrustPolicy::new([alice.trusted()]).expect("keys");
        let c = d.join("plugin.wasm");
        let sig = alice.sign(BYTES);
        std::fs::write(signature_path(&c), &sig).expect("write");
        let mut changed = BYTES.to_vec();
        changed.push(0);
        let bad = TrustRefusal::BadSignature {
            key_id: alice.trusted().id().to_owned(),
        };
        assert_eq!(policy.verify(&c, &changed), Err(bad.clone()));
        // The trusted comment is signed too: editing it breaks the global signature.
        let edited = sig.replacen(
            "trusted comment: timestamp:",
            "trusted comment: timestamp:1",
            1,
        );
        assert_ne!(edited, sig);
        std::fs::write(signature_path(&c), &edited).expect("write");
        assert_eq!(policy.verify(&c, BYTES), Err(bad));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn malformed_oversized_and_non_file_signatures_are_refused_as_such() {
        let d = scratch("malformed");
        let policy = TrustPolicy::new([Signer::new().trusted()]).expect("keys");
        let c = d.join("plugin.wasm");
        let sig = signature_path(&c);
        for (content, why) in [
            (b"not a signature".to_vec(), "not a minisign signature"),
            (vec![0xff, 0xfe, 0, 1], "not text"),
            (vec![b'x'; 70 << 10], "maximum"),
        ] {
            std::fs::write(&sig, &content).expect("write");
            let e = policy.verify(&c, BYTES).expect_err(why);
            assert_eq!(e.as_str(), "malformed_signature", "{e}");
            assert!(e.to_string().contains(why), "{e}");
            assert!(e.to_string().contains(&sig.display().to_string()), "{e}");
        }
        std::fs::remove_file(&sig).expect("rm");
        std::fs::create_dir(&sig).expect("a directory");
        let e = policy.verify(&c, BYTES).expect_err("a directory");
        assert_eq!(e.as_str(), "unreadable_signature", "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn keys_are_read_as_minisign_prints_them_and_bad_ones_are_named() {
        // A key and its id as the stock `minisign -G` printed them.
        let k = TrustedKey::parse("RWRHs4BcChVSimkp37yexDX7kT2h9Qc3la9J7aDfSJlRObr3f7mo+D3W")
            .expect("a minisign key");
        assert_eq!(k.id(), "8A52150A5C80B347");
        let e = TrustedKey::parse("not base64 at all!").expect_err("garbage");
        assert!(e.contains("is not base64"), "{e}");
        // A valid base64 string of the wrong length: not a key.
        let e = TrustedKey::parse("aGVsbG8=").expect_err("short");
        assert!(e.contains("not a minisign public key"), "{e}");
        // A .pub file, two of them concatenated.
        let file = "untrusted comment: minisign public key 8A52150A5C80B347\nRWRHs4BcChVSimkp37yexDX7kT2h9Qc3la9J7aDfSJlRObr3f7mo+D3W\n\n# bob\nRWQ=\n";
        let e = parse_keys_file(file).expect_err("bad second key");
        assert!(e.starts_with("line 5: "), "{e}");
        let keys = parse_keys_file(&file.replace("RWQ=\n", "")).expect("one key");
        assert_eq!(keys, vec![k.clone()]);
        assert!(parse_keys_file("# nothing\n").is_err());
        // Duplicates are kept once; no key is no policy.
        let p = TrustPolicy::new([k.clone(), k]).expect("a policy");
        assert_eq!(p.key_ids(), ["8A52150A5C80B347"]);
        assert!(TrustPolicy::new([]).is_none());
    }

    #[test]
    fn a_signature_made_by_the_stock_minisign_tool_verifies() {
        // Made once with `minisign -G -W` and `minisign -S -s k.sec -m f.wasm` (minisign 0.11)
        // over the 6 bytes "hello\n"; the throwaway secret key was not kept.
        let d = scratch("stock");
        let policy = TrustPolicy::new([TrustedKey::parse(
            "RWRHs4BcChVSimkp37yexDX7kT2h9Qc3la9J7aDfSJlRObr3f7mo+D3W",
        )
        .expect("key")])
        .expect("keys");
        let c = d.join("f.wasm");
        std::fs::write(
            signature_path(&c),
            "untrusted comment: signature from minisign secret key\nRURHs4BcChVSii1a0LfT/n1Smrq8Mw5Kuixx+Pogj2To1UakmVni/ayFvjnx/nYOSR4BHZwWdnS997kxEDEn9BswG41BPdKEwwQ=\ntrusted comment: timestamp:1796123331\tfile:f.wasm\thashed\nCLT13T/OgRW7HtjK9ut+Bhpb+WTzF24AQfl53nk8W1/GuF1Sw4qzVAD3+m5hxYK+AFFEFKzd6RDMIv9khaSYCg==\n",
        )
        .expect("write");
        assert_eq!(
            policy.verify(&c, b"hello\n").as_deref(),
            Ok("8A52150A5C80B347")
        );
        assert!(policy.verify(&c, b"hello").is_err());
        let _ = std::fs::remove_dir_all(&d);
    }
}

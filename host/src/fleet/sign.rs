//! Operator actions are signed, so write access to the deployments topic alone can neither
//! deploy nor force a downgrade: `sharehost fleet` signs each action's JSON with a minisign
//! secret key, and every host verifies it with the keys it trusts for the pipeline before it
//! applies anything.

use std::path::Path;

use super::records::{Action, SignedAction, json};
use crate::runtime::TrustPolicy;

/// The environment variable holding the password of an encrypted signing key.
pub const KEY_PASSWORD_ENV: &str = "SHAREHOST_SIGNING_KEY_PASSWORD";

/// Why a signing key or a signed action was refused.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The secret key could not be read or opened.
    #[error("signing key {path}: {reason}")]
    Key {
        /// The key file.
        path: String,
        /// Why.
        reason: String,
    },
    /// Signing failed.
    #[error("cannot sign the action: {0}")]
    Sign(String),
}

/// The largest secret key file read: a minisign key is under 400 bytes.
const MAX_KEY_BYTES: u64 = 16 << 10;

/// The size of a minisign secret key's decoded bytes: algorithms (6), KDF salt (32), KDF limits
/// (16), key id (8), Ed25519 secret key (64), checksum (32).
const SECRET_KEY_BYTES: usize = 158;

/// Reads a minisign secret key as `minisign -G` writes it. An encrypted one (the default) is
/// opened with the password in [`KEY_PASSWORD_ENV`]; one made with `-W` is not encrypted and
/// takes no password (the variable unset or empty). minisign 0.11 writes a `-W` key without a
/// checksum, which the `minisign` crate calls corrupted: such a key is read as it stands and
/// checked instead by signing with it and verifying with its own public half.
pub fn load_key(path: &Path) -> Result<minisign::SecretKey, SignError> {
    load_key_with(path, std::env::var(KEY_PASSWORD_ENV).ok())
}

/// [`load_key`] with the password given (`None` or empty: none).
pub fn load_key_with(
    path: &Path,
    password: Option<String>,
) -> Result<minisign::SecretKey, SignError> {
    use base64::Engine;
    use std::io::Read;
    let fail = |reason: String| SignError::Key {
        path: path.display().to_string(),
        reason,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_KEY_BYTES + 1).read_to_string(&mut text))
        .map_err(|e| fail(e.to_string()))?;
    if text.len() as u64 > MAX_KEY_BYTES {
        return Err(fail(format!(
            "more than the {MAX_KEY_BYTES} bytes a minisign secret key file has"
        )));
    }
    let not_a_key = |why: &str| fail(format!("not a minisign secret key ({why})"));
    let bytes = text
        .lines()
        .nth(1)
        .and_then(|l| {
            base64::engine::general_purpose::STANDARD
                .decode(l.trim())
                .ok()
        })
        .filter(|b| b.len() == SECRET_KEY_BYTES && b.starts_with(b"Ed"))
        .ok_or_else(|| not_a_key("its second line is not a key's base64"))?;
    let boxed =
        minisign::SecretKeyBox::from_string(&text).map_err(|e| not_a_key(&e.to_string()))?;
    let password = password.filter(|p| !p.is_empty());
    let encrypted = bytes[2..4] != [0, 0];
    match (encrypted, password) {
        (true, Some(password)) => minisign::SecretKey::from_box(boxed, Some(password))
            .map_err(|e| fail(format!("cannot open it with {KEY_PASSWORD_ENV} ({e})"))),
        (true, None) => Err(fail(format!(
            "it is encrypted and {KEY_PASSWORD_ENV} is unset or empty: put its password there (a key made with `minisign -G -W` takes none)"
        ))),
        (false, Some(_)) => Err(fail(format!(
            "it is not encrypted (made with `minisign -G -W`), yet {KEY_PASSWORD_ENV} holds a password: unset it or leave it empty"
        ))),
        (false, None) => match minisign::SecretKey::from_unencrypted_box(boxed) {
            Ok(key) => Ok(key),
            Err(_) if bytes[SECRET_KEY_BYTES - 32..].iter().all(|&b| b == 0) => {
                let key = minisign::SecretKey::from_bytes(&bytes)
                    .map_err(|e| not_a_key(&e.to_string()))?;
                consistent(&key).map_err(|e| {
                    fail(format!(
                        "corrupted: its secret and public halves do not match ({e})"
                    ))
                })?;
                Ok(key)
            }
            Err(e) => Err(fail(format!("corrupted: {e}"))),
        },
    }
}

/// Signs a probe with `key` and verifies it with the public half the key carries.
fn consistent(key: &minisign::SecretKey) -> Result<(), minisign::PError> {
    let pk = minisign::PublicKey::from_secret_key(key)?;
    let probe = b"sharehost signing key probe";
    let sig = minisign::sign(None, key, &probe[..], None, None)?;
    minisign::verify(
        &pk,
        &sig,
        std::io::Cursor::new(&probe[..]),
        true,
        false,
        false,
    )
}

/// Signs `action` with `key`: its exact JSON and a signature over those bytes.
pub fn sign(action: &Action, key: &minisign::SecretKey) -> Result<SignedAction, SignError> {
    let text = serde_json::to_string(action).map_err(|e| SignError::Sign(e.to_string()))?;
    let trusted = format!(
        "sharehost fleet {} {} {}",
        action.fleet, action.pipeline, action.seq
    );
    let sig = minisign::sign(None, key, text.as_bytes(), Some(&trusted), None)
        .map_err(|e| SignError::Sign(e.to_string()))?;
    Ok(SignedAction {
        action: text,
        signature: sig.into_string(),
    })
}

/// Verifies a signed action with `trust` and reads it: the action and the key id that signed
/// it, or why it is refused (unsigned, tampered with, by an unknown key, or not an action).
pub fn verify(signed: &SignedAction, trust: &TrustPolicy) -> Result<(Action, String), String> {
    let signer = trust
        .verify_signed(
            Path::new("the deployments record's signature"),
            signed.action.as_bytes(),
            &signed.signature,
        )
        .map_err(|e| e.to_string())?;
    let action: Action = json(signed.action.as_bytes()).map_err(|e| e.to_string())?;
    Ok((action, signer))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::records::Change;
    use crate::runtime::TrustedKey;

    fn keys() -> (minisign::SecretKey, TrustPolicy) {
        let kp = minisign::KeyPair::generate_unencrypted_keypair().expect("key pair");
        let trusted = TrustedKey::parse(&kp.pk.to_base64()).expect("trusted key");
        (kp.sk, TrustPolicy::new([trusted]).expect("policy"))
    }

    fn action() -> Action {
        Action {
            fleet: "f".into(),
            pipeline: "p".into(),
            seq: 1,
            issued_at_ms: 1,
            change: Change::Promote,
            then: Default::default(),
        }
    }

    /// Runs the real `minisign` (Debian's package; dev/test installs it) with `input` on its
    /// standard input: a test of keys as minisign writes them fails, not skips, without it.
    fn minisign(args: &[&str], input: &str) {
        use std::io::Write;
        let mut child = std::process::Command::new("minisign")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("the minisign binary (apt-get install minisign; dev/test installs it)");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write to minisign");
        assert!(
            child.wait().expect("minisign").success(),
            "minisign {args:?}"
        );
    }

    /// A key pair made by `minisign -G` (with `-W` when `password` is `None`) in `dir`: the
    /// secret key's path and the public key line.
    fn minisign_keys(dir: &Path, password: Option<&str>) -> (std::path::PathBuf, String) {
        let (sk, pk) = (dir.join("key.sec"), dir.join("key.pub"));
        let (sk_s, pk_s) = (sk.to_str().expect("utf-8"), pk.to_str().expect("utf-8"));
        match password {
            None => minisign(&["-G", "-W", "-p", pk_s, "-s", sk_s], ""),
            Some(pw) => minisign(&["-G", "-p", pk_s, "-s", sk_s], &format!("{pw}\n{pw}\n")),
        }
        let public = std::fs::read_to_string(&pk).expect("public key");
        let line = public.lines().nth(1).expect("key line").to_owned();
        (sk, line)
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("sharehost-sign-{name}-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    #[test]
    fn a_key_made_by_minisign_w_signs_with_no_password_or_an_empty_one() {
        let dir = scratch("w");
        let (sk, public) = minisign_keys(&dir, None);
        let trust =
            TrustPolicy::new([TrustedKey::parse(&public).expect("trusted key")]).expect("policy");
        for password in [None, Some(String::new())] {
            let key = load_key_with(&sk, password).expect("minisign -W key");
            let signed = sign(&action(), &key).expect("sign");
            assert_eq!(verify(&signed, &trust).map(|(a, _)| a), Ok(action()));
        }
        let refused = load_key_with(&sk, Some("pw".into())).expect_err("a password");
        assert!(refused.to_string().contains("not encrypted"), "{refused}");
        // Its secret half damaged: refused, not a signature no host accepts.
        let text = std::fs::read_to_string(&sk).expect("key");
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        let mut b = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &lines[1])
            .expect("base64");
        b[70] ^= 1;
        lines[1] = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &b);
        std::fs::write(&sk, lines.join("\n") + "\n").expect("write");
        let refused = load_key_with(&sk, None).expect_err("damaged");
        assert!(refused.to_string().contains("corrupted"), "{refused}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_encrypted_minisign_key_opens_with_its_password_and_says_so_without() {
        let dir = scratch("enc");
        let (sk, public) = minisign_keys(&dir, Some("correct horse"));
        let refused = load_key_with(&sk, Some(String::new())).expect_err("no password");
        assert!(
            refused.to_string().contains("encrypted")
                && refused.to_string().contains(KEY_PASSWORD_ENV),
            "{refused}"
        );
        let started = std::time::Instant::now();
        let key = load_key_with(&sk, Some("correct horse".into())).expect("opened");
        eprintln!(
            "scrypt of a minisign key (opslimit 2^25, memlimit 1 GiB) in this build: {:.2} s",
            started.elapsed().as_secs_f64()
        );
        let trust =
            TrustPolicy::new([TrustedKey::parse(&public).expect("trusted key")]).expect("policy");
        let signed = sign(&action(), &key).expect("sign");
        assert!(verify(&signed, &trust).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_signed_action_verifies_and_a_tampered_or_foreign_one_does_not() {
        let (sk, trust) = keys();
        let signed = sign(&action(), &sk).expect("sign");
        assert_eq!(verify(&signed, &trust).map(|(a, _)| a), Ok(action()));
        let mut tampered = signed.clone();
        tampered.action = tampered.action.replace("\"seq\":1", "\"seq\":9");
        assert!(verify(&tampered, &trust).is_err(), "tampered");
        let (other_sk, _) = keys();
        let foreign = sign(&action(), &other_sk).expect("sign");
        let refused = verify(&foreign, &trust).expect_err("unknown key");
        assert!(refused.contains("unknown key"), "{refused}");
        let unsigned = SignedAction {
            action: signed.action.clone(),
            signature: String::new(),
        };
        assert!(verify(&unsigned, &trust).is_err(), "unsigned");
    }
}

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

/// Reads a minisign secret key (`minisign -G`): encrypted ones with the password in
/// [`KEY_PASSWORD_ENV`], keys made with `-W` without one.
pub fn load_key(path: &Path) -> Result<minisign::SecretKey, SignError> {
    let fail = |reason: String| SignError::Key {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let boxed = minisign::SecretKeyBox::from_string(&text)
        .map_err(|e| fail(format!("not a minisign secret key ({e})")))?;
    match std::env::var(KEY_PASSWORD_ENV) {
        Ok(password) => minisign::SecretKey::from_box(boxed, Some(password))
            .map_err(|e| fail(format!("cannot open it with {KEY_PASSWORD_ENV} ({e})"))),
        Err(_) => minisign::SecretKey::from_unencrypted_box(boxed).map_err(|e| {
            fail(format!(
                "cannot open it without a password ({e}); an encrypted key takes its password in {KEY_PASSWORD_ENV}"
            ))
        }),
    }
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

//! SASL PLAIN and SCRAM-SHA-256/512 (RFC 5802, RFC 7677), as a pure client state machine plus
//! the two Kafka round trips (SaslHandshake, SaslAuthenticate) that carry it.
//!
//! Written here because no well-kept crate offers a client-side SCRAM exchange that is
//! transport-agnostic and async-free; the primitives (HMAC, PBKDF2, SHA-2) come from RustCrypto.

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use rand::Rng;
use sha2::{Digest, Sha256, Sha512};

/// A string that never shows up in `Debug` or logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    /// The secret itself, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// The SASL mechanisms sharehost speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// Username and password in clear (only sensible over TLS).
    Plain,
    /// Salted challenge-response with SHA-256.
    ScramSha256,
    /// Salted challenge-response with SHA-512.
    ScramSha512,
}

impl Mechanism {
    /// The name Kafka uses in SaslHandshake.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mechanism {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_uppercase().as_str() {
            "PLAIN" => Ok(Mechanism::Plain),
            "SCRAM-SHA-256" => Ok(Mechanism::ScramSha256),
            "SCRAM-SHA-512" => Ok(Mechanism::ScramSha512),
            _ => Err(format!(
                "unknown SASL mechanism {s:?} (expected PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)"
            )),
        }
    }
}

/// Credentials for one mechanism.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaslSettings {
    /// Which mechanism to use.
    pub mechanism: Mechanism,
    /// The user name.
    pub username: String,
    /// The password (never logged).
    pub password: Secret,
}

/// The PLAIN initial response: `\0user\0password`.
pub fn plain_message(username: &str, password: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(username.len() + password.len() + 2);
    v.push(0);
    v.extend_from_slice(username.as_bytes());
    v.push(0);
    v.extend_from_slice(password.as_bytes());
    v
}

/// Hash function of a SCRAM variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScramHash {
    /// SCRAM-SHA-256.
    Sha256,
    /// SCRAM-SHA-512.
    Sha512,
}

impl ScramHash {
    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            ScramHash::Sha256 => {
                let mut m = <Hmac<Sha256>>::new_from_slice(key).expect("HMAC takes any key length");
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
            ScramHash::Sha512 => {
                let mut m = <Hmac<Sha512>>::new_from_slice(key).expect("HMAC takes any key length");
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramHash::Sha256 => Sha256::digest(data).to_vec(),
            ScramHash::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            ScramHash::Sha256 => {
                let mut out = vec![0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
                out
            }
            ScramHash::Sha512 => {
                let mut out = vec![0u8; 64];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
                out
            }
        }
    }
}

/// Why a SCRAM exchange failed on the client side.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    /// The server's message could not be parsed.
    #[error("malformed server message: {0}")]
    Malformed(String),
    /// The server's nonce does not extend ours (a replay or a man in the middle).
    #[error("server nonce does not start with the client nonce")]
    NonceMismatch,
    /// The server refused (`e=...` in server-final).
    #[error("server says: {0}")]
    ServerError(String),
    /// The server could not prove it knows the password.
    #[error("server signature does not verify")]
    BadServerSignature,
    /// An iteration count below 4096 (RFC 7677's minimum) is refused as a downgrade.
    #[error("iteration count {0} is below the minimum of 4096")]
    WeakIterations(u32),
}

/// Client side of one SCRAM exchange: `first` → server-first → `final_message` → server-final →
/// `verify_server_final`.
#[derive(Debug)]
pub struct ScramClient {
    hash: ScramHash,
    password: String,
    client_first_bare: String,
    nonce: String,
    expected_server_signature: Option<Vec<u8>>,
}

fn escape_username(u: &str) -> String {
    u.replace('=', "=3D").replace(',', "=2C")
}

impl ScramClient {
    /// Starts an exchange with a fresh random nonce.
    pub fn new(hash: ScramHash, username: &str, password: &str) -> Self {
        let nonce: String = rand::rng()
            .sample_iter(rand::distr::Alphanumeric)
            .take(24)
            .map(char::from)
            .collect();
        Self::with_nonce(hash, username, password, &nonce)
    }

    /// Starts an exchange with a given nonce (test vectors).
    pub fn with_nonce(hash: ScramHash, username: &str, password: &str, nonce: &str) -> Self {
        ScramClient {
            hash,
            password: password.to_owned(),
            client_first_bare: format!("n={},r={nonce}", escape_username(username)),
            nonce: nonce.to_owned(),
            expected_server_signature: None,
        }
    }

    /// The client-first message (no channel binding, no authzid).
    pub fn first_message(&self) -> String {
        format!("n,,{}", self.client_first_bare)
    }

    /// Consumes server-first and produces client-final.
    pub fn final_message(&mut self, server_first: &str) -> Result<String, ScramError> {
        let mut nonce = None;
        let mut salt = None;
        let mut iterations = None;
        for part in server_first.split(',') {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| ScramError::Malformed(server_first.to_owned()))?;
            match k {
                "r" => nonce = Some(v),
                "s" => {
                    salt = Some(
                        B64.decode(v)
                            .map_err(|e| ScramError::Malformed(format!("salt: {e}")))?,
                    )
                }
                "i" => {
                    iterations = Some(
                        v.parse::<u32>()
                            .map_err(|e| ScramError::Malformed(format!("iterations: {e}")))?,
                    )
                }
                "e" => return Err(ScramError::ServerError(v.to_owned())),
                _ => {}
            }
        }
        let (Some(nonce), Some(salt), Some(iterations)) = (nonce, salt, iterations) else {
            return Err(ScramError::Malformed(server_first.to_owned()));
        };
        if !nonce.starts_with(&self.nonce) || nonce.len() <= self.nonce.len() {
            return Err(ScramError::NonceMismatch);
        }
        if iterations < 4096 {
            return Err(ScramError::WeakIterations(iterations));
        }
        let h = self.hash;
        let salted = h.salted_password(self.password.as_bytes(), &salt, iterations);
        let client_key = h.hmac(&salted, b"Client Key");
        let stored_key = h.hash(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let client_signature = h.hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&client_signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let server_key = h.hmac(&salted, b"Server Key");
        self.expected_server_signature = Some(h.hmac(&server_key, auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", B64.encode(proof)))
    }

    /// Checks the server's proof that it knows our password.
    pub fn verify_server_final(&self, server_final: &str) -> Result<(), ScramError> {
        if let Some(e) = server_final.strip_prefix("e=") {
            return Err(ScramError::ServerError(e.to_owned()));
        }
        let v = server_final
            .split(',')
            .find_map(|p| p.strip_prefix("v="))
            .ok_or_else(|| ScramError::Malformed(server_final.to_owned()))?;
        let got = B64
            .decode(v)
            .map_err(|e| ScramError::Malformed(format!("signature: {e}")))?;
        match &self.expected_server_signature {
            Some(want) if *want == got => Ok(()),
            _ => Err(ScramError::BadServerSignature),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677 §3 test vector.
    #[test]
    fn rfc7677_sha256_vector() {
        let mut c =
            ScramClient::with_nonce(ScramHash::Sha256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
        assert_eq!(c.first_message(), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let fin = c.final_message(server_first).expect("valid");
        assert_eq!(
            fin,
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        assert_eq!(
            c.verify_server_final("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="),
            Ok(())
        );
        assert_eq!(
            c.verify_server_final("v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="),
            Err(ScramError::BadServerSignature)
        );
    }

    #[test]
    fn refuses_foreign_nonce_weak_iterations_and_server_errors() {
        let mut c = ScramClient::with_nonce(ScramHash::Sha512, "u", "p", "abc");
        assert_eq!(
            c.final_message("r=xyz123,s=AAAA,i=4096"),
            Err(ScramError::NonceMismatch)
        );
        assert_eq!(
            c.final_message("r=abc,s=AAAA,i=4096"),
            Err(ScramError::NonceMismatch),
            "must extend"
        );
        assert_eq!(
            c.final_message("r=abcdef,s=AAAA,i=10"),
            Err(ScramError::WeakIterations(10))
        );
        assert_eq!(
            c.final_message("e=invalid-proof"),
            Err(ScramError::ServerError("invalid-proof".into()))
        );
        assert!(matches!(
            c.final_message("garbage"),
            Err(ScramError::Malformed(_))
        ));
        assert_eq!(
            c.verify_server_final("e=other-error"),
            Err(ScramError::ServerError("other-error".into()))
        );
    }

    #[test]
    fn sha512_proof_has_the_right_length() {
        let mut c = ScramClient::with_nonce(ScramHash::Sha512, "alice", "secret", "n0nce");
        let fin = c
            .final_message("r=n0nceSERVER,s=c2FsdA==,i=4096")
            .expect("valid");
        let proof = fin.rsplit_once("p=").expect("proof").1;
        assert_eq!(B64.decode(proof).expect("b64").len(), 64);
    }

    #[test]
    fn usernames_are_escaped() {
        let c = ScramClient::with_nonce(ScramHash::Sha256, "a=b,c", "p", "n");
        assert_eq!(c.first_message(), "n,,n=a=3Db=2Cc,r=n");
    }

    #[test]
    fn plain_message_layout_and_secret_redaction() {
        assert_eq!(plain_message("u", "p"), b"\0u\0p");
        assert_eq!(format!("{:?}", Secret::new("hunter2")), "Secret(***)");
        assert_eq!(
            "scram-sha-512".parse::<Mechanism>(),
            Ok(Mechanism::ScramSha512)
        );
        assert!("GSSAPI".parse::<Mechanism>().is_err());
    }
}

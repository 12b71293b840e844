//! Keys and signatures made as `minisign -G -W` and `minisign -Sm` make them (a fresh key pair
//! per test; no secret key outlives the test's temporary directory).

use std::path::Path;

use sharehost::runtime::{TrustedKey, signature_path};

/// A publisher's or operator's key pair.
pub struct Signer {
    /// The public half, as a manifest's `[trust] keys` lists it.
    pub pk: minisign::PublicKey,
    /// The secret half, for signing components and fleet actions.
    pub sk: minisign::SecretKey,
}

impl Signer {
    /// A fresh unencrypted key pair.
    pub fn new() -> Signer {
        let kp = minisign::KeyPair::generate_unencrypted_keypair().expect("key pair");
        Signer {
            pk: kp.pk,
            sk: kp.sk,
        }
    }

    /// The public key line a manifest lists (`RW...`).
    pub fn public(&self) -> String {
        self.pk.to_base64()
    }

    /// The key id minisign shows, as the host reports the signer.
    pub fn id(&self) -> String {
        TrustedKey::parse(&self.public())
            .expect("a key")
            .id()
            .to_owned()
    }

    /// Writes `component.minisig`, as `minisign -Sm component` does.
    pub fn sign(&self, component: &Path) {
        let bytes = std::fs::read(component).expect("read component");
        let sig = minisign::sign(Some(&self.pk), &self.sk, &bytes[..], None, None).expect("sign");
        std::fs::write(signature_path(component), sig.to_string()).expect("write signature");
    }

    /// Writes the secret key file `sharehost fleet --key` reads to `path`.
    pub fn write_key(&self, path: &Path) {
        let boxed = self.sk.to_box(None).expect("key box").to_string();
        std::fs::write(path, boxed).expect("write key");
    }
}

impl Default for Signer {
    fn default() -> Signer {
        Signer::new()
    }
}

//! Keys and signatures made as `minisign -G -W` and `minisign -Sm` make them (a fresh key pair
//! per test; no secret key outlives the test's temporary directory).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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

/// Runs the real `minisign` binary (Debian's package, which dev/test installs) with `input` on
/// its standard input. A test of keys as minisign writes them fails, never skips, without it.
pub fn minisign(args: &[&str], input: &str) {
    let mut child = Command::new("minisign")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
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

/// A key pair made by `minisign -G` in `dir` (`-W`, unencrypted, when `password` is `None`):
/// the secret key file and the public key line a manifest lists.
pub fn minisign_keys(dir: &Path, password: Option<&str>) -> (PathBuf, String) {
    let (sk, pk) = (dir.join("minisign.key"), dir.join("minisign.pub"));
    let (sk_s, pk_s) = (sk.to_str().expect("utf-8"), pk.to_str().expect("utf-8"));
    match password {
        None => minisign(&["-G", "-W", "-p", pk_s, "-s", sk_s], ""),
        Some(pw) => minisign(&["-G", "-p", pk_s, "-s", sk_s], &format!("{pw}\n{pw}\n")),
    }
    let public = std::fs::read_to_string(&pk).expect("public key");
    let line = public.lines().nth(1).expect("a key line").to_owned();
    (sk, line)
}

/// Signs `component` with `minisign -Sm` and the secret key `sk` (its password, if any, on
/// standard input).
pub fn minisign_sign(sk: &Path, component: &Path, password: Option<&str>) {
    minisign(
        &[
            "-S",
            "-s",
            sk.to_str().expect("utf-8"),
            "-m",
            component.to_str().expect("utf-8"),
        ],
        &password.map(|p| format!("{p}\n")).unwrap_or_default(),
    );
}

//! Where a secret lives ([`SecretSource`]): an environment variable or a file, never the
//! manifest. Both the SASL password (`[cluster.sasl]`) and a plugin's secrets
//! (`[pipeline.secrets]`) are named this way and read when the host needs them.

use std::path::PathBuf;

use super::limits::MAX_SECRET_BYTES;
use crate::runtime::fs::{FileError, read_regular_text};

/// Where a secret comes from (never the manifest itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// An environment variable's name.
    Env(String),
    /// A file whose content (trimmed) is the secret.
    File(PathBuf),
}

impl SecretSource {
    /// Reads the secret; errors start with `field` and name the variable or file. A file is
    /// read bounded, a regular file of at most [`MAX_SECRET_BYTES`] (a path to `/dev/zero` or a
    /// FIFO is refused, never read), and its bytes are never quoted.
    pub fn read(&self, field: &str) -> Result<String, String> {
        match self {
            SecretSource::Env(var) => std::env::var(var)
                .map_err(|_| format!("{field}: environment variable {var} is not set")),
            SecretSource::File(path) => read_regular_text(path, MAX_SECRET_BYTES)
                .map(|s| s.trim_end_matches(['\n', '\r']).to_owned())
                .map_err(|e| match e {
                    FileError::TooLarge { .. } => format!(
                        "{field}: cannot read {}: more than a secret file's {} KiB maximum",
                        path.display(),
                        MAX_SECRET_BYTES >> 10
                    ),
                    e => format!("{field}: cannot read {e}"),
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_file_is_read_bounded_and_by_type() {
        let e = SecretSource::File("/dev/zero".into())
            .read("pipeline[0].secrets.t")
            .expect_err("a device");
        assert_eq!(
            e,
            "pipeline[0].secrets.t: cannot read /dev/zero: is a character device, not a regular file"
        );
        let big = std::env::temp_dir().join(format!("sharehost-secret-big-{}", std::process::id()));
        let f = std::fs::File::create(&big).expect("create");
        f.set_len(MAX_SECRET_BYTES + 1).expect("set_len");
        let e = SecretSource::File(big.clone())
            .read("s")
            .expect_err("too large");
        assert_eq!(
            e,
            format!(
                "s: cannot read {}: more than a secret file's 1024 KiB maximum",
                big.display()
            )
        );
        std::fs::write(&big, "hunter2\n").expect("write");
        assert_eq!(
            SecretSource::File(big.clone()).read("s").as_deref(),
            Ok("hunter2")
        );
        let _ = std::fs::remove_file(&big);
    }
}

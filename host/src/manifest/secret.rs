//! Where a secret lives ([`SecretSource`]): an environment variable or a file, never the
//! manifest. Both the SASL password (`[cluster.sasl]`) and a plugin's secrets
//! (`[pipeline.secrets]`) are named this way and read when the host needs them.

use std::path::PathBuf;

/// Where a secret comes from (never the manifest itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// An environment variable's name.
    Env(String),
    /// A file whose content (trimmed) is the secret.
    File(PathBuf),
}

impl SecretSource {
    /// Reads the secret; errors start with `field` and name the variable or file.
    pub fn read(&self, field: &str) -> Result<String, String> {
        match self {
            SecretSource::Env(var) => std::env::var(var)
                .map_err(|_| format!("{field}: environment variable {var} is not set")),
            SecretSource::File(path) => std::fs::read_to_string(path)
                .map(|s| s.trim_end_matches(['\n', '\r']).to_owned())
                .map_err(|e| format!("{field}: cannot read {}: {e}", path.display())),
        }
    }
}

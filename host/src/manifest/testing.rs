//! What the validators' unit tests share: a scratch folder holding a component file, a
//! minimal valid manifest, and a parse of manifest text as if read from that folder.

use std::path::PathBuf;

use super::Manifest;
use super::error::ManifestError;

/// The scratch folder, with `plugin.wasm` in it (its content is never read by the manifest).
pub(super) fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("sharehost-manifest-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("tmp");
    std::fs::write(d.join("plugin.wasm"), b"not really").expect("write");
    d
}

/// Parses `text` as the file `m.toml` of the scratch folder.
pub(super) fn parse(text: &str) -> Result<Manifest, ManifestError> {
    Manifest::parse(&dir().join("m.toml"), text)
}

/// The smallest valid manifest: one pipeline, every optional key left out.
pub(super) const MINIMAL: &str = r#"
[cluster]
bootstrap = "127.0.0.1:9092"

[[pipeline]]
name = "orders"
topics = ["orders"]
group = "orders-g"
component = "plugin.wasm"
"#;

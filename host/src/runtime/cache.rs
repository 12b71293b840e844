//! The host-owned cache of precompiled components.
//!
//! Compiling a component takes tens of milliseconds per plugin on two cores; mapping a
//! precompiled artifact takes well under one. Artifacts are named by the SHA-256 of the
//! component bytes plus a digest of the engine's `precompile_compatibility_hash` (wasmtime
//! version and every setting that changes code generation), so a new wasmtime, a changed
//! engine configuration or a changed plugin each get their own entry. Only files this host
//! wrote itself, in a directory it created with mode 0700, are ever deserialized: loading
//! precompiled bytes from anywhere else would run arbitrary native code.

use std::fs::DirBuilder;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::error::RuntimeError;

/// The cache directory plus the engine fingerprint its file names embed.
pub(crate) struct Cache {
    dir: PathBuf,
    engine_tag: String,
}

/// Feeds `Hash` output into SHA-256, so the engine fingerprint is stable across processes
/// (std's `DefaultHasher` is randomly keyed per process).
struct ShaHasher(Sha256);

impl Hasher for ShaHasher {
    fn finish(&self) -> u64 {
        // Only `write` is used; the digest is read with `finalize` below.
        0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The SHA-256 of a component's bytes, as hex: the plugin version's identity.
pub(crate) fn content_hash(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

impl Cache {
    /// Opens (creating when missing) the cache directory with mode 0700 and refuses a
    /// directory that other users can write, since its files are executed as native code.
    pub(crate) fn open(engine: &Engine, dir: &Path) -> Result<Self, RuntimeError> {
        let err = |source| RuntimeError::CacheDir {
            path: dir.to_owned(),
            source,
        };
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(err)?;
        let meta = std::fs::metadata(dir).map_err(err)?;
        if meta.permissions().mode() & 0o022 != 0 {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "writable by group or others; the cache holds native code and must be 0700",
            )));
        }
        let mut hasher = ShaHasher(Sha256::new());
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_tag = hex(&hasher.0.finalize()[..8]);
        Ok(Self {
            dir: dir.to_owned(),
            engine_tag,
        })
    }

    /// The file a component with this content hash is cached in, for this engine.
    pub(crate) fn path_for(&self, content_hash: &str) -> PathBuf {
        self.dir
            .join(format!("{content_hash}-{}.cwasm", self.engine_tag))
    }

    /// Maps the component from the cache, if this host stored it before. An entry wasmtime
    /// refuses (e.g. truncated by a crash) is deleted and reported as a miss.
    pub(crate) fn get(&self, engine: &Engine, content_hash: &str) -> Option<Component> {
        let path = self.path_for(content_hash);
        if !path.is_file() {
            return None;
        }
        match sharehost_trusted_cwasm::load_host_precompiled(engine, &path) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "discarding an unusable cache entry");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Stores a compiled (and already validated) component. A failure is logged, not fatal:
    /// the next load compiles again.
    pub(crate) fn put(&self, component: &Component, content_hash: &str) {
        let path = self.path_for(content_hash);
        let result = component
            .serialize()
            .map_err(|e| format!("{e:#}"))
            .and_then(|bytes| self.store(&path, &bytes).map_err(|e| e.to_string()));
        if let Err(e) = result {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the precompiled cache; continuing without it");
        }
    }

    /// Writes an artifact atomically: a temporary file in the same directory, then a rename,
    /// so a crash never leaves a half-written entry under the final name.
    fn store(&self, path: &Path, artifact: &[u8]) -> std::io::Result<()> {
        let tmp = self.dir.join(format!(
            ".{}.{}.tmp",
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            std::process::id()
        ));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(artifact)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    }
}

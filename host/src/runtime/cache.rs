//! The host-owned cache of precompiled components.
//!
//! Compiling a component takes tens of milliseconds per plugin on two cores; mapping a
//! precompiled artifact takes well under one. Artifacts are named by the SHA-256 of the
//! component bytes plus a digest of the engine's `precompile_compatibility_hash` (wasmtime
//! version and every setting that changes code generation) and of the runtime's own code
//! settings (allocator actually chosen, plugin memory limit, reservations), so a new wasmtime,
//! a changed engine configuration or a changed plugin each get their own entry.
//!
//! An artifact is native code: loading one planted by someone else runs their code inside the
//! host. So the directory must belong to this process's effective user and be writable by no
//! one else (checked at open, an error otherwise), and every entry is opened without following
//! a symlink and checked *on the opened file* (owner, mode, regular file) before its bytes are
//! read from that same file and deserialized. An entry that fails a check is never loaded: it
//! is logged, treated as a miss and replaced by this host's own compilation (a rename over the
//! directory entry, never a write through it). A miss rather than a load error, because such
//! an entry can only have been put into this user's own 0700 directory by root or by this user
//! (another umask, an older sharehost): refusing to start over it would turn a harmless
//! leftover into an outage, while never executing it keeps the guarantee.

use std::fs::{DirBuilder, File, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use sha2::{Digest, Sha256};
use wasmtime::Engine;
#[cfg(test)]
use wasmtime::component::Component;

use super::error::RuntimeError;

/// Where `sharehost run`, `check` and `test-plugin` keep precompiled components unless told
/// otherwise: `$SHAREHOST_CACHE_DIR`, else `$XDG_CACHE_HOME/sharehost/cwasm`, else
/// `~/.cache/sharehost/cwasm`. One place, so a component compiled by `test-plugin` starts
/// instantly under `run` (a Python component takes seconds to compile).
pub fn default_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SHAREHOST_CACHE_DIR") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("sharehost").join("cwasm")
}

/// The cache directory plus the engine fingerprint its file names embed.
pub(crate) struct Cache {
    dir: PathBuf,
    engine_tag: String,
    /// This process's effective uid: the only owner whose files are trusted.
    uid: u32,
}

/// This process's effective uid.
fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
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
    /// Opens (creating when missing) the cache directory with mode 0700 and refuses one that
    /// another user owns or that group or others can write, since its files are executed as
    /// native code. `code_settings` are the runtime settings that shape compiled code beyond
    /// the engine's compatibility hash; they become part of every entry's name.
    pub(crate) fn open(
        engine: &Engine,
        dir: &Path,
        code_settings: &str,
    ) -> Result<Self, RuntimeError> {
        let err = |source| RuntimeError::CacheDir {
            path: dir.to_owned(),
            source,
        };
        let refuse = |reason: String| {
            err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                reason,
            ))
        };
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(err)?;
        let meta = std::fs::metadata(dir).map_err(err)?;
        let uid = euid();
        if !meta.is_dir() {
            return Err(refuse("not a directory".into()));
        }
        if meta.uid() != uid {
            return Err(refuse(format!(
                "owned by uid {}, not by this process's uid {uid}; the cache holds native code and must be this user's own 0700 directory",
                meta.uid()
            )));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(refuse(format!(
                "mode {:o} is writable by group or others; the cache holds native code and must be 0700",
                meta.mode() & 0o7777
            )));
        }
        let mut hasher = ShaHasher(Sha256::new());
        engine.precompile_compatibility_hash().hash(&mut hasher);
        code_settings.hash(&mut hasher);
        let engine_tag = hex(&hasher.0.finalize()[..8]);
        Ok(Self {
            dir: dir.to_owned(),
            engine_tag,
            uid,
        })
    }

    /// The file a component with this content hash is cached in, for this engine.
    pub(crate) fn path_for(&self, content_hash: &str) -> PathBuf {
        self.dir
            .join(format!("{content_hash}-{}.cwasm", self.engine_tag))
    }

    /// Opens an entry without following a symlink and checks the opened file: a regular file
    /// this user owns that no one else can write. `Ok(None)` is a plain miss (no entry).
    fn open_trusted(&self, path: &Path) -> Result<Option<File>, String> {
        let fd = match rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(rustix::io::Errno::LOOP) => return Err("is a symbolic link".into()),
            Err(e) => return Err(std::io::Error::from(e).to_string()),
        };
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| e.to_string())?;
        if !meta.is_file() {
            return Err("is not a regular file".into());
        }
        if meta.uid() != self.uid {
            return Err(format!(
                "is owned by uid {}, not by this process's uid {}",
                meta.uid(),
                self.uid
            ));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(format!(
                "mode {:o} is writable by group or others",
                meta.mode() & 0o7777
            ));
        }
        Ok(Some(file))
    }

    /// The artifact this host stored for a component, if any: bytes read from the entry
    /// after the ownership checks passed on the opened file, so they are this host's own
    /// compilation and may be deserialized. An entry that fails the checks is never read
    /// (logged, a miss). Which engine loads the bytes is the caller's choice (the pool's or
    /// the on-demand one: both share the code settings the entry's name carries).
    pub(crate) fn get_artifact(&self, content_hash: &str) -> Option<Vec<u8>> {
        let path = self.path_for(content_hash);
        let mut file = match self.open_trusted(&path) {
            Ok(Some(f)) => f,
            Ok(None) => return None,
            Err(reason) => {
                tracing::warn!(path = %path.display(), reason = %reason, "refusing an untrusted cache entry; it is never loaded and will be replaced");
                return None;
            }
        };
        // Read from the file that was checked, not from a second lookup of the path.
        let mut artifact = Vec::new();
        if let Err(e) = file.read_to_end(&mut artifact) {
            tracing::warn!(path = %path.display(), error = %e, "cannot read a cache entry; compiling instead");
            return None;
        }
        Some(artifact)
    }

    /// Drops an entry wasmtime refused (e.g. truncated by a crash), so the next load
    /// compiles and replaces it.
    pub(crate) fn discard(&self, content_hash: &str, error: &str) {
        let path = self.path_for(content_hash);
        tracing::warn!(path = %path.display(), error = %error, "discarding an unusable cache entry");
        let _ = std::fs::remove_file(&path);
    }

    /// Loads the component from the cache with `engine`, if this host stored it before; an
    /// entry wasmtime refuses is discarded and reported as a miss.
    #[cfg(test)]
    pub(crate) fn get(&self, engine: &Engine, content_hash: &str) -> Option<Component> {
        let artifact = self.get_artifact(content_hash)?;
        match sharehost_trusted_cwasm::load_host_precompiled(engine, &artifact) {
            Ok(c) => Some(c),
            Err(e) => {
                self.discard(content_hash, &format!("{e:#}"));
                None
            }
        }
    }

    /// Stores a compiled (and already validated) artifact, the bytes
    /// `Engine::precompile_component` returned. A failure is logged, not fatal: the next load
    /// compiles again.
    pub(crate) fn put_artifact(&self, artifact: &[u8], content_hash: &str) {
        let path = self.path_for(content_hash);
        if let Err(e) = self.store(&path, artifact) {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the precompiled cache; continuing without it");
        }
    }

    /// Stores a compiled component (tests build entries this way).
    #[cfg(test)]
    pub(crate) fn put(&self, component: &Component, content_hash: &str) {
        match component.serialize() {
            Ok(bytes) => self.put_artifact(&bytes, content_hash),
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "cannot serialize a component"),
        }
    }

    /// Writes an artifact atomically: a new 0600 file (whatever the umask) in the same
    /// directory, then a rename, so a crash never leaves a half-written entry under the final
    /// name and a refused entry (or a symlink) is replaced, never written through.
    fn store(&self, path: &Path, artifact: &[u8]) -> std::io::Result<()> {
        let tmp = self.dir.join(format!(
            ".{}.{}.tmp",
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            std::process::id()
        ));
        // A leftover of a crashed process that had this pid.
        let _ = std::fs::remove_file(&tmp);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(OFlags::NOFOLLOW.bits() as i32)
            .open(&tmp)?;
        f.write_all(artifact)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{PermissionsExt, chown, symlink};

    use super::*;
    use crate::runtime::{PluginRuntime, RuntimeConfig};

    /// Another user: `nobody` on most systems. The tests run as root (they chown).
    const OTHER_UID: u32 = 65534;

    fn scratch(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("sharehost-cache-unit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        d
    }

    fn engine() -> Engine {
        let mut c = wasmtime::Config::new();
        c.wasm_component_model(true);
        Engine::new(&c).expect("engine")
    }

    /// The smallest valid component (just the header): compiles in microseconds.
    fn component(engine: &Engine) -> Component {
        Component::new(engine, b"\0asm\x0d\0\x01\0").expect("empty component")
    }

    /// A cache in a fresh directory holding this host's own entry for hash `a`.
    fn cache_with_entry(tag: &str) -> (PathBuf, Engine, Cache) {
        let root = scratch(tag);
        let engine = engine();
        let cache = Cache::open(&engine, &root.join("cwasm"), "test").expect("open");
        cache.put(&component(&engine), "a");
        assert!(cache.get(&engine, "a").is_some(), "its own entry loads");
        (root, engine, cache)
    }

    #[test]
    fn cache_refuses_a_directory_owned_by_another_user() {
        let root = scratch("foreign-dir");
        let dir = root.join("cwasm");
        std::fs::create_dir(&dir).expect("dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        chown(&dir, Some(OTHER_UID), Some(OTHER_UID)).expect("chown (the tests run as root)");
        let e = Cache::open(&engine(), &dir, "test")
            .err()
            .expect("a directory another user owns is refused");
        let text = e.to_string();
        assert!(text.contains(&dir.display().to_string()), "{text}");
        assert!(
            text.contains(&format!("owned by uid {OTHER_UID}")),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn cache_refuses_a_directory_others_can_write() {
        let root = scratch("loose-dir");
        let dir = root.join("cwasm");
        std::fs::create_dir(&dir).expect("dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = Cache::open(&engine(), &dir, "test")
            .err()
            .expect("a world-writable directory is refused");
        assert!(e.to_string().contains("writable by group or others"), "{e}");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn cache_never_loads_an_entry_owned_by_another_user() {
        let (root, engine, cache) = cache_with_entry("foreign-entry");
        let entry = cache.path_for("a");
        chown(&entry, Some(OTHER_UID), Some(OTHER_UID)).expect("chown (the tests run as root)");
        assert!(
            cache.get(&engine, "a").is_none(),
            "an entry another user owns is a miss, never deserialized"
        );
        // The next store replaces it with this host's own file.
        cache.put(&component(&engine), "a");
        assert_eq!(std::fs::metadata(&entry).expect("entry").uid(), euid());
        assert!(cache.get(&engine, "a").is_some());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn cache_refuses_a_group_or_other_writable_entry() {
        for mode in [0o620, 0o602] {
            let (root, engine, cache) = cache_with_entry("loose-entry");
            let entry = cache.path_for("a");
            std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(mode)).expect("chmod");
            assert!(
                cache.get(&engine, "a").is_none(),
                "an entry with mode {mode:o} is refused"
            );
            let _ = std::fs::remove_dir_all(&root);
        }
    }

    #[test]
    fn cache_refuses_a_symlinked_entry() {
        let (root, engine, cache) = cache_with_entry("symlink-entry");
        // An entry for component `b` that is a symlink to the (valid, own) entry of `a`: the
        // host would run `a`'s code while reporting `b`'s hash.
        symlink(cache.path_for("a"), cache.path_for("b")).expect("symlink");
        assert!(
            cache.get(&engine, "b").is_none(),
            "a symlinked entry is never followed"
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn own_entries_are_private_whatever_the_umask() {
        let (root, _engine, cache) = cache_with_entry("mode");
        let mode = std::fs::metadata(cache.path_for("a"))
            .expect("entry")
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn runtimes_with_different_plugin_memory_limits_get_different_cache_keys() {
        let root = scratch("keys");
        let key = |mib: usize| {
            let rt = PluginRuntime::new(RuntimeConfig {
                max_plugin_memory: mib << 20,
                max_instances: 2,
                cache_dir: Some(root.join("cwasm")),
                ..RuntimeConfig::default()
            })
            .expect("runtime");
            rt.cache_path_for("same-component").expect("a cache")
        };
        assert_ne!(key(64), key(4096));
        assert_eq!(key(64), key(64), "the key is stable");
        let _ = std::fs::remove_dir_all(&root);
    }
}

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
//!
//! Ownership says who wrote an entry, not what it was compiled from: an entry of component A
//! copied (by this same user, or a tool of theirs) to the name of component B would run A's
//! code under B's verified signature. So every entry also carries an HMAC-SHA256, under a key
//! kept in the cache directory (32 random bytes, created once, checked like an entry), of the
//! content hash it was compiled from, the engine tag and the artifact: an entry is loaded only
//! for the component and engine it was compiled for, by a cache holding its key. The key
//! stands against a misplaced or replaced entry, not against a process of this user that reads
//! the key (such a process can replace the host's binary as well).

use std::fs::{DirBuilder, File, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use rustix::fs::{Mode, OFlags};
use sha2::{Digest, Sha256};
use wasmtime::Engine;
#[cfg(test)]
use wasmtime::component::Component;

use crate::error::RuntimeError;

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

/// The right to compile one component into the cache, held until dropped (the kernel lets it
/// go when the process dies): see [`Cache::lock_compile`].
pub(crate) struct CompileLock(#[allow(dead_code)] File);

/// The cache directory plus the engine fingerprint its file names embed.
pub(crate) struct Cache {
    dir: PathBuf,
    engine_tag: String,
    /// This process's effective uid: the only owner whose files are trusted.
    uid: u32,
    /// The key that binds each entry to the component it was compiled from.
    key: [u8; KEY_BYTES],
}

/// The first bytes of every entry: the format, so an entry of an older sharehost (a bare
/// artifact) is a miss, never deserialized.
const ENTRY_MAGIC: &[u8; 8] = b"shcwasm1";
/// Bytes of the entry's HMAC-SHA256 after the magic.
const TAG_BYTES: usize = 32;
/// Magic plus tag: where the artifact starts.
const ENTRY_HEADER: usize = ENTRY_MAGIC.len() + TAG_BYTES;
/// Bytes of the cache's key.
const KEY_BYTES: usize = 32;
/// The key's file in the cache directory.
const KEY_FILE: &str = "key";

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
        let err = |error| RuntimeError::CacheDir {
            path: dir.to_owned(),
            error,
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
        let mut cache = Self {
            dir: dir.to_owned(),
            engine_tag,
            uid,
            key: [0; KEY_BYTES],
        };
        cache.key = cache.load_or_create_key().map_err(err)?;
        Ok(cache)
    }

    /// The cache's key: read from its file when that is trusted (checked like an entry) and
    /// whole, else a new random one. A new key is linked into place only where none exists, so
    /// two hosts opening a new cache at once end up with the same key; an untrusted or short
    /// key file is replaced, which turns every entry into a miss (compiled again).
    fn load_or_create_key(&self) -> std::io::Result<[u8; KEY_BYTES]> {
        let path = self.dir.join(KEY_FILE);
        let read = |file: &mut File| -> std::io::Result<Option<[u8; KEY_BYTES]>> {
            let mut bytes = Vec::with_capacity(KEY_BYTES);
            file.take(KEY_BYTES as u64 + 1).read_to_end(&mut bytes)?;
            Ok(<[u8; KEY_BYTES]>::try_from(bytes.as_slice()).ok())
        };
        let replace = match self.open_trusted(&path) {
            Ok(Some(mut file)) => match read(&mut file)? {
                Some(key) => return Ok(key),
                None => {
                    tracing::warn!(path = %path.display(), "the cache key is not {KEY_BYTES} bytes; replacing it (every entry compiles again)");
                    true
                }
            },
            Ok(None) => false,
            Err(reason) => {
                tracing::warn!(path = %path.display(), reason = %reason, "refusing an untrusted cache key; replacing it (every entry compiles again)");
                true
            }
        };
        let key: [u8; KEY_BYTES] = rand::random();
        let tmp = self.write_private(&path, &[&key])?;
        if replace {
            return std::fs::rename(&tmp, &path).map(|()| key);
        }
        // Linked, not renamed: a key another host created meanwhile is kept, and read back.
        let linked = std::fs::hard_link(&tmp, &path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(key),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                match self.open_trusted(&path) {
                    Ok(Some(mut file)) => read(&mut file)?.ok_or_else(|| {
                        std::io::Error::other(format!("{}: not {KEY_BYTES} bytes", path.display()))
                    }),
                    Ok(None) => Err(std::io::Error::other(format!(
                        "{}: vanished while it was being created",
                        path.display()
                    ))),
                    Err(reason) => Err(std::io::Error::other(format!(
                        "{}: {reason}",
                        path.display()
                    ))),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// The tag that binds `artifact` to the component (`content_hash`) and the engine it was
    /// compiled for, under this cache's key.
    fn tag(&self, content_hash: &str) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256>>::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(content_hash.as_bytes());
        mac.update(&[0]);
        mac.update(self.engine_tag.as_bytes());
        mac.update(&[0]);
        mac
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

    /// Waits (up to `patience`) until no other process or thread of this user compiles the
    /// component with this content hash for this cache, and holds that until the returned
    /// guard drops: a host that then finds the entry written loads it instead of compiling
    /// the same bytes again. Hosts started side by side (a test suite, several pipelines on one
    /// component, `check` beside `run`) each compiled an 18 MB Python component at once, and
    /// on two cores that multiplied the compile time by their number. `None` (compile without
    /// it) when the lock file cannot be opened or a holder keeps it past `patience`: a stopped
    /// process must not stop every other host from loading.
    pub(crate) fn lock_compile(
        &self,
        content_hash: &str,
        patience: std::time::Duration,
    ) -> Option<CompileLock> {
        let mut name = self.path_for(content_hash).into_os_string();
        name.push(".lock");
        let path = PathBuf::from(name);
        // A lock file is never read: it is opened without following a symlink, private,
        // and left in place (removing it would let two holders lock two different files).
        let file = match OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags((OFlags::NOFOLLOW | OFlags::CLOEXEC).bits() as i32)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot open the compile lock; compiling without it");
                return None;
            }
        };
        match file.try_lock() {
            Ok(()) => return Some(CompileLock(file)),
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(e)) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot take the compile lock; compiling without it");
                return None;
            }
        }
        tracing::info!(path = %path.display(), "another host is compiling this component; waiting for its artifact");
        // flock has no timeout: a thread blocks in it and hands the locked file over. Past
        // the patience the thread is left to take the lock and let it go at once (the file
        // drops with the refused send).
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let spawned = std::thread::Builder::new()
            .name("sharehost-compile-lock".into())
            .spawn(move || {
                let locked = file.lock().map(|()| file);
                let _ = tx.send(locked);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot wait for the compile lock; compiling without it");
            return None;
        }
        match rx.recv_timeout(patience) {
            Ok(Ok(file)) => Some(CompileLock(file)),
            Ok(Err(e)) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot take the compile lock; compiling without it");
                None
            }
            Err(_) => {
                tracing::warn!(path = %path.display(), waited_s = patience.as_secs(), "another host held the compile lock too long; compiling without it");
                None
            }
        }
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
        let mut entry = Vec::new();
        if let Err(e) = file.read_to_end(&mut entry) {
            tracing::warn!(path = %path.display(), error = %e, "cannot read a cache entry; compiling instead");
            return None;
        }
        let bound = entry.len() >= ENTRY_HEADER && entry.starts_with(ENTRY_MAGIC) && {
            let mut mac = self.tag(content_hash);
            mac.update(&entry[ENTRY_HEADER..]);
            // Constant time, though the tag is no secret to anyone who can read the entry.
            mac.verify_slice(&entry[ENTRY_MAGIC.len()..ENTRY_HEADER])
                .is_ok()
        };
        if !bound {
            tracing::warn!(path = %path.display(), "refusing a cache entry not compiled for this component by this cache (moved from another component's name, another cache's, or an older format); it is never loaded and will be replaced");
            return None;
        }
        entry.drain(..ENTRY_HEADER);
        Some(entry)
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
        let mut mac = self.tag(content_hash);
        mac.update(artifact);
        let tag = mac.finalize().into_bytes();
        if let Err(e) = self.store(&path, &[ENTRY_MAGIC, &tag, artifact]) {
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

    /// Writes an entry atomically: a new 0600 file (whatever the umask) in the same directory,
    /// then a rename, so a crash never leaves a half-written entry under the final name and a
    /// refused entry (or a symlink) is replaced, never written through.
    fn store(&self, path: &Path, parts: &[&[u8]]) -> std::io::Result<()> {
        let tmp = self.write_private(path, parts)?;
        std::fs::rename(&tmp, path)
    }

    /// Writes `parts` to a new private file beside `path` (named after it, this process and a
    /// count of this process's writes, so two threads never share one) and returns that
    /// file's path.
    fn write_private(&self, path: &Path, parts: &[&[u8]]) -> std::io::Result<PathBuf> {
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let tmp = self.dir.join(format!(
            ".{}.{}.{}.tmp",
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            std::process::id(),
            WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        // A leftover of a crashed process that had this pid.
        let _ = std::fs::remove_file(&tmp);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(OFlags::NOFOLLOW.bits() as i32)
            .open(&tmp)?;
        for part in parts {
            f.write_all(part)?;
        }
        f.sync_all()?;
        Ok(tmp)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{PermissionsExt, chown, symlink};

    use super::*;
    use crate::config::RuntimeConfig;
    use crate::engine::PluginRuntime;

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
    fn an_entry_moved_to_another_components_name_is_never_loaded() {
        let (root, engine, cache) = cache_with_entry("moved-entry");
        // This user's own file, with the right owner and mode, holding `a`'s code under the
        // name of component `b`: it would run `a` under `b`'s verified signature.
        std::fs::copy(cache.path_for("a"), cache.path_for("b")).expect("copy");
        std::fs::set_permissions(cache.path_for("b"), std::fs::Permissions::from_mode(0o600))
            .expect("chmod");
        assert!(cache.get(&engine, "b").is_none(), "bound to `a`, not `b`");
        assert!(cache.get(&engine, "a").is_some(), "still `a`'s own");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn an_entry_changed_or_written_without_the_key_is_never_loaded() {
        let (root, engine, cache) = cache_with_entry("forged-entry");
        let entry = cache.path_for("a");
        let good = std::fs::read(&entry).expect("entry");
        // One byte of the code changed.
        let mut changed = good.clone();
        let last = changed.len() - 1;
        changed[last] ^= 1;
        std::fs::write(&entry, &changed).expect("write");
        assert!(
            cache.get(&engine, "a").is_none(),
            "a changed entry is a miss"
        );
        // A bare artifact, as an older sharehost (or anyone without the key) writes it.
        std::fs::write(&entry, &good[ENTRY_HEADER..]).expect("write");
        assert!(
            cache.get(&engine, "a").is_none(),
            "an untagged entry is a miss"
        );
        // The next store replaces it with a bound one.
        cache.put(&component(&engine), "a");
        assert!(cache.get(&engine, "a").is_some());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn the_cache_key_is_kept_across_opens_and_replaced_when_untrusted() {
        let (root, engine, _cache) = cache_with_entry("key");
        let dir = root.join("cwasm");
        let key_path = dir.join(KEY_FILE);
        assert_eq!(
            std::fs::metadata(&key_path).expect("key").mode() & 0o777,
            0o600
        );
        let again = Cache::open(&engine, &dir, "test").expect("open");
        assert!(
            again.get(&engine, "a").is_some(),
            "a second open reads the same key"
        );
        // A key others could have written is not trusted: a new one, every entry a miss.
        std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let replaced = Cache::open(&engine, &dir, "test").expect("open");
        assert!(
            replaced.get(&engine, "a").is_none(),
            "entries of the old key"
        );
        assert_eq!(
            std::fs::metadata(&key_path).expect("key").mode() & 0o777,
            0o600,
            "the key was replaced by a private one"
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
    fn a_compile_lock_held_past_the_patience_is_given_up_and_one_let_go_is_taken() {
        let (root, _, cache) = cache_with_entry("lock");
        let held = cache
            .lock_compile("h", std::time::Duration::ZERO)
            .expect("free");
        // Another holder of the same component's lock (another process, or thread): refused
        // at its patience, so a stuck holder never stops a load.
        assert!(
            cache
                .lock_compile("h", std::time::Duration::from_millis(50))
                .is_none()
        );
        // Another component's lock is its own.
        assert!(
            cache
                .lock_compile("other", std::time::Duration::ZERO)
                .is_some()
        );
        // A waiter takes it when the holder lets go.
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let dir = root.join("cwasm");
            std::thread::spawn(move || {
                let cache = Cache::open(&engine(), &dir, "test").expect("cache");
                tx.send(()).expect("send");
                cache
                    .lock_compile("h", std::time::Duration::from_secs(600))
                    .is_some()
            })
        };
        rx.recv().expect("the waiter opened its cache");
        drop(held);
        assert!(waiter.join().expect("no panic"), "taken once let go");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn runtimes_whose_memory_limits_shape_no_code_share_cache_keys() {
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
        // The pool's default reservation compiles the same bounds checks whatever the limit
        // (the compact pool, which compiles the limit in, keys on it: engine.rs's test).
        assert_eq!(
            key(32),
            key(64),
            "test-plugin's limit and a manifest's share an entry"
        );
        assert_eq!(key(64), key(4096));
        assert_eq!(key(64), key(64), "the key is stable");
        let _ = std::fs::remove_dir_all(&root);
    }
}

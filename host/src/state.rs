//! Where the host keeps what must survive a restart: the active plugin version of each
//! pipeline (for rollback after a restart) and what `sharehost dlq replay` has replayed.
//! Small JSON files, each written atomically (a temporary file, then a rename).

use std::io::Write;
use std::path::{Path, PathBuf};

/// `$SHAREHOST_STATE_DIR`, else `state/` beside the precompiled cache
/// (`~/.cache/sharehost/state` by default): one place per user, like the cache.
pub fn default_state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SHAREHOST_STATE_DIR") {
        return PathBuf::from(d);
    }
    let cache = crate::runtime::default_cache_dir();
    cache
        .parent()
        .map(|p| p.join("state"))
        .unwrap_or_else(|| cache.join("state"))
}

/// Writes `bytes` to `path` so that a crash leaves either the old file or the new one, never
/// a torn one: a temporary file in the same directory, synced, then renamed over `path`.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_atomic_write_replaces_the_whole_file() {
        let dir = std::env::temp_dir().join(format!("sharehost-state-{}", std::process::id()));
        let path = dir.join("a.json");
        write_atomically(&path, b"first, longer content").expect("write");
        write_atomically(&path, b"second").expect("rewrite");
        assert_eq!(std::fs::read(&path).expect("read"), b"second");
        let leftovers = std::fs::read_dir(&dir).expect("dir").count();
        assert_eq!(leftovers, 1, "no temporary file left behind");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

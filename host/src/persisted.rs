//! Where the host keeps what must survive a restart: the active plugin version of each
//! pipeline (for rollback after a restart), each pipeline's member id, and what `sharehost dlq
//! replay` has replayed. Small files, each written atomically (a temporary file, then a
//! rename), except the member id's, which its lock guards.

use std::io::{Read, Seek, Write};
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

/// `name` as part of a state file's name: the characters Kafka allows in topic and group names
/// (ASCII letters, digits, `.`, `_`, `-`) kept, anything else (a path separator) made `_`.
/// Every state file named after a pipeline, group, cluster or topic goes through here.
pub fn file_name_part(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
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

/// A pipeline's member id, kept across restarts: a host that comes back after a crash rejoins
/// its share group as the same member (the coordinator takes a heartbeat at member epoch 0
/// with a known member id as that member rejoining, and answers with its partitions at once),
/// instead of joining as a new member while the dead one keeps its partitions until the
/// group's session timeout (45 s by default).
///
/// The file is held under an exclusive `flock` for as long as this value lives, so two live
/// processes never share a member id: a second process finds it taken and joins with a fresh
/// one. The kernel drops the lock when its process dies, however it dies.
#[derive(Debug)]
pub struct MemberIdentity {
    id: String,
    /// Holds the lock; closing it releases the id.
    _file: std::fs::File,
}

/// What [`MemberIdentity::claim`] found.
#[derive(Debug)]
pub enum Claim {
    /// The id this pipeline used before (`reused`) or a new one now kept for it.
    Claimed {
        /// The identity, held.
        identity: MemberIdentity,
        /// Whether the id was there from an earlier run.
        reused: bool,
    },
    /// Another live process holds this pipeline's id: use a fresh one, kept nowhere.
    Taken,
}

impl MemberIdentity {
    /// The member id kept at `path` (created, with `fresh`, when there is none or it is not a
    /// valid member id), locked for this process.
    pub fn claim(path: &Path, fresh: &str) -> std::io::Result<Claim> {
        use rustix::fs::{FlockOperation, flock};
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(Claim::Taken),
            Err(e) => return Err(e.into()),
        }
        let mut text = String::new();
        // At most a member id's length is read: the file is ours, but not trusted blindly.
        (&mut file).take(64).read_to_string(&mut text).ok();
        let kept = text.trim();
        if is_member_id(kept) {
            return Ok(Claim::Claimed {
                identity: MemberIdentity {
                    id: kept.to_owned(),
                    _file: file,
                },
                reused: true,
            });
        }
        file.set_len(0)?;
        file.rewind()?;
        file.write_all(fresh.as_bytes())?;
        file.sync_all()?;
        Ok(Claim::Claimed {
            identity: MemberIdentity {
                id: fresh.to_owned(),
                _file: file,
            },
            reused: false,
        })
    }

    /// The member id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// What the broker accepts as a member id (1 to 36 characters), written by us: ASCII letters,
/// digits and dashes.
fn is_member_id(s: &str) -> bool {
    (1..=36).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_id_is_kept_across_claims_and_never_shared_by_two_live_holders() {
        let dir = std::env::temp_dir().join(format!("sharehost-member-{}", std::process::id()));
        let path = dir.join("p.member");
        let _ = std::fs::remove_file(&path);
        let Ok(Claim::Claimed { identity, reused }) = MemberIdentity::claim(&path, "first-id")
        else {
            panic!("the first claim takes the id");
        };
        assert!(!reused);
        assert_eq!(identity.id(), "first-id");
        assert!(
            matches!(MemberIdentity::claim(&path, "other"), Ok(Claim::Taken)),
            "a second holder while the first lives is refused"
        );
        drop(identity);
        let Ok(Claim::Claimed { identity, reused }) = MemberIdentity::claim(&path, "other") else {
            panic!("the id is free again once its holder is gone");
        };
        assert!(reused, "and it is the same id");
        assert_eq!(identity.id(), "first-id");
        drop(identity);
        std::fs::write(&path, "not a member id!\n").expect("corrupt it");
        let Ok(Claim::Claimed { identity, reused }) = MemberIdentity::claim(&path, "fresh-id")
        else {
            panic!("a corrupt file is replaced");
        };
        assert!(!reused);
        assert_eq!(identity.id(), "fresh-id");
        let _ = std::fs::remove_dir_all(&dir);
    }

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

//! Where the host keeps what must survive a restart: the active plugin version of each
//! pipeline (for rollback after a restart), each pipeline's member id, and what `sharehost dlq
//! replay` has replayed. Small files, each written atomically (a temporary file, then a
//! rename), except the member id's, which its lock guards.
//!
//! A member id can also outlive the state directory: a host given a stable name
//! ([`MEMBER_NAME_ENV`], a StatefulSet's pod name) derives each pipeline's id from it, so a pod
//! replaced with an empty state directory still rejoins as the member it was
//! (docs/deploy.md, "A replaced pod").

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
///
/// An id derived from the host's name ([`MemberName`]) with no state file to hold it is not
/// locked: the name is the promise that no other live host uses it.
#[derive(Debug)]
pub struct MemberIdentity {
    id: String,
    /// Holds the lock; closing it releases the id. `None` for a name's id kept nowhere.
    _file: Option<std::fs::File>,
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
                    _file: Some(file),
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
                _file: Some(file),
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

/// The environment variable that gives a host a name stable across replacement (set from the
/// downward API's `metadata.name` in a StatefulSet, whose pods keep their names). Each
/// pipeline's member id is derived from it when the state directory keeps none, so a pod
/// replaced with an empty state directory rejoins its groups as the member it was, instead of
/// leaving its partitions to the dead member until the group's session timeout. At most one
/// live host may carry a name: a StatefulSet names each pod once; a Deployment gains nothing
/// from it (its replacements get new names) and must never set a fixed value, which every
/// replica would share.
pub const MEMBER_NAME_ENV: &str = "SHAREHOST_MEMBER_NAME";

/// The longest name accepted: a Kubernetes object name (a DNS subdomain) is at most 253.
const MEMBER_NAME_MAX: usize = 253;

/// The namespace of the member ids derived from a name. Fixed for good: another value would
/// give every named host new member ids (each replaced pod's first rejoin after such an
/// upgrade would wait for the session timeout once).
const MEMBER_NAMESPACE: uuid::Uuid =
    uuid::Uuid::from_u128(0xc15a_a8ab_74e9_4b30_826e_f3af_a65b_4610);

/// A host's name, stable across replacement ([`MEMBER_NAME_ENV`]): 1 to 253 ASCII letters,
/// digits, `.`, `-` and `_` (every Kubernetes pod name fits), so that it can be part of a file
/// name and of the derivation's input without escaping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberName(String);

/// Why [`MEMBER_NAME_ENV`] cannot name this host. The host does not guess past it: a pipeline
/// fails to start (and is retried) with this as its error, since running under a random id
/// instead would quietly bring back the wait a name is there to avoid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemberNameError {
    /// Set, but to nothing.
    #[error("{MEMBER_NAME_ENV} is set but empty: unset it or give this host's stable name")]
    Empty,
    /// Longer than any Kubernetes object name.
    #[error("{MEMBER_NAME_ENV} is {len} bytes long, more than {MEMBER_NAME_MAX}")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// A character a pod name never has.
    #[error(
        "{MEMBER_NAME_ENV} has {found:?} at character {at}: only ASCII letters, digits, '.', '-' and '_' may name a host"
    )]
    Character {
        /// Its position (0-based, in characters).
        at: usize,
        /// The character.
        found: char,
    },
    /// Not valid Unicode.
    #[error("{MEMBER_NAME_ENV} is not valid Unicode")]
    NotUnicode,
}

impl MemberName {
    /// `name`, checked.
    pub fn new(name: &str) -> Result<MemberName, MemberNameError> {
        if name.is_empty() {
            return Err(MemberNameError::Empty);
        }
        if let Some((at, found)) = name
            .chars()
            .enumerate()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
        {
            return Err(MemberNameError::Character { at, found });
        }
        if name.len() > MEMBER_NAME_MAX {
            return Err(MemberNameError::TooLong { len: name.len() });
        }
        Ok(MemberName(name.to_owned()))
    }

    /// The name [`MEMBER_NAME_ENV`] gives, if it is set.
    pub fn from_env() -> Result<Option<MemberName>, MemberNameError> {
        match std::env::var_os(MEMBER_NAME_ENV) {
            None => Ok(None),
            Some(v) => {
                let v = v.into_string().map_err(|_| MemberNameError::NotUnicode)?;
                MemberName::new(&v).map(Some)
            }
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The member id of `pipeline` in `group` on the host of this name: the same on every
    /// host and every run given the same three, and different when any of them differs. A
    /// name-based UUID (RFC 9562) of SHA-256 over [`MEMBER_NAMESPACE`] and `NAME/PIPELINE/GROUP`,
    /// as its section 5.8 (version 8) describes; version 5 would need SHA-1, which the host has
    /// no other use for. `/` separates without ambiguity: neither a name nor a pipeline's name
    /// may hold one. Written hyphenated, 36 characters: what the broker accepts.
    pub fn member_id(&self, pipeline: &str, group: &str) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new()
            .chain_update(MEMBER_NAMESPACE.as_bytes())
            .chain_update(self.0.as_bytes())
            .chain_update(b"/")
            .chain_update(pipeline.as_bytes())
            .chain_update(b"/")
            .chain_update(group.as_bytes())
            .finalize();
        let mut bytes = [0u8; 16];
        for (b, d) in bytes.iter_mut().zip(digest.iter()) {
            *b = *d;
        }
        uuid::Builder::from_custom_bytes(bytes)
            .into_uuid()
            .hyphenated()
            .to_string()
    }
}

/// The file that keeps a pipeline's member id beside its state file `P.G.json`: `P.G.member`
/// for a host without a name; with one, the name's own, `P.G@NAME.member`. A state directory
/// that several differently named hosts share (podman turns an `emptyDir` into one volume for
/// every pod) must never hand one name's kept id to another: that host would then be the
/// member whose own host comes back under its name.
pub fn member_file(state_file: &Path, name: Option<&MemberName>) -> PathBuf {
    match name {
        None => state_file.with_extension("member"),
        Some(n) => {
            let stem = state_file
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            state_file.with_file_name(format!("{stem}@{}.member", n.as_str()))
        }
    }
}

/// How [`choose_member`] chose a pipeline's member id, for the caller to log and join with.
#[derive(Debug)]
pub enum MemberChoice {
    /// Claimed in the state directory: the id kept there (`reused`), else a new one (derived
    /// from the name when there is one, random otherwise) now kept there.
    Kept {
        /// The identity, held.
        identity: MemberIdentity,
        /// Whether the id was there from an earlier run.
        reused: bool,
    },
    /// The name's id, kept nowhere: there is no state file, or it cannot be used (`unusable`).
    Named {
        /// The identity (not locked).
        identity: MemberIdentity,
        /// Why the state file could not keep it, if there is one.
        unusable: Option<std::io::Error>,
    },
    /// Another live process on this state directory holds the id (the same name given to
    /// two hosts, or two unnamed hosts sharing the directory): join with a fresh random id,
    /// kept nowhere, rather than share one.
    Taken {
        /// The file it holds.
        file: PathBuf,
    },
    /// No name, and no usable state file: join with a fresh random id.
    Fresh {
        /// Why the state file could not keep an id, if there is one.
        unusable: Option<(PathBuf, std::io::Error)>,
    },
}

impl MemberChoice {
    /// The identity to join with; `None` for a fresh random one.
    pub fn into_identity(self) -> Option<MemberIdentity> {
        match self {
            MemberChoice::Kept { identity, .. } | MemberChoice::Named { identity, .. } => {
                Some(identity)
            }
            MemberChoice::Taken { .. } | MemberChoice::Fresh { .. } => None,
        }
    }
}

/// The member id `pipeline` in `group` joins with. The rule: an id the state directory keeps
/// for this host wins (a restart, or a volume kept across pods); else, with a `name`, the id
/// derived from it (a replaced pod with an empty state directory); else a fresh random one
/// (`fresh`), kept in the state directory for the next restart. An id another live process
/// holds is never used.
pub fn choose_member(
    state_file: Option<&Path>,
    name: Option<&MemberName>,
    pipeline: &str,
    group: &str,
    fresh: impl FnOnce() -> String,
) -> MemberChoice {
    let derived = name.map(|n| n.member_id(pipeline, group));
    let Some(state_file) = state_file else {
        return match derived {
            Some(id) => MemberChoice::Named {
                identity: MemberIdentity { id, _file: None },
                unusable: None,
            },
            None => MemberChoice::Fresh { unusable: None },
        };
    };
    let file = member_file(state_file, name);
    let new_id = derived.clone().unwrap_or_else(fresh);
    match MemberIdentity::claim(&file, &new_id) {
        Ok(Claim::Claimed { identity, reused }) => MemberChoice::Kept { identity, reused },
        Ok(Claim::Taken) => MemberChoice::Taken { file },
        Err(e) => match derived {
            Some(id) => MemberChoice::Named {
                identity: MemberIdentity { id, _file: None },
                unusable: Some(e),
            },
            None => MemberChoice::Fresh {
                unusable: Some((file, e)),
            },
        },
    }
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

    /// A directory of this test's own, empty.
    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sharehost-{tag}-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    fn name(s: &str) -> MemberName {
        MemberName::new(s).expect("a valid name")
    }

    /// The identity of a choice that must have found one.
    fn held(choice: MemberChoice) -> (MemberIdentity, bool) {
        match choice {
            MemberChoice::Kept { identity, reused } => (identity, reused),
            other => panic!("expected an id claimed in the state directory, got {other:?}"),
        }
    }

    #[test]
    fn a_names_member_id_is_fixed_valid_and_apart_for_every_name_pipeline_and_group() {
        let id = name("sharehost-0").member_id("orders", "orders-validators");
        // Pinned: replaced pods find their members only while the derivation stays the same
        // (the same value as Python's hashlib over the namespace's bytes and the text, with
        // RFC 9562's version 8 and variant bits set).
        assert_eq!(id, "999ddb9e-f4ad-8821-80f1-50177c5a909e");
        assert!(is_member_id(&id), "the broker accepts it: {id}");
        let parsed = uuid::Uuid::parse_str(&id).expect("a UUID");
        assert_eq!(parsed.get_version_num(), 8);
        assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122);
        let others = [
            name("sharehost-1").member_id("orders", "orders-validators"),
            name("sharehost-0").member_id("orders2", "orders-validators"),
            name("sharehost-0").member_id("orders", "orders-validators2"),
            // The separator cannot be moved between the parts.
            name("sharehost-0").member_id("orders", "orders/validators"),
        ];
        for other in &others {
            assert_ne!(&id, other);
        }
    }

    #[test]
    fn a_name_is_what_a_pod_may_be_called() {
        for ok in [
            "sharehost-0",
            "a",
            "web.example-1_x",
            &"x".repeat(MEMBER_NAME_MAX),
        ] {
            assert_eq!(
                MemberName::new(ok).map(|n| n.as_str().to_owned()),
                Ok(ok.to_owned())
            );
        }
        assert_eq!(MemberName::new(""), Err(MemberNameError::Empty));
        assert_eq!(
            MemberName::new(&"x".repeat(MEMBER_NAME_MAX + 1)),
            Err(MemberNameError::TooLong {
                len: MEMBER_NAME_MAX + 1
            })
        );
        assert_eq!(
            MemberName::new("pod/0"),
            Err(MemberNameError::Character { at: 3, found: '/' })
        );
        assert_eq!(
            MemberName::new("pöd 0"),
            Err(MemberNameError::Character { at: 1, found: 'ö' })
        );
        let e = MemberName::new("a b").expect_err("a space");
        assert!(e.to_string().contains(MEMBER_NAME_ENV), "{e}");
    }

    #[test]
    fn a_replaced_host_with_an_empty_state_directory_rejoins_under_its_names_id() {
        let (first, second) = (scratch("named-a"), scratch("named-b"));
        let state = |dir: &Path| dir.join("pipelines/orders.g.json");
        let n = name("sharehost-0");
        let random = || panic!("a named host never makes a random id");
        let (old, reused) = held(choose_member(
            Some(&state(&first)),
            Some(&n),
            "orders",
            "g",
            random,
        ));
        assert!(!reused);
        assert_eq!(old.id(), n.member_id("orders", "g"));
        // The replacement: the same name, a new (empty) state directory, the old pod gone.
        drop(old);
        let (new, reused) = held(choose_member(
            Some(&state(&second)),
            Some(&n),
            "orders",
            "g",
            random,
        ));
        assert!(!reused, "nothing was kept there");
        assert_eq!(new.id(), n.member_id("orders", "g"), "the same member");
        // With no state file at all, the name alone gives it (not locked).
        let Some(identity) = choose_member(None, Some(&n), "orders", "g", random).into_identity()
        else {
            panic!("a name gives an id without a state file");
        };
        assert_eq!(identity.id(), n.member_id("orders", "g"));
        drop(new);
        // An id the state directory keeps for the name wins over the derived one.
        let kept = member_file(&state(&second), Some(&n));
        std::fs::write(&kept, "kept-before-0123").expect("write");
        let (identity, reused) = held(choose_member(
            Some(&state(&second)),
            Some(&n),
            "orders",
            "g",
            random,
        ));
        assert!(reused);
        assert_eq!(identity.id(), "kept-before-0123");
        for d in [first, second] {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    #[test]
    fn hosts_sharing_a_state_directory_never_take_each_others_names_id() {
        let dir = scratch("shared");
        let state = dir.join("pipelines/orders.g.json");
        let (a, b) = (name("sharehost-0"), name("sharehost-1"));
        let random = || panic!("a named host never makes a random id");
        let (held_a, _) = held(choose_member(Some(&state), Some(&a), "orders", "g", random));
        let (held_b, _) = held(choose_member(Some(&state), Some(&b), "orders", "g", random));
        assert_eq!(held_a.id(), a.member_id("orders", "g"));
        assert_eq!(held_b.id(), b.member_id("orders", "g"));
        // sharehost-0 dies; sharehost-1's pipeline restarts before its replacement comes: it
        // must not take sharehost-0's id, which the replacement is about to join with.
        drop(held_a);
        drop(held_b);
        let (again_b, reused) = held(choose_member(Some(&state), Some(&b), "orders", "g", random));
        assert!(reused);
        assert_eq!(again_b.id(), b.member_id("orders", "g"));
        let (again_a, _) = held(choose_member(Some(&state), Some(&a), "orders", "g", random));
        assert_eq!(again_a.id(), a.member_id("orders", "g"));
        // Two live hosts given one name on one directory: the second joins as someone new.
        assert!(matches!(
            choose_member(Some(&state), Some(&a), "orders", "g", random),
            MemberChoice::Taken { .. }
        ));
        // A host without a name keeps its own random id in a file of its own.
        let (unnamed, reused) = held(choose_member(Some(&state), None, "orders", "g", || {
            "random-id-1".to_owned()
        }));
        assert!(!reused);
        assert_eq!(unnamed.id(), "random-id-1");
        assert_eq!(
            std::fs::read_to_string(dir.join("pipelines/orders.g.member")).expect("read"),
            "random-id-1"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_state_directory_that_cannot_keep_an_id_leaves_the_name_or_a_fresh_one() {
        let dir = scratch("unusable");
        // A regular file where the state's directory should be.
        std::fs::write(dir.join("pipelines"), b"").expect("write");
        let state = dir.join("pipelines/orders.g.json");
        let n = name("sharehost-0");
        match choose_member(Some(&state), Some(&n), "orders", "g", String::new) {
            MemberChoice::Named {
                identity,
                unusable: Some(_),
            } => assert_eq!(identity.id(), n.member_id("orders", "g")),
            other => panic!("the name's id, unkept: {other:?}"),
        }
        assert!(matches!(
            choose_member(Some(&state), None, "orders", "g", String::new),
            MemberChoice::Fresh { unusable: Some(_) }
        ));
        assert!(matches!(
            choose_member(None, None, "orders", "g", String::new),
            MemberChoice::Fresh { unusable: None }
        ));
        let _ = std::fs::remove_dir_all(dir);
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

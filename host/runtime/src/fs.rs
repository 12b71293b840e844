//! The bounded reader of the files a load reads (components and their signatures), with an
//! error of its own: a path is opened first (non-blocking, so a FIFO never blocks the open),
//! then the *opened* file is examined (fstat): anything but a regular file is refused by type,
//! and a file larger than the caller's maximum is refused by size before a byte is read. The
//! read itself is bounded too, so a file that grows after the check cannot push it past the
//! maximum. No path can make a load hang or exhaust memory.
//!
//! Its callers say what a refusal means for them: a component load names the setting that
//! raises the maximum (`component_file.rs`), a signature check calls an oversized file no
//! signature (`trust.rs`).

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

/// Why a file could not be read. Describes the file and never quotes its bytes: a path may
/// point at a secret the caller could not otherwise read (the host may run as another user).
#[derive(Debug, thiserror::Error)]
pub(crate) enum FileError {
    /// Opening, examining or reading the file failed.
    #[error("{path}: {error}")]
    Read {
        /// The path.
        path: PathBuf,
        /// What the file system said.
        error: std::io::Error,
    },
    /// The path names something other than a regular file (a directory, a FIFO, a device).
    #[error("{path}: {what}")]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is instead, e.g. "is a directory".
        what: &'static str,
    },
    /// The file is larger than the caller's maximum.
    #[error("{path}: is {size} bytes, more than the {maximum}-byte maximum")]
    TooLarge {
        /// The path.
        path: PathBuf,
        /// Its size in bytes (as examined, or as far as the bounded read got).
        size: u64,
        /// The caller's maximum.
        maximum: u64,
    },
}

/// Describes a file type that is not a regular file, as the rest of an error line.
fn what_it_is(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "is a directory"
    } else if ft.is_fifo() {
        "is a FIFO (named pipe), not a regular file"
    } else if ft.is_char_device() {
        "is a character device, not a regular file"
    } else if ft.is_block_device() {
        "is a block device, not a regular file"
    } else if ft.is_socket() {
        "is a socket, not a regular file"
    } else {
        "is not a regular file"
    }
}

/// Opens `path` and checks that the opened file is a regular file of at most `max_bytes`;
/// returns it with its size. `O_NONBLOCK` makes opening a FIFO return at once (it is then
/// refused by type); it has no effect on regular files.
pub(crate) fn open_regular(path: &Path, max_bytes: u64) -> Result<(File, u64), FileError> {
    let read_err = |error: std::io::Error| FileError::Read {
        path: path.to_owned(),
        error,
    };
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(|e| read_err(e.into()))?;
    let file = File::from(fd);
    let meta = file.metadata().map_err(read_err)?;
    if !meta.file_type().is_file() {
        return Err(FileError::NotAFile {
            path: path.to_owned(),
            what: what_it_is(meta.file_type()),
        });
    }
    if meta.len() > max_bytes {
        return Err(FileError::TooLarge {
            path: path.to_owned(),
            size: meta.len(),
            maximum: max_bytes,
        });
    }
    Ok((file, meta.len()))
}

/// Reads a regular file of at most `max_bytes` (a FIFO cannot hang the read, `/dev/zero`
/// cannot fill memory).
pub(crate) fn read_regular(path: &Path, max_bytes: u64) -> Result<Vec<u8>, FileError> {
    let (file, size) = open_regular(path, max_bytes)?;
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    // One byte more than allowed tells a file that grew since the fstat from one that did not.
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|error| FileError::Read {
            path: path.to_owned(),
            error,
        })?;
    if bytes.len() as u64 > max_bytes {
        return Err(FileError::TooLarge {
            path: path.to_owned(),
            size: bytes.len() as u64,
            maximum: max_bytes,
        });
    }
    Ok(bytes)
}

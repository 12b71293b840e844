//! The bounded reader of every file the host reads (components and their signatures, the
//! manifest, secret files, trusted-key files), with an error of its own: a path is opened first (non-blocking, so a FIFO never blocks the open),
//! then the *opened* file is examined (fstat): anything but a regular file is refused by type,
//! and a file larger than the caller's maximum is refused by size before a byte is read. The
//! read itself is bounded too, so a file that grows after the check cannot push it past the
//! maximum. No path can make a load hang or exhaust memory.
//!
//! Its callers say what a refusal means for them: a component load names the setting that
//! raises the maximum (`component_file.rs`), a signature check calls an oversized file no
//! signature (`trust.rs`), the manifest names the file and its bound.
//!
//! [`read_line`] bounds a line of a stream the same way (`test-plugin`'s JSON lines): a line
//! longer than its maximum is refused after reading at most that many bytes of it.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

/// Why a file could not be read. Describes the file and never quotes its bytes: a path may
/// point at a secret the caller could not otherwise read (the host may run as another user).
#[derive(Debug, thiserror::Error)]
pub enum FileError {
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
pub fn open_regular(path: &Path, max_bytes: u64) -> Result<(File, u64), FileError> {
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
pub fn read_regular(path: &Path, max_bytes: u64) -> Result<Vec<u8>, FileError> {
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

/// Reads a regular file of at most `max_bytes` as UTF-8 text (a manifest, a key file); text
/// that is not UTF-8 is refused naming the file, never quoting it.
pub fn read_regular_text(path: &Path, max_bytes: u64) -> Result<String, FileError> {
    let bytes = read_regular(path, max_bytes)?;
    String::from_utf8(bytes).map_err(|_| FileError::Read {
        path: path.to_owned(),
        error: std::io::Error::new(std::io::ErrorKind::InvalidData, "is not UTF-8 text"),
    })
}

/// Reads the next line of `reader` into `line` (cleared first, the newline left out), reading
/// at most `max_bytes` of it: `Ok(false)` at the end of the stream, an
/// [`std::io::ErrorKind::InvalidData`] error naming the bound for a longer line. A stream
/// of one endless line never holds more than `max_bytes` in memory.
pub fn read_line(
    reader: &mut impl std::io::BufRead,
    line: &mut Vec<u8>,
    max_bytes: usize,
) -> std::io::Result<bool> {
    use std::io::BufRead;
    line.clear();
    let limit = u64::try_from(max_bytes)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    let read = reader.by_ref().take(limit).read_until(b'\n', line)?;
    if read == 0 {
        return Ok(false);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if line.len() > max_bytes {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a line is longer than the {max_bytes}-byte maximum"),
        ));
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_over_the_bound_is_refused_after_the_bound() {
        let mut input = std::io::Cursor::new(b"short\n0123456789\nlast".to_vec());
        let mut line = Vec::new();
        assert!(read_line(&mut input, &mut line, 10).expect("short"));
        assert_eq!(line, b"short");
        // Ten bytes and a newline: exactly the bound.
        assert!(read_line(&mut input, &mut line, 10).expect("ten"));
        assert_eq!(line, b"0123456789");
        assert!(read_line(&mut input, &mut line, 10).expect("last"));
        assert_eq!(line, b"last");
        assert!(!read_line(&mut input, &mut line, 10).expect("end"));
        let mut endless = std::io::repeat(b'x');
        let mut reader = std::io::BufReader::new(&mut endless);
        let e = read_line(&mut reader, &mut line, 1000).expect_err("endless");
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("1000-byte maximum"), "{e}");
        assert!(line.len() <= 1001);
    }

    #[test]
    fn text_that_is_not_utf8_is_refused_naming_the_file() {
        let f = std::env::temp_dir().join(format!("sharehost-fs-latin1-{}", std::process::id()));
        std::fs::write(&f, b"caf\xe9").expect("write");
        let e = read_regular_text(&f, 100).expect_err("latin-1");
        assert_eq!(e.to_string(), format!("{}: is not UTF-8 text", f.display()));
        let e = read_regular_text(Path::new("/dev/zero"), 100).expect_err("device");
        assert!(e.to_string().contains("character device"), "{e}");
        let _ = std::fs::remove_file(&f);
    }
}

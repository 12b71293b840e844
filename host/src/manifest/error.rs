//! The one error a manifest can have: [`ManifestError`], located in its file (line, column and
//! the field in dotted form), and how a position in the text or a TOML error becomes one.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::runtime::fs::FileError;

/// A manifest problem, located in its file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ManifestError {
    /// The manifest file.
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// The field in dotted form (`pipeline[0].batch_size`), when known.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let (Some(l), Some(c)) = (self.line, self.column) {
            write!(f, ":{l}:{c}")?;
        }
        write!(f, ": ")?;
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl ManifestError {
    /// The manifest file itself could not be read, or is not a regular file of at most its
    /// bound (the reader's error names the file; the message says what is wrong with it).
    pub(super) fn unreadable(file: &Path, e: &FileError) -> ManifestError {
        let message = match e {
            FileError::Read { error, .. } => format!("cannot read the manifest: {error}"),
            FileError::NotAFile { what, .. } => {
                format!("cannot read the manifest: it {what}")
            }
            FileError::TooLarge { size, maximum, .. } => format!(
                "cannot read the manifest: it is {size} bytes, more than a manifest's {maximum}-byte ({} MiB) maximum",
                maximum >> 20
            ),
        };
        ManifestError {
            file: file.to_path_buf(),
            line: None,
            column: None,
            field: None,
            message,
        }
    }

    /// The text is not TOML, or not the manifest's shape (an unknown field, a wrong type).
    pub(super) fn from_toml(file: &Path, text: &str, e: &toml::de::Error) -> ManifestError {
        let (line, column) = e
            .span()
            .map(|s| line_column(text, s.start))
            .map(|(l, c)| (Some(l), Some(c)))
            .unwrap_or((None, None));
        // serde names unknown fields but not the field whose value has the wrong type: take
        // the key written on the error's line.
        let message = e.message().trim().to_owned();
        let field = line
            .and_then(|l| text.lines().nth(l - 1))
            .and_then(|l| l.split_once('='))
            .map(|(k, _)| k.trim().to_owned())
            .filter(|k| {
                !k.is_empty()
                    && !message.contains(&format!("`{k}`"))
                    && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
        ManifestError {
            file: file.to_path_buf(),
            line,
            column,
            field,
            message,
        }
    }
}

/// The 1-based line and column of a byte offset into `text` (an offset past the end counts as
/// the end).
pub(super) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = sharehost_text::cut(text, offset);
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map(|i| before.len() - i)
        .unwrap_or(before.len() + 1);
    (line, column)
}

#[cfg(test)]
mod tests {
    use crate::manifest::testing::{MINIMAL, dir, parse};

    #[test]
    fn unknown_fields_name_line_and_field() {
        let text = MINIMAL.replace(
            "group = \"orders-g\"",
            "group = \"orders-g\"\nbatchsize = 10",
        );
        let e = parse(&text).expect_err("unknown field");
        assert_eq!(e.line, Some(9), "{e}");
        assert!(e.message.contains("unknown field `batchsize`"), "{e}");
    }

    #[test]
    fn bad_values_name_line_and_field() {
        let text = MINIMAL.replace(
            "group = \"orders-g\"",
            "group = \"orders-g\"\nbatch_size = 0",
        );
        let e = parse(&text).expect_err("bad value");
        assert_eq!(
            e.to_string(),
            format!(
                "{}:9:14: pipeline[0].batch_size: must be between 1 and 10000 (got 0)",
                dir().join("m.toml").display()
            )
        );
    }
}

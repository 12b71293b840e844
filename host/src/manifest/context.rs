//! What every validator shares: the manifest being read ([`Ctx`]: its file and text), which
//! turns a value's span into a [`ManifestError`] at its line and column, checks a value against
//! its documented range or choices, and resolves a path against the manifest's folder.

use std::ops::{Range, RangeInclusive};
use std::path::{Path, PathBuf};

use toml::Spanned;

use super::error::{ManifestError, line_column};

/// The manifest being validated.
pub(super) struct Ctx<'a> {
    /// The manifest file: named in every error, and the folder relative paths start from.
    pub(super) file: &'a Path,
    /// Its text, to turn spans into lines and columns.
    pub(super) text: &'a str,
}

impl Ctx<'_> {
    /// An error about `field`, at `span` when the value has one.
    pub(super) fn err(
        &self,
        span: Option<Range<usize>>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> ManifestError {
        let (line, column) = match span {
            Some(s) => {
                let (l, c) = line_column(self.text, s.start);
                (Some(l), Some(c))
            }
            None => (None, None),
        };
        ManifestError {
            file: self.file.to_path_buf(),
            line,
            column,
            field: Some(field.into()),
            message: message.into(),
        }
    }

    /// An integer in `range`, or `default` when it is not written.
    pub(super) fn int<T: TryFrom<i64>>(
        &self,
        v: &Option<Spanned<i64>>,
        field: &str,
        range: RangeInclusive<i64>,
        default: T,
    ) -> Result<T, ManifestError> {
        let Some(v) = v else { return Ok(default) };
        let n = *v.get_ref();
        if !range.contains(&n) {
            return Err(self.err(
                Some(v.span()),
                field,
                format!(
                    "must be between {} and {} (got {n})",
                    range.start(),
                    range.end()
                ),
            ));
        }
        T::try_from(n).map_err(|_| self.err(Some(v.span()), field, format!("{n} is out of range")))
    }

    /// One of the words in `choices`, or `default` when it is not written.
    pub(super) fn choice<T: Copy>(
        &self,
        v: &Option<Spanned<String>>,
        field: &str,
        choices: &[(&str, T)],
        default: T,
    ) -> Result<T, ManifestError> {
        let Some(v) = v else { return Ok(default) };
        let word = v.get_ref().as_str();
        if let Some((_, value)) = choices.iter().find(|(w, _)| *w == word) {
            return Ok(*value);
        }
        let listed: Vec<String> = choices.iter().map(|(w, _)| format!("{w:?}")).collect();
        Err(self.err(
            Some(v.span()),
            field,
            format!("{word:?} is not one of {}", listed.join(", ")),
        ))
    }

    /// A path as written, resolved against the manifest's folder when relative.
    pub(super) fn path(&self, v: &Spanned<String>) -> PathBuf {
        let p = Path::new(v.get_ref());
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.file.parent().unwrap_or(Path::new(".")).join(p)
        }
    }
}

/// A name that appears in metrics, logs, URLs and headers (a pipeline's, an output's): 1-64
/// letters, digits, '-' or '_'.
pub(super) fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

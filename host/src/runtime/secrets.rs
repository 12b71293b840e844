//! Secrets: values a pipeline hands its plugin's `init` (contract 0.2), resolved by the host
//! from the environment or files (`[pipeline.secrets]`), that the host itself never shows.
//!
//! The host keeps them out of its own output: [`Secrets`] prints only names, and every text a
//! plugin sends to the host's log, its captured stdout/stderr, its fault messages and its
//! reject reasons (which travel into acknowledgements and dead letters) goes through
//! [`Secrets::redact`], which replaces each secret value with `[secret NAME]`. A plugin that
//! deliberately encodes a secret (reversed, in base64) defeats this: redaction guards against
//! accidents, the allow-list and the outputs' grant against intent.

use std::borrow::Cow;

/// Values shorter than this are not redacted: replacing every `a` or `42` in the log would
/// garble it and protect nothing (such a secret is guessable anyway). Documented in
/// docs/manifest.md.
pub const MIN_REDACTED_LEN: usize = 4;

/// A pipeline's secrets, name and value, in manifest order.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secrets {
    pairs: Vec<(String, String)>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.pairs.iter().map(|(name, _)| name))
            .finish()
    }
}

impl Secrets {
    /// Secrets from resolved `(name, value)` pairs.
    pub fn new(pairs: Vec<(String, String)>) -> Self {
        Self { pairs }
    }

    /// The pairs as `init` receives them.
    pub(crate) fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    /// The secrets' names (safe to show).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.pairs.iter().map(|(n, _)| n.as_str())
    }

    /// Whether there is nothing to redact (the common case costs one check per text).
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// `text` with every secret value replaced by `[secret NAME]`.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for (name, value) in &self.pairs {
            if value.len() >= MIN_REDACTED_LEN && out.contains(value.as_str()) {
                out = Cow::Owned(out.replace(value.as_str(), &format!("[secret {name}]")));
            }
        }
        out
    }

    /// Redacts an owned string in place (no copy when it holds no secret).
    pub(crate) fn redact_owned(&self, text: String) -> String {
        match self.redact(&text) {
            Cow::Borrowed(_) => text,
            Cow::Owned(s) => s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_values_are_replaced_by_their_name_and_never_printed() {
        let s = Secrets::new(vec![
            ("api-token".into(), "tok-12345".into()),
            ("pin".into(), "42".into()),
        ]);
        assert_eq!(
            s.redact("calling with tok-12345 and tok-12345, pin 42"),
            "calling with [secret api-token] and [secret api-token], pin 42"
        );
        assert!(matches!(s.redact("nothing here"), Cow::Borrowed(_)));
        let debug = format!("{s:?}");
        assert!(
            debug.contains("api-token") && !debug.contains("tok-12345"),
            "{debug}"
        );
    }
}

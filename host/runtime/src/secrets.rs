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
    /// Indices of the values long enough to redact, longest first: a secret that is a
    /// prefix of another must not be replaced inside the longer one, leaving its tail.
    longest_first: Vec<usize>,
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
        let mut longest_first: Vec<usize> = (0..pairs.len())
            .filter(|&i| pairs[i].1.len() >= MIN_REDACTED_LEN)
            .collect();
        longest_first.sort_by_key(|&i| std::cmp::Reverse(pairs[i].1.len()));
        Self {
            pairs,
            longest_first,
        }
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

    fn redactable(&self) -> impl Iterator<Item = &(String, String)> {
        self.longest_first.iter().map(|&i| &self.pairs[i])
    }

    /// `text` with every secret value replaced by `[secret NAME]`, longest value first.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for (name, value) in self.redactable() {
            if out.contains(value.as_str()) {
                out = Cow::Owned(out.replace(value.as_str(), &format!("[secret {name}]")));
            }
        }
        out
    }

    /// [`Secrets::redact`] on bytes (an emit's key, value or header, which may not be text):
    /// every secret value's bytes replaced by `[secret NAME]`, longest value first.
    pub fn redact_bytes<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        let mut out = Cow::Borrowed(bytes);
        for (name, value) in self.redactable() {
            let needle = value.as_bytes();
            if !out.windows(needle.len()).any(|w| w == needle) {
                continue;
            }
            let mark = format!("[secret {name}]");
            let mut redacted = Vec::with_capacity(out.len());
            let mut at = 0;
            while at < out.len() {
                if out[at..].starts_with(needle) {
                    redacted.extend_from_slice(mark.as_bytes());
                    at += needle.len();
                } else {
                    redacted.push(out[at]);
                    at += 1;
                }
            }
            out = Cow::Owned(redacted);
        }
        out
    }

    /// [`Secrets::redact`] ignoring ASCII case: for texts the host has lower-cased itself (a
    /// request's host name), where a secret used as a name no longer matches as written.
    // `lower` is `out` with ASCII letters lower-cased, byte for byte: its match positions are
    // character boundaries of `out` too.
    #[allow(clippy::string_slice)]
    pub fn redact_ignoring_case(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (name, value) in self.redactable() {
            let needle = value.to_ascii_lowercase();
            // One pass from left to right: the replacement may itself hold the needle.
            let lower = out.to_ascii_lowercase();
            let mut redacted = String::with_capacity(out.len());
            let mut from = 0;
            for (at, _) in lower.match_indices(&needle) {
                redacted.push_str(&out[from..at]);
                redacted.push_str(&format!("[secret {name}]"));
                from = at + needle.len();
            }
            redacted.push_str(&out[from..]);
            out = redacted;
        }
        out
    }

    /// What the host writes of a plugin's text: redacted first, then cut to `max` bytes (on
    /// a character boundary), so a secret crossing the cut is never left in part. When the
    /// text was already cut where it was read (`cut_before`: only a prefix was taken from the
    /// guest), a tail that begins a secret is dropped as well.
    pub fn redact_then_cut(&self, text: &str, max: usize, cut_before: bool) -> String {
        let mut out = self.redact(text).into_owned();
        if cut_before {
            self.drop_secret_start(&mut out);
        }
        sharehost_text::truncate(&mut out, max);
        out
    }

    /// Drops the longest tail of `text` that is the beginning of a secret value (what is left
    /// of a secret that a cut went through).
    pub(crate) fn drop_secret_start(&self, text: &mut String) {
        let mut keep = text.len();
        for (_, value) in self.redactable() {
            let v = value.as_bytes();
            // Only the last `len - 1` bytes can start a secret that runs past the end.
            let from = text.len().saturating_sub(v.len() - 1);
            for at in from..text.len() {
                if at < keep && text.is_char_boundary(at) && v.starts_with(&text.as_bytes()[at..]) {
                    keep = at;
                    break;
                }
            }
        }
        // `keep` is the text's length or a character boundary found above.
        sharehost_text::truncate(text, keep);
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

    #[test]
    fn a_secret_that_begins_another_leaves_no_tail_of_the_longer() {
        let s = Secrets::new(vec![
            ("short".into(), "abcd".into()),
            ("long".into(), "abcdefgh".into()),
        ]);
        assert_eq!(
            s.redact("x abcdefgh y abcd"),
            "x [secret long] y [secret short]"
        );
    }

    #[test]
    fn a_secret_crossing_a_cut_is_redacted_before_it() {
        let s = Secrets::new(vec![("token".into(), "tok-0123456789".into())]);
        // Cut by the host: the whole secret was there, so it is replaced, then the text cut.
        let text = format!("{}tok-0123456789 and more", "x".repeat(10));
        let out = s.redact_then_cut(&text, 16, false);
        assert!(!out.contains("tok-"), "{out}");
        assert_eq!(out, format!("{}[secre", "x".repeat(10)));
        // Cut where it was read: the tail that begins the secret is dropped.
        let read = format!("{}tok-012", "x".repeat(10));
        assert_eq!(s.redact_then_cut(&read, 1024, true), "x".repeat(10));
        // Nothing dropped when the tail begins no secret.
        let read = format!("{}tax", "x".repeat(10));
        assert_eq!(s.redact_then_cut(&read, 1024, true), read);
    }

    #[test]
    fn a_lower_cased_secret_is_redacted() {
        let s = Secrets::new(vec![("host".into(), "Secret-Host-Name".into())]);
        assert_eq!(
            s.redact_ignoring_case("https://secret-host-name.example.com:443"),
            "https://[secret host].example.com:443"
        );
        // A value that its own replacement contains is replaced once.
        let s = Secrets::new(vec![("x".into(), "SECRET".into())]);
        assert_eq!(s.redact_ignoring_case("a secret b"), "a [secret x] b");
    }
}

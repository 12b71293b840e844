//! Cutting text to a byte bound without panicking.
//!
//! Text from outside (a record's JSON error, a guest's log line, a header, a reason) may hold
//! multibyte characters anywhere, and `String::truncate` or `&s[..n]` panic when `n` falls
//! inside one. Every place in the workspace that bounds text goes through these functions (the
//! workspace's clippy configuration refuses `String::truncate` elsewhere), so the rule lives in
//! one place: cut at the last character boundary at or below the bound.

use std::borrow::Cow;

/// The mark appended where [`cut_marked`] or [`truncate_marked`] cut text.
pub const MARK: &str = "…";

/// The longest prefix of `text` that is at most `max_bytes` long and ends on a character
/// boundary.
pub fn cut(text: &str, max_bytes: usize) -> &str {
    #[allow(clippy::string_slice)] // a character boundary by construction
    &text[..text.floor_char_boundary(max_bytes)]
}

/// Shortens `text` in place to at most `max_bytes`, on a character boundary.
pub fn truncate(text: &mut String, max_bytes: usize) {
    let at = text.floor_char_boundary(max_bytes);
    #[allow(clippy::disallowed_methods)] // `at` is a character boundary
    text.truncate(at);
}

/// `text` cut to at most `max_bytes` (the mark included) with [`MARK`] where it was cut, so a
/// reader sees that something is missing; unchanged when it fits.
pub fn cut_marked(text: &str, max_bytes: usize) -> Cow<'_, str> {
    if text.len() <= max_bytes {
        return Cow::Borrowed(text);
    }
    let mut out = cut(text, max_bytes.saturating_sub(MARK.len())).to_owned();
    out.push_str(MARK);
    Cow::Owned(out)
}

/// Shortens `text` in place like [`cut_marked`].
pub fn truncate_marked(text: &mut String, max_bytes: usize) {
    if text.len() > max_bytes {
        truncate(text, max_bytes.saturating_sub(MARK.len()));
        text.push_str(MARK);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_cut_inside_a_character_keeps_the_whole_characters_before_it() {
        let euros = "€".repeat(100); // 3 bytes each
        assert_eq!(cut(&euros, 200), "€".repeat(66));
        let mut s = euros.clone();
        truncate(&mut s, 200);
        assert_eq!(s, "€".repeat(66));
        assert_eq!(cut("abc", 10), "abc");
        assert_eq!(cut("€", 0), "");
    }

    #[test]
    fn a_marked_cut_says_so_and_stays_within_the_bound() {
        let text = "ab€cd".repeat(50);
        let out = cut_marked(&text, 20);
        assert!(out.ends_with(MARK));
        assert!(out.len() <= 20);
        assert_eq!(cut_marked("short", 20), "short");
        let mut s = text.clone();
        truncate_marked(&mut s, 20);
        assert_eq!(s, out);
    }

    proptest! {
        #[test]
        fn no_bound_panics_and_every_result_is_a_prefix_within_it(text in ".{0,64}", max in 0usize..300) {
            let c = cut(&text, max);
            prop_assert!(c.len() <= max);
            prop_assert!(text.starts_with(c));
            let m = cut_marked(&text, max);
            prop_assert!(m.len() <= max.max(MARK.len()));
        }
    }
}

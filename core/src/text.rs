//! Cutting text to a limit without splitting a UTF-8 character.
//!
//! Kubernetes limits names, label values, Event notes and status messages in bytes; people read
//! reasons in characters. Each function here says which it counts and whether it marks the cut:
//!
//! - [`truncate_at_char_boundary`]: at most `max_bytes` bytes, no mark; the one place that looks
//!   for a character boundary;
//! - [`truncate_with_marker`]: at most `max_bytes` bytes *with* the mark (`…`, `...`) when cut;
//! - [`truncate_chars`]: at most `max_chars` characters with `…` as the last one when cut.
//!
//! A mark that must carry a figure (how many bytes were left out) is built by its caller around
//! [`truncate_at_char_boundary`].

use std::borrow::Cow;

/// The longest prefix of `text` that is at most `max_bytes` bytes long and ends on a character
/// boundary: `text` itself when it fits, else shorter than `max_bytes` by at most 3 bytes (the
/// rest of a character that did not fit). Nothing is appended.
pub fn truncate_at_char_boundary(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` when it is at most `max_bytes` bytes long; else its longest prefix that leaves room
/// for `marker` within `max_bytes` (on a character boundary), followed by `marker`. A `marker`
/// longer than `max_bytes` is appended to an empty prefix, so only then the result exceeds it.
pub fn truncate_with_marker<'a>(text: &'a str, max_bytes: usize, marker: &str) -> Cow<'a, str> {
    if text.len() <= max_bytes {
        return Cow::Borrowed(text);
    }
    let head = truncate_at_char_boundary(text, max_bytes.saturating_sub(marker.len()));
    Cow::Owned(format!("{head}{marker}"))
}

/// `text` when it has at most `max_chars` characters; else its first `max_chars - 1` characters
/// followed by `…`, `max_chars` characters in all (just `…` when `max_chars` is 0 or 1).
pub fn truncate_chars(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max_chars.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// `s` cut to at most `max` bytes on a character boundary, without a trailing `-` or `.`, so that
/// it still ends a DNS name.
pub fn trim_to_dns_end(s: &str, max: usize) -> &str {
    truncate_at_char_boundary(s, max).trim_end_matches(['-', '.'])
}

/// FNV-1a (64 bit): a small hash that is stable across builds and platforms, for names that must
/// not change with the compiler.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_cut_on_a_character_boundary() {
        assert_eq!(truncate_at_char_boundary("héllo", 10), "héllo");
        assert_eq!(truncate_at_char_boundary("héllo", 3), "hé");
        // inside the two bytes of `é`: back to before it
        assert_eq!(truncate_at_char_boundary("héllo", 2), "h");
        assert_eq!(truncate_at_char_boundary("héllo", 0), "");
        assert_eq!(truncate_at_char_boundary("", 5), "");
        assert_eq!(truncate_at_char_boundary("日本", 5), "日");
    }

    #[test]
    fn a_marker_fits_within_the_limit() {
        assert_eq!(truncate_with_marker("short", 10, "..."), "short");
        assert!(matches!(
            truncate_with_marker("short", 5, "..."),
            Cow::Borrowed(_)
        ));
        assert_eq!(truncate_with_marker("abcdefgh", 6, "..."), "abc...");
        assert_eq!(truncate_with_marker("abcdefgh", 6, "…"), "abc…");
        assert_eq!(truncate_with_marker("aé€x", 6, "…").len(), 6);
        assert_eq!(truncate_with_marker("aé€x", 6, "…"), "aé…");
        for max in 0..40 {
            let s = "日本語のテキスト, with ASCII too";
            let cut = truncate_with_marker(s, max, "…");
            if s.len() > max && max >= 3 {
                assert!(cut.len() <= max && cut.ends_with('…'), "{max}: {cut}");
            }
        }
        // a marker longer than the limit: only the marker
        assert_eq!(truncate_with_marker("abcdef", 2, "..."), "...");
    }

    #[test]
    fn chars_end_with_an_ellipsis() {
        assert_eq!(truncate_chars("héllo", 3), "hé…");
        assert_eq!(truncate_chars("héllo", 5), "héllo");
        assert_eq!(truncate_chars("héllo", 1), "…");
        assert_eq!(truncate_chars("héllo", 0), "…");
        assert_eq!(truncate_chars("", 0), "");
    }

    #[test]
    fn a_trimmed_name_ends_a_dns_name() {
        assert_eq!(trim_to_dns_end("abc-def", 4), "abc");
        assert_eq!(trim_to_dns_end("ab.-cd", 4), "ab");
        assert_eq!(trim_to_dns_end("aé", 2), "a");
        assert_eq!(trim_to_dns_end("short", 63), "short");
    }

    #[test]
    fn the_hash_is_fnv1a() {
        // the published FNV-1a 64-bit test vectors
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}

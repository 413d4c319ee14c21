//! What the names the operator makes (attempt pods, task labels, claim templates) are built
//! from when a readable name is too long for Kubernetes: a stable hash of the whole, and the
//! readable head cut to what is left.

use carma_core::text::truncate_at_char_boundary;

/// `s` cut to at most `max` bytes on a character boundary, without a trailing `-` or `.` (so it
/// still ends a DNS name).
pub(crate) fn trim_to(s: &str, max: usize) -> &str {
    truncate_at_char_boundary(s, max).trim_end_matches(['-', '.'])
}

/// FNV-1a: a small hash that is stable across builds and platforms (names made from it must not
/// change with the compiler).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trimmed_name_ends_a_dns_name() {
        assert_eq!(trim_to("abc-def", 4), "abc");
        assert_eq!(trim_to("ab.-cd", 4), "ab");
        assert_eq!(trim_to("aé", 2), "a");
        assert_eq!(trim_to("short", 63), "short");
    }

    #[test]
    fn the_hash_is_fnv1a() {
        // the published FNV-1a 64-bit test vectors
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}

//! OSC address pattern matching.
//!
//! OSC 1.0 wildcards within one path segment (`?`, `*`, `[a-z]`, `[!a-z]`,
//! `{foo,bar}`) and OSC 1.1 path traversal (`//` matches any number of segments,
//! including none). Addresses that start with `!` (the O2 convention) are literal: they
//! never contain wildcards, so [`is_literal`] lets a dispatcher skip matching entirely.
//!
//! Matching works on the borrowed strings with bounded recursion and a bounded amount
//! of work per call, so hostile patterns cannot blow up the time spent. This module must
//! never allocate.

/// Upper bound on the matching steps one [`matches()`] call may take; a pattern that needs
/// more is treated as not matching.
pub const MAX_MATCH_STEPS: u32 = 20_000;

/// Whether `address` (or pattern) can be looked up literally: it starts with `!`, or it
/// starts with `/` and contains no wildcard characters and no `//`.
pub fn is_literal(address: &str) -> bool {
    is_literal_bytes(address.as_bytes())
}

/// [`is_literal`] on bytes.
#[inline]
pub fn is_literal_bytes(b: &[u8]) -> bool {
    match b.first() {
        Some(b'!') => true,
        Some(b'/') => {
            let mut prev_slash = false;
            for &c in b {
                let class = BYTE_CLASS[c as usize];
                if class == WILDCARD || (class == SLASH && prev_slash) {
                    return false;
                }
                prev_slash = class == SLASH;
            }
            true
        }
        _ => false,
    }
}

const WILDCARD: u8 = 1;
const SLASH: u8 = 2;

/// Which bytes matter when deciding whether an address is literal.
static BYTE_CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    t[b'*' as usize] = WILDCARD;
    t[b'?' as usize] = WILDCARD;
    t[b'[' as usize] = WILDCARD;
    t[b']' as usize] = WILDCARD;
    t[b'{' as usize] = WILDCARD;
    t[b'}' as usize] = WILDCARD;
    t[b'/' as usize] = SLASH;
    t
};

/// Whether one path segment (no `/`) contains OSC wildcard characters.
pub fn has_wildcards(segment: &[u8]) -> bool {
    segment.iter().any(|c| matches!(c, b'*' | b'?' | b'[' | b'{'))
}

/// Whether the address `pattern` matches the concrete `address`.
///
/// Both must start with `/`; a pattern starting with `!` matches only the identical
/// path (with `/` in place of the `!`).
///
/// ```
/// use netjam_osc::pattern::matches;
/// assert!(matches("/voice*/{freq,gain}", "/voice12/gain"));
/// assert!(matches("//freq", "/synth/voice3/freq"));
/// assert!(!matches("/voice[!0-9]", "/voice3"));
/// ```
pub fn matches(pattern: &str, address: &str) -> bool {
    let (p, a) = (pattern.as_bytes(), address.as_bytes());
    let (Some((&p0, prest)), Some((&b'/', arest))) = (p.split_first(), a.split_first()) else {
        return false;
    };
    match p0 {
        b'!' => prest == arest,
        b'/' => {
            let mut steps = MAX_MATCH_STEPS;
            match_path(prest, arest, &mut steps)
        }
        _ => false,
    }
}

fn split_segment(s: &[u8]) -> (&[u8], Option<&[u8]>) {
    match s.iter().position(|&c| c == b'/') {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    }
}

/// `p` and `a` are the remainders after a `/`.
fn match_path(p: &[u8], a: &[u8], steps: &mut u32) -> bool {
    if *steps == 0 {
        return false;
    }
    *steps -= 1;
    let (pseg, prest) = split_segment(p);
    if pseg.is_empty() {
        if let Some(prest) = prest {
            // `//`: try the rest of the pattern at this level and every deeper one.
            let mut cur = a;
            loop {
                if match_path(prest, cur, steps) {
                    return true;
                }
                match split_segment(cur).1 {
                    Some(next) => cur = next,
                    None => return false,
                }
            }
        }
    }
    let (aseg, arest) = split_segment(a);
    if !match_segment_budget(pseg, aseg, steps) {
        return false;
    }
    match (prest, arest) {
        (None, None) => true,
        (Some(p), Some(a)) => match_path(p, a, steps),
        _ => false,
    }
}

/// Whether one pattern segment matches one address segment (neither contains `/`).
pub fn match_segment(pattern: &[u8], name: &[u8]) -> bool {
    let mut steps = MAX_MATCH_STEPS;
    match_segment_budget(pattern, name, &mut steps)
}

fn match_segment_budget(p: &[u8], s: &[u8], steps: &mut u32) -> bool {
    let (mut p, mut s) = (p, s);
    loop {
        if *steps == 0 {
            return false;
        }
        *steps -= 1;
        let Some((&c, prest)) = p.split_first() else {
            return s.is_empty();
        };
        match c {
            b'*' => {
                let mut rest = prest;
                while let Some((&b'*', r)) = rest.split_first() {
                    rest = r;
                }
                if rest.is_empty() {
                    return true;
                }
                for i in 0..=s.len() {
                    if match_segment_budget(rest, &s[i..], steps) {
                        return true;
                    }
                    if *steps == 0 {
                        return false;
                    }
                }
                return false;
            }
            b'?' => {
                let Some((_, srest)) = s.split_first() else {
                    return false;
                };
                p = prest;
                s = srest;
            }
            b'[' => {
                let Some((&sc, srest)) = s.split_first() else {
                    return false;
                };
                let Some(close) = prest.iter().position(|&x| x == b']') else {
                    return false;
                };
                if !class_matches(&prest[..close], sc) {
                    return false;
                }
                p = &prest[close + 1..];
                s = srest;
            }
            b'{' => {
                let Some(close) = prest.iter().position(|&x| x == b'}') else {
                    return false;
                };
                let after = &prest[close + 1..];
                for alt in prest[..close].split(|&x| x == b',') {
                    if s.starts_with(alt) && match_segment_budget(after, &s[alt.len()..], steps) {
                        return true;
                    }
                    if *steps == 0 {
                        return false;
                    }
                }
                return false;
            }
            _ => {
                let Some((&sc, srest)) = s.split_first() else {
                    return false;
                };
                if sc != c {
                    return false;
                }
                p = prest;
                s = srest;
            }
        }
    }
}

/// `[...]` contents without the brackets. `!` first negates; `a-z` is a range; a `-`
/// first or last is literal.
fn class_matches(class: &[u8], c: u8) -> bool {
    let (negate, body) = match class.split_first() {
        Some((b'!', rest)) => (true, rest),
        _ => (false, class),
    };
    let mut found = false;
    let mut i = 0;
    while i < body.len() {
        let lo = body[i];
        if i + 2 < body.len() && body[i + 1] == b'-' {
            let hi = body[i + 2];
            if lo <= c && c <= hi {
                found = true;
            }
            i += 3;
        } else {
            if lo == c {
                found = true;
            }
            i += 1;
        }
    }
    found != negate
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal() {
        assert!(matches("/a/b", "/a/b"));
        assert!(!matches("/a/b", "/a/bc"));
        assert!(!matches("/a/b", "/a"));
        assert!(!matches("/a", "/a/b"));
        assert!(matches("!a/b", "/a/b"));
        assert!(!matches("!a/*", "/a/b"));
    }

    #[test]
    fn wildcards() {
        assert!(matches("/a/*", "/a/anything"));
        assert!(matches("/a/*", "/a/"));
        assert!(!matches("/a/*", "/a/b/c"));
        assert!(matches("/*/*", "/a/b"));
        assert!(matches("/a?c", "/abc"));
        assert!(!matches("/a?c", "/ac"));
        assert!(matches("/x*y*z", "/xaaybbz"));
        assert!(!matches("/x*y*z", "/xaaybb"));
        assert!(matches("/v[0-9]", "/v7"));
        assert!(!matches("/v[!0-9]", "/v7"));
        assert!(matches("/v[!0-9]", "/vx"));
        assert!(matches("/v[abc-]", "/v-"));
        assert!(matches("/v[-a]", "/v-"));
        assert!(matches("/{foo,bar}/x", "/bar/x"));
        assert!(!matches("/{foo,bar}/x", "/baz/x"));
        assert!(matches("/f{o,oo}d", "/food"));
        assert!(matches("/{,x}y", "/y"));
        assert!(!matches("/v[0-9", "/v7"));
        assert!(!matches("/{a", "/a"));
    }

    #[test]
    fn path_traversal() {
        assert!(matches("//freq", "/freq"));
        assert!(matches("//freq", "/a/b/c/freq"));
        assert!(!matches("//freq", "/a/b/c/gain"));
        assert!(matches("/a//freq", "/a/x/freq"));
        assert!(!matches("/a//freq", "/b/x/freq"));
        assert!(matches("//voice*//gain", "/synth/voice2/env/gain"));
    }

    #[test]
    fn literal_detection() {
        assert!(is_literal("/a/b"));
        assert!(is_literal("!a/b*"));
        assert!(!is_literal("/a/*"));
        assert!(!is_literal("//a"));
        assert!(!is_literal("a"));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_patterns_never_panic(p in "[/a-c*?\\[\\]!{},-]{0,24}", a in "[/a-c]{0,16}") {
            let _ = matches(&p, &a);
            let mut bytes = p.into_bytes();
            bytes.push(0);
            bytes.extend_from_slice(a.as_bytes());
            crate::fuzz::pattern(&bytes);
        }

        #[test]
        fn literal_patterns_match_only_themselves(a in "(/[a-z0-9]{1,4}){1,4}", b in "(/[a-z0-9]{1,4}){1,4}") {
            proptest::prop_assert_eq!(matches(&a, &b), a == b);
            proptest::prop_assert!(matches(&a, &a));
        }
    }

    #[test]
    fn hostile_pattern_is_bounded() {
        let p = format!("/{}b", "*a".repeat(40));
        let a = format!("/{}", "a".repeat(200));
        assert!(!matches(&p, &a));
    }
}

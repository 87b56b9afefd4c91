//! `namePattern` matching with Go's `filepath.Match` rules. Written here rather than taken
//! from the `glob` crate because that crate differs from Go (`[!x]` vs `[^x]`, `**`, escapes),
//! and a drop-in replacement must select exactly the entries upstream selects.

/// A parsed `namePattern`: comma-separated globs, any one of which selects an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NamePattern {
    globs: Vec<Vec<char>>,
}

impl NamePattern {
    /// Parses and checks every glob so a malformed pattern is a config error, not a silent
    /// "nothing matches". Empty pieces (`nvme*,` or `,sd?`) are skipped, as upstream skips
    /// them; a pattern with no glob at all would match nothing and is refused.
    pub(crate) fn parse(pattern: &str) -> Result<Self, String> {
        let mut globs = Vec::new();
        for part in pattern.split(',') {
            let glob: Vec<char> = part.trim().chars().collect();
            if glob.is_empty() {
                continue;
            }
            check_syntax(&glob).map_err(|e| format!("{pattern:?}: glob {:?} {e}", part.trim()))?;
            globs.push(glob);
        }
        if globs.is_empty() {
            return Err(format!(
                "{pattern:?} holds no glob (every comma-separated piece is empty); it would match nothing"
            ));
        }
        Ok(NamePattern { globs })
    }

    /// True when any glob matches the whole entry name.
    pub(crate) fn matches(&self, name: &str) -> bool {
        let name: Vec<char> = name.chars().collect();
        self.globs.iter().any(|g| match_here(g, &name))
    }
}

fn check_syntax(p: &[char]) -> Result<(), &'static str> {
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            '\\' => {
                if i + 1 >= p.len() {
                    return Err("ends with a lone backslash");
                }
                i += 2;
            }
            '[' => {
                let (_, next) = parse_class(p, i, None).ok_or("has an unterminated or malformed [...] class")?;
                i = next;
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// Parses the class starting at `p[start] == '['`. Returns whether `c` (if given) matched and
/// the index after the closing bracket, or None if malformed.
fn parse_class(p: &[char], start: usize, c: Option<char>) -> Option<(bool, usize)> {
    let mut i = start + 1;
    let negated = p.get(i) == Some(&'^');
    if negated {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let ch = *p.get(i)?;
        if ch == ']' && !first {
            i += 1;
            break;
        }
        first = false;
        let (lo, next) = class_char(p, i)?;
        i = next;
        let hi = if p.get(i) == Some(&'-') && p.get(i + 1).is_some_and(|&x| x != ']') {
            let (hi, next) = class_char(p, i + 1)?;
            i = next;
            hi
        } else {
            lo
        };
        if lo > hi {
            return None;
        }
        if let Some(c) = c
            && lo <= c
            && c <= hi
        {
            matched = true;
        }
    }
    Some((matched != negated, i))
}

fn class_char(p: &[char], i: usize) -> Option<(char, usize)> {
    match *p.get(i)? {
        '\\' => Some((*p.get(i + 1)?, i + 2)),
        '-' | ']' => None,
        ch => Some((ch, i + 1)),
    }
}

/// Backtracking matcher; entry names are short, so the simple form is fast enough.
fn match_here(p: &[char], s: &[char]) -> bool {
    let Some(&head) = p.first() else { return s.is_empty() };
    match head {
        '*' => {
            let rest = &p[1..];
            (0..=s.len()).take_while(|&n| n == 0 || s[n - 1] != '/').any(|n| match_here(rest, &s[n..]))
        }
        '?' => s.first().is_some_and(|&c| c != '/') && match_here(&p[1..], &s[1..]),
        '[' => match s.first() {
            Some(&c) if c != '/' => match parse_class(p, 0, Some(c)) {
                Some((true, next)) => match_here(&p[next..], &s[1..]),
                _ => false,
            },
            _ => false,
        },
        '\\' => p.len() > 1 && s.first() == Some(&p[1]) && match_here(&p[2..], &s[1..]),
        lit => s.first() == Some(&lit) && match_here(&p[1..], &s[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, name: &str) -> bool {
        NamePattern::parse(pattern).unwrap().matches(name)
    }

    #[test]
    fn go_filepath_match_cases() {
        // Cases from Go's path/filepath match tests that apply to single path elements.
        let cases = [
            ("abc", "abc", true),
            ("*", "abc", true),
            ("*c", "abc", true),
            ("a*", "a", true),
            ("a*", "abc", true),
            ("a*", "ab/c", false),
            ("a*b*c*d*e*/f", "axbxcxdxe/f", true),
            ("a*b?c*x", "abxbbxdbxebxczzx", true),
            ("a*b?c*x", "abxbbxdbxebxczzy", false),
            ("ab[c]", "abc", true),
            ("ab[b-d]", "abc", true),
            ("ab[e-g]", "abc", false),
            ("ab[^c]", "abc", false),
            ("ab[^b-d]", "abc", false),
            ("ab[^e-g]", "abc", true),
            ("a\\*b", "a*b", true),
            ("a\\*b", "ab", false),
            ("a?b", "a☺b", true),
            ("a[^a]b", "a☺b", true),
            ("a???b", "a☺b", false),
            ("[a-ζ]*", "α", true),
            ("*[a-ζ]", "A", false),
            ("a?b", "a/b", false),
            ("a*b", "a/b", false),
            ("[\\]a]", "]", true),
            ("[\\-]", "-", true),
            ("[x\\-]", "x", true),
            ("[x\\-]", "-", true),
            ("[x\\-]", "z", false),
            ("[\\-x]", "a", false),
            ("*x", "xxx", true),
            ("ssd*", "ssd1", true),
            ("ssd*", "hdd1", false),
        ];
        for (p, s, want) in cases {
            assert_eq!(m(p, s), want, "pattern {p:?} name {s:?}");
        }
    }

    #[test]
    fn comma_separated_any_matches() {
        assert!(m("ssd*,nvme*", "nvme0n1"));
        assert!(m("ssd*, nvme*", "ssd2"));
        assert!(!m("ssd*,nvme*", "sda"));
    }

    #[test]
    fn malformed_patterns_are_errors() {
        for p in ["[", "[^", "[^bc", "a[", "[]a]", "[-]", "[x-]", "[-x]", "\\", "[a-b-c]", "[z-a]", "nvme*,["] {
            assert!(NamePattern::parse(p).is_err(), "{p:?} should be rejected");
        }
    }

    #[test]
    fn empty_pieces_are_skipped_like_upstream() {
        // Upstream's discovery skips empty pieces of the comma-separated list.
        for (p, name, want) in [
            ("nvme*,", "nvme0n1", true),
            ("nvme*,", "sda", false),
            (",sd?", "sda", true),
            (",sd?", "nvme0n1", false),
            ("a,,b", "b", true),
            ("a, ,b", "a", true),
        ] {
            assert_eq!(m(p, name), want, "pattern {p:?} name {name:?}");
        }
        // Nothing but empty pieces would match nothing: refused.
        for p in [",", ",,", " , "] {
            let e = NamePattern::parse(p).unwrap_err();
            assert!(e.contains("holds no glob"), "{p:?}: {e}");
        }
    }
}

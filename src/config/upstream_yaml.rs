//! `labelsForPV` read exactly as upstream reads it. Upstream decodes its ConfigMap with
//! sigs.k8s.io/yaml v1.4.0: YAML 1.1 resolution by its fork of go-yaml v2, then a conversion to
//! JSON that turns numbers and booleans into strings when the target is a string, as the values
//! of `labelsForPV` (a `map[string]string`) are. The upstream Helm chart renders the values
//! unquoted (`tier : 1.10`), so a drop-in replacement must produce the very same label values
//! ("1.1"), not refuse them and not spell them its own way.
//!
//! The YAML is read as parser events (scalar text, quoting style and tag), since the meaning
//! of an unquoted scalar depends on exactly those, and resolved with go-yaml v2's rules. The
//! vectors in tests/fixtures/upstream-yaml were produced by upstream's own library and are
//! checked against this module in config::tests.

use std::collections::BTreeMap;

use serde_saphyr::granit_parser::{Event, Parser, ScalarStyle};

/// The core-schema tag prefix (`!!x` is `tag:yaml.org,2002:x`).
const CORE_TAG: &str = "tag:yaml.org,2002:";

/// A YAML node as far as labelsForPV needs one: scalars in full, collections by kind.
#[derive(Debug, Clone)]
enum Node {
    Scalar { value: String, style: ScalarStyle, tag: Option<(String, String)> },
    Sequence,
    Mapping(Vec<(Node, Node)>),
}

/// What go-yaml v2 resolves a scalar to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Resolved {
    /// `~`, `null`, an empty plain scalar...
    Null,
    /// YAML 1.1 booleans: `yes`, `On`, `n`, `TRUE`...
    Bool(bool),
    /// Anything Go's `strconv.ParseInt(s, 0, 64)` accepts once underscores are removed.
    Int(i64),
    /// Integers above i64's range that fit in u64.
    Uint(u64),
    /// YAML 1.1 floats, `.inf`, `.nan`.
    Float(f64),
    /// Everything else, and every quoted or block scalar.
    Str(String),
}

/// One label whose key or value upstream's parser did not read as the text written: the
/// warning an operator gets for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Conversion {
    /// The label key as upstream makes it.
    pub key: String,
    /// What was written (the key or the value), as it stands in the YAML.
    pub written: String,
    /// What upstream makes of it.
    pub result: String,
    /// Whether it is the key (else the value) that was converted.
    pub is_key: bool,
    /// What YAML made of it: "number", "boolean" or "null".
    pub kind: &'static str,
}

/// The labels upstream makes of a `labelsForPV` ConfigMap value, with every scalar that was
/// not read as plain text, or the reason upstream refuses the value.
pub(crate) fn upstream_labels(text: &str) -> Result<(BTreeMap<String, String>, Vec<Conversion>), String> {
    let root = parse_single_document(text)?;
    let entries = match root {
        None => return Ok((BTreeMap::new(), Vec::new())),
        Some(Node::Mapping(entries)) => entries,
        Some(Node::Scalar { value, style, tag }) => match resolve_node(&value, style, tag.as_ref())? {
            Resolved::Null => return Ok((BTreeMap::new(), Vec::new())),
            other => return Err(format!("expected a map of labels, got a {}", kind(&other))),
        },
        Some(Node::Sequence) => return Err("expected a map of labels, got a list".into()),
    };
    let mut labels = BTreeMap::new();
    let mut conversions = Vec::new();
    for (key_node, value_node) in entries {
        let Node::Scalar { value: key_text, style: key_style, tag: key_tag } = key_node else {
            return Err("a label key must be a plain value, not a list or a map".into());
        };
        let key = match resolve_node(&key_text, key_style, key_tag.as_ref())? {
            Resolved::Str(s) => s,
            Resolved::Null => return Err(format!("label key {key_text:?} is null; quote it")),
            Resolved::Uint(u) => {
                return Err(format!("label key {key_text:?} is a number too large for a map key ({u}); quote it"));
            }
            other => {
                let key = key_string(&other);
                conversions.push(Conversion {
                    key: key.clone(),
                    written: key_text.clone(),
                    result: key.clone(),
                    is_key: true,
                    kind: kind(&other),
                });
                key
            }
        };
        let value = match value_node {
            Node::Scalar { value, style, tag } => {
                let resolved = resolve_node(&value, style, tag.as_ref())?;
                let what = kind(&resolved);
                let converted = !matches!(resolved, Resolved::Str(_));
                let result = value_string(resolved);
                if converted {
                    conversions.push(Conversion {
                        key: key.clone(),
                        written: value.clone(),
                        result: result.clone(),
                        is_key: false,
                        kind: what,
                    });
                }
                result
            }
            Node::Sequence => return Err(format!("label {key:?}: expected a text value, got a list")),
            Node::Mapping(_) => return Err(format!("label {key:?}: expected a text value, got a map")),
        };
        // go-yaml v2 keeps the last of duplicate keys.
        labels.insert(key, value);
    }
    Ok((labels, conversions))
}

/// The one document of `text` (None when empty), with aliases replaced by their anchors.
fn parse_single_document(text: &str) -> Result<Option<Node>, String> {
    let mut events = Vec::new();
    for event in Parser::new_from_str(text) {
        let (event, span) = event.map_err(|e| format!("not valid YAML: {e}"))?;
        match event {
            // Presentation only: comments and anchor names are not nodes.
            Event::Comment(..) | Event::Anchor(..) => {}
            // The parser spells a value left out (`k:`) as "~"; nothing was written there.
            Event::Scalar(_, ScalarStyle::Plain, anchor, tag) if span.start.index() == span.end.index() => {
                events.push(Event::Scalar("".into(), ScalarStyle::Plain, anchor, tag));
            }
            other => events.push(other),
        }
    }
    let mut builder = Builder { events: events.into_iter(), anchors: BTreeMap::new() };
    let mut root = None;
    let mut documents = 0;
    while let Some(event) = builder.events.next() {
        match event {
            Event::DocumentStart(..) => {
                documents += 1;
                if documents > 1 {
                    return Err("holds several YAML documents; write one map of labels".into());
                }
            }
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => {}
            other => root = Some(builder.node(other)?),
        }
    }
    Ok(root)
}

struct Builder<'a, I: Iterator<Item = Event<'a>>> {
    events: I,
    anchors: BTreeMap<usize, Node>,
}

impl<'a, I: Iterator<Item = Event<'a>>> Builder<'a, I> {
    fn node(&mut self, event: Event<'a>) -> Result<Node, String> {
        let (node, anchor) = match event {
            Event::Scalar(value, style, anchor, tag) => {
                let tag = tag.map(|t| (t.handle().to_string(), t.suffix().to_string()));
                (Node::Scalar { value: value.into_owned(), style, tag }, anchor)
            }
            Event::Alias(id) => {
                return self.anchors.get(&id).cloned().ok_or_else(|| format!("alias to unknown anchor {id}"));
            }
            Event::SequenceStart(_, anchor, _) => {
                loop {
                    match self.next()? {
                        Event::SequenceEnd => break,
                        inner => {
                            self.node(inner)?;
                        }
                    }
                }
                (Node::Sequence, anchor)
            }
            Event::MappingStart(_, anchor, _) => {
                let mut entries = Vec::new();
                loop {
                    match self.next()? {
                        Event::MappingEnd => break,
                        key => {
                            let key = self.node(key)?;
                            let value = self.next()?;
                            let value = self.node(value)?;
                            entries.push((key, value));
                        }
                    }
                }
                (Node::Mapping(entries), anchor)
            }
            other => return Err(format!("unexpected YAML event {other:?}")),
        };
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        Ok(node)
    }

    fn next(&mut self) -> Result<Event<'a>, String> {
        self.events.next().ok_or_else(|| "the YAML ends in the middle of a collection".to_string())
    }
}

/// go-yaml v2's decoding of one scalar: a plain scalar without a tag is resolved, a quoted or
/// block one is a string, an explicit core tag forces (and checks) its type.
fn resolve_node(value: &str, style: ScalarStyle, tag: Option<&(String, String)>) -> Result<Resolved, String> {
    let Some((handle, suffix)) = tag else {
        return Ok(match style {
            ScalarStyle::Plain => resolve_plain(value),
            _ => Resolved::Str(value.to_string()),
        });
    };
    if handle != CORE_TAG {
        // Local and non-specific tags (`!foo`, `!`) are not resolvable: the text is kept.
        return Ok(Resolved::Str(value.to_string()));
    }
    let resolved = resolve_plain(value);
    let mismatch = |what: &str| Err(format!("cannot decode {value:?} as a !!{what}"));
    match suffix.as_str() {
        "str" => Ok(Resolved::Str(value.to_string())),
        // A timestamp stays its text for upstream (go-yaml v2 keeps timestamps as strings
        // when decoding into an interface), but the tag demands one.
        "timestamp" if is_timestamp(value) => Ok(Resolved::Str(value.to_string())),
        "timestamp" => mismatch("timestamp"),
        "binary" => decode_base64(value)
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .map(Resolved::Str)
            .ok_or_else(|| format!("!!binary value {value:?} is not base64-encoded text")),
        "int" => match resolved {
            Resolved::Int(_) | Resolved::Uint(_) => Ok(resolved),
            _ => mismatch("int"),
        },
        "float" => match resolved {
            Resolved::Int(i) => Ok(Resolved::Float(i as f64)),
            Resolved::Float(_) => Ok(resolved),
            _ => mismatch("float"),
        },
        "bool" => match resolved {
            Resolved::Bool(_) => Ok(resolved),
            _ => mismatch("bool"),
        },
        "null" => match resolved {
            Resolved::Null => Ok(resolved),
            _ => mismatch("null"),
        },
        other => Err(format!("the tag !!{other} is not allowed on a label")),
    }
}

/// go-yaml v2's `resolve` for an untagged plain scalar.
pub(crate) fn resolve_plain(s: &str) -> Resolved {
    match s {
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Resolved::Bool(true);
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Resolved::Bool(false);
        }
        "" | "~" | "null" | "Null" | "NULL" => return Resolved::Null,
        ".nan" | ".NaN" | ".NAN" => return Resolved::Float(f64::NAN),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => return Resolved::Float(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return Resolved::Float(f64::NEG_INFINITY),
        _ => {}
    }
    let string = || Resolved::Str(s.to_string());
    match s.as_bytes()[0] {
        // Go's ParseFloat takes Go literal syntax: underscores between digits are allowed.
        b'.' if underscores_ok(s) => {
            let plain: String = s.chars().filter(|&c| c != '_').collect();
            parse_go_float(&plain).map(Resolved::Float).unwrap_or_else(string)
        }
        b'0'..=b'9' | b'+' | b'-' => {
            // Timestamps (4 digits then '-') stay strings for upstream, and never parse as
            // numbers below, so they need no case of their own.
            let plain: String = s.chars().filter(|&c| c != '_').collect();
            if let Some(i) = parse_go_int(&plain) {
                return Resolved::Int(i);
            }
            if let Some(u) = parse_go_uint(&plain) {
                return Resolved::Uint(u);
            }
            if is_yaml_style_float(&plain)
                && let Some(f) = parse_go_float(&plain)
            {
                return Resolved::Float(f);
            }
            if let Some(digits) = plain.strip_prefix("0b") {
                if let Some(i) = parse_radix_i64(digits, 2, false) {
                    return Resolved::Int(i);
                }
                if let Some(u) = parse_radix_u64(digits, 2) {
                    return Resolved::Uint(u);
                }
            } else if let Some(digits) = plain.strip_prefix("-0b")
                && let Some(i) = parse_radix_i64(digits, 2, true)
            {
                return Resolved::Int(i);
            }
            string()
        }
        _ => string(),
    }
}

/// Go's `strconv.ParseInt(s, 0, 64)` (underscores already removed).
fn parse_go_int(s: &str) -> Option<i64> {
    let (negative, rest) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let (digits, radix) = split_radix(rest)?;
    parse_radix_i64(digits, radix, negative)
}

/// Go's `strconv.ParseUint(s, 0, 64)`: no sign allowed.
fn parse_go_uint(s: &str) -> Option<u64> {
    let (digits, radix) = split_radix(s)?;
    parse_radix_u64(digits, radix)
}

/// Go's base-0 prefixes: `0x`, `0o`, `0b` (any case, with at least one more character), a
/// leading `0` for octal, else decimal.
fn split_radix(s: &str) -> Option<(&str, u32)> {
    let b = s.as_bytes();
    if b.is_empty() {
        return None;
    }
    if b[0] != b'0' {
        return Some((s, 10));
    }
    if b.len() >= 3 {
        match b[1].to_ascii_lowercase() {
            b'x' => return Some((&s[2..], 16)),
            b'o' => return Some((&s[2..], 8)),
            b'b' => return Some((&s[2..], 2)),
            _ => {}
        }
    }
    // A bare "0" is octal zero for Go: no digit follows the prefix.
    let rest = &s[1..];
    Some((if rest.is_empty() { "0" } else { rest }, 8))
}

fn parse_radix_u64(digits: &str, radix: u32) -> Option<u64> {
    // No sign and at least one digit: from_str_radix alone would accept a leading '+'.
    if digits.is_empty() || digits.bytes().any(|b| !(b as char).is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

fn parse_radix_i64(digits: &str, radix: u32, negative: bool) -> Option<i64> {
    let magnitude = parse_radix_u64(digits, radix)?;
    if negative {
        if magnitude <= i64::MAX as u64 + 1 { Some((magnitude as i128).wrapping_neg() as i64) } else { None }
    } else {
        i64::try_from(magnitude).ok()
    }
}

/// Go's `underscoreOK` for a decimal literal: every underscore sits between two digits.
fn underscores_ok(s: &str) -> bool {
    let b = s.strip_prefix(['+', '-']).unwrap_or(s).as_bytes();
    let mut saw = b'^';
    for &c in b {
        if c.is_ascii_digit() {
            saw = b'0';
        } else if c == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
        } else if saw == b'_' {
            return false;
        } else {
            saw = b'!';
        }
    }
    saw != b'_'
}

/// go-yaml v2's timestamp forms (`2006-1-2`, with `T`/`t` and a time and a zone (`Z` or
/// `+07:00`), or with a space and a time without zone), with Go's range checks on each field.
fn is_timestamp(s: &str) -> bool {
    fn number(s: &str, min_len: usize, max_len: usize, max: u32) -> Option<u32> {
        let ok = (min_len..=max_len).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit());
        ok.then(|| s.parse().ok()).flatten().filter(|&n| n <= max)
    }
    let date_end = s.find(['T', 't', ' ']).unwrap_or(s.len());
    let mut date = s[..date_end].split('-');
    let (Some(y), Some(m), Some(d), None) = (date.next(), date.next(), date.next(), date.next()) else {
        return false;
    };
    let (Some(year), Some(month), Some(day)) = (number(y, 4, 4, 9999), number(m, 1, 2, 12), number(d, 1, 2, 31)) else {
        return false;
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if month == 0 || day == 0 || day > days {
        return false;
    }
    if date_end == s.len() {
        return true;
    }
    let separator = s.as_bytes()[date_end];
    let rest = &s[date_end + 1..];
    let (time, zone) = if separator == b' ' {
        (rest, None)
    } else if let Some(t) = rest.strip_suffix('Z') {
        (t, Some(""))
    } else {
        match rest.rfind(['+', '-']) {
            Some(i) => (&rest[..i], Some(&rest[i + 1..])),
            None => return false,
        }
    };
    if let Some(zone) = zone
        && !zone.is_empty()
    {
        let mut hm = zone.split(':');
        let ok = matches!((hm.next(), hm.next(), hm.next()), (Some(h), Some(m), None)
            if number(h, 2, 2, 23).is_some() && number(m, 2, 2, 59).is_some());
        if !ok {
            return false;
        }
    }
    let (clock, fraction) = match time.split_once('.') {
        Some((c, f)) => (c, Some(f)),
        None => (time, None),
    };
    if fraction.is_some_and(|f| f.is_empty() || f.len() > 9 || !f.bytes().all(|b| b.is_ascii_digit())) {
        return false;
    }
    let mut hms = clock.split(':');
    matches!((hms.next(), hms.next(), hms.next(), hms.next()), (Some(h), Some(m), Some(sec), None)
        if number(h, 1, 2, 23).is_some() && number(m, 1, 2, 59).is_some() && number(sec, 1, 2, 59).is_some())
}

/// go-yaml v2's `yamlStyleFloat`: `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn is_yaml_style_float(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = usize::from(matches!(b.first(), Some(b'-' | b'+')));
    let digits = |i: &mut usize| {
        let start = *i;
        while b.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i - start
    };
    if b.get(i) == Some(&b'.') {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    } else {
        if digits(&mut i) == 0 {
            return false;
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            digits(&mut i);
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'-' | b'+')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

/// Go's `strconv.ParseFloat(s, 64)` for the decimal forms go-yaml hands it: None on a syntax
/// error or when the value is out of range (Go then reports an error, and go-yaml keeps the
/// text). Underflow to zero is not an error in Go.
fn parse_go_float(s: &str) -> Option<f64> {
    if !is_yaml_style_float(s) {
        return None;
    }
    let f: f64 = s.parse().ok()?;
    f.is_finite().then_some(f)
}

/// The label value upstream stores for a resolved scalar: sigs.k8s.io/yaml turns numbers and
/// booleans into strings for a string target, and JSON null leaves the empty string.
pub(crate) fn value_string(resolved: Resolved) -> String {
    match resolved {
        Resolved::Null => String::new(),
        Resolved::Bool(b) => b.to_string(),
        Resolved::Int(i) => i.to_string(),
        Resolved::Uint(u) => u.to_string(),
        Resolved::Float(f) => go_format_float32(f),
        Resolved::Str(s) => s,
    }
}

/// The map key upstream makes of a resolved non-string key (sigs.k8s.io/yaml: floats as
/// float32 with `.inf`/`-.inf`/`.nan` spellings). Null and u64 keys are errors there and
/// handled by the caller.
fn key_string(resolved: &Resolved) -> String {
    match resolved {
        Resolved::Float(f) => match go_format_float32(*f).as_str() {
            "+Inf" => ".inf".into(),
            "-Inf" => "-.inf".into(),
            "NaN" => ".nan".into(),
            s => s.to_string(),
        },
        other => value_string(other.clone()),
    }
}

/// Go's `strconv.FormatFloat(f, 'g', -1, 32)`: the shortest digits that identify the value as
/// a float32, in %e form when the exponent is below -4 or at least 6 (two exponent digits at
/// least), else in %f form.
pub(crate) fn go_format_float32(f: f64) -> String {
    let f = f as f32;
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf".into() } else { "-Inf".into() };
    }
    let sign = if f.is_sign_negative() { "-" } else { "" };
    if f == 0.0 {
        return format!("{sign}0");
    }
    // Rust's `{:e}` gives the shortest round-tripping digits too: "1.2345679e8".
    let sci = format!("{:e}", f.abs());
    let Some((mantissa, exponent)) = sci.split_once('e') else { return format!("{f}") };
    let digits: Vec<u8> = mantissa.bytes().filter(u8::is_ascii_digit).collect();
    let exp: i32 = exponent.parse().unwrap_or(0);
    let nd = digits.len() as i32;
    let dp = exp + 1;
    let mut out = String::from(sign);
    if !(-4..6).contains(&exp) {
        out.push(digits[0] as char);
        if digits.len() > 1 {
            out.push('.');
            out.extend(digits[1..].iter().map(|&d| d as char));
        }
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        out.push_str(&format!("{:02}", exp.abs()));
    } else {
        let digit = |i: i32| if (0..nd).contains(&i) { digits[i as usize] as char } else { '0' };
        if dp > 0 {
            out.extend((0..dp).map(digit));
        } else {
            out.push('0');
        }
        let decimals = (nd - dp).max(0);
        if decimals > 0 {
            out.push('.');
            out.extend((dp..dp + decimals).map(digit));
        }
    }
    out
}

/// Go's `base64.StdEncoding.DecodeString`: padded standard alphabet, nothing else.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for (n, chunk) in bytes.chunks(4).enumerate() {
        let last = n + 1 == bytes.len() / 4;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut acc = 0u32;
        for &c in &chunk[..4 - pad] {
            acc = (acc << 6) | value(c)?;
        }
        acc <<= 6 * pad as u32;
        let group = [(acc >> 16) as u8, (acc >> 8) as u8, acc as u8];
        out.extend_from_slice(&group[..3 - pad]);
    }
    Some(out)
}

fn kind(r: &Resolved) -> &'static str {
    match r {
        Resolved::Null => "null",
        Resolved::Bool(_) => "boolean",
        Resolved::Int(_) | Resolved::Uint(_) | Resolved::Float(_) => "number",
        Resolved::Str(_) => "string",
    }
}

#[cfg(test)]
#[path = "upstream_yaml_tests.rs"]
mod tests;

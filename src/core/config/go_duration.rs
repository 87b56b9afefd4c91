//! Go `time.Duration` strings (`5m0s`, `1h30m`, `1.5s`), because upstream's `minResyncPeriod`
//! is written in that syntax and drop-in ConfigMaps must keep working unchanged. Pure, so in
//! `core`: the config types print with it, `config` and the command line parse with it.

use std::time::Duration;

/// Parses a Go duration string. Negative durations are rejected because a resync period
/// cannot be negative; `0` is accepted (callers decide whether zero makes sense).
pub(crate) fn parse_go_duration(input: &str) -> Result<Duration, String> {
    let s = input.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let s = match s.strip_prefix('+') {
        Some(rest) => rest,
        None if s.starts_with('-') => return Err(format!("negative duration {input:?}")),
        None => s,
    };
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total_nanos: f64 = 0.0;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("missing unit in duration {input:?}"))?;
        if num_len == 0 {
            return Err(format!("invalid duration {input:?}: expected a number at {rest:?}"));
        }
        let number: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("invalid number {:?} in duration {input:?}", &rest[..num_len]))?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => return Err(format!("missing unit in duration {input:?}")),
            other => return Err(format!("unknown unit {other:?} in duration {input:?}")),
        };
        total_nanos += number * scale;
        rest = &rest[unit_len..];
    }
    if !total_nanos.is_finite() || total_nanos > u64::MAX as f64 {
        return Err(format!("duration {input:?} is too large"));
    }
    Ok(Duration::from_nanos(total_nanos.round() as u64))
}

/// Formats a duration the way Go prints it (`5m0s`), so the effective config shown by
/// `validate-config` reads like the upstream defaults.
pub(crate) fn format_go_duration(d: Duration) -> String {
    let total = d.as_nanos();
    if total == 0 {
        return "0s".into();
    }
    if total < 1_000_000_000 {
        return if total.is_multiple_of(1_000_000) {
            format!("{}ms", total / 1_000_000)
        } else if total.is_multiple_of(1_000) {
            format!("{}µs", total / 1_000)
        } else {
            format!("{total}ns")
        };
    }
    let secs = d.as_secs();
    let frac = d.subsec_nanos();
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if frac == 0 {
        out.push_str(&format!("{s}s"));
    } else {
        let frac = format!("{frac:09}");
        out.push_str(&format!("{s}.{}s", frac.trim_end_matches('0')));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_syntax() {
        let cases = [
            ("5m0s", 300_000),
            ("5m", 300_000),
            ("1h30m", 5_400_000),
            ("1.5h", 5_400_000),
            ("300ms", 300),
            ("10s", 10_000),
            ("0", 0),
            ("+2s", 2_000),
            ("1h0m0s", 3_600_000),
            ("1500us", 1),
            (" 2m ", 120_000),
        ];
        for (input, millis) in cases {
            assert_eq!(parse_go_duration(input).unwrap().as_millis(), millis, "{input}");
        }
    }

    #[test]
    fn rejects_bad_input() {
        for input in ["", "5", "5x", "m5", "-5m", "1..5s", "five minutes", "5 m"] {
            assert!(parse_go_duration(input).is_err(), "{input:?} should fail");
        }
    }

    #[test]
    fn formats_like_go() {
        let cases = [
            (Duration::from_secs(300), "5m0s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_secs(10), "10s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_millis(300), "300ms"),
            (Duration::ZERO, "0s"),
            (Duration::from_secs(3723), "1h2m3s"),
        ];
        for (d, want) in cases {
            assert_eq!(format_go_duration(d), want);
            assert_eq!(parse_go_duration(want).unwrap(), d);
        }
    }
}

//! Capacity rounding and formatting, identical to upstream so adopted PVs and new ones agree.

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// Rounds down to whole GiB when at least 10 GiB, else to whole MiB when at least 10 MiB,
/// else keeps the bytes: upstream's "pretty" rounding, so a PV never claims more than the disk.
pub(crate) fn round_down_pretty(bytes: u64) -> u64 {
    for unit in [GIB, MIB] {
        let whole = bytes / unit;
        if whole >= 10 {
            return whole * unit;
        }
    }
    bytes
}

/// The canonical text of a binary-SI Kubernetes quantity (`10Gi`, `1536Mi`, `1000`), as the API
/// server would print `resource.NewQuantity(n, BinarySI)`.
pub(crate) fn binary_si_quantity(bytes: u64) -> String {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes == 0 {
        return "0".into();
    }
    let mut value = bytes;
    let mut suffix = "";
    for s in SUFFIXES {
        if !value.is_multiple_of(1024) {
            break;
        }
        value /= 1024;
        suffix = s;
    }
    format!("{value}{suffix}")
}

/// A size in IEC units, as `lsblk` and Kubernetes quantities read: `512 B`, `16 MiB`,
/// `97.3 GiB` (one decimal, dropped when whole).
pub(crate) fn iec(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    let text = format!("{value:.1}");
    // 1023.96 KiB rounds to "1024.0": say the next unit.
    if text == "1024.0" && unit < UNITS.len() - 1 {
        return format!("1 {}", UNITS[unit + 1]);
    }
    format!("{} {}", text.strip_suffix(".0").unwrap_or(&text), UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_matches_upstream() {
        let cases = [
            (0, 0),
            (1, 1),
            (10 * MIB - 1, 10 * MIB - 1),
            (10 * MIB, 10 * MIB),
            (10 * MIB + 1, 10 * MIB),
            (15 * MIB + 512 * KIB, 15 * MIB),
            (10 * GIB - 1, 10 * GIB - MIB),
            (10 * GIB, 10 * GIB),
            (10 * GIB + GIB - 1, 10 * GIB),
            (500 * GIB + 123_456_789, 500 * GIB),
            (3 * GIB + 5, 3 * 1024 * MIB),
        ];
        for (input, want) in cases {
            assert_eq!(round_down_pretty(input), want, "{input}");
        }
    }

    #[test]
    fn quantities_are_canonical() {
        let cases = [
            (0, "0"),
            (1000, "1000"),
            (1024, "1Ki"),
            (1536 * MIB, "1536Mi"),
            (10 * GIB, "10Gi"),
            (1024 * GIB, "1Ti"),
            (10 * MIB - 1, "10485759"),
            (3 * KIB + 1, "3073"),
        ];
        for (bytes, want) in cases {
            assert_eq!(binary_si_quantity(bytes), want, "{bytes}");
        }
    }

    #[test]
    fn sizes_read_in_iec_units() {
        let cases = [
            (0, "0 B"),
            (512, "512 B"),
            (1023, "1023 B"),
            (1024, "1 KiB"),
            (1536, "1.5 KiB"),
            (16 << 20, "16 MiB"),
            ((1 << 20) - 1, "1 MiB"),
            (100 << 30, "100 GiB"),
            (104_453_730_304, "97.3 GiB"),
            (1 << 40, "1 TiB"),
            (3_840_755_982_336, "3.5 TiB"),
            (u64::MAX, "16 EiB"),
        ];
        for (bytes, text) in cases {
            assert_eq!(iec(bytes), text, "{bytes}");
        }
    }
}

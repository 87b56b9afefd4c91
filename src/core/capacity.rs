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
}

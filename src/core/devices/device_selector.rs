//! The optional `devices` section of a class: which raw block devices the agent may claim for
//! it (see core::devices::device_claim for the rules and host::devices::claims for the links). Upstream ignores
//! the key, so a ConfigMap that uses it still works when switching back. The types are pure
//! data, so they live in `core` where the claim rules read them; `config` parses them.

use std::fmt;

use serde::Serialize;

use crate::core::config::pattern::NamePattern;

/// What kind of block device a class may claim. Everything else (LVM volumes, dm-crypt, md,
/// zram, nbd...) is some other layer's device and is never claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceType {
    /// A whole hardware-backed disk (SCSI, SATA, NVMe namespace, virtio...).
    Disk,
    /// A partition of a disk.
    Partition,
    /// A device-mapper multipath device (its UUID starts with `mpath-`).
    Multipath,
    /// A loop device: only when named explicitly, since its backing file lives on another
    /// filesystem of the host (tests and labs).
    Loop,
}

impl DeviceType {
    /// Parses the config spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "disk" => Some(Self::Disk),
            "partition" => Some(Self::Partition),
            "multipath" => Some(Self::Multipath),
            "loop" => Some(Self::Loop),
            _ => None,
        }
    }

    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disk => "disk",
            Self::Partition => "partition",
            Self::Multipath => "multipath",
            Self::Loop => "loop",
        }
    }
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How much of a device is read before its first claim. The signature areas are always read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verify {
    /// Windows sampled over the whole surface on every probe (core::devices::surface): bounded time,
    /// a probability of seeing a small extent of data.
    #[default]
    Sample,
    /// Besides the samples, every byte once per disk, in the background, before the first
    /// claim: proof, at the cost of reading the whole disk.
    Full,
}

impl Verify {
    /// Parses the config spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "sample" => Some(Self::Sample),
            "full" => Some(Self::Full),
            _ => None,
        }
    }

    fn is_sample(&self) -> bool {
        *self == Self::Sample
    }
}

/// A class's device filter. Every field narrows the selection; a device must pass all of them
/// (and then the safety rules) to be claimed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSelector {
    /// Device types to claim; `[disk]` when left out.
    pub types: Vec<DeviceType>,
    /// Smallest size in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_size: Option<u64>,
    /// Largest size in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_size: Option<u64>,
    /// `Some(true)`: spinning disks only; `Some(false)`: non-rotational only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rotational: Option<bool>,
    /// Globs (namePattern syntax) on the sysfs model; any may match. Empty: any model.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Globs on the sysfs vendor; any may match. Empty: any vendor.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub vendors: Vec<String>,
    /// Globs matched against a device's kernel name, /dev path, by-id names and paths, and
    /// stable id: a match is never claimed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// At most this many devices claimed by the class on one node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_per_node: Option<u32>,
    /// How much of a device is read before its first claim.
    #[serde(skip_serializing_if = "Verify::is_sample")]
    pub verify: Verify,
}

impl Default for DeviceSelector {
    fn default() -> Self {
        DeviceSelector {
            types: vec![DeviceType::Disk],
            min_size: None,
            max_size: None,
            rotational: None,
            models: Vec::new(),
            vendors: Vec::new(),
            exclude: Vec::new(),
            max_per_node: None,
            verify: Verify::Sample,
        }
    }
}

/// Whether any glob of `globs` matches any of `names`. Globs were checked when the config was
/// read; one that fails to parse here matches nothing.
pub fn any_glob_matches<'a>(globs: &[String], names: impl IntoIterator<Item = &'a str> + Clone) -> Option<String> {
    globs.iter().find_map(|g| {
        let p = NamePattern::parse(g).ok()?;
        names.clone().into_iter().any(|n| p.matches(n)).then(|| g.clone())
    })
}

/// Bytes in a Kubernetes quantity such as `100Gi`, `1.5T`, `500G` or `1000000`. Only what a
/// disk size needs: no negative values, no milli units, a whole number of bytes (rounded
/// down).
pub fn parse_quantity(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, suffix) = t.split_at(split);
    if number.is_empty() || number.starts_with('.') || number.ends_with('.') || number.matches('.').count() > 1 {
        return Err(format!("{text:?} is not a size (use a quantity such as 100Gi, 1.5Ti or 500G)"));
    }
    let multiplier: u128 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        other => {
            return Err(format!("{text:?}: unknown unit {other:?} (use Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P or E)"));
        }
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let too_big = || format!("{text:?} is larger than any device");
    let whole: u128 = whole.parse().map_err(|_| too_big())?;
    let mut bytes = whole.checked_mul(multiplier).ok_or_else(too_big)?;
    if !fraction.is_empty() {
        if fraction.len() > 18 {
            return Err(format!("{text:?} has more decimals than a size needs"));
        }
        let digits: u128 = fraction.parse().map_err(|_| too_big())?;
        let scale = 10u128.pow(fraction.len() as u32);
        bytes = bytes.checked_add(digits * multiplier / scale).ok_or_else(too_big)?;
    }
    u64::try_from(bytes).map_err(|_| too_big())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_in_every_unit() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("1000000", 1_000_000),
            ("1Ki", 1024),
            ("100Gi", 100 << 30),
            ("1.5Ti", 3 << 39),
            ("500G", 500_000_000_000),
            ("2T", 2_000_000_000_000),
            ("1k", 1000),
            ("7Mi", 7 << 20),
            ("1Pi", 1 << 50),
            ("0.5Ki", 512),
            (" 10Gi ", 10 << 30),
            ("1.0000001k", 1000),
            ("15Ei", 15 << 60),
        ];
        for (text, bytes) in cases {
            assert_eq!(parse_quantity(text), Ok(*bytes), "{text}");
        }
    }

    #[test]
    fn bad_quantities_say_what_is_wrong() {
        for text in
            ["", "Gi", "-1Gi", "1.Gi", ".5Gi", "1..5Gi", "10GB", "10gi", "1m", "abc", "16Ei", "99999999999999999999999"]
        {
            let e = parse_quantity(text).expect_err(text);
            assert!(e.contains(&format!("{text:?}")) || e.contains(text.trim()), "{text}: {e}");
        }
        assert!(parse_quantity("10GB").unwrap_err().contains("unknown unit \"GB\""));
    }

    #[test]
    fn types_round_trip_and_refuse_others() {
        for t in [DeviceType::Disk, DeviceType::Partition, DeviceType::Multipath, DeviceType::Loop] {
            assert_eq!(DeviceType::parse(t.as_str()), Some(t));
        }
        for s in ["Disk", "lvm", "md", "", "rom"] {
            assert_eq!(DeviceType::parse(s), None, "{s}");
        }
    }

    #[test]
    fn globs_match_any_name() {
        let globs = vec!["sd?".to_string(), "wwn-0x5000*".to_string()];
        assert_eq!(any_glob_matches(&globs, ["sdb", "/dev/sdb"]), Some("sd?".into()));
        assert_eq!(any_glob_matches(&globs, ["nvme0n1", "wwn-0x5000abc"]), Some("wwn-0x5000*".into()));
        assert_eq!(any_glob_matches(&globs, ["nvme0n1", "/dev/nvme0n1"]), None);
        assert_eq!(any_glob_matches(&[], ["sda"]), None);
    }
}

//! A volume's history across recycling: when its PV is wiped and deleted, the PV that
//! discovery creates for the clean volume is a new object (a new UID), so `kubectl describe pv`
//! would show none of what happened. The agent keeps the last completed wipe of each volume
//! until the new PV exists (host::wipe::wipe_history) and puts it on the new PV, in the create
//! itself, as the annotation [`ANN_LAST_WIPE`] (which `kubectl describe pv` shows), and in its
//! log. No event tells it: an event was one request more per released PV (issue 42) for what
//! the annotation already says.
//!
//! The history goes only to the same disk at the same path: a disk swapped in at that path
//! meanwhile was not wiped by us, and must not look as if it had been.

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::core::identity::disk_identity::{Found, Verdict, judge};
use crate::core::volumes::capacity::iec;

/// The annotation on a recycled PV: when and how its volume was last wiped, and which PV it
/// was released from.
pub const ANN_LAST_WIPE: &str = "local-static-provisioner.io/last-wipe";

/// The annotation on a recycled PV with the wipes before its last one (newest first, one per
/// line, each as [`ANN_LAST_WIPE`] says it): with it, the PV tells the erase of its volume's
/// last tenants, not only the last one, for as long as the disk stays at its path.
pub const ANN_EARLIER_WIPES: &str = "local-static-provisioner.io/earlier-wipes";

/// How many earlier wipes [`ANN_EARLIER_WIPES`] keeps: a bounded history (a PV's store copy
/// grows by at most this many lines, however often its volume is recycled).
pub const KEEP_EARLIER: usize = 3;

/// The wipes of a released PV's volume before the one now done, newest first, from its
/// annotations (`last`: its [`ANN_LAST_WIPE`], `earlier`: its [`ANN_EARLIER_WIPES`]), at most
/// [`KEEP_EARLIER`]; blank lines dropped.
pub fn earlier_wipes(last: Option<&str>, earlier: Option<&str>) -> Vec<String> {
    last.into_iter()
        .chain(earlier.into_iter().flat_map(str::lines))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(KEEP_EARLIER)
        .map(str::to_string)
        .collect()
}

/// How long a completed wipe waits for its volume to be published again before it is
/// forgotten (a disk taken out after its wipe never comes back to claim it).
pub const KEEP_FOR: SignedDuration = SignedDuration::from_hours(24 * 7);

/// The destruction of an encrypted volume's key: the erase that can be shown.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KeyErased {
    /// The key's identifier (hex; never the key).
    pub key: String,
    /// When it was removed from the kernel and its stored copy destroyed (RFC 3339).
    pub at: String,
}

/// The last completed wipe of the volume at one host path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LastWipe {
    /// The volume's host path.
    pub host_path: String,
    /// The identity the wipe proved on its own descriptor (core::identity::disk_identity).
    pub identity: String,
    /// When the wipe completed (RFC 3339).
    pub at: String,
    /// How: `filesystem` (every entry removed), a built-in block method (`quick`, `discard`,
    /// `zero`, `shred`) or `command <name>` (the class's blockCleanerCommand).
    pub method: String,
    /// Bytes freed (filesystem) or overwritten (block device).
    pub bytes: u64,
    /// How long the wipe took, in milliseconds (none: finished after a retry, not timed).
    pub elapsed_ms: Option<u64>,
    /// The PV the volume was released from: its name and UID.
    pub pv: String,
    pub pv_uid: String,
    /// An encrypted volume's key the wipe destroyed first, and when (absent in records of
    /// earlier versions and for unencrypted volumes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_erased: Option<KeyErased>,
    /// The wipes before this one, newest first ([`earlier_wipes`]): the new PV's
    /// [`ANN_EARLIER_WIPES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier: Vec<String>,
}

impl LastWipe {
    /// Whether this wipe was of the volume found at `host_path` with `identity` now: the same
    /// path, and the same disk proven by its identity (never an unproven match).
    pub fn applies_to(&self, host_path: &str, identity: &str) -> bool {
        if self.host_path != host_path {
            return false;
        }
        let found = Found { identity: identity.to_string(), legacy: String::new(), fs_type: None };
        matches!(judge(&self.identity, &found, None), Verdict::Same(_))
    }

    /// Whether the record is to be kept at `now`: not older than [`KEEP_FOR`] (a time that
    /// cannot be read is not kept).
    pub fn fresh_at(&self, now: Timestamp) -> bool {
        self.at.parse::<Timestamp>().is_ok_and(|at| now.duration_since(at) <= KEEP_FOR)
    }

    /// The annotation's value: compact, one line, `key=value` words (`duration` left out when
    /// the wipe was not timed).
    pub fn annotation(&self) -> String {
        let took = self.elapsed_ms.map(|ms| format!(" duration={}", duration(ms))).unwrap_or_default();
        let key = self
            .key_erased
            .as_ref()
            .map(|k| format!(" key={} key-destroyed={} key-verified=absent", k.key, k.at))
            .unwrap_or_default();
        format!(
            "at={} method={} bytes={}{took}{key} previous-pv={}",
            self.at,
            self.method.replace(' ', "-"),
            self.bytes,
            self.pv_uid
        )
    }

    /// The value of [`ANN_EARLIER_WIPES`], when there were wipes before this one.
    pub fn earlier_annotation(&self) -> Option<String> {
        (!self.earlier.is_empty()).then(|| self.earlier.join("\n"))
    }

    /// The words of the agent's log line when the new PV is created.
    pub fn note(&self) -> String {
        let what = if let Some(k) = &self.key_erased {
            format!(
                "its encryption key {} destroyed at {}, then every entry removed, {} freed",
                k.key,
                k.at,
                iec(self.bytes)
            )
        } else if self.method == FILESYSTEM {
            format!("every entry removed, {} freed", iec(self.bytes))
        } else {
            format!("{} device, {}", iec(self.bytes), self.method)
        };
        let took = match self.elapsed_ms {
            Some(ms) => format!("in {}", duration(ms)),
            None => "finished after a retry".to_string(),
        };
        format!(
            "Volume at {} was wiped at {} ({what}, {took}) after PV {} (UID {}) was released; published again clean",
            self.host_path, self.at, self.pv, self.pv_uid
        )
    }
}

/// The method of a filesystem volume's wipe.
pub const FILESYSTEM: &str = "filesystem";
/// The method of an encrypted volume's wipe: its key destroyed, then every entry removed.
pub const CRYPTO_ERASE: &str = "crypto-erase";

/// `elapsed_ms` in seconds, to the millisecond: `0.012s`, `61.999s`.
fn duration(elapsed_ms: u64) -> String {
    format!("{}.{:03}s", elapsed_ms / 1000, elapsed_ms % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FS: &str = "v2;fs;disk=serial:S1;uuid=a;ino=2;dev=8:1";

    fn wipe() -> LastWipe {
        LastWipe {
            host_path: "/mnt/disks/vol1".into(),
            identity: FS.into(),
            at: "2026-11-28T10:00:00Z".into(),
            method: "filesystem".into(),
            bytes: 4096,
            elapsed_ms: Some(1234),
            pv: "local-pv-1234".into(),
            pv_uid: "uid-1".into(),
            key_erased: None,
            earlier: Vec::new(),
        }
    }

    #[test]
    fn applies_only_to_the_same_disk_at_the_same_path() {
        let w = wipe();
        let cases = [
            ("/mnt/disks/vol1", FS, true),
            // The device number is informational: the same disk enumerated elsewhere.
            ("/mnt/disks/vol1", "v2;fs;disk=serial:S1;uuid=a;ino=2;dev=8:17", true),
            ("/mnt/disks/vol2", FS, false),
            ("/mnt/disks/vol1/", FS, false),
            // Another disk swapped in at the path, a reformatted one, an unreadable identity.
            ("/mnt/disks/vol1", "v2;fs;disk=serial:S2;uuid=a;ino=2;dev=8:1", false),
            ("/mnt/disks/vol1", "v2;fs;disk=serial:S1;uuid=b;ino=2;dev=8:1", false),
            ("/mnt/disks/vol1", "v2;blk;disk=serial:S1;size=10;dev=8:1", false),
            ("/mnt/disks/vol1", "garbage", false),
            ("/mnt/disks/vol1", "", false),
        ];
        for (path, identity, want) in cases {
            assert_eq!(w.applies_to(path, identity), want, "{path} {identity}");
        }
        // Nothing proves a device-number-only identity: never applied on it.
        let weak = LastWipe { identity: "v2;fs;ino=2;dev=8:1".into(), ..wipe() };
        assert!(!weak.applies_to("/mnt/disks/vol1", "v2;fs;ino=2;dev=8:1"));
    }

    #[test]
    fn the_earlier_wipes_are_the_released_pvs_newest_first_and_bounded() {
        assert!(earlier_wipes(None, None).is_empty());
        assert_eq!(earlier_wipes(Some("w3"), None), ["w3"]);
        assert_eq!(earlier_wipes(Some("w3"), Some("w2\nw1")), ["w3", "w2", "w1"]);
        // Bounded: the oldest fall off, however long the chain the PV carried.
        assert_eq!(earlier_wipes(Some("w9"), Some("w8\nw7\nw6\nw5")), ["w9", "w8", "w7"]);
        assert_eq!(earlier_wipes(None, Some("w2\n\n  \nw1")), ["w2", "w1"]);
        assert_eq!(earlier_wipes(Some(" "), Some("w1")), ["w1"]);
        let w = LastWipe { earlier: vec!["w2".into(), "w1".into()], ..wipe() };
        assert_eq!(w.earlier_annotation().as_deref(), Some("w2\nw1"));
        assert_eq!(wipe().earlier_annotation(), None);
    }

    #[test]
    fn kept_for_a_week_and_never_when_its_time_is_unreadable() {
        let w = wipe();
        let at: Timestamp = "2026-11-28T10:00:00Z".parse().unwrap();
        assert!(w.fresh_at(at));
        assert!(w.fresh_at(at + SignedDuration::from_hours(24 * 7)));
        assert!(!w.fresh_at(at + SignedDuration::from_hours(24 * 7) + SignedDuration::from_secs(1)));
        // A clock set back keeps it (the age is negative).
        assert!(w.fresh_at(at - SignedDuration::from_hours(1)));
        for bad in ["", "yesterday", "2026-11-28"] {
            assert!(!LastWipe { at: bad.into(), ..wipe() }.fresh_at(at), "{bad:?}");
        }
    }

    #[test]
    fn annotation_and_note_say_when_how_and_from_which_pv() {
        let w = LastWipe { method: "command cleaner.sh".into(), bytes: 64 << 20, ..wipe() };
        assert_eq!(
            w.annotation(),
            "at=2026-11-28T10:00:00Z method=command-cleaner.sh bytes=67108864 duration=1.234s previous-pv=uid-1"
        );
        let note = w.note();
        for part in ["/mnt/disks/vol1", "64 MiB device, command cleaner.sh", "in 1.234s", "local-pv-1234", "uid-1"] {
            assert!(note.contains(part), "{part}: {note}");
        }
        let fs = wipe().note();
        assert!(fs.contains("every entry removed, 4 KiB freed"), "{fs}");
        let resumed = LastWipe { elapsed_ms: None, ..wipe() };
        assert!(resumed.note().contains("finished after a retry"), "{}", resumed.note());
        assert!(!resumed.annotation().contains("duration"), "{}", resumed.annotation());
        assert!(LastWipe { elapsed_ms: Some(0), ..wipe() }.annotation().contains("duration=0.000s"));
        let erased = LastWipe {
            method: CRYPTO_ERASE.into(),
            key_erased: Some(super::KeyErased {
                key: "0123456789abcdef0123456789abcdef".into(),
                at: "2026-11-28T09:59:59Z".into(),
            }),
            ..wipe()
        };
        assert_eq!(
            erased.annotation(),
            "at=2026-11-28T10:00:00Z method=crypto-erase bytes=4096 duration=1.234s \
             key=0123456789abcdef0123456789abcdef key-destroyed=2026-11-28T09:59:59Z key-verified=absent previous-pv=uid-1"
        );
        assert!(
            erased.note().contains("encryption key 0123456789abcdef0123456789abcdef destroyed at 2026-11-28T09:59:59Z")
        );
        assert_eq!(duration(12), "0.012s");
        assert_eq!(duration(61_999), "61.999s");
    }
}

//! Failing-disk signs (issue 27): judges what the kernel shows about one volume's filesystem
//! or device, without special tools, into the reasons the volume counts as failing. The host
//! side (host::health::disk_health) reads the signs; this side decides, so every rule is unit-tested
//! with time passed in.
//!
//! Most signs are states the kernel keeps until someone repairs the disk (a read-only or shut
//! down filesystem, ext4's error count), so they are judged afresh on every look and clear by
//! themselves once repaired. The block layer's I/O error counter only grows, and a count from
//! before the agent started is no news, so it is judged against memory: a rise above the count
//! first seen is a failure for [`IO_ERROR_HOLD`] after the last rise, then clears. An I/O
//! error the agent itself met (reading the used mark, the identity, the size; writing the
//! mark; the presence check) is held the same way, [`IO_FAILURE_HOLD`] after the last one: a
//! bad sector may answer one read and fail the next, and a PV must not flap.
//!
//! Size is a fact too (issue 41): a volume smaller than its PV's capacity, or a filesystem
//! larger than the device under it, fails writes beyond its end ([`shrunk`]); a grown one is
//! only told ([`grown`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::core::volumes::capacity::{iec, round_down_pretty};
use crate::core::wipe::cleanup::PvState;
use std::time::{Duration, Instant};

/// How long a rise of the I/O error counter keeps a disk failing after the last rise.
pub const IO_ERROR_HOLD: Duration = Duration::from_secs(10 * 60);

/// How long an I/O error the agent met keeps a disk failing after the last one.
pub const IO_FAILURE_HOLD: Duration = Duration::from_secs(10 * 60);

/// What the kernel shows about one volume's filesystem or device, read in one look.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Signs {
    /// The filesystem (its superblock, not just this mount) or the block device is read-only.
    pub read_only: bool,
    /// ext4's `errors_count` (None: not ext4, or unreadable).
    pub fs_errors: Option<u64>,
    /// The filesystem is shut down (XFS, or ext4 after a shutdown ioctl): every access fails.
    pub shut_down: bool,
    /// The block layer's error counter of the disk(s) under the volume where sysfs exposes one
    /// (SCSI `device/ioerr_cnt`); None where there is none (loop, virtio, NVMe) or unreadable.
    pub io_errors: Option<u64>,
    /// An I/O error (EIO, EUCLEAN...) met while reading the volume's facts, or its device gone.
    pub io_failure: Option<String>,
    /// The volume's size now, to compare with its PV's capacity ([`shrunk`], [`grown`]).
    pub size: Option<SizeFacts>,
    /// The kernel names of the volume's device and of every device under it, whole disks
    /// included (`sdb1`, `sdb`): a kernel log line about any of them is about this volume
    /// (core::health::kernel_log). Empty for a volume on no block device (tmpfs).
    pub devices: Vec<String>,
    /// What tells this instance of the volume from an earlier one at the same path (its mount
    /// ID, its device number, a loop device's backing file): a kernel log line read before the
    /// current instance was first seen is about another disk that had the name
    /// ([`HealthMemory::seen_since`]).
    pub instance: String,
}

/// A volume's size as read in one look (no I/O on the disk: statfs, an ioctl, sysfs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeFacts {
    /// The filesystem's size (statfs blocks) or the block device's (BLKGETSIZE64), unrounded.
    pub bytes: u64,
    /// For a filesystem on a block device, that device's size now (sysfs); None otherwise.
    pub device_bytes: Option<u64>,
    /// Whether the size stays what it was unless someone resizes the disk or the filesystem (a
    /// block device; ext2/3/4, XFS, tmpfs, vfat, exFAT, f2fs). A pooled filesystem's (ZFS,
    /// btrfs over several devices, NFS) moves with its neighbours' use and is never compared.
    pub fixed: bool,
}

/// Why a volume counts as failing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failing {
    /// The filesystem or its block device is read-only.
    ReadOnly,
    /// The filesystem recorded errors (ext4 keeps the count until fsck repairs it).
    FilesystemErrors { count: u64 },
    /// The filesystem is shut down.
    ShutDown,
    /// The disk's I/O error counter rose by `new` in the current episode.
    IoErrors { new: u64 },
    /// An I/O error met while reading the volume's facts (or writing its used mark).
    IoFailure(String),
    /// The volume is smaller than its PV says (`device`: false; sizes in bytes), or the
    /// filesystem is larger than the device under it now (`device`: true).
    Shrunk { was: u64, now: u64, device: bool },
    /// The kernel log named the volume's device (or one under it) in an I/O error line
    /// (core::health::kernel_log): the latest such line.
    KernelLog(String),
    /// An operation on the volume passed its deadline (host::ops): the disk does not answer.
    Unresponsive(String),
}

impl Failing {
    /// A stable kebab-case name, for metric labels and annotations.
    pub fn code(&self) -> &'static str {
        match self {
            Failing::ReadOnly => "read-only",
            Failing::FilesystemErrors { .. } => "filesystem-errors",
            Failing::ShutDown => "shut-down",
            Failing::IoErrors { .. } => "io-errors",
            Failing::IoFailure(_) => "io-failure",
            Failing::Shrunk { .. } => "shrunk",
            Failing::KernelLog(_) => "kernel-log",
            Failing::Unresponsive(_) => "unresponsive",
        }
    }
}

impl fmt::Display for Failing {
    /// A sentence an operator reads in an event.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failing::ReadOnly => f.write_str(
                "the filesystem or its block device is read-only (the kernel makes a filesystem read-only after an error)",
            ),
            Failing::FilesystemErrors { count } => write!(
                f,
                "the filesystem has recorded {count} error{} (ext4 errors_count); it stays so until fsck repairs it",
                plural(*count)
            ),
            Failing::ShutDown => {
                f.write_str("the filesystem is shut down after an error: every access fails until it is unmounted and repaired")
            }
            Failing::IoErrors { new } => write!(
                f,
                "the disk reported {new} new I/O error{} (block-layer error counter)",
                plural(*new)
            ),
            Failing::IoFailure(what) => write!(f, "an I/O error on the volume: {what}"),
            Failing::Shrunk { was, now, device: false } => write!(
                f,
                "the volume is {} now, smaller than the {} its PV offers: writes beyond its end fail",
                iec(*now),
                iec(*was)
            ),
            Failing::Shrunk { was, now, device: true } => write!(
                f,
                "the filesystem ({}) is larger than its device now ({}): writes beyond the device's end fail",
                iec(*was),
                iec(*now)
            ),
            Failing::KernelLog(line) => write!(f, "the kernel log says: {line}"),
            Failing::Unresponsive(what) => write!(f, "the disk does not answer: {what}"),
        }
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The I/O error counter of one disk as remembered between looks.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Counter {
    /// The count the current episode started from (the first count seen, or the count when
    /// the last episode ended).
    baseline: u64,
    /// The count at the last look that had one.
    last: u64,
    /// When the count last rose, while the episode lasts.
    rose_at: Option<Instant>,
}

/// Memory between looks, per disk key: the I/O error count an episode starts from and when it
/// last rose. Only keys with a counter are kept; [`Self::retain`] forgets the others.
#[derive(Debug, Clone, Default)]
pub struct HealthMemory {
    counters: BTreeMap<String, Counter>,
    /// The last I/O error met on each key and when, while held ([`IO_FAILURE_HOLD`]).
    failures: BTreeMap<String, (String, Instant)>,
    /// The grown size already told for each key ([`HealthMemory::growth`]).
    told_growth: BTreeMap<String, u64>,
    /// Each key's volume instance and since when it has been seen ([`HealthMemory::seen_since`]).
    instances: BTreeMap<String, (String, Instant)>,
}

impl HealthMemory {
    /// The reasons the volume behind `key` is failing now, in a stable order (that of
    /// [`Failing`]'s variants); empty when healthy.
    ///
    /// Edge cases, decided:
    /// - `fs_errors: Some(0)` or None is healthy: only a count above zero is a failure, and it
    ///   lasts exactly as long as the kernel shows it (fsck resets it to zero).
    /// - The first I/O error count seen for a key is its baseline, never a failure: it may be
    ///   from long before the agent started. A rise above it starts an episode that lasts
    ///   [`IO_ERROR_HOLD`] after the latest rise; `new` counts the rise since the episode began.
    ///   When an episode ends, its last count becomes the next baseline.
    /// - A count lower than the last one means a new device instance behind the key (the SCSI
    ///   counter starts at zero with the device, and wraps at 2^32): it becomes the baseline and
    ///   any episode ends.
    /// - No count (None) after one was seen changes nothing: an unreadable counter is neither a
    ///   rise nor a recovery, so a running episode still ends on time.
    /// - An I/O failure (in the look, or [`Self::witness`]ed) lasts [`IO_FAILURE_HOLD`] after
    ///   the latest one; the sentence is the latest one's.
    pub fn judge(&mut self, key: &str, signs: &Signs, now: Instant) -> Vec<Failing> {
        self.judge_volume(key, signs, None, now)
    }

    /// [`Self::judge`] for a volume whose PV offers `capacity` bytes (None: no PV): a size
    /// below it is a failure too ([`shrunk`]).
    pub fn judge_volume(&mut self, key: &str, signs: &Signs, capacity: Option<u64>, now: Instant) -> Vec<Failing> {
        let mut failing = Vec::new();
        if signs.read_only {
            failing.push(Failing::ReadOnly);
        }
        if let Some(count) = signs.fs_errors.filter(|c| *c > 0) {
            failing.push(Failing::FilesystemErrors { count });
        }
        if signs.shut_down {
            failing.push(Failing::ShutDown);
        }
        if let Some(new) = self.io_errors(key, signs.io_errors, now) {
            failing.push(Failing::IoErrors { new });
        }
        if let Some(what) = &signs.io_failure {
            self.witness(key, what, now);
        }
        if let Some((what, at)) = self.failures.get(key) {
            if now.saturating_duration_since(*at) < IO_FAILURE_HOLD {
                failing.push(Failing::IoFailure(what.clone()));
            } else {
                self.failures.remove(key);
            }
        }
        if let Some(shrink) = signs.size.as_ref().and_then(|size| shrunk(capacity, size)) {
            failing.push(shrink);
        }
        failing
    }

    /// Records an I/O error met on `key` outside a look (writing the used mark, the presence
    /// check): the next looks judge it failing for [`IO_FAILURE_HOLD`].
    pub fn witness(&mut self, key: &str, what: &str, now: Instant) {
        self.failures.insert(key.to_string(), (what.to_string(), now));
    }

    /// Since when the volume at `key` has been the instance `instance` (`now` for one not seen
    /// before, or seen as another): kernel log lines read earlier are about a disk that had
    /// its device's name before (a reused `loop3`, a replaced `sdb`), not this one.
    pub fn seen_since(&mut self, key: &str, instance: &str, now: Instant) -> Instant {
        match self.instances.get(key) {
            Some((seen, since)) if seen == instance => *since,
            _ => {
                self.instances.insert(key.to_string(), (instance.to_string(), now));
                now
            }
        }
    }

    /// The growth of `key` to tell, once per size: (the PV's capacity, the size now) when the
    /// volume grew past its PV's capacity ([`grown`]) and this size was not told yet.
    pub fn growth(&mut self, key: &str, capacity: Option<u64>, size: Option<&SizeFacts>) -> Option<(u64, u64)> {
        let Some((was, now)) = size.and_then(|s| grown(capacity, s)) else {
            self.told_growth.remove(key);
            return None;
        };
        (self.told_growth.insert(key.to_string(), now) != Some(now)).then_some((was, now))
    }

    /// Updates the counter of `key` with this look's count; the rise of a running episode.
    fn io_errors(&mut self, key: &str, count: Option<u64>, now: Instant) -> Option<u64> {
        let counter = match (self.counters.get_mut(key), count) {
            (None, None) => return None,
            (None, Some(count)) => {
                self.counters.insert(key.to_string(), Counter { baseline: count, last: count, rose_at: None });
                return None;
            }
            (Some(counter), _) => counter,
        };
        if counter.rose_at.is_some_and(|at| now.saturating_duration_since(at) >= IO_ERROR_HOLD) {
            counter.baseline = counter.last;
            counter.rose_at = None;
        }
        match count {
            Some(count) if count < counter.last => {
                *counter = Counter { baseline: count, last: count, rose_at: None };
            }
            Some(count) if count > counter.last => {
                counter.last = count;
                counter.rose_at = Some(now);
            }
            _ => {}
        }
        counter.rose_at.map(|_| counter.last - counter.baseline)
    }

    /// When the I/O error episode of `key` ends if its count does not rise again (a deadline
    /// for the next look); None when there is no episode.
    #[cfg(test)]
    pub fn clears_at(&self, key: &str) -> Option<Instant> {
        self.counters.get(key)?.rose_at.map(|at| at + IO_ERROR_HOLD)
    }

    /// Forgets the keys for which `keep` is false (the disks no longer seen).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.counters.retain(|key, _| keep(key));
        self.failures.retain(|key, _| keep(key));
        self.told_growth.retain(|key, _| keep(key));
        self.instances.retain(|key, _| keep(key));
    }

    /// Number of entries remembered (counters, held failures, told growths, instances).
    pub fn len(&self) -> usize {
        self.counters.len() + self.failures.len() + self.told_growth.len() + self.instances.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether a read-only filesystem was made so by the kernel after an error, not mounted
/// read-only by an operator, from its superblock options (mountinfo's field after the source)
/// and ext4's error count: ext4's `emergency_ro` (Linux 6.x's `errors=remount-ro`) or
/// `shutdown`, or a read-only superblock with errors recorded (older kernels' remount-ro). A
/// read-only superblock without errors is an operator's `ro` mount.
pub fn read_only_after_error(super_options: &str, fs_errors: Option<u64>) -> bool {
    let mut options = super_options.split(',');
    let read_only = options.next() == Some("ro");
    let emergency = super_options.split(',').any(|o| o == "emergency_ro" || o == "shutdown");
    emergency || (read_only && fs_errors.is_some_and(|n| n > 0))
}

/// Whether the volume shrank, as a failing sign: a filesystem larger than the device under it
/// now (whatever its PV says), or a fixed-size volume smaller than its PV's `capacity`.
///
/// The PV's capacity is the volume's size rounded down (core::volumes::capacity::round_down_pretty),
/// so a size at or above it is no shrink however the rounding fell, and any size below it is
/// one (writes beyond it fail). statfs reports a filesystem's blocks less its own overhead, so
/// a device shrunk by less than that overhead is not seen here.
pub fn shrunk(capacity: Option<u64>, size: &SizeFacts) -> Option<Failing> {
    if let Some(device) = size.device_bytes.filter(|d| *d < size.bytes) {
        return Some(Failing::Shrunk { was: size.bytes, now: device, device: true });
    }
    let capacity = capacity.filter(|c| size.fixed && size.bytes < *c)?;
    Some(Failing::Shrunk { was: capacity, now: size.bytes, device: false })
}

/// Whether the volume grew past its PV's `capacity`: (capacity, size now) when its size now,
/// rounded as a new PV's would be, is larger. Told, never acted on: a Bound PV's capacity is
/// not changed, and an unbound one keeps offering what it offered (never more than is there).
pub fn grown(capacity: Option<u64>, size: &SizeFacts) -> Option<(u64, u64)> {
    let capacity = capacity?;
    (size.fixed && round_down_pretty(size.bytes) > capacity).then_some((capacity, size.bytes))
}

/// The annotation value for a volume's failing signs: each reason's code and sentence.
pub fn annotation_value(failing: &[Failing]) -> String {
    failing.iter().map(|f| format!("{}: {f}", f.code())).collect::<Vec<_>>().join("; ")
}

/// What the agent does about one PV of this node given its disk's signs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthAction {
    /// Annotate the PV with `value` (and tell the PV and its claim): its disk is failing or
    /// does not answer. Never changes anything else of the PV.
    Flag { name: String, value: String },
    /// The disk's signs cleared: remove the annotation (and tell the PV and its claim).
    Unflag { name: String },
    /// An unbound PV on a failing disk: deleted with its resourceVersion as a precondition, so
    /// a claim bound meanwhile keeps it. A disk that only does not answer is not a reason (a
    /// backup tool freezes filesystems too).
    Withdraw { name: String, uid: String, resource_version: String, why: String },
}

/// Plans what to do about each PV given the failing signs of the volumes by host path, and
/// the paths whose disks this pass looked at (`judged`: signs read, or a look that did not
/// answer). Pure: a Bound, Released or deleting PV is only ever annotated; an unbound one on a
/// failing disk is withdrawn; the annotation follows the signs, so it clears when they do, and
/// only then: a disk not looked at this pass (its look still running, its volume not found) is
/// not proven healthy, and its annotation stays.
pub fn plan_health(
    pvs: &[PvState],
    failing: &BTreeMap<String, Vec<Failing>>,
    judged: &BTreeSet<String>,
) -> Vec<HealthAction> {
    let mut out = Vec::new();
    for pv in pvs {
        let signs = failing.get(&pv.host_path).filter(|f| !f.is_empty());
        match signs {
            Some(f) => {
                let failing_disk = f.iter().any(|f| !matches!(f, Failing::Unresponsive(_)));
                let unbound = !pv.deleting && !pv.claimed && matches!(pv.phase.as_str(), "Available" | "Pending");
                if failing_disk && unbound {
                    out.push(HealthAction::Withdraw {
                        name: pv.name.clone(),
                        uid: pv.uid.clone(),
                        resource_version: pv.resource_version.clone(),
                        why: annotation_value(f),
                    });
                    continue;
                }
                // An unbound PV being deleted (withdrawn) is about to go: nobody to tell.
                if pv.deleting && !pv.claimed {
                    continue;
                }
                let value = annotation_value(f);
                if pv.disk_failing.as_deref() != Some(value.as_str()) {
                    out.push(HealthAction::Flag { name: pv.name.clone(), value });
                }
            }
            None if pv.disk_failing.is_some() && judged.contains(&pv.host_path) => {
                out.push(HealthAction::Unflag { name: pv.name.clone() })
            }
            None => {}
        }
    }
    out
}

#[cfg(test)]
#[path = "disk_health_tests.rs"]
mod tests;

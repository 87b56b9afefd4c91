//! Failing-disk signs (issue 27): judges what the kernel shows about one volume's filesystem
//! or device, without special tools, into the reasons the volume counts as failing. The host
//! side (host::disk_health) reads the signs; this side decides, so every rule is unit-tested
//! with time passed in.
//!
//! Most signs are states the kernel keeps until someone repairs the disk (a read-only or shut
//! down filesystem, ext4's error count), so they are judged afresh on every look and clear by
//! themselves once repaired. The block layer's I/O error counter only grows, and a count from
//! before the agent started is no news, so it is judged against memory: a rise above the count
//! first seen is a failure for [`IO_ERROR_HOLD`] after the last rise, then clears.

use std::collections::BTreeMap;
use std::fmt;

use crate::core::cleanup::PvState;
use std::time::{Duration, Instant};

/// How long a rise of the I/O error counter keeps a disk failing after the last rise.
pub const IO_ERROR_HOLD: Duration = Duration::from_secs(10 * 60);

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
    /// An I/O error met while reading the volume's facts.
    IoFailure(String),
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
            Failing::IoFailure(what) => write!(f, "an I/O error while reading the volume: {what}"),
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
    pub fn judge(&mut self, key: &str, signs: &Signs, now: Instant) -> Vec<Failing> {
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
            failing.push(Failing::IoFailure(what.clone()));
        }
        failing
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
    }

    /// Number of disks remembered.
    pub fn len(&self) -> usize {
        self.counters.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
    }
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

/// Plans what to do about each PV given the failing signs of the volumes by host path. Pure:
/// a Bound, Released or deleting PV is only ever annotated; an unbound one on a failing disk
/// is withdrawn; the annotation follows the signs, so it clears when they do.
pub fn plan_health(pvs: &[PvState], failing: &BTreeMap<String, Vec<Failing>>) -> Vec<HealthAction> {
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
            None if pv.disk_failing.is_some() => out.push(HealthAction::Unflag { name: pv.name.clone() }),
            None => {}
        }
    }
    out
}

#[cfg(test)]
#[path = "disk_health_tests.rs"]
mod tests;

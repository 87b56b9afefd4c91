//! Which mount-table entries this agent cares about, and which block-device changes: a mount or
//! unmount anywhere on the node (kubelet mounts and unmounts for every pod) must not cost a
//! pass unless it touches something a pass reads. The agent says after each pass what it
//! depends on ([`MountInterest`], [`DeviceInterest`]); the host's watches compare only the
//! relevant part of what they read and wake a pass when that part changed. When in doubt an
//! entry is relevant: a pass too many costs CPU, a pass missed could publish a disk in use or
//! wipe one a pod still has mounted (the periodic resync stays the safety net).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::core::volumes::volume_safety::KUBELET_LOCAL_VOLUME_DIRS;

/// One mount-table entry, as far as relevance goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MountLine<'a> {
    /// `major:minor` of the filesystem.
    pub device: &'a str,
    /// The directory of the filesystem that is mounted (`/` unless a bind of a subdirectory or
    /// of a single file, such as a device node).
    pub root: &'a Path,
    /// Where it is mounted.
    pub mount_point: &'a Path,
    /// Filesystem type.
    pub fs_type: &'a str,
    /// Mount source (`/dev/sdb1`, `tmpfs`).
    pub source: &'a str,
}

/// What the last pass read from the mount table, so a change elsewhere can be told apart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MountInterest {
    /// Paths whose mounts a pass reads, as configured and as resolved: the discovery
    /// directories, the volumes' paths, the config directory. A mount at, below or above
    /// (covering) one of them is relevant, and so is every mount of the same filesystem device
    /// as one of those (a bind mount of a volume elsewhere, kubelet's mount of it into a pod,
    /// a mount in a host area that makes a volume's source unsafe).
    pub paths: BTreeSet<PathBuf>,
    /// Devices (`major:minor`) a pass depends on besides those found through `paths`: the
    /// disks of the volumes and entries found (a Filesystem volume's device, a Block
    /// volume's device number).
    pub devices: BTreeSet<String>,
    /// kubelet's directory (resolved): a mount covering it, or one of the directories below it
    /// where kubelet mounts local volumes (core::volumes::volume_safety::KUBELET_LOCAL_VOLUME_DIRS, the
    /// hostPaths deploy/ mounts), decides whether kubelet's mounts are visible at all.
    pub kubelet_dir: Option<PathBuf>,
    /// A class claims devices, has Block volumes, or a Block volume or entry was found: the
    /// in-use checks of block devices read every mount of a block device (a partition or a
    /// device stacked over it mounted anywhere, a device node bind-mounted into a pod).
    pub block_devices: bool,
}

/// The entries [`relevant_indices`] finds, themselves.
#[cfg(test)]
pub(crate) fn relevant_mounts<'a>(table: &[MountLine<'a>], interest: Option<&MountInterest>) -> Vec<MountLine<'a>> {
    relevant_indices(table, interest).into_iter().map(|i| table[i]).collect()
}

/// The positions in `table` of the entries the agent cares about, in table order; `None` interest means every
/// entry (nothing known yet). An entry is relevant when:
/// - its mount point is one of the interest paths, below one (a discovery entry mounted, a
///   mount nested in a volume) or above one (a mount that covers a discovery directory);
/// - its device is the device of such an entry, or one of the interest devices (the same
///   filesystem mounted elsewhere: kubelet's bind mount of a volume into a pod, a second
///   mount of a volume's disk, a host-area mount of it);
/// - its mount point covers kubelet's directory or one of the directories below it where
///   kubelet mounts local volumes;
/// - while block devices matter: its filesystem is on a block device (major not 0, or a source
///   under /dev: btrfs shows an anonymous device number), it is a devtmpfs, or it binds a
///   single file (root not `/`: a device node) below kubelet's directory.
pub(crate) fn relevant_indices(table: &[MountLine<'_>], interest: Option<&MountInterest>) -> Vec<usize> {
    let Some(interest) = interest else { return (0..table.len()).collect() };
    let devices = near_devices(table, interest);
    (0..table.len()).filter(|i| relevant_line(&table[*i], interest, &devices)).collect()
}

/// The devices whose every mount is relevant: the interest's own, and those of the entries at,
/// below or above its paths (the filesystems found there: every other mount of them matters).
pub(crate) fn near_devices(table: &[MountLine<'_>], interest: &MountInterest) -> BTreeSet<String> {
    let mut devices = interest.devices.clone();
    devices.extend(table.iter().filter(|m| near_path(&interest.paths, m.mount_point)).map(|m| m.device.to_string()));
    devices
}

/// Whether one entry is relevant, given the table's [`near_devices`]: the rule of
/// [`relevant_indices`], for a mount that came since the table was read too.
pub(crate) fn relevant_line(m: &MountLine<'_>, interest: &MountInterest, near_devices: &BTreeSet<String>) -> bool {
    let kubelet = interest.kubelet_dir.as_deref();
    let covers_kubelet = || {
        kubelet.is_some_and(|k| {
            std::iter::once(k.to_path_buf())
                .chain(KUBELET_LOCAL_VOLUME_DIRS.iter().map(|d| k.join(d)))
                .any(|view| view.starts_with(m.mount_point))
        })
    };
    near_path(&interest.paths, m.mount_point)
        || near_devices.contains(m.device)
        || covers_kubelet()
        || (interest.block_devices && on_block_device(m, kubelet))
}

/// What a mount event did to the namespace's mount IDs (listmount(2)), judged before reading the
/// whole table: on a busy node most events are mounts elsewhere, and one look at each new mount
/// tells them apart for the price of a few system calls instead of the kernel writing out the
/// table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum IdChange {
    /// Read the table: no earlier listing to compare with, the same IDs (a remount, a change of
    /// propagation, or a mount and its unmount between two looks: only the table shows those),
    /// or a mount went that was not one of the `fresh` mounts found irrelevant.
    ReadTable,
    /// Only these mounts came (and only fresh irrelevant ones went): look at each; the table
    /// need be read only if one may be relevant.
    LookAt(Vec<u64>),
}

/// Compares two listings (ascending, as listmount gives them). `fresh`: the mounts that came
/// since the table was last read and were found irrelevant then.
pub(crate) fn id_change(before: Option<&[u64]>, now: &[u64], fresh: &BTreeSet<u64>) -> IdChange {
    let Some(before) = before else { return IdChange::ReadTable };
    if before == now {
        return IdChange::ReadTable;
    }
    let (was, is): (BTreeSet<u64>, BTreeSet<u64>) = (before.iter().copied().collect(), now.iter().copied().collect());
    if was.difference(&is).any(|gone| !fresh.contains(gone)) {
        return IdChange::ReadTable;
    }
    IdChange::LookAt(is.difference(&was).copied().collect())
}

/// Whether `mount_point` is one of `paths`, below one, or above one (it covers it), in
/// logarithmic time: a busy node's every mount event asks this of every line of the table, and
/// an agent with a thousand volumes has a thousand paths. Paths order by components, so those
/// below `mount_point` follow it directly.
fn near_path(paths: &BTreeSet<PathBuf>, mount_point: &Path) -> bool {
    let at_or_below = mount_point.ancestors().any(|a| paths.contains(a));
    let above = || {
        paths
            .range::<Path, _>((std::ops::Bound::Included(mount_point), std::ops::Bound::Unbounded))
            .next()
            .is_some_and(|p| p.starts_with(mount_point))
    };
    at_or_below || above()
}

/// Whether an entry may be (or hold) a block device, for the in-use checks of block devices.
fn on_block_device(m: &MountLine<'_>, kubelet: Option<&Path>) -> bool {
    !m.device.starts_with("0:")
        || m.source.starts_with("/dev/")
        || m.fs_type == "devtmpfs"
        || (m.root != Path::new("/") && kubelet.is_none_or(|k| m.mount_point.starts_with(k)))
}

/// What the last pass depends on among the node's block devices, so that a device attached or
/// detached elsewhere (a loop device of another program) costs no pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DeviceInterest {
    /// Every change matters: a class claims devices (a new disk may be claimed) or has
    /// volumeMode Block (its entries are links to devices, which may appear or go with no
    /// change in the discovery directory).
    pub all: bool,
    /// The devices (`major:minor`) the volumes and entries found are on, and the whole disks
    /// under them: one of them going, appearing or resized matters.
    pub devices: BTreeSet<String>,
}

/// One line of the kernel's block-device list (`/proc/partitions`: major, minor, size in
/// 1 KiB blocks, name) or a udev by-id name (`by-id NAME`).
fn line_device(line: &str) -> Option<String> {
    let mut fields = line.split_whitespace();
    let (major, minor) = (fields.next()?, fields.next()?);
    let (major, minor): (u32, u32) = (major.parse().ok()?, minor.parse().ok()?);
    Some(format!("{major}:{minor}"))
}

/// Whether a change of the block-device list from `before` to `after` (each a sorted list of
/// lines as [`line_device`] reads them) matters to a pass: always before the first pass and
/// while `all`; otherwise only when a line that differs names one of the interest devices, or
/// is a line no device number can be read from (a by-id name, the header: a change there is
/// taken to matter while any device is depended on).
pub(crate) fn device_change_matters(before: &[String], after: &[String], interest: Option<&DeviceInterest>) -> bool {
    let Some(interest) = interest else { return before != after };
    if interest.all {
        return before != after;
    }
    let (b, a): (BTreeSet<&String>, BTreeSet<&String>) = (before.iter().collect(), after.iter().collect());
    b.symmetric_difference(&a).any(|line| match line_device(line) {
        Some(device) => interest.devices.contains(&device),
        None => !interest.devices.is_empty(),
    })
}

#[cfg(test)]
#[path = "mount_interest_tests.rs"]
mod tests;

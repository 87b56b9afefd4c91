//! Block devices as sysfs describes them: which base disk (or backing file) and byte range a
//! device's data is, and whether the host uses it. A partition, its whole disk, and two loop
//! devices over one image are different device numbers for the same data; discovery must see
//! that to publish each disk at most once and never offer a device the host has in use.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::HostError;
use super::mountinfo::MountTable;
use crate::core::volume_safety::{Extent, MountFacts, locate};

/// Stacked devices deeper than this (a loop over a partition of a loop...) are not followed.
const MAX_DEPTH: usize = 8;

/// `major:minor` of the block device at `path` (symlinks followed).
pub fn block_device_number(path: &Path) -> Result<String, HostError> {
    let meta = std::fs::metadata(path).map_err(|e| HostError::io("stat", path, e))?;
    Ok(device_number(meta.rdev()))
}

fn device_number(rdev: u64) -> String {
    format!("{}:{}", nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev))
}

/// The extent of the block device `major:minor`: a partition is a range of its whole disk, a
/// loop device a range of its backing file (or of the device it is backed by), anything else
/// the whole of itself. `None` when sysfs does not know the device (tmpfs and other
/// filesystems without a device).
pub fn extent(device: &str, mounts: &[MountFacts<'_>]) -> Option<Extent> {
    extent_at_depth(device, mounts, 0)
}

fn extent_at_depth(device: &str, mounts: &[MountFacts<'_>], depth: usize) -> Option<Extent> {
    if depth > MAX_DEPTH {
        return None;
    }
    let dir = std::fs::canonicalize(format!("/sys/dev/block/{device}")).ok()?;
    let read = |dir: &Path, name: &str| {
        std::fs::read_to_string(dir.join(name)).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
    };
    let number = |dir: &Path, name: &str| read(dir, name).and_then(|s| s.parse::<u64>().ok());
    let size = number(&dir, "size")?.saturating_mul(512);
    let shifted = |base: Extent, offset: u64, len: u64| Extent {
        start: base.start.saturating_add(offset),
        end: base.start.saturating_add(offset).saturating_add(len).min(base.end),
        ..base
    };
    if dir.join("partition").exists() {
        let start = number(&dir, "start")?.saturating_mul(512);
        let disk = read(dir.parent()?, "dev")?;
        return Some(shifted(extent_at_depth(&disk, mounts, depth + 1)?, start, size));
    }
    if let Some(backing) = read(&dir, "loop/backing_file") {
        let offset = number(&dir, "loop/offset").unwrap_or(0);
        let limit = number(&dir, "loop/sizelimit").filter(|l| *l > 0);
        let len = limit.unwrap_or(size);
        let path = PathBuf::from(backing.trim_end_matches(" (deleted)"));
        return Some(match std::fs::metadata(&path) {
            Ok(m) if m.file_type().is_block_device() => {
                shifted(extent_at_depth(&device_number(m.rdev()), mounts, depth + 1)?, offset, len)
            }
            Ok(m) => Extent {
                base: format!("file:{}:{}", device_number(m.dev()), m.ino()),
                start: offset,
                end: offset.saturating_add(len),
                file: std::fs::canonicalize(&path).ok().and_then(|p| locate(mounts, &p)),
            },
            // The file is not visible here (another mount namespace): its path is all we have.
            Err(_) => Extent {
                base: format!("file:{}", path.display()),
                start: offset,
                end: offset.saturating_add(len),
                file: None,
            },
        });
    }
    Some(Extent { base: format!("dev:{device}"), start: 0, end: size, file: None })
}

/// Every block device sysfs lists, with its `major:minor` and kernel name.
fn all_devices() -> Vec<(String, String)> {
    let Ok(rd) = std::fs::read_dir("/sys/class/block") else { return Vec::new() };
    rd.flatten()
        .filter_map(|e| {
            let dev = std::fs::read_to_string(e.path().join("dev")).ok()?;
            Some((dev.trim().to_string(), e.file_name().to_string_lossy().into_owned()))
        })
        .collect()
}

/// Why the block device at `path` is in use by the host, if it is (`facts` is `mounts` as the
/// safety rules see it, read once per pass): it, or any device that
/// shares its data (its partitions, its whole disk, another loop device over the same file),
/// is mounted, held by device-mapper, md or LVM, or open exclusively. The last is a
/// non-destructive probe: an `O_EXCL` open (no read, no write) that fails with EBUSY while a
/// filesystem, a holder or a program like mkfs has claimed the device; our own claim lasts
/// only until the descriptor is closed a moment later.
pub fn block_device_in_use(
    path: &Path,
    mounts: &MountTable,
    facts: &[MountFacts<'_>],
) -> Result<Option<String>, HostError> {
    let device = block_device_number(path)?;
    let own = extent(&device, facts);
    // (device, kernel name when it is another device, whether to probe it with O_EXCL)
    let mut sharing = vec![(device.clone(), None, true)];
    if let Some(own) = &own {
        for (dev, name) in all_devices() {
            let Some(e) = extent(&dev, facts).filter(|e| e.base == own.base && e.start < own.end && own.start < e.end)
            else {
                continue;
            };
            if dev != device {
                // A device spanning more than ours (the whole disk of a partition) is claimed
                // whenever any of its partitions is, so probing it would blame the others.
                let probe = e.start >= own.start && e.end <= own.end;
                sharing.push((dev, Some(name), probe));
            }
        }
    }
    for (dev, name, probe) in &sharing {
        let which = name.as_ref().map(|n| format!("{n}, which shares its data,")).unwrap_or_else(|| "it".to_string());
        if let Some(m) = mounts.mount_of_device(dev) {
            return Ok(Some(format!("{which} is mounted at {}", m.mount_point.display())));
        }
        let holders: Vec<String> = std::fs::read_dir(format!("/sys/dev/block/{dev}/holders"))
            .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        if !holders.is_empty() {
            return Ok(Some(format!("{which} is held by {} (device-mapper, md or LVM)", holders.join(", "))));
        }
        let node = match name {
            Some(n) => PathBuf::from(format!("/dev/{n}")),
            None => path.to_path_buf(),
        };
        if !probe || (name.is_some() && !node.exists()) {
            continue;
        }
        if exclusively_open(&node)? {
            return Ok(Some(format!(
                "{which} is open exclusively by another user (a mounted filesystem, device-mapper, md, LVM or a program such as mkfs)"
            )));
        }
    }
    Ok(None)
}

/// The non-destructive exclusive-open probe (see [`block_device_in_use`]).
fn exclusively_open(node: &Path) -> Result<bool, HostError> {
    use nix::fcntl::{OFlag, open};
    let flags = OFlag::O_RDONLY | OFlag::O_EXCL | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
    match open(node, flags, nix::sys::stat::Mode::empty()) {
        Ok(fd) => {
            drop(fd);
            Ok(false)
        }
        Err(nix::errno::Errno::EBUSY) => Ok(true),
        Err(e) => Err(HostError::io("open O_EXCL (probe)", node, e)),
    }
}

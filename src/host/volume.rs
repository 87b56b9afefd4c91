//! What a discovery entry is (directory, block device, something else) and how big it is.
//!
//! An entry is judged at its unresolved path: a directory volume must itself be the mount
//! point, so a symlink can never make discovery or a wipe leave the discovery directory. Only
//! block devices are reached through symlinks (`/dev/disk/by-id/...` links are the upstream
//! recipe), because a device node is the disk itself wherever the link points.

use std::fs::File;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::HostError;

/// The kind of a discovery entry, judged without following a symlink except to a block device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A real directory (a Filesystem volume when it is a mount point).
    Directory,
    /// A block device, or a symlink that resolves to one.
    BlockDevice,
    /// A symlink to anything but a block device (a directory, `/`, a dangling target): never
    /// followed, since it could point out of the discovery directory.
    Symlink,
    /// A regular file, socket, character device...: never a volume.
    Other,
}

/// Classifies `path` (see [`resolve_entry`]).
pub fn entry_kind(path: &Path) -> Result<EntryKind, HostError> {
    resolve_entry(path).map(|(kind, _)| kind)
}

/// Classifies the entry at `path` and returns the path to use for it: for a directory, the
/// canonical parent joined with the entry's own name (the entry itself is never resolved, so
/// the mount-table lookup is of the path kubelet will use); for a block device, the path as
/// given (opening it follows the link to the device node).
pub fn resolve_entry(path: &Path) -> Result<(EntryKind, PathBuf), HostError> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(HostError::io("classify", path, std::io::Error::other("not an entry of a directory")));
    };
    let parent = std::fs::canonicalize(parent).map_err(|e| HostError::io("resolve", parent, e))?;
    let entry = parent.join(name);
    let meta = std::fs::symlink_metadata(&entry).map_err(|e| HostError::io("lstat", &entry, e))?;
    let ft = meta.file_type();
    let kind = if ft.is_dir() {
        EntryKind::Directory
    } else if ft.is_block_device() {
        EntryKind::BlockDevice
    } else if ft.is_symlink() {
        match std::fs::metadata(&entry) {
            Ok(target) if target.file_type().is_block_device() => EntryKind::BlockDevice,
            _ => EntryKind::Symlink,
        }
    } else {
        EntryKind::Other
    };
    Ok((kind, entry))
}

/// Total size of the filesystem mounted at `path` (blocks times block size, as upstream).
pub fn filesystem_capacity(path: &Path) -> Result<u64, HostError> {
    let st = nix::sys::statfs::statfs(path).map_err(|e| HostError::io("statfs", path, e))?;
    let blocks = st.blocks();
    let bsize = u64::try_from(st.block_size()).unwrap_or(0);
    Ok(blocks.saturating_mul(bsize))
}

nix::ioctl_read!(blkgetsize64, 0x12, 114, u64);

/// Size of the block device at `path` in bytes (BLKGETSIZE64).
pub fn block_device_capacity(path: &Path) -> Result<u64, HostError> {
    let file = File::open(path).map_err(|e| HostError::io("open", path, e))?;
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which is valid for the call.
    unsafe { blkgetsize64(file.as_raw_fd(), &mut size) }.map_err(|e| HostError::io("ioctl BLKGETSIZE64", path, e))?;
    Ok(size)
}

/// `major:minor` of the block device at `path` (symlinks followed).
pub fn block_device_number(path: &Path) -> Result<String, HostError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|e| HostError::io("stat", path, e))?;
    let rdev = meta.rdev();
    Ok(format!("{}:{}", nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev)))
}

/// Why the block device at `path` is in use by the host, if it is: its filesystem (or one of
/// its partitions') is mounted, device-mapper, md or LVM holds it, or someone has it open
/// exclusively. The last is a non-destructive probe: an `O_EXCL` open (no read, no write)
/// that fails with EBUSY while a filesystem, a holder or a program like mkfs has claimed it;
/// our own claim lasts only until the descriptor is closed a moment later.
pub fn block_device_in_use(path: &Path, mounts: &super::mountinfo::MountTable) -> Result<Option<String>, HostError> {
    let device = block_device_number(path)?;
    let sys = PathBuf::from(format!("/sys/dev/block/{device}"));
    let mut parts = vec![(device.clone(), sys.clone(), None)];
    // Partitions are subdirectories of the disk's sysfs directory with a `partition` file.
    if let Ok(rd) = std::fs::read_dir(&sys) {
        for e in rd.flatten() {
            let dir = e.path();
            if dir.join("partition").exists()
                && let Ok(dev) = std::fs::read_to_string(dir.join("dev"))
            {
                parts.push((dev.trim().to_string(), dir, Some(e.file_name().to_string_lossy().into_owned())));
            }
        }
    }
    for (dev, dir, part) in &parts {
        let which = part.as_ref().map(|p| format!("its partition {p}")).unwrap_or_else(|| "it".to_string());
        if let Some(m) = mounts.mount_of_device(dev) {
            return Ok(Some(format!("{which} is mounted at {}", m.mount_point.display())));
        }
        let holders: Vec<String> = std::fs::read_dir(dir.join("holders"))
            .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        if !holders.is_empty() {
            return Ok(Some(format!("{which} is held by {} (device-mapper, md or LVM)", holders.join(", "))));
        }
    }
    use nix::fcntl::{OFlag, open};
    match open(path, OFlag::O_RDONLY | OFlag::O_EXCL | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK, nix::sys::stat::Mode::empty())
    {
        Ok(fd) => {
            drop(fd);
            Ok(None)
        }
        Err(nix::errno::Errno::EBUSY) => Ok(Some(
            "it is open exclusively by another user (a mounted filesystem, device-mapper, md, LVM or a program such as mkfs)"
                .to_string(),
        )),
        Err(e) => Err(HostError::io("open O_EXCL (probe)", path, e)),
    }
}

/// Total size of the filesystem mounted exactly at `path`, which must be a directory and not
/// a symlink (opened with `O_NOFOLLOW`, so a link swapped in after the check is not followed).
pub fn mounted_dir_capacity(path: &Path) -> Result<u64, HostError> {
    use nix::fcntl::{OFlag, open};
    let fd = open(
        path,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| HostError::io("open", path, e))?;
    let st = nix::sys::statfs::fstatfs(&fd).map_err(|e| HostError::io("statfs", path, e))?;
    let bsize = u64::try_from(st.block_size()).unwrap_or(0);
    Ok(st.blocks().saturating_mul(bsize))
}

//! What a discovery entry is (directory, block device, something else) and how big it is.
//!
//! An entry is judged at its unresolved path: a directory volume must itself be the mount
//! point, so a symlink can never make discovery or a wipe leave the discovery directory. Only
//! block devices are reached through symlinks (`/dev/disk/by-id/...` links are the upstream
//! recipe), because a device node is the disk itself wherever the link points.

use std::fs::File;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::host::HostError;
use crate::host::devices::blockdev::device_size;

/// The kind of a discovery entry, judged without following a symlink except to a block device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryKind {
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

/// Classifies the entry at `path` and returns the path to use for it: for a directory, the
/// canonical parent joined with the entry's own name (the entry itself is never resolved, so
/// the mount-table lookup is of the path kubelet will use); for a block device, the path as
/// given (opening it follows the link to the device node).
pub(crate) fn resolve_entry(path: &Path) -> Result<(EntryKind, PathBuf), HostError> {
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
        if link_reaches_block_device(&entry) { EntryKind::BlockDevice } else { EntryKind::Symlink }
    } else {
        EntryKind::Other
    };
    Ok((kind, entry))
}

/// Whether the symlink `link` leads to a block device without passing through a "magic link"
/// (`/proc/self/fd/N`, `/proc/PID/root`...): those resolve differently for every process, so
/// kubelet and the wipe would each reach another device than discovery did.
fn link_reaches_block_device(link: &Path) -> bool {
    use rustix::fs::{CWD, Mode, OFlags, ResolveFlags, fstat, openat2};
    let flags = OFlags::PATH | OFlags::CLOEXEC;
    match openat2(CWD, link, flags, Mode::empty(), ResolveFlags::NO_MAGICLINKS) {
        Ok(fd) => fstat(&fd).is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_block_device()),
        // Kernels before 5.6 (or a seccomp profile without openat2): refuse links through
        // /proc by their text.
        Err(rustix::io::Errno::NOSYS | rustix::io::Errno::PERM) => {
            let through_proc =
                std::fs::canonicalize(link).is_err() || std::fs::read_link(link).is_ok_and(|t| t.starts_with("/proc"));
            !through_proc && std::fs::metadata(link).is_ok_and(|m| m.file_type().is_block_device())
        }
        Err(_) => false,
    }
}

/// Whether a directory entry is the root of a mount, and which mount, as the kernel sees it
/// (statx without following the entry). The mount table alone cannot tell: it still lists
/// mounts that a later mount covered, and several mounts stacked on one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MountRoot {
    /// The entry is the root of the mount with this ID (the first field of mountinfo).
    Root(u64),
    /// The entry is not a mount root.
    NotRoot,
    /// The kernel does not say (before Linux 5.8): judge by the mount table's paths.
    Unknown,
}

/// Asks the kernel whether `path` (not followed) is a mount root (see [`MountRoot`]).
pub(crate) fn mount_root_at(path: &Path) -> Result<MountRoot, HostError> {
    use rustix::fs::{AtFlags, CWD, StatxAttributes, StatxFlags, statx};
    let st = match statx(CWD, path, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::TYPE | StatxFlags::MNT_ID) {
        Ok(st) => st,
        // Kernels before 4.11, or a seccomp profile that predates statx.
        Err(rustix::io::Errno::NOSYS | rustix::io::Errno::PERM) => return Ok(MountRoot::Unknown),
        Err(e) => return Err(HostError::io("statx", path, std::io::Error::from(e))),
    };
    let known = st.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT)
        && StatxFlags::from_bits_retain(st.stx_mask).contains(StatxFlags::MNT_ID);
    Ok(match (known, st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT)) {
        (false, _) => MountRoot::Unknown,
        (true, true) => MountRoot::Root(st.stx_mnt_id),
        (true, false) => MountRoot::NotRoot,
    })
}

/// The mount an open descriptor is on, by the kernel's mount ID (`None` before Linux 5.8).
pub(crate) fn mount_of_fd<'a>(
    fd: std::os::fd::BorrowedFd<'_>,
    mounts: &'a crate::host::mounts::mountinfo::MountTable,
) -> Option<&'a crate::host::mounts::mountinfo::MountEntry> {
    use rustix::fs::{AtFlags, StatxFlags, statx};
    let st = statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID).ok()?;
    StatxFlags::from_bits_retain(st.stx_mask).contains(StatxFlags::MNT_ID).then_some(())?;
    mounts.by_id(st.stx_mnt_id)
}

/// The mount whose root is the entry `path` (not followed), or `None` when the entry is not a
/// mount point. Uses the kernel's mount ID, so a covered or stacked mount is never taken for
/// the one that is visible at the path.
pub(crate) fn mount_at<'a>(
    path: &Path,
    mounts: &'a crate::host::mounts::mountinfo::MountTable,
) -> Result<Option<&'a crate::host::mounts::mountinfo::MountEntry>, HostError> {
    Ok(match mount_root_at(path)? {
        MountRoot::Root(id) => mounts.by_id(id).filter(|m| m.mount_point == path),
        MountRoot::NotRoot => None,
        MountRoot::Unknown => mounts.get(path),
    })
}

/// Total size of the filesystem mounted at `path` (blocks times block size, as upstream).
pub(crate) fn filesystem_capacity(path: &Path) -> Result<u64, HostError> {
    let st = nix::sys::statfs::statfs(path).map_err(|e| HostError::io("statfs", path, e))?;
    let blocks = st.blocks();
    let bsize = u64::try_from(st.block_size()).unwrap_or(0);
    Ok(blocks.saturating_mul(bsize))
}

/// Size of the block device at `path` in bytes (BLKGETSIZE64).
pub(crate) fn block_device_capacity(path: &Path) -> Result<u64, HostError> {
    let file = File::open(path).map_err(|e| HostError::io("open", path, e))?;
    device_size(&file).map_err(|e| HostError::io("ioctl BLKGETSIZE64", path, e))
}

/// Total size of the filesystem mounted exactly at `path`, which must be a directory and not
/// a symlink (opened with `O_NOFOLLOW`, so a link swapped in after the check is not followed).
pub(crate) fn mounted_dir_capacity(path: &Path) -> Result<u64, HostError> {
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

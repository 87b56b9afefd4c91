//! What a discovery entry is (directory, block device, something else) and how big it is.

use std::fs::File;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use super::HostError;

/// The kind of a discovery entry after following symlinks (e.g. /dev/disk/by-id links).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A directory (a Filesystem volume when it is a mount point).
    Directory,
    /// A block device.
    BlockDevice,
    /// A regular file, socket, character device...: never a volume.
    Other,
}

/// Classifies `path`, following symlinks.
pub fn entry_kind(path: &Path) -> Result<EntryKind, HostError> {
    let meta = std::fs::metadata(path).map_err(|e| HostError::io("stat", path, e))?;
    let ft = meta.file_type();
    Ok(if ft.is_dir() {
        EntryKind::Directory
    } else if ft.is_block_device() {
        EntryKind::BlockDevice
    } else {
        EntryKind::Other
    })
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

//! "Is this device blank?": reads a raw block device's signature areas (the ranges the quick
//! wipe zeroes) and windows sampled over its whole surface (core::devices::surface), without ever
//! writing, and says what they hold. A device is only claimed when they all read zero, the
//! state `blkdiscard -z` leaves: a signature names itself, and any other non-zero byte is data,
//! reported at its offset. The samples catch a disk "cleaned" by zeroing only its start.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::sys::stat::Mode;

use crate::core::devices::signatures::{Content, recognise, signature_areas};
use crate::core::devices::surface::{WINDOW, first_non_zero, sample_windows};
use crate::host::devices::blockdev;

/// How far a probe reads beyond the signature areas.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reach {
    /// Only the signature areas: a device this agent claimed and wiped (the quick wipe zeroes
    /// exactly those), checked again before it is published.
    pub areas_only: bool,
    /// What sysfs says of the device (a rotational one gets fewer, seek-bound, samples).
    pub rotational: Option<bool>,
    /// Further windows `(offset, len)` to read, e.g. where an earlier full read found data.
    pub extra: Vec<(u64, u64)>,
}

/// What probing a device found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Someone holds the device exclusively (mounted, a device-mapper/md/LVM holder, mkfs...):
    /// it is in use, and nothing was read.
    Busy,
    /// The signature areas were read.
    Read {
        /// Size of the device in bytes.
        size: u64,
        /// What the areas hold.
        content: Content,
    },
}

/// A probe that failed, naming the device and what was being done.
#[derive(Debug, thiserror::Error)]
pub enum DeviceContentError {
    /// The node (after following symlinks) is not a block device.
    #[error("{path} is not a block device")]
    NotBlockDevice { path: PathBuf },
    /// A system call failed (the host's one I/O error: which operation, which file).
    #[error(transparent)]
    Io(#[from] crate::host::HostError),
}

impl DeviceContentError {
    fn io(op: &'static str, path: &Path, source: impl Into<std::io::Error>) -> Self {
        DeviceContentError::Io(crate::host::HostError::io(op, path, source))
    }
}

/// Reads the signature areas of the block device `node` and recognises what they hold.
///
/// The device is opened read-only with O_EXCL (plus O_CLOEXEC and O_NONBLOCK): on a block
/// device O_EXCL without O_CREAT claims it exclusively, so it fails with EBUSY (reported as
/// [`Probe::Busy`]) while it is mounted or held by device-mapper, md, LVM or a program such as
/// mkfs, and while we read, none of them can claim it: what we read is not being rewritten by
/// a format under way. A read-only open does not make udev rescan the device (only a close
/// after a writable open sends the "change" event), so probing leaves no trace.
///
/// Besides the signature areas, the windows of [`sample_windows`] (and `reach.extra`) are read
/// on the same descriptor, in ascending order, through one reused buffer of [`WINDOW`] bytes;
/// the first non-zero byte ends the read. A recognised signature names itself; otherwise the
/// lowest non-zero offset read is reported as data.
pub fn probe_content(node: &Path) -> Result<Probe, DeviceContentError> {
    probe_content_with(node, &Reach::default())
}

/// [`probe_content`] with a chosen reach.
pub fn probe_content_with(node: &Path, reach: &Reach) -> Result<Probe, DeviceContentError> {
    let flags = OFlag::O_RDONLY | OFlag::O_EXCL | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
    let fd: OwnedFd = match open(node, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::EBUSY) => return Ok(Probe::Busy),
        Err(e) => return Err(DeviceContentError::io("open read-only exclusively", node, e)),
    };
    let file = File::from(fd);
    let meta = file.metadata().map_err(|e| DeviceContentError::io("fstat", node, e))?;
    if !meta.file_type().is_block_device() {
        return Err(DeviceContentError::NotBlockDevice { path: node.to_path_buf() });
    }
    let size = blockdev::device_size(&file).map_err(|e| DeviceContentError::io("ioctl BLKGETSIZE64", node, e))?;
    let mut areas = Vec::new();
    for (offset, len) in signature_areas(size) {
        let len = usize::try_from(len).map_err(|e| {
            DeviceContentError::io("size the read of", node, std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
        })?;
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, offset).map_err(|e| DeviceContentError::io("read signature area of", node, e))?;
        areas.push((offset, buf));
    }
    let views: Vec<(u64, &[u8])> = areas.iter().map(|(offset, buf)| (*offset, buf.as_slice())).collect();
    let content = recognise(size, &views);
    let below = match (&content, reach.areas_only) {
        (Content::Signatures(_), _) | (_, true) => return Ok(Probe::Read { size, content }),
        (Content::Data { offset }, false) => *offset,
        (Content::Blank, false) => size,
    };
    match first_non_zero_sampled(&file, size, reach, below)
        .map_err(|e| DeviceContentError::io("read sample of", node, e))?
    {
        Some(offset) => Ok(Probe::Read { size, content: Content::Data { offset: offset.min(below) } }),
        None => Ok(Probe::Read { size, content }),
    }
}

/// The first non-zero byte below `below` in the sample windows of a device of `size` bytes.
fn first_non_zero_sampled(file: &File, size: u64, reach: &Reach, below: u64) -> std::io::Result<Option<u64>> {
    let mut windows = sample_windows(size, reach.rotational);
    windows.extend(reach.extra.iter().filter(|(at, _)| *at < size).map(|&(at, len)| (at, len.min(size - at))));
    windows.sort_unstable();
    let mut buf = vec![0u8; WINDOW as usize];
    for (mut at, len) in windows {
        let end = at + len;
        while at < end && at < below {
            let n = usize::try_from((end - at).min(WINDOW)).unwrap_or(buf.len()).min(buf.len());
            let chunk = &mut buf[..n];
            file.read_exact_at(chunk, at)?;
            if let Some(i) = first_non_zero(chunk) {
                return Ok(Some(at + i as u64));
            }
            at += n as u64;
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image");
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let e = probe_content(&path).unwrap_err();
        assert!(matches!(e, DeviceContentError::NotBlockDevice { .. }), "{e:?}");
        assert_eq!(e.to_string(), format!("{} is not a block device", path.display()));
    }

    #[test]
    fn a_missing_node_names_the_path_and_the_operation() {
        let e = probe_content(Path::new("/dev/no-such-disk-here")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "open read-only exclusively /dev/no-such-disk-here: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn a_character_device_is_not_a_block_device() {
        let e = probe_content(Path::new("/dev/null")).unwrap_err();
        assert!(matches!(e, DeviceContentError::NotBlockDevice { .. }), "{e:?}");
    }
}

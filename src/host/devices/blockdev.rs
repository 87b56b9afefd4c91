//! Block devices as sysfs describes them: which base disk (or backing file) and byte range a
//! device's data is, and whether the host uses it. A partition, its whole disk, and two loop
//! devices over one image are different device numbers for the same data; discovery must see
//! that to publish each disk at most once and never offer a device the host has in use.
//!
//! The block and loop device ioctls live here too, each declared once behind a safe wrapper.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::stat::SFlag;

use crate::core::volumes::volume_safety::{Extent, MountFacts, locate};
use crate::host::HostError;
use crate::host::mounts::mountinfo::MountTable;
use crate::host::ops::{Job, OnDeadline, Operations, Subject};

/// Stacked devices deeper than this (a loop over a partition of a loop...) are not followed.
const MAX_DEPTH: usize = 8;

/// `major:minor` of the block device at `path` (symlinks followed).
pub(crate) fn block_device_number(path: &Path) -> Result<String, HostError> {
    let meta = std::fs::metadata(path).map_err(|e| HostError::io("stat", path, e))?;
    Ok(device_number(meta.rdev()))
}

/// `major:minor` of a device number, as sysfs and the mount table write it.
pub(crate) fn device_number(rdev: u64) -> String {
    format!("{}:{}", nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev))
}

/// The extent of the block device `major:minor`: a partition is a range of its whole disk, a
/// loop device a range of its backing file (or of the device it is backed by), anything else
/// the whole of itself. `None` when sysfs does not know the device (tmpfs and other
/// filesystems without a device).
pub(crate) fn extent(device: &str, mounts: &[MountFacts<'_>], on: &OnDeadline) -> Option<Extent> {
    extent_at_depth(device, mounts, 0, on)
}

fn extent_at_depth(device: &str, mounts: &[MountFacts<'_>], depth: usize, on: &OnDeadline) -> Option<Extent> {
    if depth > MAX_DEPTH {
        return None;
    }
    let dir = std::fs::canonicalize(format!("/sys/dev/block/{device}")).ok()?;
    let number = |dir: &Path, name: &str| sysfs_attr(dir, name).and_then(|s| s.parse::<u64>().ok());
    let size = number(&dir, "size")?.saturating_mul(512);
    let shifted = |base: Extent, offset: u64, len: u64| Extent {
        start: base.start.saturating_add(offset),
        end: base.start.saturating_add(offset).saturating_add(len).min(base.end),
        ..base
    };
    if dir.join("partition").exists() {
        let start = number(&dir, "start")?.saturating_mul(512);
        let disk = sysfs_attr(dir.parent()?, "dev")?;
        return Some(shifted(extent_at_depth(&disk, mounts, depth + 1, on)?, start, size));
    }
    if dir.join("loop").is_dir()
        && let Some(e) = loop_extent(device, &dir, size, mounts, depth, on)
    {
        return Some(e);
    }
    Some(Extent { base: format!("dev:{device}"), start: 0, end: size, file: None })
}

/// The sysfs directory of block device `dev` (a link into /sys/devices).
pub(crate) fn sys_block(dev: u64) -> PathBuf {
    PathBuf::from(format!("/sys/dev/block/{}", device_number(dev)))
}

/// Opens the device node of `dev` read-only: the hint, udev's `/dev/block/M:m`, or
/// `/dev/<DEVNAME>` from sysfs; only a node that really is that device counts.
pub(crate) fn open_device(dev: u64, hint: Option<&Path>) -> Option<File> {
    let mut candidates: Vec<PathBuf> = hint.map(Path::to_path_buf).into_iter().collect();
    candidates.push(PathBuf::from(format!("/dev/block/{}", device_number(dev))));
    if let Ok(uevent) = std::fs::read_to_string(sys_block(dev).join("uevent"))
        && let Some(name) = uevent.lines().find_map(|l| l.strip_prefix("DEVNAME="))
    {
        candidates.push(Path::new("/dev").join(name));
    }
    candidates.into_iter().find_map(|c| {
        let file = File::open(&c).ok()?;
        let meta = file.metadata().ok()?;
        (meta.file_type().is_block_device() && meta.rdev() == dev).then_some(file)
    })
}

/// The extent of loop device `device` (sysfs directory `dir`, `size` bytes): a range of the
/// device it is backed by, or of its backing file, named by the device number of the file's
/// filesystem and its inode as LOOP_GET_STATUS64 reports them (the node is opened read-only,
/// never `O_EXCL`), so it is known even when the file's path is not visible here (another
/// mount namespace). Without the ioctl (no node to open): the file as its path shows it here,
/// else the path's text. `None`: no file attached.
fn loop_extent(
    device: &str,
    dir: &Path,
    size: u64,
    mounts: &[MountFacts<'_>],
    depth: usize,
    on: &OnDeadline,
) -> Option<Extent> {
    let backing = sysfs_attr(dir, "loop/backing_file");
    let path = backing.as_deref().map(|b| PathBuf::from(b.trim_end_matches(" (deleted)")));
    let status = device_rdev(device).and_then(|r| open_device(r, None)).and_then(|f| loop_status(&f).ok());
    // The file itself is looked at only without the ioctl's answer: a stat by path asks the
    // file's filesystem (a hung FUSE or NFS server under a loop device would hold the pass).
    let seen = path.as_ref().filter(|_| status.is_none()).and_then(|p| std::fs::metadata(p).ok());
    let number = |name: &str| sysfs_attr(dir, name).and_then(|s| s.parse::<u64>().ok());
    let (offset, limit) = match &status {
        Some(st) => (st.offset, (st.size_limit > 0).then_some(st.size_limit)),
        None => (number("loop/offset").unwrap_or(0), number("loop/sizelimit").filter(|l| *l > 0)),
    };
    let len = limit.unwrap_or(size);
    let range = |base: String, file| Extent { base, start: offset, end: offset.saturating_add(len), file };
    // Backed by a block device: a range of that device's own extent.
    let backing_device = match (&status, &seen) {
        (Some(st), _) if st.rdevice != 0 && sys_block(st.rdevice).exists() => Some(st.rdevice),
        (None, Some(m)) if m.file_type().is_block_device() => Some(m.rdev()),
        _ => None,
    };
    if let Some(rdev) = backing_device {
        let base = extent_at_depth(&device_number(rdev), mounts, depth + 1, on)?;
        return Some(Extent {
            start: base.start.saturating_add(offset),
            end: base.start.saturating_add(offset).saturating_add(len).min(base.end),
            ..base
        });
    }
    // Where the file lives, for a path that is that very file here.
    let here = |dev: u64, ino: u64| {
        let p = path.as_ref()?;
        seen.as_ref().filter(|m| m.dev() == dev && m.ino() == ino)?;
        std::fs::canonicalize(p).ok().and_then(|p| locate(mounts, &p))
    };
    // The same from the mount table alone, never asking the file's filesystem: the kernel names
    // the file by its resolved path (`loop/backing_file`), and the mount that contains that
    // path here must be the file's filesystem (the device the ioctl reports). Where another
    // mount namespace's path happens to fall on that filesystem here too, the loop device is
    // taken to share that place's data: a refusal more, never one less.
    let in_table = |dev: u64| {
        let found = locate(mounts, path.as_ref()?)?;
        (found.device == device_number(dev)).then_some(found)
    };
    Some(match (&status, &seen) {
        (Some(st), _) => range(format!("file:{}:{}", device_number(st.device), st.inode), in_table(st.device)),
        (None, Some(m)) => range(format!("file:{}:{}", device_number(m.dev()), m.ino()), here(m.dev(), m.ino())),
        // Neither the ioctl nor the file here: its path is all we have.
        (None, None) => range(format!("file:{}", path?.display()), None),
    })
}

/// The device number of `major:minor`.
fn device_rdev(device: &str) -> Option<u64> {
    let (major, minor) = device.split_once(':')?;
    Some(nix::sys::stat::makedev(major.parse().ok()?, minor.parse().ok()?))
}

/// A sysfs attribute of the device directory `dir`, trimmed; `None` when missing or empty.
pub(crate) fn sysfs_attr(dir: &Path, rel: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(rel)).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
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

/// Block devices' extents by `major:minor` (None: that device gave no answer).
pub(crate) type Extents = BTreeMap<String, Option<Extent>>;

/// The extent of every block device of the node, by `major:minor`, each read as an operation
/// on its device under `timeout` (a loop device's status blocks while its backing file's
/// filesystem does not answer): `None` for a device that gave no answer. What
/// [`block_device_in_use`] compares with, read once per pass instead of once per device judged.
pub(crate) fn extents(mounts: &Arc<MountTable>, ops: &Operations, timeout: Duration) -> Extents {
    let devices = all_devices();
    let jobs = devices.iter().map(|(dev, name)| {
        let (dev, mounts) = (dev.clone(), mounts.clone());
        Job::new(Subject::Device(name.clone()), "extent", timeout, move |on| extent(&dev, &mounts.facts(), on))
    });
    let answers = ops.run_each(jobs);
    devices.into_iter().zip(answers).map(|((dev, _), answer)| (dev, answer.done().flatten())).collect()
}

/// Why the block device at `path` is in use by the host, if it is (`facts` is `mounts` as the
/// safety rules see it, read once per pass): it, or any device that
/// shares its data (its partitions, its whole disk, another loop device over the same file),
/// is mounted, held by device-mapper, md or LVM, or open exclusively. The last is a
/// non-destructive probe: an `O_EXCL` open (no read, no write) that fails with EBUSY while a
/// filesystem, a holder or a program like mkfs has claimed the device; our own claim lasts
/// only until the descriptor is closed a moment later. `known`: the extents the pass already
/// read under their own deadlines, by `major:minor`; a device not in it is read here. A device
/// that gave no answer (None) is not compared: only a loop device's status can fail to answer
/// (its backing file's filesystem stopped), and a device sharing its data has that data on
/// the same filesystem, so its own probe of its content does not answer either and proves
/// nothing blank.
pub(crate) fn block_device_in_use(
    path: &Path,
    mounts: &MountTable,
    facts: &[MountFacts<'_>],
    known: Option<&Extents>,
    on: &OnDeadline,
) -> Result<Option<String>, HostError> {
    let device = block_device_number(path)?;
    let extent_of = |dev: &str| match known.and_then(|k| k.get(dev)) {
        Some(e) => e.clone(),
        None => extent(dev, facts, on),
    };
    let own = extent_of(&device);
    // (device, kernel name when it is another device, whether to probe it with O_EXCL)
    let mut sharing = vec![(device.clone(), None, true)];
    // The whole disk of ours, when ours is a partition.
    let whole = std::fs::canonicalize(format!("/sys/dev/block/{device}"))
        .ok()
        .filter(|d| d.join("partition").exists())
        .and_then(|d| sysfs_attr(d.parent()?, "dev"));
    if let Some(own) = &own {
        for (dev, name) in all_devices() {
            let Some(e) = extent_of(&dev).filter(|e| e.overlaps(own)) else { continue };
            if dev != device {
                // A device spanning more than ours (the whole disk of a partition) is claimed
                // whenever any of its partitions is, so probing it would blame the others. Not
                // so another loop device over the same file: nothing claims it for ours, and
                // its filesystem may be mounted in a mount namespace whose table we do not see.
                let other_loop =
                    Path::new(&format!("/sys/dev/block/{dev}/loop")).is_dir() && whole.as_ref() != Some(&dev);
                let probe = (e.start >= own.start && e.end <= own.end) || other_loop;
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

// Block and loop device ioctls: each request is declared here once, behind a safe wrapper, so
// that no other module holds an `unsafe` block or its own copy of a request number. Each
// wrapper first checks that the descriptor is a block device: how much memory an ioctl reads
// or writes through its pointer is the driver's choice, and only for a block device is that
// the block layer's (or the loop driver's) declared argument.

/// The raw requests, generated by nix as `unsafe fn`s; private so that only the safe wrappers
/// below can call them.
mod raw {
    use super::LoopInfo64;

    nix::ioctl_read!(blkgetsize64, 0x12, 114, u64);
    // BLKDISCARD and BLKZEROOUT are declared with _IO (no size) although they take a u64[2].
    nix::ioctl_write_ptr_bad!(blkdiscard, nix::request_code_none!(0x12, 119), [u64; 2]);
    nix::ioctl_write_ptr_bad!(blkzeroout, nix::request_code_none!(0x12, 127), [u64; 2]);
    nix::ioctl_none!(blkflsbuf, 0x12, 97);
    nix::ioctl_none!(blkrrpart, 0x12, 95);
    nix::ioctl_read_bad!(loop_get_status64, 0x4C05, LoopInfo64);
}

/// The raw descriptor of `fd` if it is a block device; ENOTTY otherwise (what the kernel
/// answers a block ioctl on a regular file), without making the ioctl.
fn block_device_fd(fd: BorrowedFd<'_>) -> Result<RawFd, Errno> {
    let st = nix::sys::stat::fstat(fd)?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFBLK {
        Ok(fd.as_raw_fd())
    } else {
        Err(Errno::ENOTTY)
    }
}

/// Size in bytes of the block device open as `fd` (BLKGETSIZE64): the kernel's figure, which
/// is right for partitions and loop devices alike, unlike the file size of a device node.
pub(crate) fn device_size(fd: impl AsFd) -> std::io::Result<u64> {
    let fd = block_device_fd(fd.as_fd())?;
    let mut size: u64 = 0;
    // SAFETY: on a block device (checked; the descriptor is borrowed, so it stays that file)
    // BLKGETSIZE64 writes one u64 through the pointer, which is valid for the call.
    unsafe { raw::blkgetsize64(fd, &mut size) }?;
    Ok(size)
}

/// Discards `len` bytes from `start` (BLKDISCARD). The errno is returned as is, so the caller
/// can tell "unsupported" from a real failure.
pub(crate) fn discard(fd: impl AsFd, start: u64, len: u64) -> Result<(), Errno> {
    let fd = block_device_fd(fd.as_fd())?;
    let range = [start, len];
    // SAFETY: on a block device (checked) BLKDISCARD only reads two u64 (start, length)
    // through the pointer, which is valid for the call.
    unsafe { raw::blkdiscard(fd, &range) }.map(drop)
}

/// Zeroes `len` bytes from `start` in the kernel (BLKZEROOUT: write-zeroes offload when the
/// device has it). The errno is returned as is, so the caller can fall back to plain writes.
pub(crate) fn zero_out(fd: impl AsFd, start: u64, len: u64) -> Result<(), Errno> {
    let fd = block_device_fd(fd.as_fd())?;
    let range = [start, len];
    // SAFETY: on a block device (checked) BLKZEROOUT only reads two u64 (start, length)
    // through the pointer, which is valid for the call.
    unsafe { raw::blkzeroout(fd, &range) }.map(drop)
}

/// Drops the device's buffer cache (BLKFLSBUF), so nothing reads stale pages after a wipe.
pub(crate) fn flush_buffers(fd: impl AsFd) -> Result<(), Errno> {
    let fd = block_device_fd(fd.as_fd())?;
    // SAFETY: on a block device (checked) BLKFLSBUF takes no argument: no memory is passed.
    unsafe { raw::blkflsbuf(fd) }.map(drop)
}

/// Asks the kernel to re-read the partition table (BLKRRPART), so erased partitions vanish.
/// Fails on unpartitionable devices and while partitions are in use.
pub(crate) fn reread_partitions(fd: impl AsFd) -> Result<(), Errno> {
    let fd = block_device_fd(fd.as_fd())?;
    // SAFETY: on a block device (checked) BLKRRPART takes no argument: no memory is passed.
    unsafe { raw::blkrrpart(fd) }.map(drop)
}

/// `struct loop_info64` from linux/loop.h.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// What a loop device is bound to, as LOOP_GET_STATUS64 reports it: the parts of
/// `struct loop_info64` that name the backing file and the range of it in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LoopStatus {
    /// Device number of the filesystem holding the backing file (can change across reboots).
    pub device: u64,
    /// Device number the backing file stands for when it is a device node (0 otherwise).
    pub rdevice: u64,
    /// Inode of the backing file: tells a file replaced at the same path from the original.
    pub inode: u64,
    /// Byte offset into the backing file where the device starts.
    pub offset: u64,
    /// Size limit in bytes (0: up to the end of the file).
    pub size_limit: u64,
    /// The backing file's name as given at set-up, truncated by the kernel to 63 bytes.
    pub file_name: Vec<u8>,
}

/// The binding of the loop device open as `fd` (LOOP_GET_STATUS64). The kernel answers it with
/// a getattr of the backing file, which blocks while the file's filesystem does not answer (a
/// stopped FUSE daemon, a hung NFS server): it is only called from work that runs under the
/// executor's deadline (host::ops), as [`extent`] is, which takes the proof.
pub(crate) fn loop_status(fd: impl AsFd) -> Result<LoopStatus, Errno> {
    let fd = block_device_fd(fd.as_fd())?;
    let mut info = LoopInfo64 {
        lo_device: 0,
        lo_inode: 0,
        lo_rdevice: 0,
        lo_offset: 0,
        lo_sizelimit: 0,
        lo_number: 0,
        lo_encrypt_type: 0,
        lo_encrypt_key_size: 0,
        lo_flags: 0,
        lo_file_name: [0; 64],
        lo_crypt_name: [0; 64],
        lo_encrypt_key: [0; 32],
        lo_init: [0; 2],
    };
    // SAFETY: on a block device (checked) LOOP_GET_STATUS64 is the loop driver's ('L' is its
    // ioctl range; other block drivers reject it) and writes one loop_info64 through the
    // pointer, which points to one `LoopInfo64` (same layout) valid for the call.
    unsafe { raw::loop_get_status64(fd, &mut info) }?;
    let name = info.lo_file_name.split(|b| *b == 0).next().unwrap_or_default();
    Ok(LoopStatus {
        device: info.lo_device,
        rdevice: info.lo_rdevice,
        inode: info.lo_inode,
        offset: info.lo_offset,
        size_limit: info.lo_sizelimit,
        file_name: name.to_vec(),
    })
}

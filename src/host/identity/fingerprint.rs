//! Volume identity on the host: reads what the fingerprint recorded on each PV is made of (see
//! core::identity::disk_identity for the format and for what proves the same or another disk), so that a
//! different disk now mounted (or linked) at a volume's path is never wiped in its place.
//!
//! - Block-backed filesystem: the stable ID of the device under it (from sysfs: WWID, serial,
//!   device-mapper or md UUID, a loop device's backing file by its filesystem's device number
//!   and inode, never its path; a partition adds its number and start), the
//!   filesystem UUID read from the superblock, and the inode of the volume's root.
//! - tmpfs: its fsid, which the kernel draws at random for each mount.
//! - Other filesystems with no block device under them: fsid and root inode (never a proof).
//! - Block device: its stable ID and size.
//!
//! Devices are only ever opened read-only (never `O_EXCL`, never written), and a symlink is
//! followed only to a block device (see host::volumes::volume::resolve_entry).

use std::fs::File;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::os::unix::io::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use nix::sys::statfs::{BTRFS_SUPER_MAGIC, EXT4_SUPER_MAGIC, FsType, Statfs, TMPFS_MAGIC, XFS_SUPER_MAGIC};

use crate::core::cluster::succession::DiskCheck;
use crate::core::identity::disk_identity::{DiskIdentity, Found, Kind, LoopKey, Verdict, is_present, judge};
use crate::host::HostError;
pub(crate) use crate::host::devices::blockdev::open_device;
use crate::host::devices::blockdev::{device_number, device_size, loop_status, sys_block, sysfs_attr};
use crate::host::mounts::mountinfo::MountTable;
use crate::host::ops::OnDeadline;
use crate::host::volumes::volume::{EntryKind, mount_at, resolve_entry};

/// Fingerprint of the volume at `path`, in the current format (what is recorded on new PVs).
pub fn volume_identity(path: &Path) -> Result<String, HostError> {
    found_identity(path, None).map(|f| f.identity)
}

/// [`volume_identity`] with a mount table already read (saves reading it again for
/// filesystems whose device is only known from the mount table, like btrfs).
pub fn volume_identity_in(path: &Path, mounts: &MountTable) -> Result<String, HostError> {
    found_identity(path, Some(mounts)).map(|f| f.identity)
}

/// Everything the identity check compares with a recorded identity: the current and the legacy
/// fingerprint of the volume at `path`, and its filesystem type. The mount table is read only
/// when needed and not given.
pub fn found_identity(path: &Path, mounts: Option<&MountTable>) -> Result<Found, HostError> {
    let (kind, entry) = resolve_entry(path)?;
    let refuse = |why: &str| Err(HostError::io("identify", &entry, std::io::Error::other(why.to_string())));
    match kind {
        EntryKind::BlockDevice => block_found(&entry),
        EntryKind::Directory => filesystem_found(&entry, mounts),
        EntryKind::Symlink => refuse("a symlink to something other than a block device is never followed"),
        EntryKind::Other => refuse("neither a directory nor a block device"),
    }
}

/// Whether the volume recorded as `recorded` is still at `path`: a mounted directory or a
/// block device that may be the recorded disk (proven the same, or unproven with nothing
/// contradicting it; see core::identity::disk_identity::is_present). Any error counts as absent.
pub fn volume_present(path: &Path, recorded: Option<&str>, mounts: &MountTable) -> bool {
    let here = match resolve_entry(path) {
        // The mount visible at the entry itself (by the kernel's mount ID, never a covered one).
        Ok((EntryKind::Directory, resolved)) => mount_at(&resolved, mounts).is_ok_and(|m| m.is_some()),
        Ok((EntryKind::BlockDevice, _)) => true,
        _ => false,
    };
    here && recorded.is_none_or(|r| found_identity(path, Some(mounts)).is_ok_and(|found| is_present(r, &found)))
}

/// Whether the volume recorded as `recorded` is still at `path` (as `volume_present`) and what
/// is there compared with the recorded disk (as `check_disk`), from one read of the identity:
/// the presence check of every PV in every pass, which the fences (core::fence::volume_fence) need too.
/// The third part is the I/O error the identity read met (the failing sign `io-failure`):
/// the volume is there (mounted, or the device exists) and its disk fails, which is not
/// absence, so it counts as present and unverified.
pub fn presence_and_check(
    path: &Path,
    recorded: Option<&str>,
    mounts: &MountTable,
    _on: &OnDeadline,
) -> (bool, DiskCheck, Option<String>) {
    if !volume_present(path, None, mounts) {
        return (false, DiskCheck::Missing, None);
    }
    let Some(recorded) = recorded else { return (true, DiskCheck::Unrecorded, None) };
    match found_identity(path, Some(mounts)) {
        Ok(found) => (is_present(recorded, &found), judged(recorded, &found), None),
        Err(e) if e.is_disk_failure() => (true, DiskCheck::Unverified, Some(e.to_string())),
        Err(_) => (false, DiskCheck::Unverified, None),
    }
}

/// A recorded identity against the one found, as a disk check.
fn judged(recorded: &str, found: &Found) -> DiskCheck {
    match judge(recorded, found, None) {
        Verdict::Same(_) => DiskCheck::Same,
        Verdict::Different(_) => DiskCheck::Different,
        Verdict::Unproven { plausible: true, .. } => DiskCheck::Plausible,
        Verdict::Unproven { plausible: false, .. } => DiskCheck::Unverified,
    }
}

/// What is at a predecessor PV's path compared with the disk it recorded (see core::cluster::succession):
/// `Different` only when proven; `Plausible` when nothing proves either way but everything
/// that can be compared matches; `Unverified` when the identity cannot tell.
pub fn check_disk(path: &Path, recorded: Option<&str>, mounts: &MountTable, _on: &OnDeadline) -> DiskCheck {
    if !volume_present(path, None, mounts) {
        return DiskCheck::Missing;
    }
    let Some(recorded) = recorded else { return DiskCheck::Unrecorded };
    let Ok(found) = found_identity(path, Some(mounts)) else { return DiskCheck::Unverified };
    judged(recorded, &found)
}

/// The current-format identity to record for a PV whose old-format record still proves the
/// disk at `path` is the same one (see core::identity::disk_identity::upgrade); `None` otherwise.
pub fn upgraded_identity(path: &Path, recorded: &str, mounts: &MountTable, _on: &OnDeadline) -> Option<String> {
    if !crate::core::identity::disk_identity::is_legacy(recorded) || !volume_present(path, None, mounts) {
        return None;
    }
    crate::core::identity::disk_identity::upgrade(recorded, &found_identity(path, Some(mounts)).ok()?)
}

fn block_found(entry: &Path) -> Result<Found, HostError> {
    let file = File::open(entry).map_err(|e| HostError::io("open", entry, e))?;
    device_identity(&file, entry)
}

/// The identity of the block device open as `file` (`entry` only names it in errors). The
/// wipe computes it on the very descriptor it then writes through, so a link or device
/// swapped at the path after the check cannot redirect the wipe.
pub fn device_identity(file: &File, entry: &Path) -> Result<Found, HostError> {
    let meta = file.metadata().map_err(|e| HostError::io("stat", entry, e))?;
    if !meta.file_type().is_block_device() {
        return Err(HostError::io("identify", entry, std::io::Error::other("not a block device")));
    }
    let rdev = meta.rdev();
    let size = device_size(file).map_err(|e| HostError::io("ioctl BLKGETSIZE64", entry, e))?;
    let (disk, backing) = stable_id(rdev, Some(file));
    let born = backing_born(rdev, disk.as_deref(), backing.as_deref());
    let identity = DiskIdentity {
        kind: Kind::Block,
        disk,
        backing,
        born,
        size: Some(size),
        dev: Some(device_number(rdev)),
        ..Default::default()
    };
    Ok(Found { identity: identity.render(), legacy: legacy_block_identity(rdev, size), fs_type: None })
}

fn filesystem_found(entry: &Path, mounts: Option<&MountTable>) -> Result<Found, HostError> {
    use nix::fcntl::{OFlag, open};
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let fd = open(entry, flags, nix::sys::stat::Mode::empty()).map_err(|e| HostError::io("open", entry, e))?;
    directory_identity(fd.as_fd(), entry, mounts)
}

/// The identity of the volume whose root directory is open as `fd` (`entry` names it in
/// errors, and finds a btrfs filesystem's device in the mount table). The wipe computes it on
/// the very descriptor it then walks from, so a mount swapped at the path after the check
/// cannot redirect the wipe.
pub fn directory_identity(fd: BorrowedFd<'_>, entry: &Path, mounts: Option<&MountTable>) -> Result<Found, HostError> {
    let meta = nix::sys::stat::fstat(fd).map_err(|e| HostError::io("stat", entry, e))?;
    let st = nix::sys::statfs::fstatfs(fd).map_err(|e| HostError::io("statfs", entry, e))?;
    let (legacy_fsid, words) = fsid(&st);
    let legacy = format!("fs:fsid={legacy_fsid};ino={}", meta.st_ino);
    let meta = StatIds { ino: meta.st_ino, dev: meta.st_dev };
    let magic = st.filesystem_type();
    let mount_type = || mounts.and_then(|m| m.get(entry)).map(|m| m.fs_type.clone());
    let fs_type = mount_type().unwrap_or_else(|| fs_type_name(magic));
    let fsid_hex = format!("{:08x}{:08x}", words[0] as u32, words[1] as u32);
    let mut id = DiskIdentity { ino: Some(meta.ino()), ..Default::default() };
    if magic == TMPFS_MAGIC {
        // A random fsid per mount on current kernels; zero on old ones, where it names nothing.
        id.volatile = (words != [0, 0]).then(|| "tmpfs".to_string());
        id.fsid = Some(fsid_hex);
        id.dev = Some(device_number(meta.dev()));
    } else if let Some((rdev, device)) = block_device_under(entry, meta.dev(), mounts) {
        (id.disk, id.backing) = stable_id(rdev, device.as_ref());
        id.born = backing_born(rdev, id.disk.as_deref(), id.backing.as_deref());
        id.uuid = device.as_ref().and_then(|d| filesystem_uuid(d, magic));
        id.dev = Some(device_number(rdev));
    } else {
        id.fsid = Some(fsid_hex);
        id.dev = Some(device_number(meta.dev()));
    }
    Ok(Found { identity: id.render(), legacy, fs_type: Some(fs_type) })
}

/// The statfs fsid as earlier versions recorded it (`a,b`, the two words in decimal) and as
/// its two words. nix has no accessor; the Debug form is stable ("fsid_t { __val: [a, b] }").
/// The inode and device of a volume root, from `fstat`.
struct StatIds {
    ino: u64,
    dev: u64,
}

impl StatIds {
    fn ino(&self) -> u64 {
        self.ino
    }

    fn dev(&self) -> u64 {
        self.dev
    }
}

fn fsid(st: &Statfs) -> (String, [i32; 2]) {
    let text = format!("{:?}", st.filesystem_id());
    let legacy: String = text.chars().filter(|c| c.is_ascii_digit() || *c == ',' || *c == '-').collect();
    let mut words = legacy.split(',').map(|w| w.parse::<i32>().unwrap_or(0));
    let words = [words.next().unwrap_or(0), words.next().unwrap_or(0)];
    (legacy, words)
}

fn fs_type_name(magic: FsType) -> String {
    match magic {
        m if m == EXT4_SUPER_MAGIC => "ext4".to_string(),
        m if m == XFS_SUPER_MAGIC => "xfs".to_string(),
        m if m == BTRFS_SUPER_MAGIC => "btrfs".to_string(),
        m if m == TMPFS_MAGIC => "tmpfs".to_string(),
        m => format!("fs-{:x}", m.0),
    }
}

/// The block device holding the filesystem at `entry`, with a read-only handle on it when its
/// node can be opened: the filesystem's own device number when it is a block device (ext4,
/// XFS...), else the mount table's source (btrfs reports an anonymous device number).
fn block_device_under(entry: &Path, st_dev: u64, mounts: Option<&MountTable>) -> Option<(u64, Option<File>)> {
    if sys_block(st_dev).exists() {
        return Some((st_dev, open_device(st_dev, None)));
    }
    let read;
    let table = match mounts {
        Some(t) => t,
        None => {
            read = MountTable::read().ok()?;
            &read
        }
    };
    let source = PathBuf::from(&table.get(entry)?.source);
    if !source.is_absolute() {
        return None;
    }
    let meta = std::fs::metadata(&source).ok().filter(|m| m.file_type().is_block_device())?;
    Some((meta.rdev(), open_device(meta.rdev(), Some(&source))))
}

/// The stable ID of block device `dev` and, for a loop device, the device number of its
/// backing file's filesystem. A partition is its disk's ID plus its number and start.
pub(crate) fn stable_id(dev: u64, node: Option<&File>) -> (Option<String>, Option<String>) {
    let Ok(dir) = std::fs::canonicalize(sys_block(dev)) else { return (None, None) };
    if let Some(part) = sysfs_attr(&dir, "partition") {
        let (Some(start), Some(disk_dir)) = (sysfs_attr(&dir, "start"), dir.parent()) else { return (None, None) };
        // Loop ioctls on a partition answer for its disk.
        let (disk, backing) = device_id(disk_dir, node);
        return (disk.map(|d| format!("{d}/part{part}@{start}")), backing);
    }
    device_id(&dir, node)
}

/// Where the kernel keeps what the hardware or the administrator named a device by, most
/// specific first: SCSI/ATA WWID, NVMe namespace WWID, serials (SCSI, virtio), device-mapper
/// UUID (LVM, dm-crypt, multipath), md array UUID.
const ID_ATTRIBUTES: [(&str, &str); 6] = [
    ("device/wwid", "wwid"),
    ("wwid", "wwid"),
    ("device/serial", "serial"),
    ("serial", "serial"),
    ("dm/uuid", "dm"),
    ("md/uuid", "md"),
];

fn device_id(dir: &Path, node: Option<&File>) -> (Option<String>, Option<String>) {
    for (rel, kind) in ID_ATTRIBUTES {
        if let Some(v) = sysfs_attr(dir, rel) {
            return (Some(format!("{kind}:{v}")), None);
        }
    }
    if dir.join("loop").is_dir() {
        return loop_id(node);
    }
    (None, None)
}

/// A loop device is the data of the file behind it, named by what LOOP_GET_STATUS64 reports
/// (never the path, which differs in another mount namespace and changes on rename: see
/// core::identity::disk_identity): the device number of the filesystem holding the file, its inode, and
/// the range in use. That device number is also returned apart, as the identity's `backing`.
fn loop_id(node: Option<&File>) -> (Option<String>, Option<String>) {
    let Some(info) = node.and_then(|n| loop_status(n).ok()) else { return (None, None) };
    let backing = device_number(info.device);
    let key = LoopKey {
        dev: Some(backing.clone()),
        ino: info.inode,
        offset: info.offset,
        limit: (info.size_limit > 0).then_some(info.size_limit),
        part: None,
        born: None,
        size: None,
    };
    (key.render(), Some(backing))
}

/// The birth time (ns since 1970) of the file behind loop device `dev` (or behind the loop
/// device a partition `dev` is of) whose stable id `disk` (with the identity's `backing`) was
/// just read; `None` for any other device, or when it cannot be proven to be of that very
/// file. The kernel names the file by its path (`loop/backing_file`), which may lead elsewhere
/// by now: the file found there counts only when its filesystem and inode are those of `disk`
/// (not of a second LOOP_GET_STATUS64, which a device attached again in between would answer
/// for another file). The path is tried as this process sees it and as the host's first
/// process does (`/proc/1/root`: an agent in a container with the host's PIDs). A file deleted
/// while attached, one in a mount namespace the agent cannot see and a filesystem without
/// birth times give `None`: compared where known (core::identity::disk_identity).
fn backing_born(dev: u64, disk: Option<&str>, backing: Option<&str>) -> Option<u64> {
    use rustix::fs::{AtFlags, CWD, StatxFlags, makedev, statx};
    let key = LoopKey::parse(disk?)?.with_backing(backing);
    let wanted = key.dev.clone()?;
    let dir = std::fs::canonicalize(sys_block(dev)).ok()?;
    let disk_dir = if sysfs_attr(&dir, "partition").is_some() { dir.parent()?.to_path_buf() } else { dir };
    let path = sysfs_attr(&disk_dir, "loop/backing_file")?;
    if path.ends_with(" (deleted)") || !path.starts_with('/') {
        return None;
    }
    let host_root = Path::new("/proc/1/root").join(path.trim_start_matches('/'));
    // No symlink is followed, no automount triggered, and a network filesystem is not asked to
    // sync: what the cache holds answers (the file's inode and birth time do not change).
    let flags = AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT | AtFlags::STATX_DONT_SYNC;
    [PathBuf::from(&path), host_root].into_iter().find_map(|p| {
        let st = statx(CWD, &p, flags, StatxFlags::INO | StatxFlags::BTIME).ok()?;
        let same_file = st.stx_ino == key.ino && device_number(makedev(st.stx_dev_major, st.stx_dev_minor)) == wanted;
        let has_btime = st.stx_mask & StatxFlags::BTIME.bits() != 0;
        let ns = u64::try_from(st.stx_btime.tv_sec).ok()?.checked_mul(1_000_000_000)?;
        (same_file && has_btime).then(|| ns.saturating_add(u64::from(st.stx_btime.tv_nsec)))
    })
}

/// The UUID in the superblock of the filesystem of type `magic` on `device`, read with
/// ordinary buffered reads (coherent with what the kernel and mkfs write through the device).
fn filesystem_uuid(device: &File, magic: FsType) -> Option<String> {
    let read = |offset: u64, len: usize| {
        let mut buf = vec![0u8; len];
        device.read_exact_at(&mut buf, offset).ok().map(|_| buf)
    };
    let uuid: Vec<u8> = if magic == EXT4_SUPER_MAGIC {
        // ext2/3/4: superblock at 1024, s_magic 0xEF53 (LE) at 0x38, s_uuid at 0x68.
        let sb = read(1024, 0x78)?;
        (u16::from_le_bytes([sb[0x38], sb[0x39]]) == 0xEF53).then(|| sb[0x68..0x78].to_vec())?
    } else if magic == XFS_SUPER_MAGIC {
        // XFS: "XFSB" at 0, sb_uuid at 32.
        let sb = read(0, 48)?;
        (&sb[0..4] == b"XFSB").then(|| sb[32..48].to_vec())?
    } else if magic == BTRFS_SUPER_MAGIC {
        // btrfs: superblock at 64 KiB, fsid at 0x20, magic "_BHRfS_M" at 0x40.
        let sb = read(65536, 0x48)?;
        (&sb[0x40..0x48] == b"_BHRfS_M").then(|| sb[0x20..0x30].to_vec())?
    } else {
        return None;
    };
    if uuid.iter().all(|b| *b == 0) {
        return None;
    }
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    Some(format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32]))
}

/// A block device's identity as versions before the `v2` format recorded it: the most stable
/// ID sysfs offered then, or the device number, with the size. Kept byte for byte so PVs they
/// recorded can still be compared.
fn legacy_block_identity(rdev: u64, size: u64) -> String {
    let sys = sys_block(rdev);
    let read = |rel: &str| sysfs_attr(&sys, rel);
    let stable = read("device/wwid")
        .map(|v| format!("wwid={v}"))
        .or_else(|| read("wwid").map(|v| format!("wwid={v}")))
        .or_else(|| read("device/serial").map(|v| format!("serial={v}")))
        .or_else(|| read("dm/uuid").map(|v| format!("dm={v}")))
        .or_else(|| read("loop/backing_file").map(|v| format!("loop={v}@{}", read("loop/offset").unwrap_or_default())));
    match stable {
        Some(id) => format!("blk:{id};size={size}"),
        None => format!("blk:dev={};size={size}", device_number(rdev)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_on_one_filesystem_differ_by_root_inode() {
        let tmp = tempfile::tempdir().unwrap();
        let a = tmp.path().join("a");
        let b = tmp.path().join("b");
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let ia = volume_identity(&a).unwrap();
        assert!(ia.starts_with("v2;fs;"), "{ia}");
        assert_ne!(ia, volume_identity(&b).unwrap());
        assert_eq!(ia, volume_identity(&a).unwrap(), "identity is stable");
        let found = found_identity(&a, None).unwrap();
        assert!(found.legacy.starts_with("fs:fsid="), "{}", found.legacy);
        assert_eq!(
            judge(&ia, &found_identity(&b, None).unwrap(), None),
            judge(&found.identity, &found_identity(&b, None).unwrap(), None)
        );
        assert!(!matches!(judge(&ia, &found_identity(&b, None).unwrap(), None), Verdict::Same(_)));
    }

    #[test]
    fn symlinks_to_directories_have_no_identity() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("real")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("real"), tmp.path().join("link")).unwrap();
        assert!(volume_identity(&tmp.path().join("link")).is_err());
        std::fs::write(tmp.path().join("file"), b"x").unwrap();
        assert!(volume_identity(&tmp.path().join("file")).is_err());
    }

    fn image(offset: u64, bytes: &[(u64, &[u8])]) -> (tempfile::NamedTempFile, File) {
        let f = tempfile::NamedTempFile::new().unwrap();
        f.as_file().set_len(offset + 128 * 1024).unwrap();
        for (at, data) in bytes {
            f.as_file().write_all_at(data, *at).unwrap();
        }
        let file = File::open(f.path()).unwrap();
        (f, file)
    }

    const UUID: [u8; 16] =
        [0x0b, 0x6c, 0x9a, 0x5e, 0x11, 0x11, 0x42, 0x22, 0x83, 0x33, 0x44, 0x44, 0x55, 0x55, 0x66, 0x66];
    const UUID_TEXT: &str = "0b6c9a5e-1111-4222-8333-444455556666";

    #[test]
    fn superblock_uuids_are_read_where_each_filesystem_keeps_them() {
        let (_t, ext) = image(0, &[(1024 + 0x38, &[0x53, 0xEF]), (1024 + 0x68, &UUID)]);
        assert_eq!(filesystem_uuid(&ext, EXT4_SUPER_MAGIC).as_deref(), Some(UUID_TEXT));
        assert_eq!(filesystem_uuid(&ext, XFS_SUPER_MAGIC), None, "only the mounted type's superblock is read");
        let (_t, xfs) = image(0, &[(0, b"XFSB"), (32, &UUID)]);
        assert_eq!(filesystem_uuid(&xfs, XFS_SUPER_MAGIC).as_deref(), Some(UUID_TEXT));
        let (_t, btrfs) = image(0, &[(65536 + 0x40, b"_BHRfS_M"), (65536 + 0x20, &UUID)]);
        assert_eq!(filesystem_uuid(&btrfs, BTRFS_SUPER_MAGIC).as_deref(), Some(UUID_TEXT));
        let (_t, blank) = image(0, &[]);
        for magic in [EXT4_SUPER_MAGIC, XFS_SUPER_MAGIC, BTRFS_SUPER_MAGIC, TMPFS_MAGIC] {
            assert_eq!(filesystem_uuid(&blank, magic), None);
        }
        let (_t, zero_uuid) = image(0, &[(0, b"XFSB")]);
        assert_eq!(filesystem_uuid(&zero_uuid, XFS_SUPER_MAGIC), None, "an all-zero UUID names nothing");
    }

    #[test]
    fn tmpfs_mounts_at_one_path_differ() {
        if !crate::host::test_env::require_root("tmpfs_mounts_at_one_path_differ") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("v");
        std::fs::create_dir_all(&p).unwrap();
        let mount = |p: &Path| {
            assert!(
                std::process::Command::new("mount").args(["-t", "tmpfs", "tmpfs"]).arg(p).status().unwrap().success()
            )
        };
        let umount = |p: &Path| assert!(std::process::Command::new("umount").arg(p).status().unwrap().success());
        mount(&p);
        let first = volume_identity(&p).unwrap();
        assert!(first.contains(";volatile=tmpfs;"), "{first}");
        umount(&p);
        mount(&p);
        let second = found_identity(&p, None).unwrap();
        umount(&p);
        assert_ne!(first, second.identity, "a different disk at the same path must not look the same");
        assert!(matches!(judge(&first, &second, None), Verdict::Different(_)));
    }
}

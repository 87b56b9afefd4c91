//! Reads the failing-disk signs of one volume (issue 27) from what the kernel already shows:
//! the mount table's super options, sysfs and one `statx` of the volume. It runs on every pass
//! for every volume, so it never reads the device's data and costs microseconds; anything
//! unreadable is an unknown (None), never an error, and core::health::disk_health judges the result.
//!
//! How each sign shows on Linux 6.18 (checked with loop devices):
//! - ext4 `errors=remount-ro` after an error: the superblock stays `rw` but the super options
//!   gain `emergency_ro` (statfs's ST_RDONLY stays clear), `/sys/fs/ext4/<dev>/errors_count`
//!   counts the errors and keeps them across mounts until `e2fsck` clears them.
//! - ext4 shut down (`FS_IOC_SHUTDOWN`): super option `shutdown`; statx and statfs still work.
//! - XFS shut down: nothing in mountinfo or `/sys/fs/xfs/<dev>`, statfs works, but getattr
//!   (statx) and open of any inode fail with EIO: XFS's getattr fails only when shut down.
//! - `mount -o remount,ro`: super options `ro`. A read-only bind mount of a read-write
//!   filesystem is not a sign (the filesystem is fine).
//! - `blockdev --setro`: `/sys/dev/block/M:m/ro` is `1` (a partition's shows its disk's too).
//! - A loop device shrunk under its filesystem (`truncate` + `losetup -c`): statfs still says
//!   the filesystem's size; `/sys/dev/block/M:m/size` (512-byte sectors) says the device's.
//! - The block layer counts I/O errors only for SCSI disks (`device/ioerr_cnt`, hex); loop,
//!   virtio and NVMe devices have no counter, so io_errors is None there.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, CWD, StatxFlags, statx};
use rustix::io::Errno;

use crate::core::health::disk_health::{Signs, SizeFacts};
use crate::host::mounts::mountinfo::MountEntry;
use crate::host::ops::OnDeadline;

/// Where the kernel publishes devices and filesystems.
const SYS: &str = "/sys";

/// How deep to follow `slaves/` (dm over md over partitions...) before giving up.
const MAX_STACK_DEPTH: usize = 8;

/// What the node's failing-disk signs are read from that changes without a mount or a device
/// changing, for the block-device watch (host::mounts::watch), which reads each part only while a
/// volume has it: the ext4 error counts (`ext4`) and the SCSI I/O error counters (`io`), in
/// one comparable list; each mount's superblock options (read-only, `emergency_ro`,
/// `shutdown`) are [`superblock_options_hash`]. Only procfs and sysfs are read; no disk is
/// touched, so a wedged one cannot stop the watch. (An XFS shutdown shows only to a stat of the
/// volume, so it is seen at the next pass, not by this.)
pub fn counters_fingerprint(ext4: bool, io: bool) -> Vec<String> {
    let mut out = Vec::new();
    let counters = |dir: &str, file: &str| -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
        rd.flatten()
            .filter_map(|e| {
                let value = std::fs::read_to_string(e.path().join(file)).ok()?;
                Some(format!("{dir}/{} {}", e.file_name().to_string_lossy(), value.trim()))
            })
            .collect()
    };
    if ext4 {
        out.extend(counters("/sys/fs/ext4", "errors_count"));
    }
    if io {
        out.extend(counters("/sys/block", "device/ioerr_cnt"));
    }
    out
}

/// A hash of every mount's superblock options (the field after the filesystem type and
/// source in /proc/self/mountinfo), without keeping the table: on a node with a thousand
/// volume mounts the table is large, and this runs every few seconds.
pub fn superblock_options_hash() -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let table = std::fs::read("/proc/self/mountinfo").unwrap_or_default();
    for line in table.split(|b| *b == b'\n') {
        let Some(at) = line.windows(3).position(|w| w == b" - ") else { continue };
        let id = line.split(|b| *b == b' ').next().unwrap_or_default();
        let options = line[at + 3..].split(|b| *b == b' ').nth(2).unwrap_or_default();
        (id, options).hash(&mut hasher);
    }
    hasher.finish()
}

/// Filesystems whose size stays what it was made unless resized (see
/// core::health::disk_health::SizeFacts::fixed).
const FIXED_SIZE_FILESYSTEMS: [&str; 8] = ["ext2", "ext3", "ext4", "xfs", "tmpfs", "vfat", "exfat", "f2fs"];

/// Reads the signs of one volume: `volume` is its path inside the container, `mount` its mount
/// (None for a block volume), `device` the `major:minor` of the filesystem's device or of the
/// block volume, `bytes` the size the inspection read (statfs or BLKGETSIZE64). Only sysfs
/// reads and, for a filesystem volume, one `statx` of `volume`.
pub fn read_signs(
    volume: &Path,
    mount: Option<&MountEntry>,
    device: &str,
    bytes: Option<u64>,
    _on: &OnDeadline,
) -> Signs {
    read_signs_in(Path::new(SYS), volume, mount, device, bytes)
}

/// [`read_signs`] with sysfs at `sys` (a fake tree in unit tests).
fn read_signs_in(sys: &Path, volume: &Path, mount: Option<&MountEntry>, device: &str, bytes: Option<u64>) -> Signs {
    let fixed = mount.is_none_or(|m| FIXED_SIZE_FILESYSTEMS.contains(&m.fs_type.as_str()));
    let device_bytes = match (mount, block_device(device)) {
        (Some(_), Some((major, _))) if major != 0 => device_size(sys, device),
        _ => None,
    };
    let mut signs = Signs {
        size: bytes.map(|bytes| SizeFacts { bytes, device_bytes, fixed }),
        instance: instance(sys, mount, device),
        read_only: mount.is_some_and(|m| m.super_read_only),
        shut_down: mount.is_some_and(|m| m.super_shut_down),
        ..Signs::default()
    };
    if let Some(mount) = mount {
        look_at_volume(volume, mount, &mut signs);
    }
    match block_device(device) {
        // Major 0 is an anonymous device (tmpfs, overlay, btrfs subvolumes): no disk to read.
        Some((0, _)) | None => {}
        Some(_) => look_at_device(sys, device, mount, &mut signs),
    }
    signs
}

/// The one call on the volume itself: a `statx` of its root, which a shut down XFS fails with
/// EIO, and which meets other I/O errors a broken filesystem returns.
fn look_at_volume(volume: &Path, mount: &MountEntry, signs: &mut Signs) {
    let Err(errno) = statx(CWD, volume, AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT, StatxFlags::TYPE) else {
        return;
    };
    if mount.fs_type == "xfs" && errno == Errno::IO {
        signs.shut_down = true;
    } else if is_io_error(errno) {
        signs.io_failure = Some(format!("statx {}: {}", volume.display(), std::io::Error::from(errno)));
    }
    // Any other error (the volume gone, not allowed...) is discovery's business, not the disk's.
}

/// Errors that mean the disk or the filesystem on it failed: EIO, EUCLEAN (EFSCORRUPTED),
/// EBADMSG (EFSBADCRC), ENXIO and ENODEV (the device went away under the filesystem).
pub(crate) fn is_io_error(errno: Errno) -> bool {
    [Errno::IO, Errno::UCLEAN, Errno::BADMSG, Errno::NXIO, Errno::NODEV].contains(&errno)
}

/// Whether a failed call's error is one of [`is_io_error`]'s: the disk failed, not the caller.
pub(crate) fn is_disk_failure(e: &std::io::Error) -> bool {
    e.raw_os_error().is_some_and(|n| is_io_error(Errno::from_raw_os_error(n)))
}

/// Whether the filesystem open as `fd`, which refused a write as read-only, was made so by the
/// kernel after an error rather than mounted read-only by an operator: its mount's superblock
/// options now (a fresh read of the mount table) and, for ext4, its error count
/// (core::health::disk_health::read_only_after_error). Unreadable facts say no: the operator's case,
/// which the next pass's signs still judge.
pub(crate) fn read_only_after_error(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    let Ok(mounts) = crate::host::mounts::mountinfo::MountTable::read() else { return false };
    let Some(mount) = crate::host::volumes::volume::mount_of_fd(fd, &mounts) else { return false };
    let errors = fs::read_link(Path::new(SYS).join("dev/block").join(&mount.device))
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
        .and_then(|name| read_trimmed(&Path::new(SYS).join("fs/ext4").join(name).join("errors_count")))
        .and_then(|t| t.parse().ok());
    crate::core::health::disk_health::read_only_after_error(&mount.super_options, errors)
}

/// What tells this instance of the volume from an earlier one at its path
/// (core::health::disk_health::Signs::instance): a filesystem's mount ID and device, a block device's
/// number and, for a loop device, its backing file (a detached and re-attached `loopN`).
fn instance(sys: &Path, mount: Option<&MountEntry>, device: &str) -> String {
    let backing = block_device(device)
        .and_then(|_| read_trimmed(&sys.join("dev/block").join(device).join("loop/backing_file")))
        .unwrap_or_default();
    match mount {
        Some(m) => format!("mount {} dev {device} {backing}", m.id),
        None => format!("dev {device} {backing}"),
    }
}

/// The size of block device `device` (`major:minor`) from sysfs, in bytes; None if unreadable.
fn device_size(sys: &Path, device: &str) -> Option<u64> {
    let sectors: u64 = read_trimmed(&sys.join("dev/block").join(device).join("size"))?.parse().ok()?;
    sectors.checked_mul(512)
}

/// The sysfs reads about the block device `device` (`major:minor`, major not 0).
fn look_at_device(sys: &Path, device: &str, mount: Option<&MountEntry>, signs: &mut Signs) {
    let dir = sys.join("dev/block").join(device);
    let name = match fs::read_link(&dir) {
        Ok(target) => target.file_name().map(|n| n.to_string_lossy().into_owned()),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            // A block device that is mounted or offered but has left sysfs was removed under
            // its user (a pulled disk): everything on it fails from now on.
            signs.io_failure.get_or_insert_with(|| format!("block device {device} is gone (no {})", dir.display()));
            return;
        }
        Err(_) => None,
    };
    signs.devices = device_names(&dir);
    if read_trimmed(&dir.join("ro")).as_deref() == Some("1") {
        signs.read_only = true;
    }
    if let (Some(name), Some(mount)) = (&name, mount)
        && matches!(mount.fs_type.as_str(), "ext4" | "ext3" | "ext2")
    {
        signs.fs_errors =
            read_trimmed(&sys.join("fs/ext4").join(name).join("errors_count")).and_then(|t| t.parse().ok());
    }
    signs.io_errors = io_error_count(&dir);
}

/// The kernel names of the block device at `dir` and of every device under it: its slaves,
/// recursively, and the whole disk of each partition (a request error names the whole disk),
/// so a kernel log line about any of them is about the volume (core::health::kernel_log).
fn device_names(dir: &Path) -> Vec<String> {
    let mut names = Vec::new();
    let mut add = |dir: &Path| {
        let Ok(real) = fs::canonicalize(dir) else { return };
        if let Some(name) = real.file_name().map(|n| n.to_string_lossy().into_owned())
            && !names.contains(&name)
        {
            names.push(name);
        }
    };
    let mut stack = vec![(dir.to_path_buf(), 0)];
    while let Some((dir, depth)) = stack.pop() {
        add(&dir);
        if dir.join("partition").exists() {
            add(&dir.join(".."));
        }
        if depth < MAX_STACK_DEPTH
            && let Ok(rd) = fs::read_dir(dir.join("slaves"))
        {
            stack.extend(rd.flatten().map(|e| (e.path(), depth + 1)));
        }
    }
    names
}

/// The sum of the SCSI error counters of the whole disks under `dir` (itself, the disk of a
/// partition, the disks under a dm or md device); None when none of them has one.
fn io_error_count(dir: &Path) -> Option<u64> {
    let mut disks = Vec::new();
    whole_disks(dir.to_path_buf(), 0, &mut disks);
    let mut seen = Vec::new();
    let mut total: Option<u64> = None;
    for disk in disks {
        // One disk under two partitions of a stack is counted once.
        let id = read_trimmed(&disk.join("dev"));
        if id.is_some() && seen.contains(&id) {
            continue;
        }
        seen.push(id);
        if let Some(count) = read_trimmed(&disk.join("device/ioerr_cnt")).and_then(|t| parse_hex(&t)) {
            total = Some(total.unwrap_or(0).saturating_add(count));
        }
    }
    total
}

/// Collects the whole disks under the block device at `dir`: the devices in `slaves/` (each
/// resolved in turn), else the disk of a partition (the kernel resolves `..` of the partition's
/// own directory, which sits in its disk's), else the device itself.
fn whole_disks(dir: PathBuf, depth: usize, out: &mut Vec<PathBuf>) {
    if depth > MAX_STACK_DEPTH {
        return;
    }
    let slaves: Vec<PathBuf> =
        fs::read_dir(dir.join("slaves")).map(|rd| rd.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    if !slaves.is_empty() {
        for slave in slaves {
            whole_disks(slave, depth + 1, out);
        }
    } else if dir.join("partition").exists() {
        out.push(dir.join(".."));
    } else {
        out.push(dir);
    }
}

/// `major:minor` as numbers; None for anything else (so no path can be made of it).
fn block_device(device: &str) -> Option<(u32, u32)> {
    let (major, minor) = device.split_once(':')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(major) || !digits(minor) {
        return None;
    }
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// A counter as sysfs prints it: `0x1f` (SCSI's `%#x`), or plain hex.
fn parse_hex(text: &str) -> Option<u64> {
    let digits = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")).unwrap_or(text);
    u64::from_str_radix(digits, 16).ok()
}

/// A small sysfs file, trimmed; None when unreadable.
fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|t| t.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fake sysfs the way the kernel lays it out: devices under `devices/`, reached through
    /// `dev/block/M:m` symlinks, partitions inside their disk's directory.
    struct FakeSys {
        dir: tempfile::TempDir,
    }

    impl FakeSys {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            fs::create_dir_all(dir.path().join("dev/block")).unwrap();
            FakeSys { dir }
        }

        fn root(&self) -> &Path {
            self.dir.path()
        }

        /// Adds a device at `devices/<rel>` numbered `dev`, with `files` in it.
        fn device(&self, rel: &str, dev: &str, files: &[(&str, &str)]) -> PathBuf {
            let path = self.root().join("devices").join(rel);
            fs::create_dir_all(&path).unwrap();
            fs::write(path.join("dev"), format!("{dev}\n")).unwrap();
            for (name, text) in files {
                let file = path.join(name);
                fs::create_dir_all(file.parent().unwrap()).unwrap();
                fs::write(file, text).unwrap();
            }
            symlink(format!("../../devices/{rel}"), self.root().join("dev/block").join(dev)).unwrap();
            path
        }

        fn slave(&self, holder: &Path, name: &str, rel: &str) {
            fs::create_dir_all(holder.join("slaves")).unwrap();
            symlink(self.root().join("devices").join(rel), holder.join("slaves").join(name)).unwrap();
        }

        fn ext4_errors(&self, name: &str, count: &str) {
            let dir = self.root().join("fs/ext4").join(name);
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("errors_count"), count).unwrap();
        }
    }

    fn mount(fs_type: &str, device: &str) -> MountEntry {
        MountEntry {
            id: 40,
            device: device.to_string(),
            root: PathBuf::from("/"),
            mount_point: PathBuf::from("/"),
            fs_type: fs_type.to_string(),
            source: "/dev/x".to_string(),
            super_read_only: false,
            super_shut_down: false,
            super_options: "rw".to_string(),
        }
    }

    /// The volume path for the statx: `/`, which is healthy here.
    /// The signs, without the device names ([`device_names_cover_the_stack`] checks them).
    fn signs(sys: &FakeSys, mount: Option<&MountEntry>, device: &str) -> Signs {
        let signs = read_signs_in(sys.root(), Path::new("/"), mount, device, None);
        Signs { devices: Vec::new(), instance: String::new(), ..signs }
    }

    #[test]
    fn the_instance_changes_with_the_mount_and_the_loop_backing_file() {
        let sys = FakeSys::new();
        let dir = sys.device("virtual/block/loop3", "7:3", &[("loop/backing_file", "/images/a\n")]);
        let instance =
            |mount: Option<&MountEntry>| read_signs_in(sys.root(), Path::new("/"), mount, "7:3", None).instance;
        let mut m = mount("ext4", "7:3");
        assert_eq!(instance(Some(&m)), "mount 40 dev 7:3 /images/a");
        m.id = 41;
        assert_eq!(instance(Some(&m)), "mount 41 dev 7:3 /images/a");
        assert_eq!(instance(None), "dev 7:3 /images/a");
        fs::write(dir.join("loop/backing_file"), "/images/b\n").unwrap();
        assert_eq!(instance(None), "dev 7:3 /images/b");
    }

    #[test]
    fn device_names_cover_the_stack() {
        let sys = FakeSys::new();
        sys.device("pci0/a/block/sda", "8:0", &[]);
        sys.device("pci0/a/block/sda/sda1", "8:1", &[("partition", "1\n")]);
        sys.device("pci0/b/block/sdb", "8:16", &[]);
        let md = sys.device("virtual/block/md0", "9:0", &[]);
        sys.slave(&md, "sda1", "pci0/a/block/sda/sda1");
        sys.slave(&md, "sdb", "pci0/b/block/sdb");
        let dm = sys.device("virtual/block/dm-0", "252:0", &[]);
        sys.slave(&dm, "md0", "virtual/block/md0");
        let names = |device: &str| {
            let mut n = read_signs_in(sys.root(), Path::new("/"), None, device, None).devices;
            n.sort();
            n
        };
        assert_eq!(names("8:1"), ["sda", "sda1"]);
        assert_eq!(names("8:0"), ["sda"]);
        assert_eq!(names("252:0"), ["dm-0", "md0", "sda", "sda1", "sdb"]);
        // tmpfs: no device, no names.
        assert!(
            read_signs_in(sys.root(), Path::new("/"), Some(&mount("tmpfs", "0:9")), "0:9", None).devices.is_empty()
        );
    }

    #[test]
    fn sizes_of_the_volume_and_the_device_under_a_filesystem() {
        let sys = FakeSys::new();
        sys.device("virtual/block/loop5", "7:5", &[("size", "65536\n")]);
        let at = |mount: Option<&MountEntry>, device: &str, bytes| {
            read_signs_in(sys.root(), Path::new("/"), mount, device, bytes).size
        };
        // ext4 on the loop device: its device's size (sectors of 512 bytes) beside it.
        let ext4 = mount("ext4", "7:5");
        assert_eq!(
            at(Some(&ext4), "7:5", Some(64 << 20)),
            Some(SizeFacts { bytes: 64 << 20, device_bytes: Some(32 << 20), fixed: true })
        );
        // A block volume: its own size is the fact; no device under it.
        assert_eq!(
            at(None, "7:5", Some(32 << 20)),
            Some(SizeFacts { bytes: 32 << 20, device_bytes: None, fixed: true })
        );
        // tmpfs: no device; fixed. NFS or ZFS: not fixed.
        assert_eq!(
            at(Some(&mount("tmpfs", "0:40")), "0:40", Some(1 << 20)),
            Some(SizeFacts { bytes: 1 << 20, device_bytes: None, fixed: true })
        );
        assert_eq!(
            at(Some(&mount("zfs", "0:41")), "0:41", Some(1 << 20)),
            Some(SizeFacts { bytes: 1 << 20, device_bytes: None, fixed: false })
        );
        // Nothing read by the inspection: no size sign.
        assert_eq!(at(Some(&ext4), "7:5", None), None);
    }

    #[test]
    fn scsi_disk_partition_counts_its_disks_errors_and_ext4_errors() {
        let sys = FakeSys::new();
        sys.device("pci0/host0/target0/block/sda", "8:0", &[("ro", "0\n"), ("device/ioerr_cnt", "0x1f\n")]);
        sys.device("pci0/host0/target0/block/sda/sda1", "8:1", &[("ro", "0\n"), ("partition", "1\n")]);
        sys.ext4_errors("sda1", "3\n");
        let m = mount("ext4", "8:1");
        assert_eq!(signs(&sys, Some(&m), "8:1"), Signs { io_errors: Some(31), fs_errors: Some(3), ..Signs::default() });
        // The whole disk as a block volume: no filesystem, so no ext4 count.
        assert_eq!(signs(&sys, None, "8:0"), Signs { io_errors: Some(31), ..Signs::default() });
        // XFS on the partition: ext4's directory of the same name is not read.
        assert_eq!(signs(&sys, Some(&mount("xfs", "8:1")), "8:1"), Signs { io_errors: Some(31), ..Signs::default() });
    }

    #[test]
    fn read_only_from_sysfs_or_the_super_options() {
        let sys = FakeSys::new();
        sys.device("virtual/block/loop3", "7:3", &[("ro", "1\n")]);
        sys.device("virtual/block/loop4", "7:4", &[("ro", "0\n")]);
        assert!(signs(&sys, None, "7:3").read_only);
        assert!(!signs(&sys, None, "7:4").read_only);
        let mut m = mount("ext4", "7:4");
        m.super_read_only = true;
        m.super_shut_down = true;
        let s = signs(&sys, Some(&m), "7:4");
        assert!(s.read_only && s.shut_down);
        // Loop devices have no error counter and no ext4 directory here: unknowns.
        assert_eq!((s.io_errors, s.fs_errors), (None, None));
    }

    #[test]
    fn stacked_devices_sum_their_disks_once() {
        let sys = FakeSys::new();
        sys.device("pci0/a/block/sda", "8:0", &[("device/ioerr_cnt", "0x2\n")]);
        sys.device("pci0/a/block/sda/sda1", "8:1", &[("partition", "1\n")]);
        sys.device("pci0/a/block/sda/sda2", "8:2", &[("partition", "2\n")]);
        sys.device("pci0/b/block/sdb", "8:16", &[("device/ioerr_cnt", "0x10\n")]);
        sys.device("pci0/c/block/vda", "253:0", &[]);
        let md = sys.device("virtual/block/md0", "9:0", &[]);
        sys.slave(&md, "sda1", "pci0/a/block/sda/sda1");
        sys.slave(&md, "sda2", "pci0/a/block/sda/sda2");
        sys.slave(&md, "sdb", "pci0/b/block/sdb");
        let dm = sys.device("virtual/block/dm-0", "252:0", &[]);
        sys.slave(&dm, "md0", "virtual/block/md0");
        sys.slave(&dm, "vda", "pci0/c/block/vda");
        assert_eq!(signs(&sys, None, "9:0").io_errors, Some(0x12));
        assert_eq!(signs(&sys, None, "252:0").io_errors, Some(0x12));
        // Only disks without a counter under it: unknown.
        let dm1 = sys.device("virtual/block/dm-1", "252:1", &[]);
        sys.slave(&dm1, "vda", "pci0/c/block/vda");
        assert_eq!(signs(&sys, None, "252:1").io_errors, None);
    }

    #[test]
    fn a_loop_of_slaves_ends() {
        let sys = FakeSys::new();
        let a = sys.device("virtual/block/dm-5", "252:5", &[]);
        sys.slave(&a, "dm-5", "virtual/block/dm-5");
        assert_eq!(signs(&sys, None, "252:5").io_errors, None);
    }

    #[test]
    fn a_device_gone_from_sysfs_is_an_io_failure() {
        let sys = FakeSys::new();
        let s = signs(&sys, Some(&mount("ext4", "8:33")), "8:33");
        assert!(s.io_failure.as_deref().is_some_and(|f| f.contains("block device 8:33 is gone")), "{s:?}");
    }

    #[test]
    fn anonymous_and_malformed_devices_read_no_sysfs() {
        let sys = FakeSys::new();
        // tmpfs (0:x) has no block device: healthy, nothing known.
        assert_eq!(signs(&sys, Some(&mount("tmpfs", "0:35")), "0:35"), Signs::default());
        for bad in ["", "8", "8:", ":1", "../..", "8:1/../..", "a:b", "8:1:2", " 8:1", "99999999999:0"] {
            assert_eq!(signs(&sys, None, bad), Signs::default(), "{bad:?}");
        }
    }

    #[test]
    fn unreadable_or_odd_counters_are_unknown() {
        let sys = FakeSys::new();
        sys.device("p/block/sdc", "8:32", &[("device/ioerr_cnt", "garbage\n")]);
        sys.device("p/block/sdd", "8:48", &[("device/ioerr_cnt", "ff\n")]);
        sys.ext4_errors("sdc", "-1\n");
        assert_eq!(signs(&sys, Some(&mount("ext4", "8:32")), "8:32"), Signs::default());
        assert_eq!(signs(&sys, None, "8:48").io_errors, Some(255));
    }

    #[test]
    fn errno_classes() {
        for e in [Errno::IO, Errno::UCLEAN, Errno::BADMSG, Errno::NXIO, Errno::NODEV] {
            assert!(is_io_error(e), "{e:?}");
        }
        for e in [Errno::NOENT, Errno::ACCESS, Errno::NOTDIR, Errno::LOOP, Errno::PERM, Errno::NOMEM] {
            assert!(!is_io_error(e), "{e:?}");
        }
        assert_eq!(parse_hex("0x1f"), Some(31));
        assert_eq!(parse_hex("0X0"), Some(0));
        assert_eq!(parse_hex(""), None);
        assert_eq!(parse_hex("0x"), None);
        assert!(is_disk_failure(&std::io::Error::from_raw_os_error(5)));
        assert!(!is_disk_failure(&std::io::Error::from_raw_os_error(2)));
        assert!(!is_disk_failure(&std::io::Error::other("not an errno")));
    }
}

//! Failing-disk signs (issue 27) on real loop devices (root only: skipped with a message
//! otherwise, a failure under CI): each test brings a real filesystem or device into the state
//! a failing disk leaves it in (an ext4 error with errors=remount-ro, a shut down XFS or ext4, a
//! read-only remount, a read-only block device), checks that host::health::disk_health::read_signs
//! sees it and core::health::disk_health judges it, then repairs it and checks that the signs clear.
//! Each read is timed: it runs for every volume on every pass.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use local_static_provisioner::core::health::disk_health::{Failing, HealthMemory, Signs, SizeFacts};
use local_static_provisioner::core::health::kernel_log::KernelLogMemory;
use local_static_provisioner::host::health::disk_health::read_signs;
use local_static_provisioner::host::health::kernel_log::{KMSG, KernelLog};
use local_static_provisioner::host::mounts::mountinfo::{MountEntry, MountTable};
use local_static_provisioner::host::ops::foreground;
use support::{cannot_run, quiet, remove_scratch_dir, require_root, run};

/// A scratch directory with its loop images in `images/` and mount points in `mnt/`; every
/// mount and loop device left behind is undone when dropped (also after a failed assertion).
struct Lab {
    root: PathBuf,
    loops: Vec<PathBuf>,
}

impl Lab {
    fn new() -> Self {
        let root = tempfile::Builder::new().prefix("lsp-disk-health-").tempdir().unwrap().keep();
        std::fs::create_dir_all(root.join("images")).unwrap();
        Lab { root, loops: Vec::new() }
    }

    /// A loop device over a sparse image of `mib` MiB.
    fn loop_device(&mut self, name: &str, mib: u64, partitions: bool) -> PathBuf {
        let img = self.root.join("images").join(name);
        run(Command::new("truncate").arg("-s").arg(format!("{mib}M")).arg(&img));
        let mut cmd = Command::new("losetup");
        if partitions {
            cmd.arg("-P");
        }
        let out = run(cmd.args(["--find", "--show"]).arg(&img));
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        self.loops.push(dev.clone());
        dev
    }

    fn mount_point(&self, name: &str) -> PathBuf {
        let p = self.root.join("mnt").join(name);
        std::fs::create_dir_all(&p).unwrap();
        p
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for p in support::mounts_under(&self.root) {
            quiet(Command::new("umount").arg(&p));
        }
        for dev in self.loops.iter().rev() {
            quiet(Command::new("blockdev").arg("--setrw").arg(dev));
            quiet(Command::new("losetup").arg("-d").arg(dev));
        }
        remove_scratch_dir(&self.root, "disk_health");
    }
}

/// The mount at `point`, as the agent reads it.
fn mount_at(point: &Path) -> MountEntry {
    let table = MountTable::read().unwrap();
    table.get(point).cloned().unwrap_or_else(|| panic!("{} is not mounted", point.display()))
}

/// `major:minor` of a block device, from sysfs.
fn dev_number(device: &Path) -> String {
    let name = device.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::read_to_string(format!("/sys/class/block/{name}/dev")).unwrap().trim().to_string()
}

/// The signs of the filesystem volume mounted at `point`, timed (without the device names,
/// which [`devices_of`] checks).
fn fs_signs(point: &Path) -> Signs {
    let mount = mount_at(point);
    let signs = timed(point, || foreground(|on| read_signs(point, Some(&mount), &mount.device, None, on)));
    Signs { devices: Vec::new(), instance: String::new(), ..signs }
}

/// The signs of the block volume `device`, timed (without the device names).
fn block_signs(device: &Path) -> Signs {
    let number = dev_number(device);
    let signs = timed(device, || foreground(|on| read_signs(device, None, &number, None, on)));
    Signs { devices: Vec::new(), instance: String::new(), ..signs }
}

/// Runs `read` 200 times and prints the fastest, median and slowest call; the median must be
/// well under a millisecond (a debug build on a shared machine: the slowest is only printed).
fn timed(what: &Path, read: impl Fn() -> Signs) -> Signs {
    let first = read();
    let mut times: Vec<Duration> = (0..200)
        .map(|_| {
            let start = Instant::now();
            let again = read();
            let took = start.elapsed();
            assert_eq!(again, first, "{}: signs changed between reads", what.display());
            took
        })
        .collect();
    times.sort();
    let median = times[times.len() / 2];
    eprintln!(
        "read_signs {}: min {:?} median {median:?} max {:?} ({first:?})",
        what.display(),
        times[0],
        times[times.len() - 1]
    );
    assert!(median < Duration::from_micros(500), "read_signs {} took {median:?} (median)", what.display());
    first
}

fn judge(signs: &Signs) -> Vec<&'static str> {
    HealthMemory::default().judge("disk", signs, Instant::now()).iter().map(Failing::code).collect()
}

fn mkfs_ext4(dev: &Path) {
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(dev));
}

fn mount(args: &[&str], dev: &Path, point: &Path) {
    run(Command::new("mount").args(args).arg(dev).arg(point));
}

fn umount(point: &Path) {
    run(Command::new("umount").arg(point));
}

/// `e2fsck -fy`: exit 0 (clean) or 1 (errors corrected) are both a repaired filesystem.
fn fsck(dev: &Path) {
    let out = Command::new("e2fsck").arg("-fy").arg(dev).output().unwrap();
    let code = out.status.code();
    assert!(
        matches!(code, Some(0 | 1)),
        "e2fsck {}: {code:?}\n{}",
        dev.display(),
        String::from_utf8_lossy(&out.stdout)
    );
}

fn clean_ext4() -> Signs {
    Signs { fs_errors: Some(0), ..Signs::default() }
}

/// Makes ext4 meet real corruption: the inode of a file is cleared behind its directory entry
/// (debugfs, unmounted), then a lookup of the file finds the deleted inode, an ext4 error.
fn corrupt_and_look_up(dev: &Path, point: &Path) {
    std::fs::write(point.join("victim"), b"data").unwrap();
    umount(point);
    run(Command::new("debugfs").args(["-w", "-R", "clri /victim"]).arg(dev));
    mount(&["-o", "errors=remount-ro"], dev, point);
    let looked = std::fs::metadata(point.join("victim"));
    assert!(looked.is_err(), "a lookup of a cleared inode succeeded: {looked:?}");
}

#[test]
fn ext4_error_with_remount_ro_until_fsck() {
    let _area = support::area(module_path!());
    if !require_root("ext4_error_with_remount_ro_until_fsck") {
        return;
    }
    let mut lab = Lab::new();
    let dev = lab.loop_device("ext4.img", 64, false);
    let point = lab.mount_point("ext4");
    mkfs_ext4(&dev);
    mount(&["-o", "errors=remount-ro"], &dev, &point);
    assert_eq!(fs_signs(&point), clean_ext4());

    let name = dev.file_name().unwrap().to_string_lossy().into_owned();
    let trigger = PathBuf::from(format!("/sys/fs/ext4/{name}/trigger_fs_error"));
    if trigger.exists() {
        std::fs::write(&trigger, "disk_health test").unwrap();
    } else {
        eprintln!("no {}: corrupting with debugfs instead", trigger.display());
        corrupt_and_look_up(&dev, &point);
    }
    let signs = fs_signs(&point);
    assert!(signs.read_only, "{signs:?}");
    assert!(signs.fs_errors.is_some_and(|n| n >= 1), "{signs:?}");
    assert!(!signs.shut_down && signs.io_failure.is_none(), "{signs:?}");
    assert_eq!(judge(&signs), ["read-only", "filesystem-errors"]);

    // Mounted again without a repair: no longer read-only, but the count stays.
    umount(&point);
    mount(&["-o", "errors=remount-ro"], &dev, &point);
    let signs = fs_signs(&point);
    assert!(!signs.read_only && signs.fs_errors.is_some_and(|n| n >= 1), "{signs:?}");
    assert_eq!(judge(&signs), ["filesystem-errors"]);

    umount(&point);
    fsck(&dev);
    mount(&["-o", "errors=remount-ro"], &dev, &point);
    let signs = fs_signs(&point);
    assert_eq!(signs, clean_ext4());
    assert!(judge(&signs).is_empty());
}

#[test]
fn ext4_corruption_found_by_a_lookup() {
    let _area = support::area(module_path!());
    if !require_root("ext4_corruption_found_by_a_lookup") {
        return;
    }
    let mut lab = Lab::new();
    let dev = lab.loop_device("ext4.img", 64, false);
    let point = lab.mount_point("ext4");
    mkfs_ext4(&dev);
    mount(&["-o", "errors=remount-ro"], &dev, &point);
    corrupt_and_look_up(&dev, &point);
    let signs = fs_signs(&point);
    assert!(signs.read_only && signs.fs_errors.is_some_and(|n| n >= 1), "{signs:?}");
    umount(&point);
    fsck(&dev);
    mount(&["-o", "errors=remount-ro"], &dev, &point);
    assert_eq!(fs_signs(&point), clean_ext4());
}

#[test]
fn ext4_shut_down() {
    let _area = support::area(module_path!());
    if !require_root("ext4_shut_down") {
        return;
    }
    let mut lab = Lab::new();
    let dev = lab.loop_device("ext4.img", 64, false);
    let point = lab.mount_point("ext4");
    mkfs_ext4(&dev);
    mount(&[], &dev, &point);
    assert_eq!(fs_signs(&point), clean_ext4());
    run(Command::new("xfs_io").args(["-x", "-c", "shutdown"]).arg(&point));
    let signs = fs_signs(&point);
    assert!(signs.shut_down, "{signs:?}");
    assert!(judge(&signs).contains(&"shut-down"), "{signs:?}");
    umount(&point);
    fsck(&dev);
    mount(&[], &dev, &point);
    assert_eq!(fs_signs(&point), clean_ext4());
}

#[test]
fn xfs_shut_down() {
    let _area = support::area(module_path!());
    if !require_root("xfs_shut_down") {
        return;
    }
    let mut lab = Lab::new();
    // mkfs.xfs refuses filesystems under 300 MiB; the image is sparse.
    let dev = lab.loop_device("xfs.img", 320, false);
    let point = lab.mount_point("xfs");
    run(Command::new("mkfs.xfs").args(["-q", "-f"]).arg(&dev));
    mount(&[], &dev, &point);
    assert_eq!(fs_signs(&point), Signs::default());
    run(Command::new("xfs_io").args(["-x", "-c", "shutdown"]).arg(&point));
    let signs = fs_signs(&point);
    assert_eq!(signs, Signs { shut_down: true, ..Signs::default() });
    assert_eq!(judge(&signs), ["shut-down"]);
    // Mounting again replays the log: healthy.
    umount(&point);
    mount(&[], &dev, &point);
    assert_eq!(fs_signs(&point), Signs::default());
}

#[test]
fn remount_read_only_and_back() {
    let _area = support::area(module_path!());
    if !require_root("remount_read_only_and_back") {
        return;
    }
    let lab = Lab::new();
    let point = lab.mount_point("tmpfs");
    run(Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"]).arg(&point));
    assert_eq!(fs_signs(&point), Signs::default());
    // A read-only bind mount of it: this mount is read-only, the filesystem is not.
    let bind = lab.mount_point("bind");
    run(Command::new("mount").arg("--bind").arg(&point).arg(&bind));
    run(Command::new("mount").args(["-o", "remount,bind,ro"]).arg(&bind));
    assert_eq!(fs_signs(&bind), Signs::default());
    run(Command::new("mount").args(["-o", "remount,ro"]).arg(&point));
    let signs = fs_signs(&point);
    assert_eq!(signs, Signs { read_only: true, ..Signs::default() });
    assert_eq!(judge(&signs), ["read-only"]);
    run(Command::new("mount").args(["-o", "remount,rw"]).arg(&point));
    assert_eq!(fs_signs(&point), Signs::default());
}

#[test]
fn ext4_remount_read_only_and_back() {
    let _area = support::area(module_path!());
    if !require_root("ext4_remount_read_only_and_back") {
        return;
    }
    let mut lab = Lab::new();
    let dev = lab.loop_device("ext4.img", 64, false);
    let point = lab.mount_point("ext4");
    mkfs_ext4(&dev);
    mount(&[], &dev, &point);
    run(Command::new("mount").args(["-o", "remount,ro"]).arg(&point));
    assert_eq!(fs_signs(&point), Signs { read_only: true, fs_errors: Some(0), ..Signs::default() });
    run(Command::new("mount").args(["-o", "remount,rw"]).arg(&point));
    assert_eq!(fs_signs(&point), clean_ext4());
}

#[test]
fn block_device_set_read_only() {
    let _area = support::area(module_path!());
    if !require_root("block_device_set_read_only") {
        return;
    }
    let mut lab = Lab::new();
    let dev = lab.loop_device("block.img", 16, false);
    assert_eq!(block_signs(&dev), Signs::default());
    run(Command::new("blockdev").arg("--setro").arg(&dev));
    let signs = block_signs(&dev);
    assert_eq!(signs, Signs { read_only: true, ..Signs::default() });
    assert_eq!(judge(&signs), ["read-only"]);
    run(Command::new("blockdev").arg("--setrw").arg(&dev));
    assert_eq!(block_signs(&dev), Signs::default());
}

#[test]
fn partition_of_a_read_only_disk() {
    let _area = support::area(module_path!());
    if !require_root("partition_of_a_read_only_disk") {
        return;
    }
    let mut lab = Lab::new();
    let disk = lab.loop_device("parted.img", 32, true);
    let mut sfdisk = Command::new("sfdisk");
    sfdisk.args(["-q", "--label", "gpt"]).arg(&disk).stdin(std::process::Stdio::piped());
    let mut child = sfdisk.spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b",16M\n").unwrap();
    assert!(child.wait().unwrap().success(), "sfdisk {}", disk.display());
    quiet(Command::new("partx").arg("-u").arg(&disk));
    let part = PathBuf::from(format!("{}p1", disk.display()));
    let name = part.file_name().unwrap().to_string_lossy().into_owned();
    let Some(()) = wait_for(Path::new(&format!("/sys/class/block/{name}/dev"))) else {
        cannot_run("partition_of_a_read_only_disk", "the kernel made no partition device for the loop device");
        return;
    };
    assert_eq!(block_signs(&part), Signs::default());
    // The whole disk set read-only: its partition is read-only too.
    run(Command::new("blockdev").arg("--setro").arg(&disk));
    assert_eq!(block_signs(&part), Signs { read_only: true, ..Signs::default() });
    run(Command::new("blockdev").arg("--setrw").arg(&disk));
    assert_eq!(block_signs(&part), Signs::default());
}

/// Waits up to 5 s for `path` to appear.
fn wait_for(path: &Path) -> Option<()> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        if path.exists() {
            return Some(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// The statfs size of the filesystem at `point`, as discovery reads it (blocks times size).
fn statfs_bytes(point: &Path) -> u64 {
    let st = nix::sys::statfs::statfs(point).unwrap();
    st.blocks() * u64::try_from(st.block_size()).unwrap()
}

/// `blockdev --getsize64`.
fn device_bytes(device: &Path) -> u64 {
    let out = run(Command::new("blockdev").arg("--getsize64").arg(device));
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// Resizes a loop device's image to `mib` MiB and tells the loop device (`losetup -c`).
fn resize_loop(lab: &Lab, image: &str, device: &Path, mib: u64) {
    run(Command::new("truncate").arg("-s").arg(format!("{mib}M")).arg(lab.root.join("images").join(image)));
    run(Command::new("losetup").arg("-c").arg(device));
    assert_eq!(device_bytes(device), mib << 20, "{} resized", device.display());
}

/// The kernel names read_signs gives for the volume's device stack.
fn devices_of(volume: &Path, mount: Option<&MountEntry>, device: &str) -> Vec<String> {
    foreground(|on| read_signs(volume, mount, device, None, on)).devices
}

/// A loop device shrunk under its ext4 filesystem (the 64 MiB filesystem on 32 MiB):
/// the filesystem is larger than its device (the sign shrunk, with or without a PV); writes
/// past the device's end then fail with EIO, ext4 counts no error and stays read-write, and
/// only the kernel log says so (the sign kernel-log, read from /dev/kmsg).
#[test]
fn ext4_on_a_device_shrunk_under_it() {
    let _area = support::area(module_path!());
    if !require_root("ext4_on_a_device_shrunk_under_it") {
        return;
    }
    let mut lab = Lab::new();
    let dev = lab.loop_device("shrunk.img", 64, false);
    let point = lab.mount_point("shrunk");
    mkfs_ext4(&dev);
    mount(&["-o", "errors=remount-ro"], &dev, &point);
    let mount_entry = mount_at(&point);
    let bytes = statfs_bytes(&point);
    let name = dev.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(devices_of(&point, Some(&mount_entry), &mount_entry.device), std::slice::from_ref(&name));
    let signs = foreground(|on| read_signs(&point, Some(&mount_entry), &mount_entry.device, Some(bytes), on));
    assert_eq!(signs.size, Some(SizeFacts { bytes, device_bytes: Some(64 << 20), fixed: true }));
    let capacity = Some(bytes.min(64 << 20));
    let mut memory = HealthMemory::default();
    assert!(memory.judge_volume("v", &signs, capacity, Instant::now()).is_empty(), "{signs:?}");

    let mut log = match KernelLog::open(Path::new(KMSG)) {
        Ok(log) => Some(log),
        Err(e) => {
            cannot_run("ext4_on_a_device_shrunk_under_it (kernel log part)", &format!("{e}"));
            None
        }
    };
    let failed_devices = std::sync::Mutex::new(KernelLogMemory::default());
    let seen = Instant::now();
    if let Some(log) = log.as_mut() {
        log.drain(&failed_devices);
    }

    resize_loop(&lab, "shrunk.img", &dev, 32);
    let signs =
        foreground(|on| read_signs(&point, Some(&mount_entry), &mount_entry.device, Some(statfs_bytes(&point)), on));
    assert_eq!(signs.size.and_then(|s| s.device_bytes), Some(32 << 20), "{signs:?}");
    let judged = memory.judge_volume("v", &signs, capacity, Instant::now());
    assert_eq!(judged, [Failing::Shrunk { was: bytes, now: 32 << 20, device: true }]);
    assert_eq!(HealthMemory::default().judge("new", &signs, Instant::now()).len(), 1, "a new volume too");

    // Writes past the device's end: EIO at fsync, no ext4 error, still read-write.
    let written = (|| -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(point.join("big"))?;
        for _ in 0..50 {
            f.write_all(&[7u8; 1 << 20])?;
        }
        f.sync_all()
    })();
    let err = written.expect_err("writes past the device's end succeeded");
    assert_eq!(err.raw_os_error(), Some(5), "{err}");
    let after = fs_signs(&point);
    assert_eq!((after.read_only, after.fs_errors), (false, Some(0)), "{after:?}");
    let Some(log) = log.as_mut() else { return };
    let names = devices_of(&point, Some(&mount_entry), &mount_entry.device);
    let said = wait_for_value(|| {
        log.drain(&failed_devices);
        failed_devices.lock().unwrap().failing(&names, seen, Instant::now())
    });
    eprintln!("the kernel log says: {said:?}");
    match said {
        Some(Failing::KernelLog(line)) => assert!(line.contains(&name) && line.contains("I/O error"), "{line}"),
        other => panic!("no kernel log line about {name}: {other:?}"),
    }
}

/// Polls `f` for up to 5 s until it gives a value.
fn wait_for_value<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > Duration::from_secs(5) {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A Block volume whose device shrank to half, then grew to twice its PV's capacity: shrunk,
/// then told as grown (once per size), never failing for growth.
#[test]
fn block_device_shrunk_then_grown() {
    let _area = support::area(module_path!());
    if !require_root("block_device_shrunk_then_grown") {
        return;
    }
    let mut lab = Lab::new();
    let dev = lab.loop_device("block.img", 64, false);
    let number = dev_number(&dev);
    let capacity = Some(64u64 << 20);
    let signs_now = || foreground(|on| read_signs(&dev, None, &number, Some(device_bytes(&dev)), on));
    let mut memory = HealthMemory::default();
    assert!(memory.judge_volume("b", &signs_now(), capacity, Instant::now()).is_empty());
    assert_eq!(memory.growth("b", capacity, signs_now().size.as_ref()), None);

    resize_loop(&lab, "block.img", &dev, 32);
    let signs = signs_now();
    assert_eq!(signs.size, Some(SizeFacts { bytes: 32 << 20, device_bytes: None, fixed: true }));
    assert_eq!(
        memory.judge_volume("b", &signs, capacity, Instant::now()),
        [Failing::Shrunk { was: 64 << 20, now: 32 << 20, device: false }]
    );

    resize_loop(&lab, "block.img", &dev, 128);
    let signs = signs_now();
    assert!(memory.judge_volume("b", &signs, capacity, Instant::now()).is_empty(), "growth is no failure");
    assert_eq!(memory.growth("b", capacity, signs.size.as_ref()), Some((64 << 20, 128 << 20)));
    assert_eq!(memory.growth("b", capacity, signs.size.as_ref()), None, "told once");
}

/// The used mark's write on a filesystem the kernel made read-only after an error fails as
/// the disk failing (not published), while an operator's read-only mount keeps the mark in the
/// ledger only, as before.
#[test]
fn mark_write_on_a_filesystem_read_only_after_an_error() {
    let _area = support::area(module_path!());
    use local_static_provisioner::core::identity::used_mark::UsedMark;
    use local_static_provisioner::host::identity::used_mark::{Carrier, MarkError, open_volume_root, write_dir_mark};
    use std::os::fd::AsFd;
    if !require_root("mark_write_on_a_filesystem_read_only_after_an_error") {
        return;
    }
    let mark = UsedMark {
        pv: "local-pv-test".into(),
        node: "n".into(),
        path: "/mnt/x".into(),
        identity: "v2;fs".into(),
        at: "now".into(),
        uid: None,
        root: None,
        claimed: false,
        wiped_filesystems: Vec::new(),
    };
    let mut lab = Lab::new();
    // An operator's read-only mount.
    let tmp = lab.mount_point("tmpfs");
    run(Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m,ro", "tmpfs"]).arg(&tmp));
    let root = open_volume_root(&tmp).unwrap();
    let carrier = write_dir_mark(root.as_fd(), &tmp, Some("tmpfs"), &mark).unwrap();
    assert!(matches!(&carrier, Carrier::LedgerOnly { why, .. } if why.contains("read-only")), "{carrier:?}");

    // ext4 the kernel made read-only after an error.
    let dev = lab.loop_device("ro-after-error.img", 64, false);
    let point = lab.mount_point("ext4");
    mkfs_ext4(&dev);
    mount(&["-o", "errors=remount-ro"], &dev, &point);
    let name = dev.file_name().unwrap().to_string_lossy().into_owned();
    let trigger = PathBuf::from(format!("/sys/fs/ext4/{name}/trigger_fs_error"));
    if trigger.exists() {
        std::fs::write(&trigger, "disk_health test").unwrap();
    } else {
        corrupt_and_look_up(&dev, &point);
    }
    let root = open_volume_root(&point).unwrap();
    let refused = wait_for_value(|| match write_dir_mark(root.as_fd(), &point, Some("ext4"), &mark) {
        Err(e @ MarkError::DiskFailing { .. }) => Some(e),
        _ => None,
    });
    let refused = refused.expect("the mark's write on ext4 read-only after an error is the disk failing");
    assert!(refused.is_disk_failure(), "{refused}");
    eprintln!("{refused}");
}

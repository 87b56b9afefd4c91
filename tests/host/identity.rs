//! The disk identity on real devices: loop devices with ext4, XFS and partitions, tmpfs, and
//! zram (a device with no stable ID). A disk a user can confuse with the recorded one (a clone
//! with the same filesystem UUID, XFS remade on the same device number, a remounted tmpfs) is
//! never taken for it; the same disk remounted, renumbered or reattached is; identities recorded
//! by earlier versions keep working. Needs root.

use crate::support;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use local_static_provisioner::core::cluster::succession::DiskCheck;
use local_static_provisioner::core::identity::disk_identity::{DiskIdentity, Found, Proof, Verdict, judge};
use local_static_provisioner::host::identity::fingerprint::{
    check_disk, found_identity, volume_identity, volume_present,
};
use local_static_provisioner::host::mounts::mountinfo::MountTable;
use local_static_provisioner::host::ops::foreground;
use support::{Mount, Zram, mount_tmpfs, require_root, run};

/// A loop device attached by this test (optionally at a given number, or scanning partitions),
/// detached when dropped.
struct Loop {
    device: PathBuf,
}

impl Loop {
    fn attach(file: &Path, partscan: bool) -> Loop {
        let mut cmd = Command::new("losetup");
        cmd.args(["--find", "--show"]);
        if partscan {
            cmd.arg("--partscan");
        }
        let out = run(cmd.arg(file));
        Loop { device: PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()) }
    }

    /// Attaches `file` at `device`, which a test just detached: the kernel releases a loop
    /// device after `losetup -d` returns, so it can answer "busy" for a moment (a fresh-clone CI
    /// run met it while other work ran on the machine); asked again as losetup's users do.
    fn attach_at(device: &Path, file: &Path) -> Loop {
        for _ in 0..100 {
            let out = Command::new("losetup").arg(device).arg(file).output().unwrap();
            if out.status.success() {
                return Loop { device: device.to_path_buf() };
            }
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains("busy"), "losetup {} {}: {stderr}", device.display(), file.display());
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("{} stayed busy for 10 s", device.display());
    }

    fn partition(&self, n: u32) -> PathBuf {
        PathBuf::from(format!("{}p{n}", self.device.display()))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.device).stderr(Stdio::null()).status();
    }
}

fn sparse(path: &Path, mib: u64) {
    run(Command::new("truncate").arg("-s").arg(format!("{mib}M")).arg(path));
}

fn mount(device: &Path, at: &Path) -> Mount {
    std::fs::create_dir_all(at).unwrap();
    run(Command::new("mount").arg(device).arg(at));
    Mount { path: at.to_path_buf() }
}

fn mkfs_ext4(device: &Path, uuid: Option<&str>) {
    let mut cmd = Command::new("mkfs.ext4");
    cmd.args(["-q", "-F"]);
    if let Some(u) = uuid {
        cmd.args(["-U", u]);
    }
    run(cmd.arg(device));
}

fn mkfs_xfs(device: &Path) {
    run(Command::new("mkfs.xfs").args(["-q", "-f"]).arg(device));
}

fn have(tool: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {tool}")).stdout(Stdio::null()).status().unwrap().success()
}

fn found(path: &Path) -> Found {
    found_identity(path, None).unwrap_or_else(|e| panic!("identity of {}: {e}", path.display()))
}

fn parsed(identity: &str) -> DiskIdentity {
    DiskIdentity::parse(identity).unwrap_or_else(|| panic!("not a current identity: {identity}"))
}

fn mounts() -> MountTable {
    MountTable::read().unwrap()
}

/// The identity versions before `v2` recorded for a filesystem: statfs fsid words in decimal
/// and the root inode (computed here independently of the agent's code).
fn old_format_fs_identity(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let st = nix::sys::statfs::statfs(path).unwrap();
    let debug = format!("{:?}", st.filesystem_id());
    let words: String = debug.chars().filter(|c| c.is_ascii_digit() || *c == ',' || *c == '-').collect();
    format!("fs:fsid={words};ino={}", std::fs::metadata(path).unwrap().ino())
}

fn is_same(v: &Verdict) -> bool {
    matches!(v, Verdict::Same(_))
}

#[test]
fn an_ext4_clone_with_the_same_uuid_is_another_disk() {
    let _area = support::area(module_path!());
    if !require_root("an_ext4_clone_with_the_same_uuid_is_another_disk") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let vol = tmp.path().join("disks/vol");
    let (a, b) = (tmp.path().join("a.img"), tmp.path().join("b.img"));
    sparse(&a, 64);
    let disk_a = Loop::attach(&a, false);
    mkfs_ext4(&disk_a.device, None);
    let m = mount(&disk_a.device, &vol);
    let recorded = volume_identity(&vol).unwrap();
    let id = parsed(&recorded);
    // A loop device is its backing file's filesystem and inode, never its path.
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&a).unwrap());
    assert!(
        id.disk.as_deref().is_some_and(|d| d.starts_with("loop:") && d.ends_with(&format!(":{ino}@0"))),
        "{recorded}"
    );
    assert!(id.uuid.is_some(), "{recorded}");
    assert_eq!(id.ino, Some(2));
    std::fs::write(vol.join("data"), b"tenant data").unwrap();
    drop(m);

    // A byte-for-byte copy: the same filesystem UUID, the same root inode.
    run(Command::new("cp").arg("--sparse=always").arg(&a).arg(&b));
    let disk_b = Loop::attach(&b, false);
    let _m = mount(&disk_b.device, &vol);
    let now = found(&vol);
    assert_eq!(parsed(&now.identity).uuid, id.uuid, "the clone has the same UUID");
    let verdict = judge(&recorded, &now, None);
    assert!(matches!(&verdict, Verdict::Different(r) if r.contains("device")), "{verdict:?}");
    assert!(!volume_present(&vol, Some(&recorded), &mounts()));
    assert_eq!(foreground(|on| check_disk(&vol, Some(&recorded), &mounts(), on)), DiskCheck::Different);
    // Even an operator's confirmation does not make a proven other disk wipeable.
    assert!(!is_same(&judge(&recorded, &now, Some(&now.identity))));
    drop(_m);

    // The clone attached at the very device number the original had.
    let number = disk_a.device.clone();
    drop(disk_a);
    let swapped = Loop::attach_at(&number, &b);
    let _m = mount(&swapped.device, &vol);
    let now = found(&vol);
    assert_eq!(parsed(&now.identity).dev, id.dev, "same device number");
    assert!(matches!(judge(&recorded, &now, None), Verdict::Different(_)));
}

#[test]
fn xfs_remade_on_the_same_device_is_another_disk() {
    let _area = support::area(module_path!());
    if !require_root("xfs_remade_on_the_same_device_is_another_disk") {
        return;
    }
    assert!(have("mkfs.xfs"), "mkfs.xfs is missing: bash scripts/install-deps.sh installs xfsprogs");
    let tmp = tempfile::tempdir().unwrap();
    let vol = tmp.path().join("disks/vol");
    let img = tmp.path().join("xfs.img");
    sparse(&img, 320);
    let disk = Loop::attach(&img, false);
    mkfs_xfs(&disk.device);
    let m = mount(&disk.device, &vol);
    let recorded = volume_identity(&vol).unwrap();
    let old_recorded = old_format_fs_identity(&vol);
    assert!(parsed(&recorded).uuid.is_some(), "{recorded}");
    assert_eq!(found(&vol).fs_type.as_deref(), Some("xfs"));
    drop(m);

    mkfs_xfs(&disk.device);
    let _m = mount(&disk.device, &vol);
    let now = found(&vol);
    // What issue 12 saw: the old identity (fsid from the device number) cannot tell them apart.
    assert_eq!(old_format_fs_identity(&vol), old_recorded, "XFS fsid comes from the device number");
    assert_eq!(now.legacy, old_recorded, "the legacy computation is the old one");
    let verdict = judge(&recorded, &now, None);
    assert!(matches!(&verdict, Verdict::Different(r) if r.contains("UUID")), "{verdict:?}");
    assert_eq!(foreground(|on| check_disk(&vol, Some(&recorded), &mounts(), on)), DiskCheck::Different);
    assert!(!volume_present(&vol, Some(&recorded), &mounts()));
    // A PV recorded by the old version cannot prove anything on XFS: unproven, confirmable.
    let legacy = judge(&old_recorded, &now, None);
    assert!(matches!(legacy, Verdict::Unproven { plausible: true, .. }), "{legacy:?}");
    assert_eq!(foreground(|on| check_disk(&vol, Some(&old_recorded), &mounts(), on)), DiskCheck::Plausible);
    assert_eq!(judge(&old_recorded, &now, Some(&now.identity)), Verdict::Same(Proof::Confirmed));
}

#[test]
fn the_same_disk_remounted_or_reattached_is_the_same() {
    let _area = support::area(module_path!());
    if !require_root("the_same_disk_remounted_or_reattached_is_the_same") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let vol = tmp.path().join("disks/vol");
    let blk_dir = tmp.path().join("blk");
    std::fs::create_dir_all(&blk_dir).unwrap();
    let img = tmp.path().join("disk.img");
    sparse(&img, 64);
    let disk = Loop::attach(&img, false);
    mkfs_ext4(&disk.device, None);
    let m = mount(&disk.device, &vol);
    let recorded = volume_identity(&vol).unwrap();
    assert_eq!(
        local_static_provisioner::host::identity::fingerprint::volume_identity_in(&vol, &mounts()).unwrap(),
        recorded,
        "with or without a mount table read"
    );
    drop(m);
    let _m = mount(&disk.device, &vol);
    assert_eq!(judge(&recorded, &found(&vol), None), Verdict::Same(Proof::Identity), "remounted");
    assert!(volume_present(&vol, Some(&recorded), &mounts()));
    assert_eq!(foreground(|on| check_disk(&vol, Some(&recorded), &mounts(), on)), DiskCheck::Same);
    drop(_m);

    // A block volume: a symlink to the device, as upstream's by-id links.
    symlink(&disk.device, blk_dir.join("disk")).unwrap();
    let blk_recorded = volume_identity(&blk_dir.join("disk")).unwrap();
    assert!(blk_recorded.starts_with("v2;blk;disk=loop:"), "{blk_recorded}");
    assert!(blk_recorded.contains(";size=67108864;"), "{blk_recorded}");

    // Detached and attached again to the same file, at another number (the old one is taken).
    let number = disk.device.clone();
    drop(disk);
    let filler_img = tmp.path().join("filler.img");
    sparse(&filler_img, 1);
    let _filler = Loop::attach_at(&number, &filler_img);
    let again = Loop::attach(&img, false);
    assert_ne!(again.device, number);
    let _m = mount(&again.device, &vol);
    let now = found(&vol);
    assert_ne!(parsed(&now.identity).dev, parsed(&recorded).dev, "renumbered");
    assert_eq!(judge(&recorded, &now, None), Verdict::Same(Proof::Identity), "{recorded} vs {}", now.identity);
    std::fs::remove_file(blk_dir.join("disk")).unwrap();
    symlink(&again.device, blk_dir.join("disk")).unwrap();
    let blk_now = found(&blk_dir.join("disk"));
    assert_eq!(judge(&blk_recorded, &blk_now, None), Verdict::Same(Proof::Identity));
    // The filler at the old number is another file: another disk.
    std::fs::remove_file(blk_dir.join("disk")).unwrap();
    symlink(&number, blk_dir.join("disk")).unwrap();
    assert!(matches!(judge(&blk_recorded, &found(&blk_dir.join("disk")), None), Verdict::Different(_)));
    // A symlink to a directory has no identity: it is never followed.
    std::fs::remove_file(blk_dir.join("disk")).unwrap();
    symlink(&vol, blk_dir.join("disk")).unwrap();
    assert!(volume_identity(&blk_dir.join("disk")).is_err());
    assert!(!volume_present(&blk_dir.join("disk"), None, &mounts()));
}

#[test]
fn partitions_are_named_by_their_disk_and_place() {
    let _area = support::area(module_path!());
    if !require_root("partitions_are_named_by_their_disk_and_place") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let vol = tmp.path().join("disks/vol");
    let img = tmp.path().join("gpt.img");
    sparse(&img, 128);
    let disk = Loop::attach(&img, true);
    let table = "label: gpt\nstart=2048, size=100000\nstart=104448, size=100000\n";
    let mut sfdisk = Command::new("sfdisk")
        .args(["--quiet", "--wipe", "always"])
        .arg(&disk.device)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut sfdisk.stdin.take().unwrap(), table.as_bytes()).unwrap();
    assert!(sfdisk.wait().unwrap().success());
    // Kernels built without partition-table parsers learn partitions from partx (BLKPG).
    run(Command::new("partx").arg("--update").arg(&disk.device));
    let (p1, p2) = (disk.partition(1), disk.partition(2));
    support::wait_until("partition nodes", std::time::Duration::from_secs(10), || {
        (p1.exists() && p2.exists()).then_some(())
    });
    mkfs_ext4(&p1, None);
    let m = mount(&p1, &vol);
    let recorded = volume_identity(&vol).unwrap();
    let disk_id = parsed(&recorded).disk.unwrap();
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&img).unwrap());
    assert!(disk_id.starts_with("loop:") && disk_id.contains(&format!(":{ino}@0/")), "{recorded}");
    assert!(disk_id.ends_with("/part1@2048"), "{recorded}");
    drop(m);

    // The same filesystem copied into the second partition: same UUID, another place.
    run(Command::new("dd")
        .arg(format!("if={}", p1.display()))
        .arg(format!("of={}", p2.display()))
        .args(["bs=1M", "status=none"]));
    let m = mount(&p2, &vol);
    let now = found(&vol);
    assert_eq!(parsed(&now.identity).uuid, parsed(&recorded).uuid);
    assert!(parsed(&now.identity).disk.unwrap().ends_with("/part2@104448"));
    assert!(matches!(judge(&recorded, &now, None), Verdict::Different(_)));
    drop(m);
    let _m = mount(&p1, &vol);
    assert_eq!(judge(&recorded, &found(&vol), None), Verdict::Same(Proof::Identity));
}

#[test]
fn a_remounted_tmpfs_is_another_mount() {
    let _area = support::area(module_path!());
    if !require_root("a_remounted_tmpfs_is_another_mount") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let vol = tmp.path().join("disks/vol");
    let m = mount_tmpfs(&vol, 16);
    let recorded = volume_identity(&vol).unwrap();
    assert_eq!(parsed(&recorded).volatile.as_deref(), Some("tmpfs"), "{recorded}");
    assert_eq!(foreground(|on| check_disk(&vol, Some(&recorded), &mounts(), on)), DiskCheck::Same);
    let old_recorded = old_format_fs_identity(&vol);
    assert_eq!(judge(&old_recorded, &found(&vol), None), Verdict::Same(Proof::Legacy));
    drop(m);
    let _m = mount_tmpfs(&vol, 16);
    let now = found(&vol);
    assert!(matches!(judge(&recorded, &now, None), Verdict::Different(_)), "{recorded} vs {}", now.identity);
    assert!(matches!(judge(&old_recorded, &now, None), Verdict::Different(_)));
    assert_eq!(foreground(|on| check_disk(&vol, Some(&recorded), &mounts(), on)), DiskCheck::Different);
    assert!(!volume_present(&vol, Some(&recorded), &mounts()));
}

#[test]
fn old_format_identities_keep_working() {
    let _area = support::area(module_path!());
    if !require_root("old_format_identities_keep_working") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let vol = tmp.path().join("disks/vol");
    let img = tmp.path().join("ext4.img");
    sparse(&img, 64);
    let disk = Loop::attach(&img, false);
    mkfs_ext4(&disk.device, None);
    let m = mount(&disk.device, &vol);
    let old_recorded = old_format_fs_identity(&vol);
    assert_eq!(judge(&old_recorded, &found(&vol), None), Verdict::Same(Proof::Legacy));
    assert_eq!(foreground(|on| check_disk(&vol, Some(&old_recorded), &mounts(), on)), DiskCheck::Same);
    assert!(volume_present(&vol, Some(&old_recorded), &mounts()));
    drop(m);
    // Reformatted: ext4's fsid comes from its UUID, so the old identity proves the difference.
    mkfs_ext4(&disk.device, None);
    let m = mount(&disk.device, &vol);
    assert!(matches!(judge(&old_recorded, &found(&vol), None), Verdict::Different(_)));
    assert_eq!(foreground(|on| check_disk(&vol, Some(&old_recorded), &mounts(), on)), DiskCheck::Different);
    drop(m);

    // An old block identity (loop backing file) and one by device number only.
    let links = tmp.path().join("blk");
    std::fs::create_dir_all(&links).unwrap();
    symlink(&disk.device, links.join("d")).unwrap();
    let old_blk = format!("blk:loop={}@0;size={}", img.display(), 64 << 20);
    assert_eq!(judge(&old_blk, &found(&links.join("d")), None), Verdict::Same(Proof::Legacy));
    let old_by_number = format!("blk:dev={};size={}", parsed(&found(&links.join("d")).identity).dev.unwrap(), 64 << 20);
    let verdict = judge(&old_by_number, &found(&links.join("d")), None);
    assert!(matches!(verdict, Verdict::Unproven { .. }), "{verdict:?}");
    // (The old code names a loop device by its file, so a record by number never equals it.)
    assert_eq!(
        foreground(|on| check_disk(&links.join("d"), Some(&old_by_number), &mounts(), on)),
        DiskCheck::Unverified
    );
}

#[test]
fn a_device_without_a_stable_id_needs_a_confirmation() {
    let _area = support::area(module_path!());
    if !require_root("a_device_without_a_stable_id_needs_a_confirmation") {
        return;
    }
    let (Some(a), Some(b)) = (Zram::new(64), Zram::new(64)) else {
        support::cannot_run("a_device_without_a_stable_id_needs_a_confirmation", "no zram in this kernel");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let vol = tmp.path().join("disks/vol");
    let uuid = "5b0c2e8e-6c1f-4d7e-9a4b-2f1e0d9c8b7a";
    mkfs_ext4(&a.device, Some(uuid));
    mkfs_ext4(&b.device, Some(uuid));
    let m = mount(&a.device, &vol);
    let recorded = volume_identity(&vol).unwrap();
    let id = parsed(&recorded);
    assert_eq!((id.disk.as_deref(), id.uuid.as_deref()), (None, Some(uuid)), "{recorded}");
    // Even the very same disk cannot be proven: a clone would look the same.
    let same = judge(&recorded, &found(&vol), None);
    assert!(matches!(&same, Verdict::Unproven { plausible: true, reason } if reason.contains("stable ID")), "{same:?}");
    drop(m);

    let _m = mount(&b.device, &vol);
    let now = found(&vol);
    let verdict = judge(&recorded, &now, None);
    assert!(matches!(verdict, Verdict::Unproven { plausible: true, .. }), "{verdict:?}");
    assert!(volume_present(&vol, Some(&recorded), &mounts()), "a volume that may be the PV's is there");
    assert_eq!(foreground(|on| check_disk(&vol, Some(&recorded), &mounts(), on)), DiskCheck::Plausible);
    assert_eq!(judge(&recorded, &now, Some(&now.identity)), Verdict::Same(Proof::Confirmed));
    assert!(!is_same(&judge(&recorded, &now, Some(&recorded))), "only the identity found now confirms");
}

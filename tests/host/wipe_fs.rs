//! `wipe_filesystem` through the public API on a real ext4 volume (loop device), and the
//! wipe-versus-`rm -rf` benchmark that bench/wipe-fs.sh runs. Needs root; skipped otherwise.

use crate::support;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use local_static_provisioner::core::wipe::volume_root::ConfiguredRoot;
use local_static_provisioner::host::mounts::mountinfo::MountTable;
use local_static_provisioner::host::wipe::wipe_fs::*;
use support::require_root;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A mount made by a test, lazily unmounted on drop.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A loop device, detached on drop.
struct Loop(String);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

fn tmpfs(path: &Path, size: &str) -> Mount {
    fs::create_dir_all(path).unwrap();
    run(Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(path));
    Mount(path.to_path_buf())
}

fn is_empty(dir: &Path) -> bool {
    fs::read_dir(dir).unwrap().next().is_none()
}

#[test]
fn wipes_an_ext4_volume_and_reports_freed_space() {
    let _area = support::area(module_path!());
    if !require_root("wipes_an_ext4_volume_and_reports_freed_space") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(tmp.path()).unwrap();
    let image = base.join("disk.img");
    run(Command::new("truncate").arg("-s").arg("64M").arg(&image));
    let lo = Loop(run(Command::new("losetup").args(["--find", "--show"]).arg(&image)));
    run(Command::new("mkfs.ext4").args(["-q", &lo.0]));
    let vol = base.join("vol");
    fs::create_dir_all(&vol).unwrap();
    run(Command::new("mount").arg(&lo.0).arg(&vol));
    let _m = Mount(vol.clone());

    let outside = base.join("outside.txt");
    fs::write(&outside, "keep").unwrap();
    for d in 0..10 {
        let dir = vol.join(format!("data/d{d}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..100 {
            fs::write(dir.join(format!("f{f}")), vec![1u8; 8192]).unwrap();
        }
    }
    symlink(&outside, vol.join("link")).unwrap();
    fs::set_permissions(&vol, fs::Permissions::from_mode(0o2770)).unwrap();
    std::os::unix::fs::chown(&vol, Some(4321), Some(8765)).unwrap();
    nix::unistd::sync();

    let stats = wipe_filesystem(&vol, &MountTable::read().unwrap(), &AtomicBool::new(false)).unwrap();
    // lost+found goes too, as with upstream's `rm -rf`.
    assert_eq!((stats.files, stats.dirs), (1001, 12), "{stats:?}");
    assert!(stats.bytes_freed >= 1000 * 8192, "{stats:?}");
    assert!(is_empty(&vol));
    // The root is a new ext4 root again (mkfs.ext4 makes it 0755 root:root).
    let meta = fs::metadata(&vol).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o755);
    assert_eq!((meta.uid(), meta.gid()), (0, 0));
    assert_eq!(fs::read_to_string(&outside).unwrap(), "keep");
}

/// A POSIX ACL in the kernel's xattr format (version 2, entries sorted by tag): the owner,
/// user 1000 and the mask rwx, group and others r-x.
fn acl_granting_uid_1000() -> Vec<u8> {
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in
        [(0x01u16, 7u16, u32::MAX), (0x02, 7, 1000), (0x04, 5, u32::MAX), (0x10, 7, u32::MAX), (0x20, 5, u32::MAX)]
    {
        acl.extend(tag.to_le_bytes());
        acl.extend(perm.to_le_bytes());
        acl.extend(id.to_le_bytes());
    }
    acl
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    rustix::fs::setxattr(path, name, value, rustix::fs::XattrFlags::empty())
        .unwrap_or_else(|e| panic!("setting {name} on {}: {e}", path.display()));
}

fn xattrs(path: &Path) -> Vec<String> {
    let mut buf = vec![0u8; 64 * 1024];
    let n = rustix::fs::listxattr(path, &mut buf[..]).unwrap();
    let mut names: Vec<String> = buf[..n]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    names.sort();
    names
}

/// The root's inode flags, as `lsattr -d` shows them (the flag letters, `-` for each unset).
fn root_flags(path: &Path) -> u32 {
    let fd =
        rustix::fs::open(path, rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY, rustix::fs::Mode::empty())
            .unwrap();
    rustix::fs::ioctl_getflags(&fd).unwrap().bits()
}

/// What a tenant leaves on the root of its volume (with root in its container, as kubelet's
/// fsGroup handling does in part): a user attribute, an access and a default ACL, mode 0777,
/// owner 1000:1000, `chattr +d +A`. Plus what the host put there: the agent's used mark and
/// another `trusted.` attribute.
fn leave_tenant_metadata(vol: &Path) {
    fs::write(vol.join("data"), "tenant").unwrap();
    set_xattr(vol, "user.tenant", b"secret");
    set_xattr(vol, "system.posix_acl_access", &acl_granting_uid_1000());
    set_xattr(vol, "system.posix_acl_default", &acl_granting_uid_1000());
    set_xattr(vol, "trusted.local-static-provisioner.used", b"{\"pv\":\"local-pv-x\"}");
    set_xattr(vol, "trusted.other-tool", b"host");
    std::os::unix::fs::chown(vol, Some(1000), Some(1000)).unwrap();
    fs::set_permissions(vol, fs::Permissions::from_mode(0o777)).unwrap();
    run(Command::new("chattr").args(["+d", "+A"]).arg(vol));
    let flags = root_flags(vol);
    assert_eq!(flags & 0xC0, 0xC0, "chattr +d +A took: {flags:#x}");
    assert!(xattrs(vol).contains(&"user.tenant".to_string()));
    assert!(xattrs(vol).contains(&"system.posix_acl_default".to_string()));
}

/// After the wipe the root is as a new volume's: none of the tenant's attributes, ACLs or
/// flags, the mode and owner a fresh filesystem gives it; the host's `trusted.` attributes
/// (the used mark first) are still there.
fn assert_new_root(vol: &Path, mode: u32, owner: (u32, u32), kept_flags: u32, recorded: bool) {
    assert!(is_empty(vol));
    let mut kept = vec!["trusted.local-static-provisioner.used".to_string(), "trusted.other-tool".to_string()];
    if recorded {
        kept.insert(0, "trusted.local-static-provisioner.root".to_string());
    }
    assert_eq!(xattrs(vol), kept);
    assert_eq!(root_flags(vol), kept_flags, "inode flags left");
    let meta = fs::metadata(vol).unwrap();
    assert_eq!(meta.mode() & 0o7777, mode, "mode");
    assert_eq!((meta.uid(), meta.gid()), owner, "owner");
}

#[test]
fn the_wipe_leaves_a_tmpfs_root_as_a_new_volumes() {
    let _area = support::area(module_path!());
    if !require_root("the_wipe_leaves_a_tmpfs_root_as_a_new_volumes") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(tmp.path()).unwrap();
    let vol = base.join("vol");
    let _m = tmpfs(&vol, "16m");
    leave_tenant_metadata(&vol);
    wipe_filesystem(&vol, &MountTable::read().unwrap(), &AtomicBool::new(false)).unwrap();
    // A tmpfs mounted without mode= makes its root 1777 root:root.
    assert_new_root(&vol, 0o1777, (0, 0), 0, false);

    // One mounted with mode=, uid=, gid=: its root is what those say.
    let opts = base.join("opts");
    fs::create_dir_all(&opts).unwrap();
    run(Command::new("mount").args(["-t", "tmpfs", "-o", "size=16m,mode=750,uid=7,gid=8", "tmpfs"]).arg(&opts));
    let _o = Mount(opts.clone());
    leave_tenant_metadata(&opts);
    wipe_filesystem(&opts, &MountTable::read().unwrap(), &AtomicBool::new(false)).unwrap();
    assert_new_root(&opts, 0o750, (7, 8), 0, false);
}

#[test]
fn the_wipe_leaves_an_ext4_root_as_a_new_volumes() {
    let _area = support::area(module_path!());
    if !require_root("the_wipe_leaves_an_ext4_root_as_a_new_volumes") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(tmp.path()).unwrap();
    let image = base.join("disk.img");
    run(Command::new("truncate").arg("-s").arg("32M").arg(&image));
    let lo = Loop(run(Command::new("losetup").args(["--find", "--show"]).arg(&image)));
    run(Command::new("mkfs.ext4").args(["-q", &lo.0]));
    let vol = base.join("vol");
    fs::create_dir_all(&vol).unwrap();
    run(Command::new("mount").arg(&lo.0).arg(&vol));
    let _m = Mount(vol.clone());
    // What mkfs.ext4 gives the root (extents, at least): the filesystem's, kept.
    let fresh_flags = root_flags(&vol);
    leave_tenant_metadata(&vol);
    wipe_filesystem(&vol, &MountTable::read().unwrap(), &AtomicBool::new(false)).unwrap();
    assert_new_root(&vol, 0o755, (0, 0), fresh_flags, false);

    // Prepared by an operator (0751, a service user's) and recorded so at the first
    // publication: that is what the wipe gives back, not the tenant's 0777 1000:1000.
    fs::set_permissions(&vol, fs::Permissions::from_mode(0o751)).unwrap();
    std::os::unix::fs::chown(&vol, Some(5), Some(6)).unwrap();
    let fd =
        rustix::fs::open(&vol, rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY, rustix::fs::Mode::empty())
            .unwrap();
    record_root(std::os::fd::AsFd::as_fd(&fd)).unwrap();
    leave_tenant_metadata(&vol);
    // A later publication does not record the tenant's: the first record stays.
    record_root(std::os::fd::AsFd::as_fd(&fd)).unwrap();
    wipe_filesystem(&vol, &MountTable::read().unwrap(), &AtomicBool::new(false)).unwrap();
    assert_new_root(&vol, 0o751, (5, 6), fresh_flags, true);

    // A class's rootMode and rootOwner win over the record (volumes an older version or
    // upstream published, whose roots workloads need as the operator made them).
    leave_tenant_metadata(&vol);
    let configured = ConfiguredRoot { mode: Some(0o2770), owner: Some((1000, 2000)) };
    wipe_filesystem_counted(&vol, &MountTable::read().unwrap(), &AtomicBool::new(false), None, configured, &mut |_| {
        Ok(())
    })
    .unwrap();
    assert_new_root(&vol, 0o2770, (1000, 2000), fresh_flags, true);
    // Only the mode configured: the owner is still the record's.
    leave_tenant_metadata(&vol);
    let configured = ConfiguredRoot { mode: Some(0o777), owner: None };
    wipe_filesystem_counted(&vol, &MountTable::read().unwrap(), &AtomicBool::new(false), None, configured, &mut |_| {
        Ok(())
    })
    .unwrap();
    assert_new_root(&vol, 0o777, (5, 6), fresh_flags, true);
}

/// `files` small files in `files / 1000` leaf directories two levels down (d*/e*/f*).
fn generate(root: &Path, files: usize) -> usize {
    let leaves = files.div_ceil(1000);
    let mut made = 0;
    for leaf in 0..leaves {
        let dir = root.join(format!("d{}/e{}", leaf / 20, leaf % 20));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..1000.min(files - made) {
            fs::write(dir.join(format!("file-{f:04}")), b"0123456789abcdef0123456789abcdef").unwrap();
        }
        made += 1000.min(files - made);
    }
    leaves + leaves.div_ceil(20)
}

#[test]
#[ignore = "benchmark: run with bench/wipe-fs.sh"]
fn bench_wipe_vs_rm() {
    let _area = support::area(module_path!());
    if !require_root("bench_wipe_vs_rm") {
        return;
    }
    let files: usize = std::env::var("WIPE_BENCH_FILES").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000);
    let tmp = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(tmp.path()).unwrap();
    // Two tmpfs volumes of the same size: the wiper needs its root to be a mount point.
    let rm_vol = base.join("rm");
    let wipe_vol = base.join("wiper");
    let _a = tmpfs(&rm_vol, "1g");
    let _b = tmpfs(&wipe_vol, "1g");
    let dirs = generate(&rm_vol, files);
    generate(&wipe_vol, files);

    // `rm -rf DIR/*`: the children of the root, keeping the root.
    let children: Vec<PathBuf> = fs::read_dir(&rm_vol).unwrap().map(|e| e.unwrap().path()).collect();
    let start = Instant::now();
    run(Command::new("rm").arg("-rf").arg("--").args(&children));
    let rm_secs = start.elapsed().as_secs_f64();
    assert!(is_empty(&rm_vol));

    let table = MountTable::read().unwrap();
    let start = Instant::now();
    let stats = wipe_filesystem(&wipe_vol, &table, &AtomicBool::new(false)).unwrap();
    let wipe_secs = start.elapsed().as_secs_f64();
    assert!(is_empty(&wipe_vol));
    assert_eq!((stats.files, stats.dirs), (files as u64, dirs as u64));

    let ratio = wipe_secs / rm_secs;
    println!(
        "{{\"figure\":\"wipe_fs\",\"files\":{files},\"dirs\":{dirs},\"rm_seconds\":{rm_secs:.3},\"wiper_seconds\":{wipe_secs:.3},\"wiper_over_rm\":{ratio:.2}}}"
    );
    println!("{:<10} {:>9} {:>7} {:>10} {:>14} {:>14}", "figure", "files", "dirs", "rm_s", "wiper_s", "wiper/rm");
    println!("{:<10} {:>9} {:>7} {:>10.3} {:>14.3} {:>14.2}", "wipe_fs", files, dirs, rm_secs, wipe_secs, ratio);
}

/// The root's mode and owner are recorded by the mark written before a PV is first created
/// (no mark there, no UID, no claim), never by a later one: a PV made earlier (by upstream, by
/// an older version) may have had a tenant, whose chmod would otherwise become the record.
#[test]
fn the_root_is_recorded_at_the_first_publication_only() {
    let _area = support::area(module_path!());
    use local_static_provisioner::core::identity::used_mark::{Replace, UsedMark};
    use local_static_provisioner::host::identity::used_mark::{Accept, Ledger, MarkOutcome, mark_volume};
    if !require_root("the_root_is_recorded_at_the_first_publication_only") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(tmp.path()).unwrap();
    let record = |vol: &Path| {
        let mut buf = [0u8; 128];
        rustix::fs::getxattr(vol, "trusted.local-static-provisioner.root", &mut buf[..])
            .ok()
            .map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    let mark = |pv: &str, uid: Option<&str>, claimed: bool| UsedMark {
        pv: pv.into(),
        node: "n".into(),
        path: String::new(),
        identity: String::new(),
        at: "2026-11-29T00:00:00Z".into(),
        uid: uid.map(str::to_string),
        root: None,
        claimed,
        wiped_filesystems: Vec::new(),
    };
    let ledger = Ledger::open(&base).unwrap();
    let publish = |vol: &Path, m: &UsedMark, replace: Replace| {
        let mounts = MountTable::read().unwrap();
        let out = mark_volume(vol, "", None, Accept::Anything, m, &ledger, &mounts, |there| replace.allows(m, there))
            .unwrap();
        assert!(matches!(out, MarkOutcome::Written(..)), "{out:?}");
    };

    // A new volume, prepared 0751 by the operator: recorded before its PV is created; the
    // tenant's chmod and the marks written later (its UID, its claim) do not change the record.
    let new = base.join("new");
    let _n = tmpfs(&new, "8m");
    fs::set_permissions(&new, fs::Permissions::from_mode(0o751)).unwrap();
    publish(&new, &mark("pv-new", None, false), Replace::BeforeCreate { judged: None });
    assert_eq!(record(&new).as_deref(), Some("mode=0751 uid=0 gid=0"));
    fs::set_permissions(&new, fs::Permissions::from_mode(0o777)).unwrap();
    publish(&new, &mark("pv-new", Some("uid-1"), true), Replace::Keep { used: true });
    assert_eq!(record(&new).as_deref(), Some("mode=0751 uid=0 gid=0"));

    // A PV that already exists and is in use (made by upstream): its root is the tenant's now,
    // so nothing is recorded, and its wipe gives it a fresh tmpfs root.
    let adopted = base.join("adopted");
    let _a = tmpfs(&adopted, "8m");
    fs::set_permissions(&adopted, fs::Permissions::from_mode(0o2777)).unwrap();
    publish(&adopted, &mark("pv-adopted", Some("uid-2"), true), Replace::Keep { used: true });
    assert_eq!(record(&adopted), None);
    wipe_filesystem(&adopted, &MountTable::read().unwrap(), &AtomicBool::new(false)).unwrap();
    assert_eq!(fs::metadata(&adopted).unwrap().mode() & 0o7777, 0o1777);
}

// FS_IOC_SET_ENCRYPTION_POLICY, declared _IOR although it passes the policy in: a v1 policy
// (version 0, AES-256-XTS contents, AES-256-CTS names, no flags, an 8-byte key descriptor).
nix::ioctl_read!(set_encryption_policy, b'f', 19, [u8; 12]);

/// A root that cannot be made a new volume's (an encryption policy a tenant set on the empty
/// root of a volume on an ext4 made with `-O encrypt`; nothing takes it off a directory that
/// stays): the
/// wipe fails, naming the path and the flag, and the policy is still there.
#[test]
fn an_encrypted_root_is_refused_naming_the_path_and_the_flag() {
    let _area = support::area(module_path!());
    const TEST: &str = "an_encrypted_root_is_refused_naming_the_path_and_the_flag";
    if !require_root(TEST) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(tmp.path()).unwrap();
    let image = base.join("disk.img");
    run(Command::new("truncate").arg("-s").arg("32M").arg(&image));
    let lo = Loop(run(Command::new("losetup").args(["--find", "--show"]).arg(&image)));
    run(Command::new("mkfs.ext4").args(["-q", "-O", "encrypt", &lo.0]));
    let disk = base.join("disk");
    fs::create_dir_all(&disk).unwrap();
    run(Command::new("mount").arg(&lo.0).arg(&disk));
    let _d = Mount(disk.clone());
    // ext4 refuses a policy on its own root directory: the volume is a directory of the
    // filesystem, bind-mounted (as a shared filesystem's volumes are).
    fs::create_dir(disk.join("vol")).unwrap();
    let root = fs::File::open(disk.join("vol")).unwrap();
    let mut policy = [0u8, 1, 4, 0, 1, 2, 3, 4, 5, 6, 7, 8];
    // SAFETY: the ioctl reads the 12-byte v1 policy through the pointer, valid for the call, on
    // a descriptor borrowed from `root`, open for the whole call.
    let set = unsafe { set_encryption_policy(std::os::fd::AsRawFd::as_raw_fd(&root), &mut policy) };
    if let Err(e) = set {
        support::cannot_run(TEST, &format!("this kernel sets no encryption policy on ext4 ({e})"));
        return;
    }
    drop(root);
    let vol = base.join("vol");
    fs::create_dir_all(&vol).unwrap();
    run(Command::new("mount").arg("--bind").arg(disk.join("vol")).arg(&vol));
    let _m = Mount(vol.clone());
    let flags = root_flags(&vol);
    assert_ne!(flags & 0x800, 0, "encrypt flag: {flags:#x}");
    let err = wipe_filesystem(&vol, &MountTable::read().unwrap(), &AtomicBool::new(false)).unwrap_err();
    assert!(
        matches!(&err, FsWipeError::RootMetadata { path, what, detail }
            if *path == vol && what == "inode flags E (chattr)" && detail.contains("encryption policy")),
        "{err}"
    );
    assert!(err.to_string().contains(&vol.display().to_string()), "{err}");
    assert_eq!(root_flags(&vol), flags);
}

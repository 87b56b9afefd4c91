//! `wipe_filesystem` through the public API on a real ext4 volume (loop device), and the
//! wipe-versus-`rm -rf` benchmark that bench/wipe-fs.sh runs. Needs root; skipped otherwise.

mod support;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use local_static_provisioner::host::mountinfo::MountTable;
use local_static_provisioner::host::wipe_fs::*;
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
    let meta = fs::metadata(&vol).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o2770);
    assert_eq!((meta.uid(), meta.gid()), (4321, 8765));
    assert_eq!(fs::read_to_string(&outside).unwrap(), "keep");
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

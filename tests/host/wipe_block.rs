//! Built-in block wipes against real loop devices (root only: skipped with a message
//! otherwise), and the external cleaner command runner (runs as any user).

use crate::support;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use support::{Mount, require_root, run};

use local_static_provisioner::host::HostError;
use local_static_provisioner::host::wipe::wipe_block::{
    BlockMethod, BlockWipeError, BlockWipeReport, run_cleaner_command, wipe_block,
};

const MIB: u64 = 1024 * 1024;
const DEVICE_SIZE: u64 = 256 * MIB;

/// A loop device of DEVICE_SIZE backed by a sparse file in its own temp dir (the shared
/// fixture detaches it when dropped, before the temp dir goes).
struct LoopDevice {
    device: PathBuf,
    _lo: support::LoopDevice,
    #[allow(dead_code)]
    dir: tempfile::TempDir,
}

impl LoopDevice {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let lo = support::LoopDevice::new(&dir.path().join("disk.img"), DEVICE_SIZE / (1024 * 1024));
        LoopDevice { device: lo.device.clone(), _lo: lo, dir }
    }
}

/// `blkid -p DEV`: exit code and output.
fn blkid(dev: &Path) -> (Option<i32>, String) {
    let out = Command::new("blkid").arg("-p").arg(dev).output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Asserts that neither blkid nor wipefs finds anything on `dev`.
fn assert_no_signatures(dev: &Path) {
    let (code, out) = blkid(dev);
    assert_eq!(code, Some(2), "blkid -p still finds something: {out}");
    let out = run(Command::new("wipefs").arg(dev));
    assert!(out.stdout.is_empty(), "wipefs still finds: {}", String::from_utf8_lossy(&out.stdout));
}

fn mkfs_ext4(dev: &Path, block_size: u32) {
    run(Command::new("mkfs.ext4").args(["-q", "-F", "-b", &block_size.to_string()]).arg(dev));
    let (code, out) = blkid(dev);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("TYPE=\"ext4\""), "{out}");
}

/// Byte offsets of the ext backup superblocks (sparse_super) on the test device.
fn ext_backups(block_size: u64) -> Vec<u64> {
    let group_bytes = 8 * block_size * block_size;
    [1u64, 3, 5, 7, 9, 25, 27, 49, 81, 125]
        .iter()
        .map(|g| if block_size == 1024 { (1 + g * 8192) * 1024 } else { g * group_bytes })
        .filter(|&o| o < DEVICE_SIZE)
        .collect()
}

/// Whether an ext superblock magic (0xEF53 at byte 56) is at `offset`. dumpe2fs and e2fsck
/// are no good for this: with the primary area erased they fail even on an intact backup.
fn ext_magic_at(dev: &Path, offset: u64) -> bool {
    let f = std::fs::File::open(dev).unwrap();
    let mut magic = [0u8; 2];
    f.read_exact_at(&mut magic, offset + 56).unwrap();
    magic == [0x53, 0xEF]
}

/// Runs a built-in wipe, recording the progress calls.
fn wipe(dev: &Path, method: BlockMethod) -> (Result<BlockWipeReport, BlockWipeError>, Vec<(u64, u64)>) {
    let cancel = AtomicBool::new(false);
    let mut calls = Vec::new();
    let result = wipe_block(dev, method, &cancel, &mut |done, total| calls.push((done, total)));
    (result, calls)
}

/// Writes a non-zero pattern at a few places (start, middle, end).
fn scribble(dev: &Path) {
    let f = OpenOptions::new().write(true).open(dev).unwrap();
    let pattern = vec![0xA5u8; 64 * 1024];
    for offset in [0, 4096, 100 * MIB + 12345, DEVICE_SIZE / 2, DEVICE_SIZE - pattern.len() as u64] {
        f.write_all_at(&pattern, offset).unwrap();
    }
    f.sync_all().unwrap();
}

fn assert_all_zero(dev: &Path) {
    let f = std::fs::File::open(dev).unwrap();
    let mut buf = vec![0u8; MIB as usize];
    let mut offset = 0;
    while offset < DEVICE_SIZE {
        f.read_exact_at(&mut buf, offset).unwrap();
        if let Some(i) = buf.iter().position(|&b| b != 0) {
            panic!("non-zero byte at offset {}", offset + i as u64);
        }
        offset += MIB;
    }
}

fn quick_wipes_ext4(test: &str, block_size: u32) {
    if !require_root(test) {
        return;
    }
    let lo = LoopDevice::new();
    mkfs_ext4(&lo.device, block_size);
    let backups = ext_backups(u64::from(block_size));
    for &offset in &backups {
        assert!(ext_magic_at(&lo.device, offset), "no backup superblock at {offset} before the wipe");
    }

    let (result, calls) = wipe(&lo.device, BlockMethod::Quick);
    let report = result.unwrap();
    assert_eq!(report, BlockWipeReport { bytes: DEVICE_SIZE, method: BlockMethod::Quick });
    assert_eq!(calls.last(), Some(&(DEVICE_SIZE, DEVICE_SIZE)));

    assert_no_signatures(&lo.device);
    for &offset in &backups {
        assert!(!ext_magic_at(&lo.device, offset), "backup superblock at {offset} survived");
    }
}

#[test]
fn quick_erases_ext4_with_1k_blocks() {
    let _area = support::area(module_path!());
    quick_wipes_ext4("quick_erases_ext4_with_1k_blocks", 1024);
    assert_eq!(ext_backups(1024)[0], 8193 * 1024);
}

#[test]
fn quick_erases_ext4_with_4k_blocks() {
    let _area = support::area(module_path!());
    quick_wipes_ext4("quick_erases_ext4_with_4k_blocks", 4096);
    assert_eq!(ext_backups(4096), vec![32768 * 4096]);
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// Writes a protective MBR and primary and backup GPT with one Linux partition (no sfdisk or
/// sgdisk needed).
fn write_gpt(dev: &Path) {
    const SECTOR: u64 = 512;
    let lbas = DEVICE_SIZE / SECTOR;
    let f = OpenOptions::new().write(true).open(dev).unwrap();

    let mut mbr = [0u8; 512];
    mbr[446..454].copy_from_slice(&[0x00, 0x00, 0x02, 0x00, 0xEE, 0xFF, 0xFF, 0xFF]);
    mbr[454..458].copy_from_slice(&1u32.to_le_bytes());
    mbr[458..462].copy_from_slice(&u32::try_from(lbas - 1).unwrap().to_le_bytes());
    mbr[510] = 0x55;
    mbr[511] = 0xAA;
    f.write_all_at(&mbr, 0).unwrap();

    let mut entries = vec![0u8; 128 * 128];
    let linux_fs = [0xAF, 0x3D, 0xC6, 0x0F, 0x83, 0x84, 0x72, 0x47, 0x8E, 0x79, 0x3D, 0x69, 0xD8, 0x47, 0x7D, 0xE4];
    entries[0..16].copy_from_slice(&linux_fs);
    entries[16..32].copy_from_slice(&[0x11; 16]);
    entries[32..40].copy_from_slice(&2048u64.to_le_bytes());
    entries[40..48].copy_from_slice(&(lbas - 34).to_le_bytes());
    for (i, unit) in "data".encode_utf16().enumerate() {
        entries[56 + 2 * i..58 + 2 * i].copy_from_slice(&unit.to_le_bytes());
    }
    let entries_crc = crc32(&entries);

    let header = |my_lba: u64, alternate: u64, entries_lba: u64| {
        let mut h = [0u8; 512];
        h[0..8].copy_from_slice(b"EFI PART");
        h[8..12].copy_from_slice(&0x0001_0000u32.to_le_bytes());
        h[12..16].copy_from_slice(&92u32.to_le_bytes());
        h[24..32].copy_from_slice(&my_lba.to_le_bytes());
        h[32..40].copy_from_slice(&alternate.to_le_bytes());
        h[40..48].copy_from_slice(&34u64.to_le_bytes());
        h[48..56].copy_from_slice(&(lbas - 34).to_le_bytes());
        h[56..72].copy_from_slice(&[0x22; 16]);
        h[72..80].copy_from_slice(&entries_lba.to_le_bytes());
        h[80..84].copy_from_slice(&128u32.to_le_bytes());
        h[84..88].copy_from_slice(&128u32.to_le_bytes());
        h[88..92].copy_from_slice(&entries_crc.to_le_bytes());
        let crc = crc32(&h[..92]);
        h[16..20].copy_from_slice(&crc.to_le_bytes());
        h
    };
    f.write_all_at(&header(1, lbas - 1, 2), SECTOR).unwrap();
    f.write_all_at(&entries, 2 * SECTOR).unwrap();
    f.write_all_at(&entries, (lbas - 33) * SECTOR).unwrap();
    f.write_all_at(&header(lbas - 1, 1, lbas - 33), (lbas - 1) * SECTOR).unwrap();
    f.sync_all().unwrap();
}

fn last_sector(dev: &Path) -> Vec<u8> {
    let f = std::fs::File::open(dev).unwrap();
    let mut buf = vec![0u8; 512];
    f.read_exact_at(&mut buf, DEVICE_SIZE - 512).unwrap();
    buf
}

#[test]
fn quick_erases_gpt_including_backup_header() {
    let _area = support::area(module_path!());
    if !require_root("quick_erases_gpt_including_backup_header") {
        return;
    }
    let lo = LoopDevice::new();
    write_gpt(&lo.device);
    let (code, out) = blkid(&lo.device);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("PTTYPE=\"gpt\""), "blkid does not see the test GPT: {out}");
    assert!(last_sector(&lo.device).starts_with(b"EFI PART"));

    let (result, _) = wipe(&lo.device, BlockMethod::Quick);
    assert_eq!(result.unwrap().method, BlockMethod::Quick);

    assert_no_signatures(&lo.device);
    assert!(last_sector(&lo.device).iter().all(|&b| b == 0), "backup GPT header survived");
}

#[test]
fn zero_fills_the_whole_device_through_a_symlink() {
    let _area = support::area(module_path!());
    if !require_root("zero_fills_the_whole_device_through_a_symlink") {
        return;
    }
    let lo = LoopDevice::new();
    mkfs_ext4(&lo.device, 4096);
    scribble(&lo.device);
    let link = lo.dir.path().join("by-id-link");
    std::os::unix::fs::symlink(&lo.device, &link).unwrap();

    let (result, calls) = wipe(&link, BlockMethod::Zero);
    assert_eq!(result.unwrap(), BlockWipeReport { bytes: DEVICE_SIZE, method: BlockMethod::Zero });

    assert_eq!(calls.last(), Some(&(DEVICE_SIZE, DEVICE_SIZE)));
    assert_steady_progress(&calls, DEVICE_SIZE);
    assert_all_zero(&lo.device);
    assert_no_signatures(&lo.device);
}

/// Progress reports of one wipe: all against `total`, never going back, never more than
/// 256 MiB apart.
fn assert_steady_progress(calls: &[(u64, u64)], total: u64) {
    let mut previous = 0;
    for &(done, t) in calls {
        assert_eq!(t, total, "{calls:?}");
        assert!(done >= previous && done - previous <= 256 * MIB, "progress {calls:?}");
        previous = done;
    }
}

#[test]
fn shred_with_one_pass_leaves_the_device_all_zeroes() {
    let _area = support::area(module_path!());
    if !require_root("shred_with_one_pass_leaves_the_device_all_zeroes") {
        return;
    }
    let lo = LoopDevice::new();
    mkfs_ext4(&lo.device, 4096);
    scribble(&lo.device);

    let method = BlockMethod::Shred { passes: 1 };
    let (result, calls) = wipe(&lo.device, method);
    assert_eq!(result.unwrap(), BlockWipeReport { bytes: DEVICE_SIZE, method });

    // Progress counts both passes (random, then zeroes) and never goes back.
    let total = 2 * DEVICE_SIZE;
    assert_eq!(calls.last(), Some(&(total, total)));
    assert!(calls.contains(&(DEVICE_SIZE, total)), "the end of the random pass is reported: {calls:?}");
    assert_steady_progress(&calls, total);
    assert_all_zero(&lo.device);
    assert_no_signatures(&lo.device);
}

#[test]
fn shred_is_cancelled_before_writing_anything() {
    let _area = support::area(module_path!());
    if !require_root("shred_is_cancelled_before_writing_anything") {
        return;
    }
    let lo = LoopDevice::new();
    scribble(&lo.device);
    let cancel = AtomicBool::new(true);
    let result = wipe_block(&lo.device, BlockMethod::Shred { passes: 2 }, &cancel, &mut |_, _| {});
    assert!(matches!(result, Err(BlockWipeError::Cancelled { done: 0, .. })), "{result:?}");
    let f = std::fs::File::open(&lo.device).unwrap();
    let mut buf = [0u8; 16];
    f.read_exact_at(&mut buf, 4096).unwrap();
    assert_eq!(buf, [0xA5; 16], "nothing was written");
}

#[test]
fn discard_on_a_loop_device() {
    let _area = support::area(module_path!());
    if !require_root("discard_on_a_loop_device") {
        return;
    }
    let lo = LoopDevice::new();
    mkfs_ext4(&lo.device, 1024);
    scribble(&lo.device);

    let (result, calls) = wipe(&lo.device, BlockMethod::Discard);
    let report = result.unwrap();
    // Loop devices discard by punching holes in the backing file.
    assert_eq!(report, BlockWipeReport { bytes: DEVICE_SIZE, method: BlockMethod::Discard });
    assert_eq!(calls.last(), Some(&(DEVICE_SIZE, DEVICE_SIZE)));
    assert_no_signatures(&lo.device);
    for offset in ext_backups(1024) {
        assert!(!ext_magic_at(&lo.device, offset), "backup superblock at {offset} survived");
    }
}

#[test]
fn cancel_before_start() {
    let _area = support::area(module_path!());
    if !require_root("cancel_before_start") {
        return;
    }
    let lo = LoopDevice::new();
    scribble(&lo.device);
    let cancel = AtomicBool::new(true);
    let err = wipe_block(&lo.device, BlockMethod::Zero, &cancel, &mut |_, _| {}).unwrap_err();
    match &err {
        BlockWipeError::Cancelled { path, done, total } => {
            assert_eq!(path, &lo.device);
            assert_eq!((*done, *total), (0, DEVICE_SIZE));
        }
        other => panic!("expected Cancelled, got {other:?}"),
    }
    // Nothing was written.
    let f = std::fs::File::open(&lo.device).unwrap();
    let mut buf = [0u8; 16];
    f.read_exact_at(&mut buf, 4096).unwrap();
    assert_eq!(buf, [0xA5; 16]);
}

#[test]
fn mounted_device_is_refused() {
    let _area = support::area(module_path!());
    if !require_root("mounted_device_is_refused") {
        return;
    }
    let lo = LoopDevice::new();
    mkfs_ext4(&lo.device, 4096);
    let mnt = lo.dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    run(Command::new("mount").arg(&lo.device).arg(&mnt));
    let mount = Mount { path: mnt };

    for method in [BlockMethod::Quick, BlockMethod::Discard, BlockMethod::Zero] {
        let (result, calls) = wipe(&lo.device, method);
        let err = result.unwrap_err();
        match &err {
            BlockWipeError::Io(HostError::Io { path, op, source }) => {
                assert_eq!(path, &lo.device);
                assert_eq!(*op, "open exclusively (is it mounted?)");
                assert_eq!(source.raw_os_error(), Some(nix::errno::Errno::EBUSY as i32));
            }
            other => panic!("expected Io, got {other:?}"),
        }
        let text = err.to_string();
        assert!(text.contains("mounted") && text.contains(&lo.device.display().to_string()), "{text}");
        assert!(calls.is_empty());
    }
    drop(mount);
    // Untouched.
    let (_, out) = blkid(&lo.device);
    assert!(out.contains("TYPE=\"ext4\""), "{out}");
}

#[test]
fn regular_files_and_char_devices_are_not_block_devices() {
    let _area = support::area(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("disk.img");
    std::fs::write(&file, vec![0xA5u8; 4096]).unwrap();
    for path in [file.as_path(), Path::new("/dev/null")] {
        let (result, _) = wipe(path, BlockMethod::Zero);
        match result {
            Err(BlockWipeError::NotBlockDevice { path: p }) => assert_eq!(p, path),
            other => panic!("expected NotBlockDevice for {}, got {other:?}", path.display()),
        }
    }
    assert_eq!(std::fs::read(&file).unwrap(), vec![0xA5u8; 4096]);

    let missing = dir.path().join("missing");
    let (result, _) = wipe(&missing, BlockMethod::Quick);
    match result {
        Err(BlockWipeError::Io(HostError::Io { path, op: "stat", .. })) => assert_eq!(path, missing),
        other => panic!("expected Io stat, got {other:?}"),
    }
}

/// Writes a shell script into `dir` and returns the argv running it. The script is run by
/// /bin/sh rather than exec'd, so a concurrent fork in another test thread holding the
/// just-written file open cannot make the exec fail with ETXTBSY.
fn script(dir: &Path, name: &str, body: &str) -> Vec<String> {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    vec!["/bin/sh".to_string(), path.display().to_string()]
}

fn command_detail(err: &BlockWipeError) -> &str {
    match err {
        BlockWipeError::Command { detail, .. } => detail,
        other => panic!("expected Command error, got {other:?}"),
    }
}

#[tokio::test]
async fn cleaner_command_gets_the_device_in_its_environment() {
    let _area = support::area(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("seen");
    let argv = script(
        dir.path(),
        "clean.sh",
        &format!("echo cleaning; echo 'a warning' >&2; printf '%s' \"$LOCAL_PV_BLKDEVICE\" > '{}'", out.display()),
    );
    let device = Path::new("/dev/disk/by-id/fake-disk");
    run_cleaner_command(&argv, device, "local-pv-1", Duration::from_secs(20)).await.unwrap();
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "/dev/disk/by-id/fake-disk");
}

#[tokio::test]
async fn cleaner_command_exit_status_is_an_error() {
    let _area = support::area(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let argv =
        script(dir.path(), "fail.sh", "echo starting; echo 'first problem' >&2; echo 'disk on fire' >&2; exit 3");
    let device = Path::new("/dev/fake");
    let err = run_cleaner_command(&argv, device, "local-pv-2", Duration::from_secs(20)).await.unwrap_err();
    let detail = command_detail(&err);
    assert!(detail.contains("status 3"), "{detail}");
    assert!(detail.contains("disk on fire"), "{detail}");
    let text = err.to_string();
    assert!(text.contains("/dev/fake") && text.contains("fail.sh"), "{text}");
}

#[tokio::test]
async fn cleaner_command_is_killed_on_timeout() {
    let _area = support::area(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let argv = script(dir.path(), "slow.sh", "echo sleeping; sleep 30; echo done");
    let started = Instant::now();
    let err =
        run_cleaner_command(&argv, Path::new("/dev/fake"), "local-pv-3", Duration::from_secs(1)).await.unwrap_err();
    let elapsed = started.elapsed();
    assert!(command_detail(&err).contains("timed out"), "{err}");
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
}

#[tokio::test]
async fn cleaner_command_with_lots_of_output_does_not_block() {
    let _area = support::area(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let argv = script(dir.path(), "chatty.sh", "seq 1 200000; seq 1 200000 >&2");
    let started = Instant::now();
    run_cleaner_command(&argv, Path::new("/dev/fake"), "local-pv-4", Duration::from_secs(30)).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[tokio::test]
async fn cleaner_command_that_cannot_start() {
    let _area = support::area(module_path!());
    let device = Path::new("/dev/fake");
    let argv = vec!["/nonexistent/scripts/quick_reset.sh".to_string()];
    let err = run_cleaner_command(&argv, device, "local-pv-5", Duration::from_secs(5)).await.unwrap_err();
    assert!(command_detail(&err).contains("could not start"), "{err}");
    let err = run_cleaner_command(&[], device, "local-pv-5", Duration::from_secs(5)).await.unwrap_err();
    assert!(command_detail(&err).contains("empty"), "{err}");
}

//! The "is this device blank?" probe against real loop devices (root only: skipped with a
//! message otherwise, a failure under CI). Each signature is made by the real tool where this
//! machine can run it, blkid confirms it is there, then the probe must name it; a device that
//! only `wipefs -a` cleaned is not blank, one whose signature areas were zeroed is, and a
//! device held exclusively (another O_EXCL open, a mount) is busy and not read.

use crate::support;

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use local_static_provisioner::core::devices::signatures::{Content, signature_areas};
use local_static_provisioner::host::devices::device_content::{Probe, probe_content};
use support::{cannot_run, require_root, run};

const MIB: u64 = 1024 * 1024;

/// A loop device over a sparse file in its own temp dir; the shared fixture detaches it by the
/// name losetup gave back when dropped (before the temp dir goes).
struct Lab {
    device: PathBuf,
    _lo: support::LoopDevice,
    dir: tempfile::TempDir,
}

impl Lab {
    fn new(size_mib: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let lo = support::LoopDevice::new(&dir.path().join("disk.img"), size_mib);
        Lab { device: lo.device.clone(), _lo: lo, dir }
    }

    /// The probe of this lab's own device, which nothing of the test holds. As in `tool`: a
    /// loop device that was another test's a moment before can still be held by that test's
    /// last exclusive open for a moment, so a busy answer is asked again a few times.
    fn read(&self) -> (u64, Content) {
        for _ in 0..20 {
            match probe_content(&self.device).unwrap() {
                Probe::Read { size, content } => return (size, content),
                Probe::Busy => std::thread::sleep(std::time::Duration::from_millis(100)),
            }
        }
        panic!("{} is busy", self.device.display())
    }

    fn size(&self) -> u64 {
        self.read().0
    }

    fn content(&self) -> Content {
        self.read().1
    }

    /// The signatures the probe names, as "kind at offset".
    fn signatures(&self) -> Vec<String> {
        match self.content() {
            Content::Signatures(found) => found.iter().map(|s| s.to_string()).collect(),
            other => panic!("{}: expected signatures, got {other:?} ({other})", self.device.display()),
        }
    }

    /// `blkid -p -o value -s TAG`: what libblkid sees, the oracle.
    fn blkid(&self, tag: &str) -> String {
        let out = Command::new("blkid").args(["-p", "-o", "value", "-s", tag]).arg(&self.device).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn write_at(&self, offset: u64, bytes: &[u8]) {
        let dev = OpenOptions::new().write(true).open(&self.device).unwrap();
        dev.write_all_at(bytes, offset).unwrap();
        dev.sync_all().unwrap();
    }

    /// What the quick wipe does: zeroes over every signature area.
    fn zero_signature_areas(&self) {
        let size = self.size();
        for (offset, len) in signature_areas(size) {
            self.write_at(offset, &vec![0u8; len as usize]);
        }
    }
}

/// True when the test can run: root, and every tool present (a missing one fails under CI,
/// where scripts/install-deps.sh installs them all).
fn can_run(test: &str, tools: &[&str]) -> bool {
    if !require_root(test) {
        return false;
    }
    for tool in tools {
        let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).stdout(Stdio::null()).status();
        if !found.is_ok_and(|s| s.success()) {
            cannot_run(test, &format!("{tool} is not installed (scripts/install-deps.sh installs it)"));
            return false;
        }
    }
    true
}

/// Makes a signature on a fresh device of `size_mib` with `make` (given the device), checks
/// that blkid's `tag` says `blkid_type`, and returns the device for the probe's checks.
fn made_with(
    test: &str,
    tools: &[&str],
    size_mib: u64,
    tag: &str,
    blkid_type: &str,
    make: impl FnOnce(&Path),
) -> Option<Lab> {
    if !can_run(test, tools) {
        return None;
    }
    let lab = Lab::new(size_mib);
    assert_eq!(lab.content(), Content::Blank, "a fresh sparse loop device is blank");
    make(&lab.device);
    assert_eq!(lab.blkid(tag), blkid_type, "blkid -p on {} after {test}", lab.device.display());
    Some(lab)
}

/// Runs a tool on `dev`. The tests of this file run side by side, each probing its own
/// device with an exclusive open for a moment, and a tool that opens `O_EXCL` (mkfs.xfs) can
/// meet such a probe of a loop device that was another test's a moment before: a busy device
/// is asked again a few times.
fn tool(name: &str, args: &[&str], dev: &Path) {
    for _ in 0..10 {
        let out = Command::new(name).args(args).arg(dev).env("LVM_SUPPRESS_FD_WARNINGS", "1").output().unwrap();
        if out.status.success() {
            return;
        }
        if !String::from_utf8_lossy(&out.stderr).contains("busy") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    run(Command::new(name).args(args).arg(dev).env("LVM_SUPPRESS_FD_WARNINGS", "1"));
}

fn tool_stdin(name: &str, args: &[&str], dev: &Path, input: &str) {
    use std::io::Write;
    let mut child = Command::new(name)
        .args(args)
        .arg(dev)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{name} {args:?} {}: {}", dev.display(), String::from_utf8_lossy(&out.stderr));
}

#[test]
fn ext4_made_by_mkfs_is_named_with_its_backups() {
    let _area = support::area(module_path!());
    let Some(lab) = made_with("ext4", &["mkfs.ext4"], 128, "TYPE", "ext4", |d| tool("mkfs.ext4", &["-q", "-F"], d))
    else {
        return;
    };
    // 128 MiB: mke2fs's "small" type, 1 KiB blocks, 8192 blocks per group; backups in groups
    // 1, 3, 5, 7, 9 (at 8193 KiB + 8 MiB * (g - 1)...).
    let found = lab.signatures();
    assert_eq!(found[0], "ext4 superblock at 1080", "{found:?}");
    for g in [1u64, 3, 5, 7, 9] {
        let at = (1 + 8192 * g) * 1024 + 0x38;
        assert!(found.contains(&format!("ext4 backup superblock at {at}")), "group {g}: {found:?}");
    }
}

#[test]
fn xfs_made_by_mkfs_is_named() {
    let _area = support::area(module_path!());
    // mkfs.xfs refuses file systems under 300 MiB.
    let Some(lab) = made_with("xfs", &["mkfs.xfs"], 300, "TYPE", "xfs", |d| tool("mkfs.xfs", &["-q", "-f"], d)) else {
        return;
    };
    assert!(lab.signatures().contains(&"xfs superblock at 0".to_string()), "{:?}", lab.signatures());
}

#[test]
fn btrfs_made_by_mkfs_is_named_with_its_mirror() {
    let _area = support::area(module_path!());
    let Some(lab) = made_with("btrfs", &["mkfs.btrfs"], 300, "TYPE", "btrfs", |d| tool("mkfs.btrfs", &["-q", "-f"], d))
    else {
        return;
    };
    assert_eq!(lab.signatures(), ["btrfs superblock at 65600", "btrfs mirror superblock at 67108928"]);
}

#[test]
fn vfat_made_by_mkfs_is_named() {
    let _area = support::area(module_path!());
    let Some(lab) =
        made_with("vfat (FAT16)", &["mkfs.vfat"], 64, "TYPE", "vfat", |d| tool("mkfs.vfat", &["-F", "16"], d))
    else {
        return;
    };
    assert_eq!(lab.signatures(), ["vfat boot sector at 54"]);
    let Some(lab) =
        made_with("vfat (FAT32)", &["mkfs.vfat"], 64, "TYPE", "vfat", |d| tool("mkfs.vfat", &["-F", "32"], d))
    else {
        return;
    };
    assert_eq!(lab.signatures(), ["vfat boot sector at 82", "vfat backup boot sector at 3154"]);
}

#[test]
fn swap_made_by_mkswap_is_named() {
    let _area = support::area(module_path!());
    let Some(lab) = made_with("swap", &["mkswap"], 64, "TYPE", "swap", |d| tool("mkswap", &[], d)) else {
        return;
    };
    assert_eq!(lab.signatures(), ["swap signature at 4086"]);
}

#[test]
fn dos_and_gpt_tables_made_by_sfdisk_are_named() {
    let _area = support::area(module_path!());
    let Some(lab) = made_with("dos label", &["sfdisk"], 64, "PTTYPE", "dos", |d| {
        tool_stdin("sfdisk", &["-q", "--no-reread", "--no-tell-kernel"], d, "label: dos\n,,83\n")
    }) else {
        return;
    };
    assert_eq!(lab.signatures(), ["dos partition table at 510"]);
    let Some(lab) = made_with("gpt label", &["sfdisk"], 64, "PTTYPE", "gpt", |d| {
        tool_stdin("sfdisk", &["-q", "--no-reread", "--no-tell-kernel"], d, "label: gpt\n,,L\n")
    }) else {
        return;
    };
    let backup = lab.size() - 512;
    assert_eq!(
        lab.signatures(),
        ["protective MBR at 510".to_string(), "gpt header at 512".into(), format!("gpt backup header at {backup}")]
    );
}

#[test]
fn an_lvm2_physical_volume_made_by_pvcreate_is_named() {
    let _area = support::area(module_path!());
    // pvcreate only writes the label: it needs no device-mapper (this kernel has none).
    let Some(lab) =
        made_with("LVM2", &["pvcreate"], 64, "TYPE", "LVM2_member", |d| tool("pvcreate", &["-q", "-y", "-ff"], d))
    else {
        return;
    };
    assert_eq!(lab.signatures(), ["LVM2 label at 512"]);
}

#[test]
fn luks_made_by_cryptsetup_is_named() {
    let _area = support::area(module_path!());
    // luksFormat writes the headers itself; dm-crypt is only needed to open the volume.
    let format = |kind: &'static str| {
        move |d: &Path| {
            tool_stdin(
                "cryptsetup",
                &[
                    "luksFormat",
                    "--type",
                    kind,
                    "--pbkdf",
                    "pbkdf2",
                    "--pbkdf-force-iterations",
                    "1000",
                    "-q",
                    "--key-file",
                    "-",
                ],
                d,
                "not a secret",
            )
        }
    };
    let Some(lab) = made_with("LUKS2", &["cryptsetup"], 64, "TYPE", "crypto_LUKS", format("luks2")) else {
        return;
    };
    assert_eq!(lab.signatures(), ["LUKS2 header at 0", "LUKS2 secondary header at 16384"]);
    let Some(lab) = made_with("LUKS1", &["cryptsetup"], 64, "TYPE", "crypto_LUKS", format("luks1")) else {
        return;
    };
    assert_eq!(lab.signatures(), ["LUKS1 header at 0"]);
}

/// The checksum of an md 1.x superblock (kernel md.c calc_sb_1_csum): the little-endian u32
/// sum of its 256 + 2 * max_dev bytes with the checksum field zero, folded to 32 bits.
fn md1_csum(sb: &[u8]) -> u32 {
    let sum: u64 = sb.chunks_exact(4).map(|w| u64::from(u32::from_le_bytes([w[0], w[1], w[2], w[3]]))).sum();
    ((sum & 0xffff_ffff) + (sum >> 32)) as u32
}

#[test]
fn an_md_1_2_superblock_is_named() {
    let _area = support::area(module_path!());
    // mdadm --create needs the md driver, which this kernel lacks ("unexpected failure opening
    // /dev/md127"), and has no offline mode: the v1.2 superblock is written here, byte for
    // byte as md's struct mdp_superblock_1 lays it out, so that blkid accepts it (magic,
    // major version 1, super_offset = its own sector, checksum).
    let Some(lab) = made_with("md 1.2", &[], 64, "TYPE", "linux_raid_member", |d| {
        let mut sb = [0u8; 256];
        sb[0..4].copy_from_slice(&0xa92b_4efcu32.to_le_bytes()); // magic
        sb[4..8].copy_from_slice(&1u32.to_le_bytes()); // major_version
        sb[16..32].copy_from_slice(b"content-probe-md"); // set_uuid
        sb[72..76].copy_from_slice(&1u32.to_le_bytes()); // level: raid1
        sb[92..96].copy_from_slice(&2u32.to_le_bytes()); // raid_disks
        sb[128..136].copy_from_slice(&2048u64.to_le_bytes()); // data_offset (sectors)
        sb[144..152].copy_from_slice(&8u64.to_le_bytes()); // super_offset: 4096 / 512
        sb[168..184].copy_from_slice(b"content-probe-dv"); // device_uuid
        let csum = md1_csum(&sb);
        sb[216..220].copy_from_slice(&csum.to_le_bytes()); // sb_csum (max_dev 0: 256 bytes)
        let dev = OpenOptions::new().write(true).open(d).unwrap();
        dev.write_all_at(&sb, 4096).unwrap();
        dev.sync_all().unwrap();
    }) else {
        return;
    };
    assert_eq!(lab.signatures(), ["md superblock 1.2 at 4096"]);
}

#[test]
fn zfs_uberblocks_are_named() {
    let _area = support::area(module_path!());
    // No ZFS tools on Debian's main archive: four uberblock magics in label L0 are what
    // libblkid needs to say zfs_member (it wants at least 4, and a device of 64 MiB or more).
    let Some(lab) = made_with("zfs", &[], 64, "TYPE", "zfs_member", |d| {
        let dev = OpenOptions::new().write(true).open(d).unwrap();
        for slot in 0..4u64 {
            dev.write_all_at(&0x00ba_b10cu64.to_le_bytes(), 128 * 1024 + slot * 1024).unwrap();
        }
        dev.sync_all().unwrap();
    }) else {
        return;
    };
    assert_eq!(lab.signatures(), ["zfs uberblock at 131072"]);
}

#[test]
fn bcache_f2fs_ntfs_and_squashfs_made_by_their_tools_are_named() {
    let _area = support::area(module_path!());
    let Some(lab) = made_with("bcache", &["make-bcache"], 64, "TYPE", "bcache", |d| tool("make-bcache", &["-B"], d))
    else {
        return;
    };
    assert_eq!(lab.signatures(), ["bcache superblock at 4120"]);
    let Some(lab) = made_with("f2fs", &["mkfs.f2fs"], 128, "TYPE", "f2fs", |d| tool("mkfs.f2fs", &["-q", "-f"], d))
    else {
        return;
    };
    assert_eq!(lab.signatures(), ["f2fs superblock at 1024", "f2fs backup superblock at 5120"]);
    let Some(lab) =
        made_with("ntfs", &["mkfs.ntfs"], 64, "TYPE", "ntfs", |d| tool("mkfs.ntfs", &["-q", "-Q", "-F", "-f"], d))
    else {
        return;
    };
    let backup = lab.size() - 512 + 3;
    assert_eq!(lab.signatures(), ["NTFS boot sector at 3".to_string(), format!("NTFS backup boot sector at {backup}")]);
    let source = tempfile::tempdir().unwrap();
    std::fs::write(source.path().join("file"), "content").unwrap();
    let Some(lab) = made_with("squashfs", &["mksquashfs"], 64, "TYPE", "squashfs", |d| {
        run(Command::new("mksquashfs").arg(source.path()).arg(d).args(["-noappend", "-quiet", "-no-progress"]));
    }) else {
        return;
    };
    assert_eq!(lab.signatures(), ["squashfs superblock at 0"]);
}

#[test]
fn wipefs_is_not_enough_but_zeroing_the_signature_areas_is() {
    let _area = support::area(module_path!());
    let Some(lab) =
        made_with("wipefs", &["mkfs.ext4", "wipefs"], 128, "TYPE", "ext4", |d| tool("mkfs.ext4", &["-q", "-F"], d))
    else {
        return;
    };
    run(Command::new("wipefs").arg("-a").arg(&lab.device));
    assert_eq!(lab.blkid("TYPE"), "", "blkid sees nothing after wipefs -a");
    // The primary magic is gone; the backup superblocks (and everything else) are not.
    let found = lab.signatures();
    assert!(!found.iter().any(|s| s.starts_with("ext4 superblock")), "{found:?}");
    assert!(found.contains(&format!("ext4 backup superblock at {}", 8193 * 1024 + 0x38)), "{found:?}");
    lab.zero_signature_areas();
    // Outside the areas the file system's metadata is still there, and the windows sampled
    // over the whole surface (core::devices::surface) see it: not blank, at an offset outside them.
    let image = std::fs::read(lab.dir.path().join("disk.img")).unwrap();
    let areas = signature_areas(image.len() as u64);
    let outside = |at: usize| !areas.iter().any(|&(o, l)| o <= at as u64 && (at as u64) < o + l);
    assert!(image.iter().enumerate().any(|(at, &b)| b != 0 && outside(at)), "mkfs wrote only inside the areas?");
    match lab.content() {
        Content::Data { offset } => assert!(outside(offset as usize) && image[offset as usize] != 0, "{offset}"),
        other => panic!("the samples missed ext4's metadata: {other:?}"),
    }
}

#[test]
fn data_without_a_signature_is_reported_by_offset() {
    let _area = support::area(module_path!());
    if !can_run("data", &[]) {
        return;
    }
    let lab = Lab::new(64);
    lab.write_at(40 * MIB + 17, b"tenant data");
    lab.write_at(7 * 1024, b"more");
    let content = lab.content();
    assert_eq!(content, Content::Data { offset: 7 * 1024 });
    assert_eq!(content.to_string(), "non-zero data at offset 7168 with no signature this agent recognises");
}

#[test]
fn a_device_held_exclusively_is_busy_and_released_is_read() {
    let _area = support::area(module_path!());
    if !can_run("busy (O_EXCL)", &[]) {
        return;
    }
    let lab = Lab::new(64);
    let holder =
        OpenOptions::new().read(true).custom_flags(nix::fcntl::OFlag::O_EXCL.bits()).open(&lab.device).unwrap();
    assert_eq!(probe_content(&lab.device).unwrap(), Probe::Busy);
    drop(holder);
    assert_eq!(probe_content(&lab.device).unwrap(), Probe::Read { size: 64 * MIB, content: Content::Blank });
}

#[test]
fn a_mounted_device_is_busy() {
    let _area = support::area(module_path!());
    if !can_run("busy (mounted)", &["mkfs.ext4", "mount"]) {
        return;
    }
    let lab = Lab::new(64);
    tool("mkfs.ext4", &["-q", "-F"], &lab.device);
    let target = lab.dir.path().join("mnt");
    std::fs::create_dir(&target).unwrap();
    run(Command::new("mount").arg(&lab.device).arg(&target));
    let mounted = support::Mount { path: target };
    assert_eq!(probe_content(&lab.device).unwrap(), Probe::Busy);
    drop(mounted);
    assert!(lab.signatures().contains(&"ext4 superblock at 1080".to_string()));
}

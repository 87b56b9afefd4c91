//! Volume identity: a fingerprint of the disk behind a path, recorded on the PV when it is
//! published and checked before a wipe, so that a different disk now mounted (or linked) at
//! the same path is never wiped in its place.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use super::HostError;
use super::mountinfo::MountTable;
use super::volume::{EntryKind, resolve_entry};
use crate::core::succession::DiskCheck;

/// Fingerprint of the volume at `path` (symlinks followed).
///
/// - Filesystem: the filesystem ID from statfs (derived from the filesystem UUID on ext4, xfs,
///   btrfs and tmpfs, so it survives reboots and device renumbering) and the inode of the
///   volume's root (different for bind mounts of different directories of one disk).
/// - Block device: the most stable ID the kernel offers in sysfs (WWID, serial, device-mapper
///   UUID, loop backing file), with the size; the device number only when none exists.
pub fn volume_identity(path: &Path) -> Result<String, HostError> {
    let meta = std::fs::metadata(path).map_err(|e| HostError::io("stat", path, e))?;
    if meta.file_type().is_block_device() {
        return Ok(block_identity(path, meta.rdev()));
    }
    let st = nix::sys::statfs::statfs(path).map_err(|e| HostError::io("statfs", path, e))?;
    // fsid has no public accessor in nix; its Debug form is stable ("fsid_t { __val: [a, b] }").
    let fsid = format!("{:?}", st.filesystem_id());
    let fsid: String = fsid.chars().filter(|c| c.is_ascii_digit() || *c == ',' || *c == '-').collect();
    Ok(format!("fs:fsid={fsid};ino={}", meta.ino()))
}

/// Whether the volume recorded as `recorded` is still at `path`: a mounted directory or a
/// block device, with the same identity when one was recorded. Any error counts as absent.
pub fn volume_present(path: &Path, recorded: Option<&str>, mounts: &MountTable) -> bool {
    let here = match resolve_entry(path) {
        Ok((EntryKind::Directory, resolved)) => mounts.is_mount_point(&resolved),
        Ok((EntryKind::BlockDevice, _)) => true,
        _ => false,
    };
    here && recorded.is_none_or(|r| volume_identity(path).is_ok_and(|found| found == r))
}

/// What is at a predecessor PV's path compared with the disk it recorded (see core::succession).
/// A mismatch counts as a different disk only when the identity cannot change across a reboot
/// for the same disk; otherwise it is `Unverified`, which never leads to releasing a claim.
pub fn check_disk(path: &Path, recorded: Option<&str>, mounts: &MountTable) -> DiskCheck {
    if !volume_present(path, None, mounts) {
        return DiskCheck::Missing;
    }
    let Some(recorded) = recorded else { return DiskCheck::Unrecorded };
    let Ok(found) = volume_identity(path) else { return DiskCheck::Unverified };
    if found == recorded {
        return DiskCheck::Same;
    }
    let fs_type = resolve_entry(path).ok().and_then(|(_, p)| mounts.get(&p).map(|m| m.fs_type.clone()));
    if mismatch_proves_another_disk(recorded, &found, fs_type.as_deref()) {
        DiskCheck::Different
    } else {
        DiskCheck::Unverified
    }
}

/// Filesystems whose statfs fsid comes from the filesystem's own UUID (tmpfs: a new one per
/// mount, and its data does not outlive the mount anyway). XFS and most others derive it from
/// the device number, which can change when disks enumerate in another order.
const FSID_FROM_UUID: [&str; 5] = ["ext2", "ext3", "ext4", "btrfs", "tmpfs"];

/// Whether two different identities prove two different disks: block identities from a WWID,
/// serial, device-mapper UUID or loop file do (the device-number fallback only when the sizes
/// differ); filesystem identities only on filesystems whose fsid comes from their UUID.
pub fn mismatch_proves_another_disk(recorded: &str, found: &str, fs_type: Option<&str>) -> bool {
    let size = |id: &str| id.rsplit_once(";size=").map(|(_, s)| s.to_string());
    match (recorded.strip_prefix("blk:"), found.strip_prefix("blk:")) {
        (Some(r), Some(f)) => {
            let by_number = |id: &str| id.starts_with("dev=");
            !(by_number(r) || by_number(f)) || size(recorded) != size(found)
        }
        // A block device where a filesystem was, or the other way round.
        (Some(_), None) | (None, Some(_)) => true,
        (None, None) => fs_type.is_some_and(|t| FSID_FROM_UUID.contains(&t)),
    }
}

fn block_identity(path: &Path, rdev: u64) -> String {
    let (major, minor) = (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev));
    let sys = format!("/sys/dev/block/{major}:{minor}");
    let read = |rel: &str| {
        std::fs::read_to_string(format!("{sys}/{rel}")).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
    };
    let size = super::volume::block_device_capacity(path).unwrap_or(0);
    let stable = read("device/wwid")
        .map(|v| format!("wwid={v}"))
        .or_else(|| read("wwid").map(|v| format!("wwid={v}")))
        .or_else(|| read("device/serial").map(|v| format!("serial={v}")))
        .or_else(|| read("dm/uuid").map(|v| format!("dm={v}")))
        .or_else(|| read("loop/backing_file").map(|v| format!("loop={v}@{}", read("loop/offset").unwrap_or_default())));
    match stable {
        Some(id) => format!("blk:{id};size={size}"),
        None => format!("blk:dev={major}:{minor};size={size}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_stable_identities_prove_a_different_disk() {
        let fs_a = "fs:fsid=1,2;ino=2";
        let fs_b = "fs:fsid=3,4;ino=2";
        assert!(mismatch_proves_another_disk(fs_a, fs_b, Some("ext4")));
        assert!(mismatch_proves_another_disk(fs_a, fs_b, Some("tmpfs")));
        // XFS derives its fsid from the device number: a renumbered disk looks different.
        assert!(!mismatch_proves_another_disk(fs_a, fs_b, Some("xfs")));
        assert!(!mismatch_proves_another_disk(fs_a, fs_b, None));
        let wwid_a = "blk:wwid=naa.1;size=100";
        let wwid_b = "blk:wwid=naa.2;size=100";
        assert!(mismatch_proves_another_disk(wwid_a, wwid_b, None));
        let dev_a = "blk:dev=8:16;size=100";
        let dev_b = "blk:dev=8:32;size=100";
        assert!(!mismatch_proves_another_disk(dev_a, dev_b, None));
        assert!(!mismatch_proves_another_disk(dev_a, "blk:serial=x;size=100", None));
        assert!(mismatch_proves_another_disk(dev_a, "blk:dev=8:16;size=200", None));
        assert!(mismatch_proves_another_disk(fs_a, wwid_a, Some("ext4")));
    }

    #[test]
    fn directories_on_one_filesystem_differ_by_root_inode() {
        let tmp = tempfile::tempdir().unwrap();
        let a = tmp.path().join("a");
        let b = tmp.path().join("b");
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let ia = volume_identity(&a).unwrap();
        assert!(ia.starts_with("fs:fsid="), "{ia}");
        assert_ne!(ia, volume_identity(&b).unwrap());
        assert_eq!(ia, volume_identity(&a).unwrap(), "identity is stable");
    }

    #[test]
    fn tmpfs_mounts_at_one_path_differ() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED tmpfs_mounts_at_one_path_differ: needs root (mounts)");
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
        umount(&p);
        mount(&p);
        let second = volume_identity(&p).unwrap();
        umount(&p);
        assert_ne!(first, second, "a different disk at the same path must not look the same");
    }
}

//! Adversarial constructions against the durable "used" mark (see docs/data-safety.md, "A used
//! disk is never offered unwiped, wherever it shows up"), on real mounts, loop devices and the
//! real control plane, with the agent under its own RBAC. None of these is covered by
//! tests/cluster/used_mark.rs:
//!
//! - a used ext4 volume mounted read-only at a new entry after its PV was force-deleted;
//! - a used Filesystem volume's device linked into a Block class (held while its PV lives,
//!   wiped or held once it is gone);
//! - a used block device partitioned afterwards, its partition exposed in a Block class;
//! - a used ext4 disk reformatted as XFS and mounted again;
//! - a tenant without CAP_SYS_ADMIN trying to read, set or remove the mark;
//! - the agent SIGKILLed right after a create and during a wipe-first;
//! - the admin copying a used volume with `cp -a` onto a fresh disk (and a fresh disk with an
//!   admin's data, which must not be wiped).
//!
//! Needs root.

use crate::support;

use std::os::unix::fs::{FileExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::used_lab::*;
use support::{run, wait_until};

/// A marker long and odd enough to be found in a raw device only where the tenant wrote it.
const SECRET: &[u8] = b"TENANT-SECRET-7f3a9c1e-not-for-the-next-tenant";

/// Published after a wipe, or refused with an event: the agent has decided about `path`.
fn decided(h: &Harness, path: &Path) -> Option<String> {
    if let Some(name) = h.available_at(path) {
        return Some(format!("published as {name}"));
    }
    h.node_event("VolumeNotPublished", &path.display().to_string()).map(|note| format!("refused: {note}"))
}

/// A Bound ext4 volume at `entry` (class `class`) with the tenant's file and its complete
/// mark: (PV, UID, device).
fn used_ext4(h: &Harness, class: &str, entry: &Path, claim: &str, mib: u64) -> (String, String, PathBuf) {
    let (dev, _) = h.lab.ext4_sized(&entry.file_name().unwrap().to_string_lossy(), entry, mib);
    let pv = h.wait_published(entry);
    h.claim(claim, class, &pv, false);
    std::fs::write(entry.join("tenant"), TENANT).unwrap();
    std::fs::write(entry.join("secret"), SECRET).unwrap();
    run(&mut Command::new("sync"));
    let uid = h.uid(&pv);
    // Complete: the PV's UID and its claim (the agent rewrites the mark when it sees it Bound).
    wait_until("the disk carries the complete mark of its claimed PV", WAIT, || marked_claimed_for(entry, &pv, &uid));
    (pv, uid, dev)
}

/// Whether the raw device still holds the tenant's secret anywhere (read whole).
fn device_has_secret(dev: &Path) -> bool {
    let Ok(bytes) = std::fs::read(dev) else { return false };
    bytes.windows(SECRET.len()).any(|w| w == SECRET)
}

/// The used ext4 disk of a Bound PV is unmounted, its claim deleted and its PV deleted with the
/// finalizer forced off (no wipe). Returns the old PV's name.
fn abandon(h: &Harness, entry: &Path, pv: &str, claim: &str) {
    h.lab.umount(entry);
    wait_until("the Bound PV flagged missing", WAIT, || h.ann(pv, ANN_MISSING));
    h.delete_claim(claim);
    h.force_delete_pv(pv);
}

// =============================================================================================
// Constructions

/// A used ext4 disk whose PV was force-deleted comes back mounted read-only at a new entry:
/// the wipe-first cannot delete anything (EROFS), so it must not be published with the data.
#[test]
fn a_used_ext4_back_read_only_at_a_new_entry_is_never_offered_with_the_data() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("ro-back") else { return };
    let class = "ua-ro-back";
    let (disks, config) = h.fs_class(class);
    let agent = h.agent(&config, &[]);
    let entry = disks.join("e");
    let (pv, _, dev) = used_ext4(&h, class, &entry, "ua-ro-back", 64);
    abandon(&h, &entry, &pv, "ua-ro-back");

    let ro = disks.join("ro");
    h.lab.mount_dev_with(&dev, &ro, &["-o", "ro"]);
    assert!(holds_tenant_data(&ro) && used_mark(&ro).is_some_and(|m| m["pv"] == pv.as_str()));
    let never = || offered_unwiped(&h, &ro);
    // The agent must notice it (a VolumeUsed event for the wipe-first, or a refusal).
    let seen = wait_never("the agent acts on the read-only used disk", &never, || {
        h.node_event("VolumeUsed", &ro.display().to_string())
            .or_else(|| h.node_event("VolumeNotPublished", &ro.display().to_string()))
            .or_else(|| h.available_at(&ro))
    });
    eprintln!("read-only used disk: {seen}");
    never_for(10, &never);
    drop(agent);
}

/// A used Filesystem volume's device linked into a Block class: held (neither published nor
/// wiped) while its PV lives with the disk gone from its path; once the PV is force-deleted,
/// wiped before it is published raw, or held; never offered with the tenant's bytes.
#[test]
fn a_used_filesystem_device_linked_into_a_block_class_is_held_then_never_offered_raw_with_data() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("fs-to-block") else { return };
    let (disks, blk) = (h.lab.dir("disks"), h.lab.dir("blk"));
    let (fs_class, blk_class) = ("ua-fs-to-block-fs", "ua-fs-to-block-blk");
    let config = h.config(
        "config",
        &[(fs_class, &disks, ""), (blk_class, &blk, "  volumeMode: Block\n  blockCleanMethod: zero\n")],
    );
    let agent = h.agent(&config, &[]);
    let entry = disks.join("e");
    let (pv, uid, dev) = used_ext4(&h, fs_class, &entry, "ua-fs-to-block", 64);
    h.lab.umount(&entry);
    wait_until("the Bound PV flagged missing", WAIT, || h.ann(&pv, ANN_MISSING));
    assert!(device_has_secret(&dev), "the secret is on the device");

    // Phase 1: the PV lives (Bound, its disk gone from its path): the device is its data.
    let raw = blk.join("raw");
    symlink(&dev, &raw).unwrap();
    let held = || {
        if let Some((name, phase)) = h.pv_at(&raw) {
            return Some(format!("{} published as {name} ({phase}) while PV {pv} holds it", raw.display()));
        }
        (!device_has_secret(&dev)).then(|| format!("the device of live PV {pv} was wiped"))
    };
    wait_never("the raw device refused while its PV lives", &held, || {
        h.node_event("VolumeNotPublished", &raw.display().to_string())
    });
    never_for(5, &held);
    assert_eq!(h.cp.pv_state(&pv), Some((uid, "Bound".to_string())));

    // Phase 2: the PV is force-deleted.
    h.delete_claim("ua-fs-to-block");
    h.force_delete_pv(&pv);
    let never = || {
        let (name, phase) = h.pv_at(&raw)?;
        device_has_secret(&dev)
            .then(|| format!("{} published as {name} ({phase}) with the tenant's bytes", raw.display()))
    };
    let new = wait_never("the raw device wiped and published", &never, || h.available_at(&raw));
    assert!(!device_has_secret(&dev), "wiped before it was published as {new}");
    drop(agent);
}

/// A used block device (its PV force-deleted) gets a partition table and comes back as a
/// partition in a Block class: the partition shares the tenant's bytes, so it is held back
/// (`used-unknown`) or wiped; never offered with them.
#[test]
fn a_used_block_device_partitioned_afterwards_never_offers_its_partition_unwiped() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("partitioned") else { return };
    let blk = h.lab.dir("blk");
    let class = "ua-partitioned";
    let config = h.config("config", &[(class, &blk, "  volumeMode: Block\n  blockCleanMethod: zero\n")]);
    let (dev, img) = h.lab.loop_dev("d", 64);
    symlink(&dev, blk.join("d1")).unwrap();
    let agent = h.agent(&config, &[]);
    let pv = h.wait_published(&blk.join("d1"));
    h.claim("ua-partitioned", class, &pv, true);
    let f = std::fs::OpenOptions::new().write(true).open(&dev).unwrap();
    for at in [16u64 << 20, 40 << 20] {
        f.write_all_at(SECRET, at).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let uid = h.uid(&pv);
    let ledger = h.ledger(&h.node);
    wait_until("the ledger records the device", WAIT, || {
        let entries: Value = serde_json::from_slice(&std::fs::read(&ledger).ok()?).ok()?;
        entries["used"].as_array()?.iter().any(|e| e["pv"] == pv.as_str() && e["uid"] == uid.as_str()).then_some(())
    });

    std::fs::remove_file(blk.join("d1")).unwrap();
    wait_until("the Bound PV flagged missing", WAIT, || h.ann(&pv, ANN_MISSING));
    h.force_delete_pv(&pv);
    h.delete_claim("ua-partitioned");

    // The admin partitions the device and re-attaches it with partition scanning.
    let mut sfdisk = Command::new("sfdisk");
    sfdisk.args(["-q", "--no-reread"]).arg(&dev).stdin(std::process::Stdio::piped());
    let mut child = sfdisk.spawn().unwrap();
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(b"label: dos\nstart=2048, type=83\n").unwrap();
    assert!(child.wait().unwrap().success());
    run(Command::new("losetup").arg("-d").arg(&dev));
    let dev = h.lab.loop_on_partscan(&img);
    let mut part = PathBuf::from(format!("{}p1", dev.display()));
    let until = Instant::now() + Duration::from_secs(10);
    while !part.exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(200));
    }
    if !part.exists() {
        // No partition scanning here (a container's loop devices): the same bytes as a
        // partition would show them, through a loop device at the partition's offset.
        eprintln!("no partition scanning; exposing the partition as a loop device at offset 1 MiB");
        let out = run(Command::new("losetup").args(["--find", "--show", "-o", "1048576"]).arg(&img));
        part = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    }
    assert!(device_has_secret(&part), "the partition holds the tenant's bytes");
    let p1 = blk.join("p1");
    symlink(&part, &p1).unwrap();
    let never = || {
        let (name, phase) = h.pv_at(&p1)?;
        device_has_secret(&part)
            .then(|| format!("{} published as {name} ({phase}) with the tenant's bytes", p1.display()))
    };
    let decided = wait_never("the partition refused or wiped", &never, || decided(&h, &p1));
    eprintln!("the partition was {decided}");
    never_for(5, &never);
    drop(agent);
}

/// A used ext4 disk (its PV force-deleted) is reformatted as XFS by an admin and mounted again:
/// `mkfs` leaves the old blocks, and the ledger relates the device, so it is wiped first (a
/// VolumeUsed event) or held; never published as if it were fresh.
#[test]
fn a_used_ext4_reformatted_as_xfs_is_wiped_first_or_held() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("reformat") else { return };
    let class = "ua-reformat";
    let (disks, config) = h.fs_class(class);
    let agent = h.agent(&config, &[]);
    let entry = disks.join("e");
    // XFS needs 300 MiB; the image is sparse.
    let (pv, _, dev) = used_ext4(&h, class, &entry, "ua-reformat", 320);
    abandon(&h, &entry, &pv, "ua-reformat");
    run(Command::new("mkfs.xfs").args(["-q", "-f"]).arg(&dev));
    // Looked at outside the discovery directory: mounted there, the agent may wipe it first and
    // write its own mark before this looks (seen under load).
    let look = h.lab.path("look");
    h.lab.mount_dev(&dev, &look);
    assert!(used_mark(&look).is_none(), "a new filesystem carries no attribute");
    h.lab.umount(&look);
    let back = disks.join("x");
    h.lab.mount_dev(&dev, &back);
    let path = back.display().to_string();
    let never = || {
        let (name, phase) = h.pv_at(&back)?;
        let wiped = h.node_event("VolumeUsed", &path).is_some();
        let refused = h.node_event("VolumeNotPublished", &path).is_some();
        (!wiped && !refused).then(|| format!("{path} published as {name} ({phase}) without a wipe-first"))
    };
    let decided = wait_never("the reformatted disk wiped first or refused", &never, || decided(&h, &back));
    eprintln!("the reformatted disk was {decided}");
    never_for(3, &never);
    drop(agent);
}

/// A tenant's process (no capabilities, an unprivileged user, owning its volume's root) can
/// neither read, set nor remove the `trusted.` mark; and a file named like the ledger in its
/// volume changes nothing: after its PV is force-deleted the disk is still wiped first.
#[test]
fn a_tenant_without_cap_sys_admin_cannot_touch_the_used_mark() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("tenant-xattr") else { return };
    let class = "ua-tenant-xattr";
    let (disks, config) = h.fs_class(class);
    let agent = h.agent(&config, &[]);
    let entry = disks.join("e");
    let (pv, uid, dev) = used_ext4(&h, class, &entry, "ua-tenant-xattr", 64);
    run(Command::new("chown").arg("65534:65534").arg(&entry));
    std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o777)).unwrap();
    let before = used_mark(&entry).unwrap();

    let as_tenant = |script: &str| {
        // By absolute path: the tenant cannot reach root's own interpreter shims.
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"])
            .args(["/usr/bin/python3", "-c", script])
            .arg(&entry)
            .arg(XATTR)
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string())
    };
    let (ok, _) = as_tenant("import os, sys; os.removexattr(sys.argv[1], sys.argv[2])");
    assert!(!ok, "the tenant removed the mark");
    let (ok, _) = as_tenant("import os, sys; os.setxattr(sys.argv[1], sys.argv[2], b'{}')");
    assert!(!ok, "the tenant overwrote the mark");
    let (ok, out) =
        as_tenant("import os, sys; print(os.listxattr(sys.argv[1])); os.getxattr(sys.argv[1], sys.argv[2])");
    assert!(!ok, "the tenant read the mark");
    assert!(!out.contains("local-static-provisioner"), "the tenant lists the mark: {out}");
    // What it can do: files of its own, one named like the ledger, a user. attribute.
    let (ok, _) = as_tenant(
        "import os, sys; open(os.path.join(sys.argv[1], 'used-disks.json'), 'w').write('{\"used\": []}'); \
         os.setxattr(sys.argv[1], 'user.local-static-provisioner.used', b'{}')",
    );
    assert!(ok, "the tenant can write its own volume (else the refusals above prove nothing)");
    assert_eq!(used_mark(&entry), Some(before), "the mark is unchanged");

    // The PV goes without a wipe; the disk comes back: it is wiped before it is offered again.
    abandon(&h, &entry, &pv, "ua-tenant-xattr");
    h.lab.mount_dev(&dev, &entry);
    let never = || offered_unwiped(&h, &entry);
    let new = wait_never("the disk wiped and published again", &never, || h.available_at(&entry));
    assert!(!holds_tenant_data(&entry));
    assert_ne!(h.uid(&new), uid);
    drop(agent);
}

/// The agent is SIGKILLed the moment its create returns (the mark may lack the UID), restarted;
/// the PV is claimed and used, then force-deleted while the disk stays at its entry; the agent
/// is SIGKILLed again during the wipe-first and restarted. Never offered with the data.
#[test]
fn an_agent_killed_after_a_create_and_during_a_wipe_first_never_offers_the_data() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("kill") else { return };
    let class = "ua-kill";
    let (disks, config) = h.fs_class(class);
    let entry = disks.join("e");
    h.lab.ext4_sized("e", &entry, 256);
    let agent = h.agent(&config, &[]);
    let pv = wait_until("the PV created", WAIT, || {
        std::thread::sleep(Duration::from_millis(20));
        h.pv_at(&entry).map(|(name, _)| name)
    });
    drop(agent); // SIGKILL
    eprintln!("mark right after the create: {:?}", used_mark(&entry));
    let agent = h.agent(&config, &[]);
    let uid = h.uid(&pv);
    wait_until("the restarted agent completes the mark", WAIT, || marked_for(&entry, &pv, &uid));
    h.claim("ua-kill", class, &pv, false);
    std::fs::write(entry.join("tenant"), TENANT).unwrap();
    // Many files, so the wipe-first takes a while.
    let many = entry.join("many");
    std::fs::create_dir(&many).unwrap();
    for i in 0..30_000 {
        std::fs::write(many.join(format!("f{i}")), b"x").unwrap();
    }
    wait_until("the mark records the claim", WAIT, || {
        used_mark(&entry).is_some_and(|m| m["claimed"] == true && m["uid"] == uid.as_str()).then_some(())
    });

    h.delete_claim("ua-kill");
    h.force_delete_pv(&pv);
    let never = || offered_unwiped(&h, &entry);
    wait_never("the wipe-first starts", &never, || h.node_event("VolumeUsed", &entry.display().to_string()));
    drop(agent); // SIGKILL during the wipe-first
    let left = std::fs::read_dir(&many).map(|d| d.count()).unwrap_or(0);
    eprintln!("files left after the kill during the wipe-first: {left}");
    never_for(2, &never);
    let agent = h.agent(&config, &[]);
    let new = wait_never("published again after the wipe", &never, || h.available_at(&entry));
    assert!(!holds_tenant_data(&entry) && !many.exists(), "wiped before it was published as {new}");
    drop(agent);
}

/// The admin copies a Bound volume with `cp -a` (the root's attributes too) onto a fresh ext4
/// and mounts it at a new entry: the copy holds the tenant's data, so it is wiped first or
/// held; never offered with it. A fresh disk with an admin's files (never published) is
/// published as it is: nothing of it is wiped.
#[test]
fn a_cp_a_copy_of_a_used_volume_is_never_offered_and_a_fresh_disk_is_not_wiped() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("cp-a") else { return };
    let class = "ua-cp-a";
    let (disks, config) = h.fs_class(class);
    let agent = h.agent(&config, &[]);
    let orig = disks.join("orig");
    let (pv, uid, _) = used_ext4(&h, class, &orig, "ua-cp-a", 64);

    let staging = h.lab.path("staging");
    let (copy_dev, _) = h.lab.ext4_sized("copy", &staging, 64);
    run(Command::new("cp").arg("-a").arg(format!("{}/.", orig.display())).arg(&staging));
    eprintln!("the copy's root mark: {:?}", used_mark(&staging));
    h.lab.umount(&staging);
    let copy = disks.join("copy");
    h.lab.mount_dev(&copy_dev, &copy);
    assert!(holds_tenant_data(&copy));

    // And a fresh disk an admin prepared with its own files.
    let staging2 = h.lab.path("staging2");
    let (fresh_dev, _) = h.lab.ext4_sized("fresh", &staging2, 64);
    std::fs::write(staging2.join("admin"), b"admin data").unwrap();
    h.lab.umount(&staging2);
    let fresh = disks.join("fresh");
    h.lab.mount_dev(&fresh_dev, &fresh);

    let never = || offered_unwiped(&h, &copy);
    let decided = wait_never("the copy wiped or refused", &never, || decided(&h, &copy));
    eprintln!("the cp -a copy was {decided}");
    let fresh_pv = wait_never("the fresh disk published", &never, || h.available_at(&fresh));
    assert_eq!(std::fs::read(fresh.join("admin")).ok().as_deref(), Some(&b"admin data"[..]), "{fresh_pv}");
    assert!(h.node_event("VolumeUsed", &fresh.display().to_string()).is_none(), "the fresh disk was wiped");
    never_for(3, &never);
    assert!(holds_tenant_data(&orig), "the original keeps its data");
    assert_eq!(h.cp.pv_state(&pv), Some((uid, "Bound".to_string())));
    drop(agent);
}

/// A used raw block device (its PV force-deleted) is formatted by an admin and mounted in a
/// Filesystem class: the ledger relates the device, so it is wiped first (or held); never
/// published as if fresh, and the agent settles (published or refused) rather than wiping it
/// over and over.
#[test]
fn a_used_raw_device_formatted_afterwards_is_wiped_first_then_published() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("raw-then-fs") else { return };
    let (disks, blk) = (h.lab.dir("disks"), h.lab.dir("blk"));
    let (fs_class, blk_class) = ("ua-raw-then-fs-fs", "ua-raw-then-fs-blk");
    let config = h.config(
        "config",
        &[(fs_class, &disks, ""), (blk_class, &blk, "  volumeMode: Block\n  blockCleanMethod: zero\n")],
    );
    let (dev, _) = h.lab.loop_dev("d", 64);
    symlink(&dev, blk.join("d1")).unwrap();
    let agent = h.agent(&config, &[]);
    let pv = h.wait_published(&blk.join("d1"));
    h.claim("ua-raw-then-fs", blk_class, &pv, true);
    let uid = h.uid(&pv);
    let ledger = h.ledger(&h.node);
    wait_until("the ledger records the device", WAIT, || {
        let entries: Value = serde_json::from_slice(&std::fs::read(&ledger).ok()?).ok()?;
        entries["used"].as_array()?.iter().any(|e| e["pv"] == pv.as_str() && e["uid"] == uid.as_str()).then_some(())
    });
    std::fs::remove_file(blk.join("d1")).unwrap();
    wait_until("the Bound PV flagged missing", WAIT, || h.ann(&pv, ANN_MISSING));
    h.force_delete_pv(&pv);
    h.delete_claim("ua-raw-then-fs");

    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&dev));
    let f = disks.join("f");
    h.lab.mount_dev(&dev, &f);
    let path = f.display().to_string();
    let never = || {
        let (name, phase) = h.pv_at(&f)?;
        let wiped = h.node_event("VolumeUsed", &path).is_some();
        let refused = h.node_event("VolumeNotPublished", &path).is_some();
        (!wiped && !refused).then(|| format!("{path} published as {name} ({phase}) without a wipe-first"))
    };
    wait_never("the wipe-first starts", &never, || h.node_event("VolumeUsed", &path));
    let decided = wait_never("the formatted device published after its wipe, or refused", &never, || decided(&h, &f));
    eprintln!("the formatted raw device was {decided}");
    drop(agent);
}

//! The durable "used" mark on real mounts, loop devices and the real control plane, with the
//! agent (and node-cleanup) under their own RBAC.
//!
//! A disk that held a tenant's data carries a mark: the `trusted.local-static-provisioner.used`
//! attribute on a filesystem volume's root, and the agent's `used-disks.json` ledger for block
//! devices and device-backed filesystems. What a user must see, whatever happened to the PV
//! object or to where the disk is mounted:
//!
//! - a Bound disk moved to another entry (on a live node, on a re-created Node, two disks
//!   swapped, or to another node) is never published there, its PV says where it went
//!   (`volume-moved-to`, never `volume-stale`), node-cleanup never releases its claim, and
//!   putting it back clears the flags; a released PV whose path holds another tenant's disk
//!   is wiped only once its own disk is back;
//! - a used disk whose PV is gone (deleted with its finalizer forced off) is wiped before it is
//!   published again: at its old entry, at another one, as a re-linked block device, or on
//!   another node; so is a byte-for-byte clone of a Bound disk;
//! - a ledger that cannot be read holds block volumes back and is left as it is;
//! - PVs made by upstream get the mark once a claim uses them.
//!
//! Every "never" is checked on every look while waiting, not only at the end. Needs root.

use crate::support;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use local_static_provisioner::core::volumes::naming::pv_name;
use support::used_lab::*;
use support::{run, umount_when_idle, wait_until};

const ANN_MOVED_TO: &str = "local-static-provisioner.io/volume-moved-to";
const ANN_STALE: &str = "local-static-provisioner.io/volume-stale";
const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// Decisions about PVs of an earlier incarnation of the Node after 1 s instead of a minute.
const SUCCESSION: &[&str] = &["--succession-settle", "1s"];

// =============================================================================================
// A Bound disk that moved is kept, said where it went, and never published there

#[test]
fn a_bound_volume_moved_on_a_live_node_is_flagged_where_it_went_and_never_published_there() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("moved-live") else { return };
    let class = "um-moved-live";
    let (disks, config) = h.fs_class(class);
    let (v2, v2new) = (disks.join("v2"), disks.join("v2new"));
    h.lab.tmpfs(&v2, 8);
    let agent = h.agent(&config, &[]);
    let pv = h.wait_published(&v2);
    h.claim("um-moved-live", class, &pv, false);
    std::fs::write(v2.join("tenant"), TENANT).unwrap();
    let uid = h.uid(&pv);
    wait_until("the disk carries the mark of its PV", WAIT, || marked_for(&v2, &pv, &uid));

    h.lab.move_mount(&v2, &v2new);
    let never = || published_at(&h, &v2new, "the disk of a Bound PV, moved to another entry");
    let to = v2new.display().to_string();
    wait_never("the PV flagged missing, moved to the new entry", &never, || {
        (h.ann(&pv, ANN_MISSING).is_some() && h.ann(&pv, ANN_MOVED_TO).as_deref() == Some(to.as_str())).then_some(())
    });
    never_for(5, &never);
    assert!(holds_tenant_data(&v2new), "the tenant's data moved with the disk");
    assert_eq!(h.cp.pv_state(&pv), Some((uid.clone(), "Bound".to_string())));
    let refused = format!("its disk is already published as PV {pv} at {}", v2.display());
    wait_until("the new entry reported not published", WAIT, || h.node_event("VolumeNotPublished", &refused));
    wait_until("VolumeMissing event naming where the disk is", WAIT, || {
        h.cp.has_event(&pv, "VolumeMissing", &format!("its disk is at {to}")).then_some(())
    });
    assert!(agent.log_text().contains("volume not published"), "{}", agent.log_text());

    // Put back: the flags go, the claim never noticed.
    h.lab.move_mount(&v2new, &v2);
    wait_until("the flags cleared", WAIT, || {
        (h.ann(&pv, ANN_MISSING).is_none() && h.ann(&pv, ANN_MOVED_TO).is_none()).then_some(())
    });
    assert_eq!(h.cp.pv_state(&pv), Some((uid, "Bound".to_string())));
    let pvc = h.cp.get_json(&["pvc", "um-moved-live", "-n", "default"]).unwrap();
    assert_eq!((pvc["status"]["phase"].as_str(), pvc["spec"]["volumeName"].as_str()), (Some("Bound"), Some(&*pv)));
    assert!(holds_tenant_data(&v2));
    assert!(h.pv_at(&v2new).is_none());
    drop(agent);
}

#[test]
fn a_bound_volume_moved_on_a_recreated_node_is_moved_not_stale_and_node_cleanup_keeps_its_claim() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("moved-reborn") else { return };
    let class = "um-moved-reborn";
    let (disks, config) = h.fs_class(class);
    // kept: bound, moved to kept-new; lost: bound, unmounted (shows node-cleanup does act).
    let (kept, kept_new, lost) = (disks.join("kept"), disks.join("kept-new"), disks.join("lost"));
    h.lab.tmpfs(&kept, 8);
    h.lab.tmpfs(&lost, 8);
    let agent = h.agent(&config, SUCCESSION);
    let (pv_kept, pv_lost) = (h.wait_published(&kept), h.wait_published(&lost));
    h.claim("um-reborn-kept", class, &pv_kept, false);
    h.claim("um-reborn-lost", class, &pv_lost, false);
    std::fs::write(kept.join("tenant"), TENANT).unwrap();
    let (kept_uid, kept_claim) = (h.uid(&pv_kept), h.claim_uid("um-reborn-kept").unwrap());
    wait_until("the disk carries the mark of its PV", WAIT, || marked_for(&kept, &pv_kept, &kept_uid));
    agent.stop();

    // The Node is deleted and registers again; meanwhile one disk moved and one is gone.
    let new_uid = h.recreate_node();
    h.lab.move_mount(&kept, &kept_new);
    h.lab.umount(&lost);
    let agent = h.agent(&config, SUCCESSION);
    let never = || {
        published_at(&h, &kept_new, "the disk of a Bound PV of the earlier incarnation, moved")
            .or_else(|| h.ann(&pv_kept, ANN_STALE).map(|at| format!("{pv_kept} was flagged stale at {at}")))
    };
    let to = kept_new.display().to_string();
    wait_never("the PV flagged moved to the new entry", &never, || {
        (h.ann(&pv_kept, ANN_MOVED_TO).as_deref() == Some(to.as_str())).then_some(())
    });
    wait_never("the lost disk's PV flagged stale", &never, || h.ann(&pv_lost, ANN_STALE));
    wait_never("VolumeMoved event naming where the disk is", &never, || {
        h.cp.has_event(&pv_kept, "VolumeMoved", &format!("its disk is at {to}")).then_some(())
    });
    let refused = format!("its disk is already published as PV {pv_kept} at {}", kept.display());
    wait_never("the new entry reported not published", &never, || h.node_event("VolumeNotPublished", &refused));

    // node-cleanup for the class, 1 s grace: it releases the lost claim, never the moved one.
    let nc = h.node_cleanup(class);
    let never = || {
        never().or_else(|| match (h.claim_uid("um-reborn-kept"), h.cp.pv_state(&pv_kept)) {
            (Some(c), Some((u, _))) if c == kept_claim && u == kept_uid => None,
            (c, p) => Some(format!("the moved disk's claim or PV was released: claim {c:?}, PV {p:?}")),
        })
    };
    wait_never("node-cleanup releases the lost disk's claim", &never, || {
        h.claim_uid("um-reborn-lost").is_none().then_some(())
    });
    never_for(5, &never);
    assert_eq!(h.cp.pv_state(&pv_kept), Some((kept_uid, "Bound".to_string())));
    assert!(holds_tenant_data(&kept_new));
    assert!(!h.ann(&pv_kept, ANN_PROVISIONED_BY).unwrap().ends_with(&new_uid), "not re-adopted while moved");
    drop(nc);
    drop(agent);
}

#[test]
fn two_bound_disks_swapped_on_a_recreated_node_are_kept_and_readopted_when_swapped_back() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("swapped") else { return };
    let park = h.lab.dir("park");
    let class = "um-swapped";
    let (disks, config) = h.fs_class(class);
    let (a, b, lost) = (disks.join("a"), disks.join("b"), disks.join("lost"));
    for v in [&a, &b, &lost] {
        h.lab.tmpfs(v, 8);
    }
    let agent = h.agent(&config, SUCCESSION);
    let (pv_a, pv_b, pv_lost) = (h.wait_published(&a), h.wait_published(&b), h.wait_published(&lost));
    for (claim, pv) in [("um-swapped-a", &pv_a), ("um-swapped-b", &pv_b), ("um-swapped-lost", &pv_lost)] {
        h.claim(claim, class, pv, false);
    }
    std::fs::write(a.join("tenant"), b"data of a").unwrap();
    std::fs::write(b.join("tenant"), b"data of b").unwrap();
    let (uid_a, uid_b) = (h.uid(&pv_a), h.uid(&pv_b));
    let claims = [h.claim_uid("um-swapped-a").unwrap(), h.claim_uid("um-swapped-b").unwrap()];
    wait_until("both disks carry their mark", WAIT, || {
        marked_for(&a, &pv_a, &uid_a).and(marked_for(&b, &pv_b, &uid_b))
    });
    agent.stop();

    let new_uid = h.recreate_node();
    let swap = || {
        h.lab.move_mount(&a, &park.join("x"));
        h.lab.move_mount(&b, &a);
        h.lab.move_mount(&park.join("x"), &b);
    };
    swap();
    h.lab.umount(&lost);
    let agent = h.agent(&config, SUCCESSION);
    // Only the original PVs are ever at a and b; neither is stale; both claims stay.
    let never = || {
        for (path, uid) in [(&a, &uid_a), (&b, &uid_b)] {
            if let Some(pv) = h.pvs_at(path).into_iter().find(|pv| pv["metadata"]["uid"] != uid.as_str()) {
                return Some(format!("a new PV {} appeared at {}", pv["metadata"]["name"], path.display()));
            }
        }
        for pv in [&pv_a, &pv_b] {
            if let Some(at) = h.ann(pv, ANN_STALE) {
                return Some(format!("{pv} was flagged stale at {at}"));
            }
        }
        let now = [h.claim_uid("um-swapped-a"), h.claim_uid("um-swapped-b")];
        (now != claims.clone().map(Some)).then(|| format!("a swapped disk's claim was released: {now:?}"))
    };
    let (at_a, at_b) = (a.display().to_string(), b.display().to_string());
    wait_never("each PV flagged moved to the other's path", &never, || {
        (h.ann(&pv_a, ANN_MOVED_TO).as_deref() == Some(at_b.as_str())
            && h.ann(&pv_b, ANN_MOVED_TO).as_deref() == Some(at_a.as_str()))
        .then_some(())
    });
    let nc = h.node_cleanup(class);
    wait_never("node-cleanup releases the lost disk's claim", &never, || {
        h.claim_uid("um-swapped-lost").is_none().then_some(())
    });
    never_for(5, &never);
    assert_eq!(std::fs::read(a.join("tenant")).unwrap(), b"data of b");
    assert_eq!(std::fs::read(b.join("tenant")).unwrap(), b"data of a");

    // Swapped back: both re-adopted by the new Node, and the flags go.
    swap();
    for pv in [&pv_a, &pv_b] {
        wait_never(&format!("{pv} re-adopted"), &never, || {
            h.ann(pv, ANN_PROVISIONED_BY)?.ends_with(&new_uid).then_some(())
        });
    }
    for (pv, uid) in [(&pv_a, &uid_a), (&pv_b, &uid_b)] {
        assert_eq!(h.cp.pv_state(pv), Some((uid.clone(), "Bound".to_string())));
    }
    assert_eq!(std::fs::read(a.join("tenant")).unwrap(), b"data of a");
    assert_eq!(std::fs::read(b.join("tenant")).unwrap(), b"data of b");
    // "Put the disk back and the flags go" (docs/data-safety.md).
    let flags = |pv: &str| [ANN_MOVED_TO, ANN_STALE, ANN_MISSING].map(|k| h.ann(pv, k));
    let since = Instant::now();
    loop {
        let now = [flags(&pv_a), flags(&pv_b)];
        if now.iter().flatten().all(Option::is_none) {
            break;
        }
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "30 s after re-adoption the PVs still carry [moved-to, stale, missing]: {pv_a}: {:?}, {pv_b}: {:?}",
            now[0],
            now[1]
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    never_for(3, &never);
    drop(nc);
    drop(agent);
}

// =============================================================================================
// A used disk whose PV is gone is wiped before it is published again

/// A Bound ext4 disk is unmounted, its claim deleted and its PV deleted with the finalizer
/// forced off (no wipe), then the disk is mounted again at `back`: the agent wipes it before
/// it publishes it, and the mark on the disk then names the new PV.
fn used_disk_comes_back(name: &str, back_entry: &str) -> Option<String> {
    let h = Harness::new(name)?;
    let class = format!("um-{name}");
    let (disks, config) = h.fs_class(&class);
    let entry = disks.join("e");
    let (dev, _) = h.lab.ext4("e", &entry);
    let agent = h.agent(&config, &[]);
    let old = h.wait_published(&entry);
    let claim = format!("um-{name}");
    h.claim(&claim, &class, &old, false);
    std::fs::write(entry.join("tenant"), TENANT).unwrap();
    let old_uid = h.uid(&old);
    wait_until("the disk carries the mark of its PV", WAIT, || marked_for(&entry, &old, &old_uid));

    h.lab.umount(&entry);
    wait_until("the Bound PV flagged missing", WAIT, || h.ann(&old, ANN_MISSING));
    h.delete_claim(&claim);
    h.force_delete_pv(&old);

    let back = disks.join(back_entry);
    h.lab.mount_dev(&dev, &back);
    assert!(holds_tenant_data(&back), "the disk came back with the tenant's data");
    let never = || offered_unwiped(&h, &back);
    let new = wait_never("the disk published again", &never, || {
        h.pv_at(&back).filter(|(_, phase)| phase == "Available").map(|(name, _)| name)
    });
    assert!(!holds_tenant_data(&back), "wiped before it was published");
    let new_uid = h.uid(&new);
    assert_ne!(new_uid, old_uid);
    wait_until("the mark names the new PV", WAIT, || marked_for(&back, &new, &new_uid));
    let used = wait_until("VolumeUsed event on the Node", WAIT, || {
        h.node_event("VolumeUsed", &format!("volume at {} held the data of PV {old}", back.display()))
    });
    assert!(
        h.node_event("VolumeCleaned", &format!("Used volume at {} wiped before it is published", back.display()))
            .is_some()
    );
    drop(agent);
    Some(used)
}

#[test]
fn a_used_disk_back_at_its_entry_after_its_pv_was_force_deleted_is_wiped_first() {
    let _area = support::area(module_path!());
    let Some(note) = used_disk_comes_back("back-same", "e") else { return };
    // What the operator reads: one sentence, no run of blanks from a broken line continuation.
    assert!(!note.contains("  "), "the VolumeUsed event note is garbled: {note:?}");
}

#[test]
fn a_used_disk_back_at_another_entry_after_its_pv_was_force_deleted_is_wiped_first() {
    let _area = support::area(module_path!());
    used_disk_comes_back("back-other", "e2");
}

#[test]
fn a_used_block_device_relinked_after_its_pv_was_force_deleted_is_wiped_first() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("block-relinked") else { return };
    let blk = h.lab.dir("blk");
    let class = "um-block-relinked";
    // zero: the whole device, so a pattern anywhere on it tells whether it was wiped.
    let config = h.config("config", &[(class, &blk, "  volumeMode: Block\n  blockCleanMethod: zero\n")]);
    let (dev, _) = h.lab.loop_dev("d", 32);
    symlink(&dev, blk.join("d1")).unwrap();
    let agent = h.agent(&config, &[]);
    let old = h.wait_published(&blk.join("d1"));
    h.claim("um-block-relinked", class, &old, true);
    write_pattern(&dev);
    let old_uid = h.uid(&old);
    let ledger = h.ledger(&h.node);
    wait_until("the ledger records the device for its PV", WAIT, || {
        (ledger_entry(&ledger, &old)?["uid"] == old_uid.as_str()).then_some(())
    });

    // The entry goes, the PV is deleted with its finalizer forced off, the device comes back
    // under another name.
    std::fs::remove_file(blk.join("d1")).unwrap();
    wait_until("the Bound PV flagged missing", WAIT, || h.ann(&old, ANN_MISSING));
    h.force_delete_pv(&old);
    h.delete_claim("um-block-relinked");
    let d2 = blk.join("d2");
    symlink(&dev, &d2).unwrap();
    let never = || {
        let (name, phase) = h.pv_at(&d2)?;
        has_pattern(&dev).then(|| format!("{} published as {name} ({phase}) with the tenant's bytes", d2.display()))
    };
    let new = wait_never("the device published again", &never, || {
        h.pv_at(&d2).filter(|(_, phase)| phase == "Available").map(|(name, _)| name)
    });
    assert!(!has_pattern(&dev), "wiped before it was published");
    wait_until("VolumeUsed event on the Node", WAIT, || {
        h.node_event("VolumeUsed", &format!("volume at {} held the data of PV {old}", d2.display()))
    });
    let new_uid = h.uid(&new);
    wait_until("the ledger records the device for the new PV", WAIT, || {
        (ledger_entry(&ledger, &new)?["uid"] == new_uid.as_str()).then_some(())
    });
    assert!(ledger_entry(&ledger, &old).is_none(), "the wipe cleared the old entry");
    drop(agent);
}

/// (Re)writes the partition table of loop device `dev` (attached with partition scanning) as
/// one DOS partition numbered `number` that starts at sector 2048 and is 32 MiB long, and has
/// the kernel drop its old partitions and add that one: the partition's node, once it shows.
fn one_partition(dev: &Path, number: u32) -> PathBuf {
    use std::io::Write as _;
    let script = format!("label: dos\nunit: sectors\n\n{}p{number} : start=2048, size=65536, type=83\n", dev.display());
    let mut sfdisk = Command::new("sfdisk");
    sfdisk.args(["-q", "--no-reread"]).arg(dev).stdin(std::process::Stdio::piped());
    let mut child = sfdisk.spawn().unwrap();
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success(), "sfdisk {script:?}");
    // `partx -d` fails when there is no partition yet, which is fine.
    let _ = Command::new("partx").arg("-d").arg(dev).output();
    run(Command::new("partx").arg("-a").arg(dev));
    let part = PathBuf::from(format!("{}p{number}", dev.display()));
    wait_until(&format!("the kernel shows {}", part.display()), Duration::from_secs(20), || {
        part.exists().then_some(())
    });
    part
}

/// A used partition whose table was rewritten so that the same start is another partition
/// number (its PV force-deleted in between) shows the same bytes: it is wiped before it is
/// offered again, never published with the tenant's data because its number changed.
#[test]
fn a_used_partition_renumbered_at_the_same_start_is_wiped_before_it_is_offered() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("renumbered") else { return };
    let blk = h.lab.dir("blk");
    let class = "um-renumbered";
    let config = h.config("config", &[(class, &blk, "  volumeMode: Block\n  blockCleanMethod: zero\n")]);
    let img = h.lab.dir("images").join("d.img");
    run(Command::new("truncate").arg("-s").arg("64M").arg(&img));
    let dev = h.lab.loop_on_partscan(&img);
    let part1 = one_partition(&dev, 1);
    symlink(&part1, blk.join("p1")).unwrap();
    let agent = h.agent(&config, &[]);
    let old = h.wait_published(&blk.join("p1"));
    h.claim("um-renumbered", class, &old, true);
    write_pattern(&part1);
    let old_uid = h.uid(&old);
    let ledger = h.ledger(&h.node);
    wait_until("the ledger records the partition for its PV", WAIT, || {
        (ledger_entry(&ledger, &old)?["uid"] == old_uid.as_str()).then_some(())
    });
    let recorded = ledger_entry(&ledger, &old).unwrap()["identity"].as_str().unwrap().to_string();
    assert!(recorded.contains("/part1@2048"), "the ledger names partition 1 at sector 2048: {recorded}");

    std::fs::remove_file(blk.join("p1")).unwrap();
    wait_until("the Bound PV flagged missing", WAIT, || h.ann(&old, ANN_MISSING));
    h.force_delete_pv(&old);
    h.delete_claim("um-renumbered");
    // The administrator rewrites the table: the same start is now partition 2.
    let part2 = one_partition(&dev, 2);
    assert!(!part1.exists(), "partition 1 is gone");
    assert!(has_pattern(&part2), "partition 2 shows the tenant's bytes");
    let p2 = blk.join("p2");
    symlink(&part2, &p2).unwrap();
    let never = || {
        let (name, phase) = h.pv_at(&p2)?;
        has_pattern(&part2).then(|| format!("{} published as {name} ({phase}) with the tenant's bytes", p2.display()))
    };
    wait_never("the renumbered partition published again", &never, || {
        h.pv_at(&p2).filter(|(_, phase)| phase == "Available").map(|(name, _)| name)
    });
    assert!(!has_pattern(&part2), "wiped before it was published");
    wait_until("VolumeUsed event on the Node", WAIT, || {
        h.node_event("VolumeUsed", &format!("volume at {} held the data of PV {old}", p2.display()))
    });
    drop(agent);
}

// =============================================================================================
// Constructions

/// A byte-for-byte clone of a Bound ext4 disk (same filesystem UUID, same mark) attached and
/// mounted at another entry while the original PV lives: never offered with the data on it.
#[test]
fn a_clone_of_a_bound_disk_is_never_offered_with_the_tenants_data() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("clone") else { return };
    let class = "um-clone";
    let (disks, config) = h.fs_class(class);
    let orig = disks.join("orig");
    let (_, img) = h.lab.ext4("orig", &orig);
    let agent = h.agent(&config, &[]);
    let pv = h.wait_published(&orig);
    h.claim("um-clone", class, &pv, false);
    std::fs::write(orig.join("tenant"), TENANT).unwrap();
    let uid = h.uid(&pv);
    wait_until("the disk carries the mark of its PV", WAIT, || marked_for(&orig, &pv, &uid));

    run(Command::new("fsfreeze").arg("-f").arg(&orig));
    let copy = h.lab.path("images/clone.img");
    let copied = Command::new("cp").arg("--sparse=always").arg(&img).arg(&copy).status();
    run(Command::new("fsfreeze").arg("-u").arg(&orig));
    assert!(copied.unwrap().success());
    // Checked mounted outside the discovery directory first, then moved in: the agent, which
    // sees the mount at once, may wipe the clone before an assertion made after it appears.
    let clone = disks.join("clone");
    let outside = h.lab.path("clone-outside");
    h.lab.mount_dev(&h.lab.loop_on(&copy), &outside);
    assert!(holds_tenant_data(&outside) && used_mark(&outside).is_some_and(|m| m["pv"] == pv.as_str()));
    h.lab.move_mount(&outside, &clone);

    let never = || offered_unwiped(&h, &clone);
    let refused_or_wiped = wait_never("the clone wiped and published, or refused", &never, || {
        if let Some((name, phase)) = h.pv_at(&clone).filter(|(_, phase)| phase == "Available") {
            return Some(format!("published as {name} ({phase}) after a wipe"));
        }
        h.node_event("VolumeNotPublished", &clone.display().to_string()).map(|note| format!("refused: {note}"))
    });
    eprintln!("the clone was {refused_or_wiped}");
    never_for(3, &never);
    assert!(holds_tenant_data(&orig), "the original keeps its data");
    assert_eq!(h.cp.pv_state(&pv), Some((uid, "Bound".to_string())));
    assert!(h.ann(&pv, ANN_MISSING).is_none());
    drop(agent);
}

/// The agent restarts with its ledger corrupted: volumes the ledger may have recorded (block
/// devices, which only the ledger can vouch for, and unmarked directories, which may be a
/// directory of a used filesystem) are not published, the ledger is left for an operator to
/// repair, and the repair is taken up without a restart.
#[test]
fn a_corrupt_ledger_holds_block_volumes_back_and_is_left_as_it_is() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("corrupt-ledger") else { return };
    let (blk, fs) = (h.lab.dir("blk"), h.lab.dir("fs"));
    let (class_blk, class_fs) = ("um-corrupt-blk", "um-corrupt-fs");
    let config = h.config(
        "config",
        &[(class_blk, &blk, "  volumeMode: Block\n  blockCleanMethod: quick\n"), (class_fs, &fs, "")],
    );
    let (d1, _) = h.lab.loop_dev("d1", 16);
    symlink(&d1, blk.join("d1")).unwrap();
    let agent = h.agent(&config, &[]);
    let pv1 = h.wait_published(&blk.join("d1"));
    let uid1 = h.uid(&pv1);
    let ledger = h.ledger(&h.node);
    wait_until("the ledger records d1", WAIT, || ledger_entry(&ledger, &pv1));
    agent.stop();

    let junk = b"{\"this is\": not a ledger";
    std::fs::write(&ledger, junk).unwrap();
    let (d2, _) = h.lab.loop_dev("d2", 16);
    symlink(&d2, blk.join("d2")).unwrap();
    h.lab.tmpfs(&fs.join("t"), 8);
    let agent = h.agent(&config, &[]);
    let never = || {
        published_at(&h, &blk.join("d2"), "a block device the unreadable ledger may record")
            .or_else(|| published_at(&h, &fs.join("t"), "a directory the unreadable ledger may record"))
    };
    let held = format!("volume at {} not published", blk.join("d2").display());
    let note = wait_never("d2 reported not published", &never, || h.node_event("VolumeNotPublished", &held));
    assert!(note.contains("cannot be checked") && note.contains("used-disk ledger"), "{note}");
    never_for(3, &never);
    assert!(agent.log_text().contains("the used-disk ledger is unreadable"), "{}", agent.log_text());
    assert_eq!(std::fs::read(&ledger).unwrap(), junk, "the ledger is left as it is");
    assert_eq!(h.cp.pv_state(&pv1), Some((uid1, "Available".to_string())), "the published device is untouched");
    let metrics = agent.admin_get("/metrics");
    assert!(metrics.contains("local_static_provisioner_unpublished_entries{reason=\"used-unknown\"} 2"), "{metrics}");
    // The operator repairs the ledger (here: by emptying it): both
    // volumes are published at the next pass, without a restart.
    let repaired = serde_json::json!({ "used": [] });
    std::fs::write(&ledger, serde_json::to_vec(&repaired).unwrap()).unwrap();
    wait_until("the tmpfs volume published after the repair", WAIT, || {
        h.pv_at(&fs.join("t")).filter(|(_, p)| p == "Available")
    });
    wait_until("d2 published after the repair", WAIT, || h.pv_at(&blk.join("d2")).filter(|(_, p)| p == "Available"));
    drop(agent);
}

/// PVs made by upstream (no identity, no mark) are adopted; the Bound one gets the mark at
/// once, the Available one only when a claim binds it.
#[test]
fn upstream_pvs_get_the_used_mark_once_claimed() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("upstream") else { return };
    let node_uid = h.cp.get_json(&["node", &h.node]).unwrap()["metadata"]["uid"].as_str().unwrap().to_string();
    let class = "um-upstream";
    let (disks, config) = h.fs_class(class);
    let (u1, u2) = (disks.join("u1"), disks.join("u2"));
    h.lab.tmpfs(&u1, 8);
    h.lab.tmpfs(&u2, 8);
    let (pv1, pv2) = (pv_name("u1", &h.node, class), pv_name("u2", &h.node, class));
    for (pv, path) in [(&pv1, &u1), (&pv2, &u2)] {
        h.cp.apply(&format!(
            "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: {pv}\n  annotations:\n    pv.kubernetes.io/provisioned-by: local-volume-provisioner-{node}-{node_uid}\nspec:\n  capacity: {{storage: 8Mi}}\n  accessModes: [ReadWriteOnce]\n  storageClassName: {class}\n  persistentVolumeReclaimPolicy: Delete\n  volumeMode: Filesystem\n  local: {{path: {path}}}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [{node}]}}]\n",
            node = h.node,
            path = path.display()
        ));
    }
    h.claim("um-upstream-1", class, &pv1, false);
    std::fs::write(u1.join("tenant"), TENANT).unwrap();

    let agent = h.agent(&config, &[]);
    for pv in [&pv1, &pv2] {
        wait_until(&format!("{pv} adopted"), WAIT, || {
            (h.pv(pv)?["metadata"]["labels"]["local-static-provisioner.io/node"] == h.node.as_str()).then_some(())
        });
    }
    let uid1 = h.uid(&pv1);
    wait_until("the Bound upstream PV's disk marked", WAIT, || marked_for(&u1, &pv1, &uid1));
    let unmarked = || used_mark(&u2).map(|m| format!("the unclaimed upstream PV's disk was marked: {m}"));
    never_for(3, &unmarked);
    h.claim("um-upstream-2", class, &pv2, false);
    let uid2 = h.uid(&pv2);
    wait_until("the upstream PV's disk marked once claimed", WAIT, || marked_for(&u2, &pv2, &uid2));
    assert!(holds_tenant_data(&u1));
    drop(agent);
}

/// A Bound disk moved to a discovery directory of another node (on this host, two agents): not
/// published there while its PV lives; once the PV is deleted unwiped, wiped before it is.
#[test]
fn a_bound_disk_moved_to_another_node_is_held_then_wiped_once_its_pv_is_gone() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("other-node") else { return };
    let other = format!("{}-b", h.node);
    h.cp.create_node(&other);
    let class = "um-other-node";
    let (disks_a, disks_b) = (h.lab.dir("a"), h.lab.dir("b"));
    let config_a = h.config("config-a", &[(class, &disks_a, "")]);
    let config_b = h.config("config-b", &[(class, &disks_b, "")]);
    let (v, w) = (disks_a.join("v"), disks_b.join("w"));
    h.lab.tmpfs(&v, 8);
    let agent_a = h.agent(&config_a, &[]);
    let agent_b = h.agent_on(&other, &config_b, &[]);
    let pv = h.wait_published(&v);
    h.claim("um-other-node", class, &pv, false);
    std::fs::write(v.join("tenant"), TENANT).unwrap();
    let uid = h.uid(&pv);
    wait_until("the disk carries the mark of its PV", WAIT, || marked_for(&v, &pv, &uid));

    h.lab.move_mount(&v, &w);
    let never = || {
        let (name, phase) = h.pv_at(&w)?;
        (h.pv(&pv).is_some() || holds_tenant_data(&w))
            .then(|| format!("{} published on {other} as {name} ({phase}) while it holds {pv}'s data", w.display()))
    };
    let refused = format!("its disk is already published as PV {pv} at {}", v.display());
    wait_never("the other node reports it not published", &never, || {
        h.cp.has_event(&other, "VolumeNotPublished", &refused).then_some(())
    });
    never_for(3, &never);
    assert!(holds_tenant_data(&w));

    // The PV goes without a wipe (as node-cleanup or an operator would do it).
    h.delete_claim("um-other-node");
    h.force_delete_pv(&pv);
    let new = wait_never("the disk wiped and published on the other node", &never, || {
        h.pv_at(&w).filter(|(_, phase)| phase == "Available").map(|(name, _)| name)
    });
    assert!(!holds_tenant_data(&w));
    assert!(h.cp.has_event(&other, "VolumeUsed", &format!("volume at {} held the data of PV {pv}", w.display())));
    let new_uid = h.uid(&new);
    wait_until("the mark names the new PV", WAIT, || marked_for(&w, &new, &new_uid));
    drop(agent_b);
    drop(agent_a);
}

/// Two Bound disks swapped on a live node, then one claim deleted: its path holds the other
/// tenant's disk, so nothing is wiped until its own disk is back; then only it is wiped.
#[test]
fn a_released_pv_whose_path_holds_another_tenants_disk_is_wiped_only_once_its_own_is_back() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("swap-release") else { return };
    let park = h.lab.dir("park");
    let class = "um-swap-release";
    let (disks, config) = h.fs_class(class);
    let (a, b) = (disks.join("a"), disks.join("b"));
    h.lab.tmpfs(&a, 8);
    h.lab.tmpfs(&b, 8);
    let agent = h.agent(&config, &[]);
    let (pv_a, pv_b) = (h.wait_published(&a), h.wait_published(&b));
    h.claim("um-swap-release-a", class, &pv_a, false);
    h.claim("um-swap-release-b", class, &pv_b, false);
    std::fs::write(a.join("tenant"), b"data of a").unwrap();
    std::fs::write(b.join("tenant"), b"data of b").unwrap();
    let (uid_a, uid_b) = (h.uid(&pv_a), h.uid(&pv_b));
    wait_until("both disks carry their mark", WAIT, || {
        marked_for(&a, &pv_a, &uid_a).and(marked_for(&b, &pv_b, &uid_b))
    });
    let swap = || {
        h.lab.move_mount(&a, &park.join("x"));
        h.lab.move_mount(&b, &a);
        h.lab.move_mount(&park.join("x"), &b);
    };
    swap();
    let (at_a, at_b) = (a.display().to_string(), b.display().to_string());
    let new_pv = || {
        [(&a, &uid_a), (&b, &uid_b)].into_iter().find_map(|(path, uid)| {
            let pv = h.pvs_at(path).into_iter().find(|pv| pv["metadata"]["uid"] != uid.as_str())?;
            Some(format!("a new PV {} appeared at {}", pv["metadata"]["name"], path.display()))
        })
    };
    let both_kept = || {
        let now = [std::fs::read(a.join("tenant")).ok(), std::fs::read(b.join("tenant")).ok()];
        (now != [Some(b"data of b".to_vec()), Some(b"data of a".to_vec())])
            .then(|| format!("a swapped tenant's data changed: {now:?}"))
    };
    let never = || new_pv().or_else(both_kept);
    wait_never("each PV flagged missing, moved to the other's path", &never, || {
        let flagged =
            |pv: &str, to: &str| h.ann(pv, ANN_MISSING).is_some() && h.ann(pv, ANN_MOVED_TO).as_deref() == Some(to);
        (flagged(&pv_a, &at_b) && flagged(&pv_b, &at_a)).then_some(())
    });

    // A's claim goes: its PV wants a wipe, but the disk at its path is B's.
    h.delete_claim("um-swap-release-a");
    wait_never("A's PV released", &never, || (h.cp.pv_state(&pv_a)?.1 == "Released").then_some(()));
    never_for(5, &never);
    assert_eq!(h.cp.pv_state(&pv_b), Some((uid_b.clone(), "Bound".to_string())));

    // Swapped back: A's disk is wiped and published again; B's tenant keeps everything.
    swap();
    let b_kept = || {
        let now = std::fs::read(b.join("tenant")).ok();
        (now.as_deref() != Some(&b"data of b"[..])).then(|| format!("B's data changed: {now:?}"))
    };
    let never = || {
        b_kept().or_else(|| {
            let (name, phase) = h.pv_at(&a).filter(|_| h.cp.pv_state(&pv_a).is_none_or(|(u, _)| u != uid_a))?;
            a.join("tenant").exists().then(|| format!("{at_a} published as {name} ({phase}) with A's data"))
        })
    };
    wait_never("A's disk wiped and published again", &never, || {
        let (uid, phase) = h.cp.pv_state(&pv_a)?;
        (uid != uid_a && phase == "Available").then_some(())
    });
    assert!(!a.join("tenant").exists());
    wait_never("B's flags cleared", &never, || {
        (h.ann(&pv_b, ANN_MISSING).is_none() && h.ann(&pv_b, ANN_MOVED_TO).is_none()).then_some(())
    });
    assert_eq!(h.cp.pv_state(&pv_b), Some((uid_b, "Bound".to_string())));
    drop(agent);
}

// ---------------------------------------------------------------------------------------------
// What the mark must not do: wipe a volume that held nobody's data

/// Two directories of one ext4 disk bound at two entries (upstream's shared-disk layout): a new
/// sibling next to a Bound one is published as it is (its files kept), never taken for the used
/// one; a subdirectory of a used tmpfs bound at a new entry after its PV was force-deleted is
/// not published with the tenant's files.
#[test]
fn siblings_on_a_shared_disk_stay_apart_and_a_subdirectory_of_a_used_volume_is_not_offered() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("siblings") else { return };
    let class = "um-siblings";
    let (disks, config) = h.fs_class(class);
    let shared = h.lab.path("shared");
    h.lab.ext4("shared", &shared);
    for dir in ["a", "b"] {
        std::fs::create_dir_all(shared.join(dir)).unwrap();
    }
    let (a, b) = (disks.join("a"), disks.join("b"));
    std::fs::create_dir_all(&a).unwrap();
    run(Command::new("mount").arg("--bind").arg(shared.join("a")).arg(&a));
    let agent = h.agent(&config, &[]);
    let pv_a = h.wait_published(&a);
    h.claim("um-siblings-a", class, &pv_a, false);
    std::fs::write(a.join("tenant"), TENANT).unwrap();
    let uid_a = h.uid(&pv_a);
    wait_until("a carries its mark", WAIT, || marked_for(&a, &pv_a, &uid_a));
    // The administrator adds a sibling directory, with a file of their own in it.
    std::fs::write(shared.join("b/seed"), b"admin data").unwrap();
    std::fs::create_dir_all(&b).unwrap();
    run(Command::new("mount").arg("--bind").arg(shared.join("b")).arg(&b));
    let never = || (!b.join("seed").exists()).then(|| format!("{} was wiped: it held nobody's data", b.display()));
    wait_never("the sibling published", &never, || h.pv_at(&b).filter(|(_, p)| p == "Available"));
    never_for(2, &never);
    assert!(holds_tenant_data(&a), "the Bound sibling is untouched");
    assert_eq!(h.cp.pv_state(&pv_a).map(|s| s.1).as_deref(), Some("Bound"));

    // A tmpfs volume is used, then a subdirectory of it is bound at a new entry and its PV is
    // deleted with the finalizer forced off: the subdirectory holds the tenant's data.
    let t = disks.join("t");
    h.lab.tmpfs(&t, 8);
    let pv_t = h.wait_published(&t);
    h.claim("um-siblings-t", class, &pv_t, false);
    std::fs::create_dir_all(t.join("sub")).unwrap();
    std::fs::write(t.join("sub/tenant"), TENANT).unwrap();
    let uid_t = h.uid(&pv_t);
    wait_until("t carries its mark", WAIT, || marked_for(&t, &pv_t, &uid_t));
    let t2 = disks.join("t2");
    std::fs::create_dir_all(&t2).unwrap();
    run(Command::new("mount").arg("--bind").arg(t.join("sub")).arg(&t2));
    // The original entry goes (the bind keeps the tmpfs alive), and so does its PV.
    umount_when_idle(&t);
    h.delete_claim("um-siblings-t");
    h.force_delete_pv(&pv_t);
    let never = || offered_unwiped(&h, &t2);
    never_for(5, &never);
    drop(agent);
}

/// An unbound volume whose mount vanishes is withdrawn; when it comes back it is published as
/// it was, without a wipe: the agent recorded that no claim was ever on it.
#[test]
fn an_unclaimed_volume_withdrawn_and_back_is_published_as_it_was() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("withdrawn") else { return };
    let class = "um-withdrawn";
    let (disks, config) = h.fs_class(class);
    let entry = disks.join("w");
    let (dev, _) = h.lab.ext4("w", &entry);
    std::fs::write(entry.join("seed"), b"admin data").unwrap();
    let agent = h.agent(&config, &[]);
    let old = h.wait_published(&entry);
    let uid = h.uid(&old);
    wait_until("the disk carries the mark of its PV", WAIT, || marked_for(&entry, &old, &uid));
    h.lab.umount(&entry);
    wait_until("the unbound PV withdrawn", WAIT, || h.cp.pv_state(&old).is_none().then_some(()));
    h.lab.mount_dev(&dev, &entry);
    let new =
        wait_until("published again", WAIT, || h.pv_at(&entry).filter(|(_, p)| p == "Available").map(|(name, _)| name));
    assert_eq!(new, old, "same entry, same name");
    assert!(entry.join("seed").exists(), "not wiped: no claim was ever on it");
    assert!(h.node_event("VolumeUsed", &entry.display().to_string()).is_none());
    drop(agent);
}

/// A used disk with no stable device ID (zram: nothing but its device number names it) whose PV
/// was force-deleted is wiped first and published: the wipe-first does not wait for an
/// operator's confirmation of a PV that does not exist.
#[test]
fn a_used_disk_without_a_stable_id_is_wiped_first_without_waiting_for_a_confirmation() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("noid") else { return };
    let Some(zram) = support::Zram::new(64) else {
        support::cannot_run(
            "a_used_disk_without_a_stable_id_is_wiped_first_without_waiting_for_a_confirmation",
            "no zram in this kernel",
        );
        return;
    };
    let class = "um-noid";
    let (disks, config) = h.fs_class(class);
    let entry = disks.join("z");
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&zram.device));
    h.lab.mount_dev(&zram.device, &entry);
    let agent = h.agent(&config, &[]);
    let old = h.wait_published(&entry);
    h.claim("um-noid", class, &old, false);
    std::fs::write(entry.join("tenant"), TENANT).unwrap();
    let uid = h.uid(&old);
    wait_until("the disk carries the mark of its PV", WAIT, || marked_for(&entry, &old, &uid));
    h.lab.umount(&entry);
    h.delete_claim("um-noid");
    h.force_delete_pv(&old);
    h.lab.mount_dev(&zram.device, &entry);
    let never = || offered_unwiped(&h, &entry);
    wait_never("published again", &never, || h.pv_at(&entry).filter(|(_, p)| p == "Available"));
    assert!(!holds_tenant_data(&entry));
    h.lab.umount(&entry);
    drop(agent);
}

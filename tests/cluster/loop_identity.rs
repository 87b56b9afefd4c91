//! Loop devices are identified by what they are (the device number of the backing file's
//! filesystem, its inode and the range shown), never by the backing file's path, on real loop
//! devices:
//!
//! - the stable id stays when the image is renamed and attached again, or attached through
//!   another path to it (a bind mount of its directory);
//! - two loop devices over one image are one disk, and share data, even when the image's path
//!   is not visible here (attached from a private mount namespace);
//! - a window (offset) loop device over an image whose whole-image loop device is mounted only
//!   in another mount namespace is refused as in use;
//! - the agent, against the real control plane, does not publish a claimed loop device a
//!   second time when its image is renamed and attached again.
//!
//! Nothing is written to any image by the code under test: each test compares the image's
//! bytes before and after. Needs root; each size below is used by no other test, so agents of
//! tests running alongside never claim these devices.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use local_static_provisioner::core::devices::device_claim::link_name;
use local_static_provisioner::core::identity::disk_identity::{DiskIdentity, Verdict, judge};
use local_static_provisioner::host::identity::fingerprint::{found_identity, volume_identity};
use serde_json::Value;
use support::used_lab::*;
use support::{binary, run, wait_until};

/// Detaches a loop device attached by a test, by its own name, when dropped.
struct Attached(PathBuf);

impl Drop for Attached {
    fn drop(&mut self) {
        for _ in 0..50 {
            let ok = Command::new("losetup").arg("-d").arg(&self.0).status().is_ok_and(|s| s.success());
            if ok || !self.0.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// A process this test started, killed by its PID and reaped when dropped.
struct Started(Child);

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn attach(img: &Path, extra: &[&str]) -> Attached {
    let out = run(Command::new("losetup").args(["--find", "--show"]).args(extra).arg(img));
    Attached(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// An image of `mib` MiB with a pattern in its first and last MiB (not blank), or sparse.
fn image(path: &Path, mib: u64, pattern: bool) {
    run(Command::new("truncate").arg("-s").arg(format!("{mib}M")).arg(path));
    if pattern {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        let block: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8 + 1).collect();
        f.write_all_at(&block, 0).unwrap();
        f.write_all_at(&block, (mib - 1) << 20).unwrap();
    }
}

fn bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// The stable device id in the identity of the block device `dev`.
fn disk_id(dev: &Path) -> String {
    let identity = volume_identity(dev).unwrap();
    DiskIdentity::parse(&identity).and_then(|d| d.disk).unwrap_or_else(|| panic!("no disk id in {identity}"))
}

/// The `disks` listing for a Block class `class` that claims loop devices of exactly `mib` MiB.
fn disks_listing(h_root: &Path, class: &str, mib: u64) -> Vec<Value> {
    let dir = h_root.join("claims");
    std::fs::create_dir_all(&dir).unwrap();
    let map = format!(
        "{class}:\n  hostDir: {d}\n  mountDir: {d}\n  volumeMode: Block\n  devices:\n    types: [loop]\n    minSize: {mib}Mi\n    maxSize: {mib}Mi\n",
        d = dir.display()
    );
    let config = h_root.join("config");
    support::write_config(&config, &[("storageClassMap", &map)]);
    let out = run(Command::new(binary())
        .args(["disks", "--output", "json", "--config-dir"])
        .arg(&config)
        .arg("--state-dir")
        .arg(h_root.join("state")));
    serde_json::from_slice(&out.stdout).expect("disks prints JSON")
}

fn listed<'a>(listing: &'a [Value], dev: &Path) -> &'a Value {
    let name = dev.file_name().unwrap().to_str().unwrap();
    listing.iter().find(|d| d["name"] == name).unwrap_or_else(|| panic!("{name} not listed"))
}

#[test]
fn the_stable_id_survives_a_rename_and_another_path_to_the_image() {
    let _area = support::area(module_path!());
    if !support::require_root("the_stable_id_survives_a_rename_and_another_path_to_the_image") {
        return;
    }
    let lab = Lab::new("loopid-rename");
    let img = lab.dir("images").join("first.img");
    image(&img, 8, true);
    let before = bytes(&img);

    let first = attach(&img, &[]);
    let recorded = volume_identity(&first.0).unwrap();
    let id = disk_id(&first.0);
    assert!(id.starts_with("loop:") && !id.contains("first.img"), "the path is not part of it: {id}");
    drop(first);

    // Renamed, attached again (perhaps on another node).
    let renamed = lab.path("images/renamed.img");
    std::fs::rename(&img, &renamed).unwrap();
    let again = attach(&renamed, &[]);
    assert_eq!(disk_id(&again.0), id, "renamed and attached again");
    let found = found_identity(&again.0, None).unwrap();
    assert!(matches!(judge(&recorded, &found, None), Verdict::Same(_)), "{recorded} vs {}", found.identity);
    assert_eq!(link_name(&disk_id(&again.0)), link_name(&id));

    // Through a bind mount of its directory: another path to the same file.
    let bind = lab.path("bind");
    std::fs::create_dir_all(&bind).unwrap();
    run(Command::new("mount").arg("--bind").arg(lab.path("images")).arg(&bind));
    let other = attach(&bind.join("renamed.img"), &[]);
    assert_eq!(disk_id(&other.0), id, "through a bind mount");
    // Another range of the same file is another disk.
    let window = attach(&renamed, &["--offset", "1048576"]);
    assert_ne!(disk_id(&window.0), id);
    drop((other, window, again));
    lab.umount(&bind);
    assert!(bytes(&renamed) == before, "the image changed");
}

#[test]
fn two_loop_devices_over_one_image_are_one_disk_when_its_path_is_not_visible_here() {
    let _area = support::area(module_path!());
    if !support::require_root("two_loop_devices_over_one_image_are_one_disk_when_its_path_is_not_visible_here") {
        return;
    }
    let lab = Lab::new("loopid-hidden");
    let mib = 19;
    let img = lab.dir("images").join("shared.img");
    image(&img, mib, false);
    let before = bytes(&img);
    let ours = attach(&img, &[]);
    // Attached from a private mount namespace, through a path that exists only there.
    let hidden = lab.dir("hidden");
    let script = format!(
        "mount -t tmpfs tmpfs {h} && mkdir {h}/in && mount --bind {imgs} {h}/in && losetup --find --show {h}/in/shared.img",
        h = hidden.display(),
        imgs = lab.path("images").display()
    );
    let out = run(Command::new("unshare").args(["-m", "--propagation", "private", "sh", "-c", &script]));
    let theirs = Attached(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    let name = theirs.0.file_name().unwrap().to_str().unwrap().to_string();
    let backing = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).unwrap();
    assert!(!Path::new(backing.trim()).exists(), "the path {backing:?} is visible here");

    assert_eq!(disk_id(&ours.0), disk_id(&theirs.0), "one image, one disk");
    let listing = disks_listing(&lab.root, "loopid-hidden", mib);
    for (a, b) in [(&ours.0, &theirs.0), (&theirs.0, &ours.0)] {
        let d = listed(&listing, a);
        let other = b.file_name().unwrap().to_str().unwrap();
        assert!(d["sharing"].as_array().unwrap().iter().any(|s| s == other), "{d}");
        let verdict = d["classes"]["loopid-hidden"].as_str().unwrap();
        assert!(verdict.contains("same-disk"), "{}: {verdict}", a.display());
    }
    drop((ours, theirs));
    assert!(bytes(&img) == before, "the image changed");
}

#[test]
fn a_window_over_an_image_mounted_in_another_namespace_is_in_use() {
    let _area = support::area(module_path!());
    if !support::require_root("a_window_over_an_image_mounted_in_another_namespace_is_in_use") {
        return;
    }
    let lab = Lab::new("loopid-window");
    let (mib, window_mib) = (64, 23);
    let img = lab.dir("images").join("whole.img");
    image(&img, mib, false);
    let whole = attach(&img, &[]);
    // ext4 on the first 32 MiB only: the window, at 40 MiB, reads blank.
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&whole.0).arg("32M"));
    let mnt = lab.dir("elsewhere");
    // Read-only, so the filesystem writes nothing and the image's bytes can be compared.
    let script = format!("mount -o ro {} {} && echo mounted && exec sleep 600", whole.0.display(), mnt.display());
    let mut child = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let holder = Started(child);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
    assert_eq!(line.trim(), "mounted");
    assert!(!std::fs::read_to_string("/proc/self/mountinfo").unwrap().contains(&mnt.display().to_string()));
    let before = bytes(&img);

    let limit = (window_mib << 20).to_string();
    let window = attach(&img, &["--offset", &(40u64 << 20).to_string(), "--sizelimit", &limit]);
    let listing = disks_listing(&lab.root, "loopid-window", window_mib);
    let verdict = listed(&listing, &window.0)["classes"]["loopid-window"].as_str().unwrap().to_string();
    assert!(verdict.contains("in-use") && verdict.contains("exclusively"), "{verdict}");

    drop(window);
    drop(holder);
    drop(whole);
    assert!(bytes(&img) == before, "the image changed");
}

#[test]
fn a_claimed_loop_device_renamed_and_attached_again_is_not_published_twice() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("loopid-agent") else { return };
    let class = "loopid-agent";
    let mib = 29;
    let dir = h.lab.dir("claims");
    let section =
        format!("  volumeMode: Block\n  devices:\n    types: [loop]\n    minSize: {mib}Mi\n    maxSize: {mib}Mi\n");
    let config = h.config("config", &[(class, &dir, &section)]);
    let (dev, img) = h.lab.loop_dev("tenant", mib);
    let before = bytes(&img);
    let agent = h.agent(&config, &[]);
    let link_of = |dev: &Path| {
        std::fs::read_dir(&dir)
            .ok()?
            .flatten()
            .find(|e| std::fs::canonicalize(e.path()).is_ok_and(|t| t == dev))
            .map(|e| e.file_name().to_string_lossy().into_owned())
    };
    let name = wait_until("the device linked", WAIT, || link_of(&dev));
    let pv = h.wait_published(&dir.join(&name));
    h.claim("loopid-tenant", class, &pv, true);

    // The image is renamed and attached again (as after a reboot, under another name).
    run(Command::new("losetup").arg("-d").arg(&dev));
    let renamed = h.lab.path("images/tenant-renamed.img");
    std::fs::rename(&img, &renamed).unwrap();
    let again = h.lab.loop_on(&renamed);
    let one_link = || {
        let names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        (names != [name.clone()]).then(|| format!("links {names:?}, where only {name} should be"))
    };
    let once = || {
        let pvs = h.cp.pvs_under(&dir.display().to_string());
        (pvs.len() != 1).then(|| format!("{} PVs under {}: the disk was published again", pvs.len(), dir.display()))
    };
    let never = || one_link().or_else(once);
    wait_never("the link re-pointed at the device", &never, || {
        (std::fs::canonicalize(dir.join(&name)).ok()? == again).then_some(())
    });
    never_for(8, &never);
    assert_eq!(h.cp.pv_state(&pv).map(|(_, phase)| phase).as_deref(), Some("Bound"));
    drop(agent);
    run(Command::new("losetup").arg("-d").arg(&again));
    assert!(bytes(&renamed) == before, "the image changed");
}

/// A new image can get a deleted image's inode (ext4 hands out the lowest free one), and with
/// it the inode, range and size of the deleted image's loop device. Its birth time tells them
/// apart: the disk recorded for a PV is not proven by the new image, whose data is kept.
#[test]
fn an_image_that_reused_a_deleted_images_inode_is_another_disk() {
    let _area = support::area(module_path!());
    if !support::require_root("an_image_that_reused_a_deleted_images_inode_is_another_disk") {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let lab = Lab::new("loopid-reuse");
    let fs = lab.path("fs");
    let (_fs_dev, _fs_img) = lab.ext4_sized("backing-fs", &fs, 32);
    let first = fs.join("first.img");
    image(&first, 4, true);
    let ino = std::fs::metadata(&first).unwrap().ino();
    let dev = attach(&first, &[]);
    let recorded = volume_identity(&dev.0).unwrap();
    let born = DiskIdentity::parse(&recorded).and_then(|d| d.born);
    assert!(born.is_some(), "the backing file's birth time is part of the identity: {recorded}");
    drop(dev);
    std::fs::remove_file(&first).unwrap();

    // A new image of the same size, on the freed inode (free once the deletion is committed),
    // attached again.
    run(Command::new("sync").arg("-f").arg(&fs));
    let second = fs.join("second.img");
    image(&second, 4, true);
    assert_eq!(std::fs::metadata(&second).unwrap().ino(), ino, "ext4 gave the new image the freed inode");
    let before = bytes(&second);
    let dev = attach(&second, &[]);
    let found = found_identity(&dev.0, None).unwrap();
    let now = DiskIdentity::parse(&found.identity).unwrap();
    assert_eq!(disk_id(&dev.0), DiskIdentity::parse(&recorded).unwrap().disk.unwrap(), "the same stable id");
    assert_ne!(now.born, born, "{} vs {recorded}", found.identity);
    match judge(&recorded, &found, None) {
        Verdict::Different(why) => assert!(why.contains("born"), "{why}"),
        other => panic!("the new image proved the recorded disk: {other:?} ({recorded} vs {})", found.identity),
    }
    assert!(
        !local_static_provisioner::core::identity::disk_identity::may_share_disk(&recorded, &found.identity),
        "nor does it share the recorded disk's data"
    );

    // Deleted while attached, its birth time cannot be read: compared without it, as by
    // earlier versions (docs/data-safety.md).
    std::fs::remove_file(&second).unwrap();
    let unlinked = volume_identity(&dev.0).unwrap();
    assert_eq!(DiskIdentity::parse(&unlinked).unwrap().born, None, "{unlinked}");
    drop(dev);
    assert!(before.len() == 4 << 20, "the image was not touched");
    lab.umount(&fs);
}

//! `wipe-disk`, an operator's wipe of one disk named by its stable id, on real loop devices
//! against the real control plane, under the agent's own RBAC (the command reads PVs and posts
//! an event as the agent's ServiceAccount would in its pod):
//!
//! - a loop device holding an ext4 with files is refused by the claim rules (not-blank); a dry
//!   run writes nothing; `--yes` zeroes every byte, leaves its neighbours as they were, posts
//!   `DeviceWipedByOperator` on the Node, and the agent then claims and publishes the disk;
//! - refused, with nothing written: an unknown id, a mounted disk, one held open exclusively
//!   by another process, one open read-write by a plain process, one an entry of a discovery
//!   directory leads to, one a PV recorded, two loop devices over one file, and an API that
//!   cannot be read.
//!
//! Each test picks device sizes no other test uses (97 MiB is claimed by the agent here).
//! Needs root.

use crate::support;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;
use support::used_lab::*;
use support::{binary, run, wait_until};

/// The size the wipe-then-claim test's class selects: no other test uses it.
const CLAIMED_MIB: u64 = 97;
/// The size of the other devices here (never selected by any class).
const OTHER_MIB: u64 = 89;

/// `wipe-disk --id <id>` for this test's Node, config and state, with `extra` flags.
fn wipe_disk(h: &Harness, config: &Path, id: &str, extra: &[&str]) -> Output {
    wipe_disk_as(h, &h.kubeconfig, config, id, extra)
}

fn wipe_disk_as(h: &Harness, kubeconfig: &Path, config: &Path, id: &str, extra: &[&str]) -> Output {
    Command::new(binary())
        .args(["wipe-disk", "--id", id, "--node-name", &h.node, "--config-dir"])
        .arg(config)
        .arg("--state-dir")
        .arg(h.lab.path(&format!("state-{}", h.node)))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(extra)
        .output()
        .expect("running wipe-disk")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The run was refused (exit code 2) naming `code` and saying `says`.
fn assert_refused(out: &Output, code: &str, says: &str) {
    let t = text(out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains(&format!("refused ({code})")), "expected refused ({code}): {t}");
    assert!(t.contains(says), "expected {says:?}: {t}");
    assert!(t.contains("nothing was written"), "{t}");
}

/// `disks --output json` as the operator runs it.
fn disks_json(h: &Harness, config: &Path) -> Vec<Value> {
    let out = run(Command::new(binary())
        .args(["disks", "--output", "json", "--config-dir"])
        .arg(config)
        .arg("--state-dir")
        .arg(h.lab.path(&format!("state-{}", h.node))));
    serde_json::from_slice(&out.stdout).expect("disks prints JSON")
}

fn listed<'a>(listing: &'a [Value], dev: &Path) -> &'a Value {
    let name = dev.file_name().unwrap().to_str().unwrap();
    listing.iter().find(|d| d["name"] == name).unwrap_or_else(|| panic!("{name} not listed"))
}

/// The stable id `disks` prints for `dev`: what an operator copies.
fn stable_id(h: &Harness, config: &Path, dev: &Path) -> String {
    listed(&disks_json(h, config), dev)["stableId"].as_str().expect("a stable id").to_string()
}

/// SHA-256 of the whole device.
fn checksum(dev: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(dev));
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().to_string()
}

/// Every byte of `dev` is zero (read through a fresh descriptor, O_DIRECT-free but after the
/// wipe dropped the cache).
fn all_zero(dev: &Path) -> Result<(), u64> {
    let f = std::fs::File::open(dev).unwrap();
    let size = std::fs::read_to_string(format!("/sys/class/block/{}/size", dev.file_name().unwrap().to_str().unwrap()))
        .unwrap()
        .trim()
        .parse::<u64>()
        .unwrap()
        * 512;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < size {
        let n = (size - at).min(buf.len() as u64) as usize;
        f.read_exact_at(&mut buf[..n], at).unwrap();
        if let Some(i) = buf[..n].iter().position(|b| *b != 0) {
            return Err(at + i as u64);
        }
        at += n as u64;
    }
    Ok(())
}

/// An ext4 with a few files on `dev`, written through a mount and unmounted again.
fn old_data(h: &Harness, dev: &Path, name: &str) {
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(dev));
    let at = h.lab.path(&format!("mnt/{name}"));
    h.lab.mount_dev(dev, &at);
    for i in 0..8 {
        std::fs::write(at.join(format!("file-{i}")), format!("{name}: someone's data {i}\n").repeat(1000)).unwrap();
    }
    h.lab.umount(&at);
}

/// A process holding a device open, killed (by its own PID) when dropped.
struct Holder(Child);

impl Holder {
    /// Starts `argv`, which prints "ready" once it holds the device.
    fn start(argv: &[&str]) -> Holder {
        let mut child = Command::new(argv[0]).args(&argv[1..]).stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "{argv:?}");
        Holder(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_disk_with_old_data_is_zeroed_on_the_operators_word_and_then_claimed() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("ow-wipe") else { return };
    // wipe-disk weighs every PV of the cluster: an earlier test's PV whose image is gone may
    // record the inode this test's image reuses (a loop id is the backing file's dev:ino).
    h.cp.forget_finished_tests_pvs();
    let class = "ow-wipe";
    let dir = h.lab.dir("claims");
    let section = format!(
        "  volumeMode: Block\n  devices:\n    types: [loop]\n    minSize: {CLAIMED_MIB}Mi\n    maxSize: {CLAIMED_MIB}Mi\n"
    );
    let config = h.config("config", &[(class, &dir, &section)]);
    let (dev, _) = h.lab.loop_dev("old", CLAIMED_MIB);
    old_data(&h, &dev, "old");
    // Neighbours: one the class also selects (with data, so refused too), one it does not.
    let (same_size, _) = h.lab.loop_dev("neighbour-a", CLAIMED_MIB);
    old_data(&h, &same_size, "neighbour-a");
    let (other, _) = h.lab.loop_dev("neighbour-b", OTHER_MIB);
    old_data(&h, &other, "neighbour-b");

    let listing = disks_json(&h, &config);
    let v = listed(&listing, &dev)["classes"][class].as_str().unwrap().to_string();
    assert!(v.contains("refused (not-blank)") && v.contains("ext4"), "{v}");
    let id = listed(&listing, &dev)["stableId"].as_str().unwrap().to_string();
    let sums = |devs: &[&PathBuf]| devs.iter().map(|d| checksum(d)).collect::<Vec<_>>();
    let before = sums(&[&dev, &same_size, &other]);

    // Without --yes: what would be zeroed, and nothing written.
    let dry = wipe_disk(&h, &config, &id, &[]);
    let t = text(&dry);
    assert!(dry.status.success(), "{t}");
    assert!(t.contains(&format!("would zero every byte of {} (101711872 bytes)", dev.display())), "{t}");
    assert!(t.contains("allowed:") && t.contains("dry run: nothing was written"), "{t}");
    assert_eq!(sums(&[&dev, &same_size, &other]), before, "a dry run wrote");

    let wiped = wipe_disk(&h, &config, &id, &["--yes"]);
    let t = text(&wiped);
    assert!(wiped.status.success(), "{t}");
    assert!(t.contains(&format!("wiped {} (id {id}): 101711872 bytes in ", dev.display())), "{t}");
    assert!(t.contains("MiB/s") && t.contains("wipe-disk: 100% (97.0 of 97.0 MiB)"), "{t}");
    assert_eq!(all_zero(&dev), Ok(()), "a non-zero byte is left");
    assert_eq!(sums(&[&same_size, &other]), before[1..], "a neighbour changed");
    wait_until("a DeviceWipedByOperator event on the Node", WAIT, || h.node_event("DeviceWipedByOperator", &id));

    // Blank now: the agent claims and publishes it; the neighbour with data stays refused.
    let _agent = h.agent(&config, &[]);
    let name = wait_until("the wiped disk linked", WAIT, || {
        std::fs::read_dir(&dir)
            .ok()?
            .flatten()
            .find(|e| std::fs::canonicalize(e.path()).is_ok_and(|t| t == dev))
            .map(|e| e.file_name().to_string_lossy().into_owned())
    });
    assert!(name.starts_with("loop-"), "{name}");
    h.wait_published(&dir.join(&name));
    let v = listed(&disks_json(&h, &config), &same_size)["classes"][class].as_str().unwrap().to_string();
    assert!(v.contains("refused (not-blank)"), "{v}");
    assert_eq!(checksum(&same_size), before[1]);
}

#[test]
fn wipes_are_refused_while_anything_uses_the_disk_and_nothing_is_written() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("ow-refuse") else { return };
    // wipe-disk weighs every PV of the cluster: an earlier test's PV whose image is gone may
    // record the inode this test's image reuses (a loop id is the backing file's dev:ino).
    h.cp.forget_finished_tests_pvs();
    let class = "ow-refuse";
    let dir = h.lab.dir("disks");
    let config = h.config("config", &[(class, &dir, "  volumeMode: Block\n")]);
    let (dev, img) = h.lab.loop_dev("busy", OTHER_MIB);
    old_data(&h, &dev, "busy");
    let (neighbour, _) = h.lab.loop_dev("neighbour", OTHER_MIB);
    old_data(&h, &neighbour, "neighbour");
    let id = stable_id(&h, &config, &dev);
    let before = (checksum(&dev), checksum(&neighbour));
    let unchanged = |what: &str| {
        assert_eq!((checksum(&dev), checksum(&neighbour)), before, "{what}: something was written");
    };
    // Allowed as it is (a dry run says so).
    let out = wipe_disk(&h, &config, &id, &[]);
    assert!(out.status.success() && text(&out).contains("allowed:"), "{}", text(&out));

    // An id no device reports, or not exactly.
    assert_refused(&wipe_disk(&h, &config, "loop:/nowhere.img@0#1", &["--yes"]), "unknown-id", "no device");
    // One character off (a typo): no device, and the id meant is suggested.
    let near = format!("{id}0");
    assert_refused(&wipe_disk(&h, &config, &near, &["--yes"]), "unknown-id", &format!("did you mean {id}"));
    assert_refused(&wipe_disk(&h, &config, dev.to_str().unwrap(), &["--yes"]), "unknown-id", "no device");
    unchanged("unknown ids");

    // Mounted (read-only and without journal replay: the mount itself writes nothing).
    let at = h.lab.path("mnt/mounted");
    h.lab.mount_dev_with(&dev, &at, &["-o", "ro,noload"]);
    assert_refused(&wipe_disk(&h, &config, &id, &["--yes"]), "in-use", "mounted at");
    h.lab.umount(&at);
    unchanged("mounted");

    // Held open exclusively by another process (as mkfs or a VM would).
    let script = "import os, sys, time\nfd = os.open(sys.argv[1], os.O_RDONLY | os.O_EXCL)\nprint('ready', flush=True)\ntime.sleep(600)";
    let holder = Holder::start(&["python3", "-c", script, dev.to_str().unwrap()]);
    let out = wipe_disk(&h, &config, &id, &["--yes"]);
    assert_refused(&out, "in-use", "open exclusively");
    assert_refused(&out, "open", &format!("(pid {})", holder.pid()));
    drop(holder);
    unchanged("held exclusively");

    // Open read-write by a plain process (no O_EXCL: only /proc shows it).
    let holder = Holder::start(&["sh", "-c", "exec 3<>\"$0\"; echo ready; exec sleep 600", dev.to_str().unwrap()]);
    let out = wipe_disk(&h, &config, &id, &["--yes"]);
    assert_refused(
        &out,
        "open",
        &format!("sleep (pid {}) has {} open", holder.pid(), dev.file_name().unwrap().to_str().unwrap()),
    );
    assert!(!text(&out).contains("refused (in-use)"), "{}", text(&out));
    drop(holder);
    unchanged("open read-write");

    // An entry of a discovery directory leads to it.
    std::os::unix::fs::symlink(&dev, dir.join("by-hand")).unwrap();
    assert_refused(&wipe_disk(&h, &config, &id, &["--yes"]), "already-volume", "entry by-hand of class ow-refuse");
    std::fs::remove_file(dir.join("by-hand")).unwrap();
    unchanged("an entry");

    // A PV of this node recorded the disk (its path leads nowhere here).
    let pv = format!("{}-recorded", h.node);
    h.cp.apply(&format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: {pv}\n  annotations:\n    local-static-provisioner.io/volume-identity: \"v2;blk;disk={id};size=93323264\"\nspec:\n  capacity: {{storage: 89Mi}}\n  accessModes: [ReadWriteOnce]\n  volumeMode: Block\n  storageClassName: {class}\n  persistentVolumeReclaimPolicy: Retain\n  local: {{path: {path}}}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions:\n        - {{key: kubernetes.io/hostname, operator: In, values: [{node}]}}\n",
        path = h.lab.path("gone").display(),
        node = h.node,
    ));
    assert_refused(&wipe_disk(&h, &config, &id, &["--yes"]), "has-pv", &format!("PV {pv}"));
    h.force_delete_pv(&pv);
    unchanged("a PV");

    // The API cannot be read: no PV can be ruled out.
    let kubeconfig = h.lab.path("unreachable.kubeconfig");
    let original = std::fs::read_to_string(&h.kubeconfig).unwrap();
    assert!(original.contains(&h.cp.api_url), "{original}");
    // Nothing listens on port 9 of the loopback.
    let broken = original.replace(&h.cp.api_url, "https://127.0.0.1:9");
    std::fs::write(&kubeconfig, broken).unwrap();
    assert_refused(
        &wipe_disk_as(&h, &kubeconfig, &config, &id, &["--yes"]),
        "api-unreadable",
        "cannot prove no PV has it",
    );
    unchanged("no API");

    // Two loop devices over one file: which one is meant cannot be told.
    let twin = h.lab.loop_on(&img);
    assert_refused(
        &wipe_disk(&h, &config, &id, &["--yes"]),
        "several-devices",
        twin.file_name().unwrap().to_str().unwrap(),
    );
    run(Command::new("losetup").arg("-d").arg(&twin));
    unchanged("two loop devices");

    // Nothing in the way any more: allowed again, still only with --yes.
    let out = wipe_disk(&h, &config, &id, &[]);
    assert!(out.status.success() && text(&out).contains("allowed:"), "{}", text(&out));
    unchanged("the final dry run");
}

/// A loop device whose image file lives inside a Bound Filesystem volume (a tmpfs the agent
/// published) holds that tenant's data: `wipe-disk` refuses it as the PV's disk, naming the PV,
/// and the file is left as it was (the rule discovery applies to such a loop device).
#[test]
fn a_loop_device_over_a_file_inside_a_bound_volume_is_refused_as_that_pvs_disk() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("ow-inside") else { return };
    h.cp.forget_finished_tests_pvs();
    let class = "ow-inside";
    let (disks, config) = h.fs_class(class);
    let vol = disks.join("vol");
    h.lab.tmpfs(&vol, OTHER_MIB + 8);
    let agent = h.agent(&config, &[]);
    let pv = h.wait_published(&vol);
    h.claim("ow-inside", class, &pv, false);
    wait_until("the PV is Bound", WAIT, || (h.cp.pv_state(&pv)?.1 == "Bound").then_some(()));
    drop(agent);
    // The tenant's image in its volume, attached as a loop device (by the tenant, or by an
    // administrator who took it for a spare disk).
    let img = vol.join("tenant.img");
    run(Command::new("truncate").arg("-s").arg(format!("{OTHER_MIB}M")).arg(&img));
    let dev = h.lab.loop_on(&img);
    // Detached however the test ends: its image is in a tmpfs the lab's clean-up only
    // unmounts (lazily), which would leave the device attached.
    let _detach = Detach(dev.clone());
    old_data(&h, &dev, "inside");
    let id = stable_id(&h, &config, &dev);
    let before = checksum(&img);
    let out = wipe_disk(&h, &config, &id, &["--yes"]);
    assert_refused(&out, "has-pv", &format!("PV {pv}"));
    assert!(!text(&out).contains("no PV has it"), "{}", text(&out));
    assert_eq!(checksum(&img), before, "the tenant's image was written");
}

/// Detaches a loop device when dropped.
struct Detach(std::path::PathBuf);

impl Drop for Detach {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

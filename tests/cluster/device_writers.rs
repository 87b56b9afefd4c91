//! Writers of raw devices, on real loop devices with the agent under its own RBAC against the
//! real control plane:
//! - a device that a process has open for writing without `O_EXCL` (writing zeros every
//!   0.2 s, so its content stays blank) is not claimed while the writer lives;
//! - a claimed device whose PV is Available and that the host then formats and mounts gets its
//!   PV withdrawn (a Warning event on the PV), and stays held, also across a restart of the
//!   agent, until it is blank and unused again; its data is kept;
//! - a writer on a claimed device with an Available PV gets the PV withdrawn, even though
//!   what it writes is zeros; the device is offered again once the writer is gone;
//! - a Bound PV's device is the tenant's: a filesystem made on it leaves the PV alone.
//!
//! Each test selects its devices by a size no other test uses. Needs root.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use support::used_lab::*;
use support::{run, wait_until};

/// A Block class over the lab's `claims/` directory that claims loop devices of exactly `mib`
/// MiB.
fn claim_class(h: &Harness, class: &str, mib: u64) -> (PathBuf, PathBuf) {
    let dir = h.lab.dir("claims");
    let section =
        format!("  volumeMode: Block\n  devices:\n    types: [loop]\n    minSize: {mib}Mi\n    maxSize: {mib}Mi\n");
    let config = h.config("config", &[(class, &dir, &section)]);
    (dir, config)
}

/// The link in `dir` whose target is the device `dev` now.
fn link_to(dir: &Path, dev: &Path) -> Option<String> {
    let names = std::fs::read_dir(dir).ok()?;
    names
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_symlink()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| std::fs::canonicalize(dir.join(n)).is_ok_and(|t| t == dev))
}

/// A process that opened `dev` for writing without O_EXCL and writes 4 KiB of zeros at 1 MiB
/// every 0.2 s, synced (as a raw database or an image writer would). Stopped by its PID.
struct Writer(Child);

impl Writer {
    /// Starts the writer and returns once it has the device open and wrote to it once.
    fn start(dev: &Path) -> Writer {
        let script = "import os, sys, time\n\
            fd = os.open(sys.argv[1], os.O_WRONLY)\n\
            first = True\n\
            while True:\n    os.pwrite(fd, bytes(4096), 1 << 20); os.fsync(fd)\n    \
            if first: print('ready', flush=True); first = False\n    time.sleep(0.2)\n";
        let mut child = Command::new("python3")
            .args(["-c", script])
            .arg(dev)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).expect("the writer's first line");
        assert_eq!(line.trim(), "ready", "the writer could not open {}", dev.display());
        Writer(child)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// SHA-256 of the whole device, read by `sha256sum` (independently of the agent).
fn checksum(dev: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(dev));
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_string()
}

/// The filesystem type blkid finds on `dev`, read by blkid itself.
fn blkid_type(dev: &Path) -> Option<String> {
    let out = Command::new("blkid").args(["-p", "-o", "value", "-s", "TYPE"]).arg(dev).output().ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|t| !t.is_empty())
}

/// The note of an event on PV `pv` with `reason`.
fn pv_event(h: &Harness, pv: &str, reason: &str) -> Option<String> {
    let events = h.cp.get_json(&["events.events.k8s.io", "-A"])?;
    events["items"].as_array()?.iter().find_map(|e| {
        (e["regarding"]["kind"] == "PersistentVolume" && e["regarding"]["name"] == pv && e["reason"] == reason)
            .then(|| e["note"].as_str().unwrap_or_default().to_string())
    })
}

/// The hold the agent recorded for the link `name` in its claims.json.
fn recorded_hold(h: &Harness, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(h.lab.path(&format!("state-{}/claims.json", h.node))).ok()?;
    let records: serde_json::Value = serde_json::from_str(&text).ok()?;
    records.as_array()?.iter().find(|r| r["name"] == name)?["held"].as_str().map(str::to_string)
}

#[test]
fn a_device_open_for_writing_without_o_excl_is_not_claimed_while_the_writer_lives() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("dw-open") else { return };
    let class = "dw-open";
    let (dir, config) = claim_class(&h, class, 59);
    let (dev, _) = h.lab.loop_dev("written", 59);
    let before = checksum(&dev);
    let writer = Writer::start(&dev);
    let _agent = h.agent(&config, &[]);
    wait_until("a DeviceRefused event naming the writer", WAIT, || {
        h.node_event("DeviceRefused", "python3").or_else(|| h.node_event("DeviceRefused", "someone is using it"))
    });
    never_for(3, &|| link_to(&dir, &dev).map(|l| format!("claimed while written to: {l}")));
    drop(writer);
    // Nothing announces that a writer stopped: the agent looks again on a retry deadline.
    let name = wait_until("claimed once the writer is gone", WAIT, || link_to(&dir, &dev));
    h.wait_published(&dir.join(&name));
    assert_eq!(checksum(&dev), before, "the agent wrote nothing to the device");
}

#[test]
fn a_claimed_device_formatted_and_mounted_by_the_host_while_available_is_withdrawn_and_held() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("dw-format") else { return };
    let class = "dw-format";
    let (dir, config) = claim_class(&h, class, 61);
    let (dev, _) = h.lab.loop_dev("hostfs", 61);
    let agent = h.agent(&config, &[]);
    let name = wait_until("linked", WAIT, || link_to(&dir, &dev));
    let path = dir.join(&name);
    let pv = h.wait_published(&path);
    // The host takes the disk for something of its own. The agent's brief exclusive probe of
    // a device with an unbound PV can meet mkfs's exclusive open, and the mount's: each is run
    // again then, as an operator would.
    // Until blkid sees the filesystem: a run that met the probe may fail with another message
    // than "busy", or leave a filesystem blkid does not see yet.
    let mut last = String::new();
    for _ in 0..20 {
        let out = Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&dev).output().unwrap();
        last = format!("exit {:?}: {}", out.status.code(), String::from_utf8_lossy(&out.stderr));
        if out.status.success() && blkid_type(&dev).as_deref() == Some("ext4") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        blkid_type(&dev).as_deref() == Some("ext4"),
        "mkfs.ext4 made no filesystem on {} (last run: {last})",
        dev.display()
    );
    let mnt = h.lab.dir("hostfs-mnt");
    h.lab.mount_dev_meeting_probes(&dev, &mnt);
    std::fs::write(mnt.join("host-file"), b"the host's data").unwrap();
    let note = wait_until("a ClaimedDeviceChanged event on the PV", WAIT, || pv_event(&h, &pv, "ClaimedDeviceChanged"));
    assert!(note.contains("changed under it"), "{note}");
    wait_until("the Available PV withdrawn", WAIT, || h.pv_at(&path).is_none().then_some(()));
    assert!(recorded_hold(&h, &name).is_some(), "the hold is recorded");
    never_for(3, &|| h.pv_at(&path).map(|p| format!("offered again while the host uses it: {p:?}")));
    assert_eq!(std::fs::read(mnt.join("host-file")).unwrap(), b"the host's data", "the host's data is kept");
    h.lab.umount(&mnt);
    // A restart forgets nothing: still held (the filesystem is there).
    drop(agent);
    let _agent = h.agent(&config, &[]);
    never_for(4, &|| h.pv_at(&path).map(|p| format!("offered again after a restart: {p:?}")));
    assert!(std::fs::symlink_metadata(&path).is_ok(), "the link is kept");
    // Cleared by the operator (the whole device zeroed): offered again.
    run(Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "oflag=direct", "status=none", "count=61"])
        .arg(format!("of={}", dev.display())));
    wait_until("published again once blank and unused", WAIT, || h.available_at(&path));
    assert_eq!(recorded_hold(&h, &name), None, "the hold is lifted");
}

#[test]
fn a_writer_on_a_claimed_device_with_an_available_pv_gets_the_pv_withdrawn() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("dw-writer") else { return };
    let class = "dw-writer";
    let (dir, config) = claim_class(&h, class, 67);
    let (dev, _) = h.lab.loop_dev("quiet", 67);
    let _agent = h.agent(&config, &[]);
    let name = wait_until("linked", WAIT, || link_to(&dir, &dev));
    let path = dir.join(&name);
    let pv = h.wait_published(&path);
    let uid = h.uid(&pv);
    let writer = Writer::start(&dev);
    wait_until("the Available PV withdrawn", WAIT, || h.pv_at(&path).is_none().then_some(()));
    let note = pv_event(&h, &pv, "ClaimedDeviceChanged").expect("a Warning event on the PV");
    assert!(note.contains("python3") || note.contains("writes"), "{note}");
    never_for(3, &|| h.pv_at(&path).map(|p| format!("offered while written to: {p:?}")));
    drop(writer);
    let again = wait_until("offered again once the writer is gone", WAIT, || h.available_at(&path));
    assert_ne!(h.uid(&again), uid, "a new PV");
}

#[test]
fn a_bound_pvs_device_is_the_tenants_and_a_filesystem_on_it_changes_nothing() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("dw-bound") else { return };
    let class = "dw-bound";
    let (dir, config) = claim_class(&h, class, 71);
    let (dev, _) = h.lab.loop_dev("tenant", 71);
    let _agent = h.agent(&config, &[]);
    let name = wait_until("linked", WAIT, || link_to(&dir, &dev));
    let path = dir.join(&name);
    let pv = h.wait_published(&path);
    h.claim("dw-bound", class, &pv, true);
    wait_until("bound", WAIT, || h.pv_at(&path).filter(|(_, phase)| phase == "Bound").map(|_| ()));
    // The tenant formats and writes, as kubelet and a pod would.
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&dev));
    let writer = Writer::start(&dev);
    never_for(4, &|| match h.pv_at(&path) {
        Some((_, phase)) if phase == "Bound" => None,
        other => Some(format!("the bound PV changed: {other:?}")),
    });
    assert!(pv_event(&h, &pv, "ClaimedDeviceChanged").is_none(), "no event for the tenant's own use");
    assert_eq!(recorded_hold(&h, &name), None);
    drop(writer);
}

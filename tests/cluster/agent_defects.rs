//! The agent's own bookkeeping on a real control plane, real mounts and loop devices (issue 29):
//! a PV name another volume took is tried again once that PV is gone, the agent's own creates
//! are never taken for someone else's while its watch catches up, a held device is told once,
//! and every refused entry is evented. Needs root.

use crate::support;

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use local_static_provisioner::core::volumes::naming::pv_name;
use serde_json::Value;
use support::used_lab::*;
use support::{binary, run, wait_until};

/// Events of `reason` about this test's Node whose note contains `text`, with their counts
/// (an event repeated in its series counts each time).
fn node_events(h: &Harness, reason: &str, text: &str) -> u64 {
    let Some(events) = h.cp.get_json(&["events.events.k8s.io", "-A"]) else { return 0 };
    let items = events["items"].as_array().cloned().unwrap_or_default();
    items
        .iter()
        .filter(|e| {
            e["regarding"]["kind"] == "Node"
                && e["regarding"]["name"] == h.node.as_str()
                && e["reason"] == reason
                && e["note"].as_str().is_some_and(|n| n.contains(text))
        })
        .map(|e| 1 + e["series"]["count"].as_u64().unwrap_or(0).saturating_sub(1))
        .sum()
}

#[test]
fn a_pv_name_taken_by_another_volume_is_published_once_that_pv_is_gone() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("ad-collide") else { return };
    let class = "ad-collide";
    let (disks, config) = h.fs_class(class);
    let vol = disks.join("vol1");
    h.lab.tmpfs(&vol, 8);
    let name = pv_name("vol1", &h.node, class);
    // Another node's PV holds the name (a hash collision, or a volume moved between nodes).
    let elsewhere = h.lab.dir("elsewhere/vol1");
    h.cp.apply(&format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: {name}\n  annotations: {{pv.kubernetes.io/provisioned-by: local-volume-provisioner-ad-other-0000}}\nspec:\n  capacity: {{storage: 1Gi}}\n  accessModes: [ReadWriteOnce]\n  storageClassName: {class}\n  local: {{path: {p}}}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms: [{{matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [ad-other]}}]}}]\n",
        p = elsewhere.display()
    ));
    let agent = h.agent(&config, &[]);
    wait_until("a VolumeNameCollision event", WAIT, || {
        h.cp.has_event(&name, "VolumeNameCollision", "is taken by").then_some(())
    });
    never_for(3, &|| h.pv_at(&vol).map(|pv| format!("published over the other PV: {pv:?}")));
    // The other PV goes: the name is tried again (with backoff, no restart, no resync) and the
    // volume is published.
    h.cp.kubectl_ok(&["delete", "pv", &name]);
    let published = h.wait_published(&vol);
    assert_eq!(published, name);
    let log = agent.log_text();
    assert_eq!(log.matches("PV name taken by").count(), 1, "one warning for the collision:\n{log}");
}

#[test]
fn volumes_appearing_together_are_created_once_each_and_never_refused_as_their_own() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("ad-expect") else { return };
    let class = "ad-expect";
    let (disks, config) = h.fs_class(class);
    const N: usize = 40;
    for i in 0..N {
        h.lab.tmpfs(&disks.join(format!("a{i:02}")), 4);
    }
    let agent = h.agent(&config, &[]);
    let all = |n: usize| {
        let pvs = h.cp.pvs_under(&disks.display().to_string());
        (pvs.len() == n && pvs.iter().all(|pv| pv["status"]["phase"] == "Available")).then_some(())
    };
    wait_until("the first volumes published", WAIT, || all(N));
    // More while the agent runs: each mount is an event, so passes run while creates are in
    // flight and their PVs reach the watch.
    for i in 0..N {
        h.lab.tmpfs(&disks.join(format!("b{i:02}")), 4);
    }
    wait_until("all volumes published", WAIT, || all(2 * N));
    std::thread::sleep(Duration::from_secs(3));
    let log = agent.log_text();
    assert_eq!(log.matches("created PV").count(), 2 * N, "one create per volume:\n{log}");
    assert!(!log.contains("already published"), "a volume refused as its own:\n{log}");
    assert!(!log.contains("PV already exists"), "a create sent twice:\n{log}");
    assert_eq!(node_events(&h, "VolumeNotPublished", ""), 0, "no refusal evented");
}

/// `local-static-provisioner disks --output json` for `config`.
fn disks_json(config: &Path, state: &Path) -> Vec<Value> {
    let out = run(Command::new(binary())
        .args(["disks", "--output", "json", "--config-dir"])
        .arg(config)
        .arg("--state-dir")
        .arg(state));
    serde_json::from_slice::<Vec<Value>>(&out.stdout).expect("disks prints JSON")
}

#[test]
fn a_held_device_is_one_warning_and_one_event_for_as_long_as_it_is_held() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("ad-held") else { return };
    let class = "ad-held";
    let mib = 41;
    let dir = h.lab.dir("claims");
    let section =
        format!("  volumeMode: Block\n  devices:\n    types: [loop]\n    minSize: {mib}Mi\n    maxSize: {mib}Mi\n");
    let config = h.config("config", &[(class, &dir, &section)]);
    let (dev, _) = h.lab.loop_dev("held", mib);
    // The agent claimed the device, then stopped before publishing it, and someone put a
    // filesystem on it meanwhile (as tests/cluster/device_claims.rs sets it up).
    let state = h.lab.dir(&format!("state-{}", h.node));
    let listing = disks_json(&config, &state);
    let kernel = dev.file_name().unwrap().to_str().unwrap();
    let d = listing.iter().find(|d| d["name"] == kernel).expect("the device is listed");
    let verdict = d["classes"][class].as_str().unwrap_or_default().to_string();
    let link = verdict
        .strip_prefix("would claim as ")
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("{verdict}"))
        .to_string();
    let disk = d["stableId"].as_str().unwrap().to_string();
    let record = serde_json::json!([{
        "class": class, "name": link, "host_path": dir.join(&link).display().to_string(),
        "disk": disk, "target": dev.display().to_string(),
    }]);
    std::fs::write(state.join("claims.json"), record.to_string()).unwrap();
    std::os::unix::fs::symlink(&dev, dir.join(&link)).unwrap();
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&dev));
    let agent = h.agent(&config, &[]);
    wait_until("a DeviceHeld event", WAIT, || h.node_event("DeviceHeld", &link));
    // The hold is looked at again on growing deadlines (0.5 s to 30 s): 40 s is many looks.
    std::thread::sleep(Duration::from_secs(40));
    assert_eq!(node_events(&h, "VolumeNotPublished", &link), 0, "no second event for the same cause");
    assert_eq!(node_events(&h, "DeviceHeld", &link), 1, "one DeviceHeld event");
    let log = agent.log_text();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("WARN") && l.contains(link.as_str())).collect();
    assert_eq!(warnings.len(), 1, "one WARN for the held device: {warnings:#?}");
    assert!(h.pv_at(&dir.join(&link)).is_none(), "never published");
    drop(agent);
    run(Command::new("losetup").arg("-d").arg(&dev));
}

#[test]
fn entries_that_can_never_be_volumes_are_evented_once() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("ad-skips") else { return };
    let fs_dir = h.lab.dir("fs");
    let block_dir = h.lab.dir("block");
    let config =
        h.config("config", &[("ad-skips-fs", &fs_dir, ""), ("ad-skips-block", &block_dir, "  volumeMode: Block\n")]);
    // A FIFO (neither a directory nor a block device), a directory in a Block class, and a
    // name that is not UTF-8.
    run(Command::new("mkfifo").arg(fs_dir.join("fifo")));
    std::fs::create_dir_all(block_dir.join("dir")).unwrap();
    let bad: PathBuf = fs_dir.join(std::ffi::OsStr::from_bytes(b"bad-\xff"));
    std::fs::create_dir_all(&bad).unwrap();
    let agent = h.agent(&config, &[]);
    let expected = [
        ("fifo", "neither a directory nor a block device"),
        ("dir", "directory in a Block class"),
        ("bad-", "not valid UTF-8"),
    ];
    for (entry, why) in expected {
        wait_until(&format!("{entry} evented"), WAIT, || {
            let events = h.cp.get_json(&["events.events.k8s.io", "-A"])?;
            events["items"]
                .as_array()?
                .iter()
                .any(|e| {
                    e["reason"] == "VolumeNotPublished"
                        && e["regarding"]["name"] == h.node.as_str()
                        && e["note"].as_str().is_some_and(|n| n.contains(entry) && n.contains(why))
                })
                .then_some(())
        });
    }
    // Once per occurrence: a later pass (a new mount elsewhere in the class) says nothing more.
    h.lab.tmpfs(&fs_dir.join("vol"), 4);
    h.wait_published(&fs_dir.join("vol"));
    let log = agent.log_text();
    for (entry, why) in expected {
        let lines = log.lines().filter(|l| l.contains("entry refused") && l.contains(why) && l.contains(entry)).count();
        assert_eq!(lines, 1, "{entry}: one warning\n{log}");
    }
    assert_eq!(node_events(&h, "VolumeNotPublished", "neither a directory nor a block device"), 1);
}

//! The node inventory (issue 31) on real loop devices, real mounts and the real control plane,
//! with the agents under the RBAC from deploy/:
//!
//! - a node with claimed, refused and plain volumes shows them in its LocalStorageNode, with the
//!   right verdicts and capacity, owned by its Node; a new volume shows within a second;
//! - an idle agent writes nothing (counted in the API server's audit log over a minute of passes);
//! - the object goes with its Node (the garbage collector);
//! - a used block disk moved to another node is held back while its PV lives and wiped before it
//!   is offered there once the PV is gone: the cluster-side copy of the used mark;
//! - a ledger lost while the PV was deleted unwiped is restored from the copy, so the disk is
//!   wiped before it is offered again.
//!
//! Needs root.

mod support;

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::used_lab::*;
use support::{run, wait_until};

/// The node's LocalStorageNode, once it has a status.
fn inventory(h: &Harness, node: &str) -> Option<Value> {
    h.cp.get_json(&["localstoragenode", node]).filter(|o| o["status"]["nodeName"] == node)
}

fn volume_at<'a>(inv: &'a Value, path: &Path) -> Option<&'a Value> {
    inv["status"]["volumes"].as_array()?.iter().find(|v| v["path"] == path.to_str().unwrap())
}

fn device<'a>(inv: &'a Value, dev: &Path) -> Option<&'a Value> {
    let name = dev.file_name()?.to_str()?;
    inv["status"]["devices"].as_array()?.iter().find(|d| d["name"] == name)
}

fn verdict(inv: &Value, dev: &Path, class: &str) -> Option<(String, String)> {
    let v = device(inv, dev)?["classes"].as_array()?.iter().find(|c| c["class"] == class)?.clone();
    Some((v["verdict"].as_str()?.to_string(), v["reason"].as_str().unwrap_or("").to_string()))
}

#[test]
fn a_node_shows_its_claimed_refused_and_plain_volumes_and_a_new_one_within_a_second() {
    let Some(h) = Harness::new("inv-shows") else { return };
    let (fs_class, claim_class) = ("inv-shows-fs", "inv-shows-raw");
    let fs_dir = h.lab.dir("fs");
    let claims = h.lab.dir("claims");
    // A size no other test's devices have: this class claims only these.
    let mib = 43;
    let section =
        format!("  volumeMode: Block\n  devices:\n    types: [loop]\n    minSize: {mib}Mi\n    maxSize: {mib}Mi\n");
    let config = h.config("config", &[(fs_class, &fs_dir, ""), (claim_class, &claims, &section)]);
    h.lab.tmpfs(&fs_dir.join("plain"), 8);
    let (clean, _) = h.lab.loop_dev("clean", mib);
    let (used, _) = h.lab.loop_dev("used", mib);
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&used));
    let agent = h.agent(&config, &[]);
    let plain = h.wait_published(&fs_dir.join("plain"));

    let inv = wait_until("the inventory shows both devices' verdicts and the plain volume", WAIT, || {
        let inv = inventory(&h, &h.node)?;
        let claimed = verdict(&inv, &clean, claim_class)?;
        let refused = verdict(&inv, &used, claim_class)?;
        let v = volume_at(&inv, &fs_dir.join("plain"))?;
        (claimed.0 == "Claimed" && refused == ("Refused".into(), "not-blank".into()) && v["phase"] == "Available")
            .then_some(inv)
    });
    let status = &inv["status"];
    let v = volume_at(&inv, &fs_dir.join("plain")).unwrap();
    assert_eq!(v["pv"], plain.as_str());
    assert_eq!(v["capacityBytes"], 8 << 20, "{v}");
    let fs = status["classes"].as_array().unwrap().iter().find(|c| c["name"] == fs_class).unwrap();
    assert_eq!((fs["volumes"].as_u64(), fs["available"].as_u64()), (Some(1), Some(1)), "{fs}");
    assert_eq!(fs["hostDir"], fs_dir.to_str().unwrap());
    let raw = status["classes"].as_array().unwrap().iter().find(|c| c["name"] == claim_class).unwrap();
    assert_eq!((raw["volumeMode"].as_str(), raw["claimsDevices"].as_bool()), (Some("Block"), Some(true)));
    assert!(status["summary"]["claimed"].as_u64().unwrap() >= 1, "{}", status["summary"]);
    assert!(status["agent"]["configValid"].as_bool().unwrap());
    assert!(device(&inv, &used).unwrap()["content"].as_str().unwrap().contains("ext4"), "{inv}");
    // Owned by its Node: the garbage collector removes it with the Node.
    let node_uid = h.cp.kubectl_ok(&["get", "node", &h.node, "-o", "jsonpath={.metadata.uid}"]);
    let owner = &inv["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["name"].as_str(), owner["uid"].as_str()),
        (Some("Node"), Some(h.node.as_str()), Some(node_uid.trim()))
    );
    // The claimed device's PV is counted once it is published.
    let link = wait_until("the claimed device published", WAIT, || {
        let inv = inventory(&h, &h.node)?;
        let claimed = inv["status"]["volumes"]
            .as_array()?
            .iter()
            .find(|v| v["class"] == claim_class && v["pv"].is_string())?
            .clone();
        Some(claimed)
    });
    assert_eq!(link["capacityBytes"], mib << 20);

    // `kubectl get` alone answers the question, per node.
    let table = h.cp.kubectl_ok(&["get", "localstoragenodes", &h.node]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "DISKS", "CLAIMED", "VOLUMES", "AVAILABLE", "CAPACITY", "PROBLEMS", "AGE"], "{table}");
    let wide = h.cp.kubectl_ok(&["get", "lsn", &h.node, "-o", "wide"]);
    assert!(wide.contains("VERSION") && wide.contains(env!("CARGO_PKG_VERSION")), "{wide}");

    // A new volume: in the inventory within a second of the mount (measured from the mount
    // call's return; the agent needs no settle to list an entry).
    let started = Instant::now();
    h.lab.tmpfs(&fs_dir.join("new"), 4);
    wait_until("the new volume in the inventory", WAIT, || {
        volume_at(&inventory(&h, &h.node)?, &fs_dir.join("new")).map(|_| ())
    });
    let seen = started.elapsed();
    println!("a new volume was in the inventory {} ms after its mount", seen.as_millis());
    assert!(seen < Duration::from_secs(3), "a new volume took {seen:?} to show (goal: a second)");
    drop(agent);
}

/// The agent's requests on LocalStorageNodes in the audit log from byte `from` on: (verb,
/// subresource), one per audit ID.
fn inventory_requests(h: &Harness, from: u64) -> Vec<(String, String)> {
    let mut text = String::new();
    let mut file = std::fs::File::open(h.cp.dir.join("logs/audit.log")).unwrap();
    file.seek(SeekFrom::Start(from)).unwrap();
    file.read_to_string(&mut text).unwrap();
    let agent = format!("local-static-provisioner/{} (agent; {})", env!("CARGO_PKG_VERSION"), h.node);
    let mut seen = std::collections::BTreeSet::new();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["userAgent"] == agent.as_str() && e["objectRef"]["resource"] == "localstoragenodes")
        .filter(|e| seen.insert(e["auditID"].as_str().unwrap_or_default().to_string()))
        .map(|e| {
            let sub = e["objectRef"]["subresource"].as_str().unwrap_or("").to_string();
            (e["verb"].as_str().unwrap_or("?").to_string(), sub)
        })
        .collect()
}

#[test]
fn an_idle_agent_writes_its_inventory_only_when_something_changes() {
    let Some(h) = Harness::new("inv-idle") else { return };
    let class = "inv-idle";
    let dir = h.lab.dir("disks");
    for i in 0..3 {
        h.lab.tmpfs(&dir.join(format!("v{i}")), 4);
    }
    let config = h.config("config", &[(class, &dir, "")]);
    // A pass every second: sixty passes in the idle minute below.
    let agent = h.agent(&config, &["--discovery-period", "1s"]);
    for i in 0..3 {
        h.wait_published(&dir.join(format!("v{i}")));
    }
    wait_until("the inventory shows three Available volumes", WAIT, || {
        (inventory(&h, &h.node)?["status"]["summary"]["available"] == 3).then_some(())
    });
    // Let the last write land, then count a minute.
    std::thread::sleep(Duration::from_secs(2));
    let audit = h.cp.dir.join("logs/audit.log");
    let from = std::fs::metadata(&audit).unwrap().len();
    let passes_before = agent.log_text().matches("pass done").count();
    std::thread::sleep(Duration::from_secs(60));
    let writes: Vec<_> =
        inventory_requests(&h, from).into_iter().filter(|(verb, _)| verb != "get" && verb != "list").collect();
    let passes = agent.log_text().matches("pass done").count() - passes_before;
    println!("idle minute: {passes} passes, {} inventory writes", writes.len());
    assert!(passes >= 30, "the agent made passes meanwhile ({passes})");
    assert!(writes.is_empty(), "an idle agent wrote its inventory: {writes:?}");

    // A change is one write (or a few, for the PV's own steps), and then nothing again.
    let from = std::fs::metadata(&audit).unwrap().len();
    h.lab.tmpfs(&dir.join("v3"), 4);
    h.wait_published(&dir.join("v3"));
    wait_until("the inventory shows four Available volumes", WAIT, || {
        (inventory(&h, &h.node)?["status"]["summary"]["available"] == 4).then_some(())
    });
    std::thread::sleep(Duration::from_secs(5));
    let writes: Vec<_> = inventory_requests(&h, from).into_iter().filter(|(verb, _)| verb == "patch").collect();
    println!("one new volume: {} inventory writes", writes.len());
    assert!((1..=3).contains(&writes.len()), "{writes:?}");
    assert!(writes.iter().all(|(_, sub)| sub == "status"), "only the status is written: {writes:?}");
    drop(agent);
}

#[test]
fn the_inventory_goes_with_its_node() {
    let Some(h) = Harness::new("inv-gc") else { return };
    let class = "inv-gc";
    let dir = h.lab.dir("disks");
    h.lab.tmpfs(&dir.join("v"), 4);
    let config = h.config("config", &[(class, &dir, "")]);
    let agent = h.agent(&config, &[]);
    h.wait_published(&dir.join("v"));
    wait_until("the inventory written", WAIT, || inventory(&h, &h.node));
    drop(agent);
    h.cp.kubectl_ok(&["delete", "node", &h.node]);
    wait_until("the garbage collector removed the LocalStorageNode", WAIT, || {
        h.cp.get_json(&["localstoragenode", &h.node]).is_none().then_some(())
    });
}

/// A used block disk moved to another node (on this host, two agents): held back there while
/// its PV lives; once the PV is deleted unwiped (node-cleanup or an operator), wiped before it
/// is offered there. The other node's ledger has never seen it: only the cluster-side copy in
/// the first node's LocalStorageNode says it was used.
#[test]
fn a_used_block_disk_moved_to_another_node_is_wiped_before_it_is_offered_there() {
    let Some(h) = Harness::new("inv-moved") else { return };
    let other = format!("{}-b", h.node);
    h.cp.create_node(&other);
    let class = "inv-moved";
    let (a, b) = (h.lab.dir("a"), h.lab.dir("b"));
    let block = "  volumeMode: Block\n  blockCleanMethod: zero\n";
    let config_a = h.config("config-a", &[(class, &a, block)]);
    let config_b = h.config("config-b", &[(class, &b, block)]);
    let (dev, _) = h.lab.loop_dev("d", 32);
    symlink(&dev, a.join("d")).unwrap();
    let agent_a = h.agent(&config_a, &[]);
    let agent_b = h.agent_on(&other, &config_b, &[]);
    let pv = h.wait_published(&a.join("d"));
    h.claim("inv-moved", class, &pv, true);
    write_pattern(&dev);
    let uid = h.uid(&pv);
    wait_until("node A's inventory records the disk as used by its PV", WAIT, || {
        let inv = inventory(&h, &h.node)?;
        inv["status"]["usedDisks"]
            .as_array()?
            .iter()
            .any(|r| r["pv"] == pv.as_str() && r["uid"] == uid.as_str())
            .then_some(())
    });

    // The disk leaves A and shows up on B while A's PV still names it.
    std::fs::remove_file(a.join("d")).unwrap();
    symlink(&dev, b.join("d")).unwrap();
    let never = || {
        let (name, phase) = h.pv_at(&b.join("d"))?;
        has_pattern(&dev).then(|| format!("published on {other} as {name} ({phase}) with {pv}'s data"))
    };
    never_for(8, &never);
    assert!(has_pattern(&dev), "nothing wiped while its PV lives");

    // The PV goes without a wipe: B wipes the disk before it offers it.
    h.delete_claim("inv-moved");
    h.force_delete_pv(&pv);
    let new = wait_never("the disk wiped and published on the other node", &never, || {
        h.pv_at(&b.join("d")).filter(|(_, phase)| phase == "Available").map(|(name, _)| name)
    });
    assert!(!has_pattern(&dev), "wiped before it was offered");
    assert!(h.cp.has_event(&other, "VolumeUsed", &format!("held the data of PV {pv}")), "told on the other Node");
    // B records it now, and no longer lets A's record stand for it.
    wait_until("node B's inventory records the disk and supersedes A's record", WAIT, || {
        let inv = inventory(&h, &other)?;
        let records = inv["status"]["usedDisks"].as_array()?;
        let supersedes = inv["status"]["superseded"].as_array()?.iter().any(|u| u == uid.as_str());
        (records.iter().any(|r| r["pv"] == new.as_str()) && supersedes).then_some(())
    });
    // Not wiped again: the PV stays.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(h.pv_at(&b.join("d")).map(|(n, _)| n), Some(new.clone()));

    // A tenant of B uses it, and the disk goes back to A, whose own ledger still says A's old
    // PV used it: held by B's PV, never wiped nor offered by A while that PV lives.
    h.claim("inv-moved-b", class, &new, true);
    write_pattern(&dev);
    std::fs::remove_file(b.join("d")).unwrap();
    symlink(&dev, a.join("d")).unwrap();
    let never_back = || {
        if !has_pattern(&dev) {
            return Some(format!("wiped on {} while {new} holds its data", h.node));
        }
        h.pv_at(&a.join("d")).map(|(name, phase)| format!("published back on {} as {name} ({phase})", h.node))
    };
    wait_never("node A reports it not published", &never_back, || {
        h.cp.has_event(&h.node, "VolumeNotPublished", &new).then_some(())
    });
    never_for(5, &never_back);
    std::fs::remove_file(a.join("d")).unwrap();
    drop(agent_b);
    drop(agent_a);
    h.cp.forget_pvs_under(h.lab.root.to_str().unwrap());
}

/// A ledger lost (a replaced state directory) while the PV of a used block disk was deleted
/// unwiped: the agent puts the marks of its LocalStorageNode back into the ledger at start-up,
/// so the disk is wiped before it is offered again.
#[test]
fn a_lost_ledger_is_restored_from_the_inventory_and_the_disk_wiped_before_it_is_offered() {
    let Some(h) = Harness::new("inv-lost") else { return };
    let class = "inv-lost";
    let dir = h.lab.dir("blk");
    let config = h.config("config", &[(class, &dir, "  volumeMode: Block\n  blockCleanMethod: zero\n")]);
    let (dev, _) = h.lab.loop_dev("d", 32);
    symlink(&dev, dir.join("d")).unwrap();
    let agent = h.agent(&config, &[]);
    let pv = h.wait_published(&dir.join("d"));
    h.claim("inv-lost", class, &pv, true);
    write_pattern(&dev);
    let uid = h.uid(&pv);
    wait_until("the inventory records the disk", WAIT, || {
        let inv = inventory(&h, &h.node)?;
        inv["status"]["usedDisks"].as_array()?.iter().any(|r| r["uid"] == uid.as_str()).then_some(())
    });
    drop(agent);
    // The ledger is lost, and the PV deleted without a wipe while no agent runs.
    let ledger = h.ledger(&h.node);
    std::fs::remove_file(&ledger).unwrap();
    h.delete_claim("inv-lost");
    h.force_delete_pv(&pv);
    let agent = h.agent(&config, &[]);
    let never = || {
        let (name, phase) = h.pv_at(&dir.join("d"))?;
        has_pattern(&dev).then(|| format!("published again as {name} ({phase}) with {pv}'s data"))
    };
    wait_never("the disk wiped and published again", &never, || {
        h.pv_at(&dir.join("d")).filter(|(_, phase)| phase == "Available").map(|(name, _)| name)
    });
    assert!(!has_pattern(&dev));
    assert!(h.node_event("UsedMarksRestored", "put back").is_some(), "the restore is told on the Node");
    drop(agent);
    h.cp.forget_pvs_under(h.lab.root.to_str().unwrap());
}

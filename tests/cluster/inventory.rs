//! The node inventory (issue 31) on real loop devices, real mounts and the real control plane,
//! with the agents under the RBAC from deploy/:
//!
//! - a node with claimed, refused and plain volumes shows them in its LocalStorageNode, with the
//!   right verdicts and capacity, owned by its Node; a new volume shows within a second;
//! - an idle agent writes nothing (counted in the API server's audit log over a minute of passes);
//! - the object goes with its Node (the garbage collector);
//! - a used block disk moved to another node is held back while its PV is bound, and wiped
//!   before it is offered there once that PV is Released (a claim used it);
//! - issue 40: a disk a claim used on a node whose LocalStorageNode is gone is wiped first
//!   while that node's Released PV names it; a forged record of another node's token only holds
//!   a disk (said, released by `kubectl local-storage release-hold`), a decoy PV by name holds
//!   nothing, and a disk the node itself published and wiped is never blocked;
//! - a ledger lost while the PV was deleted unwiped is restored from the copy, so the disk is
//!   wiped before it is offered again.
//!
//! Needs root.

use crate::support;

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::used_lab::*;
use support::{AgentProcess, run, wait_until};

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
    let _area = support::area(module_path!());
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
    let _area = support::area(module_path!());
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
    // The inventory lists the host's disks: a loop device another test attaches meanwhile is a
    // change, told with a write. Those changes are counted, every 20 ms.
    let sampler = support::DiskChanges::start();
    std::thread::sleep(Duration::from_secs(60));
    let changes = sampler.stop();
    let writes: Vec<_> =
        inventory_requests(&h, from).into_iter().filter(|(verb, _)| verb != "get" && verb != "list").collect();
    let passes = agent.log_text().matches("pass done").count() - passes_before;
    println!("idle minute: {passes} passes, {} inventory writes, {changes} changes of the host's disks", writes.len());
    assert!(passes >= 30, "the agent made passes meanwhile ({passes})");
    assert!(writes.len() <= changes, "an idle agent wrote its inventory more often than the disks changed: {writes:?}");

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
    let _area = support::area(module_path!());
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
/// its PV is bound; once its claim is gone (the PV Released, unwiped: its disk is not at A's
/// path), wiped before it is offered there. The other node's ledger has never seen it: the PV
/// that names it by its disk-id label, and A's record, say it was used.
#[test]
fn a_used_block_disk_moved_to_another_node_is_wiped_before_it_is_offered_there() {
    let _area = support::area(module_path!());
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

    // The claim goes while A cannot wipe the disk (it is not at A's path): A's PV is Released,
    // which proves a claim used the disk, so B wipes it before it offers it.
    h.delete_claim("inv-moved");
    let new = wait_never("the disk wiped and published on the other node", &never, || {
        h.pv_at(&b.join("d")).filter(|(_, phase)| phase == "Available").map(|(name, _)| name)
    });
    h.force_delete_pv(&pv);
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
    let _area = support::area(module_path!());
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

/// This version's CRD (status.held, supersededPvs), applied again: the control plane is shared
/// with tests of other versions that apply theirs.
fn this_crd(h: &Harness) {
    h.cp.apply(&std::fs::read_to_string(support::repo_root().join("deploy/base/crd.yaml")).unwrap());
    h.cp.wait_crd_established("localstoragenodes.local-static-provisioner.io");
}

/// A kubeconfig with a token of the agent's ServiceAccount bound to a pod on `node`, as the
/// DaemonSet's pod gets: it carries the node-name claim the admission policies read, so the
/// agent (or a thief of its token) may write exactly what the policies let node `node` write.
fn node_kubeconfig(h: &Harness, node: &str) -> std::path::PathBuf {
    // A pod per run: without a kubelet, a deleted pod stays Terminating, and so its tokens
    // stop working.
    let pod = format!("agent-{node}-{}", std::process::id());
    let (ns, sa) = ("local-static-provisioner", "local-static-provisioner");
    h.cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: {ns}}}\nspec:\n  nodeName: {node}\n  serviceAccountName: {sa}\n  containers: [{{name: agent, image: local-static-provisioner:test}}]\n"
    ));
    let token = h.cp.kubectl_ok(&[
        "create",
        "token",
        sa,
        "-n",
        ns,
        "--duration",
        "1h",
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        &pod,
    ]);
    h.cp.token_kubeconfig(&h.lab.root, &format!("agent-{node}"), token.trim())
}

/// `kubectl local-storage release-hold --node <node> <uid>`, as an operator runs it.
fn release_hold(h: &Harness, node: &str, uid: &str) {
    let link = h.lab.path("kubectl-local_storage");
    if !link.exists() {
        symlink(support::binary(), &link).unwrap();
    }
    let out = Command::new(&link)
        .args(["release-hold", "--node", node, uid])
        .env("KUBECONFIG", &h.cp.kubeconfig)
        .output()
        .unwrap();
    assert!(out.status.success(), "release-hold: {}", String::from_utf8_lossy(&out.stderr));
}

/// Issue 40, on two agents of this host under the RBAC from deploy/.
#[test]
fn a_block_disk_across_nodes_is_judged_by_evidence_no_single_node_can_forge() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("inv-xnode") else { return };
    let other = format!("{}-b", h.node);
    h.cp.create_node(&other);
    // A run that failed may have left the object this test writes for A (it has no owner).
    let _ = h.cp.kubectl(&["delete", "localstoragenode", &h.node, &other, "--ignore-not-found"]);
    let class = "inv-xnode";
    let (a, b) = (h.lab.dir("a"), h.lab.dir("b"));
    let block = "  volumeMode: Block\n  blockCleanMethod: zero\n";
    let config_a = h.config("config-a", &[(class, &a, block)]);
    let config_b = h.config("config-b", &[(class, &b, block)]);
    let (d1, _) = h.lab.loop_dev("d1", 32);
    let (d2, _) = h.lab.loop_dev("d2", 32);
    symlink(&d1, a.join("d1")).unwrap();
    symlink(&d2, a.join("d2")).unwrap();
    let (token_a, token_b) = (node_kubeconfig(&h, &h.node), node_kubeconfig(&h, &other));
    let agent_a = AgentProcess::start_with(&config_a, &h.node, &token_a, &h.lab.path("agent-a.log"), &[]);
    let pv1 = h.wait_published(&a.join("d1"));
    let pv2 = h.wait_published(&a.join("d2"));
    const IDENTITY: &str = "local-static-provisioner.io/volume-identity";
    let (id1, id2) = (h.ann(&pv1, IDENTITY).unwrap(), h.ann(&pv2, IDENTITY).unwrap());
    let label = h.pv(&pv1).unwrap()["metadata"]["labels"]["local-static-provisioner.io/disk-id"].clone();
    assert!(label.as_str().is_some_and(|l| l.len() == 40), "the PV carries its disk's label: {label}");

    // Item 1: a tenant writes to d1 on A; A's agent is down when the claim is deleted (the PV
    // stays Released, unwiped); an admin deletes A's LocalStorageNode; d1 shows up on B.
    h.claim("inv-xnode", class, &pv1, true);
    write_pattern(&d1);
    let uid1 = h.uid(&pv1);
    drop(agent_a);
    h.delete_claim("inv-xnode");
    wait_until("A's PV is Released", WAIT, || (h.pv(&pv1)?["status"]["phase"] == "Released").then_some(()));
    h.cp.kubectl_ok(&["delete", "localstoragenode", &h.node]);
    std::fs::remove_file(a.join("d1")).unwrap();
    std::fs::remove_file(a.join("d2")).unwrap();
    symlink(&d1, b.join("d1")).unwrap();
    this_crd(&h);
    let agent_b = AgentProcess::start_with(&config_b, &other, &token_b, &h.lab.path("agent-b.log"), &[]);
    let never1 = || {
        let (name, phase) = h.pv_at(&b.join("d1"))?;
        has_pattern(&d1).then(|| format!("published on {other} as {name} ({phase}) with {pv1}'s data"))
    };
    let new1 = wait_never("B wipes d1 first, then publishes it", &never1, || h.available_at(&b.join("d1")));
    assert!(!has_pattern(&d1), "wiped before it was offered");
    assert!(h.cp.has_event(&other, "VolumeUsed", &format!("held the data of PV {pv1}")), "told on B's Node");
    wait_until("B supersedes A's Released PV", WAIT, || {
        let inv = inventory(&h, &other)?;
        inv["status"]["supersededPvs"].as_array()?.iter().any(|p| p["uid"] == uid1.as_str()).then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(h.available_at(&b.join("d1")), Some(new1.clone()), "not wiped again");

    // Item 3: A's token writes, in its own LocalStorageNode's status (what it may write), records
    // naming B's disks: d2 (which A's PV named, since deleted) and d1 (B's own now), each under a
    // decoy PV name; a decoy PV of that name exists on A, naming no disk.
    h.force_delete_pv(&pv2);
    let node_uid = h.cp.get_json(&["node", &h.node]).unwrap()["metadata"]["uid"].as_str().unwrap().to_string();
    let object = format!(
        "apiVersion: local-static-provisioner.io/v1alpha1\nkind: LocalStorageNode\nmetadata:\n  name: {n}\n  ownerReferences: [{{apiVersion: v1, kind: Node, name: {n}, uid: {node_uid}}}]\nspec:\n  nodeName: {n}\n",
        n = h.node
    );
    let as_a = |args: &[&str], stdin: Option<&str>| {
        let out = h.cp.kubectl_stdin(&token_a, args, stdin);
        assert!(out.status.success(), "as node A: {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    as_a(&["create", "-f", "-"], Some(&object));
    let record = |identity: &str, uid: &str| serde_json::json!({ "identity": identity, "pv": "inv-xnode-decoy", "uid": uid, "path": "/x", "at": "2026-11-29T00:00:00Z", "claimed": true });
    let status = serde_json::json!({ "status": { "nodeName": h.node, "usedDisks": [record(&id2, "forged-2"), record(&id1, "forged-1")] } });
    let mut status = status;
    status["apiVersion"] = serde_json::json!("local-static-provisioner.io/v1alpha1");
    status["kind"] = serde_json::json!("LocalStorageNode");
    status["metadata"] = serde_json::json!({ "name": h.node });
    let apply = ["apply", "--server-side", "--subresource=status", "--force-conflicts", "-f", "-"];
    as_a(&apply, Some(&status.to_string()));
    h.cp.apply(&format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: inv-xnode-decoy\nspec:\n  capacity: {{storage: 1Mi}}\n  accessModes: [ReadWriteOnce]\n  storageClassName: {class}\n  local: {{path: /nonexistent/decoy}}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions:\n        - {{key: kubernetes.io/hostname, operator: In, values: [{n}]}}\n",
        n = h.node
    ));
    // An admin links d2, holding data of its own, into B's directory: held and said, never wiped.
    write_pattern(&d2);
    symlink(&d2, b.join("d2")).unwrap();
    let untouched = || {
        if !has_pattern(&d2) {
            return Some("d2 wiped on A's word".to_string());
        }
        h.pv_at(&b.join("d2")).map(|(name, phase)| format!("d2 published as {name} ({phase})"))
    };
    wait_never("B says A's record holds d2", &untouched, || {
        h.cp.has_event(&other, "VolumeNotPublished", &format!("node {}'s LocalStorageNode", h.node))
            .then_some(())
            .filter(|_| h.cp.has_event(&other, "VolumeNotPublished", "forged-2"))
    });
    this_crd(&h);
    let held = wait_until("B's inventory lists the hold", WAIT, || {
        let inv = inventory(&h, &other)?;
        inv["status"]["held"].as_array()?.iter().find(|x| x["uid"] == "forged-2").cloned()
    });
    assert_eq!(held["node"], h.node.as_str());
    assert_eq!(held["reason"], "record");
    never_for(3, &untouched);
    // The operator releases it: d2 is wiped first (the record taken as a mark), then published;
    // the decoy PV of the record's name holds nothing.
    release_hold(&h, &other, "forged-2");
    let never2 = || {
        let (name, phase) = h.pv_at(&b.join("d2"))?;
        has_pattern(&d2).then(|| format!("published as {name} ({phase}) unwiped"))
    };
    wait_never("d2 wiped and published after the release", &never2, || h.available_at(&b.join("d2")));

    // B's own tenant uses d1 and lets it go: B wipes it and publishes it again, whatever A's
    // forged record of d1 says.
    h.claim("inv-xnode-b", class, &new1, true);
    write_pattern(&d1);
    // Read before the claim goes: the agent may wipe and delete the Released PV at once.
    let bound_uid = h.uid(&new1);
    h.delete_claim("inv-xnode-b");
    wait_until("d1 wiped and published again on B", WAIT, || {
        // The same name (its entry's), a new object.
        let name = h.available_at(&b.join("d1"))?;
        let uid = h.pv(&name)?["metadata"]["uid"].as_str()?.to_string();
        (uid != bound_uid && !has_pattern(&d1)).then_some(name)
    });
    assert!(!has_pattern(&d1));
    assert!(
        !h.cp.has_event(&other, "VolumeNotPublished", "forged-1"),
        "a disk B published and wiped is never held by one node's word"
    );
    std::fs::remove_file(b.join("d1")).unwrap();
    std::fs::remove_file(b.join("d2")).unwrap();
    drop(agent_b);
    let _ = h.cp.kubectl(&["delete", "pv", "inv-xnode-decoy", "--wait=false"]);
    let _ = h.cp.kubectl(&["delete", "localstoragenode", &h.node, "--wait=false"]);
    for node in [&h.node, &other] {
        let pod = format!("agent-{node}-{}", std::process::id());
        let delete = ["delete", "pod", "-n", "local-static-provisioner", &pod, "--force", "--grace-period=0"];
        let _ = h.cp.kubectl(&delete);
    }
    h.cp.forget_pvs_under(h.lab.root.to_str().unwrap());
}

/// Without a class that claims devices (no `devices` section anywhere) the inventory still
/// lists the node's disks, from sysfs and the mount table, probing none: a blank loop device
/// with its size and no verdict, "not probed"; the disk of a Filesystem volume (ext4 on a loop
/// device, published as a PV) in use, mounted at the volume's path. `kubectl get lsn` counts
/// them.
#[test]
fn without_a_devices_class_every_disk_is_listed_unprobed() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("inv-list") else { return };
    let class = "inv-list-fs";
    let dir = h.lab.dir("disks");
    let config = h.config("config", &[(class, &dir, "")]);
    let (volume_disk, _) = h.lab.ext4_sized("vol", &dir.join("v"), 38);
    let (blank, _) = h.lab.loop_dev("blank", 37);
    let agent = h.agent(&config, &[]);
    h.wait_published(&dir.join("v"));
    let inv = wait_until("the inventory lists both loop devices", WAIT, || {
        let inv = inventory(&h, &h.node)?;
        (device(&inv, &blank).is_some() && device(&inv, &volume_disk).is_some()).then_some(inv)
    });
    let b = device(&inv, &blank).unwrap();
    assert_eq!((b["size"].as_u64(), b["kind"].as_str()), (Some(37 << 20), Some("loop")), "{b}");
    assert_eq!(b["content"], "not probed (no class selects it)", "{b}");
    assert!(b["classes"].as_array().is_none_or(|c| c.is_empty()), "no class judged it: {b}");
    let v = device(&inv, &volume_disk).unwrap();
    let content = v["content"].as_str().unwrap();
    assert_eq!(content, format!("in use: mounted at {}", dir.join("v").display()), "{v}");
    let disks = inv["status"]["summary"]["disks"].as_u64().unwrap();
    assert!(disks >= 2, "{}", inv["status"]["summary"]);
    let table = h.cp.kubectl_ok(&["get", "lsn", &h.node]);
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[1], disks.to_string(), "DISKS in kubectl get lsn: {table}");
    drop(agent);
}

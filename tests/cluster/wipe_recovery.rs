//! Wipes that fail part-way, on real tmpfs mounts, loop devices and the real control plane:
//! a completed wipe whose PV could not be finished is not done again (its durable record is
//! honoured only while the disk is unchanged), a cancelled wipe kills its blockCleanerCommand
//! with everything it started, and what a released PV costs in API requests. Needs root.

use crate::support;

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use local_static_provisioner::config::{ClassConfig, ConfigSource};
use local_static_provisioner::core::volumes::naming::pv_name;
use local_static_provisioner::core::wipe::cleanup::PvState;
use local_static_provisioner::host::identity::fingerprint::found_identity;
use local_static_provisioner::host::identity::used_mark::Ledger;
use local_static_provisioner::host::volumes::kubelet::KubeletView;
use local_static_provisioner::host::wipe::run::wipe;
use local_static_provisioner::host::wipe::wipe_record::{self as record, WipedRecord};
use local_static_provisioner::wiper::{Progress, WipeError, WipeJob, Wiped, target_at};
use serde_json::Value;
use support::{
    AgentProcess, ControlPlane, LoopDevice, mount_tmpfs, require_root, run, wait_recycled, wait_until, write_config,
};

const WAIT: Duration = Duration::from_secs(90);

/// One class over `dir`, as the agent would load it, with `extra` YAML lines for the class.
fn class(tmp: &Path, dir: &Path, extra: &str) -> ClassConfig {
    let config = tmp.join("config");
    let map = format!("c:\n  hostDir: {d}\n  mountDir: {d}\n{extra}", d = dir.display());
    write_config(&config, &[("storageClassMap", &map)]);
    let loaded = ConfigSource::new(&config).load().unwrap().config;
    loaded.storage_class_map.get("c").unwrap().clone()
}

/// A wipe of the volume at `path` for PV `uid`, released by claim `claim`, whose PV is
/// finished afterwards (so it is recorded).
fn job(path: &Path, class: &ClassConfig, uid: &str, claim: &str) -> WipeJob {
    let identity = found_identity(path, None).unwrap().identity;
    let host_path = path.display().to_string();
    let pv = PvState {
        name: format!("pv-{uid}"),
        uid: uid.into(),
        phase: "Released".into(),
        host_path: host_path.clone(),
        class: "c".into(),
        identity: Some(identity.clone()),
        identity_confirmed: Some(identity),
        claim: Some(("default".into(), "claim".into(), claim.into())),
        ..Default::default()
    };
    let target = target_at(&host_path, "c", Some(class)).unwrap();
    WipeJob { pv, target, timeout_base: Duration::from_secs(60), min_rate: 1 << 20, resumable: true }
}

struct Host {
    ledger: Ledger,
    kubelet: KubeletView,
    state: PathBuf,
}

impl Host {
    fn new(tmp: &Path) -> Host {
        let state = tmp.join("state");
        std::fs::create_dir_all(&state).unwrap();
        let kubelet = KubeletView { dir: tmp.join("no-kubelet"), required: false };
        Host { ledger: Ledger::open(&state).unwrap(), kubelet, state }
    }

    fn wipe(&self, job: &WipeJob) -> Result<Wiped, WipeError> {
        wipe(&self.ledger, &self.kubelet, job, &AtomicBool::new(false), &Progress::default())
    }

    fn records(&self) -> Vec<WipedRecord> {
        record::read(&self.state).unwrap()
    }
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[test]
fn a_completed_filesystem_wipe_is_not_done_again_while_its_record_holds() {
    let _area = support::area(module_path!());
    if !require_root("a_completed_filesystem_wipe_is_not_done_again_while_its_record_holds") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("fs");
    let vol = dir.join("vol1");
    let _m = mount_tmpfs(&vol, 16);
    std::fs::write(vol.join("tenant-data"), b"secret").unwrap();
    let class = class(tmp.path(), &dir, "");
    let host = Host::new(tmp.path());

    let first = job(&vol, &class, "pv-1", "claim-1");
    let wiped = host.wipe(&first).unwrap();
    assert!(!wiped.resumed && entries(&vol) == 0, "{wiped:?}");
    let records = host.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!((records[0].uid.as_str(), records[0].claim.as_deref()), ("pv-1", Some("claim-1")));
    assert_eq!(Some(&records[0].identity), first.pv.identity.as_ref());

    // The PV's finish failed: the retry proves the same disk, empty since, and does not wipe.
    assert!(host.wipe(&first).unwrap().resumed, "a retry only finishes the PV");

    // Re-bound to another claim and released again: its record does not apply.
    let rebound = job(&vol, &class, "pv-1", "claim-2");
    assert!(!host.wipe(&rebound).unwrap().resumed);
    assert_eq!(host.records()[0].claim.as_deref(), Some("claim-2"));

    // Written since (a host process, an operator): wiped again, and the entry is gone.
    std::fs::write(vol.join("written-later"), b"x").unwrap();
    assert!(!host.wipe(&rebound).unwrap().resumed, "an entry in the root voids the record");
    assert_eq!(entries(&vol), 0);

    // Another PV's wipe of the same disk does not use it either.
    assert!(!host.wipe(&job(&vol, &class, "pv-2", "claim-3")).unwrap().resumed);

    // Pruned once the PVs are finished.
    assert_eq!(record::retain(&host.state, &|_| false).unwrap(), Vec::<String>::new());
    assert!(host.records().is_empty());
}

/// The write counters of a block device, from sysfs.
fn write_counters(device: &Path) -> String {
    let name = device.file_name().unwrap().to_str().unwrap();
    let stat = std::fs::read_to_string(format!("/sys/class/block/{name}/stat")).unwrap();
    let fields: Vec<&str> = stat.split_whitespace().collect();
    // writes, sectors written, discards, flushes.
    format!("{} {} {} {}", fields[4], fields[6], fields.get(11).unwrap_or(&"0"), fields.get(15).unwrap_or(&"0"))
}

#[test]
fn a_completed_block_wipe_is_not_done_again_until_the_device_is_written() {
    let _area = support::area(module_path!());
    if !require_root("a_completed_block_wipe_is_not_done_again_until_the_device_is_written") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("blk");
    std::fs::create_dir_all(&dir).unwrap();
    let disk = LoopDevice::new(&tmp.path().join("disk.img"), 64);
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&disk.device));
    let link = dir.join("disk1");
    symlink(&disk.device, &link).unwrap();
    let class = class(tmp.path(), &dir, "  volumeMode: Block\n  blockCleanMethod: zero\n");
    let host = Host::new(tmp.path());

    let first = job(&link, &class, "pv-b", "claim-b");
    assert!(!host.wipe(&first).unwrap().resumed);
    assert!(host.records()[0].written.is_some(), "the counters after the wipe are kept");
    let before = write_counters(&disk.device);
    let again = host.wipe(&first).unwrap();
    assert!(again.resumed, "{again:?}");
    assert_eq!(write_counters(&disk.device), before, "the retry wrote nothing: the 64 MiB are not zeroed again");

    // Someone writes to the device: the record is void and the device is wiped again.
    run(Command::new("dd")
        .args(["if=/dev/urandom", "bs=4096", "count=1", "oflag=direct", "conv=notrunc"])
        .arg(format!("of={}", disk.device.display())));
    assert!(!host.wipe(&first).unwrap().resumed, "a write since voids the record");
    let mut head = vec![0u8; 4096];
    std::fs::File::open(&disk.device).unwrap().read_exact(&mut head).unwrap();
    assert!(head.iter().all(|&b| b == 0), "wiped again");

    // Someone writes to the loop device's backing file itself: the device's counters do not
    // move, its backing file's times do: wiped again too.
    assert!(host.wipe(&first).unwrap().resumed, "nothing written since the last wipe");
    let counters = write_counters(&disk.device);
    run(Command::new("dd")
        .args(["if=/dev/urandom", "bs=4096", "count=1", "conv=notrunc,fsync"])
        .arg(format!("of={}", tmp.path().join("disk.img").display())));
    assert_eq!(write_counters(&disk.device), counters, "the device's counters did not see the write");
    assert!(!host.wipe(&first).unwrap().resumed, "a write to the backing file voids the record");
}

/// Whether process `pid` is gone (or a zombie nobody waits for).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn a_cancelled_wipe_kills_its_cleaner_command_and_what_it_started() {
    let _area = support::area(module_path!());
    if !require_root("a_cancelled_wipe_kills_its_cleaner_command_and_what_it_started") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cmd");
    std::fs::create_dir_all(&dir).unwrap();
    let disk = LoopDevice::new(&tmp.path().join("disk.img"), 16);
    let link = dir.join("disk1");
    symlink(&disk.device, &link).unwrap();
    let pids = tmp.path().join("pids");
    let script = tmp.path().join("slow-cleaner.sh");
    // A cleaner that starts a helper of its own and sleeps: as `dd` under a script would.
    std::fs::write(
        &script,
        format!("#!/bin/sh\nsleep 300 &\necho \"$$ $!\" > {p}.tmp\nmv {p}.tmp {p}\nsleep 300\n", p = pids.display()),
    )
    .unwrap();
    let class = class(
        tmp.path(),
        &dir,
        &format!("  volumeMode: Block\n  blockCleanerCommand: [\"/bin/sh\", \"{}\"]\n", script.display()),
    );
    let host = Host::new(tmp.path());
    let job = job(&link, &class, "pv-c", "claim-c");

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let cancel = Arc::new(AtomicBool::new(false));
    let canceller = {
        let (cancel, pids) = (cancel.clone(), pids.clone());
        std::thread::spawn(move || {
            let started: Vec<i32> = wait_until("the cleaner's PIDs", WAIT, || {
                let text = std::fs::read_to_string(&pids).ok()?;
                let all: Vec<i32> = text.split_whitespace().filter_map(|p| p.parse().ok()).collect();
                (all.len() == 2).then_some(all)
            });
            cancel.store(true, Ordering::Relaxed); // The agent stops, or the wipe's time is up.
            (started, Instant::now())
        })
    };
    let result = {
        let _entered = runtime.enter();
        wipe(&host.ledger, &host.kubelet, &job, &cancel, &Progress::default())
    };
    let (started, cancelled_at) = canceller.join().unwrap();
    let took = cancelled_at.elapsed();
    let err = result.unwrap_err().to_string();
    assert!(err.contains("cancelled") && err.contains("killed"), "{err}");
    assert!(took < Duration::from_secs(5), "the wipe ended {took:?} after its cancellation");
    for pid in started {
        wait_until(&format!("process {pid} of the cleaner gone"), Duration::from_secs(5), || gone(pid).then_some(()));
    }
    assert!(host.records().is_empty(), "a cancelled wipe is not recorded");
}

/// The API server's audit entries from byte `from` on (whole lines).
fn audit_entries(cp: &ControlPlane, from: u64) -> Vec<Value> {
    let mut text = String::new();
    if let Ok(mut file) = std::fs::File::open(cp.dir.join("logs/audit.log")) {
        file.seek(SeekFrom::Start(from)).unwrap();
        file.read_to_string(&mut text).unwrap();
    }
    text.split_inclusive('\n').filter(|l| l.ends_with('\n')).filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn audit_len(cp: &ControlPlane) -> u64 {
    std::fs::metadata(cp.dir.join("logs/audit.log")).map_or(0, |m| m.len())
}

/// The requests of the agent of `node` in `entries`, as "verb resource" (watches left out:
/// they are the agent's, not any PV's), in order.
fn requests_of(entries: &[Value], node: &str) -> Vec<String> {
    let ua = format!("local-static-provisioner/{} (agent; {node})", env!("CARGO_PKG_VERSION"));
    let mut seen: Vec<(String, String)> = entries
        .iter()
        .filter(|e| e["userAgent"] == ua.as_str() && e["verb"] != "watch")
        .map(|e| {
            let what =
                format!("{} {}", e["verb"].as_str().unwrap_or(""), e["objectRef"]["resource"].as_str().unwrap_or(""));
            (e["requestReceivedTimestamp"].as_str().unwrap_or("").to_string(), what)
        })
        .collect();
    seen.sort();
    seen.into_iter().map(|(_, what)| what).collect()
}

#[test]
fn a_released_filesystem_pv_costs_three_requests_and_its_inventory_view_waits() {
    let _area = support::area(module_path!());
    if !require_root("a_released_filesystem_pv_costs_three_requests_and_its_inventory_view_waits") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "wipe-req-node";
    let name = pv_name("vol1", node, "wipe-req");
    leave_nothing(&cp, &name, node, "wipe-req-claim");
    cp.create_node(node);
    cp.create_storage_class("wipe-req", "Delete");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("fs");
    let vol = dir.join("vol1");
    let _m = mount_tmpfs(&vol, 16);
    let config = tmp.path().join("config");
    write_config(
        &config,
        &[("storageClassMap", &format!("wipe-req:\n  hostDir: {d}\n  mountDir: {d}\n", d = dir.display()))],
    );
    let kubeconfig = cp.agent_kubeconfig(tmp.path());
    // Another test's loop device attached or detached from here on is a change of the host's
    // disks that the inventory lists: without a class that claims devices nothing wakes a pass
    // for it, so the agent may write it with the cycle's first pass (allowed for below).
    let disks = support::DiskChanges::start();
    let agent = AgentProcess::start(&config, node, &kubeconfig, &tmp.path().join("agent.log"));
    let uid = wait_until("PV published", WAIT, || cp.pv_state(&name).map(|(u, _)| u));
    assert_eq!(cp.bind_claim("wipe-req-claim", "wipe-req", false), name);
    std::fs::write(vol.join("data"), b"tenant data").unwrap();
    // Whatever the binding caused is done before the count starts.
    std::thread::sleep(Duration::from_secs(3));
    let mark = audit_len(&cp);
    let released = Instant::now();
    cp.release_claim("wipe-req-claim");
    wait_recycled(&cp, &name, &uid, Some(&vol), WAIT);
    let cycle = released.elapsed();
    // Time for anything the release still causes (the inventory's write at the cycle's end).
    std::thread::sleep(Duration::from_secs(3));
    // The heartbeat's renewals (one write every 10 s, whatever the PVs do) are not the PV's.
    let (inventory, requests): (Vec<String>, Vec<String>) = requests_of(&audit_entries(&cp, mark), node)
        .into_iter()
        .filter(|r| !r.ends_with(" leases"))
        .partition(|r| r.ends_with(" localstoragenodes"));
    eprintln!("requests of the agent for one released PV: {requests:?}, and its node inventory: {inventory:?}");
    eprintln!("requests per released PV: {} (inventory writes {})", requests.len() + inventory.len(), inventory.len());
    // The node inventory's view of the PV's phases (Released, deleted, the new PV Available)
    // waits up to a minute and goes out with the node's other changes: none of its own here.
    eprintln!("the release cycle took {cycle:?}");
    // (A loop device another test attached meanwhile is a change of the host's disks, which
    // the inventory lists: written, and allowed for.)
    let changes = disks.stop();
    assert!(inventory.len() <= changes, "{inventory:?} after a cycle of {cycle:?} ({changes} changes of the disks)");
    assert!(requests.len() <= 3, "{} requests for one released PV: {requests:?}", requests.len());
    // The PV's delete, our finalizer's removal, and the clean volume's new PV, which carries how
    // the volume was wiped in its annotation (core::wipe::wipe_history): no event more.
    assert_eq!(requests, ["delete persistentvolumes", "patch persistentvolumes", "create persistentvolumes"]);
    let new = cp.get_json(&["pv", &name]).unwrap();
    let last = new["metadata"]["annotations"]["local-static-provisioner.io/last-wipe"].as_str().unwrap_or_default();
    assert!(last.contains(&format!("previous-pv={uid}")), "the history is on the new PV: {last:?}");
    // Deferred, not lost: the inventory shows the new PV Available within its minute.
    let new_uid = new["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    let shown = wait_until("the inventory shows the volume Available again", Duration::from_secs(90), || {
        let inv = cp.get_json(&["localstoragenode", node])?;
        let volumes = inv["status"]["volumes"].as_array()?.clone();
        volumes.into_iter().find(|v| v["pv"] == name.as_str() && v["phase"] == "Available" && v["claim"].is_null())
    });
    eprintln!("the inventory's view {:?} after the release: {shown} (new PV {new_uid})", released.elapsed());
    drop(agent);
    leave_nothing(&cp, &name, node, "wipe-req-claim");
}

/// Deletes PV `name` and the Node (forgetting our finalizer): a run on the same control plane
/// (or after a failed one) starts from nothing.
fn leave_nothing(cp: &ControlPlane, name: &str, node: &str, claim: &str) {
    cp.kubectl(&["delete", "pod", claim, "-n", "default", "--grace-period=0", "--force", "--ignore-not-found"]);
    cp.kubectl(&["delete", "pvc", claim, "-n", "default", "--wait=false", "--ignore-not-found"]);
    cp.kubectl(&["patch", "pvc", claim, "-n", "default", "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
    cp.kubectl(&["patch", "pv", name, "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
    cp.kubectl(&["delete", "pv", name, "--wait=false", "--ignore-not-found"]);
    cp.kubectl(&["delete", "node", node, "--ignore-not-found"]);
}

/// The name of the policy of [`hold_deletion`].
const HOLD_POLICY: &str = "wipe-recovery-hold";

/// A ValidatingAdmissionPolicy that refuses the deletion of PV `pv`, in force once this returns.
fn hold_deletion(cp: &ControlPlane, policy: &str, pv: &str) {
    cp.apply(&format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata: {{name: {policy}}}\nspec:\n  failurePolicy: Fail\n  matchConstraints:\n    resourceRules:\n    - apiGroups: [\"\"]\n      apiVersions: [v1]\n      operations: [DELETE]\n      resources: [persistentvolumes]\n  validations:\n  - expression: \"oldObject.metadata.name != '{pv}'\"\n    message: held by the test\n---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {{name: {policy}}}\nspec:\n  policyName: {policy}\n  validationActions: [Deny]\n"
    ));
    wait_until("the policy in force", WAIT, || {
        let out = cp.kubectl(&["delete", "pv", pv, "--dry-run=server"]);
        String::from_utf8_lossy(&out.stderr).contains("held by the test").then_some(())
    });
}

/// Removes the policy of [`hold_deletion`].
fn release_deletion(cp: &ControlPlane) {
    for kind in ["validatingadmissionpolicybinding", "validatingadmissionpolicy"] {
        cp.kubectl(&["delete", kind, HOLD_POLICY, "--ignore-not-found"]);
    }
}

#[test]
fn a_wipe_whose_pv_could_not_be_finished_is_not_done_again() {
    let _area = support::area(module_path!());
    if !require_root("a_wipe_whose_pv_could_not_be_finished_is_not_done_again") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "wipe-finish-node";
    let name = pv_name("vol1", node, "wipe-finish");
    release_deletion(&cp);
    leave_nothing(&cp, &name, node, "wipe-finish-claim");
    cp.create_node(node);
    cp.create_storage_class("wipe-finish", "Delete");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("fs");
    let vol = dir.join("vol1");
    let _m = mount_tmpfs(&vol, 16);
    let config = tmp.path().join("config");
    write_config(
        &config,
        &[("storageClassMap", &format!("wipe-finish:\n  hostDir: {d}\n  mountDir: {d}\n", d = dir.display()))],
    );
    let kubeconfig = cp.agent_kubeconfig(tmp.path());
    let log = tmp.path().join("agent.log");
    let agent = AgentProcess::start(&config, node, &kubeconfig, &log);
    let uid = wait_until("PV published", WAIT, || cp.pv_state(&name).map(|(u, _)| u));
    assert_eq!(cp.bind_claim("wipe-finish-claim", "wipe-finish", false), name);
    std::fs::write(vol.join("data"), b"tenant data").unwrap();

    hold_deletion(&cp, HOLD_POLICY, &name);
    cp.release_claim("wipe-finish-claim");
    let wiped = |n: usize| move |log: &str| (log.matches("volume wiped").count() >= n).then_some(());
    let failed_finishes = |log: &str| log.matches("wiped, but the PV could not be finished").count();
    wait_until("the wipe done and its PV's finish refused", WAIT, || {
        let log = agent.log_text();
        wiped(1)(&log)?;
        (failed_finishes(&log) >= 1).then_some(())
    });
    assert!(entries(&vol) == 0);
    let state = tmp.path().join(format!("state-{node}"));
    assert_eq!(record::read(&state).unwrap().len(), 1, "the completed wipe is recorded");

    // Written meanwhile: the record is void, the retry wipes again (and is refused again).
    std::fs::write(vol.join("written-later"), b"x").unwrap();
    wait_until("the second wipe and its refused finish", WAIT, || {
        let log = agent.log_text();
        wiped(2)(&log)?;
        (failed_finishes(&log) >= 2).then_some(())
    });
    assert!(agent.log_text().contains("the recorded wipe does not hold; wiping again"));
    assert_eq!(entries(&vol), 0);

    // The API lets go: the next retry proves the disk unchanged and only finishes the PV.
    release_deletion(&cp);
    wait_recycled(&cp, &name, &uid, Some(&vol), WAIT);
    let log = agent.stop();
    assert_eq!(log.matches("volume wiped").count(), 2, "not wiped a third time:\n{log}");
    assert!(log.contains("wiped before and unchanged since (recorded); not wiped again"), "{log}");
    assert!(record::read(&state).unwrap().is_empty(), "the record goes once the PV is finished");
    leave_nothing(&cp, &name, node, "wipe-finish-claim");
}

#[test]
fn a_stopping_agent_kills_the_cleaner_command_of_its_running_wipe() {
    let _area = support::area(module_path!());
    if !require_root("a_stopping_agent_kills_the_cleaner_command_of_its_running_wipe") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "wipe-stop-node";
    let name = pv_name("disk1", node, "wipe-stop");
    leave_nothing(&cp, &name, node, "wipe-stop-claim");
    cp.create_node(node);
    cp.create_storage_class("wipe-stop", "Delete");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("blk");
    std::fs::create_dir_all(&dir).unwrap();
    let disk = LoopDevice::new(&tmp.path().join("disk.img"), 16);
    symlink(&disk.device, dir.join("disk1")).unwrap();
    let pids = tmp.path().join("pids");
    let script = tmp.path().join("slow-cleaner.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\nsleep 300 &\necho \"$$ $!\" > {p}.tmp\nmv {p}.tmp {p}\nsleep 300\n", p = pids.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let config = tmp.path().join("config");
    let map = format!(
        "wipe-stop:\n  hostDir: {d}\n  mountDir: {d}\n  volumeMode: Block\n  blockCleanerCommand: [\"{s}\"]\n",
        d = dir.display(),
        s = script.display()
    );
    write_config(&config, &[("storageClassMap", &map)]);
    let kubeconfig = cp.agent_kubeconfig(tmp.path());
    let agent = AgentProcess::start(&config, node, &kubeconfig, &tmp.path().join("agent.log"));
    let uid = wait_until("PV published", WAIT, || cp.pv_state(&name).map(|(u, _)| u));
    assert_eq!(cp.bind_claim("wipe-stop-claim", "wipe-stop", true), name);
    cp.release_claim("wipe-stop-claim");
    let started: Vec<i32> = wait_until("the cleaner running", WAIT, || {
        let text = std::fs::read_to_string(&pids).ok()?;
        let all: Vec<i32> = text.split_whitespace().filter_map(|p| p.parse().ok()).collect();
        (all.len() == 2).then_some(all)
    });
    let stopping = Instant::now();
    let log = agent.stop(); // SIGTERM: a rolling update, a drain.
    let took = stopping.elapsed();
    for pid in started {
        wait_until(&format!("cleaner process {pid} gone"), Duration::from_secs(5), || gone(pid).then_some(()));
    }
    assert!(took < Duration::from_secs(8), "the agent took {took:?} to stop:\n{log}");
    assert!(log.contains("cancelled"), "{log}");
    assert_eq!(cp.pv_state(&name), Some((uid, "Released".to_string())), "the PV stays for the next agent");
    leave_nothing(&cp, &name, node, "wipe-stop-claim");
}

//! What an idle or busy agent costs (issue 29): its requests counted in the API server's audit
//! log (by its User-Agent, which names the node) for a PV deleted by hand while its volume is
//! still there (the agent releases its finalizer and re-creates it; upstream, which sets no
//! finalizer, sends the one create) and for a start-up (each watch one request, the Node
//! from its own, one adoption list); and the wake-ups of its block-device watch while
//! idle. Against the real control plane with real tmpfs volumes; needs root.

use crate::support;

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::{AgentProcess, ControlPlane, mount_tmpfs, require_root, wait_until, write_config};

const WAIT: Duration = Duration::from_secs(60);

fn audit_log(cp: &ControlPlane) -> std::path::PathBuf {
    cp.dir.join("logs/audit.log")
}

fn audit_len(cp: &ControlPlane) -> u64 {
    std::fs::metadata(audit_log(cp)).map_or(0, |m| m.len())
}

/// The requests of the agent of `node` written to the audit log from byte `from` on, one per
/// audit ID (a request is logged once per stage), as "verb resource[/name]".
fn requests_of(cp: &ControlPlane, node: &str, from: u64) -> Vec<String> {
    let mut text = String::new();
    if let Ok(mut file) = std::fs::File::open(audit_log(cp)) {
        file.seek(SeekFrom::Start(from)).unwrap();
        file.read_to_string(&mut text).unwrap();
    }
    let agent = format!("local-static-provisioner/{} (agent; {node})", env!("CARGO_PKG_VERSION"));
    let mut seen = std::collections::BTreeSet::new();
    text.split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["userAgent"] == agent.as_str())
        .filter(|e| seen.insert(e["auditID"].as_str().unwrap_or_default().to_string()))
        .map(|e| {
            let object = &e["objectRef"];
            let name = object["name"].as_str().map(|n| format!("/{n}")).unwrap_or_default();
            format!("{} {}{name}", e["verb"].as_str().unwrap_or("?"), object["resource"].as_str().unwrap_or("?"))
        })
        .collect()
}

/// The requests on LocalStorageNodes (the node inventory), apart from the others.
fn split_inventory(requests: Vec<String>) -> (Vec<String>, Vec<String>) {
    requests.into_iter().partition(|r| !r.contains(" localstoragenodes"))
}

/// A node name of this run only (`base` and the temporary directory's name): an earlier run's
/// PVs of the same node would be this agent's to look after.
fn node_of_run(cp: &ControlPlane, base: &str, root: &Path) -> String {
    let run: String = root.file_name().unwrap().to_string_lossy().chars().filter(char::is_ascii_alphanumeric).collect();
    let node = format!("{base}-{}", run.to_ascii_lowercase());
    cp.create_node(&node);
    node
}

/// A class over `dir` with `volumes` tmpfs volumes, its StorageClass, and the agent's config.
fn lab(cp: &ControlPlane, root: &Path, class: &str, volumes: usize) -> (Vec<support::Mount>, std::path::PathBuf) {
    cp.create_storage_class(class, "Delete");
    let dir = root.join("disks");
    // Entry names of this run only: PV names are made from them, and an earlier run's PVs stay.
    let run = root.file_name().unwrap().to_string_lossy().replace('.', "");
    let mounts = (0..volumes).map(|i| mount_tmpfs(&dir.join(format!("v{i}-{run}")), 4)).collect();
    let config = root.join("config");
    let map = format!("{class}:\n  hostDir: {d}\n  mountDir: {d}\n", d = dir.display());
    write_config(&config, &[("storageClassMap", &map), ("minResyncPeriod", "1h\n")]);
    (mounts, config)
}

#[test]
fn a_pv_deleted_by_hand_costs_one_patch_and_its_re_creation() {
    let _area = support::area(module_path!());
    if !require_root("a_pv_deleted_by_hand_costs_one_patch_and_its_re_creation") {
        return;
    }
    let cp = ControlPlane::get();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let node = &node_of_run(&cp, "idle-cost-deleted", root);
    let (_mounts, config) = lab(&cp, root, "idle-cost-deleted", 1);
    let kubeconfig = cp.agent_kubeconfig(root);
    let prefix = root.display().to_string();
    let agent = AgentProcess::start(&config, node, &kubeconfig, &root.join("agent.log"));
    let pv = wait_until("the PV published", WAIT, || {
        let pvs = cp.pvs_under(&prefix);
        pvs.first().filter(|pv| pv["status"]["phase"] == "Available").cloned()
    });
    let name = pv["metadata"]["name"].as_str().unwrap().to_string();
    let old_uid = pv["metadata"]["uid"].as_str().unwrap().to_string();
    // Idle first: what follows the publication (its mark, its events) is not counted.
    std::thread::sleep(Duration::from_secs(3));
    let from = audit_len(&cp);
    let disks = support::DiskChanges::start();
    cp.kubectl_ok(&["delete", "pv", &name, "--wait=false"]);
    wait_until("the PV re-created", WAIT, || {
        let pvs = cp.pvs_under(&prefix);
        pvs.first().filter(|pv| pv["metadata"]["uid"] != old_uid.as_str()).cloned()
    });
    // Whatever the re-creation causes comes within the settle window and a pass or two.
    std::thread::sleep(Duration::from_secs(3));
    // The heartbeat's renewals (one write every 10 s, whatever the PVs do) are not the PV's.
    let all: Vec<String> = requests_of(&cp, node, from).into_iter().filter(|r| !r.contains(" leases/")).collect();
    let (requests, inventory) = split_inventory(all);
    let log = agent.stop();
    assert!(!requests.is_empty(), "no request of the agent in the audit log: is its User-Agent right?\n{log}");
    eprintln!("requests per deleted PV: {} ({requests:?}; inventory {inventory:?})", requests.len() + inventory.len());
    // The node inventory follows the PV (deleted, then published again): steps of that cycle
    // wait for its end, which shows the volume as it was, so nothing is written.
    // (A loop device another test attached meanwhile is a change of the host's disks, which
    // the inventory lists: written, and allowed for.)
    let changes = disks.stop();
    assert!(
        inventory.len() <= changes,
        "inventory writes per deleted PV: {inventory:?} ({changes} changes of the disks)"
    );
    let creates = requests.iter().filter(|r| r.starts_with("create persistentvolumes")).count();
    assert_eq!(creates, 1, "{requests:?}");
    // The finalizer the deletion waits on is released with one patch (the store already has
    // the PV's UID and finalizers): that and the create, nothing else.
    assert!(requests.len() <= 2, "requests per deleted PV: {requests:?}");
}

/// An agent started with 3 volumes on `cp`: its requests (apart from those on its node
/// inventory, which come second) from its start until its inventory shows the 3 PVs and a quiet
/// moment passed, and its log.
fn start_up_requests(cp: &ControlPlane, base: &str) -> (Vec<String>, Vec<String>, String) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let node = &node_of_run(cp, base, root);
    let (_mounts, config) = lab(cp, root, base, 3);
    let kubeconfig = cp.agent_kubeconfig(root);
    let prefix = root.display().to_string();
    let from = audit_len(cp);
    let agent = AgentProcess::start(&config, node, &kubeconfig, &root.join("agent.log"));
    wait_until("3 PVs published", WAIT, || (cp.pvs_under(&prefix).len() == 3).then_some(()));
    // Its node inventory shows them (written once the changes settled), then a quiet moment.
    wait_until("the inventory shows the 3 PVs", WAIT, || {
        let inv = cp.get_json(&["localstoragenode", node])?;
        (inv["status"]["summary"]["volumes"] == 3).then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    let (requests, inventory) = split_inventory(requests_of(cp, node, from));
    let log = agent.stop();
    assert!(!requests.is_empty(), "no request of the agent in the audit log\n{log}");
    // Its node inventory: read once, created once, and written as the volumes were published
    // (changes within its delay as one write).
    let own = |verb: &str| inventory.iter().filter(|r| **r == format!("{verb} localstoragenodes/{node}")).count();
    assert_eq!((own("get"), own("create")), (1, 1), "{inventory:?}");
    assert!((1..=4).contains(&own("patch")), "{inventory:?}");
    assert_eq!(own("get") + own("create") + own("patch"), inventory.len(), "nothing else: {inventory:?}");
    // The Node comes with its watch's first events: no read of its own.
    assert_eq!(count(&requests, "get nodes"), 0, "{requests:?}");
    assert_eq!(count(&requests, "create persistentvolumes"), 3, "{requests:?}");
    // Nothing but the watches' lists and watches, the PVs' creates and their Events.
    let other: Vec<&String> = requests
        .iter()
        .filter(|r| !r.starts_with("create persistentvolumes"))
        .filter(|r| !r.starts_with("list ") && !r.starts_with("watch ") && !r.starts_with("create events"))
        .collect();
    assert!(other.is_empty(), "unexpected start-up requests: {other:?} (all: {requests:?})");
    (requests, inventory, log)
}

fn count(requests: &[String], prefix: &str) -> usize {
    requests.iter().filter(|r| r.starts_with(prefix)).count()
}

/// Each watch (its Node, this node's PVs, the StorageClasses) is one request: a streaming list,
/// whose first events are the objects that exist (the Node too: not read apart). The one list
/// is the adoption's (the cluster's PVs, once).
#[test]
fn start_up_reads_the_node_and_each_watch_with_one_request() {
    let _area = support::area(module_path!());
    if !require_root("start_up_reads_the_node_and_each_watch_with_one_request") {
        return;
    }
    let cp = ControlPlane::get();
    let (requests, _, _) = start_up_requests(&cp, "idle-cost-start");
    for watched in ["nodes", "persistentvolumes", "storageclasses"] {
        assert_eq!(count(&requests, &format!("watch {watched}")), 1, "{watched}: {requests:?}");
    }
    assert_eq!(count(&requests, "list persistentvolumes"), 1, "the adoption's only: {requests:?}");
    assert_eq!(count(&requests, "list "), 1, "no other list: {requests:?}");
}

/// An API server that does not serve streaming lists (the WatchList feature gate off, as
/// before Kubernetes 1.32) refuses the first watch; each watch then lists and watches, once,
/// and the agent publishes as on any other. A control plane of this test's own.
#[test]
fn without_streaming_lists_each_watch_lists_then_watches() {
    let _area = support::area(module_path!());
    if !require_root("without_streaming_lists_each_watch_lists_then_watches") {
        return;
    }
    let cp = ControlPlane::private(&["--feature-gates=WatchList=false"]);
    let (requests, _, log) = start_up_requests(&cp, "idle-cost-no-watch-list");
    for watched in ["nodes", "storageclasses"] {
        assert_eq!(count(&requests, &format!("list {watched}")), 1, "{watched}: {requests:?}");
    }
    // The watch's list of this node's PVs, and the adoption's.
    assert_eq!(count(&requests, "list persistentvolumes"), 2, "{requests:?}");
    // Each watch: the refused streaming one, then the one after the list.
    for watched in ["nodes", "persistentvolumes", "storageclasses"] {
        assert_eq!(count(&requests, &format!("watch {watched}")), 2, "{watched}: {requests:?}");
    }
    assert_eq!(log.matches("the API server does not serve streaming lists").count(), 3, "said once per watch:\n{log}");
}

/// The voluntary context switches (sleeps ended) of the agent's thread named `name`.
fn wakes_of(pid: u32, name: &str) -> Option<u64> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("voluntary_ctxt_switches:"))?;
        return line.split_whitespace().nth(1)?.parse().ok();
    }
    None
}

#[test]
fn an_idle_agent_without_devices_or_disks_does_not_poll_block_devices() {
    let _area = support::area(module_path!());
    if !require_root("an_idle_agent_without_devices_or_disks_does_not_poll_block_devices") {
        return;
    }
    let cp = ControlPlane::get();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let node = &node_of_run(&cp, "idle-cost-idle", root);
    // tmpfs volumes only: no class claims devices, no volume is on a disk.
    let (_mounts, config) = lab(&cp, root, "idle-cost-idle", 3);
    let kubeconfig = cp.agent_kubeconfig(root);
    let prefix = root.display().to_string();
    let agent = AgentProcess::start(&config, node, &kubeconfig, &root.join("agent.log"));
    wait_until("3 PVs published", WAIT, || (cp.pvs_under(&prefix).len() == 3).then_some(()));
    std::thread::sleep(Duration::from_secs(2));
    let before = wakes_of(agent.pid(), "block-device-wa").expect("the block-device watch thread");
    std::thread::sleep(Duration::from_secs(5));
    let after = wakes_of(agent.pid(), "block-device-wa").expect("the block-device watch thread");
    agent.stop();
    // A poll every 250 ms woke it 20 times in 5 s. Now only a device event does (another test
    // on this machine attaching a loop device, say): a few at most.
    assert!(after - before < 8, "the block-device watch woke {} times in 5 s of idleness", after - before);
}

/// The passes the agent has run (its reconcile-duration histogram's count).
fn passes(agent: &AgentProcess) -> u64 {
    let metrics = agent.admin_get("/metrics");
    let line = metrics.lines().find(|l| l.starts_with("local_static_provisioner_reconcile_duration_seconds_count"));
    line.and_then(|l| l.split_whitespace().last()).and_then(|n| n.parse().ok()).expect("the pass counter")
}

/// Waits up to 5 s for a pass after `before`; whether one ran.
fn a_pass_after(agent: &AgentProcess, before: u64) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        if passes(agent) > before {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn mounts_elsewhere_cost_no_pass_and_mounts_of_its_volumes_still_wake_one() {
    let _area = support::area(module_path!());
    if !require_root("mounts_elsewhere_cost_no_pass_and_mounts_of_its_volumes_still_wake_one") {
        return;
    }
    let cp = ControlPlane::get();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let node = &node_of_run(&cp, "idle-cost-mounts", root);
    let (mounts, config) = lab(&cp, root, "idle-cost-mounts", 3);
    let kubeconfig = cp.agent_kubeconfig(root);
    let prefix = root.display().to_string();
    let agent = AgentProcess::start(&config, node, &kubeconfig, &root.join("agent.log"));
    wait_until("3 PVs published", WAIT, || (cp.pvs_under(&prefix).len() == 3).then_some(()));
    std::thread::sleep(Duration::from_secs(2));
    // A tmpfs outside the discovery directory, mounted and unmounted ten times (kubelet does so
    // for every pod on a busy node): each used to wake about four passes.
    let elsewhere = root.join("elsewhere");
    let before = passes(&agent);
    for _ in 0..10 {
        drop(mount_tmpfs(&elsewhere, 1));
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    let churned = passes(&agent) - before;
    // A bind mount of a volume elsewhere (kubelet's into a pod: a wipe must wait for it), its
    // unmount, and a new entry mounted in the discovery directory each wake a pass promptly.
    let before = passes(&agent);
    let bind = support::bind_mount(&mounts[0].path, &root.join("pod/volumes/pv"));
    let bind_woke = a_pass_after(&agent, before);
    let before = passes(&agent);
    drop(bind);
    let unbind_woke = a_pass_after(&agent, before);
    let before = passes(&agent);
    let run = root.file_name().unwrap().to_string_lossy().replace('.', "");
    let entry = mount_tmpfs(&root.join(format!("disks/new-{run}")), 4);
    let entry_woke = a_pass_after(&agent, before);
    wait_until("the new entry's PV", WAIT, || (cp.pvs_under(&prefix).len() == 4).then_some(()));
    agent.stop();
    drop(entry);
    drop(mounts);
    cp.forget_pvs_under(&prefix);
    // One stray pass is allowed (a timer of the agent's own); the churn used to cost ~40.
    assert!(churned <= 1, "10 mounts and unmounts elsewhere cost {churned} passes");
    assert!(bind_woke, "a bind mount of a volume elsewhere woke no pass");
    assert!(unbind_woke, "its unmount woke no pass");
    assert!(entry_woke, "a new entry mounted in the discovery directory woke no pass");
}

//! Deleted and re-created Nodes on the real control plane: node-cleanup releases the claims
//! and PVs of a deleted Node after the grace period and never touches a NotReady one nor acts
//! blind; two replicas never act at once, and a leader stopped in the middle of a pass sends no
//! write once it resumes (checked in the API server's audit log); the agent of a re-created Node
//! re-adopts PVs whose disk is still there and handles stale ones. Every process runs with its
//! own RBAC.

use crate::support;

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use local_static_provisioner::core::volumes::naming::pv_name;
use serde_json::Value;
use support::{AgentProcess, ControlPlane, mount_tmpfs, require_root, wait_until, write_config};

const WAIT: Duration = Duration::from_secs(90);
const NS: &str = "local-static-provisioner";
/// A 1 s resync, and succession decisions after 1 s instead of a minute.
const FAST: &[&str] = &["--succession-settle", "1s"];
/// The one behaviour that waits for the resync by design: a Node deleted and registered again
/// while its agent keeps running is noticed when the agent re-reads its Node at the resync (it
/// may only get its own Node, not watch Nodes). A 1 s resync keeps that part of the test short.
const FAST_NODE_REREAD: &[&str] = &["--succession-settle", "1s", "--discovery-period", "1s"];
/// Our wipe finalizer.
const FINALIZER: &str = "local-static-provisioner.io/wipe";

fn class_map(classes: &[(&str, &Path)]) -> String {
    classes.iter().map(|(c, d)| format!("{c}:\n  hostDir: {d}\n  mountDir: {d}\n", d = d.display())).collect()
}

/// A claim bound directly to `pv` (no pod).
fn claim_pv(cp: &ControlPlane, claim: &str, class: &str, pv: &str) {
    cp.apply(&format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {claim}, namespace: default}}\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: {class}\n  volumeName: {pv}\n  resources: {{requests: {{storage: 1Mi}}}}\n"
    ));
    wait_until(&format!("claim {claim} bound to {pv}"), WAIT, || (cp.pv_state(pv)?.1 == "Bound").then_some(()));
}

fn claim_uid(cp: &ControlPlane, claim: &str) -> Option<String> {
    let pvc = cp.get_json(&["pvc", claim, "-n", "default"])?;
    pvc["metadata"]["deletionTimestamp"].is_null().then(|| pvc["metadata"]["uid"].as_str().unwrap().to_string())
}

fn annotation(cp: &ControlPlane, pv: &str, key: &str) -> Option<String> {
    cp.get_json(&["pv", pv])?["metadata"]["annotations"][key].as_str().map(str::to_string)
}

/// A local PV as a local-static-provisioner makes it, created as admin (no disk needed: only
/// node-cleanup looks at it).
fn make_pv(cp: &ControlPlane, name: &str, node: &str, class: &str) {
    cp.apply(&format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: {name}\n  annotations: {{pv.kubernetes.io/provisioned-by: local-volume-provisioner-{node}-0f0e1d2c-3b4a-5968-7786-95a4b3c2d1e0}}\n  labels: {{local-static-provisioner.io/node: {node}}}\n  finalizers: [local-static-provisioner.io/wipe]\nspec:\n  capacity: {{storage: 1Gi}}\n  accessModes: [ReadWriteOnce]\n  persistentVolumeReclaimPolicy: Delete\n  storageClassName: {class}\n  local: {{path: /mnt/nowhere/{name}}}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [{node}]}}]\n"
    ));
    wait_until(&format!("{name} Available"), WAIT, || (cp.pv_state(name)?.1 == "Available").then_some(()));
}

/// A PV of a Node that is then deleted: what node-cleanup exists for.
fn strand_pv(cp: &ControlPlane, node: &str, pv: &str, class: &str) {
    cp.create_node(node);
    make_pv(cp, pv, node, class);
    cp.kubectl_ok(&["delete", "node", node]);
}

/// Two node-cleanup replicas for `class` sharing the Lease `<class>-test`, the first one
/// leading and the second one waiting; `lease` is the lease duration and renew deadline.
fn two_replicas(
    cp: &ControlPlane,
    class: &str,
    grace: &str,
    lease: [&str; 2],
) -> (tempfile::TempDir, AgentProcess, AgentProcess) {
    let grace = ["--grace-period", grace];
    two_replicas_with(cp, class, lease, &grace, &grace)
}

/// As `two_replicas`, with flags of each replica's own (the grace period among them).
fn two_replicas_with(
    cp: &ControlPlane,
    class: &str,
    lease: [&str; 2],
    first_flags: &[&str],
    second_flags: &[&str],
) -> (tempfile::TempDir, AgentProcess, AgentProcess) {
    cp.create_storage_class(class, "Delete");
    // node-cleanup runs on some Node: a cluster with no Node at all is never acted on.
    cp.create_node("nc-bystander");
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = cp.node_cleanup_kubeconfig(tmp.path());
    let lease_name = format!("{class}-test");
    let flags = [
        "--storage-classes",
        class,
        "--resync-period",
        "500ms",
        "--lease-name",
        &lease_name,
        "--lease-duration",
        lease[0],
        "--renew-deadline",
        lease[1],
        "--retry-period",
        "500ms",
    ];
    let first =
        AgentProcess::start_node_cleanup(&kubeconfig, &tmp.path().join("first.log"), &[&flags, first_flags].concat());
    wait_until("first replica leads", WAIT, || first.log_text().contains("leadership acquired").then_some(()));
    let second =
        AgentProcess::start_node_cleanup(&kubeconfig, &tmp.path().join("second.log"), &[&flags, second_flags].concat());
    wait_until("second replica waits", WAIT, || second.log_text().contains("another replica leads").then_some(()));
    (tmp, first, second)
}

#[test]
fn deleted_node_is_released_after_grace_while_not_ready_node_and_blind_runs_lose_nothing() {
    let _area = support::area(module_path!());
    if !require_root("deleted_node_is_released_after_grace_while_not_ready_node_and_blind_runs_lose_nothing") {
        return;
    }
    let cp = ControlPlane::get();
    let (gone, sick) = ("nc-gone-node", "nc-sick-node");
    let class = "nc-fs";
    cp.create_storage_class(class, "Delete");
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = cp.agent_kubeconfig(tmp.path());
    // Each node gets an agent that publishes two tmpfs volumes; one of each is claimed.
    let mut mounts = Vec::new();
    let mut names = Vec::new();
    for node in [gone, sick] {
        cp.create_node(node);
        let dir = tmp.path().join(node);
        for vol in ["a", "b"] {
            mounts.push(mount_tmpfs(&dir.join(vol), 8));
            names.push(pv_name(vol, node, class));
        }
        let config = tmp.path().join(format!("{node}-config"));
        write_config(&config, &[("storageClassMap", &class_map(&[(class, &dir)]))]);
        let agent = AgentProcess::start(&config, node, &kubeconfig, &tmp.path().join(format!("{node}-agent.log")));
        for vol in ["a", "b"] {
            let pv = pv_name(vol, node, class);
            wait_until(&format!("{pv} published"), WAIT, || (cp.pv_state(&pv)?.1 == "Available").then_some(()));
        }
        claim_pv(&cp, &format!("{node}-claim"), class, &pv_name("a", node, class));
        // The machines go away (or stop answering): their agents stop.
        agent.stop();
    }
    let gone_claim_uid = claim_uid(&cp, &format!("{gone}-claim")).unwrap();
    let sick_claim_uid = claim_uid(&cp, &format!("{sick}-claim")).unwrap();
    let sick_pvs: Vec<(String, String)> = names[2..].iter().map(|n| (n.clone(), cp.pv_state(n).unwrap().0)).collect();
    cp.set_node_ready(sick, false);
    cp.kubectl_ok(&["delete", "node", gone]);

    // Blind: a node-cleanup that may not list Nodes must do nothing at all, even past the grace.
    cp.apply(&format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: nc-blind, namespace: {NS}}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: nc-blind}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nc-blind}}\nsubjects: [{{kind: ServiceAccount, name: nc-blind, namespace: {NS}}}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: nc-blind}}\nrules:\n- {{apiGroups: [''], resources: [persistentvolumes], verbs: [get, list, watch, delete, patch]}}\n- {{apiGroups: [''], resources: [persistentvolumeclaims], verbs: [delete]}}\n- {{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, create, update]}}\n"
    ));
    let token = cp.kubectl_ok(&["create", "token", "nc-blind", "-n", NS]);
    let blind_kubeconfig = cp.token_kubeconfig(tmp.path(), "nc-blind", token.trim());
    let blind = AgentProcess::start_node_cleanup(
        &blind_kubeconfig,
        &tmp.path().join("blind.log"),
        &["--storage-classes", class, "--grace-period", "1s", "--resync-period", "500ms", "--lease-name", "nc-blind"],
    );
    wait_until("blind run leads and fails to list Nodes a few times", WAIT, || {
        let log = blind.log_text();
        (log.contains("leadership acquired") && log.matches("cannot list Nodes").count() >= 5).then_some(())
    });
    let blind_log = blind.stop();
    assert!(!blind_log.contains("deleted"), "{blind_log}");
    assert_eq!(claim_uid(&cp, &format!("{gone}-claim")).as_deref(), Some(gone_claim_uid.as_str()));
    for name in &names {
        assert!(cp.pv_state(name).is_some(), "{name} must survive a blind run");
    }

    // The real one, with its own RBAC.
    let nc_kubeconfig = cp.node_cleanup_kubeconfig(tmp.path());
    let nc = AgentProcess::start_node_cleanup(
        &nc_kubeconfig,
        &tmp.path().join("node-cleanup.log"),
        &["--storage-classes", &format!("other-class,{class}"), "--grace-period", "6s", "--resync-period", "1s"],
    );
    wait_until("node-cleanup notices the deleted node", WAIT, || {
        nc.log_text().contains(&format!("node={gone}")).then_some(())
    });
    // Just noticed: the grace period has only begun, so the claim is untouched.
    assert_eq!(claim_uid(&cp, &format!("{gone}-claim")).as_deref(), Some(gone_claim_uid.as_str()));
    wait_until("the deleted node's claim is deleted", WAIT, || {
        claim_uid(&cp, &format!("{gone}-claim")).is_none().then_some(())
    });
    for name in &names[..2] {
        wait_until(&format!("{name} of the deleted node gone"), WAIT, || cp.pv_state(name).is_none().then_some(()));
    }
    assert!(cp.has_event(&format!("{gone}-claim"), "NodeGone", "StatefulSet"));
    assert!(cp.has_event(&names[1], "NodeGone", "PV deleted"));
    let metrics = nc.admin_get("/metrics");
    for line in [
        "local_static_provisioner_node_cleanup_actions_total{action=\"delete_claim\",cause=\"node_gone\"} 1",
        "local_static_provisioner_node_cleanup_actions_total{action=\"delete_pv\",cause=\"node_gone\"} 2",
        "local_static_provisioner_node_cleanup_leader 1",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }

    // The NotReady node, well past the same grace period: nothing of it was touched.
    assert_eq!(claim_uid(&cp, &format!("{sick}-claim")).as_deref(), Some(sick_claim_uid.as_str()));
    for (name, uid) in &sick_pvs {
        assert_eq!(cp.pv_state(name).map(|s| s.0).as_deref(), Some(uid.as_str()), "{name} of the NotReady node");
    }
    assert_eq!(cp.pv_state(&names[2]).unwrap().1, "Bound");
    let log = nc.stop();
    assert!(!log.contains(&format!("node={sick}")), "the NotReady node was never taken for gone:\n{log}");
    // Its RBAC (deploy/node-cleanup) lets it do all it does: its watches never fail for want of it.
    assert!(!log.contains("forbidden"), "node-cleanup was refused something:\n{log}");
    // The sick node's PVs: made unclaimed and released so other tests' cluster stays tidy.
    cp.kubectl_ok(&["delete", "pvc", &format!("{sick}-claim"), "-n", "default", "--wait=false"]);
    drop(mounts);
}

#[test]
fn two_replicas_never_act_at_once_and_the_second_takes_over() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let class = "nc-ha";
    let (_tmp, first, second) = two_replicas(&cp, class, "2s", ["4s", "3s"]);
    for (i, node) in ["nc-ha-node-1", "nc-ha-node-2", "nc-ha-node-3"].iter().enumerate() {
        strand_pv(&cp, node, &format!("nc-ha-pv-{i}"), class);
    }
    for i in 0..3 {
        let name = format!("nc-ha-pv-{i}");
        wait_until(&format!("{name} deleted"), WAIT, || cp.pv_state(&name).is_none().then_some(()));
    }
    let (first_log, second_log) = (first.log_text(), second.log_text());
    assert_eq!(first_log.matches("PV deleted").count(), 3, "{first_log}");
    assert!(!second_log.contains("PV deleted"), "{second_log}");
    assert!(!second_log.contains("leadership acquired"), "{second_log}");
    let lease = cp.get_json(&["lease", "nc-ha-test", "-n", NS]).unwrap();
    let holder = lease["spec"]["holderIdentity"].as_str().unwrap().to_string();

    // The leader stops (releasing the lease): the other replica takes over and acts.
    first.stop();
    wait_until("second replica takes over", WAIT, || second.log_text().contains("leadership acquired").then_some(()));
    let lease = cp.get_json(&["lease", "nc-ha-test", "-n", NS]).unwrap();
    assert_ne!(lease["spec"]["holderIdentity"].as_str().unwrap(), holder);
    assert!(lease["spec"]["leaseTransitions"].as_i64().unwrap() >= 1);
    strand_pv(&cp, "nc-ha-node-4", "nc-ha-pv-4", class);
    wait_until("the new leader acts", WAIT, || cp.pv_state("nc-ha-pv-4").is_none().then_some(()));
    assert!(second.stop().contains("PV deleted"));
}

#[test]
fn recreated_node_readopts_its_disks_and_handles_stale_ones() {
    let _area = support::area(module_path!());
    if !require_root("recreated_node_readopts_its_disks_and_handles_stale_ones") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "nc-reborn-node";
    let class = "nc-reborn";
    cp.create_storage_class(class, "Delete");
    let old_uid = cp.create_node(node);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("disks");
    let kubeconfig = cp.agent_kubeconfig(tmp.path());
    let config = tmp.path().join("config");
    write_config(&config, &[("storageClassMap", &class_map(&[(class, &dir)]))]);
    // same: bound, stays; swapped: bound, replaced by another disk; lost: bound, unmounted;
    // free: unbound, replaced by another disk.
    let vols = ["same", "swapped", "lost", "free"];
    let mut mounts: Vec<_> = vols.iter().map(|v| Some(mount_tmpfs(&dir.join(v), 8))).collect();
    let pv = |v: &str| pv_name(v, node, class);
    let agent = AgentProcess::start_with(&config, node, &kubeconfig, &tmp.path().join("agent-1.log"), FAST);
    for v in vols {
        wait_until(&format!("{v} published"), WAIT, || (cp.pv_state(&pv(v))?.1 == "Available").then_some(()));
    }
    for v in ["same", "swapped", "lost"] {
        claim_pv(&cp, &format!("reborn-{v}"), class, &pv(v));
    }
    std::fs::write(dir.join("same/data"), b"tenant data").unwrap();
    let before: Vec<Value> = vols.iter().map(|v| cp.get_json(&["pv", &pv(v)]).unwrap()).collect();
    agent.stop();

    // The Node object is deleted and the machine registers again: same name, new UID. Meanwhile
    // two disks were swapped and one is gone.
    cp.kubectl_ok(&["delete", "node", node]);
    let new_uid = cp.create_node(node);
    assert_ne!(old_uid, new_uid);
    for (i, v) in vols.iter().enumerate() {
        if *v != "same" {
            mounts[i] = None; // unmount
        }
    }
    let _swapped = mount_tmpfs(&dir.join("swapped"), 8);
    let _free = mount_tmpfs(&dir.join("free"), 8);

    let agent = AgentProcess::start_with(&config, node, &kubeconfig, &tmp.path().join("agent-2.log"), FAST_NODE_REREAD);
    let new_provisioner = format!("local-volume-provisioner-{node}-{new_uid}");
    wait_until("same disk re-adopted", WAIT, || {
        (annotation(&cp, &pv("same"), "pv.kubernetes.io/provisioned-by")? == new_provisioner).then_some(())
    });
    let after = cp.get_json(&["pv", &pv("same")]).unwrap();
    // Nothing but the provisioned-by annotation changed.
    assert_eq!(after["metadata"]["uid"], before[0]["metadata"]["uid"]);
    assert_eq!(after["spec"], before[0]["spec"]);
    assert_eq!(after["metadata"]["labels"], before[0]["metadata"]["labels"]);
    assert_eq!(after["metadata"]["finalizers"], before[0]["metadata"]["finalizers"]);
    let mut expected = before[0]["metadata"]["annotations"].clone();
    expected["pv.kubernetes.io/provisioned-by"] = Value::String(new_provisioner.clone());
    assert_eq!(after["metadata"]["annotations"], expected);
    assert_eq!(after["status"]["phase"], "Bound");
    assert_eq!(std::fs::read(dir.join("same/data")).unwrap(), b"tenant data");
    assert!(cp.has_event(&pv("same"), "VolumeReadopted", "recorded disk"));

    // Bound PVs whose disk is different or missing: flagged stale, kept Bound, same object.
    for (i, v) in [(1, "swapped"), (2, "lost")] {
        wait_until(&format!("{v} flagged stale"), WAIT, || {
            annotation(&cp, &pv(v), "local-static-provisioner.io/volume-stale").map(|_| ())
        });
        let now = cp.get_json(&["pv", &pv(v)]).unwrap();
        assert_eq!(now["metadata"]["uid"], before[i]["metadata"]["uid"]);
        assert_eq!(now["status"]["phase"], "Bound");
        assert!(cp.has_event(&pv(v), "VolumeStale", if v == "lost" { "no volume" } else { "different disk" }));
    }
    // The unbound PV whose disk changed is withdrawn; the new disk there is published afresh.
    let old_free_uid = before[3]["metadata"]["uid"].as_str().unwrap().to_string();
    wait_until("free PV replaced by the new disk's PV", WAIT, || {
        let (uid, phase) = cp.pv_state(&pv("free"))?;
        (uid != old_free_uid && phase == "Available").then_some(())
    });
    assert_eq!(annotation(&cp, &pv("free"), "pv.kubernetes.io/provisioned-by").unwrap(), new_provisioner);
    assert!(cp.has_event(&pv("free"), "VolumeWithdrawn", "different disk"));
    let metrics = agent.admin_get("/metrics");
    for line in [
        "local_static_provisioner_succession_total{outcome=\"readopted\"} 1",
        "local_static_provisioner_succession_total{outcome=\"flagged_stale\"} 2",
        "local_static_provisioner_succession_total{outcome=\"withdrawn\"} 1",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }

    // With the class opted in, node-cleanup releases the stale claims after its grace period;
    // the re-adopted one is untouched. The swapped path then holds a fresh PV for its new disk.
    let same_claim = claim_uid(&cp, "reborn-same").unwrap();
    let nc_kubeconfig = cp.node_cleanup_kubeconfig(tmp.path());
    let nc = AgentProcess::start_node_cleanup(
        &nc_kubeconfig,
        &tmp.path().join("node-cleanup.log"),
        &["--storage-classes", class, "--grace-period", "2s", "--resync-period", "1s", "--lease-name", "nc-reborn"],
    );
    for v in ["swapped", "lost"] {
        wait_until(&format!("stale claim of {v} deleted"), WAIT, || {
            claim_uid(&cp, &format!("reborn-{v}")).is_none().then_some(())
        });
        assert!(cp.has_event(&format!("reborn-{v}"), "VolumeStale", "claim deleted"));
    }
    wait_until("lost PV gone", WAIT, || cp.pv_state(&pv("lost")).is_none().then_some(()));
    let old_swapped_uid = before[1]["metadata"]["uid"].as_str().unwrap().to_string();
    wait_until("swapped path published with its new disk", WAIT, || {
        let (uid, phase) = cp.pv_state(&pv("swapped"))?;
        (uid != old_swapped_uid && phase == "Available").then_some(())
    });
    assert_eq!(claim_uid(&cp, "reborn-same").as_deref(), Some(same_claim.as_str()));
    nc.stop();

    // Re-created again while the agent keeps running: noticed at the next resync.
    cp.kubectl_ok(&["delete", "node", node]);
    let third_uid = cp.create_node(node);
    wait_until("re-adopted by the running agent", WAIT, || {
        let ann = annotation(&cp, &pv("same"), "pv.kubernetes.io/provisioned-by")?;
        ann.ends_with(&third_uid).then_some(())
    });
    assert_eq!(cp.pv_state(&pv("same")).unwrap().1, "Bound");
    agent.stop();
    cp.kubectl_ok(&["delete", "pvc", "reborn-same", "-n", "default", "--wait=false"]);
}

#[test]
fn a_paused_leader_does_not_act_when_it_resumes() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let class = "nc-pause";
    let (_tmp, first, second) = two_replicas(&cp, class, "1s", ["3s", "2s"]);

    // The leader freezes (a stalled process, a paused VM): its lease expires and the other one
    // takes over and acts.
    let pid = nix::unistd::Pid::from_raw(first.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    wait_until("second replica takes over", WAIT, || second.log_text().contains("leadership acquired").then_some(()));
    // When the frozen one resumes, its leadership has lapsed: it must not act, now or later.
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    for i in 0..2 {
        let pv = format!("nc-pause-pv-{i}");
        strand_pv(&cp, &format!("nc-pause-node-{i}"), &pv, class);
        wait_until(&format!("{pv} deleted"), WAIT, || cp.pv_state(&pv).is_none().then_some(()));
    }
    let first_log = first.stop();
    assert!(!first_log.contains("PV deleted"), "the resumed replica acted:\n{first_log}");
    assert!(first_log.contains("another replica leads"), "{first_log}");
    assert_eq!(second.stop().matches("PV deleted").count(), 2);
}

/// The API server's audit log (metadata of the agent's and node-cleanup's requests).
fn audit_log(cp: &ControlPlane) -> std::path::PathBuf {
    cp.dir.join("logs/audit.log")
}

fn audit_len(cp: &ControlPlane) -> u64 {
    std::fs::metadata(audit_log(cp)).map_or(0, |m| m.len())
}

/// The audit entries written from byte `from` on (whole lines only: the API server may be
/// writing the last one).
fn audit_entries(cp: &ControlPlane, from: u64) -> Vec<Value> {
    let mut text = String::new();
    if let Ok(mut file) = std::fs::File::open(audit_log(cp)) {
        file.seek(SeekFrom::Start(from)).unwrap();
        file.read_to_string(&mut text).unwrap();
    }
    text.split_inclusive('\n').filter(|l| l.ends_with('\n')).filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// A write of node-cleanup's: anything but a read on PVs, claims or Events.
fn is_write(entry: &Value) -> bool {
    ["create", "update", "patch", "delete", "deletecollection"].contains(&entry["verb"].as_str().unwrap_or(""))
        && ["persistentvolumes", "persistentvolumeclaims", "events"]
            .contains(&entry["objectRef"]["resource"].as_str().unwrap_or(""))
}

fn user_agent(identity: &str) -> String {
    format!("local-static-provisioner/{} (node-cleanup; {identity})", env!("CARGO_PKG_VERSION"))
}

/// The bug this guards against: a leader stopped (SIGSTOP) while a write waited in its rate
/// limiter, and resumed after another replica took over, went on with the action it was in,
/// removing the wipe finalizer of a PV whose Node had come back. Every write is now fenced
/// right before it goes out, so the resumed replica sends none; the audit log, which tells the
/// replicas apart by their User-Agent, is the judge.
#[test]
fn a_leader_stopped_mid_pass_sends_no_write_once_it_resumes() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let class = "nc-fence";
    let start = audit_len(&cp);
    cp.create_storage_class(class, "Delete");
    // Six PVs of deleted Nodes, so the leader's pass has many writes (a PV deletion is followed
    // by an Event and the removal of our finalizer).
    let pv = |i: usize| format!("nc-fence-pv-{i}");
    let node = |i: usize| format!("nc-fence-node-{i}");
    for i in 0..6 {
        strand_pv(&cp, &node(i), &pv(i), class);
    }
    // The leader sends one request a second, so a stop lands while a write waits in its rate
    // limiter. The second replica's grace period is an hour: it takes the Lease but releases
    // nothing, so whatever happens to the PVs is the first one's doing. A lease of 6s and a
    // renew deadline of 4s give each write a 1s deadline.
    let (first_id, second_id) = ("nc-fence-first", "nc-fence-second");
    let (_tmp, first, second) = two_replicas_with(
        &cp,
        class,
        ["6s", "4s"],
        &["--grace-period", "1s", "--kube-api-qps", "1", "--kube-api-burst", "1", "--identity", first_id],
        &["--grace-period", "1h", "--identity", second_id],
    );
    let (first_ua, second_ua) = (user_agent(first_id), user_agent(second_id));

    // A PV deletion by the leader, once both replicas run: stop the leader right after it,
    // while the Event and the finalizer removal that follow wait for the rate limiter.
    let mark = audit_len(&cp);
    let deleted = wait_until("the leader deletes a PV", WAIT, || {
        audit_entries(&cp, mark).into_iter().find_map(|e| {
            (e["userAgent"] == first_ua.as_str()
                && e["verb"] == "delete"
                && e["objectRef"]["resource"] == "persistentvolumes")
                .then(|| e["objectRef"]["name"].as_str().unwrap().to_string())
        })
    });
    let pid = nix::unistd::Pid::from_raw(first.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();

    // The PV it is in the middle of (deleted, our finalizer still on it); or, if the stop came
    // after the finalizer removal, the first PV it has not reached.
    let waiting = |name: &str| {
        cp.get_json(&["pv", name])
            .is_some_and(|p| p["metadata"]["finalizers"].as_array().is_some_and(|f| f.iter().any(|f| f == FINALIZER)))
    };
    let target = (0..6)
        .find(|i| pv(*i) == deleted && waiting(&deleted))
        .or_else(|| (0..6).find(|i| waiting(&pv(*i))))
        .expect("a PV the leader has not finished with");
    eprintln!("leader stopped after deleting {deleted}; re-creating the Node of {}", pv(target));

    wait_until("second replica takes over", WAIT, || second.log_text().contains("leadership acquired").then_some(()));
    // That Node registers again: what the stopped leader was about to do is wrong now.
    cp.create_node(&node(target));
    std::thread::sleep(Duration::from_secs(3));
    let resumed_at = Timestamp::now();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    wait_until("the resumed replica notices it no longer leads", WAIT, || {
        let log = first.log_text();
        (log.contains("abandoning the rest of it") || log.contains("another replica leads")).then_some(())
    });
    // Time for whatever it still had queued (a few requests at one a second) to go out.
    std::thread::sleep(Duration::from_secs(6));
    let first_log = first.stop();
    second.stop();

    let entries = audit_entries(&cp, start);
    let writes_of = |ua: &str| entries.iter().filter(|e| e["userAgent"] == ua && is_write(e)).collect::<Vec<_>>();
    let first_writes = writes_of(&first_ua);
    assert!(
        !first_writes.is_empty(),
        "no write of the first replica in the audit log: is its User-Agent {first_ua:?}?"
    );
    assert!(
        entries.iter().any(|e| e["userAgent"] == second_ua.as_str()),
        "the second replica's requests are told apart"
    );
    let late: Vec<String> = first_writes
        .iter()
        .filter(|e| {
            let received: Timestamp = e["requestReceivedTimestamp"].as_str().unwrap().parse().unwrap();
            received > resumed_at
        })
        .map(|e| {
            format!(
                "{} {} {} at {}",
                e["verb"], e["objectRef"]["resource"], e["objectRef"]["name"], e["requestReceivedTimestamp"]
            )
        })
        .collect();
    assert!(late.is_empty(), "the resumed replica wrote after {resumed_at}:\n{}\n{first_log}", late.join("\n"));
    assert!(waiting(&pv(target)), "{} of the re-created Node lost our finalizer or is gone", pv(target));
    assert!(
        first_log.contains("leadership lost during a pass; abandoning the rest of it")
            || first_log.contains("another replica leads"),
        "{first_log}"
    );

    // Leave nothing behind for a re-run on the same control plane.
    for i in 0..6 {
        cp.kubectl(&["patch", "pv", &pv(i), "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
        cp.kubectl(&["delete", "pv", &pv(i), "--wait=false", "--ignore-not-found"]);
    }
    cp.kubectl(&["delete", "node", &node(target), "--ignore-not-found"]);
}

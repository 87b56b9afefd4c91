//! Data safety of the running agent against the real control plane, with real mounts: it
//! publishes only real, unique volumes (no symlink followed, no mount of the host itself, one
//! disk at most one PV), says why in Warning events and a metric, and never wipes through a
//! symlink swapped in for a released volume. A canary filesystem outside the discovery
//! directory must come through every scenario untouched. Needs root.

use crate::support;

use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

use local_static_provisioner::core::volumes::naming::pv_name;
use support::{AgentProcess, ControlPlane, Mount, bind_mount, mount_tmpfs, require_root, wait_until, write_config};

const WAIT: Duration = Duration::from_secs(60);

/// A tmpfs outside the discovery directory holding one file that must survive.
fn canary(path: &Path) -> Mount {
    let m = mount_tmpfs(path, 8);
    std::fs::write(path.join("precious"), b"tenant data").unwrap();
    m
}

fn assert_canary(path: &Path) {
    assert_eq!(std::fs::read(path.join("precious")).unwrap(), b"tenant data", "canary at {} changed", path.display());
}

/// A read-only bind mount: a host directory bound into the discovery directory must never be
/// writable through the test's own clean-up either.
fn ro_bind(src: &Path, dst: &Path) -> Mount {
    let m = bind_mount(src, dst);
    let ok = std::process::Command::new("mount").args(["-o", "remount,bind,ro"]).arg(dst).status().unwrap();
    assert!(ok.success(), "remounting {} read-only", dst.display());
    m
}

fn published_paths(cp: &ControlPlane, prefix: &str) -> Vec<String> {
    let mut paths: Vec<String> = cp
        .pvs_under(prefix)
        .iter()
        .map(|pv| pv["spec"]["local"]["path"].as_str().unwrap_or_default().to_string())
        .collect();
    paths.sort();
    paths
}

fn metric(agent: &AgentProcess, line_start: &str) -> Option<String> {
    agent.admin_get("/metrics").lines().find(|l| l.starts_with(line_start)).map(str::to_string)
}

#[test]
fn agent_publishes_only_real_unique_volumes_and_says_why() {
    let _area = support::area(module_path!());
    if !require_root("agent_publishes_only_real_unique_volumes_and_says_why") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "safety-node-publish";
    cp.create_node(node);
    cp.create_storage_class("safety-fs", "Delete");

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let disks = root.join("disks");
    let _canary = canary(&root.join("canary"));
    let _ok = mount_tmpfs(&disks.join("ok"), 8);
    // A symlink to a mount outside, and to the host root.
    symlink(root.join("canary"), disks.join("link-out")).unwrap();
    symlink("/", disks.join("link-root")).unwrap();
    // A bind mount of an ancestor of the discovery directory, and of the host root.
    let _parent = ro_bind(root, &disks.join("parent"));
    let _host_root = ro_bind(Path::new("/"), &disks.join("host-root"));
    // One tmpfs at two entries.
    let _a = mount_tmpfs(&disks.join("a"), 8);
    let b = bind_mount(&disks.join("a"), &disks.join("b"));

    let config = root.join("config");
    let class_map = format!("safety-fs:\n  hostDir: {d}\n  mountDir: {d}\n", d = disks.display());
    write_config(&config, &[("storageClassMap", &class_map)]);
    let kubeconfig = cp.agent_kubeconfig(root);
    let agent = AgentProcess::start(&config, node, &kubeconfig, &root.join("agent.log"));
    let prefix = disks.display().to_string();
    let ok = format!("{prefix}/ok");

    wait_until("the one real volume published", WAIT, || (published_paths(&cp, &prefix) == [ok.clone()]).then_some(()));
    for (text, what) in [
        ("link-out (class safety-fs) not published: symlink to the directory", "a symlink to a mount outside"),
        ("link-root (class safety-fs) not published: symlink to the directory /;", "a symlink to /"),
        ("parent (class safety-fs) not published", "a bind mount of an ancestor"),
        ("host-root (class safety-fs) not published", "a bind mount of /"),
    ] {
        wait_until(&format!("a VolumeNotPublished event for {what}"), WAIT, || {
            cp.has_event(node, "VolumeNotPublished", text).then_some(())
        });
    }
    // The two entries of one tmpfs: neither is published, each refusal names the other.
    wait_until("the shared disk refused", WAIT, || {
        cp.has_event(node, "VolumeNotPublished", &format!("same disk as (or shares data with) {prefix}/b"))
            .then_some(())
    });
    for (reason, n) in [("symlink", 2), ("exposes-host", 2), ("same-disk", 2)] {
        let want = format!("local_static_provisioner_unpublished_entries{{reason=\"{reason}\"}} {n}");
        wait_until(&format!("metric {want}"), WAIT, || metric(&agent, &want));
    }
    assert_eq!(published_paths(&cp, &prefix), std::slice::from_ref(&ok), "nothing else was published meanwhile");

    // Once one of the two entries is gone, the other is published; a new alias of it is then
    // refused because its disk is published, and the published one keeps it.
    drop(b);
    let a_path = format!("{prefix}/a");
    wait_until("the remaining entry published", WAIT, || {
        (published_paths(&cp, &prefix) == [a_path.clone(), ok.clone()]).then_some(())
    });
    let _c = bind_mount(&disks.join("a"), &disks.join("c"));
    wait_until("the new alias refused", WAIT, || {
        let text = format!("already published as PV {} at {a_path}", pv_name("a", node, "safety-fs"));
        cp.has_event(node, "VolumeNotPublished", &text).then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(published_paths(&cp, &prefix), [a_path, ok], "the alias is never published");
    assert_canary(&root.join("canary"));
    drop(agent);
}

#[test]
fn a_released_volume_swapped_for_a_symlink_is_never_wiped_through_it() {
    let _area = support::area(module_path!());
    if !require_root("a_released_volume_swapped_for_a_symlink_is_never_wiped_through_it") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "safety-node-swap";
    cp.create_node(node);
    cp.create_storage_class("safety-swap", "Delete");

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let disks = root.join("disks");
    let _canary = canary(&root.join("canary"));
    let vol = mount_tmpfs(&disks.join("v"), 8);
    let config = root.join("config");
    let class_map = format!("safety-swap:\n  hostDir: {d}\n  mountDir: {d}\n", d = disks.display());
    write_config(&config, &[("storageClassMap", &class_map)]);
    let kubeconfig = cp.agent_kubeconfig(root);
    let agent = AgentProcess::start(&config, node, &kubeconfig, &root.join("agent.log"));
    let name = pv_name("v", node, "safety-swap");
    wait_until("the volume published", WAIT, || cp.pv_state(&name).filter(|(_, p)| p == "Available"));
    let bound = cp.bind_claim("safety-swap-claim", "safety-swap", false);
    assert_eq!(bound, name);

    // While the claim is bound, the volume is unmounted and its entry replaced by a symlink to
    // the canary; then the claim is released.
    drop(vol);
    std::fs::remove_dir(disks.join("v")).unwrap();
    symlink(root.join("canary"), disks.join("v")).unwrap();
    cp.release_claim("safety-swap-claim");
    wait_until("the PV flagged as missing its volume", WAIT, || {
        let pv = cp.get_json(&["pv", &name])?;
        (pv["status"]["phase"] == "Released"
            && pv["metadata"]["annotations"]["local-static-provisioner.io/volume-missing"].is_string())
        .then_some(())
    });
    // Several passes later (1 s resync), nothing was wiped and the PV is still there.
    std::thread::sleep(Duration::from_secs(4));
    assert_canary(&root.join("canary"));
    assert!(cp.pv_state(&name).is_some(), "the PV of a missing volume is kept");
    assert!(!agent.log_text().contains("volume wiped"), "nothing may be wiped");
    std::fs::remove_file(disks.join("v")).unwrap();
    drop(agent);
    cp.kubectl(&["patch", "pv", &name, "--type=json", "-p", r#"[{"op":"remove","path":"/metadata/finalizers"}]"#]);
    cp.kubectl(&["delete", "pv", &name, "--wait=false"]);
}

#[test]
fn a_disk_published_twice_before_the_one_disk_rule_is_not_wiped_under_a_bound_pv() {
    let _area = support::area(module_path!());
    if !require_root("a_disk_published_twice_before_the_one_disk_rule_is_not_wiped_under_a_bound_pv") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "safety-node-twice";
    let uid = cp.create_node(node);
    let class = "safety-twice";
    cp.create_storage_class(class, "Delete");

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let disks = root.join("disks");
    let _a = mount_tmpfs(&disks.join("a"), 8);
    let _b = bind_mount(&disks.join("a"), &disks.join("b"));
    std::fs::write(disks.join("a/tenant-file"), b"data of the tenant").unwrap();
    // Two PVs of one disk, as an older version (or upstream) could leave them.
    for entry in ["a", "b"] {
        cp.apply(&format!(
            "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: {name}\n  annotations: {{pv.kubernetes.io/provisioned-by: local-volume-provisioner-{node}-{uid}}}\nspec:\n  capacity: {{storage: 8Mi}}\n  accessModes: [ReadWriteOnce]\n  persistentVolumeReclaimPolicy: Delete\n  storageClassName: {class}\n  local: {{path: {path}}}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [{node}]}}]\n",
            name = pv_name(entry, node, class),
            path = disks.join(entry).display(),
        ));
    }
    let config = root.join("config");
    let class_map = format!("{class}:\n  hostDir: {d}\n  mountDir: {d}\n", d = disks.display());
    write_config(&config, &[("storageClassMap", &class_map)]);
    let kubeconfig = cp.agent_kubeconfig(root);
    let agent = AgentProcess::start(&config, node, &kubeconfig, &root.join("agent.log"));
    for entry in ["a", "b"] {
        let name = pv_name(entry, node, class);
        wait_until(&format!("{name} adopted"), WAIT, || {
            let pv = cp.get_json(&["pv", &name])?;
            pv["metadata"]["finalizers"]
                .as_array()?
                .iter()
                .any(|f| f == "local-static-provisioner.io/wipe")
                .then_some(())
        });
    }
    let first = cp.bind_claim("safety-twice-1", class, false);
    let second = cp.bind_claim("safety-twice-2", class, false);
    assert_ne!(first, second);
    cp.release_claim("safety-twice-1");
    wait_until("the wipe refused", WAIT, || {
        cp.has_event(&first, "VolumeFailedDelete", &format!("also published as PV {second} (Bound)")).then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(std::fs::read(disks.join("a/tenant-file")).unwrap(), b"data of the tenant", "the bound tenant's data");
    assert_eq!(cp.pv_state(&first).map(|(_, phase)| phase).as_deref(), Some("Released"));
    drop(agent);
    cp.release_claim("safety-twice-2");
    for name in [first, second] {
        cp.kubectl(&["patch", "pv", &name, "--type=json", "-p", r#"[{"op":"remove","path":"/metadata/finalizers"}]"#]);
        cp.kubectl(&["delete", "pv", &name, "--wait=false"]);
    }
}

#[test]
fn an_identity_recorded_by_an_older_version_is_upgraded_and_still_lets_the_wipe_run() {
    let _area = support::area(module_path!());
    if !require_root("an_identity_recorded_by_an_older_version_is_upgraded_and_still_lets_the_wipe_run") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "safety-node-upgrade";
    let uid = cp.create_node(node);
    let class = "safety-upgrade";
    cp.create_storage_class(class, "Delete");

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let disks = root.join("disks");
    let _v = mount_tmpfs(&disks.join("v"), 8);
    let legacy =
        local_static_provisioner::host::identity::fingerprint::found_identity(&disks.join("v"), None).unwrap().legacy;
    assert!(legacy.starts_with("fs:fsid="), "the old format: {legacy}");
    let name = pv_name("v", node, class);
    // The PV as an older version made it: our label and finalizer, the old identity format.
    cp.apply(&format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: {name}\n  labels: {{local-static-provisioner.io/node: {node}}}\n  finalizers: [local-static-provisioner.io/wipe]\n  annotations:\n    pv.kubernetes.io/provisioned-by: local-volume-provisioner-{node}-{uid}\n    local-static-provisioner.io/volume-identity: '{legacy}'\nspec:\n  capacity: {{storage: 8Mi}}\n  accessModes: [ReadWriteOnce]\n  persistentVolumeReclaimPolicy: Delete\n  storageClassName: {class}\n  local: {{path: {path}}}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [{node}]}}]\n",
        path = disks.join("v").display(),
    ));
    let config = root.join("config");
    let class_map = format!("{class}:\n  hostDir: {d}\n  mountDir: {d}\n", d = disks.display());
    write_config(&config, &[("storageClassMap", &class_map)]);
    let kubeconfig = cp.agent_kubeconfig(root);
    let agent = AgentProcess::start(&config, node, &kubeconfig, &root.join("agent.log"));
    let identity = |cp: &ControlPlane| {
        cp.get_json(&["pv", &name]).and_then(|pv| {
            pv["metadata"]["annotations"]["local-static-provisioner.io/volume-identity"].as_str().map(str::to_string)
        })
    };
    let upgraded = wait_until("the identity re-recorded in the current format", WAIT, || {
        identity(&cp).filter(|id| id.starts_with("v2;"))
    });
    assert!(upgraded.contains("volatile=tmpfs"), "{upgraded}");

    // The upgraded record still proves the disk: a used volume is wiped and published again.
    let first_uid = cp.pv_state(&name).unwrap().0;
    assert_eq!(cp.bind_claim("safety-upgrade-claim", class, false), name);
    std::fs::write(disks.join("v/tenant-file"), b"x").unwrap();
    cp.release_claim("safety-upgrade-claim");
    wait_until("the volume wiped and published again", WAIT, || {
        cp.pv_state(&name).filter(|(uid, phase)| *uid != first_uid && phase == "Available")
    });
    assert!(!disks.join("v/tenant-file").exists(), "the tenant's file is wiped");
    drop(agent);
    cp.kubectl(&["patch", "pv", &name, "--type=json", "-p", r#"[{"op":"remove","path":"/metadata/finalizers"}]"#]);
    cp.kubectl(&["delete", "pv", &name, "--wait=false"]);
}

#[test]
fn a_pv_without_a_recorded_identity_never_wipes_a_mount_of_the_host() {
    let _area = support::area(module_path!());
    if !require_root("a_pv_without_a_recorded_identity_never_wipes_a_mount_of_the_host") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "safety-node-noid";
    let uid = cp.create_node(node);
    let class = "safety-noid";
    cp.create_storage_class(class, "Delete");
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let disks = root.join("disks");
    std::fs::create_dir_all(&disks).unwrap();
    std::fs::write(root.join("precious"), b"host data").unwrap();
    // An upstream PV whose volume is not there when the agent adopts it: no identity recorded.
    let name = pv_name("x", node, class);
    cp.apply(&format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: {name}\n  annotations: {{pv.kubernetes.io/provisioned-by: local-volume-provisioner-{node}-{uid}}}\nspec:\n  capacity: {{storage: 8Mi}}\n  accessModes: [ReadWriteOnce]\n  persistentVolumeReclaimPolicy: Delete\n  storageClassName: {class}\n  local: {{path: {path}}}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [{node}]}}]\n",
        path = disks.join("x").display(),
    ));
    assert_eq!(cp.bind_claim("safety-noid-claim", class, false), name);
    let config = root.join("config");
    let class_map = format!("{class}:\n  hostDir: {d}\n  mountDir: {d}\n", d = disks.display());
    write_config(&config, &[("storageClassMap", &class_map)]);
    let kubeconfig = cp.agent_kubeconfig(root);
    let agent = AgentProcess::start(&config, node, &kubeconfig, &root.join("agent.log"));
    wait_until("the PV adopted", WAIT, || {
        let pv = cp.get_json(&["pv", &name])?;
        pv["metadata"]["finalizers"].as_array()?.iter().any(|f| f == "local-static-provisioner.io/wipe").then_some(())
    });
    // Now a bind mount of the directory that holds the discovery directory (and the host's
    // file) appears at the PV's path, and the claim is released.
    let _bind = bind_mount(root, &disks.join("x"));
    cp.release_claim("safety-noid-claim");
    wait_until("the wipe refused", WAIT, || {
        cp.has_event(&name, "VolumeFailedDelete", "is not wiped: its mount source").then_some(())
    });
    assert_eq!(std::fs::read(root.join("precious")).unwrap(), b"host data");
    assert!(config.exists() && root.join("agent.log").exists(), "nothing of the host directory was removed");
    drop(agent);
    cp.kubectl(&["patch", "pv", &name, "--type=json", "-p", r#"[{"op":"remove","path":"/metadata/finalizers"}]"#]);
    cp.kubectl(&["delete", "pv", &name, "--wait=false"]);
}

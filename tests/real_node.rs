//! End to end on a real node (kubelet, containerd, runc; tests/node/): the DaemonSet and
//! node-cleanup from deploy/ as shipped (overlay: image, API address, ports, a block class)
//! under their real pod-bound ServiceAccount tokens, and workloads that really mount their
//! volumes. tests/run.sh starts the node after the other tests (LSP_NODE_DIR) and runs these
//! one at a time. Needs root.

mod support;

use std::path::Path;
use std::process::Command;

use k8s_openapi::jiff::Timestamp;
use local_static_provisioner::core::naming::pv_name;
use support::real_node::{RealNode, WAIT};
use support::{LoopDevice, Mount, mount_tmpfs, wait_until};

/// [`support::wait_recycled`] on the real node's control plane.
fn wait_recycled(node: &RealNode, name: &str, old_uid: &str, volume: Option<&Path>) -> String {
    support::wait_recycled(&node.cp, name, old_uid, volume, WAIT)
}

/// A tmpfs "disk" mounted in a discovery directory, unmounted at the end (the agent then
/// withdraws its PV). Named per test process: a volume a failed earlier run left Released
/// keeps its path (its disk is gone, so it is rightly never wiped), and must not meet this one.
fn disk(dir: &str, entry: &str, mib: u64) -> (String, std::path::PathBuf, Mount) {
    let entry = unique(entry);
    let path = Path::new(dir).join(&entry);
    let mount = mount_tmpfs(&path, mib);
    (entry, path, mount)
}

/// A symlink to a block device in a discovery directory, removed at the end, passed or not.
struct Link(std::path::PathBuf);

impl Link {
    fn new(device: &Path, at: &Path) -> Link {
        std::os::unix::fs::symlink(device, at).unwrap();
        Link(at.to_path_buf())
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `name` made unique to this test process.
fn unique(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

/// Releases what a test bound and waits until its volume is recycled, so the next test starts
/// from Available volumes only.
fn release(node: &RealNode, pods: &[&str], claims: &[&str]) {
    for pod in pods {
        node.delete_pod(pod, false);
    }
    for claim in claims {
        node.delete_claim(claim);
    }
    for pod in pods {
        wait_until(&format!("pod {pod} gone"), WAIT, || {
            node.cp.get_json(&["pod", pod, "-n", "default"]).is_none().then_some(())
        });
    }
}

#[test]
fn real_node_filesystem_volume_is_wiped_between_tenants() {
    let Some(node) = RealNode::get("real_node_filesystem_volume_is_wiped_between_tenants") else { return };
    node.deploy();
    let (entry, vol, mount) = disk("/mnt/fast-disks", "e2e-fs", 40);
    let pv = pv_name(&entry, &node.name, "fast-disks");
    let uid = wait_until("PV of e2e-fs", WAIT, || node.cp.pv_state(&pv).map(|(u, _)| u));

    // Tenant 1 writes through kubelet's mount of the PV.
    node.claim("e2e-fs-1", "fast-disks", false, "40Mi");
    node.workload(
        "e2e-fs-writer",
        "e2e-fs-1",
        false,
        "echo secret > /data/tenant-1 && mkdir /data/dir && echo more > /data/dir/f && sync && trap 'exit 0' TERM; sleep 3600 & wait",
        30,
    );
    node.wait_phase("e2e-fs-writer", &["Running"]);
    let bound = node.cp.get_json(&["pvc", "e2e-fs-1", "-n", "default"]).unwrap();
    assert_eq!(bound["spec"]["volumeName"], pv.as_str(), "the claim took the test's volume");
    wait_until("tenant data on the disk", WAIT, || vol.join("tenant-1").exists().then_some(()));
    assert!(node.kubelet_holds(&pv), "kubelet mounted the PV for the pod");

    // Pod and claim deleted: kubelet unmounts, the agent wipes and publishes the volume again.
    release(&node, &["e2e-fs-writer"], &["e2e-fs-1"]);
    let new_uid = wait_recycled(&node, &pv, &uid, Some(&vol));
    assert!(!node.kubelet_holds(&pv), "kubelet let go of the volume");
    assert!(node.cp.has_event(&pv, "VolumeCleaned", "wiped"), "the wipe is reported on the PV");

    // Tenant 2 sees an empty volume.
    node.claim("e2e-fs-2", "fast-disks", false, "40Mi");
    node.workload("e2e-fs-reader", "e2e-fs-2", false, "ls -la /data; [ -z \"$(ls -A /data)\" ]", 5);
    node.expect_success("e2e-fs-reader");
    release(&node, &["e2e-fs-reader"], &["e2e-fs-2"]);
    wait_recycled(&node, &pv, &new_uid, Some(&vol));
    drop(mount);
}

#[test]
fn real_node_block_volume_quick_wipe_leaves_no_signature() {
    let Some(node) = RealNode::get("real_node_block_volume_quick_wipe_leaves_no_signature") else { return };
    node.deploy();
    let tmp = tempfile::tempdir().unwrap();
    let disk = LoopDevice::new(&tmp.path().join("e2e-blk.img"), 48);
    let entry = unique("e2e-blk");
    let link = Link::new(&disk.device, &Path::new("/mnt/block-disks").join(&entry));
    let pv = pv_name(&entry, &node.name, "block-disks");
    let uid = wait_until("PV of e2e-blk", WAIT, || node.cp.pv_state(&pv).map(|(u, _)| u));

    // Tenant 1 writes a swap signature and data through the mapped device.
    node.claim("e2e-blk-1", "block-disks", true, "48Mi");
    node.workload(
        "e2e-blk-writer",
        "e2e-blk-1",
        true,
        "mkswap /dev/xvda && echo tenant-data | dd of=/dev/xvda bs=512 seek=4096 conv=fsync && trap 'exit 0' TERM; sleep 3600 & wait",
        30,
    );
    node.wait_phase("e2e-blk-writer", &["Running"]);
    wait_until("swap signature on the device", WAIT, || {
        let out = Command::new("blkid").args(["-p", "-o", "value", "-s", "TYPE"]).arg(&disk.device).output().ok()?;
        (String::from_utf8_lossy(&out.stdout).trim() == "swap").then_some(())
    });

    release(&node, &["e2e-blk-writer"], &["e2e-blk-1"]);
    let new_uid = wait_recycled(&node, &pv, &uid, None);
    let blkid = Command::new("blkid").arg("-p").arg(&disk.device).output().unwrap();
    assert_eq!(blkid.status.code(), Some(2), "no signature left: {}", String::from_utf8_lossy(&blkid.stdout));

    // Tenant 2 sees no filesystem: no signature in the device's first 64 KiB, all zeroes.
    node.claim("e2e-blk-2", "block-disks", true, "48Mi");
    node.workload(
        "e2e-blk-reader",
        "e2e-blk-2",
        true,
        "head=$(dd if=/dev/xvda bs=65536 count=1 2>/dev/null | od -An -v -tx1 | tr -d ' \\n0'); echo \"non-zero: [$head]\"; [ -z \"$head\" ]",
        5,
    );
    node.expect_success("e2e-blk-reader");
    release(&node, &["e2e-blk-reader"], &["e2e-blk-2"]);
    wait_recycled(&node, &pv, &new_uid, None);
    drop(link);
    wait_until("block PV withdrawn", WAIT, || node.cp.pv_state(&pv).is_none().then_some(()));
}

/// A raw disk nobody prepared: the agent in its pod claims it (the overlay's claimed-disks
/// class takes loop devices of 57 MiB), kubelet formats it with the class's fsType when the
/// first tenant's pod mounts it, and after the release the agent wipes it and publishes it
/// again under the same name, so the next tenant gets a fresh filesystem.
#[test]
fn real_node_a_claimed_raw_disk_is_formatted_by_kubelet_and_wiped_between_tenants() {
    let Some(node) = RealNode::get("real_node_a_claimed_raw_disk_is_formatted_by_kubelet_and_wiped_between_tenants")
    else {
        return;
    };
    node.deploy();
    let dir = Path::new("/mnt/claimed-disks");
    let tmp = tempfile::tempdir().unwrap();
    let disk = LoopDevice::new(&tmp.path().join(format!("{}.img", unique("e2e-claimed"))), 57);
    let linked = || {
        std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
            (std::fs::canonicalize(e.path()).ok()? == disk.device).then(|| e.file_name().to_string_lossy().into_owned())
        })
    };
    let entry = wait_until("the agent's pod links the raw disk", WAIT, linked);
    assert!(entry.starts_with("loop-"), "{entry}");
    let pv = pv_name(&entry, &node.name, "claimed-disks");
    let uid = wait_until("PV of the claimed disk", WAIT, || node.cp.pv_state(&pv).map(|(u, _)| u));
    let blkid = |dev: &Path| {
        let out = Command::new("blkid").args(["-p", "-o", "value", "-s", "TYPE"]).arg(dev).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(blkid(&disk.device), "", "claiming wrote nothing");

    node.claim("e2e-claimed-1", "claimed-disks", false, "57Mi");
    node.workload(
        "e2e-claimed-writer",
        "e2e-claimed-1",
        false,
        "echo tenant-data > /data/tenant && sync && trap 'exit 0' TERM; sleep 3600 & wait",
        30,
    );
    node.wait_phase("e2e-claimed-writer", &["Running"]);
    assert_eq!(blkid(&disk.device), "ext4", "kubelet formatted the raw disk with the class's fsType");

    release(&node, &["e2e-claimed-writer"], &["e2e-claimed-1"]);
    let new_uid = wait_recycled(&node, &pv, &uid, None);
    assert_eq!(blkid(&disk.device), "", "the wipe left no signature");
    node.claim("e2e-claimed-2", "claimed-disks", false, "57Mi");
    node.workload("e2e-claimed-reader", "e2e-claimed-2", false, "ls -la /data; [ ! -e /data/tenant ]", 5);
    node.expect_success("e2e-claimed-reader");
    release(&node, &["e2e-claimed-reader"], &["e2e-claimed-2"]);
    wait_recycled(&node, &pv, &new_uid, None);

    // The disk goes away: its PV is withdrawn, then the agent removes its link.
    drop(disk);
    wait_until("PV of the detached disk withdrawn", WAIT, || node.cp.pv_state(&pv).is_none().then_some(()));
    wait_until("the agent's link removed", WAIT, || {
        (!dir.join(&entry).exists() && std::fs::symlink_metadata(dir.join(&entry)).is_err()).then_some(())
    });
}

/// A pod that ignores SIGTERM keeps writing after its deletion was asked for. Deleted
/// gracefully, its claim stays until kubelet has stopped it and unmounted the volume; deleted
/// by force, the claim (and so the PV's release) comes at once while the container still
/// writes: the agent must wait for kubelet's unmount (VolumeStillMounted) and wipe after it,
/// so nothing the pod wrote reaches the next tenant.
#[test]
fn real_node_wipe_never_starts_while_kubelet_still_has_the_volume_mounted() {
    let Some(node) = RealNode::get("real_node_wipe_never_starts_while_kubelet_still_has_the_volume_mounted") else {
        return;
    };
    node.deploy();
    let (entry, vol, mount) = disk("/mnt/fast-disks", "e2e-held", 24);
    let pv = pv_name(&entry, &node.name, "fast-disks");
    let mut uid = wait_until("PV of e2e-held", WAIT, || node.cp.pv_state(&pv).map(|(u, _)| u));
    let stubborn = "trap '' TERM; i=0; while true; do i=$((i+1)); echo $i > /data/n-$i; sleep 0.1; done";

    for (round, force) in [(1, false), (2, true)] {
        let (claim, pod) = (format!("e2e-held-{round}"), format!("e2e-held-writer-{round}"));
        node.claim(&claim, "fast-disks", false, "24Mi");
        // Graceful: killed after 6 s. Forced: kubelet still gives it a couple of seconds.
        node.workload(&pod, &claim, false, stubborn, 6);
        node.wait_phase(&pod, &["Running"]);
        wait_until("the pod writes", WAIT, || (std::fs::read_dir(&vol).ok()?.count() > 5).then_some(()));
        node.delete_pod(&pod, force);
        node.delete_claim(&claim);
        // Until kubelet has unmounted the volume, the PV is not wiped and its data stays.
        while node.kubelet_holds(&pv) {
            let (now_uid, _) = node.cp.pv_state(&pv).expect("the PV stays while kubelet holds its volume");
            assert_eq!(now_uid, uid, "round {round}: PV republished while kubelet still held the volume");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        uid = wait_recycled(&node, &pv, &uid, Some(&vol));
        if force {
            assert!(
                node.cp.has_event(&pv, "VolumeStillMounted", "still mounted for a pod"),
                "round {round}: the wait is said in an event"
            );
        }
        wait_until(&format!("pod {pod} gone"), WAIT, || {
            node.cp.get_json(&["pod", &pod, "-n", "default"]).is_none().then_some(())
        });
        // Nothing written after the wipe: the volume is still empty once every writer is gone.
        std::thread::sleep(std::time::Duration::from_secs(1));
        assert_eq!(std::fs::read_dir(&vol).unwrap().count(), 0, "round {round}: written after the wipe");
    }
    drop(mount);
}

/// The agent's container sees a disk mounted on the host after it started: the discovery
/// directory is a shared mount and the DaemonSet mounts it with HostToContainer.
#[test]
fn real_node_a_mount_made_after_the_agent_started_is_published() {
    let Some(node) = RealNode::get("real_node_a_mount_made_after_the_agent_started_is_published") else { return };
    let agent = node.deploy();
    let started: Timestamp =
        agent["status"]["containerStatuses"][0]["state"]["running"]["startedAt"].as_str().unwrap().parse().unwrap();
    // The API's timestamps have whole seconds.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let mounted = Timestamp::now();
    let (entry, path, mount) = disk("/mnt/fast-disks", "e2e-late", 16);
    assert!(started < mounted, "the agent ({started}) started before the mount ({mounted})");
    let pv = pv_name(&entry, &node.name, "fast-disks");
    let found = wait_until("PV of a disk mounted after the agent started", WAIT, || node.cp.get_json(&["pv", &pv]));
    assert_eq!(found["spec"]["local"]["path"], path.to_str().unwrap());
    assert_eq!(found["spec"]["capacity"]["storage"], "16Mi");
    // And its unmount reaches it too: the PV is withdrawn.
    drop(mount);
    wait_until("PV withdrawn after the unmount", WAIT, || node.cp.pv_state(&pv).is_none().then_some(()));
}

/// The agent's own pod-bound token (read where kubelet projected it) carries the node claim:
/// the admission policy lets it write its node's PVs and nothing of another node's.
#[test]
fn real_node_the_agents_pod_bound_token_reaches_only_its_nodes_pvs() {
    let Some(node) = RealNode::get("real_node_the_agents_pod_bound_token_reaches_only_its_nodes_pvs") else { return };
    let agent = node.deploy();
    let pod_uid = agent["metadata"]["uid"].as_str().unwrap();
    let projected =
        Path::new(node.var("KUBELET_ROOT")).join("pods").join(pod_uid).join("volumes/kubernetes.io~projected");
    let token_file = std::fs::read_dir(&projected)
        .unwrap()
        .flatten()
        .map(|e| e.path().join("token"))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("no projected token under {}", projected.display()));
    let token = std::fs::read_to_string(token_file).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = node.cp.token_kubeconfig(tmp.path(), "agent-pod", token.trim());
    let as_agent = |args: &[&str], stdin: Option<&str>| node.cp.kubectl_stdin(&kubeconfig, args, stdin);

    let who = as_agent(&["auth", "whoami", "-o", "json"], None);
    let who: serde_json::Value = serde_json::from_slice(&who.stdout).unwrap();
    assert_eq!(
        who["status"]["userInfo"]["username"],
        "system:serviceaccount:local-static-provisioner:local-static-provisioner"
    );
    assert_eq!(who["status"]["userInfo"]["extra"]["authentication.kubernetes.io/node-name"][0], node.name.as_str());

    // Another node's PV, as its own agent would have made it.
    let other = "lsp-other-node";
    let other_pv = |name: &str| {
        format!(
            "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: {name}\n  labels: {{local-static-provisioner.io/node: {other}}}\n  annotations: {{pv.kubernetes.io/provisioned-by: local-volume-provisioner-{other}}}\nspec:\n  capacity: {{storage: 1Gi}}\n  accessModes: [ReadWriteOnce]\n  persistentVolumeReclaimPolicy: Delete\n  storageClassName: fast-disks\n  local: {{path: /mnt/fast-disks/x}}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms: [{{matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [{other}]}}]}}]\n"
        )
    };
    node.cp.apply(&other_pv("e2e-other-node-pv"));
    let denied = |out: std::process::Output, what: &str| {
        assert!(!out.status.success(), "{what} must be refused");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("ValidatingAdmissionPolicy") && err.contains("local-static-provisioner-node-scope"),
            "{what}: {err}"
        );
    };
    denied(as_agent(&["delete", "pv", "e2e-other-node-pv"], None), "deleting another node's PV");
    denied(as_agent(&["annotate", "pv", "e2e-other-node-pv", "e2e/probe=1"], None), "annotating another node's PV");
    denied(
        as_agent(&["create", "-f", "-"], Some(&other_pv("e2e-agent-made-for-other"))),
        "creating a PV for another node",
    );
    assert!(node.cp.get_json(&["pv", "e2e-other-node-pv"]).is_some(), "the other node's PV is untouched");
    node.cp.kubectl_ok(&["delete", "pv", "e2e-other-node-pv"]);

    // Its own node's PV: the same token may annotate it (RBAC and the policy both allow).
    let (entry, _path, mount) = disk("/mnt/fast-disks", "e2e-token", 8);
    let own = pv_name(&entry, &node.name, "fast-disks");
    wait_until("own PV", WAIT, || node.cp.pv_state(&own));
    let out = as_agent(&["annotate", "pv", &own, "e2e/probe=1"], None);
    assert!(out.status.success(), "annotating its own node's PV: {}", String::from_utf8_lossy(&out.stderr));
    drop(mount);
    wait_until("own PV withdrawn", WAIT, || node.cp.pv_state(&own).is_none().then_some(()));
}

/// An ext4 volume in use by a pod starts recording errors (the kernel's `trigger_fs_error`, as a
/// failing disk's read errors would): the app owner sees it on the claim (`kubectl describe
/// pvc`), the PV carries the reasons, and nothing of the tenant's is touched. After the claim is
/// let go, the volume is wiped but not offered again while its filesystem records errors.
#[test]
fn real_node_a_failing_disk_is_shown_on_the_claim() {
    let Some(node) = RealNode::get("real_node_a_failing_disk_is_shown_on_the_claim") else { return };
    node.deploy();
    let tmp = tempfile::tempdir().unwrap();
    let disk = LoopDevice::new(&tmp.path().join("e2e-failing.img"), 64);
    support::run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&disk.device));
    let entry = unique("e2e-failing");
    let vol = Path::new("/mnt/fast-disks").join(&entry);
    std::fs::create_dir_all(&vol).unwrap();
    support::run(Command::new("mount").args(["-o", "errors=continue"]).arg(&disk.device).arg(&vol));
    let mounted = Mount { path: vol.clone() };
    let pv = pv_name(&entry, &node.name, "fast-disks");
    wait_until("PV of the ext4 volume", WAIT, || node.cp.pv_state(&pv).map(|(u, _)| u));

    let claim = unique("e2e-failing-claim");
    node.claim(&claim, "fast-disks", false, "40Mi");
    let pod = unique("e2e-failing-app");
    node.workload(&pod, &claim, false, "echo mine > /data/f && sync && trap 'exit 0' TERM; sleep 3600 & wait", 30);
    node.wait_phase(&pod, &["Running"]);
    let bound = node.cp.get_json(&["pvc", &claim, "-n", "default"]).unwrap();
    assert_eq!(bound["spec"]["volumeName"], pv.as_str(), "the claim took the test's volume");

    let name = disk.device.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::write(format!("/sys/fs/ext4/{name}/trigger_fs_error"), "1").unwrap();
    let described = wait_until("DiskFailing on the claim", WAIT, || {
        let out = node.cp.kubectl_ok(&["describe", "pvc", &claim, "-n", "default"]);
        out.contains("DiskFailing").then_some(out)
    });
    assert!(described.contains("filesystem-errors"), "{described}");
    let failing = node.cp.get_json(&["pv", &pv]).unwrap();
    let annotation = failing["metadata"]["annotations"]["local-static-provisioner.io/disk-failing"].as_str();
    assert!(annotation.is_some_and(|a| a.contains("filesystem-errors")), "{failing}");
    assert_eq!(failing["status"]["phase"], "Bound", "a bound PV on a failing disk is never withdrawn");
    assert!(node.cp.has_event(&pv, "DiskFailing", "filesystem-errors"), "the PV is told too");
    assert_eq!(std::fs::read_to_string(vol.join("f")).unwrap(), "mine\n", "the tenant's data is untouched");

    // Let go: wiped and deleted as usual, then not offered again while the errors stay.
    release(&node, &[&pod], &[&claim]);
    wait_until("the released PV wiped and deleted", WAIT, || node.cp.pv_state(&pv).is_none().then_some(()));
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert!(node.cp.pv_state(&pv).is_none(), "a disk recording errors is not offered to a new tenant");
    drop(mounted);
}

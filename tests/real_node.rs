//! End to end on a real node (kubelet, containerd, runc; tests/node/): the DaemonSet and
//! node-cleanup from deploy/ as shipped (overlay: image, API address, ports, a block class)
//! under their real pod-bound ServiceAccount tokens, and workloads that really mount their
//! volumes. tests/run.sh starts the node after the other tests (LSP_NODE_DIR) and runs these
//! one at a time. Needs root.

mod support;

use std::path::Path;
use std::process::Command;

use k8s_openapi::jiff::Timestamp;
use local_static_provisioner::core::volumes::naming::pv_name;
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
    assert!(node.agent_log_tail(400).contains("volume wiped"), "the wipe is in the agent's log");

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
    let tmp = node.image_dir();
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
    let tmp = node.image_dir();
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
    let agent = node.deploy();
    // The agent sees kubelet's mounts through the three directories of deploy/base only: no
    // hostPath of kubelet's directory as a whole or above it.
    let kubelet = node.var("KUBELET_ROOT");
    let host_paths: Vec<&str> =
        agent["spec"]["volumes"].as_array().unwrap().iter().filter_map(|v| v["hostPath"]["path"].as_str()).collect();
    assert!(
        !host_paths.iter().any(|p| Path::new(kubelet).starts_with(p)),
        "kubelet's directory mounted: {host_paths:?}"
    );
    assert!(host_paths.contains(&format!("{kubelet}/pods").as_str()), "{host_paths:?}");
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

/// The same for a Block PV, whose device node kubelet bind-mounts under
/// plugins/kubernetes.io~local-volume (a directory of its own among the agent's hostPaths): a
/// pod deleted by force still writes to the device until kubelet has unmapped it, and the wipe
/// waits for that (VolumeStillMounted), so nothing it wrote reaches the next tenant.
#[test]
fn real_node_block_wipe_never_starts_while_kubelet_still_has_the_device_mapped() {
    let Some(node) = RealNode::get("real_node_block_wipe_never_starts_while_kubelet_still_has_the_device_mapped")
    else {
        return;
    };
    node.deploy();
    let tmp = node.image_dir();
    let disk = LoopDevice::new(&tmp.path().join("e2e-blk-held.img"), 48);
    let entry = unique("e2e-blk-held");
    let link = Link::new(&disk.device, &Path::new("/mnt/block-disks").join(&entry));
    let pv = pv_name(&entry, &node.name, "block-disks");
    let uid = wait_until("PV of e2e-blk-held", WAIT, || node.cp.pv_state(&pv).map(|(u, _)| u));
    let first_sector = || {
        let out = Command::new("dd")
            .arg(format!("if={}", disk.device.display()))
            .args(["bs=512", "count=1", "iflag=direct"])
            .output()
            .unwrap();
        out.stdout
    };
    // Writes its count to the device's first sector (which every wipe clears) until killed.
    let stubborn = "trap '' TERM; i=0; while true; do i=$((i+1)); echo $i | dd of=/dev/xvda bs=512 count=1 conv=fsync,notrunc 2>/dev/null; sleep 0.1; done";
    node.claim("e2e-blk-held-1", "block-disks", true, "48Mi");
    node.workload("e2e-blk-held-writer", "e2e-blk-held-1", true, stubborn, 6);
    node.wait_phase("e2e-blk-held-writer", &["Running"]);
    wait_until("the pod writes", WAIT, || first_sector().iter().any(|b| *b != 0).then_some(()));
    node.delete_pod("e2e-blk-held-writer", true);
    node.delete_claim("e2e-blk-held-1");
    // Until kubelet has unmapped the device, the PV is not wiped.
    while node.kubelet_holds(&pv) {
        let (now_uid, _) = node.cp.pv_state(&pv).expect("the PV stays while kubelet maps its device");
        assert_eq!(now_uid, uid, "PV republished while kubelet still mapped the device");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    wait_recycled(&node, &pv, &uid, None);
    assert!(node.cp.has_event(&pv, "VolumeStillMounted", "still mounted for a pod"), "the wait is said in an event");
    wait_until("pod e2e-blk-held-writer gone", WAIT, || {
        node.cp.get_json(&["pod", "e2e-blk-held-writer", "-n", "default"]).is_none().then_some(())
    });
    // Nothing written after the wipe: the first sector is still zero once the writer is gone.
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(
        first_sector().iter().all(|b| *b == 0),
        "written after the wipe: {:?}",
        String::from_utf8_lossy(&first_sector())
    );
    drop(link);
    wait_until("block PV withdrawn", WAIT, || node.cp.pv_state(&pv).is_none().then_some(()));
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

/// The start-up taint of the test overlay (deploy/components/startup-taint, tests/node/overlay.sh).
const STARTUP_TAINT: &str = "lsp-e2e.example.com/storage-not-ready";

/// The real Node's taints (kubelet's own `not-ready` one among them: nothing removes it here).
fn taints(node: &RealNode) -> Vec<serde_json::Value> {
    let got = node.cp.get_json(&["node", &node.name]).unwrap();
    got["spec"]["taints"].as_array().cloned().unwrap_or_default()
}

/// removeNodeNotReadyTaint on the real node, as deploy/ installs it with its component: the
/// Node tainted NoExecute with the start-up key (as a node pool registers it), the agent's pod
/// replaced; the DaemonSet's toleration lets the new pod run there, and once its pass published
/// the node's volumes its pod-bound token removes that taint, under the shipped Node policy;
/// the other taints stay.
#[test]
fn real_node_the_start_up_taint_goes_once_the_volumes_are_published() {
    let Some(node) = RealNode::get("real_node_the_start_up_taint_goes_once_the_volumes_are_published") else { return };
    let agent = node.deploy();
    let (entry, _path, _mount) = disk("/mnt/fast-disks", "e2e-taint", 16);
    let pv = pv_name(&entry, &node.name, "fast-disks");
    wait_until("the PV of the disk", WAIT, || node.cp.get_json(&["pv", &pv]));
    let others = taints(&node);
    assert!(others.iter().all(|t| t["key"] != STARTUP_TAINT), "{others:?}");
    node.cp.kubectl_ok(&["taint", "node", &node.name, &format!("{STARTUP_TAINT}=true:NoExecute")]);
    let old_uid = agent["metadata"]["uid"].as_str().unwrap().to_string();
    node.cp.kubectl_ok(&[
        "delete",
        "pod",
        "-n",
        "local-static-provisioner",
        agent["metadata"]["name"].as_str().unwrap(),
        "--wait=false",
    ]);
    let new = wait_until("the agent's pod replaced on the tainted node", WAIT, || {
        let pod = node.ready_pod("local-static-provisioner", "app.kubernetes.io/name=local-static-provisioner");
        (pod["metadata"]["uid"] != old_uid.as_str()).then_some(pod)
    });
    let tolerations = new["spec"]["tolerations"].as_array().unwrap();
    assert!(tolerations.iter().any(|t| t["key"] == STARTUP_TAINT && t["operator"] == "Exists"), "{tolerations:?}");
    wait_until("the start-up taint removed", WAIT, || (taints(&node) == others).then_some(()));
    wait_until("the removal told on the Node", WAIT, || {
        node.cp.has_event(&node.name, "StartupTaintRemoved", STARTUP_TAINT).then_some(())
    });
    // node-cleanup's pod may have been evicted meanwhile: the next test's deploy waits for it.
}

/// A kubeconfig holding the agent pod's own pod-bound token, read where kubelet projected it.
fn agent_pod_kubeconfig(node: &RealNode, agent: &serde_json::Value, dir: &Path) -> std::path::PathBuf {
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
    node.cp.token_kubeconfig(dir, "agent-pod", token.trim())
}

/// The agent's own pod-bound token (read where kubelet projected it) carries the node claim:
/// the admission policy lets it write its node's PVs and nothing of another node's.
#[test]
fn real_node_the_agents_pod_bound_token_reaches_only_its_nodes_pvs() {
    let Some(node) = RealNode::get("real_node_the_agents_pod_bound_token_reaches_only_its_nodes_pvs") else { return };
    let agent = node.deploy();
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = agent_pod_kubeconfig(&node, &agent, tmp.path());
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

/// The same token on LocalStorageNodes (the node inventory, issue 31): it reads its own node's
/// (which it may create, owned by its Node), and the admission policy refuses it every write to
/// another node's, its used-disk records included, and a status of its own naming another node.
#[test]
fn real_node_the_agents_pod_bound_token_reaches_only_its_nodes_inventory() {
    let Some(node) = RealNode::get("real_node_the_agents_pod_bound_token_reaches_only_its_nodes_inventory") else {
        return;
    };
    let agent = node.deploy();
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = agent_pod_kubeconfig(&node, &agent, tmp.path());
    let as_agent = |args: &[&str], stdin: Option<&str>| node.cp.kubectl_stdin(&kubeconfig, args, stdin);
    let api = "local-static-provisioner.io/v1alpha1";
    let node_uid = node.cp.get_json(&["node", &node.name]).unwrap()["metadata"]["uid"].as_str().unwrap().to_string();
    let object = |name: &str, owner: &str| {
        format!(
            "apiVersion: {api}\nkind: LocalStorageNode\nmetadata:\n  name: {name}\n  ownerReferences: [{{apiVersion: v1, kind: Node, name: {owner}, uid: {node_uid}}}]\nspec: {{nodeName: {name}}}\n"
        )
    };
    let status = |name: &str, node_name: &str, used: &str| {
        format!(
            "apiVersion: {api}\nkind: LocalStorageNode\nmetadata: {{name: {name}}}\nstatus:\n  nodeName: {node_name}\n  usedDisks: {used}\n"
        )
    };
    let apply_status = |yaml: &str| as_agent(support::APPLY_STATUS, Some(yaml));
    let denied = |out: std::process::Output, what: &str| {
        assert!(!out.status.success(), "{what} must be refused");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("ValidatingAdmissionPolicy") && err.contains("local-static-provisioner-inventory"),
            "{what}: {err}"
        );
    };

    // Its own: created by the agent, or else by this test with the agent's token (allowed: its
    // name, its node, owned by its Node; the agent takes AlreadyExists as done), then read.
    let own = as_agent(&["create", "-f", "-"], Some(&object(&node.name, &node.name)));
    let err = String::from_utf8_lossy(&own.stderr);
    assert!(own.status.success() || err.contains("AlreadyExists"), "creating its own LocalStorageNode: {err}");
    let got = as_agent(&["get", "localstoragenode", &node.name, "-o", "json"], None);
    assert!(got.status.success(), "reading its own LocalStorageNode: {}", String::from_utf8_lossy(&got.stderr));
    let got: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
    assert_eq!(got["spec"]["nodeName"], node.name.as_str());

    // Another node's, as its agent would have written it (by the admin here, without an owner:
    // that Node does not exist), with a used-disk record.
    let other = "lsp-other-node";
    node.cp.apply(&format!(
        "apiVersion: {api}\nkind: LocalStorageNode\nmetadata: {{name: {other}}}\nspec: {{nodeName: {other}}}\n"
    ));
    let record = "[{identity: 'blk:serial=e2e-other', pv: local-pv-e2e-other, path: /mnt/fast-disks/x, at: '2026-11-28T12:00:00Z', claimed: true}]";
    let out = node.cp.kubectl_stdin(
        &node.cp.kubeconfig,
        &["apply", "--server-side", "--field-manager=e2e-other-agent", "--subresource=status", "-f", "-"],
        Some(&status(other, other, record)),
    );
    assert!(out.status.success(), "the other node's status: {}", String::from_utf8_lossy(&out.stderr));
    denied(apply_status(&status(other, other, "[]")), "clearing another node's used disks");
    denied(apply_status(&status(other, &node.name, "[]")), "taking over another node's status");
    denied(
        as_agent(&["create", "-f", "-"], Some(&object("lsp-other-node-2", "lsp-other-node-2"))),
        "creating another node's",
    );
    denied(apply_status(&status(&node.name, other, "[]")), "its own status naming another node");
    let kept = node.cp.get_json(&["localstoragenode", other]).unwrap();
    assert_eq!(kept["status"]["usedDisks"][0]["identity"], "blk:serial=e2e-other", "the other node's record: {kept}");
    assert!(node.cp.get_json(&["localstoragenode", "lsp-other-node-2"]).is_none());
    node.cp.kubectl_ok(&["delete", "localstoragenode", other]);
}

/// `kubectl get localstoragenodes` shows the real node with its printer columns once its agent
/// has written its status, and a new disk in it within a second of its mount.
#[test]
fn real_node_kubectl_get_localstoragenodes_shows_the_node() {
    let Some(node) = RealNode::get("real_node_kubectl_get_localstoragenodes_shows_the_node") else { return };
    node.deploy();
    let (entry, _path, mount) = disk("/mnt/fast-disks", "e2e-inventory", 8);
    let pv = pv_name(&entry, &node.name, "fast-disks");
    wait_until("PV of e2e-inventory", WAIT, || node.cp.pv_state(&pv));
    // The status that shows the PV: the one written when the volume was found may precede it
    // (the PV reaches the agent's store by its watch, and is written by a later pass).
    let status =
        wait_until("the agent to write its LocalStorageNode with the PV", std::time::Duration::from_secs(30), || {
            let obj = node.cp.get_json(&["localstoragenode", &node.name])?;
            let has_pv = obj["status"]["volumes"].as_array().is_some_and(|v| v.iter().any(|v| v["pv"] == pv.as_str()));
            (obj["status"]["nodeName"] == node.name.as_str() && has_pv).then_some(obj["status"].clone())
        });
    assert!(status["summary"]["volumes"].as_i64().unwrap_or(0) >= 1, "{status}");
    let table = node.cp.kubectl_ok(&["get", "localstoragenodes"]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "DISKS", "CLAIMED", "VOLUMES", "AVAILABLE", "CAPACITY", "PROBLEMS", "AGE"], "{table}");
    let row: Vec<&str> = lines
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|r| r.first() == Some(&node.name.as_str()))
        .unwrap_or_else(|| panic!("no row for {}:\n{table}", node.name));
    assert!(row[1..7].iter().all(|c| *c != "<none>"), "a column is empty:\n{table}");
    let wide = node.cp.kubectl_ok(&["get", "localstoragenodes", "-o", "wide"]);
    let header = wide.lines().next().unwrap();
    assert!(header.contains("VERSION") && header.contains("CONFIG-VALID"), "{wide}");
    // A change is in the object within a second: a new disk, timed from its mount.
    let started = std::time::Instant::now();
    let (_entry2, path2, mount2) = disk("/mnt/fast-disks", "e2e-inventory-new", 8);
    let shown = |obj: &serde_json::Value| {
        obj["status"]["volumes"].as_array().is_some_and(|v| v.iter().any(|v| v["path"] == path2.to_str().unwrap()))
    };
    wait_until("the new disk in the LocalStorageNode", WAIT, || {
        node.cp.get_json(&["localstoragenode", &node.name]).filter(shown).map(|_| ())
    });
    let took = started.elapsed();
    println!("real node: a new disk was in kubectl get localstoragenode {} ms after its mount", took.as_millis());
    assert!(took < std::time::Duration::from_secs(3), "took {took:?} (goal: a second)");
    drop(mount2);
    drop(mount);
    wait_until("PV withdrawn", WAIT, || node.cp.pv_state(&pv).is_none().then_some(()));
}

/// An ext4 volume in use by a pod starts recording errors (the kernel's `trigger_fs_error`, as a
/// failing disk's read errors would): the app owner sees it on the claim (`kubectl describe
/// pvc`), the PV carries the reasons, and nothing of the tenant's is touched. After the claim is
/// let go, the volume is wiped but not offered again while its filesystem records errors.
#[test]
fn real_node_a_failing_disk_is_shown_on_the_claim() {
    let Some(node) = RealNode::get("real_node_a_failing_disk_is_shown_on_the_claim") else { return };
    node.deploy();
    let tmp = node.image_dir();
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
    let start = std::time::Instant::now();
    let described = loop {
        let out = node.cp.kubectl_ok(&["describe", "pvc", &claim, "-n", "default"]);
        if out.contains("DiskFailing") {
            break out;
        }
        // What the kernel and the agent said, for a run that fails here.
        assert!(
            start.elapsed() < WAIT,
            "no DiskFailing on the claim after {WAIT:?}; errors_count {:?}; PV {}\n{out}\nagent:\n{}",
            std::fs::read_to_string(format!("/sys/fs/ext4/{name}/errors_count")),
            node.cp.get_json(&["pv", &pv]).map(|v| v["metadata"]["annotations"].to_string()).unwrap_or_default(),
            node.agent_log_tail(80)
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
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

// ---- Swapped disks (issue 28): no pod ever gets another tenant's disk ----

/// How long a pod may take to start once its volume's fence is lifted: kubelet retries a
/// failed mount with a backoff growing to 2 min 2 s, and the scheduler a pod it could not place.
const AFTER_PUT_BACK: std::time::Duration = std::time::Duration::from_secs(300);

/// One tenant of a swap test: its disk's entry and PV, its claim, the pods that write and then
/// read its data, and the secret it writes (unique to the test process).
struct Tenant {
    pv: String,
    claim: String,
    writer: String,
    reader: String,
    secret: String,
    /// The tenant file (Filesystem): `tenant-<tag>` in the volume.
    file: String,
}

/// Two loop devices, each one tenant's volume: ext4 filesystems mounted at two entries of
/// /mnt/fast-disks, or symlinks at two entries of /mnt/block-disks. `place(true)` puts each disk
/// at the other's entry, as a reboot that renames disks does to an fstab (or links) by kernel
/// name; `place(false)` puts them back. Dropped, passed or not: unmounted or unlinked, entries
/// removed, loop devices detached.
struct SwapLab<'a> {
    node: &'a RealNode,
    block: bool,
    entries: [std::path::PathBuf; 2],
    devices: [LoopDevice; 2],
    tenants: [Tenant; 2],
    _images: tempfile::TempDir,
    /// When the disks last moved (see [`SwapLab::note`]).
    moved: std::cell::Cell<std::time::Instant>,
}

impl<'a> SwapLab<'a> {
    /// The disks (ext4 when `!block`), each at its own entry, and their PVs published.
    fn new(node: &'a RealNode, block: bool, stem: &str) -> SwapLab<'a> {
        let images = node.image_dir();
        let (dir, class) = if block { ("/mnt/block-disks", "block-disks") } else { ("/mnt/fast-disks", "fast-disks") };
        let devices = ["a", "b"].map(|tag| {
            let disk = LoopDevice::new(&images.path().join(format!("{stem}-{tag}.img")), 40);
            if !block {
                support::run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&disk.device));
            }
            disk
        });
        let names = ["a", "b"].map(|tag| unique(&format!("{stem}-{tag}")));
        let entries = names.clone().map(|entry| Path::new(dir).join(entry));
        let tenants = [0, 1].map(|i| {
            let tag = ["a", "b"][i];
            Tenant {
                pv: pv_name(&names[i], &node.name, class),
                claim: unique(&format!("{stem}-claim-{tag}")),
                writer: unique(&format!("{stem}-writer-{tag}")),
                reader: unique(&format!("{stem}-reader-{tag}")),
                secret: format!("secret-of-tenant-{tag}-{}", std::process::id()),
                file: format!("tenant-{tag}"),
            }
        });
        let lab = SwapLab {
            node,
            block,
            entries,
            devices,
            tenants,
            _images: images,
            moved: std::time::Instant::now().into(),
        };
        if !block {
            lab.entries.iter().for_each(|e| std::fs::create_dir_all(e).unwrap());
        }
        lab.place(false);
        for t in &lab.tenants {
            wait_until(&format!("PV {} published", t.pv), WAIT, || node.cp.pv_state(&t.pv));
        }
        lab
    }

    /// Each disk at its own entry, or (`crosswise`) at the other's. Filesystems: both
    /// unmounted first (kubelet must have let go of them), then mounted; links: both removed,
    /// then made again.
    fn place(&self, crosswise: bool) {
        self.moved.set(std::time::Instant::now());
        for entry in &self.entries {
            if self.block {
                let _ = std::fs::remove_file(entry);
            } else if support::mounts_under(entry).contains(entry) {
                support::umount_when_idle(entry);
            }
        }
        for (i, entry) in self.entries.iter().enumerate() {
            let device = &self.devices[if crosswise { 1 - i } else { i }].device;
            if self.block {
                std::os::unix::fs::symlink(device, entry).unwrap();
            } else {
                support::run(Command::new("mount").arg(device).arg(entry));
            }
        }
    }

    /// Says on stderr what happened how long after the disks last moved (the figures of the
    /// report: how soon a fence is set and lifted, how soon a pod starts after the put-back).
    fn note(&self, what: &str) {
        eprintln!("[swap] {:>5.1} s after the disks moved: {what}", self.moved.get().elapsed().as_secs_f64());
    }

    /// The tenant files in the filesystem at entry `i` now, by name, with their contents.
    fn files_at(&self, i: usize) -> Vec<(String, String)> {
        let mut files: Vec<(String, String)> = std::fs::read_dir(&self.entries[i])
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("tenant-"))
            .map(|name| {
                let text = std::fs::read_to_string(self.entries[i].join(&name)).unwrap_or_default();
                (name, text.trim().to_string())
            })
            .collect();
        files.sort();
        files
    }

    /// What the first sector of disk `i` holds, as text (the block tenants' secret).
    fn sector_of(&self, i: usize) -> String {
        let mut head = vec![0u8; 512];
        let file = std::fs::File::open(&self.devices[i].device).unwrap();
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut head, 0).unwrap();
        String::from_utf8_lossy(&head).trim_matches(char::from(0)).trim().to_string()
    }
}

impl Drop for SwapLab<'_> {
    fn drop(&mut self) {
        for entry in &self.entries {
            if self.block {
                let _ = std::fs::remove_file(entry);
            } else {
                for _ in 0..3 {
                    if !support::mounts_under(entry).contains(entry) {
                        break;
                    }
                    let _ = Command::new("umount").arg("-l").arg(entry).status();
                }
                let _ = std::fs::remove_dir(entry);
            }
        }
        if std::thread::panicking() {
            // A failed test's PVs would stay Released for good (their disks gone: never wiped),
            // recording the identities of loop devices over deleted images, whose inodes a later
            // test's images may get again: that disk would then be refused as one already
            // published (seen). They are the test's own: deleted, finalizers and all.
            for t in &self.tenants {
                let _ = self.node.cp.kubectl(&[
                    "patch",
                    "pv",
                    &t.pv,
                    "--type=merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ]);
                let _ = self.node.cp.kubectl(&["delete", "pv", &t.pv, "--ignore-not-found", "--wait=false"]);
            }
        }
    }
}

impl<'a> SwapLab<'a> {
    fn class(&self) -> &'static str {
        if self.block { "block-disks" } else { "fast-disks" }
    }

    /// Each tenant's claim, bound to its own PV, and its writer pod: it writes its secret (a file
    /// in its filesystem, or the first sector of its device) and stays Running. Returns once both
    /// secrets are on their own disks.
    fn write_secrets(&self) {
        for t in &self.tenants {
            self.node.claim_volume(&t.claim, self.class(), self.block, "16Mi", &t.pv);
            let write = if self.block {
                format!("echo {} | dd of=/dev/xvda bs=512 count=1 conv=sync,fsync", t.secret)
            } else {
                format!("echo {} > /data/{} && sync", t.secret, t.file)
            };
            self.node.workload(
                &t.writer,
                &t.claim,
                self.block,
                &format!("{write} && trap 'exit 0' TERM; sleep 3600 & wait"),
                5,
            );
        }
        for (i, t) in self.tenants.iter().enumerate() {
            self.node.wait_phase(&t.writer, &["Running"]);
            let bound = self.node.cp.get_json(&["pvc", &t.claim, "-n", "default"]).unwrap();
            assert_eq!(bound["spec"]["volumeName"], t.pv.as_str(), "claim {} took its own volume", t.claim);
            wait_until(&format!("tenant {i}'s secret on its disk"), WAIT, || {
                let written = if self.block {
                    self.sector_of(i) == t.secret
                } else {
                    self.files_at(i) == [(t.file.clone(), t.secret.clone())]
                };
                written.then_some(())
            });
            assert!(self.node.kubelet_holds(&t.pv), "kubelet mounted (or mapped) PV {} for its pod", t.pv);
        }
    }

    /// Deletes the writer pods and waits until kubelet has let go of both volumes.
    fn stop_writers(&self) {
        for t in &self.tenants {
            self.node.delete_pod(&t.writer, false);
        }
        for t in &self.tenants {
            wait_until(&format!("pod {} gone and its volume let go", t.writer), WAIT, || {
                let gone = self.node.cp.get_json(&["pod", &t.writer, "-n", "default"]).is_none();
                (gone && !self.node.kubelet_holds(&t.pv)).then_some(())
            });
        }
    }

    /// Each tenant's reader pod: it prints what it finds of any tenant's (the files, or the
    /// first sector) and `read-done`, then stays Running. `placed`: already on the node
    /// (spec.nodeName), so that only kubelet stands between it and the volume.
    fn start_readers(&self, placed: bool) {
        let read = if self.block {
            "echo \"saw: $(dd if=/dev/xvda bs=512 count=1 2>/dev/null | tr -d '\\000')\""
        } else {
            "for f in /data/tenant-*; do echo \"saw $f: $(cat $f)\"; done"
        };
        let script = format!("{read}; echo read-done; trap 'exit 0' TERM; sleep 3600 & wait");
        for t in &self.tenants {
            if placed {
                self.node.workload_placed(&t.reader, &t.claim, self.block, &script, 5);
            } else {
                self.node.workload(&t.reader, &t.claim, self.block, &script, 5);
            }
        }
    }

    /// The fence labels on the node of both PVs (None: no label).
    fn fences(&self) -> [Option<String>; 2] {
        let labels = self.node.labels();
        [0, 1].map(|i| labels.get(&format!("fence.local-static-provisioner.io/{}", self.tenants[i].pv)).cloned())
    }

    /// Panics if any reader pod got the other tenant's disk: what it printed, and what kubelet
    /// set up for it on the host. While `fenced`, also if it got a disk at all: Running (or run),
    /// a kubelet mount or mapping of either PV, or a volume set up in its pod directory.
    fn assert_nothing_leaked(&self, fenced: bool) {
        for (i, t) in self.tenants.iter().enumerate() {
            let other = &self.tenants[1 - i];
            let log = self.node.pod_log(&t.reader);
            assert!(
                !log.contains(&other.secret) && !log.contains(&format!("/data/{}", other.file)),
                "pod {} saw the other tenant's data:\n{log}",
                t.reader
            );
            let Some(pod) = self.node.cp.get_json(&["pod", &t.reader, "-n", "default"]) else { continue };
            let kubelet_dir = Path::new(self.node.var("KUBELET_ROOT")).join("pods");
            let pod_dir = kubelet_dir.join(pod["metadata"]["uid"].as_str().unwrap_or("?"));
            let volume = pod_dir.join("volumes/kubernetes.io~local-volume").join(&t.pv);
            let seen: Vec<String> = std::fs::read_dir(&volume)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            assert!(
                !seen.contains(&other.file),
                "pod {}'s volume on the host holds {}: {seen:?}",
                t.reader,
                other.file
            );
            if !fenced {
                continue;
            }
            let phase = pod["status"]["phase"].as_str().unwrap_or_default();
            assert_eq!(phase, "Pending", "pod {} started while its volume is fenced:\n{log}", t.reader);
            assert!(log.is_empty(), "pod {} ran while its volume is fenced:\n{log}", t.reader);
            for pv in [&t.pv, &other.pv] {
                assert!(!self.node.kubelet_holds(pv), "kubelet mounted PV {pv} while it is fenced");
            }
            assert!(seen.is_empty(), "pod {}'s volume on the host holds {seen:?} while fenced", t.reader);
            let mapped = pod_dir.join("volumeDevices/kubernetes.io~local-volume").join(&t.pv);
            let device = std::fs::metadata(&mapped).is_ok_and(|m| {
                use std::os::unix::fs::FileTypeExt;
                m.file_type().is_block_device()
            });
            assert!(!device, "a device is mapped for pod {} at {} while fenced", t.reader, mapped.display());
        }
    }

    /// Polls `f` like [`wait_until`], checking at every look that nothing leaked (see
    /// [`SwapLab::assert_nothing_leaked`]).
    fn wait_fenced<T>(&self, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        wait_until(what, WAIT, || {
            self.assert_nothing_leaked(true);
            f()
        })
    }

    /// Waits until kubelet has refused both reader pods' volumes by the PVs' node affinity (its
    /// FailedMount "NodeAffinity check failed"), checking meanwhile that nothing leaked.
    fn wait_kubelet_refuses(&self) {
        for t in &self.tenants {
            self.wait_fenced(&format!("kubelet refuses pod {}'s volume", t.reader), || {
                self.node
                    .pod_events(&t.reader)
                    .iter()
                    .any(|(reason, text)| reason == "FailedMount" && text.contains("NodeAffinity check failed"))
                    .then_some(())
            });
        }
        self.note("kubelet refuses both pods' mounts (NodeAffinity check failed)");
    }

    /// Keeps checking for `secs` seconds that nothing leaked while fenced.
    fn stay_fenced(&self, secs: u64) {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        while std::time::Instant::now() < until {
            self.assert_nothing_leaked(true);
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// Waits for both PVs' fences (`not-its-disk`) and the VolumeFenced event on both claims
    /// and PVs, each naming the disk there as the other tenant's.
    fn wait_swap_fenced(&self) {
        self.wait_fenced("both PVs fenced as not-its-disk", || {
            (self.fences() == [0, 1].map(|_| Some("not-its-disk".to_string()))).then_some(())
        });
        self.note("both PVs fenced (not-its-disk)");
        for (i, t) in self.tenants.iter().enumerate() {
            let other = &self.tenants[1 - i];
            self.wait_fenced(&format!("VolumeFenced on claim {} and PV {}", t.claim, t.pv), || {
                let told = |name: &str| self.node.cp.has_event(name, "VolumeFenced", "not the PV's own");
                (told(&t.claim) && told(&t.pv)).then_some(())
            });
            assert!(
                self.node.cp.has_event(&t.claim, "VolumeFenced", &format!("the disk of PV {}", other.pv)),
                "the claim's owner is told whose disk is at its path"
            );
        }
    }

    /// Puts the disks back and waits until both fences are lifted (VolumeUnfenced on both
    /// claims), both readers are Running and each printed its own secret; then checks on the
    /// host that each disk holds only its own tenant's data.
    fn put_back_and_read(&self) {
        self.place(false);
        wait_until("both fences lifted", WAIT, || {
            self.assert_nothing_leaked(false);
            (self.fences() == [None, None]).then_some(())
        });
        self.note("put back: both fences lifted");
        for t in &self.tenants {
            wait_until(&format!("VolumeUnfenced on claim {}", t.claim), WAIT, || {
                self.node.cp.has_event(&t.claim, "VolumeUnfenced", "lifted").then_some(())
            });
        }
        for t in &self.tenants {
            self.node.wait_phase_within(&t.reader, &["Running"], AFTER_PUT_BACK);
            self.note(&format!("pod {} Running", t.reader));
        }
        for (i, t) in self.tenants.iter().enumerate() {
            let log = wait_until(&format!("pod {} read its volume", t.reader), WAIT, || {
                self.assert_nothing_leaked(false);
                let log = self.node.pod_log(&t.reader);
                log.contains("read-done").then_some(log)
            });
            assert!(log.contains(&t.secret), "pod {} reads its own data after the put-back:\n{log}", t.reader);
            assert!(self.node.kubelet_holds(&t.pv), "kubelet mounted PV {} for its pod", t.pv);
            if self.block {
                assert_eq!(self.sector_of(i), t.secret, "disk {i} holds its own tenant's secret");
            } else {
                assert_eq!(
                    self.files_at(i),
                    [(t.file.clone(), t.secret.clone())],
                    "disk {i} holds its tenant's file only"
                );
            }
        }
        self.assert_nothing_leaked(false);
    }

    /// Releases both tenants and waits until both volumes are wiped and Available again, then
    /// takes the disks away and waits until their PVs are withdrawn (and not fenced for it).
    fn finish(self) {
        let uids = self.tenants.each_ref().map(|t| self.node.cp.pv_state(&t.pv).unwrap().0);
        let pods: Vec<&str> = self.tenants.iter().map(|t| t.reader.as_str()).collect();
        let claims: Vec<&str> = self.tenants.iter().map(|t| t.claim.as_str()).collect();
        release(self.node, &pods, &claims);
        for (i, t) in self.tenants.iter().enumerate() {
            let volume = (!self.block).then(|| self.entries[i].as_path());
            wait_recycled(self.node, &t.pv, &uids[i], volume);
        }
        let (node, pvs) = (self.node, self.tenants.each_ref().map(|t| t.pv.clone()));
        // Only what follows counts: a put-back that left a path empty for longer than the
        // settle window (an umount refused as busy a moment) fenced it as missing, rightly.
        let taken_away = Timestamp::now();
        drop(self);
        for pv in &pvs {
            wait_until(&format!("PV {pv} withdrawn"), WAIT, || node.cp.pv_state(pv).is_none().then_some(()));
        }
        // Withdrawn, not fenced on its way out (the agent posts its events right after its writes).
        std::thread::sleep(std::time::Duration::from_secs(1));
        for pv in &pvs {
            assert!(
                !node.cp.has_event_since(pv, "VolumeFenced", "nothing is mounted at its path", Some(taken_away)),
                "PV {pv} was fenced as its disk went away, on its way out"
            );
        }
    }
}

/// Whether the scheduler found no node for pod `name` because of its PV's node affinity (the
/// PodScheduled condition's message; its words differ between releases).
fn refused_by_scheduler(node: &RealNode, name: &str) -> bool {
    let Some(pod) = node.cp.get_json(&["pod", name, "-n", "default"]) else { return false };
    pod["status"]["conditions"].as_array().is_some_and(|conditions| {
        conditions.iter().any(|c| {
            c["type"] == "PodScheduled"
                && c["status"] == "False"
                && c["message"].as_str().is_some_and(|m| {
                    m.contains("didn't match PersistentVolume's node affinity")
                        || m.contains("volume node affinity conflict")
                })
        })
    })
}

/// Every node-selector term of a PV requires its own fence label and the node-wide one to be
/// absent from its node (the design of issue 28): kubelet and the scheduler then refuse it.
fn assert_honours_fences(node: &RealNode, pv: &str) {
    let found = node.cp.get_json(&["pv", pv]).unwrap();
    let terms = found["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"].as_array().unwrap();
    assert!(!terms.is_empty(), "{found}");
    for term in terms {
        let absent: Vec<&str> = term["matchExpressions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["operator"] == "DoesNotExist")
            .filter_map(|e| e["key"].as_str())
            .collect();
        let own = format!("fence.local-static-provisioner.io/{pv}");
        assert!(absent.contains(&own.as_str()), "PV {pv} requires {own} absent: {term}");
        assert!(absent.contains(&"local-static-provisioner.io/volumes-unverified"), "PV {pv}: {term}");
    }
}

/// Tests 1 and 2: two tenants write their secrets, their pods go, the disks come back swapped
/// (both fenced), their new pods are refused by the scheduler while nothing reaches either,
/// and after the put-back each pod reads its own secret.
fn swap_and_put_back(node: &RealNode, block: bool, stem: &str) {
    node.deploy();
    let lab = SwapLab::new(node, block, stem);
    lab.tenants.iter().for_each(|t| assert_honours_fences(node, &t.pv));
    lab.write_secrets();
    assert_eq!(lab.fences(), [None, None], "nothing fenced while each disk is at its own entry");

    lab.stop_writers();
    lab.place(true);
    lab.wait_swap_fenced();
    lab.start_readers(false);
    for t in &lab.tenants {
        lab.wait_fenced(&format!("pod {} refused a node for its volume", t.reader), || {
            refused_by_scheduler(node, &t.reader).then_some(())
        });
    }
    lab.note("both new pods refused by the scheduler");
    lab.stay_fenced(10);

    lab.put_back_and_read();
    lab.finish();
}

/// Two tenants on filesystem disks mounted by name: after the disks come back swapped, each
/// path holds the other tenant's disk. The agent fences both PVs (node labels their affinity
/// forbids), so the scheduler places neither tenant's new pod; nothing is mounted and nobody
/// sees the other's file. Put back, both pods start and read their own files.
#[test]
fn real_node_swapped_filesystem_disks_are_never_mounted_for_the_other_tenant() {
    let Some(node) = RealNode::get("real_node_swapped_filesystem_disks_are_never_mounted_for_the_other_tenant") else {
        return;
    };
    swap_and_put_back(&node, false, "e2e-swapfs");
}

/// The same with block volumes: the two links in the block discovery directory are pointed at
/// each other's device (as links made by kernel name are after a reboot); neither device is
/// mapped for the other tenant, and each tenant's first sector stays its own.
#[test]
fn real_node_swapped_block_links_are_never_mapped_for_the_other_tenant() {
    let Some(node) = RealNode::get("real_node_swapped_block_links_are_never_mapped_for_the_other_tenant") else {
        return;
    };
    swap_and_put_back(&node, true, "e2e-swapblk");
}

/// The disks are swapped while no agent runs (stopped gracefully: it sets the node-wide fence
/// as it goes), and the tenants' pods are placed on the node directly, past the scheduler:
/// kubelet's node-affinity check alone refuses their mounts. The agent, back, checks every PV
/// and replaces the node-wide fence by both PVs' own (never a moment without either); put
/// back, both pods start with their own data.
#[test]
fn real_node_a_swap_while_the_agent_is_down_is_fenced_before_any_pod_mounts() {
    let Some(node) = RealNode::get("real_node_a_swap_while_the_agent_is_down_is_fenced_before_any_pod_mounts") else {
        return;
    };
    node.deploy();
    let lab = SwapLab::new(&node, false, "e2e-swapdown");
    lab.tenants.iter().for_each(|t| assert_honours_fences(&node, &t.pv));
    lab.write_secrets();

    let away = node.keep_agent_away();
    let node_wide = || node.labels().get("local-static-provisioner.io/volumes-unverified").cloned();
    assert_eq!(node_wide().as_deref(), Some("agent-stopped"), "the stopping agent fenced the node's volumes");
    lab.stop_writers();
    lab.place(true);
    lab.start_readers(true);
    lab.wait_kubelet_refuses();
    assert_eq!(lab.fences(), [None, None], "no agent, no per-volume fence yet");
    lab.stay_fenced(5);

    // The agent comes back: its first pass fences both PVs before it lifts the node-wide fence.
    away.come_back();
    lab.wait_fenced("the node-wide fence replaced by both PVs' own", || {
        // One read of the labels: the agent lifts the node-wide fence in the same write that
        // sets each PV's own (the reason may first be `unverified`, if a disk is slow to answer).
        let labels = node.labels();
        if labels.contains_key("local-static-provisioner.io/volumes-unverified") {
            return None;
        }
        for t in &lab.tenants {
            let own = format!("fence.local-static-provisioner.io/{}", t.pv);
            assert!(labels.contains_key(&own), "the node-wide fence was lifted before {own} was set: {labels:?}");
        }
        Some(())
    });
    lab.wait_swap_fenced();
    lab.stay_fenced(10);

    lab.put_back_and_read();
    lab.finish();
}

/// Power-cycles the real node (tests/node/restart.sh): `down` kills kubelet, every container and
/// containerd with SIGKILL and drops the mounts a power loss takes; `up` boots it again (the boot
/// fence, then kubelet). Returns what the script said.
fn power(node: &RealNode, step: &str) -> String {
    let out = Command::new("bash")
        .arg(support::repo_root().join("tests/node/restart.sh"))
        .arg(&node.dir)
        .arg(step)
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "restart.sh {step} failed:\n{said}");
    said
}

/// A crash (nothing stops gracefully, so no agent fences the node on its way out) and a reboot
/// that brings the disks back swapped, with the tenants' pods already placed on the node: the
/// boot fence sets the node-wide fence before kubelet starts, so kubelet refuses their mounts
/// until the agent's first pass has fenced both PVs on their own. Put back, both read their
/// own data.
#[test]
fn real_node_a_crash_and_a_reboot_that_swaps_the_disks_reach_no_other_tenant() {
    let Some(node) = RealNode::get("real_node_a_crash_and_a_reboot_that_swaps_the_disks_reach_no_other_tenant") else {
        return;
    };
    node.deploy();
    // The DaemonSet keeps the boot fence's binary on the host (--install-boot-fence).
    let boot_fence = Path::new("/var/lib/local-static-provisioner/bin/local-static-provisioner");
    wait_until("the boot fence's binary on the host", WAIT, || boot_fence.exists().then_some(()));
    let lab = SwapLab::new(&node, false, "e2e-reboot");
    lab.write_secrets();
    lab.stop_writers();

    // The crash: nothing gets a SIGTERM, so nothing fences the node on its way down.
    power(&node, "down");
    let node_wide = || node.labels().get("local-static-provisioner.io/volumes-unverified").cloned();
    assert_eq!(node_wide(), None, "a crashed agent sets no fence");
    // While it is off, the disks come back swapped (fstab by kernel name), and the tenants'
    // pods are already bound to the node, waiting for it.
    lab.place(true);
    lab.start_readers(true);

    // The boot: the fence before kubelet, then kubelet starts the pods.
    let said = power(&node, "up");
    assert!(said.contains("node-wide volume fence set"), "the boot fence ran before kubelet:\n{said}");
    lab.note("node up again");
    lab.wait_kubelet_refuses();
    node.deploy();
    lab.wait_swap_fenced();
    assert_eq!(node_wide(), None, "the agent's first pass replaced the node-wide fence by each PV's own");
    lab.stay_fenced(5);

    lab.put_back_and_read();
    lab.finish();
}

/// The PID of the process that holds the agent's state-directory lock on this host (the
/// DaemonSet's agent: it flocks /var/lib/local-static-provisioner/lock for its whole life), read
/// from the kernel's lock table.
fn agent_pid() -> Option<i32> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata("/var/lib/local-static-provisioner/lock").ok()?;
    let file =
        format!("{:02x}:{:02x}:{}", nix::sys::stat::major(meta.dev()), nix::sys::stat::minor(meta.dev()), meta.ino());
    std::fs::read_to_string("/proc/locks").ok()?.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&"FLOCK") && fields.get(5) == Some(&file.as_str())).then(|| fields[4].parse().ok())?
    })
}

/// The agent SIGKILLed by its PID (no SIGTERM: it sets no fence on its way out), the disks
/// swapped, and kubelet restarted within the same boot, the tenants' pods already placed on the
/// node: kubelet's start (the boot fence as its ExecStartPre) finds no agent holding the node
/// and fences it, so kubelet refuses the pods' mounts until the restarted agent's first pass
/// has fenced both PVs on their own. Before issue 40 the hook trusted "fenced earlier in this
/// boot", set nothing, and both pods started on the other tenant's disk.
#[test]
fn real_node_an_agent_killed_and_a_kubelet_restart_that_swaps_the_disks_reach_no_other_tenant() {
    let Some(node) =
        RealNode::get("real_node_an_agent_killed_and_a_kubelet_restart_that_swaps_the_disks_reach_no_other_tenant")
    else {
        return;
    };
    node.deploy();
    let boot_fence = Path::new("/var/lib/local-static-provisioner/bin/local-static-provisioner");
    wait_until("the boot fence's binary on the host", WAIT, || boot_fence.exists().then_some(()));
    // This boot's kubelet start was fenced already (as systemd ran the hook at boot): what
    // follows is a restart within the boot. Noted here when the node started before the
    // binary was on the host.
    let marker = Path::new("/run/local-static-provisioner/boot-fenced");
    std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
    std::fs::write(marker, b"").unwrap();
    let lab = SwapLab::new(&node, false, "e2e-killed");
    lab.write_secrets();
    lab.stop_writers();

    // kubelet first (it would restart the agent's container at once), then the agent, by the
    // PID that holds its lock: SIGKILL, so no fence on its way out.
    power(&node, "kubelet-down");
    let pid = wait_until("the agent's PID", WAIT, agent_pid);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    wait_until("the agent's lock released", WAIT, || agent_pid().is_none().then_some(()));
    let node_wide = || node.labels().get("local-static-provisioner.io/volumes-unverified").cloned();
    assert_eq!(node_wide(), None, "a killed agent sets no fence");
    lab.place(true);
    lab.start_readers(true);

    let said = power(&node, "kubelet-up");
    assert!(said.contains("node-wide volume fence set"), "kubelet's start fenced the node:\n{said}");
    assert!(said.contains("volumes-unverified=agent-gone"), "no agent held the node:\n{said}");
    lab.note("kubelet up again");
    lab.wait_kubelet_refuses();
    lab.wait_swap_fenced();
    assert_eq!(node_wide(), None, "the agent's first pass replaced the node-wide fence by each PV's own");
    lab.stay_fenced(5);

    lab.put_back_and_read();
    lab.finish();
}

/// What the tenant of the encrypted volume writes: found in the raw disk only if it was written
/// there in clear.
const ENCRYPTED_SECRET: &str = "E2E-ENCRYPTED-SECRET-3d9a61c7-never-on-the-disk";

/// Encryption at rest as users install it (docs/encryption.md; the overlay's encrypted-disks
/// class): a pod writes a secret through its claim and the raw disk never holds it; after a
/// reboot (which drops every key from the kernel) a pod recreated with the claim reads it, the
/// agent having put the key back before kubelet could mount the volume; released, the key is
/// destroyed before the files go (the recycled PV says so), and the next tenant's pod sees an
/// empty volume.
#[test]
fn real_node_an_encrypted_volume_keeps_its_data_off_the_disk_survives_a_reboot_and_is_erased() {
    let Some(node) =
        RealNode::get("real_node_an_encrypted_volume_keeps_its_data_off_the_disk_survives_a_reboot_and_is_erased")
    else {
        return;
    };
    node.deploy();
    let images = node.image_dir();
    let disk = LoopDevice::new(&images.path().join("e2e-enc.img"), 48);
    support::run(Command::new("mkfs.ext4").args(["-q", "-F", "-O", "encrypt"]).arg(&disk.device));
    let entry = unique("e2e-enc");
    let root = Path::new("/mnt/encrypted-disks").join(&entry);
    std::fs::create_dir_all(&root).unwrap();
    support::run(Command::new("mount").arg(&disk.device).arg(&root));
    let mount = Mount { path: root.clone() };
    let data = root.join("lsp-encrypted");
    let pv = pv_name(&entry, &node.name, "encrypted-disks");
    let uid = wait_until("the encrypted volume's PV", WAIT, || node.cp.pv_state(&pv).map(|(u, _)| u));
    let object = node.cp.get_json(&["pv", &pv]).unwrap();
    assert_eq!(object["spec"]["local"]["path"], data.display().to_string().as_str(), "the PV names the data directory");
    let key = object["metadata"]["annotations"]["local-static-provisioner.io/encryption"].as_str().unwrap().to_string();
    assert!(key.starts_with("fscrypt-v2 key="), "{key}");

    // The tenant writes through kubelet's mount of the PV; the disk holds only ciphertext.
    node.claim_volume("e2e-enc-1", "encrypted-disks", false, "30Mi", &pv);
    let write =
        format!("printf '%s' {ENCRYPTED_SECRET} > /data/secret && sync && trap 'exit 0' TERM; sleep 3600 & wait");
    node.workload("e2e-enc-writer", "e2e-enc-1", false, &write, 5);
    node.wait_phase("e2e-enc-writer", &["Running"]);
    wait_until("the secret written", WAIT, || data.join("secret").exists().then_some(()));
    assert!(node.kubelet_holds(&pv), "kubelet mounted the PV for the pod");
    support::run(&mut Command::new("sync"));
    let raw = std::fs::read(&disk.device).unwrap();
    let secret = ENCRYPTED_SECRET.as_bytes();
    assert!(!raw.windows(secret.len()).any(|w| w == secret), "the tenant's data is on the disk in clear");
    node.delete_pod("e2e-enc-writer", false);
    wait_until("the writer gone", WAIT, || {
        node.cp.get_json(&["pod", "e2e-enc-writer", "-n", "default"]).is_none().then_some(())
    });

    // A reboot: everything killed, the disk's filesystem mounted again (its key gone from the
    // kernel: the data directory is locked), the tenant's next pod already placed on the node,
    // then the node up: kubelet starts that pod at once, and may mount the volume only once the
    // agent's first pass lifted the boot fence, which it does after it put the key back.
    let boot_fence = Path::new("/var/lib/local-static-provisioner/bin/local-static-provisioner");
    wait_until("the boot fence's binary on the host", WAIT, || boot_fence.exists().then_some(()));
    power(&node, "down");
    support::run(Command::new("umount").arg(&root));
    support::run(Command::new("mount").arg(&disk.device).arg(&root));
    assert!(!data.join("secret").exists(), "the key survived the remount: the test proves nothing");
    let read = format!("[ \"$(cat /data/secret)\" = {ENCRYPTED_SECRET} ]");
    node.workload_placed("e2e-enc-reader", "e2e-enc-1", false, &read, 5);
    power(&node, "up");
    node.deploy();
    node.expect_success("e2e-enc-reader");

    // Released: the key destroyed first, then the files; the next tenant gets an empty volume.
    release(&node, &["e2e-enc-reader"], &["e2e-enc-1"]);
    let new_uid = wait_recycled(&node, &pv, &uid, Some(&data));
    let history =
        node.cp.get_json(&["pv", &pv]).unwrap()["metadata"]["annotations"]["local-static-provisioner.io/last-wipe"]
            .as_str()
            .unwrap_or_default()
            .to_string();
    let old_key = key.trim_start_matches("fscrypt-v2 ");
    for part in ["method=crypto-erase", old_key, "key-verified=absent"] {
        assert!(history.contains(part), "{part} missing from the recycled PV's last-wipe: {history}");
    }
    node.claim_volume("e2e-enc-2", "encrypted-disks", false, "30Mi", &pv);
    node.workload("e2e-enc-next", "e2e-enc-2", false, "ls -la /data; [ -z \"$(ls -A /data)\" ]", 5);
    node.expect_success("e2e-enc-next");
    release(&node, &["e2e-enc-next"], &["e2e-enc-2"]);
    wait_recycled(&node, &pv, &new_uid, Some(&data));
    drop(mount);
    drop(disk);
}

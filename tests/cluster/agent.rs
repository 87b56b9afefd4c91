//! The agent against the real control plane, with real mounts as disks, running under the
//! ServiceAccount and RBAC from deploy/: PVs are published exactly once, accepted by the API
//! server and usable by the scheduler and PV binder; restarts change nothing; upstream-made PVs
//! are adopted; a PV of someone else is never overwritten. Needs root.

use crate::support;

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::time::Duration;

use local_static_provisioner::core::volumes::naming::pv_name;
use serde_json::Value;
use support::{AgentProcess, ControlPlane, LoopDevice, mount_tmpfs, require_root, wait_until, write_config};

const WAIT: Duration = Duration::from_secs(60);

fn versions(pvs: &[Value]) -> BTreeMap<String, String> {
    pvs.iter()
        .map(|pv| {
            (
                pv["metadata"]["name"].as_str().unwrap().to_string(),
                pv["metadata"]["resourceVersion"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn agent_publishes_once_and_restarts_without_churn() {
    let _area = support::area(module_path!());
    if !require_root("agent_publishes_once_and_restarts_without_churn") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "agent-node-publish";
    let uid = cp.create_node(node);
    cp.create_storage_class("agent-fs", "Delete");
    cp.kubectl_ok(&["patch", "storageclass", "agent-fs", "--type=merge", "-p", r#"{"mountOptions":["noatime"]}"#]);
    cp.create_storage_class("agent-block", "Retain");

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let fs_dir = root.join("fs");
    let block_dir = root.join("block");
    std::fs::create_dir_all(&block_dir).unwrap();
    let _v1 = mount_tmpfs(&fs_dir.join("vol1"), 16);
    let _v2 = mount_tmpfs(&fs_dir.join("vol2"), 32);
    std::fs::create_dir_all(fs_dir.join("plain")).unwrap();
    let lo = LoopDevice::new(&root.join("disk.img"), 64);
    symlink(&lo.device, block_dir.join("disk1")).unwrap();

    let config = root.join("config");
    let class_map = format!(
        "agent-fs:\n  hostDir: {fs}\n  mountDir: {fs}\n  fsType: ext4\nagent-block:\n  hostDir: {block}\n  mountDir: {block}\n  volumeMode: Block\n",
        fs = fs_dir.display(),
        block = block_dir.display()
    );
    write_config(
        &config,
        &[
            ("storageClassMap", &class_map),
            ("nodeLabelsForPV", "- topology.kubernetes.io/zone\n"),
            ("setPVOwnerRef", "true\n"),
        ],
    );
    let kubeconfig = cp.agent_kubeconfig(root);
    let prefix = root.display().to_string();

    let agent = AgentProcess::start(&config, node, &kubeconfig, &root.join("agent-1.log"));
    let pvs = wait_until("3 PVs published", WAIT, || {
        let pvs = cp.pvs_under(&prefix);
        (pvs.len() == 3 && pvs.iter().all(|pv| pv["status"]["phase"] == "Available")).then_some(pvs)
    });

    let vol1 = pvs.iter().find(|pv| pv["metadata"]["name"] == pv_name("vol1", node, "agent-fs")).expect("vol1 PV");
    let meta = &vol1["metadata"];
    assert_eq!(
        meta["annotations"]["pv.kubernetes.io/provisioned-by"],
        format!("local-volume-provisioner-{node}-{uid}")
    );
    assert_eq!(meta["labels"]["local-static-provisioner.io/node"], node);
    assert_eq!(meta["labels"]["topology.kubernetes.io/zone"], "zone-a");
    assert_eq!(meta["ownerReferences"][0]["kind"], "Node");
    assert_eq!(meta["ownerReferences"][0]["uid"], uid.as_str());
    let spec = &vol1["spec"];
    assert_eq!(spec["local"]["path"], format!("{}/vol1", fs_dir.display()));
    assert_eq!(spec["local"]["fsType"], "ext4");
    assert_eq!(spec["capacity"]["storage"], "16Mi");
    assert_eq!(spec["persistentVolumeReclaimPolicy"], "Delete");
    assert_eq!(spec["mountOptions"], serde_json::json!(["noatime"]));
    assert_eq!(spec["accessModes"], serde_json::json!(["ReadWriteOnce"]));
    assert_eq!(spec["volumeMode"], "Filesystem");
    assert_eq!(
        spec["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0],
        serde_json::json!({"key": "kubernetes.io/hostname", "operator": "In", "values": [node]})
    );
    let disk = pvs.iter().find(|pv| pv["metadata"]["name"] == pv_name("disk1", node, "agent-block")).expect("disk PV");
    assert_eq!(disk["spec"]["volumeMode"], "Block");
    assert_eq!(disk["spec"]["persistentVolumeReclaimPolicy"], "Retain");
    assert_eq!(disk["spec"]["capacity"]["storage"], "64Mi");

    // A new mount while the agent runs is published too.
    let _v3 = mount_tmpfs(&fs_dir.join("vol3"), 12);
    wait_until("vol3 published", WAIT, || (cp.pvs_under(&prefix).len() == 4).then_some(()));

    // Restart: nothing is created or updated.
    let log = agent.stop();
    assert!(log.contains("shutting down"), "graceful shutdown expected:\n{log}");
    let before = versions(&cp.pvs_under(&prefix));
    let agent = AgentProcess::start(&config, node, &kubeconfig, &root.join("agent-2.log"));
    wait_until("three passes of the restarted agent", WAIT, || {
        (agent.log_text().matches("pass done").count() >= 3).then_some(())
    });
    let after = versions(&cp.pvs_under(&prefix));
    assert_eq!(before, after, "a restart must not create or change PVs");
    assert!(!agent.log_text().contains("created PV"), "{}", agent.log_text());

    // The published PVs are usable: a claim and a pod bind to one of them on this node.
    cp.apply(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: agent-claim, namespace: default}\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: agent-fs\n  resources: {requests: {storage: 10Mi}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: agent-pod, namespace: default}\nspec:\n  containers: [{name: app, image: registry.k8s.io/pause:3.10}]\n  volumes: [{name: data, persistentVolumeClaim: {claimName: agent-claim}}]\n",
    );
    let bound = wait_until("claim bound to an agent PV", WAIT, || {
        let pvc = cp.get_json(&["pvc", "agent-claim", "-n", "default"])?;
        (pvc["status"]["phase"] == "Bound").then(|| pvc["spec"]["volumeName"].as_str().unwrap().to_string())
    });
    assert!(after.contains_key(&bound), "claim bound to {bound}, not one of ours");
    let scheduled_to = wait_until("pod scheduled", WAIT, || {
        cp.get_json(&["pod", "agent-pod", "-n", "default"])?["spec"]["nodeName"].as_str().map(str::to_string)
    });
    assert_eq!(scheduled_to, node);
    cp.kubectl_ok(&["delete", "pod", "agent-pod", "-n", "default", "--grace-period=0", "--force"]);
    cp.kubectl_ok(&["delete", "pvc", "agent-claim", "-n", "default", "--wait=false"]);
    drop(agent);
    // Its PVs go with the test: the loop image's inode is freed with the scratch directory, and
    // a later test's image given the same inode would be that disk to the agent, held by these
    // unclaimed PVs of another node (core::identity::disk_trust).
    cp.forget_pvs_under(&root.display().to_string());
}

#[test]
fn agent_adopts_upstream_pvs_and_never_overwrites_foreign_ones() {
    let _area = support::area(module_path!());
    if !require_root("agent_adopts_upstream_pvs_and_never_overwrites_foreign_ones") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "agent-node-adopt";
    let uid = cp.create_node(node);
    cp.create_storage_class("adopt-fs", "Delete");

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let fs_dir = root.join("fs");
    let _v1 = mount_tmpfs(&fs_dir.join("vol1"), 16);
    let _v2 = mount_tmpfs(&fs_dir.join("vol2"), 16);
    let config = root.join("config");
    let class_map = format!("adopt-fs:\n  hostDir: {fs}\n  mountDir: {fs}\n", fs = fs_dir.display());
    write_config(&config, &[("storageClassMap", &class_map)]);

    // What upstream made for vol1: same name and path, upstream's annotation, no label of ours.
    let upstream_name = pv_name("vol1", node, "adopt-fs");
    cp.apply(&format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: {upstream_name}\n  annotations:\n    pv.kubernetes.io/provisioned-by: local-volume-provisioner-{node}-{uid}\nspec:\n  capacity: {{storage: 16Mi}}\n  accessModes: [ReadWriteOnce]\n  storageClassName: adopt-fs\n  persistentVolumeReclaimPolicy: Delete\n  volumeMode: Filesystem\n  local: {{path: {fs}/vol1}}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [{node}]}}]\n",
        fs = fs_dir.display()
    ));
    // A PV of another node that happens to carry the name vol2 would get.
    let foreign_name = pv_name("vol2", node, "adopt-fs");
    cp.apply(&format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: {foreign_name}\n  annotations:\n    pv.kubernetes.io/provisioned-by: local-volume-provisioner-other-node-1234\nspec:\n  capacity: {{storage: 1Gi}}\n  accessModes: [ReadWriteOnce]\n  storageClassName: adopt-fs\n  local: {{path: /mnt/elsewhere/vol9}}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [other-node]}}]\n"
    ));
    let foreign_before = cp.get_json(&["pv", &foreign_name]).unwrap();

    let kubeconfig = cp.agent_kubeconfig(root);
    let agent = AgentProcess::start(&config, node, &kubeconfig, &root.join("agent.log"));
    wait_until("upstream PV adopted", WAIT, || {
        let pv = cp.get_json(&["pv", &upstream_name])?;
        (pv["metadata"]["labels"]["local-static-provisioner.io/node"] == node).then_some(())
    });
    wait_until("collision reported as an event", WAIT, || {
        let events = cp.get_json(&["events.events.k8s.io", "-A"])?;
        events["items"]
            .as_array()?
            .iter()
            .any(|e| e["reason"] == "VolumeNameCollision" && e["regarding"]["name"] == foreign_name.as_str())
            .then_some(())
    });
    // Let a few more passes run: nothing may be duplicated or overwritten.
    std::thread::sleep(Duration::from_secs(3));
    let ours = cp.pvs_under(&fs_dir.display().to_string());
    assert_eq!(ours.len(), 1, "only the adopted PV may exist for this node's paths: {ours:#?}");
    assert_eq!(ours[0]["metadata"]["name"], upstream_name.as_str());
    let foreign_after = cp.get_json(&["pv", &foreign_name]).unwrap();
    assert_eq!(foreign_before["metadata"]["resourceVersion"], foreign_after["metadata"]["resourceVersion"]);
    assert_eq!(foreign_after["spec"]["local"]["path"], "/mnt/elsewhere/vol9");
    let log = agent.log_text();
    assert_eq!(log.matches("PV name taken by").count(), 1, "the collision is reported once:\n{log}");
    cp.kubectl_ok(&["delete", "pv", &foreign_name, &upstream_name, "--wait=false"]);
}

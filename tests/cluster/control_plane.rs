//! Proof that the test control plane is a real one: the scheduler places a pod that uses a
//! WaitForFirstConsumer claim on the fake node, the PV controller binds the claim and later
//! releases the PV, and RBAC is really enforced for the agent's ServiceAccount.

use crate::support;

use std::time::Duration;

use support::{ControlPlane, wait_until};

#[test]
fn scheduler_binder_and_rbac_are_real() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let node = "cp-proof-node";
    cp.create_node(node);
    cp.create_storage_class("cp-proof-sc", "Delete");
    cp.apply(&format!(
        r#"
apiVersion: v1
kind: PersistentVolume
metadata:
  name: cp-proof-pv
  annotations:
    pv.kubernetes.io/provisioned-by: local-volume-provisioner-{node}-test
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  storageClassName: cp-proof-sc
  persistentVolumeReclaimPolicy: Delete
  local: {{path: /mnt/cp-proof}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [{node}]}}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: cp-proof-claim, namespace: default}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: cp-proof-sc
  resources: {{requests: {{storage: 1Gi}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: cp-proof-pod, namespace: default}}
spec:
  containers: [{{name: app, image: registry.k8s.io/pause:3.10}}]
  volumes: [{{name: data, persistentVolumeClaim: {{claimName: cp-proof-claim}}}}]
"#
    ));

    let scheduled_to = wait_until("the pod to be scheduled", Duration::from_secs(60), || {
        let pod = cp.get_json(&["pod", "cp-proof-pod", "-n", "default"])?;
        pod["spec"]["nodeName"].as_str().map(str::to_string)
    });
    assert_eq!(scheduled_to, node);
    wait_until("claim and PV Bound", Duration::from_secs(60), || {
        let pvc = cp.get_json(&["pvc", "cp-proof-claim", "-n", "default"])?;
        let pv = cp.get_json(&["pv", "cp-proof-pv"])?;
        (pvc["status"]["phase"] == "Bound" && pv["status"]["phase"] == "Bound").then_some(())
    });
    let pv = cp.get_json(&["pv", "cp-proof-pv"]).unwrap();
    assert_eq!(pv["spec"]["claimRef"]["name"], "cp-proof-claim");

    // No kubelet runs, so the pod is removed with a forced delete; then the claim goes.
    cp.kubectl_ok(&["delete", "pod", "cp-proof-pod", "-n", "default", "--grace-period=0", "--force"]);
    cp.kubectl_ok(&["delete", "pvc", "cp-proof-claim", "-n", "default", "--wait=false"]);
    wait_until("the PV controller to release the PV", Duration::from_secs(60), || {
        let pv = cp.get_json(&["pv", "cp-proof-pv"])?;
        (pv["status"]["phase"] == "Released").then_some(())
    });

    // The agent's ServiceAccount gets exactly its ClusterRole: reading its node is allowed,
    // deleting nodes, reading secrets, running pods, changing StorageClasses or creating
    // namespaces is not.
    let tmp = tempfile::tempdir().unwrap();
    let agent = cp.agent_kubeconfig(tmp.path());
    let ok = cp.kubectl_as(&agent, &["get", "node", node, "-o", "name"]);
    assert!(ok.status.success(), "agent must read its node: {}", String::from_utf8_lossy(&ok.stderr));
    for denied in [
        vec!["delete", "node", node],
        vec!["get", "secrets", "-n", "kube-system"],
        vec!["run", "agent-must-not", "--image", "x", "-n", "default"],
        vec!["delete", "storageclass", "cp-proof-sc"],
        vec!["create", "namespace", "agent-must-not"],
    ] {
        let out = cp.kubectl_as(&agent, &denied);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("Forbidden"), "{denied:?} must be forbidden, got: {err}");
    }
    cp.kubectl_ok(&["delete", "pv", "cp-proof-pv", "--wait=false"]);
}

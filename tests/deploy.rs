//! The shipped manifests against the real API server: the kustomize base and the Helm chart
//! (rendered from a values file written for the upstream chart) are accepted by a server-side
//! dry run, and the ConfigMap the chart renders is a valid config for the agent.

mod support;

use std::path::PathBuf;
use std::process::Command;

use support::{ControlPlane, binary, repo_root, run, write_config};

fn helm() -> PathBuf {
    let out = run(Command::new("bash").arg(repo_root().join("tests/tools/build-helm.sh")));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// `kubectl apply --dry-run=server -f -`: validated and admitted by the API server, not stored.
fn server_dry_run(cp: &ControlPlane, yaml: &str) {
    let out = cp.kubectl_stdin(&cp.kubeconfig, &["apply", "--dry-run=server", "-f", "-"], Some(yaml));
    assert!(out.status.success(), "dry run refused: {}\n{yaml}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn kustomize_base_is_accepted_by_the_api_server() {
    let cp = ControlPlane::get();
    let _ = cp.kubectl(&["create", "namespace", "local-static-provisioner"]);
    let out = cp.kubectl_ok(&["kustomize", repo_root().join("deploy/base").to_str().unwrap()]);
    for kind in ["DaemonSet", "ClusterRole", "ConfigMap", "StorageClass", "ValidatingAdmissionPolicy"] {
        assert!(out.contains(&format!("kind: {kind}")), "kustomize output lacks {kind}");
    }
    server_dry_run(&cp, &out);
}

#[test]
fn helm_chart_takes_upstream_values_and_renders_a_valid_config() {
    let cp = ControlPlane::get();
    let ns = "lsp-helm-test";
    let _ = cp.kubectl(&["create", "namespace", ns]);
    let chart = repo_root().join("deploy/helm/local-static-provisioner");
    let values = repo_root().join("tests/fixtures/upstream-values.yaml");
    let out =
        run(Command::new(helm()).args(["template", "lsp", "--namespace", ns]).arg(&chart).arg("--values").arg(&values));
    let rendered = String::from_utf8(out.stdout).unwrap();
    server_dry_run(&cp, &rendered);

    // The ConfigMap's keys, mounted as kubelet would, are a valid config with upstream's meaning.
    let docs: Vec<serde_json::Value> = rendered
        .split("\n---")
        .filter_map(|d| serde_saphyr::from_str::<serde_json::Value>(d).ok())
        .filter(|d| d.is_object())
        .collect();
    let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").expect("a ConfigMap");
    let data = cm["data"].as_object().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let keys: Vec<(&str, &str)> = data.iter().map(|(k, v)| (k.as_str(), v.as_str().unwrap())).collect();
    write_config(tmp.path(), &keys);
    let out = run(Command::new(binary()).args(["validate-config", "--config-dir"]).arg(tmp.path()));
    let effective: serde_json::Value = serde_saphyr::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let fast = &effective["storageClassMap"]["fast-disks"];
    assert_eq!(fast["blockCleanerCommand"], serde_json::json!(["/scripts/shred.sh", "2"]));
    assert_eq!(fast["fsType"], "ext4");
    let block = &effective["storageClassMap"]["local-block"];
    assert_eq!(block["volumeMode"], "Block");
    assert_eq!(block["mountDir"], "/mnt/block-disks", "mountDir defaults to hostDir");
    assert_eq!(block["namePattern"], "nvme*,sd*");
    assert_eq!(block["selector"][0]["matchExpressions"][0]["key"], "topology.kubernetes.io/zone");
    assert_eq!(effective["setPVOwnerRef"], true);
    assert_eq!(effective["useJobForCleaning"], true);
    assert_eq!(effective["useNodeNameOnly"], true);
    assert_eq!(effective["nodeLabelsForPV"], serde_json::json!(["topology.kubernetes.io/zone"]));
    assert_eq!(effective["labelsForPV"]["pv-labels"], "can-be-selected");

    // The rest of the upstream values land where they should.
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "local-storage-admin");
    assert_eq!(pod["tolerations"][0]["key"], "storage-node");
    let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
    assert!(mounts.iter().any(|m| m["mountPath"] == "/mnt/block-disks" && m["mountPropagation"] == "HostToContainer"));
    let default_sc =
        docs.iter().find(|d| d["kind"] == "StorageClass" && d["metadata"]["name"] == "fast-disks").unwrap();
    assert_eq!(default_sc["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"], "true");
    let vap = docs.iter().find(|d| d["kind"] == "ValidatingAdmissionPolicy").unwrap();
    assert!(vap.to_string().contains(&format!("system:serviceaccount:{ns}:local-storage-admin")));

    // With serviceMonitor enabled (as many upstream values files have it) the chart renders it.
    let out = run(Command::new(helm())
        .args(["template", "lsp", "--namespace", ns, "--set", "serviceMonitor.enabled=true"])
        .arg(&chart)
        .arg("--values")
        .arg(&values));
    assert!(String::from_utf8_lossy(&out.stdout).contains("kind: ServiceMonitor"));
}

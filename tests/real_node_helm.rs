//! The Helm chart on the real node (tests/node/): installed with helm in place of deploy/ (only
//! a post-renderer for the API address, tests/node/helm-post-render.sh), its agent publishes a
//! disk and a workload mounts it. Runs after tests/real_node.rs (tests/run.sh): it removes the
//! deploy/ installation first, since two agents must not share a node's discovery directories.

mod support;

use std::path::PathBuf;
use std::process::Command;

use local_static_provisioner::core::volumes::naming::pv_name;
use support::real_node::{RealNode, WAIT};
use support::{mount_tmpfs, repo_root, run, wait_until};

fn helm() -> PathBuf {
    let out = run(Command::new("bash").arg(repo_root().join("tests/tools/build-helm.sh")));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

#[test]
fn real_node_helm_chart_installs_and_serves_a_workload() {
    let Some(node) = RealNode::get("real_node_helm_chart_installs_and_serves_a_workload") else { return };
    // deploy/'s installation goes first (its namespace, cluster objects and StorageClasses).
    let overlay = node.dir.join("overlay");
    if overlay.join("kustomization.yaml").exists() {
        node.cp.kubectl_ok(&["delete", "-k", overlay.to_str().unwrap(), "--ignore-not-found", "--wait=true"]);
    }
    let (ns, release) = ("lsp-helm-e2e", "lsp-e2e");
    let api = node.cp.api_url.trim_start_matches("https://").to_string();
    let (api_host, api_port) = api.rsplit_once(':').unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let chart = repo_root().join("deploy/helm/local-static-provisioner");
    let install = run(Command::new(helm())
        .env("KUBECTL", node.cp.bin.join("kubectl"))
        .arg("--kubeconfig")
        .arg(&node.cp.kubeconfig)
        .args(["install", release, "--namespace", ns, "--create-namespace", "--wait", "--timeout", "2m"])
        .arg(&chart)
        .args(["--set", "image.tag=e2e", "--set", "image.pullPolicy=Never"])
        .args(["--set", &format!("listenAddress=127.0.0.1:{port}")])
        .arg("--post-renderer")
        .arg(repo_root().join("tests/node/helm-post-render.sh"))
        .args(["--post-renderer-args", api_host, "--post-renderer-args", api_port]));
    let notes = String::from_utf8_lossy(&install.stdout);
    assert!(notes.contains("STATUS: deployed"), "{notes}");
    let agent = node.ready_pod(ns, &format!("app.kubernetes.io/instance={release}"));
    // Named as upstream's chart names them: <release>-<chart name>.
    assert_eq!(agent["spec"]["serviceAccountName"], format!("{release}-local-static-provisioner"));
    // The LocalStorageNode CRD from the chart's crds/ (deploy/'s went with its installation
    // above) and the inventory policy rendered for the release.
    let crd = "localstoragenodes.local-static-provisioner.io";
    assert!(node.cp.get_json(&["crd", crd]).is_some(), "helm install did not install the CRD {crd}");
    let policy = format!("{release}-local-static-provisioner-inventory");
    assert!(node.cp.get_json(&["validatingadmissionpolicy", &policy]).is_some(), "no {policy}");

    // Its agent publishes a disk (the chart's class and admission policy), a workload uses it.
    let entry = format!("e2e-helm-{}", std::process::id());
    let vol = std::path::Path::new("/mnt/fast-disks").join(&entry);
    let mount = mount_tmpfs(&vol, 20);
    let pv = pv_name(&entry, &node.name, "fast-disks");
    wait_until("PV published by the chart's agent", WAIT, || node.cp.pv_state(&pv));
    node.claim("e2e-helm", "fast-disks", false, "20Mi");
    node.workload("e2e-helm-app", "e2e-helm", false, "echo from-helm > /data/f && cat /data/f", 5);
    node.expect_success("e2e-helm-app");
    assert!(node.pod_log("e2e-helm-app").contains("from-helm"));
    assert_eq!(std::fs::read_to_string(vol.join("f")).unwrap(), "from-helm\n");
    let uid = node.cp.pv_state(&pv).unwrap().0;
    node.delete_pod("e2e-helm-app", false);
    node.delete_claim("e2e-helm");
    wait_until("recycled by the chart's agent", WAIT, || {
        let (now, phase) = node.cp.pv_state(&pv)?;
        (now != uid && phase == "Available").then_some(())
    });
    assert_eq!(std::fs::read_dir(&vol).unwrap().count(), 0);
    drop(mount);
    wait_until("PV withdrawn", WAIT, || node.cp.pv_state(&pv).is_none().then_some(()));
    run(Command::new(helm()).arg("--kubeconfig").arg(&node.cp.kubeconfig).args([
        "uninstall",
        release,
        "--namespace",
        ns,
        "--wait",
    ]));
    // Helm leaves what it installed from crds/ (docs/uninstall.md says to delete it by hand).
    assert!(node.cp.get_json(&["crd", crd]).is_some(), "helm uninstall deleted the CRD {crd}");
}

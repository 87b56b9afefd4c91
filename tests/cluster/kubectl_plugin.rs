//! The kubectl plugin on the real control plane: the inventory CRD from deploy/base, the
//! fixture LocalStorageNode objects of the golden tests (tests/fixtures/kubectl-plugin/, written
//! as an agent would: the object, then its status subresource), and the binary under test
//! symlinked as `kubectl-local_storage`, run directly and as `kubectl local-storage`. Its tables
//! must be the golden files (src/cli/kubectl/render.rs): what the unit tests render from the
//! fixture is what the plugin prints from the API. Needs no root.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};
use support::{ControlPlane, binary, repo_root, run};

const CRD: &str = "localstoragenodes.local-static-provisioner.io";
/// Every node of the fixture: filtering on them gives the golden files' unfiltered output
/// whatever other inventories the shared control plane holds.
const FIXTURE_NODES: &str = "worker-1,worker-2,worker-3";

/// The tests of this file write and delete the same fixture objects: one at a time.
static FIXTURE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn golden(name: &str) -> String {
    std::fs::read_to_string(repo_root().join("tests/golden/kubectl-plugin").join(name)).unwrap()
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Installs the CRD and writes the fixture's objects and statuses as the admin.
fn install_fixture(cp: &ControlPlane) -> Vec<Value> {
    let crd = repo_root().join("deploy/base/crd.yaml");
    cp.kubectl_ok(&["apply", "-f", crd.to_str().unwrap()]);
    cp.wait_crd_established(CRD);
    let text = std::fs::read_to_string(repo_root().join("tests/fixtures/kubectl-plugin/inventories.json")).unwrap();
    let list: Value = serde_json::from_str(&text).unwrap();
    let items = list["items"].as_array().unwrap().clone();
    for item in &items {
        let name = item["metadata"]["name"].as_str().unwrap();
        let object = json!({
            "apiVersion": item["apiVersion"],
            "kind": item["kind"],
            "metadata": { "name": name },
            "spec": item["spec"],
        });
        cp.apply(&object.to_string());
        if !item["status"].is_null() {
            let patch = json!({ "status": item["status"] }).to_string();
            cp.kubectl_ok(&["patch", "localstoragenode", name, "--subresource=status", "--type=merge", "-p", &patch]);
        }
    }
    items
}

/// Deletes the fixture's objects when the test ends, passed or not: agents of other tests on
/// the shared control plane read every inventory (other nodes' used-disk records).
struct RemoveFixture(PathBuf);

impl Drop for RemoveFixture {
    fn drop(&mut self) {
        let cp = ControlPlane::at(&self.0);
        let mut args = vec!["delete", "localstoragenode", "--ignore-not-found", "--wait=false"];
        args.extend(FIXTURE_NODES.split(','));
        let _ = cp.kubectl(&args);
    }
}

/// A directory holding `kubectl-local_storage`, a symlink to the binary under test.
fn plugin_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("kubectl-local_storage");
    std::os::unix::fs::symlink(binary(), &link).unwrap();
    (dir, link)
}

/// PATH with `dir` first.
fn path_with(dir: &Path) -> std::ffi::OsString {
    let mut paths = vec![dir.to_path_buf()];
    paths.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
    std::env::join_paths(paths).unwrap()
}

#[test]
fn the_plugin_lists_the_inventories_as_the_golden_files_show() {
    let _area = support::area(module_path!());
    let _one = FIXTURE.lock().unwrap_or_else(|e| e.into_inner());
    let cp = ControlPlane::get();
    let _remove = RemoveFixture(cp.dir.clone());
    let items = install_fixture(&cp);
    let (dir, link) = plugin_dir();
    let direct = |args: &[&str]| {
        Command::new(&link).args(args).env("KUBECONFIG", &cp.kubeconfig).output().expect("running the plugin")
    };
    let via_kubectl = |args: &[&str]| {
        Command::new(cp.bin.join("kubectl"))
            .arg("local-storage")
            .args(args)
            .env("KUBECONFIG", &cp.kubeconfig)
            .env("PATH", path_with(dir.path()))
            .output()
            .expect("running kubectl")
    };

    // kubectl finds it.
    let (listed, _) =
        text(&run(Command::new(cp.bin.join("kubectl")).args(["plugin", "list"]).env("PATH", path_with(dir.path()))));
    assert!(listed.contains("kubectl-local_storage"), "{listed}");

    // The tables, both ways, are the golden files.
    for (args, file) in [
        (vec!["disks", "--node", FIXTURE_NODES], "disks.txt"),
        (vec!["disks", "--node", FIXTURE_NODES, "-o", "wide"], "disks-wide.txt"),
        (vec!["disks", "--node", FIXTURE_NODES, "--class", "raw"], "disks-class-raw.txt"),
        (vec!["disks", "--node", "worker-1"], "disks-node-worker-1.txt"),
        (vec!["volumes", "--node", FIXTURE_NODES], "volumes.txt"),
        (vec!["volumes", "--node", FIXTURE_NODES, "-o", "wide"], "volumes-wide.txt"),
        (vec!["volumes", "--node", FIXTURE_NODES, "--class", "raw"], "volumes-class-raw.txt"),
        (vec!["volumes", "--node=worker-2", "--node=worker-9"], "volumes-missing-node.txt"),
    ] {
        for (how, out) in [("directly", direct(&args)), ("as kubectl local-storage", via_kubectl(&args))] {
            let (stdout, stderr) = text(&out);
            assert!(out.status.success(), "{args:?} {how}: {stderr}");
            assert_eq!(stdout, golden(file), "{args:?} {how} differs from {file}; stderr: {stderr}");
        }
    }

    // Without a node filter every fixture node is there (among whatever else the cluster has;
    // other nodes' names widen the NODE column, so rows are compared by their words).
    let (all, notes) = text(&via_kubectl(&["disks"]));
    for (node, disk) in [("worker-1", "sdc"), ("worker-2", "nvme0n1")] {
        let found = all.lines().any(|l| l.split_whitespace().take(2).eq([node, disk]));
        assert!(found, "{node} {disk}: {all}");
    }
    let notes = format!("{all}{notes}");
    assert!(notes.contains("node worker-3: no inventory yet"), "{notes}");

    // -o json: the objects as the API holds them, for scripts; the notes on stderr.
    let out = via_kubectl(&["volumes", "--node", "worker-1,worker-2,worker-8", "-o", "json"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let list: Value = serde_json::from_str(&stdout).expect("-o json parses");
    let got = list["items"].as_array().unwrap();
    let names: Vec<&str> = got.iter().map(|i| i["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["worker-1", "worker-2"]);
    for item in got {
        let name = item["metadata"]["name"].as_str().unwrap();
        let fixture = items.iter().find(|i| i["metadata"]["name"] == name).unwrap();
        assert_eq!(item["status"], fixture["status"], "{name}: the status as written");
        assert!(item["metadata"]["managedFields"].is_null(), "{name}: managed fields left out");
    }
    assert!(stderr.contains("node worker-8: no inventory yet"), "{stderr}");
    let out = direct(&["disks", "--node", "worker-2", "-o", "yaml"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("kind: LocalStorageNode") && stdout.contains("name: nvme0n1"), "{stdout}");

    // prepare: the node-side steps with the disk's stable ID filled in from the inventory.
    let (stdout, stderr) = text(&via_kubectl(&["prepare", "--node", "worker-1", "sdc"]));
    assert_eq!(stdout, golden("prepare-not-blank.txt"), "stderr: {stderr}");

    // cleanup is the wipe request: a PV that does not exist is said so.
    let out = via_kubectl(&["cleanup", "kubectl-plugin-no-such-pv"]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success() && stderr.contains("kubectl-plugin-no-such-pv: no such PV"), "{stderr}");

    // Help names the plugin as kubectl users call it.
    let (help, _) = text(&via_kubectl(&["--help"]));
    assert!(help.contains("kubectl local-storage") && help.contains("prepare"), "{help}");

    // kubectl get shows the printer columns of the CRD.
    let table = cp.kubectl_ok(&["get", "localstoragenodes", "worker-1", "worker-2", "worker-3"]);
    let header = table.lines().next().unwrap();
    for column in ["DISKS", "CLAIMED", "VOLUMES", "AVAILABLE", "CAPACITY", "PROBLEMS", "AGE"] {
        assert!(header.contains(column), "{column}: {table}");
    }
    let row = |node: &str| table.lines().find(|l| l.starts_with(node)).unwrap().split_whitespace().collect::<Vec<_>>();
    assert_eq!(row("worker-1")[1..8], ["4", "1", "4", "1", "931.5", "GiB", "4"], "{table}");
    assert_eq!(row("worker-2")[1..8], ["2", "1", "1", "1", "3.5", "TiB", "0"], "{table}");
    let wide = cp.kubectl_ok(&["get", "lsn", "worker-1", "-o", "wide"]);
    assert!(wide.contains("VERSION") && wide.contains("0.1.0 (bc283b1)"), "{wide}");
}

/// Deletes the test's RBAC objects when it ends.
struct RemoveRbac(PathBuf);

impl Drop for RemoveRbac {
    fn drop(&mut self) {
        let cp = ControlPlane::at(&self.0);
        let _ = cp.kubectl(&[
            "delete",
            "clusterrole,clusterrolebinding",
            "kubectl-plugin-test-worker-1",
            "--ignore-not-found",
        ]);
    }
}

/// kubectl's connection flags, given after the command as kubectl leaves them to plugins:
/// `--context` picks a context of the kubeconfig (its current one points nowhere here), `--as` and
/// `--as-group` impersonate; and `--node` is filtered by the API server. The user `jane` may list
/// worker-1's LocalStorageNode only (RBAC resourceNames, which authorizes a list only with the
/// field selector `metadata.name=worker-1`): as her, `--node worker-1` answers and a list of every
/// node is forbidden.
#[test]
fn kubectl_flags_and_the_node_filter_reach_the_api_server() {
    let _area = support::area(module_path!());
    let _one = FIXTURE.lock().unwrap_or_else(|e| e.into_inner());
    let cp = ControlPlane::get();
    let _remove = RemoveFixture(cp.dir.clone());
    let _rbac = RemoveRbac(cp.dir.clone());
    install_fixture(&cp);
    let (dir, link) = plugin_dir();

    // A kubeconfig whose current context reaches no API server; "good" is the admin's.
    let kubeconfig = dir.path().join("contexts.kubeconfig");
    std::fs::copy(&cp.kubeconfig, &kubeconfig).unwrap();
    let config = |args: &[&str]| {
        let mut all = vec!["config"];
        all.extend_from_slice(args);
        let out = cp.kubectl_as(&kubeconfig, &all);
        assert!(out.status.success(), "kubectl config {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let user = String::from_utf8(
        cp.kubectl_as(&kubeconfig, &["config", "view", "-o", "jsonpath={.contexts[0].context.user}"]).stdout,
    )
    .unwrap();
    config(&["set-cluster", "nowhere", "--server=https://127.0.0.1:1", "--insecure-skip-tls-verify=true"]);
    config(&["set-context", "broken", "--cluster=nowhere", &format!("--user={user}")]);
    config(&["set-context", "good", "--cluster=local", &format!("--user={user}")]);
    config(&["use-context", "broken"]);
    let plugin = |args: &[&str], kubeconfig_env: &Path| {
        Command::new(&link).args(args).env("KUBECONFIG", kubeconfig_env).output().expect("running the plugin")
    };
    let worker_1 = golden("disks-node-worker-1.txt");

    // --context, with the kubeconfig from KUBECONFIG and from --kubeconfig.
    let out = plugin(&["disks", "--node", "worker-1"], &kubeconfig);
    assert!(!out.status.success(), "the current context reaches no API server: {:?}", text(&out));
    let out = plugin(&["disks", "--node", "worker-1", "--context", "good"], &kubeconfig);
    assert_eq!(text(&out).0, worker_1, "--context good: {}", text(&out).1);
    let flag = format!("--kubeconfig={}", kubeconfig.display());
    let out = plugin(&["disks", "--node", "worker-1", &flag, "--context=good"], Path::new("/nonexistent"));
    assert_eq!(text(&out).0, worker_1, "--kubeconfig and --context: {}", text(&out).1);
    let out = plugin(&["disks", "--context", "no-such-context"], &kubeconfig);
    let (_, stderr) = text(&out);
    assert!(!out.status.success() && stderr.contains("no-such-context"), "{stderr}");

    // jane may list worker-1's inventory, by name only.
    cp.apply(
        &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "kubectl-plugin-test-worker-1"},
            "rules": [{"apiGroups": ["local-static-provisioner.io"], "resources": ["localstoragenodes"],
                       "verbs": ["list"], "resourceNames": ["worker-1"]}],
        })
        .to_string(),
    );
    cp.apply(
        &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "kubectl-plugin-test-worker-1"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kubectl-plugin-test-worker-1"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "jane"}],
        })
        .to_string(),
    );
    let admin = cp.kubeconfig.clone();
    support::wait_until("jane's role in effect", std::time::Duration::from_secs(10), || {
        plugin(&["disks", "--node", "worker-1", "--as", "jane"], &admin).status.success().then_some(())
    });
    let out = plugin(&["disks", "--node", "worker-1", "--as", "jane"], &admin);
    assert_eq!(text(&out).0, worker_1, "--as jane --node worker-1: {}", text(&out).1);
    for args in [&["disks", "--as", "jane"][..], &["volumes", "--as=jane", "--node", "worker-1,worker-2"]] {
        let out = plugin(args, &admin);
        let (_, stderr) = text(&out);
        assert!(!out.status.success() && stderr.contains("jane") && stderr.contains("forbidden"), "{args:?}: {stderr}");
    }
    // --as-group: jane in system:masters may list everything.
    let out = plugin(&["disks", "--node", FIXTURE_NODES, "--as", "jane", "--as-group", "system:masters"], &admin);
    assert_eq!(text(&out).0, golden("disks.txt"), "--as-group: {}", text(&out).1);

    // -n: accepted by every command (cluster-scoped objects), the agent's namespace for prepare.
    let out = plugin(&["disks", "--node", "worker-1", "-n", "storage"], &admin);
    assert_eq!(text(&out).0, worker_1, "-n: {}", text(&out).1);
    let (stdout, stderr) = text(&plugin(&["prepare", "--node", "worker-1", "sdc", "-n", "storage"], &admin));
    assert!(
        stdout.contains("kubectl -n storage exec") && !stdout.contains("-n local-static-provisioner"),
        "{stdout}{stderr}"
    );
}

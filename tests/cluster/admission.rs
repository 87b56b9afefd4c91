//! The ValidatingAdmissionPolicies of deploy/base/admission-policy.yaml (and the Helm chart's
//! rendering of them) on the real control plane. The agent of node A, with a pod-bound token
//! carrying A's node name, may create only local PVs at <root>/<entry> whose node affinity pins
//! A, change only the metadata of A's PVs (adopting upstream's), and delete only A's PVs;
//! node-cleanup may only delete local PVs and drop the wipe finalizer of those being deleted.
//! On Nodes, the same agent may only add, change or remove the fence labels of its own Node
//! (with the values the agent writes), and nothing else of it. On LocalStorageNodes (the node
//! inventory) it may only create its own node's, owned by its Node alone, and write only its
//! status: another node's, used-disk records included, is out of its reach in every form; the
//! garbage collector deletes a LocalStorageNode with its Node.
//! Every refusal is tried in more than one form; the real agent and node-cleanup run under the
//! policies; a kustomize overlay with `namespace:` keeps the agent bound.
//!
//! Each test binds the policies to ServiceAccounts of its own (the shipped names are replaced
//! in the policy text), so tests never see each other's policies. The overlay test keeps the
//! shipped names, as that is what it checks: while it runs, the shipped ServiceAccounts in any
//! namespace are under the policies (test binaries run one after another, so no other binary
//! sharing the control plane is affected). Every test removes its policies and PVs when it
//! ends, even on failure.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use local_static_provisioner::core::volumes::naming::pv_name;
use local_static_provisioner::core::volumes::pv::clean_path;
use serde_json::{Value, json};
use support::{
    AgentProcess, ControlPlane, cannot_run, mount_tmpfs, relative, repo_root, require_root, run, wait_until,
    write_config,
};

const WAIT: Duration = Duration::from_secs(90);
const LABEL: &str = "local-static-provisioner.io/node";
const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
const WIPE: &str = "local-static-provisioner.io/wipe";
/// The discovery root of deploy/base/configmap.yaml, i.e. of the shipped policy.
const ROOT: &str = "/mnt/fast-disks";
/// The matchCondition patterns of the shipped policies, and their names.
const AGENT_MATCH: &str = ":local-static-provisioner$'";
const CLEANUP_MATCH: &str = ":local-static-provisioner-node-cleanup$'";
const AGENT_POLICY: &str = "local-static-provisioner-node-scope";
const CLEANUP_POLICY: &str = "local-static-provisioner-node-cleanup-scope";
const FENCE_POLICY: &str = "local-static-provisioner-node-fence";
const INVENTORY_POLICY: &str = "local-static-provisioner-inventory";
const HEARTBEAT_POLICY: &str = "local-static-provisioner-heartbeat";
const CLEANUP_FENCE_POLICY: &str = "local-static-provisioner-node-cleanup-fence";
/// The fence labels of a Node (issue 28): one per PV, and the node-wide one.
const FENCE_PREFIX: &str = "fence.local-static-provisioner.io/";
const UNVERIFIED: &str = "local-static-provisioner.io/volumes-unverified";

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The objects of a multi-document YAML stream.
fn documents(yaml: &str) -> Vec<Value> {
    yaml.split("\n---").filter_map(|d| serde_saphyr::from_str::<Value>(d).ok()).filter(|d| d.is_object()).collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {docs:#?}"))
}

/// The expression of a policy's variable.
fn variable<'a>(policy: &'a Value, name: &str) -> &'a str {
    policy["spec"]["variables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .and_then(|v| v["expression"].as_str())
        .unwrap_or_else(|| panic!("no variable {name}"))
}

/// The discovery roots of a policy: its `roots` variable, a CEL list of single-quoted strings
/// (also a YAML flow sequence).
fn roots(policy: &Value) -> Vec<String> {
    let expression = variable(policy, "roots");
    assert_eq!(policy["spec"]["variables"][0]["name"], "roots", "overlays patch variable 0");
    serde_saphyr::from_str::<Vec<String>>(expression).unwrap_or_else(|e| panic!("roots {expression}: {e}"))
}

/// A node selector term: `key operator values` as a matchExpression (or a matchField when the
/// key is metadata.name).
fn term(key: &str, operator: &str, values: &[&str]) -> Value {
    let field = if key == "metadata.name" { "matchFields" } else { "matchExpressions" };
    let mut requirement = json!({"key": key, "operator": operator});
    if !values.is_empty() {
        requirement["values"] = json!(values);
    }
    json!({ field: [requirement] })
}

fn hostname(node: &str) -> Value {
    term("kubernetes.io/hostname", "In", &[node])
}

/// A PV shaped exactly as the agent builds it (src/core/volumes/pv.rs; the golden JSON of
/// src/core/volumes/pv_tests.rs with every optional field but the class selector), for `node`, whose
/// Node has UID `uid`, at `path`. `test` labels it for clean-up.
fn agent_pv(test: &str, name: &str, node: &str, uid: &str, path: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "labels": {"topology.kubernetes.io/zone": "zone-a", "pv-labels": "can-be-selected", LABEL: node, "vap-test": test},
            "annotations": {
                PROVISIONED_BY: format!("local-volume-provisioner-{node}-{uid}"),
                "local-static-provisioner.io/volume-identity": "fs:fsid=1,2;ino=6"
            },
            "finalizers": [WIPE],
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]
        },
        "spec": {
            "capacity": {"storage": "1536Mi"},
            "local": {"path": path, "fsType": "ext4"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "vap-sc",
            "mountOptions": ["noatime"],
            "volumeMode": "Filesystem",
            "nodeAffinity": {"required": {"nodeSelectorTerms": [hostname(node)]}}
        }
    })
}

/// The same PV with `edit` applied.
fn with(mut pv: Value, edit: impl FnOnce(&mut Value)) -> Value {
    edit(&mut pv);
    pv
}

fn set_terms(pv: &mut Value, terms: Vec<Value>) {
    pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"] = Value::Array(terms);
}

fn set_source(pv: &mut Value, key: &str, source: Value) {
    let spec = pv["spec"].as_object_mut().unwrap();
    spec.remove("local");
    spec.insert(key.to_string(), source);
}

/// The policies of `yaml` with their names made unique to `test`, bound to this test's own
/// ServiceAccounts instead of the shipped ones (`None` keeps the shipped name).
fn policies_for(yaml: &str, test: &str, agent_sa: Option<&str>, cleanup_sa: Option<&str>) -> String {
    let mut yaml = yaml
        .replace(CLEANUP_POLICY, &format!("{test}-node-cleanup-scope"))
        .replace(AGENT_POLICY, &format!("{test}-node-scope"))
        .replace(FENCE_POLICY, &format!("{test}-node-fence"))
        .replace(INVENTORY_POLICY, &format!("{test}-inventory"))
        .replace(HEARTBEAT_POLICY, &format!("{test}-heartbeat"))
        .replace(CLEANUP_FENCE_POLICY, &format!("{test}-node-cleanup-fence"));
    if let Some(sa) = cleanup_sa {
        assert!(yaml.contains(CLEANUP_MATCH));
        yaml = yaml.replace(CLEANUP_MATCH, &format!(":{sa}$'"));
    }
    if let Some(sa) = agent_sa {
        assert!(yaml.contains(AGENT_MATCH));
        yaml = yaml.replace(AGENT_MATCH, &format!(":{sa}$'"));
    }
    yaml
}

/// What a test installed: its policies and the PVs labelled `vap-test=<test>`, removed when
/// dropped (finalizers first, as no agent runs to remove them).
struct Scratch<'a> {
    cp: &'a ControlPlane,
    test: String,
    policies: Vec<String>,
    /// LocalStorageNodes the test may have made (by name: they carry no label of the test).
    inventories: Vec<String>,
}

impl<'a> Scratch<'a> {
    fn new(cp: &'a ControlPlane, test: &str) -> Self {
        Scratch { cp, test: test.to_string(), policies: Vec::new(), inventories: Vec::new() }
    }

    /// Applies policies and their bindings (YAML documents or a JSON List), remembering them
    /// for removal.
    fn apply_policies(&mut self, yaml: &str) {
        let docs = documents(yaml);
        let docs = match docs.as_slice() {
            [list] if list["kind"] == "List" => list["items"].as_array().unwrap().clone(),
            _ => docs,
        };
        for doc in docs {
            let kind = doc["kind"].as_str().unwrap().to_lowercase();
            assert!(kind.starts_with("validatingadmissionpolicy"), "not a policy: {doc}");
            self.policies.push(format!("{kind}/{}", doc["metadata"]["name"].as_str().unwrap()));
        }
        self.cp.apply(yaml);
    }

    fn label(&self) -> String {
        format!("vap-test={}", self.test)
    }

    fn remove_pv(&self, name: &str) {
        let _ = self.cp.kubectl(&["patch", "pv", name, "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
        let _ = self.cp.kubectl(&["delete", "pv", name, "--wait=false", "--ignore-not-found"]);
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        if let Some(list) = self.cp.get_json(&["pv", "-l", &self.label()]) {
            for pv in list["items"].as_array().into_iter().flatten() {
                self.remove_pv(pv["metadata"]["name"].as_str().unwrap_or_default());
            }
        }
        // LocalStorageNodes it made, finalizers first (not get_json: the CRD may be absent,
        // and a panic here while unwinding would abort).
        let out = self.cp.kubectl(&["get", "localstoragenodes", "-l", &self.label(), "-o", "json"]);
        let mut names: Vec<String> = serde_json::from_slice::<Value>(&out.stdout)
            .ok()
            .and_then(|list| list["items"].as_array().cloned())
            .into_iter()
            .flatten()
            .filter_map(|obj| obj["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        names.extend(self.inventories.iter().cloned());
        {
            for name in &names {
                let name = name.as_str();
                let _ = self.cp.kubectl(&[
                    "patch",
                    "localstoragenode",
                    name,
                    "--type=merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ]);
                let _ = self.cp.kubectl(&["delete", "localstoragenode", name, "--wait=false", "--ignore-not-found"]);
            }
        }
        for policy in self.policies.iter().rev() {
            let _ = self.cp.kubectl(&["delete", policy, "--ignore-not-found"]);
        }
    }
}

/// A ServiceAccount `sa` in `ns` bound to `cluster_role`.
fn service_account(cp: &ControlPlane, ns: &str, sa: &str, cluster_role: &str) {
    cp.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {sa}, namespace: {ns}}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: {ns}-{sa}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {cluster_role}}}\nsubjects: [{{kind: ServiceAccount, name: {sa}, namespace: {ns}}}]\n"
    ));
}

/// A kubeconfig with a token of `sa` bound to a pod on `node`, as the agent's DaemonSet pod
/// gets: the token carries the node-name claim the agent's policy reads.
fn pod_bound_kubeconfig(cp: &ControlPlane, dir: &Path, ns: &str, sa: &str, node: &str) -> PathBuf {
    let pod = format!("agent-{node}");
    cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: {ns}}}\nspec:\n  nodeName: {node}\n  serviceAccountName: {sa}\n  containers: [{{name: agent, image: local-static-provisioner:test}}]\n"
    ));
    let token = cp.kubectl_ok(&[
        "create",
        "token",
        sa,
        "-n",
        ns,
        "--duration",
        "1h",
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        &pod,
    ]);
    cp.token_kubeconfig(dir, &format!("{ns}-{sa}-{node}"), token.trim())
}

/// A kubeconfig with a plain (not pod-bound) token of `sa`.
fn plain_kubeconfig(cp: &ControlPlane, dir: &Path, ns: &str, sa: &str) -> PathBuf {
    let token = cp.kubectl_ok(&["create", "token", sa, "-n", ns, "--duration", "1h"]);
    cp.token_kubeconfig(dir, &format!("{ns}-{sa}-plain"), token.trim())
}

fn as_user(cp: &ControlPlane, kubeconfig: &Path, args: &[&str], stdin: Option<&Value>) -> Output {
    cp.kubectl_stdin(kubeconfig, args, stdin.map(Value::to_string).as_deref())
}

fn create(cp: &ControlPlane, kubeconfig: &Path, pv: &Value) -> Output {
    as_user(cp, kubeconfig, &["create", "-f", "-"], Some(pv))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn assert_allowed(out: &Output, what: &str) {
    assert!(out.status.success(), "{what} must be allowed: {}", stderr(out));
}

fn assert_denied(out: &Output, what: &str, why: &str) {
    let err = stderr(out);
    assert!(!out.status.success() && err.contains(why), "{what} must be denied ({why}), got: {err}");
}

/// Creating `pv` as `kubeconfig` is refused with `why`, and nothing is created.
fn assert_create_denied(cp: &ControlPlane, kubeconfig: &Path, pv: &Value, what: &str, why: &str) {
    assert_denied(&create(cp, kubeconfig, pv), what, why);
    let name = pv["metadata"]["name"].as_str().unwrap();
    assert!(cp.get_json(&["pv", name]).is_none(), "{what}: {name} exists after a refusal");
}

/// Policies take a moment to be enforced after creation: waits until creating `probe` (a PV
/// the policy refuses) is denied with `why`. A probe created before that is removed again.
fn wait_enforced(scratch: &Scratch, kubeconfig: &Path, probe: &Value, why: &str) {
    let name = probe["metadata"]["name"].as_str().unwrap();
    wait_until("the policy to be enforced", WAIT, || {
        let out = create(scratch.cp, kubeconfig, probe);
        if out.status.success() {
            scratch.remove_pv(name);
            wait_until("the probe PV to go", WAIT, || scratch.cp.get_json(&["pv", name]).is_none().then_some(()));
            return None;
        }
        stderr(&out).contains(why).then_some(())
    });
}

/// An admin-side object, e.g. a PV of another node, that the test then tries to change.
fn admin_create(cp: &ControlPlane, pv: &Value) {
    cp.apply(&pv.to_string());
}

fn merge_patch(cp: &ControlPlane, kubeconfig: &Path, name: &str, patch: &Value) -> Output {
    as_user(cp, kubeconfig, &["patch", "pv", name, "--type=merge", "-p", &patch.to_string()], None)
}

fn json_patch(cp: &ControlPlane, kubeconfig: &Path, name: &str, patch: &Value) -> Output {
    as_user(cp, kubeconfig, &["patch", "pv", name, "--type=json", "-p", &patch.to_string()], None)
}

fn delete(cp: &ControlPlane, kubeconfig: &Path, name: &str) -> Output {
    as_user(cp, kubeconfig, &["delete", "pv", name, "--wait=false"], None)
}

#[test]
fn chart_policy_file_is_the_base_policy() {
    let _area = support::area(module_path!());
    // The chart cannot reach outside itself (a symlink out of it breaks packaging), so it
    // carries a copy; this keeps the one source of truth.
    let chart = Path::new("deploy/helm/local-static-provisioner/files/admission-policy.yaml");
    let meta = std::fs::symlink_metadata(repo_root().join(chart)).unwrap();
    assert!(meta.file_type().is_file(), "{} must be a regular file, not a symlink", chart.display());
    assert!(
        read("deploy/base/admission-policy.yaml") == read(chart.to_str().unwrap()),
        "{} differs from deploy/base/admission-policy.yaml: cp deploy/base/admission-policy.yaml {}",
        chart.display(),
        chart.display()
    );
}

#[test]
fn base_policy_roots_are_the_configmap_host_dirs() {
    let _area = support::area(module_path!());
    let docs = documents(&read("deploy/base/admission-policy.yaml"));
    let policy = find(&docs, "ValidatingAdmissionPolicy", AGENT_POLICY);
    let configmap: Value = serde_saphyr::from_str(&read("deploy/base/configmap.yaml")).unwrap();
    let classes: Value = serde_saphyr::from_str(configmap["data"]["storageClassMap"].as_str().unwrap()).unwrap();
    let mut host_dirs: Vec<String> =
        classes.as_object().unwrap().values().map(|c| clean_path(c["hostDir"].as_str().unwrap())).collect();
    host_dirs.sort();
    host_dirs.dedup();
    let mut policy_roots = roots(policy);
    policy_roots.sort();
    assert_eq!(
        policy_roots, host_dirs,
        "the roots variable of {AGENT_POLICY} must list the hostDirs of deploy/base/configmap.yaml"
    );
    assert_eq!(policy_roots, [ROOT], "the tests below assume the shipped root");
}

#[test]
fn base_fence_policy_matches_the_agent_as_the_pv_policy_does() {
    let _area = support::area(module_path!());
    let docs = documents(&read("deploy/base/admission-policy.yaml"));
    let pv_policy = find(&docs, "ValidatingAdmissionPolicy", AGENT_POLICY);
    let fence_policy = find(&docs, "ValidatingAdmissionPolicy", FENCE_POLICY);
    assert_eq!(fence_policy["spec"]["matchConditions"], pv_policy["spec"]["matchConditions"]);
    assert_eq!(variable(fence_policy, "node"), variable(pv_policy, "node"), "the node-name claim");
    assert_eq!(find(&docs, "ValidatingAdmissionPolicyBinding", FENCE_POLICY)["spec"]["policyName"], FENCE_POLICY);
    // The agent's writes to Nodes are patches (UPDATE); it may not create or delete Nodes (RBAC).
    let rules = &fence_policy["spec"]["matchConstraints"]["resourceRules"];
    assert_eq!(
        rules,
        &json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}])
    );
}

const ANN_ENCRYPTION: &str = "local-static-provisioner.io/encryption";
const ENCRYPTED: &str = "fscrypt-v2 key=0123456789abcdef0123456789abcdef";

/// With an encrypting root (variable 1, as the chart renders it for a class with `encryption`),
/// an encrypted volume's PV may name <root>/<entry>/lsp-encrypted; the entry is checked as for
/// any PV, the suffix means nothing without the annotation, and nothing under another root.
#[test]
fn an_encrypted_pv_names_its_data_directory_only_under_an_encrypting_root() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let test = "vap-enc";
    let (ns, sa) = ("vap-enc", "vap-enc-agent");
    let a = "vap-enc-a";
    let uid_a = cp.create_node(a);
    apply_agent_rbac(&cp);
    service_account(&cp, ns, sa, "local-static-provisioner");
    let mut scratch = Scratch::new(&cp, test);
    let enc = "/mnt/enc-disks";
    let yaml = read("deploy/base/admission-policy.yaml")
        .replace("\n        ['/mnt/fast-disks']\n", &format!("\n        ['{ROOT}', '{enc}']\n"))
        .replace(
            "- name: encryptedRoots\n      expression: >-\n        []\n",
            &format!("- name: encryptedRoots\n      expression: >-\n        ['{enc}']\n"),
        );
    assert!(yaml.contains(&format!("['{enc}']")), "variable 1 not found");
    scratch.apply_policies(&policies_for(&yaml, test, Some(sa), Some("none")));
    let tmp = tempfile::tempdir().unwrap();
    let agent = pod_bound_kubeconfig(&cp, tmp.path(), ns, sa, a);
    let pv = |name: &str, path: &str| agent_pv(test, name, a, &uid_a, path);
    let encrypted = |name: &str, path: &str| {
        with(pv(name, path), |p| {
            p["metadata"]["annotations"][ANN_ENCRYPTION] = json!(ENCRYPTED);
        })
    };
    wait_enforced(&scratch, &agent, &pv("vap-enc-probe", "/etc"), "is not directly under one of");
    assert_allowed(
        &create(&cp, &agent, &encrypted("vap-enc-ok", &format!("{enc}/vol1/lsp-encrypted"))),
        "an encrypted volume's PV",
    );
    let refused = [
        (format!("{enc}/lsp-encrypted"), ENCRYPTED),
        (format!("{enc}/a/b/lsp-encrypted"), ENCRYPTED),
        (format!("{enc}//lsp-encrypted"), ENCRYPTED),
        (format!("{enc}/vol1/lsp-encrypted/x"), ENCRYPTED),
        (format!("{enc}/vol1/other"), ENCRYPTED),
        // Under a root whose class does not encrypt.
        (format!("{ROOT}/vol1/lsp-encrypted"), ENCRYPTED),
        // The annotation must name a key.
        (format!("{enc}/vol1/lsp-encrypted"), "yes"),
    ];
    for (path, value) in refused {
        let p = with(pv("vap-enc-bad", &path), |p| {
            p["metadata"]["annotations"][ANN_ENCRYPTION] = json!(value);
        });
        let out = create(&cp, &agent, &p);
        assert!(!out.status.success(), "an encrypted PV at {path} ({value}) must be denied");
        assert!(cp.get_json(&["pv", "vap-enc-bad"]).is_none(), "{path}: created after a refusal");
    }
    let plain = format!("{enc}/vol1/lsp-encrypted");
    assert_create_denied(
        &cp,
        &agent,
        &pv("vap-enc-plain", &plain),
        "the data directory without the annotation",
        "is not directly under one of",
    );
}

#[test]
fn agent_creates_only_local_pvs_pinned_to_its_node_under_a_root() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let test = "vap-create";
    let (ns, sa) = ("vap-create", "vap-create-agent");
    let (a, b) = ("vap-create-a", "vap-create-b");
    let uid_a = cp.create_node(a);
    cp.create_node(b);
    apply_agent_rbac(&cp);
    service_account(&cp, ns, sa, "local-static-provisioner");
    let mut scratch = Scratch::new(&cp, test);
    scratch.apply_policies(&policies_for(&read("deploy/base/admission-policy.yaml"), test, Some(sa), Some("none")));
    let tmp = tempfile::tempdir().unwrap();
    let agent = pod_bound_kubeconfig(&cp, tmp.path(), ns, sa, a);
    let pv = |name: &str, path: &str| agent_pv(test, name, a, &uid_a, path);
    wait_enforced(&scratch, &agent, &pv("vap-create-probe", "/etc"), "is not directly under one of");

    // Allowed: the PV exactly as the agent builds it, the minimal one, and other forms that pin
    // only node A.
    assert_allowed(&create(&cp, &agent, &pv("vap-create-full", &format!("{ROOT}/vol1"))), "the agent's PV");
    let minimal = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": "vap-create-minimal",
            "labels": {LABEL: a, "vap-test": test},
            "annotations": {PROVISIONED_BY: format!("local-volume-provisioner-{a}")},
            "finalizers": [WIPE]
        },
        "spec": {
            "capacity": {"storage": "10Gi"},
            "local": {"path": format!("{ROOT}/mount1")},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "vap-sc",
            "volumeMode": "Filesystem",
            "nodeAffinity": {"required": {"nodeSelectorTerms": [hostname(a)]}}
        }
    });
    assert_allowed(&create(&cp, &agent, &minimal), "the minimal PV (useNodeNameOnly)");
    let allowed_terms = [
        ("vap-create-fields", vec![term("metadata.name", "In", &[a])]),
        ("vap-create-both", vec![hostname(a), term("metadata.name", "In", &[a])]),
        (
            "vap-create-narrower",
            vec![json!({"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [a]},
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]}
            ]})],
        ),
    ];
    for (name, terms) in allowed_terms {
        let p = with(pv(name, &format!("{ROOT}/{name}")), |p| set_terms(p, terms));
        assert_allowed(&create(&cp, &agent, &p), name);
    }

    // Bound in advance to a claim: it would pull a chosen tenant's pod onto this disk.
    for (name, claim) in [("vap-create-prebound", "victim"), ("vap-create-prebound-other", "db-data")] {
        let p = with(pv(name, &format!("{ROOT}/{name}")), |p| {
            p["spec"]["claimRef"] = json!({"kind": "PersistentVolumeClaim", "namespace": "default", "name": claim});
        });
        assert_create_denied(&cp, &agent, &p, name, "may not create PVs bound in advance to a claim");
    }

    // Not a local volume: hostPath (the root filesystem, or even under a root), NFS.
    let not_local = "may only create PVs with a local volume source";
    for (name, key, source) in [
        ("vap-create-hostpath-root", "hostPath", json!({"path": "/"})),
        ("vap-create-hostpath-under", "hostPath", json!({"path": format!("{ROOT}/vol1")})),
        ("vap-create-nfs", "nfs", json!({"server": "10.0.0.9", "path": "/"})),
    ] {
        let p = with(pv(name, "/unused"), |p| set_source(p, key, source));
        assert_create_denied(&cp, &agent, &p, name, not_local);
    }

    // A local path that is not <root>/<entry>: the message names the path and the roots.
    for path in [
        "/",
        "/etc",
        "/mnt",
        ROOT,
        "/mnt/fast-disks-evil/vol1",
        "mnt/fast-disks/vol1",
        "/mnt/fast-disks/",
        "/mnt/fast-disks/.",
        "/mnt/fast-disks/./vol1",
        "/mnt/fast-disks//vol1",
        "/mnt/fast-disks/a/b",
        "/mnt/fast-disks/vol1/",
    ] {
        let why = format!("{path} is not directly under one of [{ROOT}]");
        assert_create_denied(&cp, &agent, &pv("vap-create-path", path), path, &why);
    }
    // An encrypted volume's data directory is refused where no class encrypts (the base has no
    // encrypting root): there the last component is the tenant's to make.
    let p = with(pv("vap-create-encrypted", &format!("{ROOT}/vol1/lsp-encrypted")), |p| {
        p["metadata"]["annotations"][ANN_ENCRYPTION] = json!(ENCRYPTED);
    });
    let why = format!("{ROOT}/vol1/lsp-encrypted is not directly under one of [{ROOT}]");
    assert_create_denied(&cp, &agent, &p, "an encrypted PV under a root that does not encrypt", &why);

    // Backsteps: the API server's own validation refuses them before admission (the policy
    // would too: '..' is never an entry, and 'root/../etc' has two components).
    for path in ["/mnt/fast-disks/../etc", "/mnt/fast-disks/..", "/mnt/fast-disks/vol1/../../../etc"] {
        assert_create_denied(&cp, &agent, &pv("vap-create-path", path), path, "must not contain '..'");
    }

    // Node affinity that does not pin node A alone (terms are ORed).
    let not_pinned = format!(
        "may only create PVs whose every spec.nodeAffinity term pins kubernetes.io/hostname (or metadata.name) In [{a}]"
    );
    let refused_terms = [
        ("node B", vec![hostname(b)]),
        ("node B by name", vec![term("metadata.name", "In", &[b])]),
        ("A, or B", vec![hostname(a), hostname(b)]),
        ("A, or a zone (a class selector)", vec![hostname(a), term("topology.kubernetes.io/zone", "In", &["zone-a"])]),
        ("A, or an empty term", vec![hostname(a), json!({})]),
        ("A or B in one requirement", vec![term("kubernetes.io/hostname", "In", &[a, b])]),
        ("A, or B by name", vec![hostname(a), term("metadata.name", "In", &[b])]),
        ("not B", vec![term("kubernetes.io/hostname", "NotIn", &[b])]),
        ("any hostname", vec![term("kubernetes.io/hostname", "Exists", &[])]),
        ("another label equal to A", vec![term("example.com/host", "In", &[a])]),
        ("no terms", vec![]),
    ];
    for (what, terms) in refused_terms {
        let p = with(pv("vap-create-affinity", &format!("{ROOT}/vol9")), |p| set_terms(p, terms));
        let why = if what == "no terms" { "nodeSelectorTerms: Required value" } else { not_pinned.as_str() };
        assert_create_denied(&cp, &agent, &p, what, why);
    }
    // Two names in one field selector: the API server's validation refuses it first.
    let p = with(pv("vap-create-affinity", &format!("{ROOT}/vol9")), |p| {
        set_terms(p, vec![term("metadata.name", "In", &[a, b])]);
    });
    assert_create_denied(&cp, &agent, &p, "A or B by name", "must be only one value");
    // The alpha annotation: without spec.nodeAffinity the API server refuses the local PV; with
    // it the policy refuses the annotation, whatever it says.
    let alpha = "volume.alpha.kubernetes.io/node-affinity";
    let alpha_b = format!(
        r#"{{"requiredDuringSchedulingIgnoredDuringExecution":{{"nodeSelectorTerms":[{{"matchExpressions":[{{"key":"kubernetes.io/hostname","operator":"In","values":["{b}"]}}]}}]}}}}"#
    );
    let alpha_only = with(pv("vap-create-alpha", &format!("{ROOT}/vol9")), |p| {
        p["metadata"]["annotations"][alpha] = json!(alpha_b);
        p["spec"].as_object_mut().unwrap().remove("nodeAffinity");
    });
    assert_create_denied(&cp, &agent, &alpha_only, "alpha affinity alone", "Local volume requires node affinity");
    let alpha_too = with(pv("vap-create-alpha", &format!("{ROOT}/vol9")), |p| {
        p["metadata"]["annotations"][alpha] = json!(alpha_b);
    });
    assert_create_denied(&cp, &agent, &alpha_too, "alpha affinity as well", "may not set volume.alpha");
    let alpha_a = with(pv("vap-create-alpha", &format!("{ROOT}/vol9")), |p| {
        p["metadata"]["annotations"][alpha] = json!(alpha_b.replace(b, a));
    });
    assert_create_denied(&cp, &agent, &alpha_a, "alpha affinity for A as well", "may not set volume.alpha");

    // Labelled or annotated for another node, or not at all.
    let other_label =
        with(pv("vap-create-label", &format!("{ROOT}/vol9")), |p| p["metadata"]["labels"][LABEL] = json!(b));
    assert_create_denied(&cp, &agent, &other_label, "labelled for B", "may only change PVs labelled");
    // Unlabelled (as an upstream agent still running during the swap creates them): only with
    // upstream's provisioned-by for this node, and under every other check.
    let no_label = with(other_label.clone(), |p| {
        p["metadata"]["labels"].as_object_mut().unwrap().remove(LABEL);
    });
    let annotated_b = with(no_label.clone(), |p| {
        p["metadata"]["annotations"][PROVISIONED_BY] = json!(format!("local-volume-provisioner-{b}-x"));
    });
    assert_create_denied(&cp, &agent, &annotated_b, "unlabelled, annotated for B", "may only change PVs labelled");
    let unannotated = with(no_label.clone(), |p| {
        p["metadata"]["annotations"].as_object_mut().unwrap().remove(PROVISIONED_BY);
    });
    assert_create_denied(&cp, &agent, &unannotated, "unlabelled, unannotated", "may only change PVs labelled");
    let pinned_b = with(no_label.clone(), |p| set_terms(p, vec![hostname(b)]));
    assert_create_denied(&cp, &agent, &pinned_b, "unlabelled, pinned to B", &not_pinned);
    let outside = with(no_label.clone(), |p| p["spec"]["local"]["path"] = json!("/etc"));
    assert_create_denied(&cp, &agent, &outside, "unlabelled, outside the roots", "is not directly under one of");
    let upstream_shaped = with(no_label.clone(), |p| {
        p["metadata"]["name"] = json!("vap-create-upstream");
        p["metadata"]["finalizers"] = json!([]);
    });
    assert_allowed(&create(&cp, &agent, &upstream_shaped), "an upstream agent's PV for its own node");
    // Once created, it changes as any of its node's: our label for A may be added (adoption),
    // one for B may not.
    let label_b = json!({"metadata": {"labels": {LABEL: b}}});
    assert_denied(
        &merge_patch(&cp, &agent, "vap-create-upstream", &label_b),
        "labelled for B",
        "may only change PVs labelled",
    );
    let label_a = json!({"metadata": {"labels": {LABEL: a}}});
    assert_allowed(&merge_patch(&cp, &agent, "vap-create-upstream", &label_a), "adopted");
    for provisioned_by in [Some(format!("local-volume-provisioner-{b}-x")), Some("someone-else".into()), None] {
        let p = with(pv("vap-create-annotation", &format!("{ROOT}/vol9")), |p| match &provisioned_by {
            Some(v) => p["metadata"]["annotations"][PROVISIONED_BY] = json!(v),
            None => {
                p["metadata"]["annotations"].as_object_mut().unwrap().remove(PROVISIONED_BY);
            }
        });
        assert_create_denied(
            &cp,
            &agent,
            &p,
            &format!("provisioned-by {provisioned_by:?}"),
            "may only create PVs annotated",
        );
    }

    // The golden PV with a class selector: an extra ORed term, refused (a documented limit).
    let selector = with(pv("vap-create-selector", &format!("{ROOT}/vol9")), |p| {
        set_terms(p, vec![hostname(a), term("pool", "In", &["shared"])]);
    });
    assert_create_denied(&cp, &agent, &selector, "a class selector", &not_pinned);
}

#[test]
fn agent_changes_only_the_metadata_of_its_own_pvs() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let test = "vap-update";
    let (ns, sa) = ("vap-update", "vap-update-agent");
    let (a, b) = ("vap-update-a", "vap-update-b");
    let uid_a = cp.create_node(a);
    let uid_b = cp.create_node(b);
    apply_agent_rbac(&cp);
    service_account(&cp, ns, sa, "local-static-provisioner");
    let mut scratch = Scratch::new(&cp, test);
    scratch.apply_policies(&policies_for(&read("deploy/base/admission-policy.yaml"), test, Some(sa), Some("none")));
    let tmp = tempfile::tempdir().unwrap();
    let agent = pod_bound_kubeconfig(&cp, tmp.path(), ns, sa, a);
    let no_node = plain_kubeconfig(&cp, tmp.path(), ns, sa);
    wait_enforced(
        &scratch,
        &agent,
        &agent_pv(test, "vap-update-probe", b, &uid_b, &format!("{ROOT}/p")),
        "may only change",
    );

    let own = "vap-update-own";
    assert_allowed(&create(&cp, &agent, &agent_pv(test, own, a, &uid_a, &format!("{ROOT}/own"))), "creating A's PV");
    let b_pv = "vap-update-b-pv";
    admin_create(&cp, &agent_pv(test, b_pv, b, &uid_b, &format!("{ROOT}/b")));
    let upstream = |name: &str, node: &str, uid: &str| {
        with(agent_pv(test, name, node, uid, &format!("{ROOT}/{name}")), |p| {
            let meta = p["metadata"].as_object_mut().unwrap();
            meta["labels"].as_object_mut().unwrap().remove(LABEL);
            meta.remove("finalizers");
            meta.remove("ownerReferences");
            meta["annotations"].as_object_mut().unwrap().remove("local-static-provisioner.io/volume-identity");
        })
    };
    let (up_a, up_b, up_a_prefix) = ("vap-update-up-a", "vap-update-up-b", "vap-update-up-ax");
    admin_create(&cp, &upstream(up_a, a, &uid_a));
    admin_create(&cp, &upstream(up_b, b, &uid_b));
    // Upstream's useNodeNameOnly form for node "<a>x": not A's (no '-' after the name).
    admin_create(
        &cp,
        &with(upstream(up_a_prefix, a, &uid_a), |p| {
            p["metadata"]["annotations"][PROVISIONED_BY] = json!(format!("local-volume-provisioner-{a}x"));
        }),
    );

    // Allowed: metadata of its own PV (cleanup annotations, finalizers), adoption of its own
    // upstream PV as the agent does it (label, finalizer, identity in one patch).
    let annotate =
        json!({"metadata": {"annotations": {"local-static-provisioner.io/cleanup-result": "refused: test"}}});
    assert_allowed(&merge_patch(&cp, &agent, own, &annotate), "annotating its PV");
    let finalizers = json!({"metadata": {"finalizers": [WIPE, "example.com/other"]}});
    assert_allowed(&merge_patch(&cp, &agent, own, &finalizers), "changing its PV's finalizers");
    let adopt = json!({"metadata": {
        "labels": {LABEL: a},
        "annotations": {"local-static-provisioner.io/volume-identity": "fs:fsid=1,2;ino=3"},
        "finalizers": [WIPE]
    }});
    assert_allowed(&merge_patch(&cp, &agent, up_a, &adopt), "adopting A's upstream PV");

    // Node B's PVs, labelled or upstream's: no patch, no relabel, no adoption, no delete.
    let relabel = json!({"metadata": {"labels": {LABEL: a}}});
    let mine = "may only change PVs labelled";
    assert_denied(&merge_patch(&cp, &agent, b_pv, &relabel), "relabelling B's PV", mine);
    assert_denied(&merge_patch(&cp, &agent, b_pv, &annotate), "annotating B's PV", mine);
    assert_denied(&merge_patch(&cp, &agent, up_b, &adopt), "adopting B's upstream PV", mine);
    assert_denied(&merge_patch(&cp, &agent, up_a_prefix, &adopt), "adopting node <a>x's upstream PV", mine);
    assert_denied(&delete(&cp, &agent, b_pv), "deleting B's PV", mine);
    assert_denied(&delete(&cp, &agent, up_b), "deleting B's upstream PV", mine);
    // Nor may its own PV be handed to B or lose our label.
    assert_denied(&merge_patch(&cp, &agent, own, &json!({"metadata": {"labels": {LABEL: b}}})), "handing to B", mine);
    assert_denied(&merge_patch(&cp, &agent, own, &json!({"metadata": {"labels": {LABEL: null}}})), "unlabelling", mine);

    // The spec of its own PVs stays as it is, also within an adoption.
    let spec_only = "may change only the metadata of a PV, not its spec";
    for (what, patch) in [
        ("reclaim policy", json!({"spec": {"persistentVolumeReclaimPolicy": "Delete"}})),
        ("class", json!({"spec": {"storageClassName": "other"}})),
        ("capacity", json!({"spec": {"capacity": {"storage": "100Gi"}}})),
        ("mount options", json!({"spec": {"mountOptions": ["rw"]}})),
        ("claim", json!({"spec": {"claimRef": {"namespace": "default", "name": "stolen"}}})),
        ("label and class", json!({"metadata": {"labels": {"x": "y"}}, "spec": {"storageClassName": "other"}})),
    ] {
        assert_denied(&merge_patch(&cp, &agent, own, &patch), what, spec_only);
    }
    let adopt_and_change = with(adopt.clone(), |p| p["spec"] = json!({"mountOptions": ["rw"]}));
    assert_denied(&merge_patch(&cp, &agent, up_a, &adopt_and_change), "adoption with a spec change", spec_only);
    // The alpha affinity annotation cannot be added later either.
    let alpha = json!({"metadata": {"annotations": {"volume.alpha.kubernetes.io/node-affinity": "{}"}}});
    assert_denied(&merge_patch(&cp, &agent, own, &alpha), "adding the alpha affinity", "may not set volume.alpha");

    // A token without a node name can do nothing; A's own PV can be deleted.
    let no_name = "no node name";
    assert_denied(&delete(&cp, &no_node, own), "a token without node: delete", no_name);
    assert_denied(&merge_patch(&cp, &no_node, own, &annotate), "a token without node: patch", no_name);
    assert_denied(
        &create(&cp, &no_node, &agent_pv(test, "vap-update-nonode", a, &uid_a, &format!("{ROOT}/x"))),
        "a token without node: create",
        no_name,
    );
    assert_allowed(&delete(&cp, &agent, own), "deleting A's PV");
    assert_allowed(&delete(&cp, &agent, up_a), "deleting A's adopted PV");
    // Its finalizers can be removed while it is being deleted (after the wipe).
    assert_allowed(
        &merge_patch(&cp, &agent, own, &json!({"metadata": {"finalizers": null}})),
        "releasing its finalizers",
    );
}

fn patch_node(cp: &ControlPlane, kubeconfig: &Path, node: &str, patch: &Value) -> Output {
    as_user(cp, kubeconfig, &["patch", "node", node, "--type=merge", "-p", &patch.to_string()], None)
}

/// A merge patch of a Node's labels (a `null` value removes the label), as the agent sends it.
fn labels(pairs: &[(&str, Option<&str>)]) -> Value {
    let map: serde_json::Map<String, Value> = pairs.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    json!({"metadata": {"labels": map}})
}

fn fence(pv: &str) -> String {
    format!("{FENCE_PREFIX}{pv}")
}

/// The labels of a Node, as the admin sees them.
fn node_labels(cp: &ControlPlane, node: &str) -> Value {
    cp.get_json(&["node", node]).unwrap()["metadata"]["labels"].clone()
}

#[test]
fn agent_changes_only_the_fence_labels_of_its_own_node() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let test = "vap-fence";
    let (ns, sa) = ("vap-fence", "vap-fence-agent");
    let (a, b) = ("vap-fence-a", "vap-fence-b");
    cp.create_node(a);
    cp.create_node(b);
    apply_agent_rbac(&cp);
    service_account(&cp, ns, sa, "local-static-provisioner");
    let mut scratch = Scratch::new(&cp, test);
    scratch.apply_policies(&policies_for(&read("deploy/base/admission-policy.yaml"), test, Some(sa), Some("none")));
    let tmp = tempfile::tempdir().unwrap();
    let agent = pod_bound_kubeconfig(&cp, tmp.path(), ns, sa, a);
    let no_node = plain_kubeconfig(&cp, tmp.path(), ns, sa);
    let pv1 = fence("local-pv-0000fe01");
    let pv2 = fence("local-pv-0000fe02");

    // Enforced once the agent's fence on B is refused (one that got through before is removed).
    let other = format!("the agent of node {a} may only change its own Node, not {b}");
    wait_until("the policy to be enforced", WAIT, || {
        let out = patch_node(&cp, &agent, b, &labels(&[(&pv1, Some("not-its-disk"))]));
        if out.status.success() {
            cp.kubectl_ok(&["label", "node", b, &format!("{pv1}-")]);
            return None;
        }
        stderr(&out).contains(&other).then_some(())
    });
    assert!(node_labels(&cp, b).get(&pv1).is_none(), "B carries A's fence");

    // Allowed on its own Node: a PV's fence added, changed through every value and removed; the
    // node-wide label set and removed; several in one patch, as the agent's passes send them.
    for value in ["not-its-disk", "disk-missing", "unverified", "not-its-disk"] {
        assert_allowed(&patch_node(&cp, &agent, a, &labels(&[(&pv1, Some(value))])), &format!("{pv1}={value}"));
        assert_eq!(node_labels(&cp, a)[&pv1], value);
    }
    assert_allowed(&patch_node(&cp, &agent, a, &labels(&[(UNVERIFIED, Some("agent-stopped"))])), "the node-wide label");
    assert_eq!(node_labels(&cp, a)[UNVERIFIED], "agent-stopped");
    assert_allowed(
        &patch_node(&cp, &agent, a, &labels(&[(&pv2, Some("unverified")), (UNVERIFIED, None), (&pv1, None)])),
        "a fence added, the node-wide label and another fence removed",
    );
    let now = node_labels(&cp, a);
    assert_eq!(now[&pv2], "unverified");
    assert!(now.get(UNVERIFIED).is_none() && now.get(&pv1).is_none(), "{now}");
    assert_allowed(&patch_node(&cp, &agent, a, &labels(&[(&pv2, None)])), "the last fence removed");
    // The status on the Node itself: not refused, and not written either (the API server keeps
    // the old status; the status subresource is not the agent's to patch).
    let status = json!({"metadata": {"labels": {&pv1: "disk-missing"}}, "status": {"capacity": {"cpu": "99"}}});
    assert_allowed(&patch_node(&cp, &agent, a, &status), "a fence with a status change");
    let node = cp.get_json(&["node", a]).unwrap();
    assert_eq!(node["metadata"]["labels"][&pv1], "disk-missing");
    assert_eq!(node["status"]["capacity"]["cpu"], "4", "the status was written through the Node");
    let out = as_user(
        &cp,
        &agent,
        &["patch", "node", a, "--subresource=status", "--type=merge", "-p", &status.to_string()],
        None,
    );
    assert_denied(&out, "patching the status subresource", "resource \"nodes/status\"");

    // Refused: another Node, any other label or value, and every other change; each leaves the
    // Node as it was.
    let before = cp.get_json(&["node", a]).unwrap();
    let fence_ok = (pv2.as_str(), Some("not-its-disk"));
    assert_denied(&patch_node(&cp, &agent, b, &labels(&[fence_ok])), "a fence on B", &other);
    assert_denied(&patch_node(&cp, &agent, b, &labels(&[(UNVERIFIED, Some("agent-stopped"))])), "B node-wide", &other);
    let only = format!(
        "the agent of node {a} may only change the labels {FENCE_PREFIX}<pv-name> and {UNVERIFIED} of its Node, not "
    );
    for (what, patch, named) in [
        ("a foreign label", labels(&[("example.com/pool", Some("x"))]), "example.com/pool"),
        ("a fence and a foreign label", labels(&[fence_ok, ("example.com/pool", Some("x"))]), "example.com/pool"),
        ("the hostname label changed", labels(&[("kubernetes.io/hostname", Some(b))]), "kubernetes.io/hostname"),
        ("a label removed", labels(&[("topology.kubernetes.io/zone", None)]), "topology.kubernetes.io/zone"),
        ("our PV label", labels(&[(LABEL, Some(a))]), LABEL),
        (
            "a look-alike prefix",
            labels(&[("fence.local-static-provisioner.io.example.com/x", Some("unverified"))]),
            "fence.local-static-provisioner.io.example.com/x",
        ),
        (
            "a look-alike node-wide label",
            labels(&[("local-static-provisioner.io/volumes-unverified-x", Some("agent-stopped"))]),
            "local-static-provisioner.io/volumes-unverified-x",
        ),
    ] {
        assert_denied(&patch_node(&cp, &agent, a, &patch), what, &format!("{only}{named}"));
    }
    let values = format!(
        "the agent of node {a} may set {FENCE_PREFIX}<pv-name> only to not-its-disk, disk-missing or unverified, and {UNVERIFIED} only to agent-stopped, not "
    );
    for (key, value) in [
        (pv2.as_str(), "yes"),
        (pv2.as_str(), ""),
        (pv2.as_str(), "agent-stopped"),
        (pv1.as_str(), "Not-Its-Disk"),
        (UNVERIFIED, "not-its-disk"),
        (UNVERIFIED, "true"),
        (UNVERIFIED, ""),
    ] {
        let what = format!("{key}={value}");
        assert_denied(&patch_node(&cp, &agent, a, &labels(&[(key, Some(value))])), &what, &format!("{values}{what}"));
    }
    let rest = format!("the agent of node {a} may change only fence labels of its Node, not ");
    let owner = json!([{"apiVersion": "v1", "kind": "Node", "name": b, "uid": "0f0e1d2c-3b4a-5968-7786-95a4b3c2d1e0"}]);
    for (what, patch, named) in [
        ("an annotation", json!({"metadata": {"annotations": {"example.com/x": "y"}}}), "metadata.annotations"),
        ("a finalizer", json!({"metadata": {"finalizers": ["example.com/hold"]}}), "metadata.finalizers"),
        ("an owner", json!({"metadata": {"ownerReferences": owner}}), "metadata.ownerReferences"),
        ("a taint", json!({"spec": {"taints": [{"key": "example.com/t", "effect": "NoSchedule"}]}}), "spec"),
        ("unschedulable", json!({"spec": {"unschedulable": true}}), "spec"),
        ("a pod CIDR", json!({"spec": {"podCIDR": "10.244.7.0/24"}}), "spec"),
        ("a provider ID", json!({"spec": {"providerID": "example://vap-fence-a"}}), "spec"),
        (
            "a fence with a taint",
            json!({"metadata": {"labels": {&pv2: "unverified"}}, "spec": {"taints": [{"key": "x", "effect": "NoExecute"}]}}),
            "spec",
        ),
        (
            "a fence with an annotation",
            json!({"metadata": {"labels": {&pv2: "unverified"}, "annotations": {"example.com/x": "y"}}}),
            "metadata.annotations",
        ),
    ] {
        assert_denied(&patch_node(&cp, &agent, a, &patch), what, &format!("{rest}{named}"));
    }
    let after = cp.get_json(&["node", a]).unwrap();
    assert_eq!(after["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"], "A changed: {after}");
    assert!(node_labels(&cp, b).get(&pv2).is_none(), "B carries A's fence");

    // A token without a node name can do nothing.
    assert_denied(&patch_node(&cp, &no_node, a, &labels(&[fence_ok])), "a token without node", "no node name");

    // Other users are not under this policy: another ServiceAccount with the same ClusterRole
    // (its name only extends the agent's), pod-bound on A, changes B's labels and spec.
    let (other_ns, other_sa) = ("vap-fence-other", format!("{sa}-other"));
    service_account(&cp, other_ns, &other_sa, "local-static-provisioner");
    let bystander = pod_bound_kubeconfig(&cp, tmp.path(), other_ns, &other_sa, a);
    let taint = json!({"metadata": {"labels": {"example.com/pool": "x"}}, "spec": {"unschedulable": true}});
    wait_until("the other ServiceAccount's RBAC", WAIT, || {
        patch_node(&cp, &bystander, b, &taint).status.success().then_some(())
    });
    let node = cp.get_json(&["node", b]).unwrap();
    assert_eq!(node["metadata"]["labels"]["example.com/pool"], "x");
    assert_eq!(node["spec"]["unschedulable"], true);
}

#[test]
fn node_cleanup_only_deletes_local_pvs_and_drops_the_wipe_finalizer() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let test = "vap-nc";
    let (ns, sa) = ("vap-nc", "vap-nc-cleanup");
    cp.apply(&read("deploy/base/namespace.yaml"));
    cp.apply(&read("deploy/node-cleanup/rbac.yaml"));
    service_account(&cp, ns, sa, "local-static-provisioner-node-cleanup");
    // Its Lease, in its own namespace (deploy/node-cleanup/rbac.yaml's Role, for this namespace).
    cp.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: {sa}, namespace: {ns}}}\nrules: [{{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, create, update]}}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: {sa}, namespace: {ns}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {sa}}}\nsubjects: [{{kind: ServiceAccount, name: {sa}, namespace: {ns}}}]\n"
    ));
    let mut scratch = Scratch::new(&cp, test);
    scratch.apply_policies(&policies_for(&read("deploy/base/admission-policy.yaml"), test, Some("none"), Some(sa)));
    let tmp = tempfile::tempdir().unwrap();
    let cleanup = plain_kubeconfig(&cp, tmp.path(), ns, sa);

    let node = "vap-nc-gone";
    let uid = "0f0e1d2c-3b4a-5968-7786-95a4b3c2d1e0";
    let local = |name: &str| {
        with(agent_pv(test, name, node, uid, &format!("/mnt/nowhere/{name}")), |p| {
            p["metadata"].as_object_mut().unwrap().remove("ownerReferences");
            p["metadata"]["finalizers"] = json!(["example.com/keep", WIPE]);
        })
    };
    // A label change is refused once the policy is enforced (and harmless before).
    let probe = "vap-nc-probe";
    admin_create(&cp, &local(probe));
    wait_until("the policy to be enforced", WAIT, || {
        let out = merge_patch(&cp, &cleanup, probe, &json!({"metadata": {"labels": {"probe": "x"}}}));
        (!out.status.success() && stderr(&out).contains("may only remove the finalizer")).then_some(())
    });

    // Deletes: only local PVs made by a local-static-provisioner.
    let only_local = "may only delete or release local PVs";
    let hostpath = "vap-nc-hostpath";
    admin_create(&cp, &with(local(hostpath), |p| set_source(p, "hostPath", json!({"path": "/"}))));
    assert_denied(&delete(&cp, &cleanup, hostpath), "deleting a hostPath PV", only_local);
    let foreign = "vap-nc-foreign";
    admin_create(
        &cp,
        &with(local(foreign), |p| p["metadata"]["annotations"][PROVISIONED_BY] = json!("example.com/csi")),
    );
    assert_denied(&delete(&cp, &cleanup, foreign), "deleting another provisioner's PV", only_local);
    let unannotated = "vap-nc-unannotated";
    admin_create(&cp, &with(local(unannotated), |p| p["metadata"]["annotations"] = json!({})));
    assert_denied(&delete(&cp, &cleanup, unannotated), "deleting an unannotated PV", only_local);

    // Updates: only dropping our finalizer, and only from a PV being deleted.
    let pv = "vap-nc-local";
    admin_create(&cp, &local(pv));
    // What remove_finalizer_if sends (src/api/mod.rs): tests of the UID, the finalizer's
    // position and provisioned-by, then the removal.
    let wipe_index = |name: &str| {
        let pv = cp.get_json(&["pv", name]).unwrap();
        let finalizers = pv["metadata"]["finalizers"].as_array().unwrap().clone();
        let index = finalizers.iter().position(|f| f == WIPE).unwrap();
        (pv["metadata"]["uid"].as_str().unwrap().to_string(), index)
    };
    let drop_wipe = |name: &str| {
        let (pv_uid, index) = wipe_index(name);
        let provisioned_by = format!("local-volume-provisioner-{node}-{uid}");
        json!([
            {"op": "test", "path": "/metadata/uid", "value": pv_uid},
            {"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": WIPE},
            {"op": "test", "path": "/metadata/annotations/pv.kubernetes.io~1provisioned-by", "value": provisioned_by},
            {"op": "remove", "path": format!("/metadata/finalizers/{index}")}
        ])
    };
    let only_finalizer = "may only remove the finalizer local-static-provisioner.io/wipe from a PV being deleted";
    assert_denied(
        &json_patch(&cp, &cleanup, pv, &drop_wipe(pv)),
        "dropping the finalizer of a live PV",
        only_finalizer,
    );
    assert_allowed(&delete(&cp, &cleanup, pv), "deleting a local PV");
    let unchanged = "may not change a PV's spec, labels, annotations or owner references";
    for (what, extra) in [
        ("a label", json!({"op": "add", "path": "/metadata/labels/extra", "value": "x"})),
        (
            "our node label",
            json!({"op": "replace", "path": "/metadata/labels/local-static-provisioner.io~1node", "value": "other"}),
        ),
        ("an annotation", json!({"op": "add", "path": "/metadata/annotations/extra", "value": "x"})),
        (
            "provisioned-by",
            json!({"op": "replace", "path": "/metadata/annotations/pv.kubernetes.io~1provisioned-by", "value": "local-volume-provisioner-x"}),
        ),
        (
            "the reclaim policy",
            json!({"op": "replace", "path": "/spec/persistentVolumeReclaimPolicy", "value": "Delete"}),
        ),
    ] {
        let index = wipe_index(pv).1;
        let patch = json!([extra, {"op": "remove", "path": format!("/metadata/finalizers/{index}")}]);
        assert_denied(
            &json_patch(&cp, &cleanup, pv, &patch),
            &format!("dropping the finalizer and changing {what}"),
            unchanged,
        );
    }
    let other_finalizer = json!([{"op": "remove", "path": "/metadata/finalizers/0"}]);
    assert_denied(&json_patch(&cp, &cleanup, pv, &other_finalizer), "dropping another finalizer", only_finalizer);
    let both = json!([{"op": "replace", "path": "/metadata/finalizers", "value": []}]);
    assert_denied(&json_patch(&cp, &cleanup, pv, &both), "dropping every finalizer", only_finalizer);
    let label_only = json!({"metadata": {"labels": {"extra": "x"}}});
    assert_denied(&merge_patch(&cp, &cleanup, pv, &label_only), "changing only a label", only_finalizer);
    assert_allowed(&json_patch(&cp, &cleanup, pv, &drop_wipe(pv)), "dropping our finalizer of a PV being deleted");
    let left = cp.get_json(&["pv", pv]).unwrap()["metadata"]["finalizers"].as_array().unwrap().clone();
    assert!(left.contains(&json!("example.com/keep")) && !left.contains(&json!(WIPE)), "{left:?}");

    // The real node-cleanup under the policy: a stranded PV of a deleted Node is deleted and
    // its finalizer released, with no request refused.
    let class = "vap-nc-class";
    cp.create_storage_class(class, "Delete");
    cp.create_node("vap-nc-bystander");
    cp.create_node(node);
    let stranded = "vap-nc-stranded";
    admin_create(
        &cp,
        &with(agent_pv(test, stranded, node, uid, "/mnt/nowhere/stranded"), |p| {
            p["metadata"].as_object_mut().unwrap().remove("ownerReferences");
            p["spec"]["storageClassName"] = json!(class);
            p["spec"]["persistentVolumeReclaimPolicy"] = json!("Delete");
        }),
    );
    wait_until("the stranded PV Available", WAIT, || (cp.pv_state(stranded)?.1 == "Available").then_some(()));
    cp.kubectl_ok(&["delete", "node", node]);
    let process = AgentProcess::start_node_cleanup(
        &cleanup,
        &tmp.path().join("node-cleanup.log"),
        &[
            "--storage-classes",
            class,
            "--grace-period",
            "1s",
            "--resync-period",
            "500ms",
            "--lease-name",
            sa,
            "--lease-namespace",
            ns,
        ],
    );
    wait_until("node-cleanup to release the stranded PV", WAIT, || cp.pv_state(stranded).is_none().then_some(()));
    let log = process.stop();
    assert!(!log.contains("denied"), "node-cleanup was refused something:\n{log}");
}

#[test]
fn kustomize_namespace_overlay_keeps_the_policy_bound() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let test = "vap-overlay";
    let ns = "vap-other-ns";
    let (a, b) = ("vap-overlay-a", "vap-overlay-b");
    let uid_a = cp.create_node(a);
    let uid_b = cp.create_node(b);
    // An overlay as an operator writes it: another namespace, and one more discovery root as
    // documented in the policy.
    let dir = tempfile::tempdir().unwrap();
    let base = relative(dir.path(), &repo_root().join("deploy/base"));
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: {ns}\nresources:\n  - {}\npatches:\n  - target: {{kind: ValidatingAdmissionPolicy, name: {AGENT_POLICY}}}\n    patch: |-\n      - op: replace\n        path: /spec/variables/0/expression\n        value: \"['/mnt/fast-disks', '/mnt/ssd']\"\n",
            base.display()
        ),
    )
    .unwrap();
    let built = cp.kubectl_ok(&["kustomize", dir.path().to_str().unwrap()]);
    let docs = documents(&built);
    assert_eq!(find(&docs, "ServiceAccount", "local-static-provisioner")["metadata"]["namespace"], ns);
    let binding = find(&docs, "ClusterRoleBinding", "local-static-provisioner");
    assert_eq!(binding["subjects"][0]["namespace"], ns);
    assert_eq!(roots(find(&docs, "ValidatingAdmissionPolicy", AGENT_POLICY)), ["/mnt/fast-disks", "/mnt/ssd"]);
    let _ = cp.kubectl(&["create", "namespace", ns]);
    let out = cp.kubectl_stdin(&cp.kubeconfig, &["apply", "--dry-run=server", "-f", "-"], Some(&built));
    assert!(out.status.success(), "the overlay is refused: {}", stderr(&out));

    // Applied as built: the overlay's ServiceAccount and the policies, unchanged. (Not the
    // ClusterRoleBinding, DaemonSet or StorageClass: other tests share those names.)
    let mut scratch = Scratch::new(&cp, test);
    let pick = |kinds: &[&str]| -> String {
        let items: Vec<&Value> = docs.iter().filter(|d| kinds.contains(&d["kind"].as_str().unwrap())).collect();
        json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
    };
    cp.apply(&pick(&["Namespace", "ServiceAccount"]));
    scratch.apply_policies(&pick(&["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]));
    apply_agent_rbac(&cp);
    cp.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: {test}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: local-static-provisioner}}\nsubjects: [{{kind: ServiceAccount, name: local-static-provisioner, namespace: {ns}}}]\n"
    ));
    let tmp = tempfile::tempdir().unwrap();
    let agent = pod_bound_kubeconfig(&cp, tmp.path(), ns, "local-static-provisioner", a);
    wait_enforced(&scratch, &agent, &agent_pv(test, "vap-overlay-probe", b, &uid_b, "/mnt/ssd/p"), "may only change");

    assert_allowed(
        &create(&cp, &agent, &agent_pv(test, "vap-overlay-ssd", a, &uid_a, "/mnt/ssd/vol1")),
        "the new root",
    );
    assert_allowed(
        &create(&cp, &agent, &agent_pv(test, "vap-overlay-fast", a, &uid_a, "/mnt/fast-disks/vol1")),
        "the base root",
    );
    let elsewhere = agent_pv(test, "vap-overlay-else", a, &uid_a, "/mnt/other/vol1");
    assert_create_denied(
        &cp,
        &agent,
        &elsewhere,
        "another root",
        "/mnt/other/vol1 is not directly under one of [/mnt/fast-disks, /mnt/ssd]",
    );
    let hostpath = with(agent_pv(test, "vap-overlay-hostpath", a, &uid_a, "/unused"), |p| {
        set_source(p, "hostPath", json!({"path": "/"}));
    });
    assert_create_denied(&cp, &agent, &hostpath, "hostPath /", "may only create PVs with a local volume source");
}

fn helm() -> PathBuf {
    let out = run(Command::new("bash").arg(repo_root().join("tests/tools/build-helm.sh")));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn helm_template(ns: &str, sets: &[String]) -> Vec<Value> {
    let mut cmd = Command::new(helm());
    cmd.args(["template", "vaphelm", "--namespace", ns, "--kube-version", "1.30.0"])
        .arg(repo_root().join("deploy/helm/local-static-provisioner"));
    for set in sets {
        cmd.args(["--set", set]);
    }
    documents(&String::from_utf8(run(&mut cmd).stdout).unwrap())
}

fn matched_user(policy: &Value) -> String {
    policy["spec"]["matchConditions"][0]["expression"].as_str().unwrap().to_string()
}

#[test]
fn helm_policy_renders_the_release_and_lets_the_real_agent_work() {
    let _area = support::area(module_path!());
    let ns = "vap-helm-ns";
    // Rendering: the release's ServiceAccounts and the roots of its classes, cleaned; the
    // node-cleanup policy only with node-cleanup.
    let docs = helm_template(
        ns,
        &[
            "serviceAccount.name=vap.helm-agent".into(),
            "classes[0].name=a".into(),
            "classes[0].hostDir=/mnt/a//disks/".into(),
            "classes[1].name=b".into(),
            "classes[1].hostDir=/mnt/b".into(),
            "classes[2].name=c".into(),
            "classes[2].hostDir=/mnt/b/".into(),
            "classes[1].encryption=fscrypt".into(),
            "nodeCleanup.enabled=true".into(),
            "nodeCleanup.storageClasses={a}".into(),
        ],
    );
    let policy = find(&docs, "ValidatingAdmissionPolicy", "vaphelm-local-static-provisioner-node-scope");
    assert_eq!(roots(policy), ["/mnt/a/disks", "/mnt/b"]);
    // The encrypting classes' roots (variable 1): b's only.
    assert_eq!(policy["spec"]["variables"][1]["name"], "encryptedRoots", "overlays patch variable 1");
    assert_eq!(variable(policy, "encryptedRoots"), "['/mnt/b']");
    assert!(matched_user(policy).contains(&format!("'^system:serviceaccount:{ns}:vap[.]helm-agent$'")));
    assert_eq!(
        find(&docs, "ValidatingAdmissionPolicyBinding", "vaphelm-local-static-provisioner-node-scope")["spec"]["policyName"],
        "vaphelm-local-static-provisioner-node-scope"
    );
    let cleanup = find(&docs, "ValidatingAdmissionPolicy", "vaphelm-local-static-provisioner-node-cleanup-scope");
    assert!(
        matched_user(cleanup)
            .contains(&format!("'^system:serviceaccount:{ns}:vaphelm-local-static-provisioner-node-cleanup$'"))
    );
    let binding =
        find(&docs, "ValidatingAdmissionPolicyBinding", "vaphelm-local-static-provisioner-node-cleanup-scope");
    assert_eq!(binding["spec"]["policyName"], "vaphelm-local-static-provisioner-node-cleanup-scope");
    // Apart from those substitutions, the policies are the base's.
    let base = documents(&read("deploy/base/admission-policy.yaml"));
    let strip = |p: &Value| {
        let mut p = p.clone();
        p["metadata"]["name"] = json!("x");
        p["spec"]["matchConditions"] = json!(null);
        for v in p["spec"]["variables"].as_array_mut().unwrap() {
            if v["name"] == "roots" || v["name"] == "encryptedRoots" {
                v["expression"] = json!(null);
            }
        }
        p
    };
    assert_eq!(strip(policy), strip(find(&base, "ValidatingAdmissionPolicy", AGENT_POLICY)));
    assert_eq!(strip(cleanup), strip(find(&base, "ValidatingAdmissionPolicy", CLEANUP_POLICY)));
    // The fence policy: the same agent, its own name.
    let fence_policy = find(&docs, "ValidatingAdmissionPolicy", "vaphelm-local-static-provisioner-node-fence");
    assert_eq!(matched_user(fence_policy), matched_user(policy));
    assert_eq!(
        find(&docs, "ValidatingAdmissionPolicyBinding", "vaphelm-local-static-provisioner-node-fence")["spec"]["policyName"],
        "vaphelm-local-static-provisioner-node-fence"
    );
    assert_eq!(strip(fence_policy), strip(find(&base, "ValidatingAdmissionPolicy", FENCE_POLICY)));
    // The inventory policy: the same agent, its own name.
    let inventory_policy = find(&docs, "ValidatingAdmissionPolicy", "vaphelm-local-static-provisioner-inventory");
    assert_eq!(matched_user(inventory_policy), matched_user(policy));
    assert_eq!(
        find(&docs, "ValidatingAdmissionPolicyBinding", "vaphelm-local-static-provisioner-inventory")["spec"]["policyName"],
        "vaphelm-local-static-provisioner-inventory"
    );
    assert_eq!(strip(inventory_policy), strip(find(&base, "ValidatingAdmissionPolicy", INVENTORY_POLICY)));
    // The heartbeat policy: the same agent, its own name; node-cleanup's fence: node-cleanup's.
    let heartbeat_policy = find(&docs, "ValidatingAdmissionPolicy", "vaphelm-local-static-provisioner-heartbeat");
    assert_eq!(matched_user(heartbeat_policy), matched_user(policy));
    assert_eq!(
        find(&docs, "ValidatingAdmissionPolicyBinding", "vaphelm-local-static-provisioner-heartbeat")["spec"]["policyName"],
        "vaphelm-local-static-provisioner-heartbeat"
    );
    assert_eq!(strip(heartbeat_policy), strip(find(&base, "ValidatingAdmissionPolicy", HEARTBEAT_POLICY)));
    let cleanup_fence = find(&docs, "ValidatingAdmissionPolicy", "vaphelm-local-static-provisioner-node-cleanup-fence");
    assert_eq!(matched_user(cleanup_fence), matched_user(cleanup));
    assert_eq!(
        find(&docs, "ValidatingAdmissionPolicyBinding", "vaphelm-local-static-provisioner-node-cleanup-fence")["spec"]
            ["policyName"],
        "vaphelm-local-static-provisioner-node-cleanup-fence"
    );
    assert_eq!(strip(cleanup_fence), strip(find(&base, "ValidatingAdmissionPolicy", CLEANUP_FENCE_POLICY)));
    // What the policies narrow is what the chart grants: the base's ClusterRole (nodes patch
    // and the LocalStorageNode rules included).
    let base_rbac = documents(&read("deploy/base/rbac.yaml"));
    assert_eq!(
        find(&docs, "ClusterRole", "vaphelm-local-static-provisioner-node-clusterrole")["rules"],
        find(&base_rbac, "ClusterRole", "local-static-provisioner")["rules"],
        "templates/rbac.yaml grants other than deploy/base/rbac.yaml"
    );
    let plain = helm_template(ns, &[]);
    assert_eq!(plain.iter().filter(|d| d["kind"].as_str().unwrap().starts_with("ValidatingAdmission")).count(), 8);
    assert!(
        helm_template(ns, &["admissionPolicy.enabled=false".into()])
            .iter()
            .all(|d| !d["kind"].as_str().unwrap().starts_with("ValidatingAdmission"))
    );

    // The real agent under the rendered policy: publishes, adopts an upstream PV, and wipes and
    // publishes again a released one (patches, delete, create), with no request refused.
    if !require_root("helm_policy_renders_the_release_and_lets_the_real_agent_work (agent part)") {
        return;
    }
    let cp = ControlPlane::get();
    let test = "vap-helm";
    let node = "vap-helm-node";
    let uid = cp.create_node(node);
    let class = "vap-helm-fs";
    cp.create_storage_class(class, "Delete");
    let tmp = tempfile::tempdir().unwrap();
    let fs_dir = tmp.path().join("fs");
    let _v1 = mount_tmpfs(&fs_dir.join("vol1"), 8);
    let _v2 = mount_tmpfs(&fs_dir.join("vol2"), 8);
    let sa = "vap-helm-agent";
    let docs = helm_template(
        ns,
        &[
            format!("serviceAccount.name={sa}"),
            format!("classes[0].name={class}"),
            format!("classes[0].hostDir={}/", fs_dir.display()),
        ],
    );
    let mut scratch = Scratch::new(&cp, test);
    let pick = |kinds: &[&str]| -> String {
        let items: Vec<&Value> = docs.iter().filter(|d| kinds.contains(&d["kind"].as_str().unwrap())).collect();
        json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
    };
    let _ = cp.kubectl(&["create", "namespace", ns]);
    cp.apply(&pick(&["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]));
    scratch.apply_policies(&pick(&["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]));
    let kubeconfig = pod_bound_kubeconfig(&cp, tmp.path(), ns, sa, node);
    let probe = agent_pv(test, "vap-helm-probe", node, &uid, "/mnt/fast-disks/probe");
    wait_enforced(&scratch, &kubeconfig, &probe, &format!("is not directly under one of [{}]", fs_dir.display()));

    // What upstream made for vol1 (no label of ours), to be adopted.
    let upstream = pv_name("vol1", node, class);
    admin_create(
        &cp,
        &json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": upstream, "labels": {"vap-test": test}, "annotations": {PROVISIONED_BY: format!("local-volume-provisioner-{node}-{uid}")}},
            "spec": {
                "capacity": {"storage": "8Mi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": class,
                "persistentVolumeReclaimPolicy": "Delete",
                "volumeMode": "Filesystem",
                "local": {"path": format!("{}/vol1", fs_dir.display())},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [hostname(node)]}}
            }
        }),
    );
    let config = tmp.path().join("config");
    let class_map = format!("{class}:\n  hostDir: {d}/\n  mountDir: {d}\n", d = fs_dir.display());
    write_config(&config, &[("storageClassMap", &class_map), ("labelsForPV", "vap-test: vap-helm\n")]);
    let agent = AgentProcess::start(&config, node, &kubeconfig, &tmp.path().join("agent.log"));
    let published = pv_name("vol2", node, class);
    wait_until("vol2 published", WAIT, || (cp.pv_state(&published)?.1 == "Available").then_some(()));
    wait_until("vol1 adopted", WAIT, || {
        let pv = cp.get_json(&["pv", &upstream])?;
        let finalizers = pv["metadata"]["finalizers"].as_array()?.clone();
        (pv["metadata"]["labels"][LABEL] == node && finalizers.contains(&json!(WIPE))).then_some(())
    });
    let bound = cp.bind_claim("vap-helm-claim", class, false);
    let bound_uid = cp.pv_state(&bound).unwrap().0;
    cp.release_claim("vap-helm-claim");
    wait_until(&format!("{bound} wiped and published again"), WAIT, || {
        let (uid, phase) = cp.pv_state(&bound)?;
        (uid != bound_uid && phase == "Available").then_some(())
    });
    let log = agent.stop();
    assert!(!log.contains("denied request"), "the agent was refused something:\n{log}");
    assert!(!log.contains("ValidatingAdmissionPolicy"), "the agent was refused something:\n{log}");

    // A class whose hostDir the policy does not allow: the API refuses its PV, and the agent
    // says so in a Warning event on the Node (once), not only in its log.
    let outside = tmp.path().join("outside-roots");
    let _v3 = mount_tmpfs(&outside.join("vol3"), 8);
    let class2 = "vap-helm-outside";
    cp.create_storage_class(class2, "Delete");
    let class_map = format!(
        "{class}:\n  hostDir: {d}/\n  mountDir: {d}\n{class2}:\n  hostDir: {o}\n  mountDir: {o}\n",
        d = fs_dir.display(),
        o = outside.display()
    );
    write_config(&config, &[("storageClassMap", &class_map), ("labelsForPV", "vap-test: vap-helm\n")]);
    let agent = AgentProcess::start(&config, node, &kubeconfig, &tmp.path().join("agent-2.log"));
    let refused = pv_name("vol3", node, class2);
    wait_until("the refused create reported in an event", WAIT, || {
        cp.has_event(node, "VolumeNotPublished", &format!("not published as {refused}: the API refused it"))
            .then_some(())
    });
    assert!(cp.pv_state(&refused).is_none());
    drop(agent);
}

// The node inventory (issue 31): LocalStorageNodes, one per Node, each written by its node's
// agent only.

const INVENTORY_CRD: &str = "localstoragenodes.local-static-provisioner.io";
const INVENTORY_API: &str = "local-static-provisioner.io/v1alpha1";

/// deploy/base/crd.yaml applied and established (tests of this binary share it).
fn install_inventory_crd(cp: &ControlPlane) {
    cp.apply(&read("deploy/base/crd.yaml"));
    cp.wait_crd_established(INVENTORY_CRD);
}

/// A LocalStorageNode as the agent creates it (src/api/inventory.rs): named after `node`,
/// spec.nodeName `node`, owned by the Node `owner` with UID `owner_uid`, and nothing else (no
/// labels: the policy refuses them on create; `scratch` removes it by name).
fn inventory(scratch: &mut Scratch, node: &str, owner: &str, owner_uid: &str) -> Value {
    if !scratch.inventories.iter().any(|n| n == node) {
        scratch.inventories.push(node.to_string());
    }
    json!({
        "apiVersion": INVENTORY_API,
        "kind": "LocalStorageNode",
        "metadata": {
            "name": node,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": owner, "uid": owner_uid}]
        },
        "spec": {"nodeName": node}
    })
}

/// A status as the agent applies it, with one used-disk record.
fn inventory_status(name: &str, node: &str, disk: &str) -> Value {
    json!({
        "apiVersion": INVENTORY_API,
        "kind": "LocalStorageNode",
        "metadata": {"name": name},
        "status": {
            "nodeName": node,
            "summary": {"disks": 1, "claimed": 1, "volumes": 1, "available": 0, "problems": 0},
            "usedDisks": [{
                "identity": format!("blk:serial={disk}"),
                "pv": format!("local-pv-{disk}"),
                "path": format!("{ROOT}/{disk}"),
                "at": "2026-11-28T12:00:00Z",
                "claimed": true
            }]
        }
    })
}

/// Server-side apply of a status as `kubeconfig`, as the agent sends it (src/api/inventory.rs:
/// field manager local-static-provisioner, forced, on the status subresource).
fn apply_status(cp: &ControlPlane, kubeconfig: &Path, status: &Value) -> Output {
    as_user(cp, kubeconfig, support::APPLY_STATUS, Some(status))
}

fn patch_inventory(
    cp: &ControlPlane,
    kubeconfig: &Path,
    name: &str,
    kind: &str,
    patch: &Value,
    status: bool,
) -> Output {
    let patch = patch.to_string();
    let mut args = vec!["patch", "localstoragenode", name, "--type", kind, "-p", &patch];
    if status {
        args.push("--subresource=status");
    }
    as_user(cp, kubeconfig, &args, None)
}

/// The used-disk records of a LocalStorageNode, as the admin sees them.
fn used_disks(cp: &ControlPlane, name: &str) -> Value {
    cp.get_json(&["localstoragenode", name]).unwrap()["status"]["usedDisks"].clone()
}

#[test]
fn base_inventory_policy_matches_the_agent_as_the_pv_policy_does() {
    let _area = support::area(module_path!());
    let docs = documents(&read("deploy/base/admission-policy.yaml"));
    let pv_policy = find(&docs, "ValidatingAdmissionPolicy", AGENT_POLICY);
    let policy = find(&docs, "ValidatingAdmissionPolicy", INVENTORY_POLICY);
    assert_eq!(policy["spec"]["matchConditions"], pv_policy["spec"]["matchConditions"]);
    assert_eq!(variable(policy, "node"), variable(pv_policy, "node"), "the node-name claim");
    assert_eq!(
        find(&docs, "ValidatingAdmissionPolicyBinding", INVENTORY_POLICY)["spec"]["policyName"],
        INVENTORY_POLICY
    );
    // The object and its status subresource (the agent's only write after the create), in the
    // version crd.yaml serves.
    let crd: Value = serde_saphyr::from_str(&read("deploy/base/crd.yaml")).unwrap();
    let versions: Vec<&str> =
        crd["spec"]["versions"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(
        policy["spec"]["matchConstraints"]["resourceRules"],
        json!([{
            "apiGroups": [crd["spec"]["group"]],
            "apiVersions": versions,
            "operations": ["CREATE", "UPDATE", "DELETE"],
            "resources": ["localstoragenodes", "localstoragenodes/status"]
        }])
    );
}

#[test]
fn agent_writes_only_its_own_nodes_inventory() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let test = "vap-inv";
    let (ns, sa) = ("vap-inv", "vap-inv-agent");
    let (a, b) = ("vap-inv-a", "vap-inv-b");
    let uid_a = cp.create_node(a);
    let uid_b = cp.create_node(b);
    install_inventory_crd(&cp);
    apply_agent_rbac(&cp);
    // The extra RBAC an earlier run granted at its end (kept for the policy's belt and braces
    // below) would let the RBAC checks pass: gone before this run.
    let _ = cp.kubectl(&["delete", "clusterrolebinding,clusterrole", &format!("{test}-extra"), "--ignore-not-found"]);
    service_account(&cp, ns, sa, "local-static-provisioner");
    let mut scratch = Scratch::new(&cp, test);
    scratch.apply_policies(&policies_for(&read("deploy/base/admission-policy.yaml"), test, Some(sa), Some("none")));
    let tmp = tempfile::tempdir().unwrap();
    let agent = pod_bound_kubeconfig(&cp, tmp.path(), ns, sa, a);
    let no_node = plain_kubeconfig(&cp, tmp.path(), ns, sa);
    let own_a = inventory(&mut scratch, a, a, &uid_a);
    let own_b = inventory(&mut scratch, b, b, &uid_b);
    // `kubectl patch --subresource=status` reads the subresource before it patches (the agent's
    // server-side apply does not, so its role has no such get): this test's ServiceAccount may
    // read it, so that its merge and JSON patches of a status reach the API server's checks.
    cp.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: {test}-read-status}}\nrules: [{{apiGroups: [local-static-provisioner.io], resources: [localstoragenodes/status], verbs: [get]}}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: {test}-read-status}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {test}-read-status}}\nsubjects: [{{kind: ServiceAccount, name: {sa}, namespace: {ns}}}]\n"
    ));

    // Enforced once creating B's object is refused (one created before that is removed).
    let only_own = format!("the agent of node {a} may only write the LocalStorageNode {a}, not {b}");
    wait_until("the policy to be enforced", WAIT, || {
        let out = create(&cp, &agent, &own_b);
        if out.status.success() {
            cp.kubectl_ok(&["delete", "localstoragenode", b, "--wait=true"]);
            return None;
        }
        stderr(&out).contains(&only_own).then_some(())
    });

    // Refused creates, each leaving no object behind: another node's object, its own with
    // another node in it, or owned by anything but its Node alone.
    let owned_alone = format!(
        "the agent of node {a} may only create its LocalStorageNode owned by its Node alone (one ownerReference: apiVersion v1, kind Node, name {a})"
    );
    let spec_b = spec_b_of(a, b);
    let as_the_agent =
        format!("the agent of node {a} may only create its LocalStorageNode as the agent does, without ");
    let owner =
        |api: &str, kind: &str, name: &str| json!({"apiVersion": api, "kind": kind, "name": name, "uid": uid_a});
    let refused = [
        ("B's object", own_b.clone(), only_own.clone()),
        (
            "B's object owned by Node A",
            with(own_b.clone(), |o| o["metadata"]["ownerReferences"][0] = owner("v1", "Node", a)),
            only_own.clone(),
        ),
        ("B's name with A's spec", with(own_b.clone(), |o| o["spec"]["nodeName"] = json!(a)), only_own.clone()),
        (
            "its own owned by Node B",
            with(own_a.clone(), |o| {
                o["metadata"]["ownerReferences"][0] =
                    json!({"apiVersion": "v1", "kind": "Node", "name": b, "uid": uid_b})
            }),
            owned_alone.clone(),
        ),
        ("its own with spec.nodeName B", with(own_a.clone(), |o| o["spec"]["nodeName"] = json!(b)), spec_b),
        (
            "its own with no owner",
            with(own_a.clone(), |o| {
                o["metadata"].as_object_mut().unwrap().remove("ownerReferences");
            }),
            owned_alone.clone(),
        ),
        (
            "its own owned by Nodes A and B",
            with(own_a.clone(), |o| {
                o["metadata"]["ownerReferences"] = json!([owner("v1", "Node", a), owner("v1", "Node", b)])
            }),
            owned_alone.clone(),
        ),
        (
            "its own owned by Node A and a ConfigMap",
            with(own_a.clone(), |o| {
                o["metadata"]["ownerReferences"] = json!([owner("v1", "Node", a), owner("v1", "ConfigMap", "x")]);
            }),
            owned_alone.clone(),
        ),
        (
            "its own owned by a Pod named A",
            with(own_a.clone(), |o| o["metadata"]["ownerReferences"] = json!([owner("v1", "Pod", a)])),
            owned_alone.clone(),
        ),
        (
            "its own owned by a Node of another API",
            with(own_a.clone(), |o| o["metadata"]["ownerReferences"] = json!([owner("example.com/v1", "Node", a)])),
            owned_alone.clone(),
        ),
        // What an UPDATE may not add, a CREATE may not bring: a foreign finalizer would keep
        // the object past its Node (the garbage collector cannot remove it).
        (
            "its own with a foreign finalizer",
            with(own_a.clone(), |o| o["metadata"]["finalizers"] = json!(["example.com/hold"])),
            format!("{as_the_agent}metadata.finalizers"),
        ),
        (
            "its own with a label",
            with(own_a.clone(), |o| o["metadata"]["labels"] = json!({"example.com/x": "y"})),
            format!("{as_the_agent}metadata.labels"),
        ),
        (
            "its own with an annotation",
            with(own_a.clone(), |o| o["metadata"]["annotations"] = json!({"example.com/x": "y"})),
            format!("{as_the_agent}metadata.annotations"),
        ),
        (
            "its own with all three",
            with(own_a.clone(), |o| {
                o["metadata"]["finalizers"] = json!(["example.com/hold"]);
                o["metadata"]["labels"] = json!({"example.com/x": "y"});
                o["metadata"]["annotations"] = json!({"example.com/x": "y"});
            }),
            format!("{as_the_agent}metadata.finalizers, metadata.labels, metadata.annotations"),
        ),
    ];
    for (what, obj, why) in refused {
        assert_denied(&create(&cp, &agent, &obj), what, &why);
        let name = obj["metadata"]["name"].as_str().unwrap();
        assert!(cp.get_json(&["localstoragenode", name]).is_none(), "{what}: {name} exists after a refusal");
    }
    assert_denied(&create(&cp, &no_node, &own_a), "a token without node: create", "no node name");

    // Allowed: its own, exactly as the agent creates it; a second create is AlreadyExists
    // (what the agent takes as done), not a refusal.
    assert_allowed(&create(&cp, &agent, &own_a), "creating its own LocalStorageNode");
    let again = create(&cp, &agent, &own_a);
    assert!(!again.status.success() && stderr(&again).contains("AlreadyExists"), "{}", stderr(&again));
    let stored = cp.get_json(&["localstoragenode", a]).unwrap();
    assert_eq!(stored["metadata"]["ownerReferences"][0]["uid"], uid_a.as_str());

    // Its status, as the agent writes it (server-side apply), and a merge patch of it that
    // leaves status.nodeName out (checked only when present).
    assert_allowed(&apply_status(&cp, &agent, &inventory_status(a, a, "a1")), "applying its own status");
    assert_eq!(used_disks(&cp, a)[0]["identity"], "blk:serial=a1");
    let summary = json!({"status": {"summary": {"problems": 2}}});
    assert_allowed(&patch_inventory(&cp, &agent, a, "merge", &summary, true), "a merge patch of its status");
    assert_eq!(cp.get_json(&["localstoragenode", a]).unwrap()["status"]["summary"]["problems"], 2);
    // Its status naming another node.
    let status_b = format!("the agent of node {a} may only write a LocalStorageNode status with nodeName {a}, not {b}");
    assert_denied(&apply_status(&cp, &agent, &inventory_status(a, b, "a1")), "its status naming B", &status_b);
    let node_b = json!({"status": {"nodeName": b}});
    assert_denied(&patch_inventory(&cp, &agent, a, "merge", &node_b, true), "its status.nodeName set to B", &status_b);

    // B's object, made by B's agent (here: the admin) with a used-disk record: A's token cannot
    // touch its status, so cannot clear B's record in any form.
    admin_create(&cp, &own_b);
    let applied = cp.kubectl_stdin(
        &cp.kubeconfig,
        &["apply", "--server-side", "--field-manager=vap-inv-b-agent", "--subresource=status", "-f", "-"],
        Some(&inventory_status(b, b, "b1").to_string()),
    );
    assert!(applied.status.success(), "B's status: {}", stderr(&applied));
    let b_record = used_disks(&cp, b);
    assert_eq!(b_record[0]["identity"], "blk:serial=b1");
    let b_before = cp.get_json(&["localstoragenode", b]).unwrap()["metadata"]["resourceVersion"].clone();
    let cleared = with(inventory_status(b, b, "b1"), |s| s["status"]["usedDisks"] = json!([]));
    assert_denied(&apply_status(&cp, &agent, &cleared), "clearing B's used disks (apply)", &only_own);
    let as_a = with(inventory_status(b, a, "a1"), |s| s["status"]["usedDisks"] = json!([]));
    assert_denied(&apply_status(&cp, &agent, &as_a), "B's status rewritten as A's", &only_own);
    let null_disks = json!({"status": {"usedDisks": null}});
    assert_denied(
        &patch_inventory(&cp, &agent, b, "merge", &null_disks, true),
        "clearing B's used disks (merge)",
        &only_own,
    );
    let remove = json!([{"op": "remove", "path": "/status/usedDisks"}]);
    assert_denied(&patch_inventory(&cp, &agent, b, "json", &remove, true), "clearing B's used disks (json)", &only_own);
    assert_denied(&patch_inventory(&cp, &agent, b, "merge", &summary, true), "any change to B's status", &only_own);
    assert_denied(&patch_inventory(&cp, &no_node, a, "merge", &summary, true), "a token without node", "no node name");
    let b_after = cp.get_json(&["localstoragenode", b]).unwrap();
    assert_eq!(b_after["metadata"]["resourceVersion"], b_before, "B's object changed: {b_after}");
    assert_eq!(used_disks(&cp, b), b_record);

    // RBAC: the object itself is not the agent's to change or delete, its own included.
    let spec_change = json!({"spec": {"nodeName": b}});
    for (what, name) in [("its own", a), ("B's", b)] {
        let out = patch_inventory(&cp, &agent, name, "merge", &spec_change, false);
        assert_denied(&out, &format!("patching {what} object"), "cannot patch resource \"localstoragenodes\"");
        let out = as_user(&cp, &agent, &["delete", "localstoragenode", name, "--wait=false"], None);
        assert_denied(&out, &format!("deleting {what} object"), "cannot delete resource \"localstoragenodes\"");
    }

    // Belt and braces: with more RBAC than shipped (rbac.extraRules, say), the policy still
    // keeps the object as created and refuses deletes.
    cp.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: {test}-extra}}\nrules: [{{apiGroups: [local-static-provisioner.io], resources: [localstoragenodes], verbs: [update, patch, delete]}}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: {test}-extra}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {test}-extra}}\nsubjects: [{{kind: ServiceAccount, name: {sa}, namespace: {ns}}}]\n"
    ));
    let no_delete = format!("the agent of node {a} may not delete a LocalStorageNode");
    wait_until("the extra RBAC", WAIT, || {
        let out = as_user(&cp, &agent, &["delete", "localstoragenode", a, "--wait=false"], None);
        assert!(!out.status.success(), "A's object was deleted");
        stderr(&out).contains(&no_delete).then_some(())
    });
    assert_denied(
        &as_user(&cp, &agent, &["delete", "localstoragenode", b, "--wait=false"], None),
        "deleting B's object",
        &no_delete,
    );
    let only_status = format!("the agent of node {a} may change only the status of its LocalStorageNode, not ");
    let other_owner = json!([{"apiVersion": "v1", "kind": "Node", "name": b, "uid": uid_b}]);
    for (what, patch, named) in [
        ("spec.nodeName", spec_change.clone(), None),
        ("the owner", json!({"metadata": {"ownerReferences": other_owner}}), Some("metadata.ownerReferences")),
        ("a finalizer", json!({"metadata": {"finalizers": ["example.com/hold"]}}), Some("metadata.finalizers")),
        ("a label", json!({"metadata": {"labels": {"example.com/x": "y"}}}), Some("metadata.labels")),
        ("an annotation", json!({"metadata": {"annotations": {"example.com/x": "y"}}}), Some("metadata.annotations")),
    ] {
        let out = patch_inventory(&cp, &agent, a, "merge", &patch, false);
        // A new spec.nodeName is refused first for not being A (both messages say why).
        let why = named.map_or(spec_b_of(a, b), |n| format!("{only_status}{n}"));
        assert_denied(&out, &format!("changing {what} of its own object"), &why);
    }
    assert_denied(&patch_inventory(&cp, &agent, b, "merge", &summary, false), "patching B's object", &only_own);
    let stored_after = cp.get_json(&["localstoragenode", a]).unwrap();
    assert_eq!(stored_after["metadata"]["ownerReferences"], stored["metadata"]["ownerReferences"]);
    assert_eq!(stored_after["spec"], stored["spec"]);
    assert!(cp.get_json(&["localstoragenode", b]).is_some(), "B's object is gone");
}

fn spec_b_of(a: &str, b: &str) -> String {
    format!("the agent of node {a} may only write a LocalStorageNode with spec.nodeName {a}, not {b}")
}

/// A LocalStorageNode owned by its Node goes with it: kube-controller-manager's garbage
/// collector deletes it once the Node is deleted; another Node's stays.
#[test]
fn inventory_is_deleted_with_its_node() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let test = "vap-inv-gc";
    let (gone, kept) = ("vap-inv-gc-gone", "vap-inv-gc-kept");
    let uid_gone = cp.create_node(gone);
    let uid_kept = cp.create_node(kept);
    install_inventory_crd(&cp);
    let mut scratch = Scratch::new(&cp, test);
    admin_create(&cp, &inventory(&mut scratch, gone, gone, &uid_gone));
    admin_create(&cp, &inventory(&mut scratch, kept, kept, &uid_kept));
    let applied = cp.kubectl_stdin(
        &cp.kubeconfig,
        &["apply", "--server-side", "--field-manager=vap-inv-gc", "--subresource=status", "-f", "-"],
        Some(&inventory_status(gone, gone, "gc1").to_string()),
    );
    assert!(applied.status.success(), "{}", stderr(&applied));
    // The garbage collector has seen the object (it would also delete one whose owner never
    // existed): still there a moment later.
    std::thread::sleep(Duration::from_secs(2));
    assert!(cp.get_json(&["localstoragenode", gone]).is_some(), "collected while its Node exists");
    cp.kubectl_ok(&["delete", "node", gone, "--wait=true"]);
    wait_until("the garbage collector to delete the LocalStorageNode", WAIT, || {
        cp.get_json(&["localstoragenode", gone]).is_none().then_some(())
    });
    assert!(cp.get_json(&["localstoragenode", kept]).is_some(), "another Node's LocalStorageNode went too");
}

/// A Lease in `ns` named `name`, held by `holder`, as the agent's heartbeat writes it.
fn heartbeat_lease(ns: &str, name: &str, holder: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 40, "renewTime": "2026-11-29T02:00:00.000000Z"}
    })
}

#[test]
fn agent_writes_only_its_own_nodes_heartbeat_lease() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let test = "vap-hb";
    let (ns, sa) = ("vap-hb", "vap-hb-agent");
    let (a, b) = ("vap-hb-a", "vap-hb-b");
    cp.create_node(a);
    cp.create_node(b);
    apply_agent_rbac(&cp);
    service_account(&cp, ns, sa, "local-static-provisioner");
    // deploy/base/rbac.yaml's Role on Leases, for this namespace.
    cp.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: {sa}, namespace: {ns}}}\nrules: [{{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, create, update]}}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: {sa}, namespace: {ns}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {sa}}}\nsubjects: [{{kind: ServiceAccount, name: {sa}, namespace: {ns}}}]\n"
    ));
    let mut scratch = Scratch::new(&cp, test);
    scratch.apply_policies(&policies_for(&read("deploy/base/admission-policy.yaml"), test, Some(sa), Some("none")));
    let tmp = tempfile::tempdir().unwrap();
    let agent = pod_bound_kubeconfig(&cp, tmp.path(), ns, sa, a);
    let no_node = plain_kubeconfig(&cp, tmp.path(), ns, sa);
    let (own, other) = (format!("local-static-provisioner-agent-{a}"), format!("local-static-provisioner-agent-{b}"));
    for name in [&own, &other] {
        let _ = cp.kubectl(&["delete", "lease", "-n", ns, name, "--ignore-not-found"]);
    }
    let only_own = format!("the agent of node {a} may only write its heartbeat Lease {own}, not {other}");
    wait_until("the policy to be enforced", WAIT, || {
        let out = create(&cp, &agent, &heartbeat_lease(ns, &other, b));
        if out.status.success() {
            cp.kubectl_ok(&["delete", "lease", "-n", ns, &other]);
            return None;
        }
        stderr(&out).contains(&only_own).then_some(())
    });
    // Refused: another node's heartbeat (held by it or by A), its own held by another node,
    // any Lease without the node-name claim.
    assert_denied(&create(&cp, &agent, &heartbeat_lease(ns, &other, a)), "B's heartbeat held by A", &only_own);
    assert_denied(
        &create(&cp, &agent, &heartbeat_lease(ns, "some-lease", a)),
        "another Lease",
        &format!("may only write its heartbeat Lease {own}, not some-lease"),
    );
    let held_by = |h: &str| {
        format!("the agent of node {a} may only hold its heartbeat Lease itself (holderIdentity {a}), not {h}")
    };
    assert_denied(&create(&cp, &agent, &heartbeat_lease(ns, &own, b)), "its own held by B", &held_by(b));
    // (kubectl trims the message's end, an empty holder.)
    assert_denied(&create(&cp, &agent, &heartbeat_lease(ns, &own, "")), "its own released", held_by("").trim_end());
    assert_denied(
        &create(&cp, &no_node, &heartbeat_lease(ns, &own, a)),
        "a token without the node-name claim",
        "the agent's token carries no node name",
    );
    assert!(cp.get_json(&["lease", "-n", ns, &other]).is_none() && cp.get_json(&["lease", "-n", ns, &own]).is_none());
    // Allowed: its own, held by its node, created and renewed.
    assert_allowed(&create(&cp, &agent, &heartbeat_lease(ns, &own, a)), "its own heartbeat");
    // An update with the resourceVersion read, as the agent renews (its role has no patch).
    let renew = |holder: &str| {
        let mut lease = cp.get_json(&["lease", "-n", ns, &own]).unwrap();
        lease["spec"]["holderIdentity"] = json!(holder);
        lease["spec"]["renewTime"] = json!("2026-11-29T02:00:10.000000Z");
        as_user(&cp, &agent, &["replace", "-f", "-"], Some(&lease))
    };
    assert_allowed(&renew(a), "renewing its own heartbeat");
    assert_denied(&renew(b), "handing its heartbeat to B", &held_by(b));
    cp.kubectl_ok(&["delete", "lease", "-n", ns, &own]);
}

#[test]
fn node_cleanup_only_adds_the_agent_gone_fence_to_a_node() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let test = "vap-ncf";
    let (ns, sa) = ("vap-ncf", "vap-ncf-cleanup");
    let node = "vap-ncf-a";
    cp.create_node(node);
    cp.apply(&read("deploy/base/namespace.yaml"));
    cp.apply(&read("deploy/node-cleanup/rbac.yaml"));
    service_account(&cp, ns, sa, "local-static-provisioner-node-cleanup");
    // `kubectl patch` reads the Node before it patches (node-cleanup's merge patch does not, so
    // its role has no get): this test's ServiceAccount may read Nodes.
    cp.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: {test}-read-nodes}}\nrules: [{{apiGroups: [''], resources: [nodes], verbs: [get]}}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: {test}-read-nodes}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {test}-read-nodes}}\nsubjects: [{{kind: ServiceAccount, name: {sa}, namespace: {ns}}}]\n"
    ));
    let mut scratch = Scratch::new(&cp, test);
    scratch.apply_policies(&policies_for(&read("deploy/base/admission-policy.yaml"), test, Some("none"), Some(sa)));
    let tmp = tempfile::tempdir().unwrap();
    let cleanup = plain_kubeconfig(&cp, tmp.path(), ns, sa);
    let clear = || {
        cp.kubectl_ok(&["label", "node", node, &format!("{UNVERIFIED}-"), "zone-"]);
    };
    clear();
    let only_add = format!("node-cleanup may only add {UNVERIFIED}=agent-gone to a Node that carries no {UNVERIFIED}");
    wait_until("the policy to be enforced", WAIT, || {
        let out = patch_node(&cp, &cleanup, node, &labels(&[("zone", Some("x"))]));
        if out.status.success() {
            clear();
            return None;
        }
        stderr(&out).contains(&only_add).then_some(())
    });
    // Refused: another label, another value, another label with the fence.
    for (what, patch) in [
        ("another value", labels(&[(UNVERIFIED, Some("agent-stopped"))])),
        ("another label with the fence", labels(&[(UNVERIFIED, Some("agent-gone")), ("zone", Some("x"))])),
        ("a per-PV fence", labels(&[(&fence("local-pv-0000fe01"), Some("unverified"))])),
    ] {
        assert_denied(&patch_node(&cp, &cleanup, node, &patch), what, &only_add);
    }
    assert_denied(
        &patch_node(&cp, &cleanup, node, &json!({"metadata": {"annotations": {"x": "y"}}})),
        "an annotation",
        &format!("node-cleanup may change only the label {UNVERIFIED} of a Node, not metadata.annotations"),
    );
    assert_denied(&patch_node(&cp, &cleanup, node, &json!({"spec": {"unschedulable": true}})), "the spec", "not spec");
    assert_eq!(node_labels(&cp, node).get(UNVERIFIED), None);
    // Allowed: the fence, and the same again (no change).
    assert_allowed(&patch_node(&cp, &cleanup, node, &labels(&[(UNVERIFIED, Some("agent-gone"))])), "the fence");
    assert_allowed(&patch_node(&cp, &cleanup, node, &labels(&[(UNVERIFIED, Some("agent-gone"))])), "the same again");
    // Refused once set: changing or removing it (the node's agent lifts it).
    assert_denied(
        &patch_node(&cp, &cleanup, node, &labels(&[(UNVERIFIED, Some("node-booted"))])),
        "another value",
        &only_add,
    );
    assert_denied(&patch_node(&cp, &cleanup, node, &labels(&[(UNVERIFIED, None)])), "lifting it", &only_add);
    // Over a fence set by someone else (agent-stopped), nothing.
    cp.kubectl_ok(&["label", "node", node, "--overwrite", &format!("{UNVERIFIED}=agent-stopped")]);
    assert_denied(
        &patch_node(&cp, &cleanup, node, &labels(&[(UNVERIFIED, Some("agent-gone"))])),
        "replacing another fence",
        &only_add,
    );
    clear();
}

/// The agent's RBAC from deploy/base, with the namespace its Role (the heartbeat Lease) lives
/// in: on a fresh control plane nothing has made that namespace yet.
fn apply_agent_rbac(cp: &ControlPlane) {
    cp.apply(&read("deploy/base/namespace.yaml"));
    cp.apply(&read("deploy/base/rbac.yaml"));
}

// The start-up taint (upstream's removeNodeNotReadyTaint): the agent of a node may remove the
// configured taint key from its own Node, and no other taint change.

const STARTUP_TAINT: &str = "example.com/storage-not-ready";

/// The shipped policies with variable 0 of the Node policy naming `key`, as
/// deploy/components/startup-taint and the chart write it.
fn with_startup_taint(yaml: &str, key: &str) -> String {
    let base = "- name: startupTaint\n      expression: \"''\"";
    assert!(yaml.contains(base), "the Node policy's startupTaint variable moved");
    yaml.replace(base, &format!("- name: startupTaint\n      expression: \"'{key}'\""))
}

fn taint(key: &str, effect: &str) -> Value {
    json!({"key": key, "effect": effect})
}

/// The Node's taints as the admin sets them (a merge patch replaces the list).
fn set_taints(cp: &ControlPlane, node: &str, taints: &[Value]) {
    cp.kubectl_ok(&["patch", "node", node, "--type=merge", "-p", &json!({"spec": {"taints": taints}}).to_string()]);
}

fn node_taints(cp: &ControlPlane, node: &str) -> Vec<Value> {
    cp.get_json(&["node", node]).unwrap()["spec"]["taints"].as_array().cloned().unwrap_or_default()
}

/// The taints of `node` replaced, as the agent sends it (src/api/nodes.rs: test, then replace).
fn replace_taints(cp: &ControlPlane, kubeconfig: &Path, node: &str, old: &[Value], new: &[Value]) -> Output {
    let patch = json!([
        {"op": "test", "path": "/spec/taints", "value": old},
        {"op": "replace", "path": "/spec/taints", "value": new},
    ]);
    as_user(cp, kubeconfig, &["patch", "node", node, "--type=json", "-p", &patch.to_string()], None)
}

#[test]
fn agent_removes_only_the_startup_taint_of_its_own_node() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let test = "vap-taint";
    let (ns, sa) = ("vap-taint", "vap-taint-agent");
    let (a, b) = ("vap-taint-a", "vap-taint-b");
    cp.create_node(a);
    cp.create_node(b);
    apply_agent_rbac(&cp);
    service_account(&cp, ns, sa, "local-static-provisioner");
    let tmp = tempfile::tempdir().unwrap();
    let agent = pod_bound_kubeconfig(&cp, tmp.path(), ns, sa, a);
    let mine = taint(STARTUP_TAINT, "NoSchedule");
    // No NoExecute taints: the taint manager would evict the pod the tokens are bound to.
    let mine_exec = taint(STARTUP_TAINT, "PreferNoSchedule");
    let cni = json!({"key": "node.cilium.io/agent-not-ready", "value": "true", "effect": "NoSchedule"});
    let dedicated = json!({"key": "dedicated", "value": "storage", "effect": "NoSchedule"});

    // The base policy names no key: the start-up taint is as much out of reach as any other.
    let mut scratch = Scratch::new(&cp, test);
    let base = policies_for(&read("deploy/base/admission-policy.yaml"), test, Some(sa), Some("none"));
    scratch.apply_policies(&base);
    set_taints(&cp, a, &[cni.clone(), mine.clone()]);
    let refused = format!("the agent of node {a} may change only fence labels of its Node, not spec.taints");
    let mut last = String::new();
    let enforced = (0..45).any(|_| {
        let out = replace_taints(&cp, &agent, a, &[cni.clone(), mine.clone()], std::slice::from_ref(&cni));
        if out.status.success() {
            set_taints(&cp, a, &[cni.clone(), mine.clone()]);
        } else {
            last = stderr(&out);
        }
        let done = last.contains(&refused);
        if !done {
            std::thread::sleep(Duration::from_secs(2));
        }
        done
    });
    assert!(enforced, "the base policy was not enforced; the last answer: {last}");
    assert_eq!(node_taints(&cp, a), vec![cni.clone(), mine.clone()]);
    drop(scratch);

    // With the key configured (what the component and the chart render).
    let mut scratch = Scratch::new(&cp, test);
    scratch.apply_policies(&with_startup_taint(&base, STARTUP_TAINT));
    let rest = format!(
        "the agent of node {a} may change only fence labels of its Node and remove its taint {STARTUP_TAINT}, not "
    );
    wait_until("the policy with the key to be enforced", WAIT, || {
        let out = replace_taints(&cp, &agent, a, &[cni.clone(), mine.clone()], &[]);
        if out.status.success() {
            set_taints(&cp, a, &[cni.clone(), mine.clone()]);
            return None;
        }
        stderr(&out).contains(&format!("{rest}spec.taints")).then_some(())
    });

    // Refused: every other change of the taints, with or without the start-up one's removal, and
    // other spec changes along with it; each leaves the Node as it was.
    set_taints(&cp, a, &[cni.clone(), mine.clone(), dedicated.clone()]);
    let before = [cni.clone(), mine.clone(), dedicated.clone()];
    for (what, new, named) in [
        ("another taint removed", vec![mine.clone(), dedicated.clone()], "spec.taints"),
        ("both removed", vec![dedicated.clone()], "spec.taints"),
        ("all removed", vec![], "spec.taints"),
        ("a taint added", vec![cni.clone(), mine.clone(), dedicated.clone(), taint("x", "NoSchedule")], "spec.taints"),
        ("ours removed, one added", vec![cni.clone(), dedicated.clone(), taint("x", "NoSchedule")], "spec.taints"),
        ("ours changed to another effect", vec![cni.clone(), mine_exec.clone(), dedicated.clone()], "spec.taints"),
        ("ours removed, the others reordered", vec![dedicated.clone(), cni.clone()], "spec.taints"),
        (
            "ours removed, another's value changed",
            vec![cni.clone(), json!({"key": "dedicated", "value": "other", "effect": "NoSchedule"})],
            "spec.taints",
        ),
    ] {
        assert_denied(&replace_taints(&cp, &agent, a, &before, &new), what, &format!("{rest}{named}"));
        assert_eq!(node_taints(&cp, a), before.to_vec(), "{what}");
    }
    let with_spec = json!([
        {"op": "replace", "path": "/spec/taints", "value": [cni.clone(), dedicated.clone()]},
        {"op": "add", "path": "/spec/unschedulable", "value": true},
    ]);
    let out = as_user(&cp, &agent, &["patch", "node", a, "--type=json", "-p", &with_spec.to_string()], None);
    assert_denied(&out, "ours removed with unschedulable set", &format!("{rest}spec"));
    // Another Node's start-up taint is not its own.
    set_taints(&cp, b, std::slice::from_ref(&mine));
    let out = replace_taints(&cp, &agent, b, std::slice::from_ref(&mine), &[]);
    assert_denied(&out, "B's start-up taint", &format!("the agent of node {a} may only change its own Node, not {b}"));
    assert_eq!(node_taints(&cp, b), vec![mine.clone()]);
    assert_eq!(node_taints(&cp, a), before.to_vec());

    // Allowed: the start-up taint removed, the others kept in order; then both of its effects
    // at once; then the last taint, leaving none.
    assert_allowed(
        &replace_taints(&cp, &agent, a, &before, &[cni.clone(), dedicated.clone()]),
        "the start-up taint removed",
    );
    assert_eq!(node_taints(&cp, a), vec![cni.clone(), dedicated.clone()]);
    set_taints(&cp, a, &[mine.clone(), cni.clone(), mine_exec.clone()]);
    let out =
        replace_taints(&cp, &agent, a, &[mine.clone(), cni.clone(), mine_exec.clone()], std::slice::from_ref(&cni));
    assert_allowed(&out, "both effects of the start-up taint removed");
    set_taints(&cp, a, std::slice::from_ref(&mine));
    assert_allowed(&replace_taints(&cp, &agent, a, std::slice::from_ref(&mine), &[]), "the only taint removed");
    assert_eq!(node_taints(&cp, a), Vec::<Value>::new());
    // Fence labels are still the agent's to change under the policy with the key.
    let fence_ok = labels(&[(fence("local-pv-0000ab01").as_str(), Some("unverified"))]);
    assert_allowed(&patch_node(&cp, &agent, a, &fence_ok), "a fence under the policy with the key");

    // The real agent: a Node registered with the start-up taint (and a CNI's), a volume to
    // publish; once its PV is published the start-up taint goes and the CNI's stays, with no
    // request refused.
    if !require_root("agent_removes_only_the_startup_taint_of_its_own_node (agent part)") {
        return;
    }
    let node = "vap-taint-node";
    cp.create_node(node);
    set_taints(&cp, node, &[cni.clone(), mine.clone()]);
    let class = "vap-taint-fs";
    cp.create_storage_class(class, "Delete");
    let fs_dir = tmp.path().join("fs");
    let _v1 = mount_tmpfs(&fs_dir.join("vol1"), 8);
    let root = fs_dir.display().to_string();
    let with_root = base.replace("\n        ['/mnt/fast-disks']\n", &format!("\n        ['{root}']\n"));
    drop(scratch);
    let mut scratch = Scratch::new(&cp, test);
    scratch.apply_policies(&with_startup_taint(&with_root, STARTUP_TAINT));
    let kubeconfig = pod_bound_kubeconfig(&cp, tmp.path(), ns, sa, node);
    let probe = agent_pv(test, "vap-taint-probe", node, "x", "/mnt/fast-disks/probe");
    wait_enforced(&scratch, &kubeconfig, &probe, &format!("is not directly under one of [{root}]"));
    let config = tmp.path().join("config");
    let class_map = format!("{class}:\n  hostDir: {root}\n  mountDir: {root}\n");
    write_config(
        &config,
        &[
            ("storageClassMap", &class_map),
            ("labelsForPV", &format!("vap-test: {test}\n")),
            ("removeNodeNotReadyTaint", "true\n"),
            ("provisionerNotReadyNodeTaintKey", &format!("{STARTUP_TAINT}\n")),
        ],
    );
    let started = AgentProcess::start(&config, node, &kubeconfig, &tmp.path().join("agent.log"));
    let published = pv_name("vol1", node, class);
    wait_until("the start-up taint removed", WAIT, || (node_taints(&cp, node) == vec![cni.clone()]).then_some(()));
    // Not before the volume was published.
    assert_eq!(cp.pv_state(&published).map(|s| s.1).as_deref(), Some("Available"));
    wait_until("the removal told on the Node", WAIT, || {
        cp.has_event(node, "StartupTaintRemoved", STARTUP_TAINT).then_some(())
    });
    let log = started.stop();
    assert!(!log.contains("ValidatingAdmissionPolicy"), "the agent was refused something:\n{log}");
    assert!(log.contains("removed the start-up taint"), "{log}");
}

// A rolling swap from upstream under the policies as shipped: while the DaemonSet rolls, some
// nodes still run upstream's agent (v2.9.0, bench/upstream/build.sh) with the same
// ServiceAccount, and its PVs (which carry no label of ours) must not be refused.

/// Upstream's agent on `node`, in a mount namespace of its own where `config` is bound at
/// /etc/provisioner/config (the path it reads); killed when dropped.
struct UpstreamAgent {
    child: std::process::Child,
    log: PathBuf,
}

impl UpstreamAgent {
    fn start(bin: &Path, config: &Path, node: &str, kubeconfig: &Path, log: &Path) -> UpstreamAgent {
        let script = "mount --bind \"$1\" /etc/provisioner/config || exit 1; shift; exec \"$@\"";
        let out = std::fs::File::create(log).unwrap();
        let child = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", script, "sh"])
            .arg(config)
            .arg(bin)
            .arg("--listen-address=127.0.0.1:0")
            .env("MY_NODE_NAME", node)
            .env("MY_NAMESPACE", "default")
            .env("KUBECONFIG", kubeconfig)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("starting upstream's agent");
        UpstreamAgent { child, log: log.to_path_buf() }
    }

    fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for UpstreamAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn rolling_swap_from_upstream_under_the_shipped_policies() {
    let _area = support::area(module_path!());
    let test = "rolling_swap_from_upstream_under_the_shipped_policies";
    if !require_root(test) {
        return;
    }
    let built = Command::new("bash").arg(repo_root().join("bench/upstream/build.sh")).output().unwrap();
    if !built.status.success() {
        cannot_run(test, &format!("upstream v2.9.0 not built: {}", String::from_utf8_lossy(&built.stderr)));
        return;
    }
    let upstream_bin = PathBuf::from(String::from_utf8_lossy(&built.stdout).trim()).join("local-volume-provisioner");
    // The mount point upstream's config is bound onto, on the host: an empty directory, removed
    // again if this test made it.
    let etc = Path::new("/etc/provisioner/config");
    let made_etc = !etc.exists();
    std::fs::create_dir_all(etc).unwrap();
    struct RemoveEtc(bool);
    impl Drop for RemoveEtc {
        fn drop(&mut self) {
            if self.0 {
                let _ = std::fs::remove_dir("/etc/provisioner/config");
                let _ = std::fs::remove_dir("/etc/provisioner");
            }
        }
    }
    let _etc = RemoveEtc(made_etc);

    let cp = ControlPlane::get();
    let scratch_name = "vap-swap";
    let (ns, sa) = ("vap-swap", "vap-swap-agent");
    let (old, new) = ("vap-swap-old", "vap-swap-new");
    let old_uid = cp.create_node(old);
    cp.create_node(new);
    apply_agent_rbac(&cp);
    service_account(&cp, ns, sa, "local-static-provisioner");
    let class = "vap-swap-fs";
    cp.create_storage_class(class, "Delete");
    let tmp = tempfile::tempdir().unwrap();
    let (old_dir, new_dir) = (tmp.path().join("old"), tmp.path().join("new"));
    let _o1 = mount_tmpfs(&old_dir.join("vol1"), 8);
    // Two volumes on the old node: upstream's agent runs in a private mount namespace, which
    // sees only what was mounted before it started.
    let _o2 = mount_tmpfs(&old_dir.join("vol2"), 8);
    let _n1 = mount_tmpfs(&new_dir.join("vol1"), 8);
    // The shipped policies, with the two nodes' discovery roots.
    let roots = format!("\n        ['{}', '{}']\n", old_dir.display(), new_dir.display());
    let yaml = policies_for(&read("deploy/base/admission-policy.yaml"), scratch_name, Some(sa), Some("none"))
        .replace("\n        ['/mnt/fast-disks']\n", &roots);
    let mut scratch = Scratch::new(&cp, scratch_name);
    scratch.apply_policies(&with_startup_taint(&yaml, STARTUP_TAINT));
    let old_kc = pod_bound_kubeconfig(&cp, tmp.path(), ns, sa, old);
    let new_kc = pod_bound_kubeconfig(&cp, tmp.path(), ns, sa, new);
    let probe = agent_pv(scratch_name, "vap-swap-probe", old, &old_uid, "/mnt/fast-disks/probe");
    wait_enforced(&scratch, &old_kc, &probe, "is not directly under one of");

    let config = |dir: &Path, name: &str| -> PathBuf {
        let path = tmp.path().join(name);
        let class_map = format!("{class}:\n  hostDir: {d}\n  mountDir: {d}\n", d = dir.display());
        write_config(
            &path,
            &[
                ("storageClassMap", &class_map),
                ("labelsForPV", &format!("vap-test: {scratch_name}\n")),
                ("removeNodeNotReadyTaint", "true\n"),
                ("provisionerNotReadyNodeTaintKey", &format!("{STARTUP_TAINT}\n")),
            ],
        );
        path
    };
    // The old node was registered with a start-up taint, which both agents are configured to
    // remove (upstream v2.9.0's check of its own flag is inverted: it never does).
    let startup = taint(STARTUP_TAINT, "NoSchedule");
    set_taints(&cp, old, std::slice::from_ref(&startup));
    let (old_config, new_config) = (config(&old_dir, "config-old"), config(&new_dir, "config-new"));

    // Mid-rollout: node "old" still runs upstream, node "new" runs ours. Both publish.
    let upstream = UpstreamAgent::start(&upstream_bin, &old_config, old, &old_kc, &tmp.path().join("upstream.log"));
    let ours_new = AgentProcess::start(&new_config, new, &new_kc, &tmp.path().join("ours-new.log"));
    let up_pv = pv_name("vol1", old, class);
    let our_pv = pv_name("vol1", new, class);
    wait_until("upstream's PV on the old node", WAIT, || (cp.pv_state(&up_pv)?.1 == "Available").then_some(()));
    wait_until("our PV on the new node", WAIT, || (cp.pv_state(&our_pv)?.1 == "Available").then_some(()));
    let pv = cp.get_json(&["pv", &up_pv]).unwrap();
    assert!(pv["metadata"]["labels"].get(LABEL).is_none(), "upstream labelled its PV: {pv}");
    assert_eq!(pv["metadata"]["annotations"][PROVISIONED_BY], format!("local-volume-provisioner-{old}-{old_uid}"));
    let up_pv2 = pv_name("vol2", old, class);
    wait_until("upstream's second PV", WAIT, || (cp.pv_state(&up_pv2)?.1 == "Available").then_some(()));
    // Two of upstream's loops (10 s each) have published: its start-up taint is still there.
    assert_eq!(node_taints(&cp, old), vec![startup.clone()], "upstream v2.9.0 removed its start-up taint");
    let up_log = upstream.stop();
    assert!(!up_log.contains("ValidatingAdmissionPolicy"), "upstream's agent was refused:\n{up_log}");

    // The old node's pod replaced: ours adopts upstream's PVs there and publishes a new volume.
    let ours_old = AgentProcess::start(&old_config, old, &old_kc, &tmp.path().join("ours-old.log"));
    for name in [&up_pv, &up_pv2] {
        wait_until(&format!("{name} adopted"), WAIT, || {
            let pv = cp.get_json(&["pv", name])?;
            (pv["metadata"]["labels"][LABEL] == old).then_some(())
        });
    }
    let _o3 = mount_tmpfs(&old_dir.join("vol3"), 8);
    let our_pv3 = pv_name("vol3", old, class);
    wait_until("our PV on the swapped node", WAIT, || (cp.pv_state(&our_pv3)?.1 == "Available").then_some(()));
    wait_until("the start-up taint removed by ours", WAIT, || node_taints(&cp, old).is_empty().then_some(()));
    for agent in [ours_old.stop(), ours_new.stop()] {
        assert!(!agent.contains("ValidatingAdmissionPolicy"), "our agent was refused:\n{agent}");
    }
}

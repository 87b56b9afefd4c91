//! The ValidatingAdmissionPolicy from deploy/base on the real control plane: the agent of node
//! A, with a pod-bound token carrying A's node name, may create, adopt and delete A's PVs and
//! is refused on node B's; a token without a node name is refused outright.

mod support;

use std::process::Output;

use support::{ControlPlane, repo_root};

const NS: &str = "vap-test";
const SA: &str = "vap-agent";

fn pv_yaml(name: &str, label_node: Option<&str>, provisioned_by: &str) -> String {
    let labels =
        label_node.map(|n| format!("  labels: {{local-static-provisioner.io/node: {n}}}\n")).unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: {name}\n{labels}  annotations: {{pv.kubernetes.io/provisioned-by: {provisioned_by}}}\nspec:\n  capacity: {{storage: 1Gi}}\n  accessModes: [ReadWriteOnce]\n  storageClassName: vap-sc\n  local: {{path: /mnt/{name}}}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [x]}}]\n"
    )
}

fn as_agent(cp: &ControlPlane, kubeconfig: &std::path::Path, args: &[&str], stdin: Option<&str>) -> Output {
    cp.kubectl_stdin(kubeconfig, args, stdin)
}

fn assert_allowed(out: &Output, what: &str) {
    assert!(out.status.success(), "{what} must be allowed: {}", String::from_utf8_lossy(&out.stderr));
}

fn assert_denied(out: &Output, what: &str, why: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(why), "{what} must be denied ({why}), got: {err}");
}

#[test]
fn agents_may_only_touch_their_own_nodes_pvs() {
    let cp = ControlPlane::get();
    let (node_a, node_b) = ("vap-node-a", "vap-node-b");
    let uid_a = cp.create_node(node_a);
    let uid_b = cp.create_node(node_b);
    cp.apply(&std::fs::read_to_string(repo_root().join("deploy/base/rbac.yaml")).unwrap());
    cp.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {SA}, namespace: {NS}}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: vap-agent}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: local-static-provisioner}}\nsubjects: [{{kind: ServiceAccount, name: {SA}, namespace: {NS}}}]\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: agent-a, namespace: {NS}}}\nspec:\n  nodeName: {node_a}\n  serviceAccountName: {SA}\n  containers: [{{name: agent, image: local-static-provisioner:test}}]\n"
    ));
    // The shipped policy, bound to this test's ServiceAccount instead of the real one.
    let policy = std::fs::read_to_string(repo_root().join("deploy/base/admission-policy.yaml"))
        .unwrap()
        .replace(
            "system:serviceaccount:local-static-provisioner:local-static-provisioner",
            &format!("system:serviceaccount:{NS}:{SA}"),
        )
        .replace("name: local-static-provisioner-node-scope", "name: vap-test-node-scope")
        .replace("policyName: local-static-provisioner-node-scope", "policyName: vap-test-node-scope");
    cp.apply(&policy);

    let tmp = tempfile::tempdir().unwrap();
    let bound = cp.kubectl_ok(&[
        "create",
        "token",
        SA,
        "-n",
        NS,
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        "agent-a",
    ]);
    let agent_a = cp.token_kubeconfig(tmp.path(), "agent-a", bound.trim());
    let unbound = cp.kubectl_ok(&["create", "token", SA, "-n", NS]);
    let no_node = cp.token_kubeconfig(tmp.path(), "no-node", unbound.trim());

    // Policies take a moment to be enforced after creation: wait until a denial shows.
    let b_label = pv_yaml("vap-b-by-a", Some(node_b), "x");
    support::wait_until("the policy to be enforced", std::time::Duration::from_secs(30), || {
        let out = as_agent(&cp, &agent_a, &["create", "-f", "-"], Some(&b_label));
        (!out.status.success()).then_some(())
    });
    assert_denied(
        &as_agent(&cp, &agent_a, &["create", "-f", "-"], Some(&b_label)),
        "creating a PV of node B",
        "may only change",
    );
    let own = pv_yaml("vap-a-own", Some(node_a), &format!("local-volume-provisioner-{node_a}-{uid_a}"));
    assert_allowed(&as_agent(&cp, &agent_a, &["create", "-f", "-"], Some(&own)), "creating a PV of node A");

    // Node B's PV (made by admin): no delete, no patch, no relabel.
    cp.apply(&pv_yaml("vap-b", Some(node_b), &format!("local-volume-provisioner-{node_b}-{uid_b}")));
    assert_denied(&as_agent(&cp, &agent_a, &["delete", "pv", "vap-b"], None), "deleting B's PV", "may only change");
    let relabel = format!(r#"{{"metadata":{{"labels":{{"local-static-provisioner.io/node":"{node_a}"}}}}}}"#);
    assert_denied(
        &as_agent(&cp, &agent_a, &["patch", "pv", "vap-b", "--type=merge", "-p", &relabel], None),
        "relabelling B's PV",
        "may only change",
    );

    // Adoption of an unlabelled upstream PV: A's is allowed, B's is not.
    cp.apply(&pv_yaml("vap-upstream-a", None, &format!("local-volume-provisioner-{node_a}-{uid_a}")));
    cp.apply(&pv_yaml("vap-upstream-b", None, &format!("local-volume-provisioner-{node_b}-{uid_b}")));
    assert_allowed(
        &as_agent(&cp, &agent_a, &["patch", "pv", "vap-upstream-a", "--type=merge", "-p", &relabel], None),
        "adopting A's upstream PV",
    );
    assert_denied(
        &as_agent(&cp, &agent_a, &["patch", "pv", "vap-upstream-b", "--type=merge", "-p", &relabel], None),
        "adopting B's upstream PV",
        "may only change",
    );

    // Its own PV can be deleted; a token without a node name can do nothing.
    assert_denied(
        &as_agent(&cp, &no_node, &["delete", "pv", "vap-a-own"], None),
        "a token without node",
        "no node name",
    );
    assert_allowed(&as_agent(&cp, &agent_a, &["delete", "pv", "vap-a-own", "--wait=false"], None), "deleting A's PV");
    cp.kubectl_ok(&["delete", "pv", "vap-b", "vap-upstream-a", "vap-upstream-b", "--wait=false"]);
    cp.kubectl_ok(&["delete", "validatingadmissionpolicybinding", "vap-test-node-scope"]);
}

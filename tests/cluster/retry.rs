//! Failed writes are retried with backoff, driven by their own deadlines, not by the periodic
//! resync: the agent runs with the default resync (minutes), an admission policy refuses its
//! creates for a while, and once the policy is lifted the PV appears within the retry delay.
//! Prints how long that took. Needs root.

use crate::support;

use std::time::{Duration, Instant};

use support::{AgentProcess, ControlPlane, mount_tmpfs, require_root, wait_until, write_config};

const WAIT: Duration = Duration::from_secs(90);

#[test]
fn a_create_refused_for_a_while_is_retried_and_converges_soon_after_the_refusal_is_lifted() {
    let _area = support::area(module_path!());
    if !require_root("a_create_refused_for_a_while_is_retried_and_converges_soon_after_the_refusal_is_lifted") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "retry-node";
    cp.create_node(node);
    cp.create_storage_class("retry-fs", "Delete");
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let disks = root.join("disks");
    let prefix = disks.display().to_string();

    // Refuses creating any PV under this test's directory (and nothing else, so tests running
    // at the same time are not touched).
    let policy = format!(
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: retry-test-deny}}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: ["v1"]
      operations: ["CREATE"]
      resources: ["persistentvolumes"]
  validations:
  - expression: "!has(object.spec.local) || !object.spec.local.path.startsWith('{prefix}/')"
    message: "creates under {prefix} are refused for this test"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: retry-test-deny}}
spec:
  policyName: retry-test-deny
  validationActions: [Deny]
"#
    );
    cp.apply(&policy);
    let probe = format!(
        r#"{{"apiVersion":"v1","kind":"PersistentVolume","metadata":{{"name":"retry-probe"}},
            "spec":{{"capacity":{{"storage":"1Gi"}},"accessModes":["ReadWriteOnce"],"storageClassName":"retry-fs",
            "local":{{"path":"{prefix}/probe"}},
            "nodeAffinity":{{"required":{{"nodeSelectorTerms":[{{"matchExpressions":[{{"key":"kubernetes.io/hostname","operator":"In","values":["{node}"]}}]}}]}}}}}}}}"#
    );
    let probe_path = root.join("probe.json");
    std::fs::write(&probe_path, &probe).unwrap();
    let probe_arg = probe_path.display().to_string();
    wait_until("the policy enforced", WAIT, || {
        let out = cp.kubectl(&["create", "--dry-run=server", "-f", &probe_arg]);
        (!out.status.success()).then_some(())
    });

    let _vol = mount_tmpfs(&disks.join("vol1"), 16);
    let config = root.join("config");
    let class_map = format!("retry-fs:\n  hostDir: {prefix}\n  mountDir: {prefix}\n");
    write_config(&config, &[("storageClassMap", &class_map)]);
    let kubeconfig = cp.agent_kubeconfig(root);
    let agent = AgentProcess::start(&config, node, &kubeconfig, &root.join("agent.log"));
    // Refused several times, so the delay has grown.
    wait_until("the create refused a few times", WAIT, || {
        (agent.log_text().matches("creates under").count() >= 4).then_some(())
    });
    assert!(cp.pvs_under(&prefix).is_empty(), "nothing published while refused");

    cp.kubectl_ok(&["delete", "validatingadmissionpolicybinding", "retry-test-deny"]);
    cp.kubectl_ok(&["delete", "validatingadmissionpolicy", "retry-test-deny"]);
    wait_until("the policy lifted", WAIT, || {
        cp.kubectl(&["create", "--dry-run=server", "-f", &probe_arg]).status.success().then_some(())
    });
    let lifted = Instant::now();
    let refusals = agent.log_text().matches("creates under").count();
    wait_until("the PV published after the refusal was lifted", WAIT, || {
        (cp.pvs_under(&prefix).len() == 1).then_some(())
    });
    let converged = lifted.elapsed();
    // A figure, not an assertion: bounded by the retry delay reached (at most 30 s plus
    // jitter), never by the resync (minutes).
    println!(
        "{{\"figure\":\"retry_after_refusal_lifted\",\"refusals\":{refusals},\"seconds\":{:.3}}}",
        converged.as_secs_f64()
    );
    let log = agent.log_text();
    assert!(log.contains("will retry"), "each refusal is logged with its retry");
    assert_eq!(log.matches("periodic resync").count(), 1, "converged without a resync after the first pass");
}

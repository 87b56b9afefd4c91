//! The shipped manifests against the real API server: the kustomize base, the opt-in
//! node-cleanup kustomization and the Helm chart (rendered from a values file written for the
//! upstream chart, with and without node-cleanup) are accepted by a server-side dry run, and
//! the ConfigMap the chart renders is a valid config for the agent. The kustomize components:
//! discovery-dir moves the discovery directory everywhere the base writes it from one value,
//! kubelet-dir does the same for kubelet's directory (of which base and chart mount only the
//! three directories kubelet mounts local volumes in), and monitoring's alerts are the chart's.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use support::{ControlPlane, binary, relative, repo_root, run, write_config};

fn helm() -> PathBuf {
    let out = run(Command::new("bash").arg(repo_root().join("tests/tools/build-helm.sh")));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// `kubectl apply --dry-run=server -f -`: validated and admitted by the API server, not stored.
fn server_dry_run(cp: &ControlPlane, yaml: &str) {
    let out = cp.kubectl_stdin(&cp.kubeconfig, &["apply", "--dry-run=server", "-f", "-"], Some(yaml));
    assert!(out.status.success(), "dry run refused: {}\n{yaml}", String::from_utf8_lossy(&out.stderr));
}

/// The objects of a multi-document YAML stream.
fn documents(yaml: &str) -> Vec<serde_json::Value> {
    yaml.split("\n---")
        .filter_map(|d| serde_saphyr::from_str::<serde_json::Value>(d).ok())
        .filter(|d| d.is_object())
        .collect()
}

fn find<'a>(docs: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind} rendered"))
}

fn find_named<'a>(docs: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

/// The node-cleanup Deployment's container arguments.
fn node_cleanup_args(docs: &[serde_json::Value]) -> Vec<String> {
    let deployment = find(docs, "Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect()
}

#[test]
fn kustomize_base_is_accepted_by_the_api_server() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let _ = cp.kubectl(&["create", "namespace", "local-static-provisioner"]);
    let out = cp.kubectl_ok(&["kustomize", repo_root().join("deploy/base").to_str().unwrap()]);
    for kind in ["DaemonSet", "ClusterRole", "ConfigMap", "StorageClass", "ValidatingAdmissionPolicy"] {
        assert!(out.contains(&format!("kind: {kind}")), "kustomize output lacks {kind}");
    }
    server_dry_run(&cp, &out);
}

#[test]
fn kustomize_node_cleanup_is_accepted_by_the_api_server() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    // Installed after deploy/base, which creates the namespace.
    let _ = cp.kubectl(&["create", "namespace", "local-static-provisioner"]);
    let out = cp.kubectl_ok(&["kustomize", repo_root().join("deploy/node-cleanup").to_str().unwrap()]);
    for kind in ["Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"] {
        assert!(out.contains(&format!("kind: {kind}\n")), "kustomize output lacks {kind}");
    }
    let docs = documents(&out);
    let args = node_cleanup_args(&docs);
    assert_eq!(args[0], "node-cleanup");
    assert!(args.iter().any(|a| a.starts_with("--storage-classes=")), "opt-in classes are explicit: {args:?}");
    let pod = &find(&docs, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "local-static-provisioner-node-cleanup");
    assert_eq!(find(&docs, "Role")["metadata"]["namespace"], "local-static-provisioner", "the Lease's namespace");
    server_dry_run(&cp, &out);
}

/// `kubectl kustomize DIR`.
fn kustomize(cp: &ControlPlane, dir: &Path) -> String {
    cp.kubectl_ok(&["kustomize", dir.to_str().unwrap()])
}

/// The paths of the one class of a rendered base ConfigMap: (hostDir, mountDir).
fn class_dirs(docs: &[serde_json::Value]) -> (String, String) {
    let cm = find_named(docs, "ConfigMap", "local-provisioner-config");
    let classes: serde_json::Value = serde_saphyr::from_str(cm["data"]["storageClassMap"].as_str().unwrap()).unwrap();
    let class = &classes["fast-disks"];
    (class["hostDir"].as_str().unwrap().to_string(), class["mountDir"].as_str().unwrap().to_string())
}

/// The discovery volume of a rendered base DaemonSet: (hostPath, mountPath).
fn daemonset_dirs(docs: &[serde_json::Value]) -> (String, String) {
    let pod = &find_named(docs, "DaemonSet", "local-static-provisioner")["spec"]["template"]["spec"];
    let volume = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "fast-disks").expect("volume");
    let mount = pod["containers"][0]["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "fast-disks");
    let mount = mount.expect("volumeMount");
    (volume["hostPath"]["path"].as_str().unwrap().to_string(), mount["mountPath"].as_str().unwrap().to_string())
}

/// The agent policy's discovery roots: its `roots` variable, a CEL list of single-quoted
/// strings (which YAML reads as a flow sequence).
fn policy_roots(docs: &[serde_json::Value]) -> Vec<String> {
    let policy = find_named(docs, "ValidatingAdmissionPolicy", "local-static-provisioner-node-scope");
    let roots = policy["spec"]["variables"].as_array().unwrap().iter().find(|v| v["name"] == "roots").unwrap();
    let expression = roots["expression"].as_str().unwrap();
    serde_saphyr::from_str(expression).unwrap_or_else(|e| panic!("roots {expression}: {e}"))
}

/// An overlay of deploy/base with deploy/components/discovery-dir and the value `dir`, written
/// as docs/install.md shows it (in a temporary directory, which the caller keeps).
fn moved_dir_overlay(dir: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let base = relative(tmp.path(), &repo_root().join("deploy/base"));
    let component = relative(tmp.path(), &repo_root().join("deploy/components/discovery-dir"));
    std::fs::write(
        tmp.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\n  - discovery-dir.yaml\ncomponents:\n  - {}\n",
            base.display(),
            component.display()
        ),
    )
    .unwrap();
    // The fixture's value file, with another directory.
    let value =
        std::fs::read_to_string(repo_root().join("tests/fixtures/kustomize-moved-dir/discovery-dir.yaml")).unwrap();
    assert!(value.contains("dir: /mnt/other-disks\n"));
    std::fs::write(tmp.path().join("discovery-dir.yaml"), value.replace("/mnt/other-disks", dir)).unwrap();
    tmp
}

/// An overlay that names another discovery directory once (tests/fixtures/kustomize-moved-dir)
/// moves it in the ConfigMap, the DaemonSet and the admission policy, and the API server takes
/// the result.
#[test]
fn kustomize_discovery_dir_is_moved_from_one_value() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let _ = cp.kubectl(&["create", "namespace", "local-static-provisioner"]);
    let out = kustomize(&cp, &repo_root().join("tests/fixtures/kustomize-moved-dir"));
    let docs = documents(&out);
    let new = "/mnt/other-disks";
    assert_eq!(class_dirs(&docs), (new.to_string(), new.to_string()), "the ConfigMap's hostDir and mountDir");
    assert_eq!(daemonset_dirs(&docs), (new.to_string(), new.to_string()), "the DaemonSet's hostPath and mountPath");
    assert_eq!(policy_roots(&docs), [new], "the admission policy's roots");
    // Nowhere else either (the component reaches every place the base writes it), and the
    // value itself is not applied.
    assert!(!out.contains("/mnt/fast-disks"), "the base's directory is left in:\n{out}");
    assert!(!out.contains("local-static-provisioner-discovery-dir"), "the local-config value was rendered:\n{out}");
    server_dry_run(&cp, &out);
}

/// The component given the base's own directory renders exactly the base: it writes the value
/// into the base's places and nothing else.
#[test]
fn kustomize_discovery_dir_with_the_base_value_is_the_base() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let base = kustomize(&cp, &repo_root().join("deploy/base"));
    let docs = documents(&base);
    let old = "/mnt/fast-disks";
    assert_eq!(class_dirs(&docs), (old.to_string(), old.to_string()));
    assert_eq!(daemonset_dirs(&docs), (old.to_string(), old.to_string()));
    assert_eq!(policy_roots(&docs), [old]);
    let overlay = moved_dir_overlay(old);
    assert_eq!(kustomize(&cp, overlay.path()), base, "deploy/components/discovery-dir changes more than the directory");
    // And a value in a place the component does not reach would be left behind: with another
    // value, only the five places change.
    let overlay = moved_dir_overlay("/srv/disks");
    let moved = kustomize(&cp, overlay.path());
    let changed: Vec<(&str, &str)> = base.lines().zip(moved.lines()).filter(|(a, b)| a != b).collect();
    assert_eq!(base.lines().count(), moved.lines().count());
    assert_eq!(changed.len(), 5, "hostDir, mountDir, roots, mountPath, hostPath: {changed:#?}");
    for (a, b) in changed {
        assert_eq!(a.replace(old, "/srv/disks"), b);
    }
}

/// The directories kubelet mounts local volumes in (`KUBELET_LOCAL_VOLUME_DIRS` of core::volumes::volume_safety).
const KUBELET_LOCAL_VOLUME_DIRS: [&str; 3] =
    ["pods", "plugins/kubernetes.io~local-volume", "plugins/kubernetes.io/local-volume"];

/// What a DaemonSet's pod spec mounts from kubelet's directory `kubelet` (or above it): each
/// hostPath volume at or below it, or covering it, as (hostPath, mountPath, readOnly,
/// mountPropagation), sorted.
fn kubelet_mounts_in(pod: &serde_json::Value, kubelet: &str) -> Vec<(String, String, bool, String)> {
    let volumes = pod["volumes"].as_array().unwrap();
    let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
    let mut out: Vec<_> = volumes
        .iter()
        .filter_map(|v| Some((v["name"].as_str()?, v["hostPath"]["path"].as_str()?)))
        .filter(|(_, path)| Path::new(path).starts_with(kubelet) || Path::new(kubelet).starts_with(path))
        .map(|(name, path)| {
            let m = mounts.iter().find(|m| m["name"] == name).unwrap_or_else(|| panic!("{name} is not mounted"));
            (
                path.to_string(),
                m["mountPath"].as_str().unwrap().to_string(),
                m["readOnly"] == true,
                m["mountPropagation"].as_str().unwrap_or("None").to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

fn kubelet_mounts(pod: &serde_json::Value) -> Vec<(String, String, bool, String)> {
    kubelet_mounts_in(pod, "/var/lib/kubelet")
}

/// The three directories below `kubelet`, each mounted read-only at its own path with
/// HostToContainer: what the wipe-while-mounted check needs (docs/security.md), no more.
fn narrow_kubelet_mounts(kubelet: &str) -> Vec<(String, String, bool, String)> {
    let mut out: Vec<_> = KUBELET_LOCAL_VOLUME_DIRS
        .iter()
        .map(|d| (format!("{kubelet}/{d}"), format!("{kubelet}/{d}"), true, "HostToContainer".to_string()))
        .collect();
    out.sort();
    out
}

/// The base and the chart (its defaults, and another kubeletDir) mount the same three
/// directories of kubelet's and nothing else of it: no hostPath of kubelet's directory as a
/// whole (its pki/, other plugins' state), none above it; the agent is told where kubelet's
/// directory is.
#[test]
fn kustomize_and_chart_mount_only_the_directories_kubelet_mounts_local_volumes_in() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let base = documents(&kustomize(&cp, &repo_root().join("deploy/base")));
    let pod = &find(&base, "DaemonSet")["spec"]["template"]["spec"];
    let expected = narrow_kubelet_mounts("/var/lib/kubelet");
    assert_eq!(kubelet_mounts(pod), expected, "deploy/base");
    let env = pod["containers"][0]["env"].as_array().unwrap();
    assert!(env.iter().any(|e| e["name"] == "KUBELET_DIR" && e["value"] == "/var/lib/kubelet"), "{env:?}");
    // No hostPath covers kubelet's credentials.
    for v in pod["volumes"].as_array().unwrap() {
        if let Some(path) = v["hostPath"]["path"].as_str() {
            assert!(!Path::new("/var/lib/kubelet/pki").starts_with(path), "hostPath {path} exposes kubelet's pki/");
        }
    }

    let chart = repo_root().join("deploy/helm/local-static-provisioner");
    let render = |sets: &[&str]| {
        let mut cmd = Command::new(helm());
        cmd.args(["template", "lsp", "--namespace", "lsp", "--kube-version", "1.30.0"]).arg(&chart);
        for set in sets {
            cmd.args(["--set", set]);
        }
        documents(&String::from_utf8(run(&mut cmd).stdout).unwrap())
    };
    let args = |docs: &[serde_json::Value]| -> Vec<String> {
        serde_json::from_value(find(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["args"].clone())
            .unwrap()
    };
    let defaults = render(&[]);
    assert_eq!(kubelet_mounts(&find(&defaults, "DaemonSet")["spec"]["template"]["spec"]), expected, "the chart");
    assert!(args(&defaults).contains(&"--kubelet-dir=/var/lib/kubelet".to_string()));
    let moved = render(&["kubeletDir=/var/lib/k0s/kubelet"]);
    let moved_pod = &find(&moved, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(kubelet_mounts_in(moved_pod, "/var/lib/k0s/kubelet"), narrow_kubelet_mounts("/var/lib/k0s/kubelet"));
    assert_eq!(kubelet_mounts(moved_pod), [], "nothing of /var/lib/kubelet left");
    assert!(args(&moved).contains(&"--kubelet-dir=/var/lib/k0s/kubelet".to_string()));
    // A trailing '/' would give paths with '//': refused by the values' schema.
    let mut cmd = Command::new(helm());
    cmd.args(["template", "lsp", "--kube-version", "1.30.0", "--set", "kubeletDir=/var/lib/kubelet/"]).arg(&chart);
    let refused = cmd.output().unwrap();
    assert!(!refused.status.success(), "kubeletDir with a trailing '/' rendered");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("kubeletDir"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

/// The overlay of deploy/components/kubelet-dir with kubelet's directory at `dir`.
fn kubelet_dir_overlay(dir: &str) -> tempfile::TempDir {
    let value = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: local-static-provisioner-kubelet-dir\n  annotations:\n    config.kubernetes.io/local-config: \"true\"\ndata:\n  dir: {dir}\n"
    );
    overlay_with(&["kubelet-dir"], &[("kubelet-dir.yaml", &value)])
}

/// deploy/components/kubelet-dir moves kubelet's directory in the seven places the base writes
/// it (the agent's KUBELET_DIR, the three hostPaths and their mountPaths) from one value: with
/// the base's value the output is the base's; with another only those seven lines change and
/// no /var/lib/kubelet is left. Without the value the build fails.
#[test]
fn kustomize_kubelet_dir_is_moved_from_one_value() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let base = kustomize(&cp, &repo_root().join("deploy/base"));
    let same = kubelet_dir_overlay("/var/lib/kubelet");
    assert_eq!(kustomize(&cp, same.path()), base, "deploy/components/kubelet-dir changes more than the directory");
    let new = "/var/snap/microk8s/common/var/lib/kubelet";
    let overlay = kubelet_dir_overlay(new);
    let moved = kustomize(&cp, overlay.path());
    assert_eq!(base.lines().count(), moved.lines().count());
    let changed: Vec<(&str, &str)> = base.lines().zip(moved.lines()).filter(|(a, b)| a != b).collect();
    assert_eq!(changed.len(), 7, "KUBELET_DIR, three hostPaths, three mountPaths: {changed:#?}");
    for (a, b) in changed {
        assert_eq!(a.replace("/var/lib/kubelet", new), b);
    }
    assert!(!moved.replace(new, "").contains("/var/lib/kubelet"), "a /var/lib/kubelet left behind");
    let docs = documents(&moved);
    let pod = &find(&docs, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(kubelet_mounts_in(pod, new), narrow_kubelet_mounts(new));
    server_dry_run(&cp, &moved);
    let bare = overlay_with(&["kubelet-dir"], &[]);
    assert!(!cp.kubectl(&["kustomize", bare.path().to_str().unwrap()]).status.success(), "built without the value");
}

/// The head of deploy/components/monitoring/prometheusrule.yaml; the chart's rule groups follow.
const MONITORING_RULE_HEAD: &str = "\
# GENERATED by tests/cluster/deploy.rs (monitoring_component_rules_are_the_charts) from the
# Helm chart's files/alerts-agent.yaml and files/alerts-node-cleanup.yaml, their placeholders
# filled in as the chart fills them for a release named local-static-provisioner in the
# namespace local-static-provisioner (deploy/base's names). Do not edit: change the chart's
# files, and the test says how to regenerate this one.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: local-static-provisioner
  namespace: local-static-provisioner
  labels:
    app.kubernetes.io/name: local-static-provisioner
spec:
  groups:
";

/// The chart's alert files and their placeholders, as deploy/base names things: the job is the
/// pods' app.kubernetes.io/name (the PodMonitors' jobLabel), the namespace the base's.
const MONITORING_RULE_GROUPS: [(&str, &[(&str, &str)]); 2] = [
    (
        "alerts-agent.yaml",
        &[
            ("__AGENT_SELECTOR__", r#"job="local-static-provisioner", namespace="local-static-provisioner""#),
            ("__NAMESPACE__", "local-static-provisioner"),
            ("__DAEMONSET__", "local-static-provisioner"),
        ],
    ),
    (
        "alerts-node-cleanup.yaml",
        &[(
            "__NODE_CLEANUP_SELECTOR__",
            r#"job="local-static-provisioner-node-cleanup", namespace="local-static-provisioner""#,
        )],
    ),
];

/// deploy/components/monitoring/prometheusrule.yaml as the chart's alert files make it: each
/// file (its leading comment dropped) one item of spec.groups, placeholders filled in.
fn monitoring_rule_text() -> String {
    let mut text = MONITORING_RULE_HEAD.to_string();
    for (file, substitutions) in MONITORING_RULE_GROUPS {
        let path = format!("deploy/helm/local-static-provisioner/files/{file}");
        let mut group = std::fs::read_to_string(repo_root().join(&path)).unwrap();
        for (placeholder, value) in substitutions {
            assert!(group.contains(placeholder), "{path} no longer has {placeholder}");
            group = group.replace(placeholder, value);
        }
        let body: Vec<&str> = group.lines().skip_while(|l| l.starts_with('#')).collect();
        let left = body.iter().find(|l| l.contains("__"));
        assert!(left.is_none(), "{path}: a placeholder this test does not fill in: {left:?}");
        text.push_str(&format!("    # {path}\n"));
        for (i, line) in body.iter().enumerate() {
            let indent = match (i, line.is_empty()) {
                (0, _) => "    - ",
                (_, true) => "",
                _ => "      ",
            };
            text.push_str(&format!("{indent}{line}\n"));
        }
    }
    text
}

/// The component's alerts are the chart's: its file is generated from the chart's (so a change
/// there fails here until it is regenerated), and equals what the chart renders for a release
/// with the base's names.
#[test]
fn monitoring_component_rules_are_the_charts() {
    let _area = support::area(module_path!());
    let file = "deploy/components/monitoring/prometheusrule.yaml";
    let expected = monitoring_rule_text();
    let actual = std::fs::read_to_string(repo_root().join(file)).unwrap_or_default();
    if actual != expected {
        let fresh = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("prometheusrule.yaml");
        std::fs::write(&fresh, &expected).unwrap();
        panic!("{file} is not what the chart's alert files make; regenerate it: cp {} {file}", fresh.display());
    }

    let ns = "local-static-provisioner";
    let out = run(Command::new(helm())
        .args(["template", "local-static-provisioner", "--namespace", ns, "--kube-version", "1.30.0"])
        .arg(repo_root().join("deploy/helm/local-static-provisioner"))
        .args(["--set", "prometheusRule.enabled=true", "--set", "nodeCleanup.enabled=true"])
        .args(["--set", "nodeCleanup.storageClasses={fast-disks}"]));
    let chart = documents(&String::from_utf8(out.stdout).unwrap());
    let component = documents(&actual);
    let rule = find(&component, "PrometheusRule");
    assert_eq!(rule["spec"], find(&chart, "PrometheusRule")["spec"], "the chart renders other rules");
    assert_eq!(rule["spec"]["groups"].as_array().unwrap().len(), 2);
}

/// Base and deploy/components/monitoring (tests/fixtures/kustomize-monitoring): the Service and
/// the PodMonitors select the agent's (and node-cleanup's) pods at their metrics port, the job
/// the alerts select is the pods' name label, and the API server takes it all, the
/// PodMonitors and the PrometheusRule checked against the Prometheus Operator's CRDs.
#[test]
fn kustomize_monitoring_component_is_accepted_by_the_api_server() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let _ = cp.kubectl(&["create", "namespace", "local-static-provisioner"]);
    let out = kustomize(&cp, &repo_root().join("tests/fixtures/kustomize-monitoring"));
    let docs = documents(&out);
    let base = documents(&kustomize(&cp, &repo_root().join("deploy/base")));
    assert_eq!(docs.len(), base.len() + 4, "the base, a Service, two PodMonitors and a PrometheusRule");

    let ds = find_named(&docs, "DaemonSet", "local-static-provisioner");
    let pod_labels = &ds["spec"]["template"]["metadata"]["labels"];
    let port = &ds["spec"]["template"]["spec"]["containers"][0]["ports"][0];
    assert_eq!(port["name"], "metrics");
    let selects = |selector: &serde_json::Value, labels: &serde_json::Value| {
        selector.as_object().unwrap().iter().all(|(k, v)| labels[k] == *v)
    };
    let service = find_named(&docs, "Service", "local-static-provisioner-metrics");
    assert!(selects(&service["spec"]["selector"], pod_labels), "the Service selects no agent pod");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "metrics");
    assert_eq!(service["spec"]["ports"][0]["port"], port["containerPort"]);

    let groups = find(&docs, "PrometheusRule")["spec"]["groups"].as_array().unwrap();
    let exprs: Vec<&str> =
        groups.iter().flat_map(|g| g["rules"].as_array().unwrap()).map(|r| r["expr"].as_str().unwrap()).collect();
    let node_cleanup = documents(&kustomize(&cp, &repo_root().join("deploy/node-cleanup")));
    let cleanup_pod = &find(&node_cleanup, "Deployment")["spec"]["template"];
    for (monitor, pod) in
        [("local-static-provisioner", &ds["spec"]["template"]), ("local-static-provisioner-node-cleanup", cleanup_pod)]
    {
        let spec = &find_named(&docs, "PodMonitor", monitor)["spec"];
        let labels = &pod["metadata"]["labels"];
        assert!(selects(&spec["selector"]["matchLabels"], labels), "PodMonitor {monitor} selects no pod of its own");
        assert_eq!(spec["podMetricsEndpoints"][0]["port"], pod["spec"]["containers"][0]["ports"][0]["name"]);
        // The job label the alerts select on: job="<the pods' app.kubernetes.io/name>".
        let job_label = spec["jobLabel"].as_str().unwrap();
        let job = format!("job=\"{}\"", labels[job_label].as_str().unwrap());
        assert!(exprs.iter().any(|e| e.contains(&job)), "no alert selects {job}");
    }

    cp.install_monitoring_crds(&["podmonitors", "prometheusrules"]);
    server_dry_run(&cp, &out);
}

#[test]
fn helm_chart_takes_upstream_values_and_renders_a_valid_config() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let ns = "lsp-helm-test";
    let _ = cp.kubectl(&["create", "namespace", ns]);
    let chart = repo_root().join("deploy/helm/local-static-provisioner");
    let values = repo_root().join("tests/fixtures/upstream-values.yaml");
    let out = run(Command::new(helm())
        .args(["template", "lsp", "--namespace", ns, "--kube-version", "1.30.0"])
        .arg(&chart)
        .arg("--values")
        .arg(&values));
    let rendered = String::from_utf8(out.stdout).unwrap();
    server_dry_run(&cp, &rendered);
    assert!(!rendered.contains("node-cleanup"), "node-cleanup is opt-in; upstream values do not enable it");

    // The ConfigMap's keys, mounted as kubelet would, are a valid config with upstream's meaning.
    let docs = documents(&rendered);
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
    // kubelet's mounts of local volumes are visible to the agent: no wipe while kubelet still
    // holds a volume; kubelet's whole directory is not mounted.
    assert_eq!(kubelet_mounts(pod), narrow_kubelet_mounts("/var/lib/kubelet"));
    let default_sc =
        docs.iter().find(|d| d["kind"] == "StorageClass" && d["metadata"]["name"] == "fast-disks").unwrap();
    assert_eq!(default_sc["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"], "true");
    let vap = docs.iter().find(|d| d["kind"] == "ValidatingAdmissionPolicy").unwrap();
    assert!(vap.to_string().contains(&format!("system:serviceaccount:{ns}:local-storage-admin")));

    // With serviceMonitor enabled (as many upstream values files have it) the chart renders it.
    let out = run(Command::new(helm())
        .args([
            "template",
            "lsp",
            "--namespace",
            ns,
            "--kube-version",
            "1.30.0",
            "--set",
            "serviceMonitor.enabled=true",
        ])
        .arg(&chart)
        .arg("--values")
        .arg(&values));
    assert!(String::from_utf8_lossy(&out.stdout).contains("kind: ServiceMonitor"));
}

#[test]
fn helm_chart_renders_node_cleanup_when_enabled() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let ns = "lsp-helm-node-cleanup";
    let _ = cp.kubectl(&["create", "namespace", ns]);
    let chart = repo_root().join("deploy/helm/local-static-provisioner");
    let values = repo_root().join("tests/fixtures/upstream-values.yaml");
    let command = |sets: &[&str]| {
        let mut cmd = Command::new(helm());
        cmd.args(["template", "lsp", "--namespace", ns, "--kube-version", "1.30.0"])
            .arg(&chart)
            .arg("--values")
            .arg(&values);
        for set in sets {
            cmd.args(["--set", set]);
        }
        cmd
    };
    let template = |sets: &[&str]| String::from_utf8(run(&mut command(sets)).stdout).unwrap();
    let rendered = template(&[
        "nodeCleanup.enabled=true",
        "nodeCleanup.storageClasses={local-block}",
        "nodeCleanup.gracePeriod=30m",
        "nodeCleanup.image.tag=nc",
    ]);
    server_dry_run(&cp, &rendered);

    let docs = documents(&rendered);
    let args = node_cleanup_args(&docs);
    assert_eq!(args[0], "node-cleanup");
    for arg in [
        "--storage-classes=local-block",
        "--grace-period=30m",
        "--lease-name=lsp-local-static-provisioner-node-cleanup",
    ] {
        assert!(args.iter().any(|a| a == arg), "{arg} not in {args:?}");
    }
    let deployment = find(&docs, "Deployment");
    assert_eq!(deployment["metadata"]["name"], "lsp-local-static-provisioner-node-cleanup");
    assert_eq!(deployment["metadata"]["namespace"], ns);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "lsp-local-static-provisioner-node-cleanup");
    assert_eq!(pod["containers"][0]["image"], "local-static-provisioner:nc");
    // Its pods are not the DaemonSet's: the two selectors must not overlap.
    let ds_selector = &find(&docs, "DaemonSet")["spec"]["selector"]["matchLabels"];
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert!(
        ds_selector.as_object().unwrap().iter().any(|(k, v)| pod_labels[k] != *v),
        "the DaemonSet would select node-cleanup's pods"
    );
    assert_eq!(
        find_named(&docs, "ServiceAccount", "lsp-local-static-provisioner-node-cleanup")["metadata"]["namespace"],
        ns
    );
    let role = find_named(&docs, "Role", "lsp-local-static-provisioner-node-cleanup");
    assert_eq!(role["metadata"]["namespace"], ns, "the Lease lives in the release namespace");
    let binding = find_named(&docs, "ClusterRoleBinding", "lsp-local-static-provisioner-node-cleanup");
    assert_eq!(binding["subjects"][0]["name"], "lsp-local-static-provisioner-node-cleanup");
    assert_eq!(binding["subjects"][0]["namespace"], ns);

    // Same permissions as deploy/node-cleanup, whose roles the suite audits against what
    // node-cleanup really does.
    let kustomized =
        documents(&cp.kubectl_ok(&["kustomize", repo_root().join("deploy/node-cleanup").to_str().unwrap()]));
    for kind in ["ClusterRole", "Role"] {
        assert_eq!(
            find_named(&docs, kind, "lsp-local-static-provisioner-node-cleanup")["rules"],
            find_named(&kustomized, kind, "local-static-provisioner-node-cleanup")["rules"],
            "{kind} rules differ from deploy/node-cleanup"
        );
    }

    // Opting in is never implied: without storageClasses the chart refuses to render.
    let refused = command(&["nodeCleanup.enabled=true"]).output().unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("nodeCleanup.storageClasses"));
    // rbac.create=false and serviceAccount.create=false leave those objects to the operator.
    let rendered = template(&[
        "nodeCleanup.enabled=true",
        "nodeCleanup.storageClasses=fast-disks\\,local-block",
        "rbac.create=false",
        "serviceAccount.create=false",
    ]);
    let docs = documents(&rendered);
    assert!(node_cleanup_args(&docs).iter().any(|a| a == "--storage-classes=fast-disks,local-block"));
    for kind in ["ServiceAccount", "ClusterRole", "Role", "RoleBinding"] {
        assert!(!rendered.contains(&format!("kind: {kind}\n")), "{kind} rendered despite create=false");
    }

    // With serviceMonitor enabled, node-cleanup's metrics are scraped too.
    let rendered = template(&[
        "nodeCleanup.enabled=true",
        "nodeCleanup.storageClasses={fast-disks}",
        "serviceMonitor.enabled=true",
    ]);
    let monitors = documents(&rendered).into_iter().filter(|d| d["kind"] == "ServiceMonitor").count();
    assert_eq!(monitors, 2, "one ServiceMonitor for the agent, one for node-cleanup");
}

/// What users apply runs the release it came with: every container of deploy/ names the
/// image by the crate's version (never `:latest`, which changes under a running DaemonSet and
/// defeats `IfNotPresent`) with an explicit pull policy, and the chart's appVersion is the same.
#[test]
fn shipped_manifests_pin_the_image_to_this_release() {
    let _area = support::area(module_path!());
    let version = env!("CARGO_PKG_VERSION");
    for file in ["deploy/base/daemonset.yaml", "deploy/node-cleanup/deployment.yaml"] {
        let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
        let docs = documents(&text);
        let containers = docs[0]["spec"]["template"]["spec"]["containers"].as_array().unwrap();
        assert!(!containers.is_empty(), "{file}: no containers");
        for c in containers {
            assert_eq!(c["image"], format!("local-static-provisioner:{version}"), "{file}: {}", c["name"]);
            assert_eq!(c["imagePullPolicy"], "IfNotPresent", "{file}: {}", c["name"]);
        }
    }
    let chart = std::fs::read_to_string(repo_root().join("deploy/helm/local-static-provisioner/Chart.yaml")).unwrap();
    let chart: serde_json::Value = serde_saphyr::from_str(&chart).unwrap();
    assert_eq!(chart["appVersion"], version, "Chart.yaml appVersion");
}

/// An overlay of deploy/base with the given components (paths under deploy/components) and
/// extra files, written in a temporary directory the caller keeps.
fn overlay_with(components: &[&str], files: &[(&str, &str)]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let base = relative(tmp.path(), &repo_root().join("deploy/base"));
    let mut text = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\n",
        base.display()
    );
    for (name, _) in files {
        text.push_str(&format!("  - {name}\n"));
    }
    text.push_str("components:\n");
    for c in components {
        text.push_str(&format!(
            "  - {}\n",
            relative(tmp.path(), &repo_root().join("deploy/components").join(c)).display()
        ));
    }
    std::fs::write(tmp.path().join("kustomization.yaml"), text).unwrap();
    for (name, content) in files {
        std::fs::write(tmp.path().join(name), content).unwrap();
    }
    tmp
}

/// The base runs without the host's PID namespace (as upstream); deploy/components/host-pid
/// adds it and nothing else.
#[test]
fn kustomize_base_has_no_host_pid_and_the_component_adds_only_it() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let base = kustomize(&cp, &repo_root().join("deploy/base"));
    let docs = documents(&base);
    let pod = &find(&docs, "DaemonSet")["spec"]["template"]["spec"];
    assert!(pod.get("hostPID").is_none_or(|v| v == false), "the base sets hostPID: {pod}");
    let overlay = overlay_with(&["host-pid"], &[]);
    let out = kustomize(&cp, overlay.path());
    let docs = documents(&out);
    assert_eq!(find(&docs, "DaemonSet")["spec"]["template"]["spec"]["hostPID"], true);
    let differing: Vec<String> = diff_lines(&base, &out);
    assert_eq!(differing, ["+      hostPID: true"], "deploy/components/host-pid changes more than hostPID");
}

/// The lines of `b` that `a` lacks (+) and of `a` that `b` lacks (-), in order.
fn diff_lines(a: &str, b: &str) -> Vec<String> {
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let mut out: Vec<String> = la.iter().filter(|l| !lb.contains(l)).map(|l| format!("-{l}")).collect();
    out.extend(lb.iter().filter(|l| !la.contains(l)).map(|l| format!("+{l}")));
    out
}

/// deploy/components/startup-taint writes one key into the ConfigMap (with the flag on), a
/// toleration of the DaemonSet and the Node policy's startupTaint variable; the API server
/// takes the result.
#[test]
fn kustomize_startup_taint_is_written_from_one_value() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let _ = cp.kubectl(&["create", "namespace", "local-static-provisioner"]);
    let key = "example.com/storage-not-ready";
    let value = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: local-static-provisioner-startup-taint\n  annotations:\n    config.kubernetes.io/local-config: \"true\"\ndata:\n  key: {key}\n"
    );
    let overlay = overlay_with(&["startup-taint"], &[("startup-taint.yaml", &value)]);
    let out = kustomize(&cp, overlay.path());
    let docs = documents(&out);
    let config = find(&docs, "ConfigMap");
    assert_eq!(config["data"]["removeNodeNotReadyTaint"], "true");
    assert_eq!(config["data"]["provisionerNotReadyNodeTaintKey"], key);
    let tolerations = &find(&docs, "DaemonSet")["spec"]["template"]["spec"]["tolerations"];
    assert_eq!(
        tolerations,
        &json!([{"operator": "Exists", "effect": "NoSchedule"}, {"key": key, "operator": "Exists"}])
    );
    let fence = find_named(&docs, "ValidatingAdmissionPolicy", "local-static-provisioner-node-fence");
    let vars = fence["spec"]["variables"].as_array().unwrap();
    assert_eq!(vars[0], json!({"name": "startupTaint", "expression": format!("'{key}'")}));
    // Only variable 0: the others that name it are unchanged.
    let base = kustomize(&cp, &repo_root().join("deploy/base"));
    let base_docs = documents(&base);
    let base_vars = find_named(&base_docs, "ValidatingAdmissionPolicy", "local-static-provisioner-node-fence")["spec"]
        ["variables"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(base_vars[0]["expression"], "''");
    assert_eq!(vars[1..], base_vars[1..]);
    assert!(!out.contains("local-static-provisioner-startup-taint"), "the local-config value was rendered");
    server_dry_run(&cp, &out);
    // Without the value the build fails rather than leave a placeholder behind.
    let bare = overlay_with(&["startup-taint"], &[]);
    let failed = cp.kubectl(&["kustomize", bare.path().to_str().unwrap()]);
    assert!(!failed.status.success(), "the component built without its value");
}

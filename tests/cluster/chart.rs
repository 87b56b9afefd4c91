//! The Helm chart (deploy/helm/local-static-provisioner) as users of upstream's chart meet it:
//! every values file of upstream's helm/examples and its chart's own values.yaml
//! (tests/fixtures/upstream-helm-examples), our
//! defaults and a values file enabling every feature (tests/chart/all-features.yaml) render,
//! yield a ConfigMap the agent accepts (`validate-config`), and are accepted whole by the API
//! server (server-side dry run, the Prometheus Operator's real CRDs installed); upstream's keys
//! land where upstream puts them; unknown keys and upstream settings the agent cannot honour
//! fail the render by name; `helm lint` is clean; the alerts pass `promtool` unit tests; the
//! Grafana dashboard is valid and uses only metrics the binaries export.
//!
//! The server dry run needs the control plane of tests/run.sh (LSP_CONTROL_PLANE_DIR); without
//! one that part is skipped with a message (a failure under CI), the rest runs anyway.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};
use support::{ControlPlane, binary, cannot_run, repo_root, run};

/// The Kubernetes version renders assume: the oldest the admission policies (on by default)
/// accept, so that the guard for older clusters is exercised at its edge.
const KUBE_VERSION: &str = "1.30.0";
const RELEASE: &str = "lsp";
const NAMESPACE: &str = "lsp-chart";

fn tool(script: &str) -> PathBuf {
    let out = run(Command::new("bash").arg(repo_root().join("tests/tools").join(script)));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn chart() -> PathBuf {
    repo_root().join("deploy/helm/local-static-provisioner")
}

/// `helm template` of the chart with these values files and `--set`s (and extra flags).
fn template_output(values: &[&Path], sets: &[&str], flags: &[&str]) -> Output {
    let mut cmd = Command::new(tool("build-helm.sh"));
    cmd.args(["template", RELEASE, "--namespace", NAMESPACE]).arg(chart());
    if !flags.iter().any(|f| f.starts_with("--kube-version")) {
        cmd.args(["--kube-version", KUBE_VERSION]);
    }
    cmd.args(flags);
    for file in values {
        cmd.arg("--values").arg(file);
    }
    for set in sets {
        cmd.args(["--set", set]);
    }
    cmd.output().expect("running helm")
}

fn template(values: &[&Path], sets: &[&str]) -> String {
    let out = template_output(values, sets, &[]);
    assert!(out.status.success(), "helm template {values:?} {sets:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The render's error, which must name every one of `expected`.
fn refused(values: &[&Path], sets: &[&str], flags: &[&str], expected: &[&str]) {
    let out = template_output(values, sets, flags);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{values:?} {sets:?} {flags:?} rendered, it must fail naming {expected:?}");
    for word in expected {
        assert!(err.contains(word), "the error for {values:?} {sets:?} does not name {word:?}:\n{err}");
    }
}

/// The objects of a multi-document YAML stream.
fn documents(yaml: &str) -> Vec<Value> {
    yaml.split("\n---")
        .map(|d| {
            serde_saphyr::from_str::<Value>(d).unwrap_or_else(|e| panic!("rendered YAML does not parse: {e}\n{d}"))
        })
        .filter(|d| d.is_object())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered; got {:?}", kinds_and_names(docs)))
}

fn kinds_and_names(docs: &[Value]) -> Vec<String> {
    docs.iter().map(|d| format!("{}/{}", d["kind"].as_str().unwrap_or("?"), d["metadata"]["name"])).collect()
}

fn upstream_examples() -> Vec<PathBuf> {
    let dir = repo_root().join("tests/fixtures/upstream-helm-examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 22, "upstream's 21 helm/examples and its chart's values.yaml (see the README there)");
    files
}

/// `validate-config -f -` on the whole rendered stream, as a user runs it on `helm template`
/// output: it must pick the provisioner's ConfigMap out of every other object (the dashboard's
/// ConfigMap included) and accept it. Returns the effective config, or validate-config's output.
fn validate_rendered_config(rendered: &str, what: &str) -> Result<Value, String> {
    let mut child = Command::new(binary())
        .args(["validate-config", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: validate-config: {e}"));
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), rendered.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    if !out.status.success() {
        return Err(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)));
    }
    Ok(serde_saphyr::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap())
}

/// The control plane of tests/run.sh, or None (skipped, with a message; a failure under CI).
fn control_plane(test: &str) -> Option<ControlPlane> {
    if std::env::var_os("LSP_CONTROL_PLANE_DIR").is_none() {
        cannot_run(test, "the server-side dry run needs LSP_CONTROL_PLANE_DIR (tests/run.sh starts one)");
        return None;
    }
    Some(ControlPlane::get())
}

fn server_dry_run(cp: &ControlPlane, yaml: &str, what: &str) {
    let out = cp.kubectl_stdin(&cp.kubeconfig, &["apply", "--dry-run=server", "-f", "-"], Some(yaml));
    assert!(out.status.success(), "{what}: dry run refused: {}\n{yaml}", String::from_utf8_lossy(&out.stderr));
}

/// Upstream examples whose config the agent refuses on purpose, and the refusal: data-safety
/// rules upstream does not have (docs/migrate-from-upstream.md). The chart renders them; the
/// agent names the problem (ConfigInvalid, /readyz, `validate-config`). None today: the EKS
/// example's /dev/disk/kubernetes is a dedicated directory under /dev (core::volumes::volume_safety).
const REFUSED_BY_THE_AGENT: [(&str, &str); 0] = [];

#[test]
fn every_upstream_example_renders_a_valid_config_and_is_accepted_by_the_api_server() {
    let _area = support::area(module_path!());
    let mut renders: Vec<(String, String)> = Vec::new();
    let mut problems = Vec::new();
    let all_features = repo_root().join("tests/chart/all-features.yaml");
    let mut inputs: Vec<(String, Vec<PathBuf>)> = upstream_examples()
        .into_iter()
        .map(|f| (f.file_name().unwrap().to_string_lossy().into_owned(), vec![f]))
        .collect();
    inputs.push(("the chart's defaults".into(), vec![]));
    inputs.push(("tests/chart/all-features.yaml".into(), vec![all_features]));
    for (what, files) in &inputs {
        let paths: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
        let rendered = template(&paths, &[]);
        let refusal = REFUSED_BY_THE_AGENT.iter().find(|(file, _)| file == what).map(|(_, why)| why);
        match (validate_rendered_config(&rendered, what), refusal) {
            (Ok(_), None) => {}
            (Err(e), Some(why)) if e.contains(why) => {}
            (Err(e), _) => problems.push(format!("{what}: validate-config refused the rendered ConfigMap:\n{e}")),
            (Ok(_), Some(why)) => {
                problems.push(format!("{what}: validate-config accepted it; expected a refusal: {why}"))
            }
        }
        renders.push((what.clone(), rendered));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));

    let Some(cp) = control_plane("every_upstream_example_..._is_accepted_by_the_api_server (dry run)") else { return };
    cp.install_monitoring_crds(&["servicemonitors", "prometheusrules"]);
    let _ = cp.kubectl(&["create", "namespace", NAMESPACE]);
    for (what, rendered) in &renders {
        server_dry_run(&cp, rendered, what);
    }
}

#[test]
fn upstream_keys_land_where_upstream_puts_them() {
    let _area = support::area(module_path!());
    let rendered = template(&[&repo_root().join("tests/chart/all-features.yaml")], &[]);
    let docs = documents(&rendered);
    // fullnameOverride names everything; nameOverride is the selector's name label.
    let ds = find(&docs, "DaemonSet", "lsp-everything");
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        json!({"app.kubernetes.io/name": "lsp-app", "app.kubernetes.io/instance": RELEASE})
    );
    let pod = &ds["spec"]["template"];
    assert_eq!(pod["metadata"]["labels"]["team"], "storage", "podLabels");
    assert_eq!(pod["metadata"]["annotations"]["example.com/scrape"], "yes", "podAnnotations");
    let spec = &pod["spec"];
    assert_eq!(spec["imagePullSecrets"], json!([{"name": "registry-credentials"}]));
    assert_eq!(spec["hostPID"], true);
    assert_eq!(spec["serviceAccountName"], "lsp-agent");
    assert_eq!(spec["nodeSelector"], json!({"kubernetes.io/os": "linux", "storage": "local"}), "merged with the OS");
    assert_eq!(
        spec["tolerations"],
        json!([{"key": "dedicated", "operator": "Equal", "value": "storage", "effect": "NoSchedule"}])
    );
    assert_eq!(spec["initContainers"][0]["name"], "prepare");
    assert_eq!(ds["spec"]["updateStrategy"], json!({"type": "OnDelete"}), "OnDelete drops rollingUpdate");
    let container = &spec["containers"][0];
    assert_eq!(
        container["image"], "registry.example.com/storage/local-static-provisioner:0.1.0-full",
        "image string, through tpl"
    );
    assert_eq!(container["imagePullPolicy"], "Always");
    assert_eq!(container["securityContext"], json!({"privileged": true, "allowPrivilegeEscalation": true}));
    assert!(
        container["env"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "KUBECONFIG", "value": "/etc/agent-kubeconfig/kubeconfig"}))
    );
    // A probe with a handler replaces the chart's; one with only timings keeps its handler.
    assert_eq!(container["livenessProbe"], json!({"tcpSocket": {"port": "metrics"}, "periodSeconds": 60}));
    assert_eq!(
        container["readinessProbe"],
        json!({"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 5, "failureThreshold": 6})
    );
    assert_eq!(container["startupProbe"]["failureThreshold"], 30);
    let mounts = container["volumeMounts"].as_array().unwrap();
    assert!(
        mounts.contains(&json!({"name": "signal", "mountPath": "/etc/signal", "readOnly": true})),
        "additionalVolumeMounts"
    );
    let volumes = spec["volumes"].as_array().unwrap();
    assert!(volumes.contains(&json!({"name": "signal", "emptyDir": {}})), "additionalVolumes");
    let fast = find(&docs, "StorageClass", "lsp-all-fast");
    assert_eq!(fast["provisioner"], "local-provisioner", "storageClass.provisioner");
    assert_eq!(fast["reclaimPolicy"], "Retain");
    assert_eq!(fast["allowedTopologies"][0]["matchLabelExpressions"][0]["values"], json!(["zone-a"]));
    let block = find(&docs, "StorageClass", "lsp-all-block");
    assert_eq!(block["provisioner"], "kubernetes.io/no-provisioner");
    assert_eq!(
        block["allowedTopologies"][0]["matchLabelExpressions"][0]["values"],
        json!(["linux"]),
        "a string, through tpl"
    );
    let role = find(&docs, "ClusterRole", "lsp-everything-node-clusterrole");
    assert_eq!(
        role["rules"].as_array().unwrap().last().unwrap()["resources"],
        json!(["configmaps"]),
        "rbac.extraRules"
    );
    assert_eq!(find(&docs, "ClusterRoleBinding", "lsp-everything-node-binding")["subjects"][0]["name"], "lsp-agent");
    // The config: upstream's keys and ours.
    let effective = validate_rendered_config(&rendered, "all-features").unwrap();
    assert_eq!(effective["storageClassMap"]["lsp-all-fast"]["namePattern"], "ssd*,nvme*");
    assert_eq!(effective["storageClassMap"]["lsp-all-fast"]["rootMode"], "2770");
    assert_eq!(effective["storageClassMap"]["lsp-all-fast"]["rootOwner"], "0:2000");
    assert_eq!(effective["storageClassMap"]["lsp-all-fast"]["encryption"], "fscrypt");
    assert_eq!(effective["storageClassMap"]["lsp-all-block"]["volumeMode"], "Block");
    assert_eq!(effective["nodeLabelsForPV"], json!(["topology.kubernetes.io/zone"]));
    assert_eq!(effective["labelsForPV"]["team"], "storage");
    assert_eq!(effective["useNodeNameOnly"], true);
    assert_eq!(effective["setPVOwnerRef"], true);
    // Monitoring and node-cleanup.
    assert_eq!(find(&docs, "ServiceMonitor", "lsp-everything")["spec"]["jobLabel"], "app.kubernetes.io/name");
    assert_eq!(find(&docs, "PrometheusRule", "lsp-everything")["metadata"]["labels"]["release"], "prometheus");
    let dashboard = find(&docs, "ConfigMap", "lsp-everything-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1", "the Grafana sidecar's label");
    let nc = find(&docs, "Deployment", "lsp-everything-node-cleanup");
    assert_eq!(
        nc["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.example.com/storage/local-static-provisioner:0.1.0"
    );
    assert_eq!(nc["spec"]["template"]["spec"]["imagePullSecrets"], json!([{"name": "registry-credentials"}]));

    // Upstream's naming: <release>-<chart>, or the release alone when it contains the chart's name.
    let plain = documents(&template(&[], &[]));
    let ds = find(&plain, "DaemonSet", "lsp-local-static-provisioner");
    assert_eq!(
        ds["spec"]["template"]["spec"]["containers"][0]["image"], "local-static-provisioner:0.1.0",
        "tag = appVersion"
    );
    assert_eq!(ds["spec"]["template"]["spec"]["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert_eq!(ds["spec"]["template"]["spec"]["tolerations"], json!([{"operator": "Exists", "effect": "NoSchedule"}]));
    let out = Command::new(tool("build-helm.sh"))
        .args(["template", "local-static-provisioner", "--kube-version", KUBE_VERSION])
        .arg(chart())
        .output()
        .unwrap();
    find(&documents(&String::from_utf8_lossy(&out.stdout)), "DaemonSet", "local-static-provisioner");
    // Upstream's serviceAccount.create=false without a name: the namespace's default one.
    let docs = documents(&template(&[], &["serviceAccount.create=false"]));
    assert_eq!(
        find(&docs, "DaemonSet", "lsp-local-static-provisioner")["spec"]["template"]["spec"]["serviceAccountName"],
        "default"
    );
    assert!(!docs.iter().any(|d| d["kind"] == "ServiceAccount"));
    // The two pull-policy keys agree or the render fails; a map image with upstream's key.
    let docs = documents(&template(&[], &["imagePullPolicy=Never"]));
    assert_eq!(
        find(&docs, "DaemonSet", "lsp-local-static-provisioner")["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
        "Never"
    );
}

#[test]
fn unknown_keys_and_settings_the_agent_cannot_honour_fail_by_name() {
    let _area = support::area(module_path!());
    // Typos and keys of other charts, at the top and nested (values.schema.json).
    refused(&[], &["imagePullPolcy=Always"], &[], &["imagePullPolcy"]);
    refused(&[], &["serviceMonitor.enable=true"], &[], &["enable"]);
    refused(&[], &["classes[0].name=a", "classes[0].hostDir=/mnt/a", "classes[0].hostdir=/mnt/a"], &[], &["hostdir"]);
    refused(
        &[],
        &["classes[0].name=a", "classes[0].hostDir=/mnt/a", "classes[0].storageClass.reclaimPolicy=Recycle"],
        &[],
        &["reclaimPolicy"],
    );
    refused(&[], &["nodeCleanup.gracePeriodSeconds=60"], &[], &["gracePeriodSeconds"]);
    // Upstream settings the agent cannot honour, with the reason.
    refused(&[], &["enableWindows=true"], &[], &["enableWindows", "Linux"]);
    refused(&[], &["mountDevVolume=false"], &[], &["mountDevVolume", "/dev"]);
    refused(
        &[],
        &["removeNodeNotReadyTaint=true", "provisionerNotReadyNodeTaintKey="],
        &[],
        &["removeNodeNotReadyTaint", "provisionerNotReadyNodeTaintKey"],
    );
    refused(
        &[],
        &["removeNodeNotReadyTaint=true", "provisionerNotReadyNodeTaintKey=a'b"],
        &[],
        &["provisionerNotReadyNodeTaintKey", "a'b"],
    );
    refused(&[], &["nodeSelector.kubernetes\\.io/os=windows"], &[], &["kubernetes.io/os=windows"]);
    refused(&[], &["podLabels.app\\.kubernetes\\.io/name=x"], &[], &["podLabels.app.kubernetes.io/name", "selector"]);
    refused(&[], &["imagePullPolicy=Always", "image.pullPolicy=Never"], &[], &["imagePullPolicy", "image.pullPolicy"]);
    // No ValidatingAdmissionPolicy (Kubernetes < 1.30): refused, unless the user says so, or
    // helm template is told the API exists.
    let old = ["--kube-version", "1.29.0"];
    refused(&[], &[], &old, &["admissionPolicy.enabled", "ValidatingAdmissionPolicy", "1.30"]);
    let docs =
        documents(&String::from_utf8(template_output(&[], &["admissionPolicy.enabled=false"], &old).stdout).unwrap());
    assert!(
        docs.iter().any(|d| d["kind"] == "DaemonSet") && !docs.iter().any(|d| d["kind"] == "ValidatingAdmissionPolicy")
    );
    let with_api =
        ["--kube-version", "1.29.0", "--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"];
    let out = template_output(&[], &[], &with_api);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        documents(&String::from_utf8(out.stdout).unwrap()).iter().any(|d| d["kind"] == "ValidatingAdmissionPolicy")
    );
}

#[test]
fn helm_lint_is_clean() {
    let _area = support::area(module_path!());
    let all_features = repo_root().join("tests/chart/all-features.yaml");
    for args in [vec![], vec!["--kube-version", KUBE_VERSION, "--values", all_features.to_str().unwrap()]] {
        let out = run(Command::new(tool("build-helm.sh")).args(["lint", "--strict"]).args(&args).arg(chart()));
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        for level in ["[WARNING]", "[ERROR]"] {
            assert!(!text.contains(level), "helm lint {args:?}:\n{text}");
        }
        assert!(text.contains("0 chart(s) failed"), "{text}");
    }
}

/// Every alert: `promtool check rules` on the rendered PrometheusRule, then the unit tests of
/// tests/chart/alerts.test.yaml, which test each alert firing and not firing.
#[test]
fn alerts_pass_promtool_unit_tests() {
    let _area = support::area(module_path!());
    let promtool = tool("build-promtool.sh");
    let rendered = template(
        &[],
        &["prometheusRule.enabled=true", "nodeCleanup.enabled=true", "nodeCleanup.storageClasses={fast-disks}"],
    );
    let rendered = rendered.replace(&format!("namespace=\"{NAMESPACE}\""), "namespace=\"lsp-system\"");
    let docs = documents(&rendered);
    let rule = find(&docs, "PrometheusRule", "lsp-local-static-provisioner");
    let groups = rule["spec"]["groups"].clone();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("full.yaml"), json!({"groups": groups}).to_string()).unwrap();
    run(Command::new(&promtool).args(["check", "rules"]).arg(tmp.path().join("full.yaml")));

    // The unit tests compare labels: annotations (checked above) are left out.
    let mut stripped = groups.clone();
    let mut alerts = BTreeSet::new();
    for group in stripped.as_array_mut().unwrap() {
        for rule in group["rules"].as_array_mut().unwrap() {
            rule.as_object_mut().unwrap().remove("annotations");
            alerts.insert(rule["alert"].as_str().unwrap().to_string());
        }
    }
    std::fs::write(tmp.path().join("rules.yaml"), json!({"groups": stripped}).to_string()).unwrap();
    let tests = std::fs::read_to_string(repo_root().join("tests/chart/alerts.test.yaml")).unwrap();
    std::fs::write(tmp.path().join("alerts.test.yaml"), &tests).unwrap();
    let out =
        Command::new(&promtool).args(["test", "rules"]).arg(tmp.path().join("alerts.test.yaml")).output().unwrap();
    assert!(
        out.status.success(),
        "promtool test rules:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Every alert is tested both firing and not firing.
    let tests: Value = serde_saphyr::from_str(&tests).unwrap();
    let mut seen: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    for group in tests["tests"].as_array().unwrap() {
        for case in group["alert_rule_test"].as_array().unwrap() {
            let entry = seen.entry(case["alertname"].as_str().unwrap().to_string()).or_default();
            if case["exp_alerts"].as_array().unwrap().is_empty() {
                entry.1 = true;
            } else {
                entry.0 = true;
            }
        }
    }
    for alert in &alerts {
        assert_eq!(seen.get(alert), Some(&(true, true)), "{alert} must be tested firing and not firing");
    }
    // Every metric they use is one the binaries export (or Prometheus's `up`, or
    // kube-state-metrics' DaemonSet status for the readiness alert).
    let mut known = exported_metric_names();
    known.insert("up".into());
    known.insert("kube_daemonset_status_number_unavailable".into());
    for group in groups.as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let expr = rule["expr"].as_str().unwrap();
            for name in metric_names(expr) {
                assert!(known.contains(&name), "{}: {name} is not a metric the binaries export", rule["alert"]);
            }
        }
    }
}

#[test]
fn grafana_dashboard_is_valid_and_uses_exported_metrics() {
    let _area = support::area(module_path!());
    let docs = documents(&template(&[], &["grafanaDashboard.enabled=true"]));
    let cm = find(&docs, "ConfigMap", "lsp-local-static-provisioner-dashboard");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let text = cm["data"]["local-static-provisioner.json"].as_str().unwrap();
    let dashboard: Value = serde_json::from_str(text).expect("the dashboard is valid JSON");
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    assert!(
        variables.iter().any(|v| v["name"] == "datasource" && v["type"] == "datasource" && v["query"] == "prometheus"),
        "a templated Prometheus data source"
    );
    let mut ids = BTreeSet::new();
    let mut exprs = Vec::new();
    let mut panels: Vec<&Value> = dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = panels.pop() {
        let id = panel["id"].as_u64().unwrap_or_else(|| panic!("panel without an id: {}", panel["title"]));
        assert!(ids.insert(id), "panel id {id} is used twice");
        panels.extend(panel["panels"].as_array().into_iter().flatten());
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "panel {} uses a fixed data source", panel["title"]);
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {} has no query", panel["title"]);
        for target in targets {
            assert_eq!(
                target["datasource"]["uid"], "${datasource}",
                "panel {} uses a fixed data source",
                panel["title"]
            );
            exprs.push((panel["title"].as_str().unwrap().to_string(), target["expr"].as_str().unwrap().to_string()));
        }
    }
    // Every expression parses (as recording rules, with Grafana's variables put in) and uses
    // only metrics the agent or node-cleanup export.
    let known = exported_metric_names();
    let mut rules = Vec::new();
    for (i, (title, expr)) in exprs.iter().enumerate() {
        let expr = expr.replace("$__rate_interval", "5m").replace("$namespace", ".*");
        assert!(!expr.contains('$'), "{title}: a variable the test does not know: {expr}");
        for name in metric_names(&expr) {
            assert!(known.contains(&name), "{title}: {name} is not a metric the binaries export");
        }
        rules.push(json!({"record": format!("dashboard:panel_{i}"), "expr": expr}));
    }
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("dashboard-rules.yaml");
    std::fs::write(&file, json!({"groups": [{"name": "dashboard", "rules": rules}]}).to_string()).unwrap();
    run(Command::new(tool("build-promtool.sh")).args(["check", "rules"]).arg(&file));
}

/// The names of the series the agent and node-cleanup expose, from their registries (the
/// `# TYPE` lines of support::library_expositions, where every recording method was called):
/// counters as `<name>_total`, histograms as their `_bucket`, `_sum`, `_count`.
fn exported_metric_names() -> BTreeSet<String> {
    let (agent, node_cleanup) = support::library_expositions();
    let mut names = BTreeSet::new();
    for exposition in [agent, node_cleanup] {
        for line in exposition.lines() {
            let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
            let (name, kind) = rest.split_once(' ').unwrap();
            match kind {
                "counter" => {
                    names.insert(format!("{name}_total"));
                }
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{suffix}"));
                    }
                }
                _ => {
                    names.insert(name.to_string());
                }
            }
        }
    }
    assert!(names.contains("local_static_provisioner_config_valid"), "{names:?}");
    names
}

/// The metric names a PromQL expression selects: the identifiers left once strings, label
/// matchers, ranges, function and aggregation names, keywords and grouping label lists are
/// taken out.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const KEYWORDS: [&str; 11] =
        ["by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or", "unless"];
    // Strings, {…} and […] out.
    let mut plain = String::new();
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                let mut escaped = false;
                for d in chars.by_ref() {
                    if !escaped && d == c {
                        break;
                    }
                    escaped = d == '\\' && !escaped;
                }
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                let mut depth = 1;
                while let Some(d) = chars.next() {
                    if d == c {
                        depth += 1;
                    } else if d == close {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    } else if d == '"' {
                        // A quoted '}' inside a matcher must not close it.
                        let mut escaped = false;
                        for e in chars.by_ref() {
                            if !escaped && e == '"' {
                                break;
                            }
                            escaped = e == '\\' && !escaped;
                        }
                    }
                }
                plain.push(' ');
            }
            _ => plain.push(c),
        }
    }
    let bytes: Vec<char> = plain.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == '_' || bytes[i] == ':') {
                i += 1;
            }
            let word: String = bytes[start..i].iter().collect();
            let mut j = i;
            while j < bytes.len() && bytes[j].is_whitespace() {
                j += 1;
            }
            let called = j < bytes.len() && bytes[j] == '(';
            if KEYWORDS.contains(&word.as_str()) {
                if called && ["by", "without", "on", "ignoring", "group_left", "group_right"].contains(&word.as_str()) {
                    // Skip the label list.
                    while j < bytes.len() && bytes[j] != ')' {
                        j += 1;
                    }
                    i = j + 1;
                }
            } else if !called
                && !["sum", "max", "min", "avg", "count", "topk", "bottomk", "quantile"].contains(&word.as_str())
            {
                names.insert(word);
            }
        } else if c.is_ascii_digit() || c == '.' {
            // Numbers and durations (1h, 0.25, 1e3).
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == '.') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn metric_names_finds_the_selected_series_only() {
    let _area = support::area(module_path!());
    let names = |e: &str| metric_names(e).into_iter().collect::<Vec<_>>();
    assert_eq!(names(r#"up{job="a}b", namespace="x"} == 0"#), ["up"]);
    assert_eq!(
        names("sum by (le, mode) (rate(a_bucket{x=~\"$n\"}[5m])) / on (mode) group_left b_total offset 30m > 0.25"),
        ["a_bucket", "b_total"]
    );
    assert_eq!(names("histogram_quantile(0.9, sum without (pod) (c)) or vector(0) unless absent(d)"), ["c", "d"]);
    assert_eq!(names("count(e == 0) and sum(f) by (g)"), ["e", "f"]);
}

/// `helm upgrade` of a release of upstream's chart updates its objects in place only if they
/// keep upstream's names, and its DaemonSet only if the selector (immutable) is the same:
/// otherwise a second agent would run beside the first on every node, or the upgrade would
/// fail. The names below are those upstream's chart (helm/provisioner) renders for release
/// "lsp" with its default values.
#[test]
fn objects_keep_the_names_and_selector_of_upstreams_chart() {
    let _area = support::area(module_path!());
    let docs = documents(&template(&[], &[]));
    let ds = find(&docs, "DaemonSet", "lsp-local-static-provisioner");
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        json!({"app.kubernetes.io/name": "local-static-provisioner", "app.kubernetes.io/instance": RELEASE})
    );
    find(&docs, "ConfigMap", "lsp-local-static-provisioner-config");
    find(&docs, "ServiceAccount", "lsp-local-static-provisioner");
    find(&docs, "ClusterRole", "lsp-local-static-provisioner-node-clusterrole");
    find(&docs, "ClusterRoleBinding", "lsp-local-static-provisioner-node-binding");
}

/// The chart ships the LocalStorageNode CRD of deploy/base in crds/ (a copy: the chart cannot
/// reach outside itself), unchanged; `helm template --include-crds` renders it.
#[test]
fn chart_crd_is_the_base_crd() {
    let _area = support::area(module_path!());
    let copy = chart().join("crds/localstoragenodes.yaml");
    let meta = std::fs::symlink_metadata(&copy).unwrap();
    assert!(meta.file_type().is_file(), "{} must be a regular file, not a symlink", copy.display());
    let base = std::fs::read_to_string(repo_root().join("deploy/base/crd.yaml")).unwrap();
    assert!(
        std::fs::read_to_string(&copy).unwrap() == base,
        "{} differs from deploy/base/crd.yaml: cp deploy/base/crd.yaml {}",
        copy.display(),
        copy.display()
    );
    let names = |docs: &[Value]| -> Vec<String> {
        docs.iter()
            .filter(|d| d["kind"] == "CustomResourceDefinition")
            .map(|d| d["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let out = template_output(&[], &[], &["--include-crds"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rendered = documents(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(names(&rendered), ["localstoragenodes.local-static-provisioner.io"]);
    assert_eq!(
        find(&rendered, "CustomResourceDefinition", "localstoragenodes.local-static-provisioner.io"),
        &documents(&base)[0]
    );
    // Without --include-crds (and on helm upgrade) Helm leaves it out.
    assert!(names(&documents(&template(&[], &[]))).is_empty());
}

/// The chart's NOTES as `helm install` prints them (a client-side dry run against the test
/// control plane, which only answers its version), for `sets`.
fn notes(cp: &ControlPlane, sets: &[String]) -> String {
    let mut cmd = Command::new(tool("build-helm.sh"));
    cmd.args(["install", RELEASE, "--namespace", NAMESPACE, "--dry-run=client", "--kubeconfig"])
        .arg(&cp.kubeconfig)
        .arg(chart());
    for set in sets {
        cmd.args(["--set", set]);
    }
    let out = cmd.output().expect("running helm");
    assert!(out.status.success(), "helm install --dry-run {sets:?}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_once("NOTES:").map(|(_, n)| n.to_string()).unwrap_or_default()
}

/// The NOTES warn about a class whose discovery directory the agents would refuse exactly when
/// `validate-config` refuses it: every system and sensitive directory, places under /dev for
/// both modes, and ordinary directories, each judged by the binary on the rendered ConfigMap.
#[test]
fn the_notes_warn_about_a_refused_discovery_directory_exactly_when_validate_config_refuses_it() {
    let _area = support::area(module_path!());
    let Some(cp) =
        control_plane("the_notes_warn_about_a_refused_discovery_directory_exactly_when_validate_config_refuses_it")
    else {
        return;
    };
    let mut dirs: Vec<&str> = vec![
        "/mnt/fast-disks",
        "/mnt/disks/../etc",
        "/srv/local/",
        "/var/local-disks",
        "/home/disks",
        "/tmp/x",
        "/dev/disk/kubernetes",
        "/dev/disk/kubernetes/nvme",
        "/dev/disk/by-id",
        "/dev/disk/by-path",
        "/dev/disk/.x",
        "/dev/disk",
        "/dev/mapper",
        "/dev/vg0",
        "/proc/1/root",
        "/sys/fs/cgroup",
        "/etc/kubernetes",
        "/var/lib/kubelet/pods",
        "/var/log/disks",
        "/run/disks",
        "/usr/local/disks",
        "/var/lib/disks",
    ];
    dirs.extend(["/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/proc"]);
    dirs.extend(["/root", "/run", "/sbin", "/sys", "/tmp", "/usr", "/var", "/var/lib", "/var/lib/kubelet"]);
    dirs.extend(["/var/lib/containerd", "/var/run"]);
    let mut mismatches = Vec::new();
    for mode in ["Filesystem", "Block"] {
        for dir in &dirs {
            let sets = vec![
                "classes[0].name=c".to_string(),
                format!("classes[0].hostDir={dir}"),
                format!("classes[0].volumeMode={mode}"),
            ];
            let set_refs: Vec<&str> = sets.iter().map(String::as_str).collect();
            let rendered = template(&[], &set_refs);
            let agent_refuses = match validate_rendered_config(&rendered, dir) {
                Err(_) => true,
                Ok(effective) => effective["storageClassMap"]["c"].is_null(),
            };
            let notes = notes(&cp, &sets);
            let warned = notes.contains("class c: hostDir");
            if warned != agent_refuses {
                mismatches.push(format!("{mode} {dir}: agent refuses {agent_refuses}, NOTES warn {warned}\n{notes}"));
            }
        }
    }
    assert!(mismatches.is_empty(), "{} mismatches:\n{}", mismatches.len(), mismatches.join("\n"));
}

/// scripts/package-chart.sh makes a chart repository a user can add: the archive at the
/// Chart.yaml version, its checksum, and an index whose digest is the archive's; served over
/// HTTP (a local server, as any static host would), `helm repo add` and `helm template` from it
/// render the same objects as the chart directory.
#[test]
fn the_packaged_chart_is_a_repository_helm_installs_from() {
    let _area = support::area(module_path!());
    let tmp = tempfile::tempdir().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let url = format!("http://127.0.0.1:{port}");
    let out_dir = tmp.path().join("repo");
    let out = run(Command::new("bash")
        .arg(repo_root().join("scripts/package-chart.sh"))
        .arg(&out_dir)
        .arg(&url)
        .env("HELM", tool("build-helm.sh")));
    let archive = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let chart_yaml = std::fs::read_to_string(chart().join("Chart.yaml")).unwrap();
    let version = chart_yaml.lines().find_map(|l| l.strip_prefix("version: ")).unwrap().trim();
    assert_eq!(archive, out_dir.join(format!("local-static-provisioner-{version}.tgz")));
    let digest = String::from_utf8_lossy(&run(Command::new("sha256sum").arg(&archive)).stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let sums = std::fs::read_to_string(format!("{}.sha256", archive.display())).unwrap();
    assert!(sums.starts_with(&digest), "{sums}");
    let index: Value = serde_saphyr::from_str(&std::fs::read_to_string(out_dir.join("index.yaml")).unwrap()).unwrap();
    let entry = &index["entries"]["local-static-provisioner"][0];
    assert_eq!(entry["version"], version);
    assert_eq!(entry["digest"], digest.as_str());
    assert_eq!(entry["urls"][0], format!("{url}/local-static-provisioner-{version}.tgz").as_str());

    // Served, added and rendered as a user does.
    let mut server = Command::new("python3")
        .args(["-m", "http.server", &port.to_string(), "--bind", "127.0.0.1", "--directory"])
        .arg(&out_dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let helm = |args: &[&str]| {
        Command::new(tool("build-helm.sh"))
            .args(args)
            .env("HELM_REPOSITORY_CONFIG", tmp.path().join("repositories.yaml"))
            .env("HELM_CACHE_HOME", tmp.path().join("cache"))
            .env("HELM_CONFIG_HOME", tmp.path().join("config"))
            .output()
            .unwrap()
    };
    let added = support::wait_until("the chart repository is served", Duration::from_secs(20), || {
        let out = helm(&["repo", "add", "lsp", &url]);
        out.status.success().then_some(out)
    });
    assert!(added.status.success());
    let from_repo = helm(&[
        "template",
        RELEASE,
        "lsp/local-static-provisioner",
        "--version",
        version,
        "--namespace",
        NAMESPACE,
        "--kube-version",
        KUBE_VERSION,
    ]);
    let _ = server.kill();
    let _ = server.wait();
    assert!(from_repo.status.success(), "{}", String::from_utf8_lossy(&from_repo.stderr));
    assert_eq!(String::from_utf8_lossy(&from_repo.stdout), template(&[], &[]));
}

/// removeNodeNotReadyTaint as upstream's chart renders it (the two ConfigMap keys, a toleration
/// of the key with any effect), plus the Node policy's startupTaint variable naming the key;
/// off, none of them.
#[test]
fn remove_node_not_ready_taint_renders_the_config_the_toleration_and_the_policy_key() {
    let _area = support::area(module_path!());
    let key = "sig-storage-local-static-provisioner/agent-not-ready";
    let policy = |docs: &[Value]| -> Value {
        let name = format!("{RELEASE}-node-fence");
        docs.iter()
            .find(|d| {
                d["kind"] == "ValidatingAdmissionPolicy"
                    && d["metadata"]["name"].as_str().is_some_and(|n| n.ends_with("-node-fence"))
            })
            .unwrap_or_else(|| panic!("no {name}"))["spec"]["variables"][0]
            .clone()
    };
    let docs = documents(&template(&[], &["removeNodeNotReadyTaint=true"]));
    let config = docs.iter().find(|d| d["kind"] == "ConfigMap" && d["data"]["storageClassMap"].is_string()).unwrap();
    assert_eq!(config["data"]["removeNodeNotReadyTaint"], "true");
    assert_eq!(config["data"]["provisionerNotReadyNodeTaintKey"], key);
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let tolerations = ds["spec"]["template"]["spec"]["tolerations"].as_array().unwrap();
    assert!(tolerations.contains(&json!({"key": key, "operator": "Exists"})), "{tolerations:?}");
    assert!(tolerations.contains(&json!({"operator": "Exists", "effect": "NoSchedule"})), "{tolerations:?}");
    assert_eq!(policy(&docs), json!({"name": "startupTaint", "expression": format!("'{key}'")}));
    let docs = documents(&template(&[], &[]));
    let config = docs.iter().find(|d| d["kind"] == "ConfigMap" && d["data"]["storageClassMap"].is_string()).unwrap();
    assert!(config["data"].get("removeNodeNotReadyTaint").is_none());
    assert!(config["data"].get("provisionerNotReadyNodeTaintKey").is_none());
    assert_eq!(policy(&docs), json!({"name": "startupTaint", "expression": "''"}));
}

/// hostPID only where a class claims devices (upstream: never), unless given.
#[test]
fn host_pid_only_where_a_class_claims_devices() {
    let _area = support::area(module_path!());
    let host_pid = |sets: &[&str]| -> Value {
        let docs = documents(&template(&[], sets));
        docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap()["spec"]["template"]["spec"]["hostPID"].clone()
    };
    assert_eq!(host_pid(&[]), false, "the default classes claim no devices");
    let devices = [
        "classes[0].name=raw",
        "classes[0].hostDir=/dev/disk/kubernetes",
        "classes[0].volumeMode=Block",
        "classes[0].devices.types[0]=disk",
    ];
    assert_eq!(host_pid(&devices), true, "a class with devices");
    let mut off = devices.to_vec();
    off.push("hostPID=false");
    assert_eq!(host_pid(&off), false, "given false");
    assert_eq!(host_pid(&["hostPID=true"]), true, "given true");
}

//! The real node the end-to-end tests run on: kubelet, containerd and runc started by
//! tests/node/start.sh (tests/run.sh starts it after the other tests, LSP_NODE_DIR), registered
//! with the control plane of LSP_CONTROL_PLANE_DIR. Pods really run there: workloads from the
//! shell image, the agent from the image assembled from the Dockerfile's final stage.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde_json::Value;

use super::{ControlPlane, cannot_run, repo_root, run, wait_until};

/// How long pods, PVs and wipes on the real node may take to get where a test waits for them.
pub const WAIT: Duration = Duration::from_secs(120);

/// The tests on the node share one kubelet, one DaemonSet and the discovery directories: one
/// test at a time (tests/run.sh also runs them with one thread).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The node (from its env file), the control plane, and the lock held for the test.
pub struct RealNode {
    pub cp: ControlPlane,
    pub env: BTreeMap<String, String>,
    pub name: String,
    pub dir: PathBuf,
    /// Pods and claims this test made, deleted (forced) when it ends, passed or not.
    made: std::cell::RefCell<Vec<(&'static str, String)>>,
    _turn: MutexGuard<'static, ()>,
}

impl Drop for RealNode {
    fn drop(&mut self) {
        for (kind, name) in self.made.borrow().iter().rev() {
            let _ = self.cp.kubectl(&[
                "delete",
                kind,
                name,
                "-n",
                "default",
                "--ignore-not-found",
                "--wait=false",
                "--grace-period=0",
                "--force",
            ]);
        }
    }
}

impl RealNode {
    /// The node tests/run.sh started, or None (after saying why; a failure under CI) when
    /// there is none.
    pub fn get(test: &str) -> Option<RealNode> {
        let Some(dir) = std::env::var_os("LSP_NODE_DIR").map(PathBuf::from) else {
            cannot_run(test, "no real node: tests/run.sh starts one (tests/node/start.sh) and sets LSP_NODE_DIR");
            return None;
        };
        let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let text = std::fs::read_to_string(dir.join("env")).expect("real node env file");
        let env: BTreeMap<String, String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let name = env["NODE_NAME"].clone();
        let node = RealNode { cp: ControlPlane::get(), env, name, dir, made: Default::default(), _turn: turn };
        static LEFTOVERS: std::sync::Once = std::sync::Once::new();
        LEFTOVERS.call_once(|| node.delete_leftover_pvs());
        Some(node)
    }

    /// Deletes the PVs of this node whose volume is gone from the host: an earlier test process's
    /// (a failed run, on a control plane kept for the next). Such a PV rightly holds its disk's
    /// identity, a loop device's backing file by filesystem and inode, and a filesystem reuses a
    /// deleted image's inode for a later test's image: the agent then refuses that image as the
    /// leftover's disk. Run once per process, before any test of it made a PV.
    fn delete_leftover_pvs(&self) {
        let selector = format!("local-static-provisioner.io/node={}", self.name);
        let Some(list) = self.cp.get_json(&["pv", "-l", &selector]) else { return };
        for pv in list["items"].as_array().into_iter().flatten() {
            let (Some(name), Some(path)) = (pv["metadata"]["name"].as_str(), pv["spec"]["local"]["path"].as_str())
            else {
                continue;
            };
            if std::fs::symlink_metadata(path).is_ok() {
                continue;
            }
            eprintln!("real node: deleting PV {name} of an earlier run (its volume {path} is gone)");
            let _ =
                self.cp.kubectl(&["patch", "pv", name, "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
            let _ = self.cp.kubectl(&["delete", "pv", name, "--ignore-not-found", "--wait=false"]);
        }
    }

    /// A directory for one test's disk images, on the node's own tmpfs (DIR/disk-images,
    /// mounted by the first test that asks and unmounted by tests/node/stop.sh). A loop device
    /// is named by its backing file's filesystem and inode, and the agent in its container cannot
    /// read the file's birth time (the host's files are not visible there): an image in /tmp may
    /// get the inode of another test's deleted image, whose used mark or PV then rightly makes
    /// the agent refuse it as that disk. tmpfs hands out inode numbers that are not reused
    /// within a boot, so no two images of a run share a name.
    pub fn image_dir(&self) -> tempfile::TempDir {
        let root = self.dir.join("disk-images");
        if !super::mounts_under(&root).contains(&root) {
            std::fs::create_dir_all(&root).unwrap();
            run(Command::new("mount").args(["-t", "tmpfs", "-o", "mode=0700", "lsp-node-disk-images"]).arg(&root));
        }
        tempfile::tempdir_in(&root).unwrap()
    }

    pub fn var(&self, name: &str) -> &str {
        self.env.get(name).unwrap_or_else(|| panic!("{name} missing from the node's env file"))
    }

    /// Applies deploy/base and deploy/node-cleanup through the test overlay
    /// (tests/node/overlay.sh: image, API address, ports, a block class) and waits until the
    /// agent and node-cleanup pods are Ready. Idempotent. Returns the agent pod.
    pub fn deploy(&self) -> Value {
        let overlay = self.dir.join("overlay");
        if !overlay.join("kustomization.yaml").exists() {
            run(Command::new("bash").arg(repo_root().join("tests/node/overlay.sh")).arg(&overlay).arg(&self.cp.dir));
        }
        self.cp.kubectl_ok(&["apply", "-k", overlay.to_str().unwrap()]);
        self.ready_pod("local-static-provisioner", "app.kubernetes.io/name=local-static-provisioner-node-cleanup");
        self.ready_pod("local-static-provisioner", "app.kubernetes.io/name=local-static-provisioner")
    }

    /// The one Ready pod matching `selector` in `ns` (waits for it).
    pub fn ready_pod(&self, ns: &str, selector: &str) -> Value {
        wait_until(&format!("a Ready pod {selector} in {ns}"), WAIT, || {
            let pods = self.cp.get_json(&["pods", "-n", ns, "-l", selector])?;
            pods["items"]
                .as_array()?
                .iter()
                .find(|p| {
                    p["spec"]["nodeName"] == self.name.as_str()
                        && p["metadata"]["deletionTimestamp"].is_null()
                        && p["status"]["conditions"]
                            .as_array()
                            .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
                })
                .cloned()
        })
    }

    /// A claim of `class` for `size` (Filesystem or Block).
    pub fn claim(&self, name: &str, class: &str, block: bool, size: &str) {
        let mode = if block { "Block" } else { "Filesystem" };
        self.made.borrow_mut().push(("pvc", name.to_string()));
        self.cp.apply(&format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  accessModes: [ReadWriteOnce]\n  volumeMode: {mode}\n  storageClassName: {class}\n  resources: {{requests: {{storage: {size}}}}}\n"
        ));
    }

    /// A claim of `class` bound to PV `volume` by name (`spec.volumeName`: the PV controller
    /// binds it at once, whatever the class's binding mode), so that each tenant of a test gets
    /// the volume the test made for it.
    pub fn claim_volume(&self, name: &str, class: &str, block: bool, size: &str, volume: &str) {
        let mode = if block { "Block" } else { "Filesystem" };
        self.made.borrow_mut().push(("pvc", name.to_string()));
        self.cp.apply(&format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  accessModes: [ReadWriteOnce]\n  volumeMode: {mode}\n  storageClassName: {class}\n  volumeName: {volume}\n  resources: {{requests: {{storage: {size}}}}}\n"
        ));
    }

    /// A workload pod of the shell image running `script` with the claim at /data
    /// (Filesystem) or as the device /dev/xvda (Block). It never restarts; `grace` is its
    /// termination grace period. Host network: the node runs only the CNI loopback plugin.
    pub fn workload(&self, name: &str, claim: &str, block: bool, script: &str, grace: u32) {
        self.workload_at(name, claim, block, script, grace, None);
    }

    /// [`RealNode::workload`] already placed on this node (`spec.nodeName`): the scheduler never
    /// sees it, and kubelet alone decides whether its volume may be mounted.
    pub fn workload_placed(&self, name: &str, claim: &str, block: bool, script: &str, grace: u32) {
        self.workload_at(name, claim, block, script, grace, Some(&self.name));
    }

    fn workload_at(&self, name: &str, claim: &str, block: bool, script: &str, grace: u32, node: Option<&str>) {
        let image = self.var("SHELL_IMAGE");
        let placed = node.map(|n| format!("  nodeName: {n}\n")).unwrap_or_default();
        let attach = if block {
            "volumeDevices: [{name: data, devicePath: /dev/xvda}]"
        } else {
            "volumeMounts: [{name: data, mountPath: /data}]"
        };
        let script = serde_json::to_string(script).unwrap();
        self.made.borrow_mut().push(("pod", name.to_string()));
        self.cp.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n{placed}  restartPolicy: Never\n  hostNetwork: true\n  terminationGracePeriodSeconds: {grace}\n  containers:\n  - name: main\n    image: {image}\n    imagePullPolicy: Never\n    command: [\"sh\", \"-c\", {script}]\n    {attach}\n  volumes: [{{name: data, persistentVolumeClaim: {{claimName: {claim}}}}}]\n"
        ));
    }

    /// Waits until pod `name` is in one of `phases`; returns the phase. On timeout, panics
    /// with what the pod, its claim's scheduling and the agent said.
    pub fn wait_phase(&self, name: &str, phases: &[&str]) -> String {
        self.wait_phase_within(name, phases, WAIT)
    }

    /// [`RealNode::wait_phase`] for up to `wait`.
    pub fn wait_phase_within(&self, name: &str, phases: &[&str], wait: Duration) -> String {
        let deadline = std::time::Instant::now() + wait;
        loop {
            let phase = self
                .cp
                .get_json(&["pod", name, "-n", "default"])
                .and_then(|p| p["status"]["phase"].as_str().map(str::to_string));
            if let Some(phase) = phase.filter(|p| phases.contains(&p.as_str())) {
                return phase;
            }
            if std::time::Instant::now() > deadline {
                let describe = self.cp.kubectl(&["describe", "pod", name, "-n", "default"]);
                let pvs = self.cp.kubectl(&["get", "pv,pvc", "-A"]);
                panic!(
                    "pod {name} not in {phases:?} after {wait:?}:\n{}\n{}\nagent:\n{}",
                    String::from_utf8_lossy(&describe.stdout),
                    String::from_utf8_lossy(&pvs.stdout),
                    self.agent_log_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The last `n` lines the agent pods on this node printed.
    pub fn agent_log_tail(&self, n: usize) -> String {
        let dir = Path::new(self.var("POD_LOGS_DIR"));
        let mut text = String::new();
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let file = entry.file_name().to_string_lossy().to_string();
            if let Some(pod) = file.strip_prefix("local-static-provisioner_").and_then(|f| f.split('_').next()) {
                text.push_str(&pod_logs(dir, "local-static-provisioner", pod));
            }
        }
        let lines: Vec<_> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Runs a pod to completion and panics with its output unless it succeeded.
    pub fn expect_success(&self, name: &str) {
        let phase = self.wait_phase(name, &["Succeeded", "Failed"]);
        assert_eq!(phase, "Succeeded", "pod {name} failed; its output:\n{}", self.pod_log(name));
    }

    /// What pod `name` (namespace default) printed, from kubelet's log files (the node has no
    /// address the API server could reach for `kubectl logs`).
    pub fn pod_log(&self, name: &str) -> String {
        pod_logs(Path::new(self.var("POD_LOGS_DIR")), "default", name)
    }

    /// Deletes pod `name`, forced (`--grace-period=0 --force`: the object goes at once, its
    /// containers only when kubelet has stopped them) or gracefully without waiting.
    pub fn delete_pod(&self, name: &str, force: bool) {
        let mut args = vec!["delete", "pod", name, "-n", "default", "--wait=false", "--ignore-not-found"];
        if force {
            args.extend(["--grace-period=0", "--force"]);
        }
        let out = self.cp.kubectl(&args);
        assert!(out.status.success(), "deleting pod {name}: {}", String::from_utf8_lossy(&out.stderr));
    }

    pub fn delete_claim(&self, name: &str) {
        self.cp.kubectl_ok(&["delete", "pvc", name, "-n", "default", "--wait=false", "--ignore-not-found"]);
    }

    /// This Node's labels.
    pub fn labels(&self) -> BTreeMap<String, String> {
        let node = self.cp.get_json(&["node", &self.name]).expect("the real node's Node");
        serde_json::from_value(node["metadata"]["labels"].clone()).unwrap_or_default()
    }

    /// The reason and text of every event about pod `name` (namespace default), kubelet's and the
    /// scheduler's.
    pub fn pod_events(&self, name: &str) -> Vec<(String, String)> {
        let Some(events) = self.cp.get_json(&["events.events.k8s.io", "-n", "default"]) else { return Vec::new() };
        let items = events["items"].as_array().cloned().unwrap_or_default();
        items
            .iter()
            .filter(|e| e["regarding"]["kind"] == "Pod" && e["regarding"]["name"] == name)
            .map(|e| {
                let text = e["note"].as_str().unwrap_or_default().to_string();
                (e["reason"].as_str().unwrap_or_default().to_string(), text)
            })
            .collect()
    }

    /// Keeps the agent off this node until the returned guard is dropped or
    /// [`AgentAway::come_back`] is called: the DaemonSet's pods get a node selector no node has,
    /// so the DaemonSet controller deletes the agent's pod and kubelet stops it gracefully
    /// (SIGTERM and the grace period), as a drain, an upgrade or a shutdown does. Returns once
    /// no agent pod is left on this node.
    pub fn keep_agent_away(&self) -> AgentAway<'_> {
        let away = AgentAway { node: self, back: false };
        let out = away.set_selector("\"nowhere\"");
        assert!(out.status.success(), "keeping the agent away: {}", String::from_utf8_lossy(&out.stderr));
        wait_until("the agent's pod gone from the node", WAIT, || {
            let pods = self.cp.get_json(&[
                "pods",
                "-n",
                "local-static-provisioner",
                "-l",
                "app.kubernetes.io/name=local-static-provisioner",
            ])?;
            let items = pods["items"].as_array()?;
            (!items.iter().any(|p| p["spec"]["nodeName"] == self.name.as_str())).then_some(())
        });
        away
    }

    /// Whether kubelet has any mount for PV `pv` (a pod's volume or a mapped device).
    pub fn kubelet_holds(&self, pv: &str) -> bool {
        let kubelet = self.var("KUBELET_ROOT");
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .any(|point| point.starts_with(kubelet) && point.contains(pv))
    }
}

/// The agent kept off the real node (see [`RealNode::keep_agent_away`]); the DaemonSet is put
/// back as deployed when this is dropped, passed or not.
pub struct AgentAway<'a> {
    node: &'a RealNode,
    back: bool,
}

impl AgentAway<'_> {
    /// The node-selector label that no node has.
    const LABEL: &'static str = "e2e.local-static-provisioner.io/agent-away";

    /// A strategic merge patch setting (or, with `null`, removing) the selector's label.
    fn selector_patch(&self, value: &str) -> String {
        format!(r#"{{"spec":{{"template":{{"spec":{{"nodeSelector":{{"{}":{value}}}}}}}}}}}"#, Self::LABEL)
    }

    /// Patches the DaemonSet's node selector label to `value` (JSON; `null` removes it).
    fn set_selector(&self, value: &str) -> std::process::Output {
        self.node.cp.kubectl(&[
            "patch",
            "daemonset",
            "local-static-provisioner",
            "-n",
            "local-static-provisioner",
            "--type=strategic",
            "-p",
            &self.selector_patch(value),
        ])
    }

    fn restore(&self) -> std::process::Output {
        self.set_selector("null")
    }

    /// Lets the agent back (the DaemonSet as deployed) and waits until its pod is Ready; returns it.
    pub fn come_back(mut self) -> Value {
        let out = self.restore();
        assert!(out.status.success(), "restoring the DaemonSet: {}", String::from_utf8_lossy(&out.stderr));
        self.back = true;
        self.node.deploy()
    }
}

impl Drop for AgentAway<'_> {
    fn drop(&mut self) {
        if !self.back {
            let _ = self.restore();
        }
    }
}

/// Everything the containers of pod `ns`/`name` printed, from the files under kubelet's
/// podLogsDir (`<ns>_<name>_<uid>/<container>/<n>.log`, CRI format: time, stream, tag, text).
pub fn pod_logs(dir: &Path, ns: &str, name: &str) -> String {
    let prefix = format!("{ns}_{name}_");
    let mut text = String::new();
    let Ok(pods) = std::fs::read_dir(dir) else { return text };
    for pod in pods.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&prefix)) {
        for container in std::fs::read_dir(pod.path()).into_iter().flatten().flatten() {
            for file in std::fs::read_dir(container.path()).into_iter().flatten().flatten() {
                for line in std::fs::read_to_string(file.path()).unwrap_or_default().lines() {
                    text.push_str(line.splitn(4, ' ').nth(3).unwrap_or(line));
                    text.push('\n');
                }
            }
        }
    }
    text
}

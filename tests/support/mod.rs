//! Shared fixtures for the integration tests: real mounts and loop devices on this machine,
//! and a real control plane (started by tests/control-plane/start.sh), with the agent run as
//! its own process under the ServiceAccount and RBAC from deploy/.
#![allow(dead_code)]

pub mod agent_checks;
pub mod area;
pub mod failing_disk;
pub mod real_node;
pub mod used_lab;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Waits until the area of the calling test (`module_path!()`: its module, a former test file)
/// may run, and enters it: tests of two areas never run at the same time, tests of one area run
/// side by side (tests/support/area.rs). Called first in every test of the merged test crates,
/// as `let _area = support::area(module_path!());` (tests/static_checks/test_areas.rs checks
/// that each does).
pub fn area(module_path: &str) -> area::InArea<'static> {
    area::enter_test_area(module_path)
}

/// The binary under test.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_local-static-provisioner"))
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// True when the test may mount and use loop devices. Otherwise the test cannot run: see
/// [`cannot_run`] (a message outside CI, a failure under CI).
pub fn require_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    cannot_run(test, "needs root (tmpfs/bind mounts and loop devices)");
    false
}

/// Reports that `test` (or the part of it named there) cannot run here, for `why` (not root,
/// a tool or kernel module missing). Outside CI it prints why and the caller skips. Under CI
/// it panics: CI runs as root with every tool installed, so a skip there means a broken runner,
/// and the real-disk tests must not pass by not running.
pub fn cannot_run(test: &str, why: &str) {
    if under_ci() {
        panic!("{test} cannot run under CI (CI={:?}): {why}", std::env::var("CI").unwrap_or_default());
    }
    eprintln!("SKIPPED {test}: {why} (under CI this fails)");
}

/// Whether this is a CI run: `CI` set to anything but empty, `0` or `false` (CI runs .ci/run
/// with `CI=true`, as most CI services do).
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// Runs a command and panics with its output when it fails.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs a command for clean-up: never panics, says whether it worked.
pub fn quiet(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Decodes the kernel's `\ooo` escapes of a mountinfo path field.
pub fn unescape_mount_path(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let b = field.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Mount points at or below `dir`, deepest first, as the kernel lists them.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(unescape_mount_path))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    points
}

/// Removes a test's scratch directory once its own undo steps ran (also after a panic half-way):
/// lazily unmounts whatever is still mounted at or below it, deepest first, detaches loop
/// devices still over the images in `root/images`, and deletes the directory only when nothing
/// is mounted in it any more: never through a mount, which could be a bind of `/`.
pub fn remove_scratch_dir(root: &Path, label: &str) {
    for _ in 0..3 {
        let left = mounts_under(root);
        if left.is_empty() {
            break;
        }
        for p in left {
            quiet(Command::new("umount").arg("-l").arg(&p));
        }
    }
    if let Ok(rd) = std::fs::read_dir(root.join("images")) {
        for img in rd.flatten() {
            if let Ok(out) = Command::new("losetup").arg("-j").arg(img.path()).output() {
                for line in String::from_utf8_lossy(&out.stdout).lines() {
                    if let Some(dev) = line.split(':').next() {
                        quiet(Command::new("losetup").arg("-d").arg(dev));
                    }
                }
            }
        }
    }
    let left = mounts_under(root);
    if left.is_empty() {
        let _ = std::fs::remove_dir_all(root);
    } else {
        eprintln!("[{label}] leaving {} in place, still mounted: {left:?}", root.display());
    }
}

/// A zram device: a disk with no WWID, serial or backing file, so nothing but its device
/// number names it. None when the kernel has no zram.
pub struct Zram {
    pub id: u32,
    pub device: PathBuf,
}

impl Zram {
    pub fn new(mib: u64) -> Option<Zram> {
        let control = Path::new("/sys/class/zram-control/hot_add");
        if !control.exists() {
            let _ = Command::new("modprobe").args(["zram", "num_devices=0"]).status();
        }
        let id: u32 = std::fs::read_to_string(control).ok()?.trim().parse().ok()?;
        std::fs::write(format!("/sys/block/zram{id}/disksize"), (mib << 20).to_string()).ok()?;
        let device = PathBuf::from(format!("/dev/zram{id}"));
        wait_until("zram device node", Duration::from_secs(10), || device.exists().then_some(()));
        Some(Zram { id, device })
    }
}

impl Drop for Zram {
    fn drop(&mut self) {
        let _ = std::fs::write(format!("/sys/block/zram{}/reset", self.id), "1");
        let _ = std::fs::write("/sys/class/zram-control/hot_remove", self.id.to_string());
    }
}

/// Polls `f` until it returns Some, panicking with `what` after `timeout`.
pub fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A mount made by a test, unmounted when dropped.
pub struct Mount {
    pub path: PathBuf,
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).stderr(Stdio::null()).status();
    }
}

/// Mounts a tmpfs of `size_mib` at `path` (created if needed).
pub fn mount_tmpfs(path: &Path, size_mib: u64) -> Mount {
    std::fs::create_dir_all(path).unwrap();
    run(Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"]).arg(path));
    Mount { path: path.to_path_buf() }
}

/// Bind-mounts `src` onto `dst` (both created if needed).
pub fn bind_mount(src: &Path, dst: &Path) -> Mount {
    std::fs::create_dir_all(src).unwrap();
    std::fs::create_dir_all(dst).unwrap();
    run(Command::new("mount").arg("--bind").arg(src).arg(dst));
    Mount { path: dst.to_path_buf() }
}

/// A loop device backed by a sparse file, detached when dropped.
pub struct LoopDevice {
    pub device: PathBuf,
    _backing: PathBuf,
}

impl LoopDevice {
    pub fn new(backing: &Path, size_mib: u64) -> Self {
        run(Command::new("truncate").arg("-s").arg(format!("{size_mib}M")).arg(backing));
        let out = run(Command::new("losetup").args(["--find", "--show"]).arg(backing));
        let device = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        LoopDevice { device, _backing: backing.to_path_buf() }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
    }
}

/// Writes a config directory the way kubelet updates a mounted ConfigMap: the keys go into a
/// new hidden data directory, then the `..data` symlink is swapped atomically (rename), and
/// each key is a symlink through `..data`. Readers never see a half-written config.
pub fn write_config(dir: &Path, keys: &[(&str, &str)]) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static GENERATION: AtomicUsize = AtomicUsize::new(0);
    std::fs::create_dir_all(dir).unwrap();
    let data_name = format!("..2026_11_23_00_00_00.{:09}", GENERATION.fetch_add(1, Ordering::Relaxed));
    let data = dir.join(&data_name);
    std::fs::create_dir_all(&data).unwrap();
    for (key, value) in keys {
        std::fs::write(data.join(key), value).unwrap();
    }
    let tmp_link = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp_link);
    std::os::unix::fs::symlink(&data_name, &tmp_link).unwrap();
    std::fs::rename(&tmp_link, dir.join("..data")).unwrap();
    for (key, _) in keys {
        let key_link = dir.join(key);
        if std::fs::symlink_metadata(&key_link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(key), key_link).unwrap();
        }
    }
    // As kubelet does: the links of keys the ConfigMap no longer has go.
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let into_data = std::fs::read_link(entry.path()).is_ok_and(|t| t.starts_with("..data"));
        if into_data && !keys.iter().any(|(k, _)| *k == name) {
            std::fs::remove_file(entry.path()).unwrap();
        }
    }
}

/// A control plane: the one `tests/run.sh` started (LSP_CONTROL_PLANE_DIR), or a private one
/// this test starts and stops.
pub struct ControlPlane {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub bin: PathBuf,
    pub api_url: String,
    owned: Option<tempfile::TempDir>,
}

impl ControlPlane {
    pub fn get() -> ControlPlane {
        if let Ok(dir) = std::env::var("LSP_CONTROL_PLANE_DIR") {
            return Self::from_dir(PathBuf::from(dir), None);
        }
        Self::private(&[])
    }

    /// A control plane of this test only, its API server started with `apiserver_flags` too
    /// (tests/control-plane/start.sh, LSP_APISERVER_FLAGS); stopped when dropped.
    pub fn private(apiserver_flags: &[&str]) -> ControlPlane {
        let tmp = tempfile::Builder::new().prefix("lsp-control-plane-").tempdir().unwrap();
        let script = repo_root().join("tests/control-plane/start.sh");
        run(Command::new("bash").arg(script).arg(tmp.path()).env("LSP_APISERVER_FLAGS", apiserver_flags.join(" ")));
        Self::from_dir(tmp.path().to_path_buf(), Some(tmp))
    }

    fn from_dir(dir: PathBuf, owned: Option<tempfile::TempDir>) -> ControlPlane {
        let env = std::fs::read_to_string(dir.join("env")).expect("control plane env file");
        let var = |name: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("export {name}=")))
                .unwrap_or_else(|| panic!("{name} missing from env file"))
                .to_string()
        };
        ControlPlane {
            kubeconfig: PathBuf::from(var("KUBECONFIG")),
            bin: PathBuf::from(var("CONTROL_PLANE_BIN")),
            api_url: var("API_URL"),
            dir,
            owned,
        }
    }

    /// kubectl as cluster admin.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_as(&self.kubeconfig, args)
    }

    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> Output {
        Command::new(self.bin.join("kubectl"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .output()
            .expect("running kubectl")
    }

    /// kubectl that must succeed.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl get ... -o json` parsed; None when the object does not exist.
    pub fn get_json(&self, args: &[&str]) -> Option<Value> {
        let mut full = vec!["get"];
        full.extend_from_slice(args);
        full.extend_from_slice(&["-o", "json"]);
        let out = self.kubectl(&full);
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("NotFound") || err.contains("not found"), "kubectl {full:?}: {err}");
            return None;
        }
        Some(serde_json::from_slice(&out.stdout).expect("kubectl json"))
    }

    /// kubectl with `kubeconfig`, feeding `stdin` (if any) to it.
    pub fn kubectl_stdin(&self, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
        let mut child = Command::new(self.bin.join("kubectl"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            input.write_all(text.as_bytes()).unwrap();
        }
        drop(input);
        child.wait_with_output().unwrap()
    }

    /// Applies YAML as admin.
    /// Tests of one binary run in parallel and apply shared objects (the RBAC from deploy/):
    /// two first applies race to create, and the loser's is retried as an update.
    pub fn apply(&self, yaml: &str) {
        let mut out = self.kubectl_stdin(&self.kubeconfig, &["apply", "-f", "-"], Some(yaml));
        for _ in 0..3 {
            if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains("AlreadyExists") {
                break;
            }
            out = self.kubectl_stdin(&self.kubeconfig, &["apply", "-f", "-"], Some(yaml));
        }
        assert!(out.status.success(), "apply failed: {}\n{yaml}", String::from_utf8_lossy(&out.stderr));
    }

    /// A fake Node that the scheduler accepts: Ready, with capacity, without the not-ready taint
    /// (no kubelet heartbeats here, and the node lifecycle controller is off).
    pub fn create_node(&self, name: &str) -> String {
        self.apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n    kubernetes.io/hostname: {name}\n    topology.kubernetes.io/zone: zone-a\n"
        ));
        let status = r#"{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"fake node for tests"}],"capacity":{"cpu":"4","memory":"8Gi","pods":"110"},"allocatable":{"cpu":"4","memory":"8Gi","pods":"110"}}}"#;
        self.kubectl_ok(&["patch", "node", name, "--subresource=status", "--type=merge", "-p", status]);
        let node = self.get_json(&["node", name]).unwrap();
        if node["spec"]["taints"].is_array() {
            self.kubectl_ok(&[
                "patch",
                "node",
                name,
                "--type=json",
                "-p",
                r#"[{"op":"remove","path":"/spec/taints"}]"#,
            ]);
        }
        node["metadata"]["uid"].as_str().unwrap().to_string()
    }

    pub fn create_storage_class(&self, name: &str, reclaim: &str) {
        self.apply(&format!(
            "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: {name}\nprovisioner: kubernetes.io/no-provisioner\nvolumeBindingMode: WaitForFirstConsumer\nreclaimPolicy: {reclaim}\n"
        ));
    }

    /// A kubeconfig holding a token of the agent's ServiceAccount, with the RBAC from deploy/
    /// applied (tests/control-plane/agent-kubeconfig.sh): the agent never runs as admin.
    pub fn agent_kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("agent.kubeconfig");
        run(Command::new("bash")
            .arg(repo_root().join("tests/control-plane/agent-kubeconfig.sh"))
            .arg(&self.dir)
            .arg(&path));
        // deploy/ holds the inventory's CRD too: a test starting its own control plane (or the
        // first on a shared one) may use the kind at once.
        self.wait_crd_established("localstoragenodes.local-static-provisioner.io");
        self.forget_finished_tests_inventories();
        path
    }

    /// A kubeconfig holding a token of node-cleanup's ServiceAccount, with its RBAC from
    /// deploy/node-cleanup applied.
    pub fn node_cleanup_kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("node-cleanup.kubeconfig");
        run(Command::new("bash")
            .arg(repo_root().join("tests/control-plane/agent-kubeconfig.sh"))
            .arg(&self.dir)
            .arg(&path)
            .arg("node-cleanup"));
        path
    }

    /// Sets the Node's Ready condition (no kubelet here: the test plays its part).
    pub fn set_node_ready(&self, name: &str, ready: bool) {
        let status = format!(
            r#"{{"status":{{"conditions":[{{"type":"Ready","status":"{}","reason":"Test","message":"set by the test"}}]}}}}"#,
            if ready { "True" } else { "False" }
        );
        self.kubectl_ok(&["patch", "node", name, "--subresource=status", "--type=merge", "-p", &status]);
    }

    /// A kubeconfig for this cluster that authenticates with `token`.
    pub fn token_kubeconfig(&self, dir: &Path, name: &str, token: &str) -> PathBuf {
        use base64::Engine;
        let ca = std::fs::read(self.dir.join("pki/ca.crt")).unwrap();
        let ca = base64::engine::general_purpose::STANDARD.encode(ca);
        let path = dir.join(format!("{name}.kubeconfig"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: local, cluster: {{server: {}, certificate-authority-data: {ca}}}}}]\nusers: [{{name: u, user: {{token: {token}}}}}]\ncontexts: [{{name: local, context: {{cluster: local, user: u}}}}]\ncurrent-context: local\n",
            self.api_url
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// PVs whose spec.local.path starts with `prefix` (tests use unique temp dirs).
    /// Deletes the PVs whose path is under `prefix` (a test's own directory), finalizers
    /// dropped: the control plane is shared, and a PV left behind records a disk whose image
    /// file is gone, so a later test's image that reuses the file's inode would read as that
    /// disk (a loop device's id is its backing file's device and inode).
    pub fn forget_pvs_under(&self, prefix: &str) {
        for pv in self.pvs_under(prefix) {
            let name = pv["metadata"]["name"].as_str().unwrap_or_default().to_string();
            let _ = self.kubectl(&["patch", "pv", &name, "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
            let _ = self.kubectl(&["delete", "pv", &name, "--wait=false"]);
        }
    }

    /// Deletes the PVs left by tests that have finished: those whose path lies in a top-level
    /// directory of the temporary directory that no longer exists (every test keeps its own
    /// while it runs). For commands that look at every PV of the cluster (`wipe-disk`), which
    /// would otherwise meet an earlier test's PV recording the inode this test's image reuses.
    pub fn forget_finished_tests_pvs(&self) {
        let tmp = std::env::temp_dir();
        let Some(list) = self.get_json(&["pv"]) else { return };
        for pv in list["items"].as_array().into_iter().flatten() {
            let Some(path) = pv["spec"]["local"]["path"].as_str().map(Path::new) else { continue };
            let Some(top) = path.strip_prefix(&tmp).ok().and_then(|rest| rest.components().next()) else { continue };
            if !tmp.join(top).exists() {
                let name = pv["metadata"]["name"].as_str().unwrap_or_default();
                eprintln!("deleting PV {name} of a finished test ({} is gone)", path.display());
                let _ =
                    self.kubectl(&["patch", "pv", name, "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
                let _ = self.kubectl(&["delete", "pv", name, "--wait=false"]);
            }
        }
    }

    /// Deletes the LocalStorageNodes of tests that have finished: those whose used-disk
    /// records all name paths in top-level directories of the temporary directory that no
    /// longer exist. Every agent reads every node's records before it offers a block disk, and
    /// a finished test's record of a loop device whose image is gone could read as a later
    /// test's image that reuses the file's inode: a loop device's id is its backing file's
    /// device and inode, and the file's birth time that tells them apart is not always readable
    /// (an image deleted while attached). That disk would be held or wiped first.
    pub fn forget_finished_tests_inventories(&self) {
        let tmp = std::env::temp_dir();
        let Some(list) = self.get_json(&["localstoragenodes"]) else { return };
        for obj in list["items"].as_array().into_iter().flatten() {
            let records = obj["status"]["usedDisks"].as_array().cloned().unwrap_or_default();
            let gone = |r: &Value| {
                let Some(path) = r["path"].as_str().map(Path::new) else { return false };
                let Some(top) = path.strip_prefix(&tmp).ok().and_then(|rest| rest.components().next()) else {
                    return false;
                };
                !tmp.join(top).exists()
            };
            if !records.is_empty() && records.iter().all(gone) {
                let name = obj["metadata"]["name"].as_str().unwrap_or_default();
                eprintln!("deleting LocalStorageNode {name} of a finished test (its disks' directories are gone)");
                let _ = self.kubectl(&["delete", "localstoragenode", name, "--wait=false"]);
            }
        }
    }

    /// Installs the Prometheus Operator's CRDs of `kinds` (plural names: `podmonitors`,
    /// `servicemonitors`, `prometheusrules`; tests/tools/prometheus-operator-crds.sh) and waits
    /// until they are established, so that a dry run validates those objects against their
    /// real schemas.
    pub fn install_monitoring_crds(&self, kinds: &[&str]) {
        let out = run(Command::new("bash").arg(repo_root().join("tests/tools/prometheus-operator-crds.sh")));
        let crds = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        for kind in kinds {
            let file = crds.join(format!("monitoring.coreos.com_{kind}.yaml"));
            let out = self.kubectl(&["apply", "--server-side", "--force-conflicts", "-f", file.to_str().unwrap()]);
            assert!(out.status.success(), "installing the {kind} CRD: {}", String::from_utf8_lossy(&out.stderr));
            self.wait_crd_established(&format!("{kind}.monitoring.coreos.com"));
        }
    }

    /// Waits until the CRD `name` is established (60 s at most). `kubectl wait
    /// --for=condition=Established` fails at once ("conditions accessor error") when it reads
    /// the CRD before the API server gave it any condition, which a loaded machine shows.
    pub fn wait_crd_established(&self, name: &str) {
        let query = r#"jsonpath={.status.conditions[?(@.type=="Established")].status}"#;
        wait_until(&format!("CRD {name} to be established"), Duration::from_secs(60), || {
            let out = self.kubectl(&["get", "crd", name, "-o", query]);
            (out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "True").then_some(())
        });
    }

    /// The control plane a test runs against, again (for a Drop that has no handle on it).
    pub fn at(dir: &Path) -> ControlPlane {
        Self::from_dir(dir.to_path_buf(), None)
    }

    pub fn pvs_under(&self, prefix: &str) -> Vec<Value> {
        let list = self.get_json(&["pv"]).unwrap();
        let mut items: Vec<Value> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|pv| pv["spec"]["local"]["path"].as_str().is_some_and(|p| p.starts_with(prefix)))
            .cloned()
            .collect();
        items.sort_by_key(|pv| pv["metadata"]["name"].as_str().unwrap().to_string());
        items
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if self.owned.is_some() {
            let script = repo_root().join("tests/control-plane/stop.sh");
            let _ = Command::new("bash").arg(script).arg(&self.dir).status();
        }
    }
}

/// The agent under test, as its own process; killed (by its PID) when dropped.
pub struct AgentProcess {
    child: Child,
    pub log: PathBuf,
}

impl AgentProcess {
    /// Starts the agent with the default resync (minutes): events and retry deadlines alone
    /// must drive it, as in production.
    pub fn start(config_dir: &Path, node: &str, kubeconfig: &Path, log: &Path) -> Self {
        Self::start_with(config_dir, node, kubeconfig, log, &[])
    }

    /// Starts the agent with extra flags (none: event-driven with the config's resync).
    pub fn start_with(config_dir: &Path, node: &str, kubeconfig: &Path, log: &Path, extra: &[&str]) -> Self {
        Self::start_wrapped(&[], config_dir, node, kubeconfig, log, extra)
    }

    /// [`AgentProcess::start_with`], the binary run by `wrapper` (its command words, the
    /// agent's command line after them: `unshare --user ...`; none: the agent itself); the
    /// wrapper must exec the agent, so the process is the agent's.
    pub fn start_wrapped(
        wrapper: &[&str],
        config_dir: &Path,
        node: &str,
        kubeconfig: &Path,
        log: &Path,
        extra: &[&str],
    ) -> Self {
        let mut args = vec!["run".to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        if !extra.contains(&"--state-dir") {
            // One node, one ledger of used disks, kept next to the log across restarts.
            let state = log.parent().unwrap_or(Path::new("/tmp")).join(format!("state-{node}"));
            args.extend(["--state-dir".to_string(), state.display().to_string()]);
        }
        args.extend(["--node-name".to_string(), node.to_string(), "--config-dir".to_string()]);
        args.push(config_dir.display().to_string());
        Self::spawn_by(wrapper, &args, kubeconfig, log)
    }

    /// Starts `node-cleanup` with these flags (it is the same binary).
    pub fn start_node_cleanup(kubeconfig: &Path, log: &Path, args: &[&str]) -> Self {
        let mut all = vec!["node-cleanup".to_string()];
        all.extend(args.iter().map(|s| s.to_string()));
        Self::spawn(&all, kubeconfig, log)
    }

    fn spawn(args: &[String], kubeconfig: &Path, log: &Path) -> Self {
        Self::spawn_by(&[], args, kubeconfig, log)
    }

    fn spawn_by(wrapper: &[&str], args: &[String], kubeconfig: &Path, log: &Path) -> Self {
        let log_file = std::fs::File::create(log).unwrap();
        let mut command = match wrapper.split_first() {
            None => Command::new(binary()),
            Some((program, rest)) => {
                let mut command = Command::new(program);
                command.args(rest).arg(binary());
                command
            }
        };
        let child = command
            .args(args)
            .args(["--listen-address", "127.0.0.1:0"])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env("RUST_LOG", "info,local_static_provisioner=debug")
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .expect("starting the binary under test");
        AgentProcess { child, log: log.to_path_buf() }
    }

    /// The process ID (to pause and resume it in tests).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GETs a path from the agent's admin server (its address is read from the log).
    pub fn admin_get(&self, path: &str) -> String {
        admin_get(|| self.log_text(), path)
    }

    /// Stops the agent with SIGTERM (graceful) and waits for it.
    pub fn stop(mut self) -> String {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
        self.log_text()
    }
}

/// What the threads of process `pid` are doing (name, state, kernel wait channel) and its
/// admin server's `/readyz` (which names a pass that is stuck, and where): printed when a test
/// fails with the agent still running, so a silent agent shows whether it idles or hangs.
fn process_snapshot(pid: u32, log: &str) -> String {
    use std::io::Read;
    let mut out = String::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.flatten().collect::<Vec<_>>());
    for task in tasks.unwrap_or_default() {
        let read = |name: &str| std::fs::read_to_string(task.path().join(name)).unwrap_or_default();
        let stat = read("stat");
        let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.split(' ').next()).unwrap_or("?").to_string();
        out.push_str(&format!(
            "thread {} {:?} state {state} wchan {}\n",
            task.file_name().to_string_lossy(),
            read("comm").trim(),
            read("wchan")
        ));
    }
    if let Some(addr) = admin_address(log)
        && let Ok(mut stream) = std::net::TcpStream::connect(&addr)
    {
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = write!(stream, "GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        out.push_str(&format!("/readyz: {}\n", answer.lines().last().unwrap_or("(no answer within 2 s)")));
    }
    out
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if std::thread::panicking() && matches!(self.child.try_wait(), Ok(None)) {
            eprintln!("----- the agent {} when the test failed -----", self.child.id());
            eprint!("{}", process_snapshot(self.child.id(), &self.log_text()));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.log_text();
            let tail: Vec<&str> = log.lines().rev().take(80).collect();
            eprintln!("----- last lines of the agent log {} -----", self.log.display());
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

impl ControlPlane {
    /// A claim of `class` and a pod using it; returns once the claim is Bound, with the PV name.
    pub fn bind_claim(&self, name: &str, class: &str, block: bool) -> String {
        let mode = if block { "Block" } else { "Filesystem" };
        let (mount_kind, mount_line) =
            if block { ("volumeDevices", "devicePath: /dev/data") } else { ("volumeMounts", "mountPath: /data") };
        self.apply(&format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  accessModes: [ReadWriteOnce]\n  volumeMode: {mode}\n  storageClassName: {class}\n  resources: {{requests: {{storage: 1Mi}}}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  containers:\n  - name: app\n    image: registry.k8s.io/pause:3.10\n    {mount_kind}: [{{name: data, {mount_line}}}]\n  volumes: [{{name: data, persistentVolumeClaim: {{claimName: {name}}}}}]\n"
        ));
        wait_until(&format!("claim {name} bound"), Duration::from_secs(60), || {
            let pvc = self.get_json(&["pvc", name, "-n", "default"])?;
            (pvc["status"]["phase"] == "Bound")
                .then(|| pvc["spec"]["volumeName"].as_str().unwrap_or_default().to_string())
        })
    }

    /// Deletes the pod (forced: no kubelet) and the claim of `bind_claim`.
    pub fn release_claim(&self, name: &str) {
        self.kubectl_ok(&["delete", "pod", name, "-n", "default", "--grace-period=0", "--force"]);
        self.kubectl_ok(&["delete", "pvc", name, "-n", "default", "--wait=false"]);
    }

    /// The PV's UID and phase, None when it does not exist.
    pub fn pv_state(&self, name: &str) -> Option<(String, String)> {
        let pv = self.get_json(&["pv", name])?;
        Some((
            pv["metadata"]["uid"].as_str().unwrap_or_default().to_string(),
            pv["status"]["phase"].as_str().unwrap_or_default().to_string(),
        ))
    }

    /// Whether `kubectl describe pv` shows an event with `reason`: it lists only events whose
    /// reference carries the PV's UID, which is where an operator looks first.
    pub fn describe_shows_event(&self, pv: &str, reason: &str) -> bool {
        let text = self.kubectl_ok(&["describe", "pv", pv]);
        text.split_once("\nEvents:").is_some_and(|(_, events)| events.contains(reason))
    }

    /// Whether an events.k8s.io Event about `pv` with `reason` exists whose note contains `text`.
    pub fn has_event(&self, pv: &str, reason: &str, text: &str) -> bool {
        self.has_event_since(pv, reason, text, None)
    }

    /// [`ControlPlane::has_event`], counting only Events observed at or after `since` (their
    /// eventTime, or their series' last observation): what happened after a step, not before.
    pub fn has_event_since(
        &self,
        pv: &str,
        reason: &str,
        text: &str,
        since: Option<k8s_openapi::jiff::Timestamp>,
    ) -> bool {
        let Some(events) = self.get_json(&["events.events.k8s.io", "-A"]) else { return false };
        let observed = |e: &serde_json::Value| {
            [&e["series"]["lastObservedTime"], &e["eventTime"]]
                .into_iter()
                .filter_map(|t| t.as_str()?.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .max()
        };
        events["items"].as_array().is_some_and(|items| {
            items.iter().any(|e| {
                e["regarding"]["name"] == pv
                    && e["reason"] == reason
                    && e["note"].as_str().is_some_and(|n| n.contains(text))
                    && since.is_none_or(|since| observed(e).is_some_and(|at| at >= since))
            })
        })
    }
}

/// GETs `path` from the admin server of an agent whose log `log` returns: the address is the
/// one its "admin server listening" line gives (a free port chosen by the agent).
/// The admin server's address, from the agent's log line saying it listens.
fn admin_address(log: &str) -> Option<String> {
    let line = log.lines().find(|l| l.contains("admin server listening"))?;
    Some(line.split("address=").nth(1)?.split_whitespace().next()?.to_string())
}

pub fn admin_get(log: impl Fn() -> String, path: &str) -> String {
    use std::io::Read;
    let addr = wait_until("the admin server address in the log", Duration::from_secs(30), || admin_address(&log()));
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).unwrap();
    out
}

/// Waits up to `timeout` until PV `name` exists again with a UID other than `old_uid` and is
/// Available, checking at every look that while a successor exists the volume at `volume` is
/// empty: a used volume is never offered unwiped. Returns the new UID.
pub fn wait_recycled(cp: &ControlPlane, name: &str, old_uid: &str, volume: Option<&Path>, timeout: Duration) -> String {
    wait_until(&format!("{name} wiped and Available again"), timeout, || {
        let (uid, phase) = cp.pv_state(name)?;
        if uid == old_uid {
            return None;
        }
        if let Some(v) = volume {
            let left: Vec<_> = std::fs::read_dir(v)
                .unwrap_or_else(|e| panic!("reading {}: {e}", v.display()))
                .flatten()
                .map(|e| e.file_name())
                .collect();
            assert!(left.is_empty(), "{name} was published again while {} still held {left:?}", v.display());
        }
        (phase == "Available").then_some(uid)
    })
}

/// kubectl's arguments for a server-side apply of a LocalStorageNode's status from standard
/// input, as the agent sends it (src/api/inventory.rs: field manager local-static-provisioner,
/// forced, on the status subresource).
pub const APPLY_STATUS: &[&str] = &[
    "apply",
    "--server-side",
    "--force-conflicts",
    "--field-manager=local-static-provisioner",
    "--subresource=status",
    "-f",
    "-",
];

/// Unmounts `path`, retrying for a few seconds while it is busy: the agent opens a volume's
/// root for a moment when it (re)writes its used mark, for example right after a claim binds,
/// and an unmount at that instant fails with EBUSY, as it would for an operator.
pub fn umount_when_idle(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = Command::new("umount").arg(path).output().unwrap_or_else(|e| panic!("umount {path:?}: {e}"));
        if out.status.success() {
            return;
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("busy") && Instant::now() < deadline,
            "umount {path:?} failed: {}\n{stderr}",
            out.status
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `to` relative to the directory `from` (kustomize takes only relative resource paths).
pub fn relative(from: &Path, to: &Path) -> PathBuf {
    let from = from.canonicalize().unwrap();
    let to = to.canonicalize().unwrap();
    let mut path = PathBuf::new();
    for _ in from.components().skip(1) {
        path.push("..");
    }
    path.join(to.strip_prefix("/").unwrap())
}

/// The agent's and node-cleanup's registries (their text exposition) with a sample in every
/// family: each recording method called once (prometheus-client encodes a labelled family only
/// once it has a member). Shared by the docs drift test and the chart's dashboard check.
pub fn library_expositions() -> (String, String) {
    use std::collections::BTreeMap;

    use local_static_provisioner::metrics::{FinishedWipe, Metrics, Role};
    let agent = Metrics::for_role(Role::Agent);
    let _running = agent.wipe_running();
    for ok in [true, false] {
        agent.wipe_finished(&FinishedWipe {
            mode: "fs",
            ok,
            elapsed: Duration::from_secs(1),
            bytes_wiped: 1,
            capacity_bytes: 1 << 30,
            cleanup_command: "",
        });
    }
    agent.pv_created("fs", 1 << 30);
    agent.pass_done(Duration::from_millis(5), Duration::from_millis(1));
    agent.set_volumes(&BTreeMap::from([("Bound".to_string(), 1)]));
    agent.set_flagged(1, 1, 1);
    agent.set_unpublished(&BTreeMap::from([("symlink", 1)]));
    agent.set_held_disks(&BTreeMap::from([("record", 1)]));
    agent.set_unresponsive(&[("/mnt/disks/v".into(), "inspection".into())], 1);
    agent.set_failing(&[("/mnt/disks/v".into(), "local-pv-1".into(), "read-only".into())]);
    agent.set_fenced(&[("local-pv-1".into(), "not-its-disk")]);
    agent.set_device_claims(
        &BTreeMap::from([("fast".to_string(), 1)]),
        &BTreeMap::from([(("fast".to_string(), "in-use"), 1)]),
    );
    agent.device_claimed("fast");
    agent.claim_withdrawn("fast");
    agent.crypto_erased();
    agent.key_failed("load");
    agent.set_full_reads(Some(("sdb", "wwn-0x1", 1, 2)), &BTreeMap::from([("blank", 1)]));
    agent.api_request("create", false, Duration::from_millis(1));
    agent.set_config_valid(true);
    agent.set_watch_degraded(false, true);
    agent.succession("flagged_stale");
    let node_cleanup = Metrics::for_role(Role::NodeCleanup);
    for ok in [true, false] {
        node_cleanup.node_cleanup_action("delete_pv", "stale", ok);
        node_cleanup.node_cleanup_pv_delete("Released", ok);
    }
    node_cleanup.set_absent_nodes(1);
    node_cleanup.set_leader(true);
    node_cleanup.nodes_unreadable();
    node_cleanup.api_request("delete", false, Duration::from_millis(1));
    (agent.encode(), node_cleanup.encode())
}

/// The host's block devices (name and size, as the node inventory lists them: no unattached
/// loop device), sorted, and the mounts of block devices (the inventory says where a device is
/// mounted).
fn block_devices_listed() -> Vec<(String, String)> {
    let mut devices: Vec<(String, String)> = std::fs::read_dir("/sys/class/block")
        .map(|rd| {
            rd.flatten()
                .map(|e| {
                    let size = std::fs::read_to_string(e.path().join("size")).unwrap_or_default();
                    (e.file_name().to_string_lossy().into_owned(), size.trim().to_string())
                })
                .filter(|(name, size)| !(name.starts_with("loop") && size == "0"))
                .collect()
        })
        .unwrap_or_default();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() > 4 && !fields[2].starts_with("0:") {
            devices.push((format!("mount {}", fields[2]), fields[4].to_string()));
        }
    }
    devices.sort();
    devices
}

/// Counts, in the background, how often the host's block devices or their mounts change
/// (sampled every 20 ms): the node inventory lists them, so a loop device another test attaches
/// or mounts meanwhile is a change an agent rightly writes, which a test counting an agent's
/// inventory writes must allow.
pub struct DiskChanges {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<usize>,
}

impl DiskChanges {
    pub fn start() -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut last, mut changes) = (block_devices_listed(), 0);
            while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
                let now = block_devices_listed();
                if now != last {
                    changes += 1;
                    last = now;
                }
            }
            changes
        });
        DiskChanges { stop, thread }
    }

    /// How many changes were seen since the start.
    pub fn stop(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().expect("the disk sampler")
    }
}

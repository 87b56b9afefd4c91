//! The lab and harness of the used-mark suites (tests/cluster/used_mark.rs,
//! tests/cluster/attack_used_mark.rs): a private scratch mount holding every mount, image and loop
//! device of one test, and one fake Node with its classes, claims and agents under their own RBAC,
//! all removed at the end; plus what a user sees (the mark read with Python, the ledger's entries,
//! "never" checks).

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{AgentProcess, ControlPlane, remove_scratch_dir, require_root, run, wait_until, write_config};

pub const WAIT: Duration = Duration::from_secs(90);
pub const ANN_MISSING: &str = "local-static-provisioner.io/volume-missing";
pub const XATTR: &str = "trusted.local-static-provisioner.used";
pub const TENANT: &[u8] = b"tenant data";

// ---------------------------------------------------------------------------------------------
// The lab: a private scratch mount holding every mount, image and loop device of one test

pub struct Lab {
    pub root: PathBuf,
}

impl Lab {
    pub fn new(name: &str) -> Lab {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let root = PathBuf::from(format!("/tmp/lsp-used-{}-{n}-{name}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        // Private: nothing mounted here propagates, and `mount --move` works below it.
        run(Command::new("mount").arg("--bind").arg(&root).arg(&root));
        run(Command::new("mount").arg("--make-private").arg(&root));
        Lab { root }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    pub fn dir(&self, rel: &str) -> PathBuf {
        let p = self.path(rel);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    pub fn tmpfs(&self, at: &Path, mib: u64) {
        std::fs::create_dir_all(at).unwrap();
        run(Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"]).arg(at));
    }

    /// A loop device over a new sparse image in `images/` (detached at the end).
    pub fn loop_dev(&self, name: &str, mib: u64) -> (PathBuf, PathBuf) {
        let img = self.dir("images").join(format!("{name}.img"));
        run(Command::new("truncate").arg("-s").arg(format!("{mib}M")).arg(&img));
        (self.loop_on(&img), img)
    }

    pub fn loop_on(&self, img: &Path) -> PathBuf {
        let out = run(Command::new("losetup").args(["--find", "--show"]).arg(img));
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    }

    /// A loop device over `img` whose partitions the kernel scans (`losetup -P`).
    pub fn loop_on_partscan(&self, img: &Path) -> PathBuf {
        let out = run(Command::new("losetup").args(["--find", "--show", "-P"]).arg(img));
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    }

    pub fn mount_dev(&self, dev: &Path, at: &Path) {
        self.mount_dev_with(dev, at, &[]);
    }

    /// [`Lab::mount_dev`] of a device the agent may be probing: its brief exclusive open of a
    /// claimed device with an unbound PV makes a mount meeting it fail as busy, and the mount
    /// is run again then, as an operator would (at most 20 times, 100 ms apart).
    pub fn mount_dev_meeting_probes(&self, dev: &Path, at: &Path) {
        std::fs::create_dir_all(at).unwrap();
        let mut last = String::new();
        for _ in 0..20 {
            let out = Command::new("mount").arg(dev).arg(at).output().unwrap();
            if out.status.success() {
                return;
            }
            last = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(last.contains("busy"), "mount {} {} failed: {last}", dev.display(), at.display());
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("mount {} {} stayed busy: {last}", dev.display(), at.display());
    }

    /// `mount <opts> dev at` (e.g. `-o ro`).
    pub fn mount_dev_with(&self, dev: &Path, at: &Path, opts: &[&str]) {
        std::fs::create_dir_all(at).unwrap();
        run(Command::new("mount").args(opts).arg(dev).arg(at));
    }

    /// ext4 on a new loop device, mounted at `at`: a disk whose data survives an unmount.
    pub fn ext4(&self, name: &str, at: &Path) -> (PathBuf, PathBuf) {
        self.ext4_sized(name, at, 64)
    }

    /// [`Lab::ext4`] of `mib` MiB.
    pub fn ext4_sized(&self, name: &str, at: &Path, mib: u64) -> (PathBuf, PathBuf) {
        let (dev, img) = self.loop_dev(name, mib);
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&dev));
        self.mount_dev(&dev, at);
        (dev, img)
    }

    /// Unmounts `at`, again while it is busy for a moment: an agent's pass holds a volume's
    /// root open while it reads it (more passes since the inventory's write deadline wakes one).
    pub fn umount(&self, at: &Path) {
        super::umount_when_idle(at);
    }

    pub fn move_mount(&self, from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        run(Command::new("mount").arg("--move").arg(from).arg(to));
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        remove_scratch_dir(&self.root, "used_mark");
    }
}

// ---------------------------------------------------------------------------------------------
// The cluster side: one fake Node, its classes, claims and agents; everything removed at the end

pub struct Harness {
    // Field order is drop order: claims and PVs go first (Drop::drop), then the control plane,
    // then the lab's mounts.
    pub cp: ControlPlane,
    pub lab: Lab,
    pub node: String,
    pub kubeconfig: PathBuf,
    logs: Cell<usize>,
}

impl Harness {
    pub fn new(name: &str) -> Option<Harness> {
        if !require_root(name) {
            return None;
        }
        let lab = Lab::new(name);
        let cp = ControlPlane::get();
        let node = format!("um-{name}").replace('_', "-");
        cp.create_node(&node);
        // Applies deploy/ (RBAC and the inventory's CRD) before the kind is used below.
        let kubeconfig = cp.agent_kubeconfig(&lab.root);
        // The node's inventory an earlier run on this control plane left: its agent would
        // start from that status (and a view change waits a minute), not from this run's.
        cp.kubectl_ok(&["delete", "localstoragenode", &node, "--ignore-not-found", "--wait=false"]);
        Some(Harness { cp, lab, node, kubeconfig, logs: Cell::new(0) })
    }

    /// Storage classes (reclaim Delete) and a config directory `name` for them:
    /// (class, discovery directory, extra class settings as YAML lines).
    pub fn config(&self, name: &str, classes: &[(&str, &Path, &str)]) -> PathBuf {
        let mut map = String::new();
        for (class, dir, extra) in classes {
            self.cp.create_storage_class(class, "Delete");
            map.push_str(&format!("{class}:\n  hostDir: {d}\n  mountDir: {d}\n{extra}", d = dir.display()));
        }
        let config = self.lab.path(name);
        write_config(&config, &[("storageClassMap", &map)]);
        config
    }

    /// One Filesystem class `class` over the lab's `disks/` directory: (disks, config dir).
    pub fn fs_class(&self, class: &str) -> (PathBuf, PathBuf) {
        let disks = self.lab.dir("disks");
        let config = self.config("config", &[(class, &disks, "")]);
        (disks, config)
    }

    /// The agent of this test's Node with a 1 s resync; its ledger is kept in the lab across
    /// restarts (`state-<node>` next to the logs).
    pub fn agent(&self, config: &Path, extra: &[&str]) -> AgentProcess {
        self.agent_on(&self.node, config, extra)
    }

    pub fn agent_on(&self, node: &str, config: &Path, extra: &[&str]) -> AgentProcess {
        let n = self.logs.get();
        self.logs.set(n + 1);
        let log = self.lab.path(&format!("agent-{n}.log"));
        AgentProcess::start_with(config, node, &self.kubeconfig, &log, extra)
    }

    pub fn ledger(&self, node: &str) -> PathBuf {
        self.lab.path(&format!("state-{node}/used-disks.json"))
    }

    /// node-cleanup for `class` with a 1 s grace period, under its own RBAC.
    pub fn node_cleanup(&self, class: &str) -> AgentProcess {
        let kubeconfig = self.cp.node_cleanup_kubeconfig(&self.lab.root);
        let lease = format!("{}-nc", self.node);
        let flags =
            ["--storage-classes", class, "--grace-period", "1s", "--resync-period", "500ms", "--lease-name", &lease];
        let nc = AgentProcess::start_node_cleanup(&kubeconfig, &self.lab.path("node-cleanup.log"), &flags);
        wait_until("node-cleanup leads", WAIT, || nc.log_text().contains("leadership acquired").then_some(()));
        nc
    }

    /// Deletes the Node object and registers it again (same name, new UID).
    pub fn recreate_node(&self) -> String {
        self.cp.kubectl_ok(&["delete", "node", &self.node]);
        self.cp.create_node(&self.node)
    }

    pub fn pv(&self, name: &str) -> Option<Value> {
        self.cp.get_json(&["pv", name])
    }

    pub fn ann(&self, pv: &str, key: &str) -> Option<String> {
        self.pv(pv)?["metadata"]["annotations"][key].as_str().map(str::to_string)
    }

    pub fn uid(&self, pv: &str) -> String {
        self.cp.pv_state(pv).unwrap_or_else(|| panic!("PV {pv} does not exist")).0
    }

    /// Every PV (of any node) whose local path is `path`.
    pub fn pvs_at(&self, path: &Path) -> Vec<Value> {
        let path = path.display().to_string();
        let all = self.cp.pvs_under(&self.lab.root.display().to_string());
        all.into_iter().filter(|pv| pv["spec"]["local"]["path"] == path.as_str()).collect()
    }

    /// (name, phase) of a PV at `path`, if any.
    pub fn pv_at(&self, path: &Path) -> Option<(String, String)> {
        let pv = self.pvs_at(path).into_iter().next()?;
        Some((
            pv["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            pv["status"]["phase"].as_str().unwrap_or_default().to_string(),
        ))
    }

    /// The name of an Available PV at `path`, if any.
    pub fn available_at(&self, path: &Path) -> Option<String> {
        self.pv_at(path).filter(|(_, phase)| phase == "Available").map(|(name, _)| name)
    }

    pub fn wait_published(&self, path: &Path) -> String {
        wait_until(&format!("{} published", path.display()), WAIT, || {
            self.pv_at(path).filter(|(_, phase)| phase == "Available").map(|(name, _)| name)
        })
    }

    /// A claim bound directly to `pv` (no pod); returns once the PV is Bound.
    pub fn claim(&self, claim: &str, class: &str, pv: &str, block: bool) {
        let mode = if block { "Block" } else { "Filesystem" };
        self.cp.apply(&format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {claim}, namespace: default, labels: {{um-node: {node}}}}}\nspec:\n  accessModes: [ReadWriteOnce]\n  volumeMode: {mode}\n  storageClassName: {class}\n  volumeName: {pv}\n  resources: {{requests: {{storage: 1Mi}}}}\n",
            node = self.node
        ));
        wait_until(&format!("claim {claim} bound to {pv}"), WAIT, || {
            (self.cp.pv_state(pv)?.1 == "Bound").then_some(())
        });
    }

    /// The claim's UID while it exists and is not being deleted.
    pub fn claim_uid(&self, claim: &str) -> Option<String> {
        let pvc = self.cp.get_json(&["pvc", claim, "-n", "default"])?;
        pvc["metadata"]["deletionTimestamp"].is_null().then(|| pvc["metadata"]["uid"].as_str().unwrap().to_string())
    }

    pub fn delete_claim(&self, claim: &str) {
        self.cp.kubectl_ok(&["delete", "pvc", claim, "-n", "default", "--wait=false"]);
    }

    /// What an operator does to get rid of a PV for good: delete it and force its finalizers
    /// off (no wipe happens). Returns once it is gone.
    pub fn force_delete_pv(&self, name: &str) {
        self.cp.kubectl_ok(&["delete", "pv", name, "--wait=false"]);
        wait_until(&format!("{name} gone"), WAIT, || {
            if self.pv(name).is_none() {
                return Some(());
            }
            let _ =
                self.cp.kubectl(&["patch", "pv", name, "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
            None
        });
    }

    /// The note of an event about this Node with `reason` whose note contains `text`.
    pub fn node_event(&self, reason: &str, text: &str) -> Option<String> {
        let events = self.cp.get_json(&["events.events.k8s.io", "-A"])?;
        events["items"].as_array()?.iter().find_map(|e| {
            let note = e["note"].as_str()?;
            (e["regarding"]["kind"] == "Node"
                && e["regarding"]["name"] == self.node.as_str()
                && e["reason"] == reason
                && note.contains(text))
            .then(|| note.to_string())
        })
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let selector = format!("um-node={}", self.node);
        let _ = self.cp.kubectl(&["delete", "pvc", "-n", "default", "-l", &selector, "--wait=false"]);
        self.cp.forget_pvs_under(&self.lab.root.display().to_string());
    }
}

// ---------------------------------------------------------------------------------------------
// What a user (or an operator on the node) sees

/// The used mark on a volume's root, read with Python (independently of the agent's code).
pub fn used_mark(root: &Path) -> Option<Value> {
    let script = "import os, sys; sys.stdout.buffer.write(os.getxattr(sys.argv[1], sys.argv[2]))";
    let out = Command::new("python3").args(["-c", script]).arg(root).arg(XATTR).output().unwrap();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("No data available"), "reading {XATTR} on {}: {err}", root.display());
        return None;
    }
    Some(serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("the mark is not JSON: {e}")))
}

/// Whether the mark on `root` names `pv` with its UID (complete: written after the create).
pub fn marked_for(root: &Path, pv: &str, uid: &str) -> Option<()> {
    let mark = used_mark(root)?;
    (mark["pv"] == pv && mark["uid"] == uid).then_some(())
}

/// Like `marked_for`, and the mark also records that the PV was claimed: the agent rewrites it
/// once it sees the PV Bound, so a test that compares the mark later waits for this one.
pub fn marked_claimed_for(root: &Path, pv: &str, uid: &str) -> Option<()> {
    marked_for(root, pv, uid)?;
    (used_mark(root)?["claimed"] == true).then_some(())
}

/// The ledger's entry for `pv`, if the ledger is readable and has one.
pub fn ledger_entry(ledger: &Path, pv: &str) -> Option<Value> {
    let entries: Value = serde_json::from_slice(&std::fs::read(ledger).ok()?).ok()?;
    entries["used"].as_array()?.iter().find(|e| e["pv"] == pv).cloned()
}

pub fn holds_tenant_data(root: &Path) -> bool {
    std::fs::read(root.join("tenant")).is_ok_and(|d| d == TENANT)
}

/// Polls `ready` like `wait_until`, checking first on every look that `never` names no
/// violation (panicking at once with it when it does).
pub fn wait_never<T>(what: &str, never: &dyn Fn() -> Option<String>, mut ready: impl FnMut() -> Option<T>) -> T {
    wait_until(what, WAIT, || {
        if let Some(violation) = never() {
            panic!("while waiting for {what}: {violation}");
        }
        ready()
    })
}

/// Checks for `secs` seconds that `never` names no violation.
pub fn never_for(secs: u64, never: &dyn Fn() -> Option<String>) {
    let until = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < until {
        if let Some(violation) = never() {
            panic!("{violation}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A violation when a PV is published at `path`.
pub fn published_at(h: &Harness, path: &Path, why: &str) -> Option<String> {
    let (name, phase) = h.pv_at(path)?;
    Some(format!("{} was published as PV {name} ({phase}): {why}", path.display()))
}

/// A violation when a PV at `root` exists while the tenant's file is still there.
pub fn offered_unwiped(h: &Harness, root: &Path) -> Option<String> {
    let (name, phase) = h.pv_at(root)?;
    holds_tenant_data(root)
        .then(|| format!("{} is published as PV {name} ({phase}) with the tenant's data on it", root.display()))
}

// ---------------------------------------------------------------------------------------------
// A block tenant's data

/// Recognisable bytes at the start and in the middle of a block device.
pub const PATTERN_AT: [u64; 2] = [0, 16 << 20];

pub fn pattern() -> Vec<u8> {
    b"TENANT-BLOCK-DATA-".iter().copied().cycle().take(4096).collect()
}

/// Writes the tenant's pattern at [`PATTERN_AT`] (a device of at least 32 MiB).
pub fn write_pattern(dev: &Path) {
    let f = std::fs::OpenOptions::new().write(true).open(dev).unwrap();
    for at in PATTERN_AT {
        std::os::unix::fs::FileExt::write_all_at(&f, &pattern(), at).unwrap();
    }
    f.sync_all().unwrap();
}

/// Whether the pattern is still at any of [`PATTERN_AT`].
pub fn has_pattern(dev: &Path) -> bool {
    let f = std::fs::File::open(dev).unwrap();
    PATTERN_AT.iter().any(|&at| {
        let mut buf = vec![0u8; 4096];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, at).unwrap();
        buf == pattern()
    })
}

//! Issue 41 end to end: many wedged disks and real failing disks under the real agent (its own
//! process, with the RBAC from deploy/) and the real control plane. No number of wedged
//! volumes may stop the healthy ones (published within 5 s, recycled within 30 s); an I/O error
//! (EIO) met under an Available PV withdraws it, under a Bound one flags it and tells the claim;
//! a disk that shrank is not offered at its old size, one that grew is said; a dead FUSE file
//! held open somewhere on the host stops nothing. Needs root (loop devices, ext4, tmpfs, FUSE).
//!
//! The failing disks are loop devices over the file of a small FUSE server
//! (tests/support/failing_disk.rs, tests/support/fuse_disk.py): this kernel has no
//! device-mapper. The wedged volumes are bindfs FUSE mounts whose daemon is stopped (SIGSTOP):
//! every access to them blocks, even `stat`.
//!
//! Every test owns a [`Lab`]; dropping it (also after a failed assertion) releases every block
//! first (stuck threads keep the agent from exiting, and a blocked disk from being unmounted),
//! then stops the agent, deletes its PVs and claims, unmounts and detaches. The tests of this
//! file run one at a time (one of them runs 100 FUSE daemons and measures the agent).

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use local_static_provisioner::core::volumes::naming::{ANN_DISK_FAILING, pv_name};
use serde_json::Value;
use support::agent_checks::{
    available, block_class_map, capacity, class_map, events_about, metric_lines, proc_status, unique,
};
use support::failing_disk::{FailingDisk, drop_caches, read_fails};
use support::{
    AgentProcess, ControlPlane, quiet, remove_scratch_dir, require_root, run, wait_recycled, wait_until, write_config,
};

const WAIT: Duration = Duration::from_secs(60);
/// The per-operation deadline the agents here run with (the default is 10 s).
const HOST_OP_TIMEOUT: &str = "2s";
const MIB: u64 = 1 << 20;
/// How many wedged volumes scenario (a) runs beside the healthy ones (`WEDGED_VOLUMES`
/// overrides it, for bench/wedged-disks.sh).
const WEDGED: usize = 100;
/// The agent's threads once every wedged volume answers again and the idle ones ended (10 s
/// idle, docs/operations.md): the runtime, the watches, the admin server and the pool's
/// answering thread; far below one per wedged volume.
const THREADS_AFTER_THAW: u64 = 40;

/// The tests here run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A test's scratch directory and what it mounted, attached, started and stopped there.
struct Lab {
    root: PathBuf,
    /// bindfs daemons serving volumes here, and whether each is stopped (SIGSTOP).
    fuse: Vec<(Child, bool)>,
    /// Failing disks (their own Drop releases, unmounts, detaches and stops the server).
    disks: Vec<FailingDisk>,
    /// Processes holding a file open (for the dead-FUSE-file case), killed by PID.
    holders: Vec<Child>,
    /// Claims created here (namespace default), deleted with the lab.
    claims: Vec<String>,
    agent: Option<AgentProcess>,
    cp_dir: Option<PathBuf>,
}

impl Lab {
    fn new(label: &str) -> Self {
        let root = tempfile::Builder::new().prefix(&format!("lsp-{label}-")).tempdir().unwrap().keep();
        Lab {
            root,
            fuse: Vec::new(),
            disks: Vec::new(),
            holders: Vec::new(),
            claims: Vec::new(),
            agent: None,
            cp_dir: None,
        }
    }

    fn tmpfs(&self, point: &Path, mib: u64) {
        std::fs::create_dir_all(point).unwrap();
        run(Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"]).arg(point));
    }

    /// bindfs of a fresh directory at `point`, in the foreground (its PID is ours). Returns its
    /// index for [`Self::stop_fuse`]. Does not wait for the mount: see [`Self::wait_fuse_mounted`].
    fn fuse(&mut self, point: &Path) -> usize {
        let source = self.root.join("fuse-src").join(self.fuse.len().to_string());
        std::fs::create_dir_all(&source).unwrap();
        std::fs::create_dir_all(point).unwrap();
        let child = Command::new("bindfs")
            .arg("-f")
            .arg(&source)
            .arg(point)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("bindfs runs");
        self.fuse.push((child, false));
        self.fuse.len() - 1
    }

    /// Waits until `points` are all mounted.
    fn wait_fuse_mounted(&self, points: &[PathBuf]) {
        wait_until("the FUSE mounts", Duration::from_secs(60), || {
            let mounted = support::mounts_under(&self.root);
            points.iter().all(|p| mounted.contains(p)).then_some(())
        });
    }

    /// Stops (SIGSTOP) or continues (SIGCONT) bindfs daemon `i`.
    fn stop_fuse(&mut self, i: usize, stop: bool) {
        let signal = if stop { nix::sys::signal::Signal::SIGSTOP } else { nix::sys::signal::Signal::SIGCONT };
        let pid = nix::unistd::Pid::from_raw(self.fuse[i].0.id() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
        self.fuse[i].1 = stop;
    }

    /// A failing disk of `bytes` in `root/disk-<n>` (its loop device attached).
    fn disk(&mut self, bytes: u64) -> usize {
        let dir = self.root.join(format!("disk-{}", self.disks.len()));
        self.disks.push(FailingDisk::new(&dir, bytes));
        self.disks.len() - 1
    }

    fn start_agent(&mut self, cp: &ControlPlane, node: &str, class_map: &str) -> &AgentProcess {
        let config = self.root.join("config");
        write_config(&config, &[("storageClassMap", class_map)]);
        let kubeconfig = cp.agent_kubeconfig(&self.root);
        let log = self.root.join("agent.log");
        let agent = AgentProcess::start_with(&config, node, &kubeconfig, &log, &["--host-op-timeout", HOST_OP_TIMEOUT]);
        self.cp_dir = Some(cp.dir.clone());
        self.agent.insert(agent)
    }

    fn agent(&self) -> &AgentProcess {
        self.agent.as_ref().expect("agent started")
    }

    /// A claim bound directly to `pv` (no pod: no kubelet here; the controller-manager binds).
    fn claim(&mut self, cp: &ControlPlane, claim: &str, class: &str, pv: &str, block: bool) {
        let mode = if block { "Block" } else { "Filesystem" };
        cp.apply(&format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {claim}, namespace: default}}\nspec:\n  accessModes: [ReadWriteOnce]\n  volumeMode: {mode}\n  storageClassName: {class}\n  volumeName: {pv}\n  resources: {{requests: {{storage: 1Mi}}}}\n"
        ));
        self.claims.push(claim.to_string());
        wait_until(&format!("claim {claim} bound to {pv}"), WAIT, || (cp.pv_state(pv)?.1 == "Bound").then_some(()));
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Release every block first: the agent's threads stuck there (and so the agent) could
        // not exit before, nor the mounts go.
        for disk in &self.disks {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| disk.healthy()));
        }
        for (child, stopped) in &self.fuse {
            if *stopped {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(child.id() as i32),
                    nix::sys::signal::Signal::SIGCONT,
                );
            }
        }
        for mut holder in std::mem::take(&mut self.holders) {
            let _ = holder.kill();
            let _ = holder.wait();
        }
        if let Some(agent) = self.agent.take() {
            if std::thread::panicking() {
                let kept = std::env::temp_dir()
                    .join(format!("wedged_disks-{}.log", self.root.file_name().unwrap_or_default().to_string_lossy()));
                let _ = std::fs::copy(&agent.log, &kept);
                eprintln!("agent log kept at {}", kept.display());
            }
            drop(agent);
        }
        if let Some(dir) = self.cp_dir.take() {
            let cp = ControlPlane::at(&dir);
            for claim in &self.claims {
                let _ = cp.kubectl(&["delete", "pvc", claim, "-n", "default", "--wait=false"]);
            }
            cp.forget_pvs_under(&self.root.display().to_string());
        }
        // The failing disks' mounts are below their own directories, which they unmount.
        self.disks.clear();
        for p in support::mounts_under(&self.root) {
            quiet(Command::new("umount").arg(&p));
        }
        for (mut child, _) in std::mem::take(&mut self.fuse) {
            if !matches!(child.try_wait(), Ok(Some(_))) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        remove_scratch_dir(&self.root, "wedged_disks");
    }
}

fn has_event(cp: &ControlPlane, kind: &str, name: &str, reason: &str, kind_of: &str) -> Option<Value> {
    events_about(cp, kind, name, None).into_iter().find(|e| e["reason"] == reason && e["type"] == kind_of)
}

/// The ext4 error count of the filesystem on `device` (0 when unreadable).
fn ext4_errors(device: &Path) -> u64 {
    let name = device.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::read_to_string(format!("/sys/fs/ext4/{name}/errors_count"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Polls `f` every 200 ms for at most `timeout`: how long it took, or None (no panic: the
/// figures are printed whatever happens, then asserted).
fn time_until(timeout: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

fn ms(d: Option<Duration>) -> Value {
    d.map_or(Value::Null, |d| Value::from(d.as_millis() as u64))
}

/// Scenario (a): `n` wedged volumes (bindfs FUSE mounts whose daemon is stopped) beside 3
/// healthy tmpfs volumes in one class, the agent started among them. Prints the figures as one
/// JSON line on stderr (also when a bound is missed), then asserts the bounds.
fn many_wedged(n: usize) {
    let cp = ControlPlane::get();
    let (node, class) = (&unique("wd-many-node"), &unique("wd-many"));
    cp.create_node(node);
    cp.create_storage_class(class, "Delete");
    let mut lab = Lab::new("wd-many");
    let fs_dir = lab.root.join("fs");
    for h in ["h0", "h1", "h2"] {
        lab.tmpfs(&fs_dir.join(h), 16);
    }
    let points: Vec<PathBuf> = (0..n).map(|i| fs_dir.join(format!("w{i:03}"))).collect();
    let daemons: Vec<usize> = points.iter().map(|p| lab.fuse(p)).collect();
    lab.wait_fuse_mounted(&points);
    for &i in &daemons {
        lab.stop_fuse(i, true);
    }

    let pid = lab.start_agent(&cp, node, &class_map(class, &fs_dir)).pid();
    let healthy: Vec<String> = ["h0", "h1", "h2"].iter().map(|h| pv_name(h, node, class)).collect();
    let first_published = time_until(WAIT, || healthy.iter().all(|n| available(&cp, n).is_some()));
    eprintln!("{n} wedged: the 3 healthy PVs Available {first_published:?} after the agent started");
    let measured = Instant::now();
    let (threads_wedged, rss_wedged) = (proc_status(pid, "Threads"), proc_status(pid, "VmRSS"));

    // A volume mounted among them is published within 5 s.
    lab.tmpfs(&fs_dir.join("late"), 16);
    let late = pv_name("late", node, class);
    let publish = time_until(Duration::from_secs(30), || available(&cp, &late).is_some());
    eprintln!("{n} wedged: a tmpfs mounted later: its PV Available after {publish:?}");

    // A released healthy one is recycled within 30 s.
    let h0 = &healthy[0];
    let recycle = available(&cp, h0).map(|uid| {
        let claim = unique("wd-many-claim");
        lab.claim(&cp, &claim, class, h0, false);
        std::fs::write(fs_dir.join("h0").join("tenant-data"), b"tenant").unwrap();
        cp.kubectl_ok(&["delete", "pvc", &claim, "-n", "default", "--wait=false"]);
        let released = Instant::now();
        let done = time_until(WAIT, || cp.pv_state(h0).is_some_and(|(new, phase)| new != uid && phase == "Available"));
        if done.is_some() {
            // wait_recycled's own check: the successor is on an empty volume.
            wait_recycled(&cp, h0, &uid, Some(&fs_dir.join("h0")), WAIT);
        }
        eprintln!("{n} wedged: a released healthy volume recycled {done:?} after its claim was deleted");
        done.map(|_| released.elapsed())
    });

    // Memory while saturated: 60 s after the first measure.
    std::thread::sleep(Duration::from_secs(60).saturating_sub(measured.elapsed()));
    let (threads_60s, rss_60s) = (proc_status(pid, "Threads"), proc_status(pid, "VmRSS"));
    let health = lab.agent().admin_get("/healthz");

    // Thawed: every daemon runs again; 30 s later the threads the wedged volumes held are gone.
    for &i in &daemons {
        lab.stop_fuse(i, false);
    }
    std::thread::sleep(Duration::from_secs(30));
    let (threads_thawed, rss_thawed) = (proc_status(pid, "Threads"), proc_status(pid, "VmRSS"));
    let figures = serde_json::json!({
        "scenario": "wedged-volumes",
        "wedged": n,
        "healthy_published_after_start_ms": ms(first_published),
        "threads_at_wedged": threads_wedged,
        "rss_kib_at_wedged": rss_wedged,
        "publish_healthy_ms": ms(publish),
        "recycle_healthy_ms": ms(recycle.flatten()),
        "threads_after_60s": threads_60s,
        "rss_kib_after_60s": rss_60s,
        "threads_after_thaw_30s": threads_thawed,
        "rss_kib_after_thaw_30s": rss_thawed,
        "healthz_while_wedged": health.lines().next().unwrap_or_default(),
    });
    eprintln!("{figures}");
    assert!(first_published.is_some(), "with {n} wedged volumes the healthy ones were not published in {WAIT:?}");
    assert!(
        publish.is_some_and(|d| d < Duration::from_secs(5)),
        "with {n} wedged volumes a new healthy volume took {publish:?} (5 s at most)"
    );
    assert!(
        recycle.flatten().is_some_and(|d| d < Duration::from_secs(30)),
        "with {n} wedged volumes a released healthy one took {recycle:?} (30 s at most)"
    );
    assert!(health.starts_with("HTTP/1.1 200"), "wedged volumes never fail the liveness probe: {health}");
    assert!(
        threads_thawed < THREADS_AFTER_THAW,
        "30 s after the thaw the agent still has {threads_thawed} threads (at {n} wedged: {threads_wedged})"
    );
}

/// The harness itself, without an agent: what the FUSE disk is told reaches a loop device's
/// readers (no cache in between), a block holds a reader until released, and a resize is the
/// device's size. The other tests rest on this.
#[test]
fn the_failing_disk_fails_blocks_and_resizes_as_told() {
    let _area = support::area(module_path!());
    if !require_root("the_failing_disk_fails_blocks_and_resizes_as_told") {
        return;
    }
    let _serial = serial();
    let mut lab = Lab::new("wd-harness");
    let vol = lab.root.join("vol");
    let d = lab.disk(32 * MIB);
    lab.disks[d].ext4(&vol, "errors=continue");
    std::fs::write(vol.join("file"), vec![7u8; 1 << 20]).unwrap();
    run(Command::new("sync").arg("-f").arg(vol.join("file")));
    let disk = &lab.disks[d];
    let device = disk.device.clone();
    assert!(!read_fails(&device, 0, MIB), "a healthy disk reads");

    // EIO on a range: reads there fail, reads elsewhere do not; then the whole disk, and a
    // file read through ext4 fails once the page cache is dropped.
    disk.set_eio(4 * MIB..5 * MIB, true, false);
    assert!(read_fails(&device, 4 * MIB + 4096, 4096), "a read in the failing range");
    assert!(!read_fails(&device, 8 * MIB, 4096), "a read outside it");
    disk.set_eio_everywhere(true, false);
    drop_caches();
    assert!(std::fs::read(vol.join("file")).is_err(), "a file read through ext4 on a failing disk");
    let status = disk.status();
    assert!(status["eio_reads"].as_u64().unwrap() >= 3, "{status}");
    // Writes failing only: reads work again, a direct write fails.
    disk.healthy();
    disk.set_eio_everywhere(false, true);
    assert!(!read_fails(&device, 0, MIB));
    let write = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", device.display()))
        .args(["bs=4096", "count=1", "seek=4000", "oflag=direct", "conv=notrunc"])
        .output()
        .unwrap();
    assert!(!write.status.success(), "a direct write to a disk failing writes succeeded");
    disk.healthy();

    // Blocked: a reader waits, unanswered, until released; the control channel still answers.
    disk.block();
    let dev = device.clone();
    let reader = std::thread::spawn(move || read_fails(&dev, 12 * MIB, 4096));
    wait_until("the read waiting on the blocked disk", Duration::from_secs(10), || {
        (disk.status()["pending"].as_u64().unwrap() >= 1).then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(!reader.is_finished(), "a read of a blocked disk returned");
    disk.release();
    assert!(!reader.join().unwrap(), "the released read succeeds");

    // Resized: the loop device follows (resize asserts the kernel's size).
    disk.resize(16 * MIB);
    disk.resize(48 * MIB);
    assert_eq!(disk.status()["size"], 48 * MIB);
}

/// (a) 100 wedged volumes beside healthy ones: a healthy volume is published within 5 s and a
/// released one recycled within 30 s; threads and RSS are printed (one JSON line on stderr),
/// and the threads shrink back after the thaw.
#[test]
fn a_hundred_wedged_volumes_never_hold_the_healthy_ones() {
    let _area = support::area(module_path!());
    if !require_root("a_hundred_wedged_volumes_never_hold_the_healthy_ones") {
        return;
    }
    if !quiet(Command::new("bindfs").arg("--version")) {
        return support::cannot_run("a_hundred_wedged_volumes_never_hold_the_healthy_ones", "bindfs is not installed");
    }
    let _serial = serial();
    let n = std::env::var("WEDGED_VOLUMES").ok().and_then(|v| v.parse().ok()).unwrap_or(WEDGED);
    many_wedged(n);
}

/// One more direct read of a failing disk, a few sectors on from the last: the disk stays in
/// use, as a failing disk on a host does. The kernel prints request errors rate-limited (10
/// per 5 s for all devices together), so the line of a single read may be suppressed after an
/// earlier test's errors; a read every half second gets one through within the window.
fn keep_reading(device: &Path, sector: &mut u64) {
    *sector = (*sector + 8) % (32 * MIB / 512);
    read_fails(device, *sector * 512, 4096);
}

/// (b) Reads of the disk under an Available PV fail with EIO (a bad disk, the whole of it):
/// the PV is withdrawn, as docs/operations.md promises (`io-failure`, or ext4's own count of
/// the errors it met); once the disk reads again (and the filesystem is repaired, when ext4
/// recorded errors) it is published again.
#[test]
fn eio_under_an_available_pv_withdraws_it_and_healthy_again_returns_it() {
    let _area = support::area(module_path!());
    if !require_root("eio_under_an_available_pv_withdraws_it_and_healthy_again_returns_it") {
        return;
    }
    let _serial = serial();
    let cp = ControlPlane::get();
    let (node, class) = (&unique("wd-eio-avail-node"), &unique("wd-eio-avail"));
    cp.create_node(node);
    cp.create_storage_class(class, "Delete");
    let mut lab = Lab::new("wd-eio-avail");
    let fs_dir = lab.root.join("fs");
    let vol = fs_dir.join("vol");
    let d = lab.disk(64 * MIB);
    lab.disks[d].ext4(&vol, "errors=continue");
    std::fs::write(vol.join("some-file"), b"data").unwrap();
    lab.tmpfs(&fs_dir.join("healthy"), 16);
    lab.start_agent(&cp, node, &class_map(class, &fs_dir));
    let name = pv_name("vol", node, class);
    let first_uid = wait_until("the PV on the FUSE disk", WAIT, || available(&cp, &name));

    let device = lab.disks[d].device.clone();
    lab.disks[d].set_eio_everywhere(true, false);
    drop_caches();
    assert!(read_fails(&device, 0, 4096), "a direct read of {} does not fail with EIO", device.display());
    let failed = Instant::now();
    let deadline = Duration::from_secs(30);
    let mut annotation = None;
    let mut dropped = Instant::now();
    let mut sector = 0;
    while failed.elapsed() < deadline {
        // Whatever the agent still had cached goes again: what it reads next comes from the disk.
        if dropped.elapsed() > Duration::from_secs(5) {
            drop_caches();
            dropped = Instant::now();
        }
        keep_reading(&device, &mut sector);
        match cp.get_json(&["pv", &name]) {
            None => break,
            Some(pv) => annotation = pv["metadata"]["annotations"][ANN_DISK_FAILING].as_str().map(str::to_string),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let status = lab.disks[d].status();
    let withdrawn = cp.pv_state(&name).is_none();
    eprintln!(
        "EIO on every read under an Available PV: withdrawn {withdrawn} after {:?} (annotation {annotation:?}; \
         server {status}; ext4 errors_count {})",
        failed.elapsed(),
        ext4_errors(&device)
    );
    let withdrawal = events_about(&cp, "PersistentVolume", &name, None)
        .into_iter()
        .find(|e| e["reason"] == "VolumeWithdrawn")
        .map(|e| e["note"].as_str().unwrap_or_default().to_string());
    eprintln!("its VolumeWithdrawn event: {withdrawal:?}");
    assert!(
        withdrawn,
        "{deadline:?} of EIO on every read, the Available PV {name} is still offered (annotation {annotation:?}, \
         {} EIO answers to the agent's reads)",
        status["eio_reads"]
    );
    // Not offered again while the disk fails.
    std::thread::sleep(Duration::from_secs(3));
    assert!(cp.pv_state(&name).is_none(), "published again on a failing disk");
    assert!(available(&cp, &pv_name("healthy", node, class)).is_some(), "the healthy volume beside it stays");

    // Healthy again. ext4 may have counted the read errors it met itself (filesystem-errors,
    // cleared only by e2fsck): then the operator's repair comes first.
    lab.disks[d].healthy();
    let healed = Instant::now();
    if ext4_errors(&device) > 0 {
        eprintln!("ext4 counted {} errors: repaired (umount, e2fsck, mount)", ext4_errors(&device));
        support::umount_when_idle(&vol);
        let out = Command::new("e2fsck").arg("-fy").arg(&device).output().unwrap();
        assert!(matches!(out.status.code(), Some(0..=2)), "e2fsck: {out:?}");
        run(Command::new("mount").args(["-t", "ext4", "-o", "errors=continue"]).arg(&device).arg(&vol));
    }
    // The agent may hold the sign a while after the last error (io-failure and kernel-log: 10
    // minutes without another, docs/operations.md: a bad sector may answer one read and fail
    // the next); a restarted agent starts without that memory, as after a disk replacement.
    let uid = match time_until(Duration::from_secs(20), || available(&cp, &name).is_some()) {
        Some(took) => {
            eprintln!("published again {took:?} after the disk read again");
            available(&cp, &name).unwrap()
        }
        None => {
            eprintln!("not published again within 20 s of the disk reading again (held): the agent restarted");
            lab.agent.take().unwrap().stop();
            let restarted = Instant::now();
            lab.start_agent(&cp, node, &class_map(class, &fs_dir));
            let uid = wait_until("the PV published again", WAIT, || available(&cp, &name));
            eprintln!(
                "published again {:?} after the agent restarted ({:?} after the disk read again)",
                restarted.elapsed(),
                healed.elapsed()
            );
            uid
        }
    };
    assert_ne!(uid, first_uid, "a new PV");
}

/// (c) EIO under a Bound PV: the PV is annotated disk-failing, never deleted, and a Warning
/// DiskFailing event goes to the PV and to its claim.
#[test]
fn eio_under_a_bound_pv_flags_it_and_tells_the_claim() {
    let _area = support::area(module_path!());
    if !require_root("eio_under_a_bound_pv_flags_it_and_tells_the_claim") {
        return;
    }
    let _serial = serial();
    let cp = ControlPlane::get();
    let (node, class, claim) = (&unique("wd-eio-bound-node"), &unique("wd-eio-bound"), &unique("wd-eio-claim"));
    cp.create_node(node);
    cp.create_storage_class(class, "Delete");
    let mut lab = Lab::new("wd-eio-bound");
    let fs_dir = lab.root.join("fs");
    let vol = fs_dir.join("vol");
    let d = lab.disk(64 * MIB);
    lab.disks[d].ext4(&vol, "errors=continue");
    lab.start_agent(&cp, node, &class_map(class, &fs_dir));
    let name = pv_name("vol", node, class);
    let uid = wait_until("the PV on the FUSE disk", WAIT, || available(&cp, &name));
    lab.claim(&cp, claim, class, &name, false);
    std::fs::write(vol.join("tenant-data"), b"tenant").unwrap();
    run(Command::new("sync").arg("-f").arg(vol.join("tenant-data")));

    let device = lab.disks[d].device.clone();
    lab.disks[d].set_eio_everywhere(true, false);
    drop_caches();
    assert!(read_fails(&device, 0, 4096), "a direct read of {} does not fail with EIO", device.display());
    let failed = Instant::now();
    let mut dropped = Instant::now();
    let mut sector = 0;
    let value = wait_until("the disk-failing annotation", Duration::from_secs(30), || {
        if dropped.elapsed() > Duration::from_secs(5) {
            drop_caches();
            dropped = Instant::now();
        }
        keep_reading(&device, &mut sector);
        let pv = cp.get_json(&["pv", &name])?;
        pv["metadata"]["annotations"][ANN_DISK_FAILING].as_str().map(str::to_string)
    });
    eprintln!(
        "EIO under a Bound PV: annotated {:?} after the disk failed: {value} (ext4 errors_count {})",
        failed.elapsed(),
        ext4_errors(&device)
    );
    wait_until("Warning DiskFailing on the PV", Duration::from_secs(15), || {
        has_event(&cp, "PersistentVolume", &name, "DiskFailing", "Warning")
    });
    let on_claim = wait_until("Warning DiskFailing on the claim", Duration::from_secs(15), || {
        has_event(&cp, "PersistentVolumeClaim", claim, "DiskFailing", "Warning")
    });
    eprintln!("on the claim: {}", on_claim["note"]);
    let metrics = lab.agent().admin_get("/metrics");
    let failing = metric_lines(
        &metrics,
        "local_static_provisioner_volume_failing",
        &[format!("path=\"{}\"", vol.display()), format!("pv=\"{name}\"")],
    );
    eprintln!("{failing:?}");
    assert!(!failing.is_empty(), "no volume_failing metric for {name}");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(cp.pv_state(&name), Some((uid, "Bound".to_string())), "a Bound PV is never deleted");
}

/// (d) A Block volume's disk shrinks to half (the loop device told, `losetup -c`): its
/// Available PV is withdrawn or published again at the new size, never offered at the old
/// one. A Bound one's disk grows: an event says so.
#[test]
fn a_shrunk_disk_is_not_offered_at_its_old_size_and_a_grown_one_is_said() {
    let _area = support::area(module_path!());
    if !require_root("a_shrunk_disk_is_not_offered_at_its_old_size_and_a_grown_one_is_said") {
        return;
    }
    let _serial = serial();
    let cp = ControlPlane::get();
    let (node, class, claim) = (&unique("wd-size-node"), &unique("wd-size"), &unique("wd-size-claim"));
    cp.create_node(node);
    cp.create_storage_class(class, "Delete");
    let mut lab = Lab::new("wd-size");
    let dir = lab.root.join("block");
    std::fs::create_dir_all(&dir).unwrap();
    let shrinking = lab.disk(64 * MIB);
    let growing = lab.disk(32 * MIB);
    std::os::unix::fs::symlink(&lab.disks[shrinking].device, dir.join("shrinking")).unwrap();
    std::os::unix::fs::symlink(&lab.disks[growing].device, dir.join("growing")).unwrap();
    lab.start_agent(&cp, node, &block_class_map(class, &dir));
    let (s, g) = (pv_name("shrinking", node, class), pv_name("growing", node, class));
    let s_uid = wait_until("the shrinking disk's PV", WAIT, || available(&cp, &s));
    wait_until("the growing disk's PV", WAIT, || available(&cp, &g));
    assert_eq!(capacity(&cp, &s).as_deref(), Some("64Mi"));
    lab.claim(&cp, claim, class, &g, true);

    lab.disks[shrinking].resize(32 * MIB);
    let shrunk = Instant::now();
    let outcome = wait_until("the shrunk disk's PV withdrawn or at its new size", Duration::from_secs(30), || match cp
        .get_json(&["pv", &s])
    {
        None => Some("withdrawn".to_string()),
        Some(pv) => {
            let cap = pv["spec"]["capacity"]["storage"].as_str().unwrap_or_default();
            (pv["metadata"]["uid"] != s_uid.as_str() && cap == "32Mi").then(|| format!("republished at {cap}"))
        }
    });
    eprintln!("a disk under an Available PV shrank to half: {outcome} after {:?}", shrunk.elapsed());
    // Never offered again at 64Mi.
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        assert_ne!(capacity(&cp, &s).as_deref(), Some("64Mi"), "the shrunk disk is offered at its old size");
        std::thread::sleep(Duration::from_millis(500));
    }

    lab.disks[growing].resize(48 * MIB);
    let grown = Instant::now();
    let event = wait_until("an event saying the Bound disk grew", Duration::from_secs(30), || {
        events_about(&cp, "PersistentVolume", &g, None).into_iter().find(|e| {
            let reason = e["reason"].as_str().unwrap_or_default();
            reason.contains("Grow") || reason.contains("Grew") || reason.contains("Resize")
        })
    });
    eprintln!("a Bound disk grew: {} {:?} after {:?}", event["reason"], event["note"], grown.elapsed());
    assert_eq!(cp.pv_state(&g).map(|(_, p)| p).as_deref(), Some("Bound"), "the Bound PV stays");
}

/// (e) A dead FUSE file held open by a process somewhere on the host (outside any discovery
/// directory: its daemon stopped, so a `stat` of the descriptor blocks), and a wedged failing
/// disk: a loop device over a FUSE file that stops answering, the file held open by another
/// process too: a device claim (whose writer scan looks at every process's descriptors, and
/// whose inventory at every loop device's backing file) and the passes go on; a healthy volume
/// mounted meanwhile is published within 5 s.
#[test]
fn a_dead_fuse_file_held_open_elsewhere_stops_nothing() {
    let _area = support::area(module_path!());
    if !require_root("a_dead_fuse_file_held_open_elsewhere_stops_nothing") {
        return;
    }
    if !quiet(Command::new("bindfs").arg("--version")) {
        return support::cannot_run("a_dead_fuse_file_held_open_elsewhere_stops_nothing", "bindfs is not installed");
    }
    let _serial = serial();
    let cp = ControlPlane::get();
    let (node, fs_class, dev_class) = (&unique("wd-held-node"), &unique("wd-held-fs"), &unique("wd-held-dev"));
    cp.create_node(node);
    cp.create_storage_class(fs_class, "Delete");
    cp.create_storage_class(dev_class, "Delete");
    let mut lab = Lab::new("wd-held");
    let (fs_dir, claims_dir) = (lab.root.join("fs"), lab.root.join("claims"));
    std::fs::create_dir_all(&claims_dir).unwrap();
    lab.tmpfs(&fs_dir.join("a"), 16);
    // The dead FUSE file, held open by a process, outside both classes' directories.
    let elsewhere = lab.root.join("elsewhere");
    let daemon = lab.fuse(&elsewhere);
    lab.wait_fuse_mounted(std::slice::from_ref(&elsewhere));
    std::fs::write(elsewhere.join("held"), b"x").unwrap();
    let holder = Command::new("sleep")
        .arg("3600")
        .stdin(std::fs::File::open(elsewhere.join("held")).unwrap())
        .spawn()
        .expect("sleep runs");
    lab.holders.push(holder);
    // The device class claims loop devices of exactly 37 MiB.
    let mib = 37;
    let map = format!(
        "{}{dev_class}:\n  hostDir: {d}\n  mountDir: {d}\n  volumeMode: Block\n  devices:\n    types: [loop]\n    minSize: {mib}Mi\n    maxSize: {mib}Mi\n",
        class_map(fs_class, &fs_dir),
        d = claims_dir.display()
    );
    lab.start_agent(&cp, node, &map);
    wait_until("the healthy PV", WAIT, || available(&cp, &pv_name("a", node, fs_class)));

    // The wedged disk (not of the device class's size), its file held open.
    let wedged = lab.disk(24 * MIB);
    let wedged_file = std::fs::File::open(lab.disks[wedged].image()).unwrap();
    let holder = Command::new("sleep").arg("3600").stdin(wedged_file).spawn().expect("sleep runs");
    lab.holders.push(holder);

    lab.stop_fuse(daemon, true);
    lab.disks[wedged].block();
    // A raw device to claim, and a healthy volume, while the held file is dead.
    let img = lab.root.join("claimable.img");
    run(Command::new("truncate").arg("-s").arg(format!("{mib}M")).arg(&img));
    let out = run(Command::new("losetup").args(["--find", "--show"]).arg(&img));
    let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let _detach = Detach(dev.clone());
    let stopped = Instant::now();
    lab.tmpfs(&fs_dir.join("b"), 16);
    wait_until("a volume mounted while a held FUSE file is dead", WAIT, || {
        available(&cp, &pv_name("b", node, fs_class))
    });
    let latency = stopped.elapsed();
    eprintln!("a tmpfs mounted while a held FUSE file is dead: its PV Available after {latency:?}");
    let claimed = wait_until("the raw device claimed and published", Duration::from_secs(90), || {
        cp.pvs_under(&claims_dir.display().to_string()).into_iter().next()
    });
    eprintln!(
        "the raw device claimed and published {:?} after it appeared: {} ({})",
        stopped.elapsed(),
        claimed["metadata"]["name"],
        claimed["spec"]["local"]["path"]
    );
    assert!(latency < Duration::from_secs(5), "the later volume took {latency:?}");
    let health = lab.agent().admin_get("/healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
}

/// Detaches a loop device when dropped (`losetup -d` defers the detach while the agent still
/// has the device open).
struct Detach(PathBuf);

impl Drop for Detach {
    fn drop(&mut self) {
        quiet(Command::new("losetup").arg("-d").arg(&self.0));
    }
}
